"""Config groups this package adds to fuelpipe's tree (``model/mistral_sw_tiny.yaml``)."""
