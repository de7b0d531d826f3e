"""Shared fixtures: tiny deterministic models, small decode helpers, in-process config composition, the real CLI."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from fuelpipe.config import conf_dir
from fuelpipe.config.preflight import VERSION_BASE
from fuelpipe.context import InferenceContext
from models.registry import build_random_model
from _support import _global_state

# Plans persist in a private folder for the session, never in the user's ~/.cache/fuelpipe (CLI runs
# in subprocesses inherit it).
os.environ["FUELPIPE_CACHE_DIR"] = tempfile.mkdtemp(prefix="fuelpipe-test-plans-")

# Two cores: keep torch from oversubscribing when pytest runs alongside other work.
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))

ROOT = Path(__file__).resolve().parents[1]
CONF = conf_dir()
FAST = ["backend=eager"]  # presets say nothing about the backend; eager keeps in-process runs quick
PROMPT = [3, 17, 42, 7, 99]


@pytest.fixture(autouse=True)
def no_leaked_global_state():
    """Every test leaves process-wide settings (torch threads and configs, the environment, the
    registries) as it found them: a leak is restored and fails the test that made it."""
    before = _global_state.snapshot()
    yield
    leaked = _global_state.leaks(before)
    if leaked:
        _global_state.restore(before)
        pytest.fail("the test left process-wide state changed: " + "; ".join(leaked[:8]), pytrace=False)


@pytest.fixture(scope="session")
def tiny_llama():
    return build_random_model("llama", "tiny", seed=1)


def decode_logits(ctx: InferenceContext, cache, prompt, steps: int, tokens=None) -> list[torch.Tensor]:
    """Prefill ``prompt``, then decode ``steps`` tokens (greedy unless ``tokens`` forces them).

    Returns one [vocab] f32 row per step: the prefill's last row, then each decode step's.
    """
    out = [ctx.prefill(cache, prompt)[0]]
    for i in range(steps):
        tok = tokens[i] if tokens is not None else int(torch.argmax(out[-1]))
        out.append(ctx.decode(cache, tok)[0])
    return out


def fed_sequence(prompt, logits, tokens=None) -> list[int]:
    """The full token sequence that produced ``logits`` (prompt + tokens fed to each decode step)."""
    seq = list(prompt)
    for i, row in enumerate(logits[:-1]):
        seq.append(tokens[i] if tokens is not None else int(torch.argmax(row)))
    return seq


@pytest.fixture
def compose_cfg():
    """compose_cfg(overrides, hydra=False) -> DictConfig, with GlobalHydra cleared around every call."""

    def _compose(overrides=(), hydra: bool = False, tiny: bool = True):
        GlobalHydra.instance().clear()
        overrides = with_tiny_model(overrides) if tiny else list(overrides)
        with initialize_config_dir(str(CONF), version_base=VERSION_BASE):
            return compose("config", overrides=overrides, return_hydra_config=hydra)

    threads = torch.get_num_threads()
    yield _compose
    GlobalHydra.instance().clear()
    torch.set_num_threads(threads)  # assemble() applies a composed config's backend.threads process-wide


def with_tiny_model(overrides) -> list[str]:
    """Tests run on the tiny random Llama and the fx backend unless they name a model or a backend (the
    shipped defaults are a real checkpoint and backend=aot, whose build the tests that name it pay for)."""
    overrides = list(overrides)
    if not any(o.startswith(("backend=", "backend.name=")) for o in overrides):
        overrides = [*overrides, "backend=fx"]
    if any(o.startswith("model=") for o in overrides):
        return overrides
    return [*overrides, "model=llama_tiny"]


def run_cli(*args: str, cwd: Path, timeout: float = 240, default_model: bool = False) -> subprocess.CompletedProcess:
    """``python -m fuelpipe ARGS`` as CI runs it (CI=true: no progress bars), on the tiny model unless
    ``default_model`` (the real shipped default) or ARGS name a model."""
    if not default_model and args[:1] != ("report",):
        args = tuple(with_tiny_model(args))
    env = dict(os.environ, CI="true", PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.run(
        [sys.executable, "-m", "fuelpipe", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def default_or_slow(cases, keep, ids=None):
    """``cases`` as pytest params: those in ``keep`` run by default, the rest only with ``-m slow``.

    Every family x KV combination stays covered (the slow CI step runs them all); the default run
    keeps a representative few so it fits its time budget.
    """
    keep = set(keep)
    out = []
    for i, case in enumerate(cases):
        marks = () if case in keep else (pytest.mark.slow,)
        out.append(pytest.param(*case, marks=marks, id=None if ids is None else ids[i]))
    return out


@pytest.fixture
def threads():
    """torch.set_num_threads for the test; the thread count before it is restored after."""
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)
