"""The real CLI as tests drive it: a lean experiment for sweeps, and a ``python -m fuelpipe`` process that
can be Ctrl-C'd the way a terminal does it."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from conftest import ROOT, with_tiny_model
from fuelpipe.oracles.registry import ORACLES

LEAN = [  # a fast experiment: one oracle, a two-token benchmark, one thread per worker
    "experiment=smoke", "backend.threads=1", "experiment.bench.tokens=2",
    *(f"experiment.oracles.{n}.enabled=false" for n in ORACLES if n != "plan_vs_replan"),
]
STOP_BOUND_S = 3.0  # Ctrl-C to exit: ~0.1 s here; the bound leaves room for a loaded CI machine


class Cli:
    """``python -m fuelpipe ARGS`` in its own session, its output gathered as it comes."""

    def __init__(self, *args: str, cwd: Path, env: dict | None = None) -> None:
        env = dict(env or os.environ, CI="true",
                   PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
        args = tuple(with_tiny_model(args))  # the tiny model and the fx backend unless named
        self.proc = subprocess.Popen([sys.executable, "-m", "fuelpipe", *args], cwd=cwd, env=env, text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        self.out, self.err = [], []
        self._readers = [threading.Thread(target=self._read, args=(s, b), daemon=True)
                         for s, b in ((self.proc.stdout, self.out), (self.proc.stderr, self.err))]
        for r in self._readers:
            r.start()

    @staticmethod
    def _read(stream, into: list) -> None:
        for chunk in iter(lambda: stream.read(1), ""):
            into.append(chunk)

    @property
    def stdout(self) -> str:
        return "".join(self.out)

    @property
    def stderr(self) -> str:
        return "".join(self.err)

    def wait_for(self, text: str, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.stdout:
            assert self.proc.poll() is None, (f"exited {self.proc.returncode} first: "
                                              f"{self.stdout[-2000:]}{self.stderr[-3000:]}")
            assert time.monotonic() < deadline, f"no {text!r} after {timeout} s: {self.stdout[-2000:]}"
            time.sleep(0.1)

    def ctrl_c(self, timeout: float = 120) -> int:
        """SIGINT to the whole process group, as a terminal sends it; the exit code. ``stop_s``: signal to exit."""
        sent = time.monotonic()
        os.killpg(self.proc.pid, signal.SIGINT)
        code = self.proc.wait(timeout=timeout)
        self.stop_s = time.monotonic() - sent
        print(f"Ctrl-C to exit: {self.stop_s:.2f} s")
        for r in self._readers:
            r.join(timeout=10)
        return code


def check_clean_stop(cli: Cli, code: int) -> None:
    assert code == 130, cli.stdout[-2000:] + cli.stderr[-3000:]
    assert "Traceback" not in cli.stdout + cli.stderr, cli.stderr[-3000:]
    assert "interrupted (Ctrl-C)" in cli.stderr
    assert cli.stop_s < STOP_BOUND_S, f"{cli.stop_s:.2f} s from Ctrl-C to exit"
