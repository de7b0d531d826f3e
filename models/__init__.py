"""Model families. Each family folder holds its config, decode model and no-cache reference."""
