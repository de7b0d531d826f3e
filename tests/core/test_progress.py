"""Waits show progress on a terminal (the first-run kernel build above all) and stay quiet in CI.

The build runs in a child process on a pseudo-terminal, with the compiler replaced by a 3.5 s sleep
that fails: the progress line, its end and the typed refusal are what the user sees."""
from __future__ import annotations

import os
import pty
import re
import subprocess
import sys

import pytest

SLOW_FAILING_BUILD = """
import time
import torch.utils.cpp_extension as cpp_extension

def compile_slowly(**kwargs):
    time.sleep(3.5)
    raise RuntimeError("the stand-in compiler gives up")

cpp_extension.load = compile_slowly
from fuelpipe.kernels.build import KernelBuildError, load
try:
    load()
except KernelBuildError as err:
    print("refused:", type(err).__name__, "stand-in compiler gives up" in str(err))
"""


def run_on_a_terminal(code: str, env: dict) -> tuple[int, str]:
    leader, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=follower, stdout=follower, stderr=follower,
                            env=env, close_fds=True)
    os.close(follower)
    chunks = []
    while True:
        try:
            data = os.read(leader, 4096)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(leader)
    return proc.wait(timeout=60), b"".join(chunks).decode(errors="replace")


def child_env(tmp_path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "FUELPIPE_QUIET")}
    env["FUELPIPE_KERNEL_CACHE"] = str(tmp_path / "kernels")  # empty: the build must run
    env.update(extra)
    return env


def test_a_kernel_build_shows_its_progress_on_a_terminal(tmp_path):
    rc, out = run_on_a_terminal(SLOW_FAILING_BUILD, child_env(tmp_path))
    assert rc == 0, out
    assert "building fuelpipe's C++ kernels: 2 s" in out or "building fuelpipe's C++ kernels: 3 s" in out, out
    assert "python -m fuelpipe.kernels" in out, "the line says how to build ahead"
    assert re.search(r"building fuelpipe's C\+\+ kernels: stopped in [3-9] s", out), out
    assert "refused: KernelBuildError True" in out


@pytest.mark.parametrize("quiet", [{"CI": "true"}, {"FUELPIPE_QUIET": "1"}])
def test_progress_is_quiet_in_ci_and_when_asked(tmp_path, quiet):
    rc, out = run_on_a_terminal(SLOW_FAILING_BUILD, child_env(tmp_path, **quiet))
    assert rc == 0, out
    assert "building fuelpipe's C++ kernels" not in out
    assert "refused: KernelBuildError True" in out


def test_a_short_wait_prints_nothing(tmp_path):
    code = ("import time\nfrom fuelpipe.progress import waiting\n"
            "with waiting('a short thing'):\n    time.sleep(0.3)\nprint('over')")
    rc, out = run_on_a_terminal(code, child_env(tmp_path))
    assert rc == 0 and "over" in out and "a short thing" not in out, out


def test_kernels_module_builds_ahead_or_names_the_failure(tmp_path):
    """``python -m fuelpipe.kernels`` with a compiler that is not there: exit 1, the reason named."""
    env = child_env(tmp_path, CXX=str(tmp_path / "no-such-compiler"), CI="true")
    proc = subprocess.run([sys.executable, "-m", "fuelpipe.kernels"], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "\nfuelpipe kernels: could not build fuelpipe's kernels" in "\n" + proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
