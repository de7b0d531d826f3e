"""The f32 rows kernel's software prefetch (fuelpipe/kernels/f32_rows.cpp): a measured distance that never
changes a result, a typed refusal of a distance out of range, and a stored choice re-measured when absent."""
from __future__ import annotations

import json

import pytest
import torch

from fuelpipe.errors import ConfigError
from fuelpipe.kernels.build import (
    f32_prefetch_bytes, forced_f32_prefetch, kernel_paths, load, set_f32_prefetch, vector_paths,
)
from fuelpipe.plan.rows_linear import reference_rows_linear


@pytest.fixture(scope="module", autouse=True)
def kernels():
    load()


@pytest.mark.parametrize("m", [1, 3, 8])
@pytest.mark.parametrize("k", [7, 64, 576, 1000])
def test_every_prefetch_distance_gives_the_same_bits(m, k):
    gen = torch.Generator().manual_seed(k + m)
    weights = [torch.randn(n, k, generator=gen) for n in (37, 64)]
    x = torch.randn(m, k, generator=gen)
    bias = torch.randn(101, generator=gen)
    ops = torch.ops.fuelpipe_kernels
    outs = []
    for ahead in (0, 64, 1024, 2048, 4096, 65536):
        with forced_f32_prefetch(ahead):
            outs.append(ops.f32_rows_linear(x, weights, bias))
    assert all(torch.equal(outs[0], o) for o in outs[1:])
    expected = reference_rows_linear(x, weights, bias)
    assert torch.allclose(outs[0], expected, rtol=1e-5, atol=1e-5 * k ** 0.5)


def test_a_distance_out_of_range_is_refused_and_changes_nothing():
    before = f32_prefetch_bytes()
    for bad in (-1, 65537):
        with pytest.raises(ConfigError, match=f"bytes must be in \\[0, 65536\\], got {bad}"):
            set_f32_prefetch(bad)
    assert f32_prefetch_bytes() == before


def test_the_forced_distance_is_restored_after_the_block():
    before = f32_prefetch_bytes()
    with forced_f32_prefetch(3 * 1024) as ahead:
        assert f32_prefetch_bytes() == ahead == 3072
    assert f32_prefetch_bytes() == before


def test_the_measured_distance_is_stored_and_a_record_without_it_is_measured_again(tmp_path, monkeypatch):
    from fuelpipe.kernels import path_choice

    if "avx2" not in vector_paths():
        pytest.skip("the scalar path has no prefetch to choose")
    before, paths_before = f32_prefetch_bytes(), kernel_paths()
    measured = []

    def quick_prefetch():  # the real one times 12 layers per candidate; its result is all the test needs
        measured.append(1)
        return {"f32_prefetch_bytes": 1024, "f32_prefetch_ms_per_layer": {"0": 2.0, "1024": 1.0}}

    monkeypatch.setattr(path_choice, "measure_prefetch", quick_prefetch)
    monkeypatch.setattr(path_choice, "measure", lambda paths: {"best": dict.fromkeys(path_choice.MEASURED, paths[0]),
                                                               "ms_per_layer": {}})
    try:
        path_choice.apply(tmp_path)
        assert f32_prefetch_bytes() == 1024 and len(measured) == 1
        path_choice.apply(tmp_path)  # read back
        assert len(measured) == 1
        doc = json.loads((tmp_path / path_choice.FILE).read_text())
        del doc["f32_prefetch_bytes"]  # a record from before the distance was a choice
        (tmp_path / path_choice.FILE).write_text(json.dumps(doc))
        path_choice.apply(tmp_path)
        assert len(measured) == 2 and json.loads((tmp_path / path_choice.FILE).read_text())["f32_prefetch_bytes"] == 1024
    finally:  # the process's kernels take their own choices again
        set_f32_prefetch(before)
        for kernel, path in paths_before.items():
            torch.ops.fuelpipe_kernels.set_measured_path(kernel, path)
