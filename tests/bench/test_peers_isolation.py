"""A peer that crashes in native code costs its own row only: every peer runs in its own worker process."""
import functools
import os
import signal

import pytest

from _support.sigint import python_sigint_handler

from fuelpipe.bench.peers.floor import Bandwidth, Floor
from fuelpipe.bench.peers.isolated import IsolatedSystem, PeerCrashed, describe_exit
from fuelpipe.bench.peers.report import markdown
from fuelpipe.bench.peers.run import add_ratios, run_systems, summarize
from fuelpipe.bench.peers.systems import PeerSystem
from fuelpipe.bench.peers.trace import RunTrace


class SteadyPeer(PeerSystem):
    """Answers every prompt with its first ids, at a made-up 2 ms per token."""

    group = "llama.cpp"

    def __init__(self, name: str = "steady") -> None:
        self.name = name

    def run(self, prompt, new_tokens):
        return RunTrace(list(prompt[:new_tokens]), 5.0, [2.0] * (new_tokens - 1))

    def details(self):
        return {"pid": os.getpid()}


class SegfaultingPeer(SteadyPeer):
    """Kills its own process with SIGSEGV (as llama-cpp-python did on a quantized file) at ``when``."""

    def __init__(self, when: str, after_runs: int = 0) -> None:
        super().__init__(f"crashes in {when}")
        self.when, self.after_runs, self.runs = when, after_runs, 0

    def setup(self):
        if self.when == "setup":
            os.kill(os.getpid(), signal.SIGSEGV)

    def run(self, prompt, new_tokens):
        self.runs += 1
        if self.when == "run" and self.runs > self.after_runs:
            os.kill(os.getpid(), signal.SIGSEGV)
        return super().run(prompt, new_tokens)


class RaisingPeer(SteadyPeer):
    def run(self, prompt, new_tokens):
        raise RuntimeError("no such model file")


def _floor():
    return Floor(bytes_per_token=1e6, weight_bytes=10**6, kv_bytes=0.0, bandwidth=Bandwidth(10.0, "test", 1.0, 1))


def test_crashing_peers_become_rows_and_the_run_goes_on():
    systems = [
        IsolatedSystem(SteadyPeer, 1),
        IsolatedSystem(functools.partial(SegfaultingPeer, "setup"), 1),
        IsolatedSystem(functools.partial(SegfaultingPeer, "run", 2), 1),  # the warm-up and one timed run succeed
        IsolatedSystem(functools.partial(RaisingPeer, "raises"), 1),
        IsolatedSystem(functools.partial(SteadyPeer, "steady too"), 1),
    ]
    records = run_systems(systems, [7, 8, 9, 10], 4, reps=3)
    rows = summarize(records, _floor(), None)
    add_ratios(rows, ["steady"])
    status = {r["system"]: r["status"] for r in rows}
    assert status["steady"] == status["steady too"] == "ok"
    assert status["crashes in setup"] == "crashed (SIGSEGV) during setup (warm-up)"
    assert status["crashes in run"] == "crashed (SIGSEGV) during run (repetition 2)"
    assert status["raises"].startswith("failed during run: RuntimeError: no such model file")
    ok = {r["system"]: r for r in rows if r["status"] == "ok"}
    assert ok["steady"]["tokens_per_s"] == 500.0 and len(records[0].timed) == 3
    assert ok["steady"]["pid"] != os.getpid()  # it ran in its own worker
    assert set(ok["steady"]["peak_rss_mb"]) == {"load", "build", "decode"}
    assert all(v > 0 for v in ok["steady"]["peak_rss_mb"].values())  # the worker's peaks, read there
    assert all(s._proc is None for s in systems)  # every worker is gone after the run
    doc = {"rows": rows, "floor": {"bytes_per_token": 1e6, "weight_bytes": 1e6, "kv_bytes": 0.0,
                                   "bandwidth_gb_s": 10.0, "bandwidth_method": "test", "ms_per_token": 0.1},
           "env": {"threads": 1, "cpu": "test", "torch": "x"}, "peers": ["steady"], "model": "m", "dtype": "f32",
           "prompt_tokens": 4, "new_tokens": 4, "reps": 3, "reference": None}
    table = markdown(doc)
    assert "| crashes in run | f32 | crashed (SIGSEGV) during run (repetition 2) |" in table


def test_exit_descriptions():
    assert describe_exit(-signal.SIGSEGV) == "SIGSEGV"
    assert describe_exit(-signal.SIGKILL) == "SIGKILL"
    assert describe_exit(3) == "exit code 3"


def test_a_crash_outside_run_systems_is_typed():
    s = IsolatedSystem(functools.partial(SegfaultingPeer, "run"), 1)
    s.setup()
    with pytest.raises(PeerCrashed, match="SIGSEGV"):
        s.run([1, 2], 2)
    s.close()


class SlowPeer(SteadyPeer):
    def run(self, prompt, new_tokens):
        import time

        time.sleep(60)
        return super().run(prompt, new_tokens)


@pytest.mark.parametrize("to_worker", [True, False], ids=["terminal-ctrl-c", "parent-only"])
def test_ctrl_c_while_a_peer_runs_stops_its_worker_at_once_and_quietly(capfd, to_worker):
    """A terminal's Ctrl-C reaches the worker too (it exits without a traceback); sent to this process
    alone, the worker mid-run is killed rather than waited for (``close`` gave it 30 s)."""
    import threading
    import time

    system = IsolatedSystem(SlowPeer, 1)
    system.setup()  # the worker is up
    worker = system._proc

    def ctrl_c():
        if to_worker:
            os.kill(worker.pid, signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)

    timer = threading.Timer(1.0, ctrl_c)
    t0 = time.monotonic()
    with python_sigint_handler(), pytest.raises(KeyboardInterrupt):  # as a terminal has it, whatever the run inherited
        timer.start()
        try:
            system.run([1, 2, 3], 4)
        finally:
            system.close()
    assert time.monotonic() - t0 < 5.0 and not worker.is_alive()
    assert "Traceback" not in capfd.readouterr().err
