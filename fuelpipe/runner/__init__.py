"""From a validated config to results: assemble the pieces, run oracles and benchmarks."""
