"""fuelpipe's oracles for other people's test suites: the harness and the pytest plugin."""
from fuelpipe.testing.harness import (
    PORTABLE_ORACLES, Combo, OracleFailure, OracleHarness, OracleSkipped, describe, perturbed_copy,
)

__all__ = ["PORTABLE_ORACLES", "Combo", "OracleFailure", "OracleHarness", "OracleSkipped", "describe",
           "perturbed_copy"]
