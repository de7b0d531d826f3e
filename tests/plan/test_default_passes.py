"""The default fx passes live in one place (fuelpipe.plan.default_passes): the schema, every backend
config and BackendSpec take that list, so none can drift from the others."""
from __future__ import annotations

from pathlib import Path

import pytest

from fuelpipe.config.schema import BackendConfig
from fuelpipe.plan.backends import BackendSpec
from fuelpipe.plan.default_passes import DEFAULT_FX_PASSES
from fuelpipe.plan.fx_passes import FX_PASSES


def test_every_default_pass_is_registered():
    assert all(name in FX_PASSES for name in DEFAULT_FX_PASSES)


def test_schema_and_spec_take_the_one_list():
    assert tuple(BackendConfig().fx_passes) == DEFAULT_FX_PASSES
    assert BackendSpec(name="fx").fx_passes == DEFAULT_FX_PASSES


@pytest.mark.parametrize("backend", ["eager", "fx", "inductor", "aot"])
def test_every_backend_config_composes_to_the_one_list(compose_cfg, backend):
    cfg = compose_cfg([f"backend={backend}"])
    assert tuple(cfg.backend.fx_passes) == DEFAULT_FX_PASSES


def test_a_config_still_sets_its_own_passes(compose_cfg):
    cfg = compose_cfg(["backend=fx", "backend.fx_passes=[fuse_sibling_linears]"])
    assert list(cfg.backend.fx_passes) == ["fuse_sibling_linears"]


def test_no_doc_or_config_restates_the_list():
    """A line naming every default pass is a second copy of the list that would go stale (experiments/ records
    what ran at the time, so it is left out)."""
    root = Path(__file__).resolve().parents[2]
    files = [root / "README.md", *root.glob("docs/**/*.md"), *root.glob("conf/**/*.yaml"),
             *root.glob("examples/**/*.md"), *root.glob("examples/**/*.yaml")]
    restated = [f"{path.relative_to(root)}:{n}" for path in files
                for n, line in enumerate(path.read_text().splitlines(), 1)
                if all(name in line for name in DEFAULT_FX_PASSES)]
    assert restated == []
