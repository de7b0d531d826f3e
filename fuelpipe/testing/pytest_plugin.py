"""The fuelpipe pytest plugin (registered through ``pytest11``): fuelpipe's oracles in anyone's test suite.

Fixtures:

* ``fuelpipe_oracles``: a factory, ``fuelpipe_oracles(model=...)`` or
  ``fuelpipe_oracles(config="my_tiny")``, returning an ``OracleHarness`` whose
  ``check(name, combo)`` fails the test with the oracle's own account (first
  divergent step, metric, tolerance) and skips (never passes) when the oracle
  checked nothing.
* ``fuelpipe_combo``: one ``Combo`` (backend, KV strategy, plan mode) per test,
  parametrised from ``@pytest.mark.fuelpipe_matrix(backends=[...], kv=[...],
  plans=[...])`` or from a YAML file (``@pytest.mark.fuelpipe_matrix(yaml="m.yaml")``
  or the ini option ``fuelpipe_matrix``) holding the same three lists.
* ``fuelpipe_oracle``: one oracle name per test, parametrised from the marker's
  ``oracles=[...]`` (default: ``PORTABLE_ORACLES``, the oracles any family must pass).

A test then reads::

    @pytest.mark.fuelpipe_matrix(backends=["eager", "fx"], kv=["contiguous", "paged"])
    def test_my_model(fuelpipe_oracles, fuelpipe_combo, fuelpipe_oracle):
        fuelpipe_oracles(model=build_my_model()).check(fuelpipe_oracle, fuelpipe_combo)

Nothing here imports torch until a fixture is used, so the plugin costs
nothing in test suites that do not use it.
"""
from __future__ import annotations

import itertools
from pathlib import Path

import pytest

MARKER = "fuelpipe_matrix"
MATRIX_KEYS = ("backends", "kv", "plans", "oracles", "yaml")


def pytest_addoption(parser) -> None:
    parser.addini(MARKER, "YAML file with backends / kv / plans / oracles lists for fuelpipe_combo", default="")


def pytest_configure(config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(backends=[...], kv=[...], plans=[...], oracles=[...], yaml=path): parametrise "
        "fuelpipe_combo / fuelpipe_oracle (fuelpipe's pytest plugin)",
    )


def pytest_generate_tests(metafunc) -> None:
    wants_combo = "fuelpipe_combo" in metafunc.fixturenames
    wants_oracle = "fuelpipe_oracle" in metafunc.fixturenames
    if not (wants_combo or wants_oracle):
        return
    matrix = _matrix(metafunc)
    if wants_combo:
        from fuelpipe.testing.harness import Combo

        combos = [Combo(backend=b, kv=k, plan=p)
                  for b, k, p in itertools.product(matrix["backends"], matrix["kv"], matrix["plans"])]
        metafunc.parametrize("fuelpipe_combo", combos, ids=[c.id for c in combos])
    if wants_oracle:
        metafunc.parametrize("fuelpipe_oracle", list(matrix["oracles"]))


def _matrix(metafunc) -> dict:
    from fuelpipe.testing.harness import PORTABLE_ORACLES

    marker = metafunc.definition.get_closest_marker(MARKER)
    given = dict(marker.kwargs) if marker else {}
    unknown = sorted(set(given) - set(MATRIX_KEYS))
    if unknown:
        raise pytest.UsageError(f"{MARKER} takes {', '.join(MATRIX_KEYS)}; unknown: {', '.join(unknown)}")
    path = given.pop("yaml", None) or metafunc.config.getini(MARKER)
    from_yaml = _read_yaml(Path(metafunc.config.rootpath, path) if path else None)
    matrix = {"backends": ["fx"], "kv": [None], "plans": ["plan_once"], "oracles": list(PORTABLE_ORACLES)}
    matrix.update(from_yaml)
    matrix.update(given)
    for key in ("backends", "kv", "plans", "oracles"):
        value = matrix[key]
        if isinstance(value, str) or not isinstance(value, (list, tuple)) or not value:
            raise pytest.UsageError(f"{MARKER}: {key} must be a non-empty list, got {value!r}")
    _check_names(matrix)
    return matrix


def _read_yaml(path) -> dict:
    if path is None:
        return {}
    if not path.is_file():
        raise pytest.UsageError(f"{MARKER}: no such YAML file {path}")
    from omegaconf import OmegaConf

    data = OmegaConf.to_container(OmegaConf.load(path))
    if not isinstance(data, dict) or set(data) - set(MATRIX_KEYS[:4]):
        raise pytest.UsageError(f"{MARKER}: {path} must map some of {', '.join(MATRIX_KEYS[:4])} to lists, got {data!r}")
    return data


def _check_names(matrix: dict) -> None:
    """Misspelled backend, KV or oracle names stop the collection with a did-you-mean, not a deep traceback."""
    from fuelpipe.modes import RUNNABLE_PLAN_MODES
    from fuelpipe.kv.layout import layout_names
    from fuelpipe.oracles.registry import ORACLES
    from fuelpipe.plan.backends import BACKENDS
    from fuelpipe.registry import did_you_mean

    problems = [did_you_mean("backend", b, BACKENDS) for b in matrix["backends"] if b not in BACKENDS]
    problems += [did_you_mean("KV strategy", k, layout_names()) for k in matrix["kv"] if k is not None and k not in layout_names()]
    modes = [m.value for m in RUNNABLE_PLAN_MODES]
    problems += [did_you_mean("plan mode", p, modes) for p in matrix["plans"] if p not in modes]
    problems += [did_you_mean("oracle", o, ORACLES) for o in matrix["oracles"] if o not in ORACLES]
    if problems:
        raise pytest.UsageError(f"{MARKER}: " + "; ".join(problems))


class _PytestHarness:
    """An OracleHarness whose ``check`` skips the test (never passes it) when the oracle checked nothing."""

    def __init__(self, harness) -> None:
        self.harness = harness

    def __getattr__(self, name):
        return getattr(self.harness, name)

    def check(self, name, combo=None):
        from fuelpipe.testing.harness import Combo, OracleSkipped

        __tracebackhide__ = True
        try:
            return self.harness.check(name, combo or Combo())
        except OracleSkipped as skipped:
            pytest.skip(str(skipped))


@pytest.fixture
def fuelpipe_oracles():
    """Factory: ``fuelpipe_oracles(model=...)`` or ``fuelpipe_oracles(config="name")`` -> harness."""
    from fuelpipe.testing.harness import OracleHarness

    def make(model=None, **kwargs):
        return _PytestHarness(OracleHarness(model, **kwargs))

    return make
