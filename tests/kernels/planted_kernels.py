"""The gate against bugs planted in the C++ kernels: each, on a scratch copy of the tree, must fail parity.

A kernel cannot be monkeypatched, so each case copies the packages and the
config tree (``COPIED``) into ``tmp_path``, applies one small text edit to one
kernel source (``BUGS``: the old text must occur exactly once, so a plant gone
stale fails loudly instead of testing nothing), and runs
``python -m fuelpipe experiment=parity`` on the copy in a subprocess with its
own kernel build folder, so the edited source is what gets compiled (a cold
build, minutes). Each planted run must exit 1 with ``kernel_parity`` among the
failed oracles; the unmutated copy must exit 0.

Not collected by default (the file name is not ``test_*``): run it by path,
``pytest -m slow tests/kernels/planted_kernels.py``.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import with_tiny_model
from _support.planted_record import record

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
COPIED = ("fuelpipe", "models", "conf", "hydra_plugins")  # what `python -m fuelpipe` imports and composes
KERNELS = "fuelpipe/kernels"

# name -> (file, old text, new text, gate overrides)
BUGS = {
    # The 256-bit int8 tile (the rows a thread walks in lockstep) sums only its even blocks' chain.
    "odd_blocks_dropped_in_a_tile": (
        f"{KERNELS}/quant_a16_tiles.h",
        "for (int r = 0; r < R; ++r) out[r] = hsum(_mm256_add_ps(acc[r][0], acc[r][1]));",
        "for (int r = 0; r < R; ++r) out[r] = hsum(acc[r][0]);",
        ("weights.dtype=int8",),
    ),
    # The same on the AVX-512 path only (a CPU without AVX-512 neither compiles nor runs it: skipped there).
    "odd_block_dropped_avx512": (
        f"{KERNELS}/quant_a16_avx512.h",
        "    if (b < nb) a0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(q8_block_512(",
        "    if (b + 1 < nb) a0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(q8_block_512(",
        ("weights.dtype=int8",),
    ),
    # The f32 AVX-512 tile for several rows of x writes each pair's two rows crossed (its halves swapped).
    "f32_row_pair_crossed_avx512": (
        f"{KERNELS}/f32_rows_avx512.h",
        "        const int64_t m = 2 * p + h;",
        "        const int64_t m = 2 * p + 1 - h;",
        (),
    ),
    # A row's last slot is never read, so only a row filled to its capacity sees it.
    "last_slot_unread": (
        f"{KERNELS}/slot_attention.cpp",
        "for (int64_t j = 0; j < S; ++j)",
        "for (int64_t j = 0; j + 1 < S; ++j)",
        (),
    ),
    # The 16-bit activation step one code off: max|x| / 32766 (codes and steps both move).
    "activation_step_off_by_one": (
        f"{KERNELS}/quant_a16.cpp",
        "/*levels=*/32767.f",
        "/*levels=*/32766.f",
        ("weights.dtype=int4",),
    ),
    # The 8-bit activation step one code off: max|x| / 126 (the 8-bit kernels only; the gate's model runs int16).
    "activation_step_off_by_one_8_bit": (
        f"{KERNELS}/quant_a8.cpp",
        "/*levels=*/127.f",
        "/*levels=*/126.f",
        (),
    ),
    # The 8-bit 4-bit pair's two block scales crossed: each block of a pair scaled by the other's.
    "a8_pair_scales_crossed": (
        f"{KERNELS}/quant_a8.cpp",
        "_mm256_castps128_ps256(_mm_broadcast_ss(sc)), _mm_broadcast_ss(sc + 1), 1)",
        "_mm256_castps128_ps256(_mm_broadcast_ss(sc + 1)), _mm_broadcast_ss(sc), 1)",
        (),
    ),
}


def scratch_copy(dest: Path) -> Path:
    for name in COPIED:
        shutil.copytree(ROOT / name, dest / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return dest


def plant(root: Path, file: str, old: str, new: str) -> None:
    path = root / file
    text = path.read_text()
    assert text.count(old) == 1, f"stale plant: {old!r} occurs {text.count(old)} times in {file}, not once"
    path.write_text(text.replace(old, new))


def run_gate(root: Path, work: Path, overrides) -> tuple[subprocess.CompletedProcess, dict, float]:
    """``python -m fuelpipe model=llama_tiny experiment=parity OVERRIDES`` on the copy at ``root``:
    (process, results.json, wall seconds)."""
    env = dict(os.environ, CI="true", PYTHONPATH=str(root), FUELPIPE_KERNEL_CACHE=str(work / "kernels"))
    for name in ("HYDRA_FULL_ERROR", "FUELPIPE_CONF_DIR"):
        env.pop(name, None)
    run_dir = work / "run"
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "fuelpipe", *with_tiny_model(["model=llama_tiny", "experiment=parity", *overrides]),
         f"hydra.run.dir={run_dir}"],
        cwd=work, env=env, capture_output=True, text=True, timeout=1800)
    seconds = time.perf_counter() - t0
    doc = json.loads((run_dir / "results.json").read_text())
    return proc, doc, seconds


def failed_oracles(doc: dict) -> list[str]:
    return [o["name"] for o in doc["oracles"] if not o["passed"] and not o.get("skipped")]


@pytest.mark.parametrize("name", sorted(BUGS))
def test_planted_kernel_bug_fails_the_gate(tmp_path, name):
    file, old, new, overrides = BUGS[name]
    if name.endswith("_avx512"):
        from fuelpipe.kernels.build import vector_paths

        if "avx512" not in vector_paths():
            pytest.skip("this CPU has no AVX-512 path to plant the bug in")
    root = scratch_copy(tmp_path / "tree")
    plant(root, file, old, new)
    proc, doc, seconds = run_gate(root, tmp_path, overrides)
    failed = failed_oracles(doc)
    print(f"{name}: exit {proc.returncode} in {seconds:.0f} s, failed {failed}")
    record(name, ["model=llama_tiny", *overrides, "experiment=parity", f"(scratch copy: {file})"], failed, doc["status"],
           seconds=round(seconds))
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "kernel_parity" in failed, (failed, proc.stdout[-3000:])
    assert doc["status"] == "failed"


def test_unmutated_scratch_copy_passes_the_gate(tmp_path):
    root = scratch_copy(tmp_path / "tree")
    proc, doc, seconds = run_gate(root, tmp_path, ())
    print(f"healthy: exit {proc.returncode} in {seconds:.0f} s, failed {failed_oracles(doc)}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert failed_oracles(doc) == []
    kernel = next(o for o in doc["oracles"] if o["name"] == "kernel_parity")
    assert kernel["passed"] and kernel["metric"]["cases"] > 0
