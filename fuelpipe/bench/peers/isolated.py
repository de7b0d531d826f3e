"""A peer system run in its own worker process, so that a crashing peer costs its own row only.

A peer is native code this project does not control: llama-cpp-python built
from source segfaulted on the Intel machines evaluating a quantized file,
which killed the whole benchmark and every result in it. ``IsolatedSystem``
wraps a ``PeerSystem`` factory and runs it in a spawned worker that lives for
the whole run (loaded once, timed many times, interleaved with the other
systems exactly as before). The parent sends commands over a pipe; when the
worker dies, the command raises ``PeerCrashed`` naming the signal (or exit
code), and the benchmark reports that as the row's status and goes on.

The worker runs on the parent's thread count. Its own resident memory (growth
and per-phase peaks) is reported in place of the parent's, which does not see it.
"""
from __future__ import annotations

import multiprocessing as mp
import signal
from typing import Callable, Optional

from fuelpipe.bench.peers.systems import PeerSystem
from fuelpipe.bench.peers.trace import RunTrace
from fuelpipe.errors import FuelpipeError
from fuelpipe.resident_memory import MB


class PeerCrashed(FuelpipeError):
    """The worker process running a peer system died (a signal or a non-zero exit)."""


def _serve(conn, make: Callable[[], PeerSystem], threads: int) -> None:
    """The worker: build the system, then answer commands until told to stop; Ctrl-C (the terminal sends
    it to the worker too) ends it quietly, the parent records the stop."""
    try:
        _answer(conn, make, threads)
    except KeyboardInterrupt:
        pass


def _answer(conn, make: Callable[[], PeerSystem], threads: int) -> None:
    import psutil
    import torch

    from fuelpipe.resident_memory import peak_mb, reset_peak

    torch.set_num_threads(threads)
    system = make()
    proc = psutil.Process()
    baseline = proc.memory_info().rss
    while True:
        cmd, args = conn.recv()
        if cmd == "stop":
            return
        try:
            if cmd == "setup":  # with the worker's peak resident set during it
                baseline = proc.memory_info().rss
                reset_peak()
                system.setup()
                out = peak_mb()
            elif cmd == "run":  # with its peak, and the worker's growth since setup began (weights, caches, code)
                reset_peak()
                trace = system.run(*args)
                out = (trace, peak_mb(), (proc.memory_info().rss - baseline) / MB)
            elif cmd == "details":
                out = system.details()
            else:
                raise ValueError(f"unknown command {cmd!r}")
            conn.send(("ok", out))
        except Exception as err:  # reported in the parent with the system's name
            conn.send(("error", f"{type(err).__name__}: {err}"))


def describe_exit(exitcode: Optional[int]) -> str:
    """'SIGSEGV' for a worker killed by signal 11, 'exit code 3' for a non-zero exit."""
    if exitcode is not None and exitcode < 0:
        try:
            return signal.Signals(-exitcode).name
        except ValueError:
            return f"signal {-exitcode}"
    return f"exit code {exitcode}"


class IsolatedSystem(PeerSystem):
    """``make()`` (a picklable factory: a class or ``functools.partial``) run in its own worker process."""

    def __init__(self, make: Callable[[], PeerSystem], threads: int) -> None:
        probe = make()  # cheap: construction only checks what is installed; setup loads
        self.name, self.group, self.weights = probe.name, probe.group, probe.weights
        self.missing, self.max_new_tokens = probe.missing, probe.max_new_tokens
        self._make, self._threads = make, threads
        self._proc: Optional[mp.process.BaseProcess] = None
        self._conn = None
        self._details: dict = {}
        self.worker_footprint_mb: Optional[float] = None
        self.last_peak_mb: Optional[float] = None  # the worker's peak resident set during the last command

    def _call(self, cmd: str, *args):
        if self._proc is None:
            ctx = mp.get_context("spawn")  # a clean interpreter: no inherited threads or torch state
            self._conn, child = ctx.Pipe()
            self._proc = ctx.Process(target=_serve, args=(child, self._make, self._threads), daemon=True,
                                     name=f"peer {self.name}")
            self._proc.start()
            child.close()
        try:
            self._conn.send((cmd, args))
            status, out = self._conn.recv()
        except KeyboardInterrupt:  # Ctrl-C: the command's answer is not wanted; stop the worker now, not after it
            self._proc.kill()
            self._proc.join()
            self._proc = None
            raise
        except (EOFError, OSError, BrokenPipeError):
            self._proc.join(timeout=30)
            how = describe_exit(self._proc.exitcode)
            self._proc = None
            raise PeerCrashed(f"crashed ({how}) during {cmd}") from None
        if status == "error":
            raise PeerCrashed(f"failed during {cmd}: {out}")
        return out

    def setup(self) -> None:
        self.last_peak_mb = self._call("setup")

    def run(self, prompt: list[int], new_tokens: int) -> RunTrace:
        trace, self.last_peak_mb, footprint = self._call("run", prompt, new_tokens)
        if self.worker_footprint_mb is None:  # after the warm-up run, as the in-process rows measure it
            self.worker_footprint_mb = footprint
        return trace

    def details(self) -> dict:
        if self._proc is not None and not self._details:
            try:
                self._details = self._call("details")
            except PeerCrashed:
                self._details = {}
        return self._details

    def close(self) -> None:
        if self._proc is not None:
            try:
                self._conn.send(("stop", ()))
            except (OSError, BrokenPipeError):
                pass
            self._proc.join(timeout=30)
            if self._proc.is_alive():
                self._proc.kill()
            self._proc = None
