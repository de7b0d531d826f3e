"""Freed large blocks return to the OS once glibc's mmap threshold is fixed (``fuelpipe.allocator``)."""
import os
import platform
import subprocess
import sys

import pytest

from fuelpipe.allocator import return_large_frees_to_os

# Frees a 4 MiB block (glibc then raises its dynamic threshold to 4 MiB), allocates 200 blocks of
# 2 MiB, keeps the last and frees the rest: prints the MB still resident over the start.
RETAINED = """
import gc, sys
import psutil, torch
if sys.argv[1] == "fixed":
    from fuelpipe.allocator import return_large_frees_to_os
    print(return_large_frees_to_os(), file=sys.stderr)
rss = lambda: psutil.Process().memory_info().rss / 2**20
base = rss()
big = torch.empty(4 << 20, dtype=torch.uint8)
big.fill_(1)
del big
parts = [torch.ones(512 * 1024) for _ in range(200)]
keep = parts[-1]
del parts
gc.collect()
print(rss() - base)
"""

glibc = pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only")


def _retained_mb(mode: str) -> float:
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_MMAP_THRESHOLD_"}
    out = subprocess.run([sys.executable, "-c", RETAINED, mode], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    return float(out.stdout.strip().splitlines()[-1])


@glibc
def test_fixed_threshold_returns_freed_blocks_and_the_default_keeps_them():
    dynamic, fixed = _retained_mb("default"), _retained_mb("fixed")
    assert fixed < 40, f"{fixed:.0f} MB of 400 freed stayed resident with the threshold fixed"
    assert dynamic > 200, f"the control: glibc's dynamic threshold kept only {dynamic:.0f} MB (expected ~400)"


def test_a_bad_threshold_is_refused_naming_it():
    with pytest.raises(ValueError, match="mmap threshold must be an int in \\(0, 32 MiB\\], got 0"):
        return_large_frees_to_os(0)


@glibc
def test_the_environment_wins():
    code = "from fuelpipe.allocator import return_large_frees_to_os as r; print(r())"
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.stdout.strip() == "left to the environment (MALLOC_MMAP_THRESHOLD_=65536)", out.stderr
