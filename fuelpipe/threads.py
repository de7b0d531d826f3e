"""Decode threads that adapt to a busy machine: measure, then keep the thread count that is fastest now.

torch's intra-op pool (OpenMP) waits for its workers by spinning. Alone on the machine that is the fast
choice: a decode step opens ~100 parallel regions and a spinning worker joins each at once. When other
processes want the same cores, a spinning worker burns the time slice its partner needs and every region
waits for a descheduled thread: two 2-thread decodes on 2 cores ran 3x slower each than one alone, and
one beside a busy neighbour ran 20x slower, where one thread would have lost 1.25x.

No fixed setting is right for both, and the load changes while a generation runs, so the
``ThreadGovernor`` decides from evidence, step by step:

* **Start** at the largest candidate count (1, half, all) that fits the cores other processes leave free:
  threads they have runnable now, counted in ``/proc`` (all cores where that cannot be read).
* **Starved, look down.** Each decode step's share of the cores it asked for is its process CPU time over
  wall time x threads: about 1 alone (a spinning worker counts as busy), about 0.5 when a neighbour holds
  half of them. When the median share of the last three steps falls below ``starved``, the lower counts
  are probed.
* **Room, look up.** Below the top count, every so often (a gap that doubles each time a look finds no
  room or a probe loses) it counts the other processes' runnable threads again, and probes a higher count
  only when the cores for it are free.
* **A probe** runs a candidate for ``probe_steps`` steps and keeps it when its median is faster by
  ``margin``; a probe step slower than ``drift`` x the current median ends the probe at once (under
  contention one 2-thread step can cost twenty 1-thread steps).

Alone, a run at the top count never probes: the governor costs one clock read per step.

**Decode steps keep their bits.** A count changes only between steps, and only on a backend whose
decode step computes the same bits at any thread count (``BackendEntry.thread_invariant``: fx, inductor
and aot, whose linears are fuelpipe's kernels, split by output column); ``for_backend`` makes a governor
only there. The prompt runs at the governor's count too: at the caller's count it cost a SmolLM2 chat
seconds beside a busy neighbour. torch's prompt matmuls block by thread count, so a prompt run at another
count can move the logits' last bits, and under a changing load a near-tie token can differ from a quiet
run's. ``threads=N`` fixes the count for bit-reproducible runs; benchmarks and oracles never adapt.
"""
from __future__ import annotations

import os
import statistics
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from fuelpipe.errors import ConfigError


@dataclass(frozen=True)
class GovernorSpec:
    """When to look and how to compare: step counts and ratios (no wall-clock constants)."""

    first_interval: int = 8  # steps before the first look up (the gap doubles each time a look up fails)
    max_interval: int = 256  # the longest gap between two looks up, or between probes down while starved
    probe_steps: int = 3  # steps measured per candidate in a probe (their median is compared)
    starved: float = 0.8  # a median core share below this (last three steps) sends a probe down
    drift: float = 1.5  # a probe step slower than drift x the current median loses at once
    margin: float = 0.05  # a candidate must be this much faster (fraction) to replace the current count

    def __post_init__(self) -> None:
        for name in ("first_interval", "max_interval", "probe_steps"):
            if getattr(self, name) < 1:
                raise ConfigError(f"GovernorSpec.{name} must be >= 1, got {getattr(self, name)}")
        if self.max_interval < self.first_interval:
            raise ConfigError(f"GovernorSpec.max_interval {self.max_interval} < first_interval {self.first_interval}")
        if not 0.0 < self.starved < 1.0:
            raise ConfigError(f"GovernorSpec.starved must lie in (0, 1), got {self.starved}")
        if self.drift <= 1.0:
            raise ConfigError(f"GovernorSpec.drift must be > 1, got {self.drift}")
        if not 0.0 <= self.margin < 1.0:
            raise ConfigError(f"GovernorSpec.margin must lie in [0, 1), got {self.margin}")


def candidates(most: int) -> tuple[int, ...]:
    """The counts worth trying up to ``most``: all, half, one (no duplicates, ascending)."""
    if most < 1:
        raise ConfigError(f"thread count must be >= 1, got {most}")
    return tuple(sorted({1, max(1, most // 2), most}))


def fitting(options: tuple[int, ...], free: Optional[int]) -> int:
    """The largest option that fits ``free`` cores (the smallest option when none does; all when unknown)."""
    if free is None:
        return options[-1]
    fits = [t for t in options if t <= free]
    return fits[-1] if fits else options[0]


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity: taskset, cgroup cpusets), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def free_cores(looks: int = 3) -> Optional[int]:
    """Cores this process may use that other processes' runnable threads do not hold right now
    (the median of ``looks`` looks 10 ms apart); None where ``/proc`` cannot be read."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None
    seen: list[int] = []
    for i in range(looks):
        busy = _others_running()
        if busy is None:
            return None
        seen.append(busy)
        if i < looks - 1:
            time.sleep(0.01)
    return max(0, cores - int(statistics.median(seen)))


def _others_running() -> Optional[int]:
    """Threads of other processes in state R (running or runnable), from ``/proc/*/task/*/stat``."""
    own = os.getpid()
    try:
        pids = [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return None
    running = 0
    for pid in pids:
        if pid == own:
            continue
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue  # gone, or not ours to read
        for tid in tasks:
            try:
                with open(f"/proc/{pid}/task/{tid}/stat", "rb") as f:
                    stat = f.read()
            except OSError:
                continue
            state = stat[stat.rfind(b")") + 2:stat.rfind(b")") + 3]  # the field after the command's name
            running += state == b"R"
    return running


class ThreadGovernor:
    """Picks the decode thread count step by step; ``observe(wall, cpu)`` after each step.

    ``set_threads`` is how a choice takes effect (``torch.set_num_threads`` by default) and ``free`` how
    free cores are counted (``free_cores``); tests pass stand-ins. ``history`` keeps (threads, wall
    seconds, core share) per observed step, for reports and tests."""

    def __init__(self, most: Optional[int] = None, spec: GovernorSpec = GovernorSpec(),
                 set_threads: Callable[[int], None] = torch.set_num_threads,
                 free: Callable[[int], Optional[int]] = free_cores) -> None:
        self.most = torch.get_num_threads() if most is None else most
        self.options = candidates(self.most)
        self.spec = spec
        self._set = set_threads
        self._free = free
        self.current = fitting(self.options, free(3))
        self.recent: deque[float] = deque(maxlen=8)  # wall seconds per step at ``current``
        self.shares: deque[float] = deque(maxlen=3)  # core shares of the last steps at ``current``
        self.step = 0  # steps observed (not skipped)
        self.gap_up = self.gap_down = spec.first_interval
        self.due_up = spec.first_interval  # the step of the next look up
        self.due_down = 0  # the first step at which starvation may send a probe down
        self.skip = 0
        self.probe: Optional[_Probe] = None
        self.history: list[tuple[int, float, float]] = []
        self.switches = 0

    # ---- a generation's bounds ---------------------------------------------------------------------
    def begin(self) -> int:
        """A generation starts: take the count chosen so far for its prompt and steps (a probe in flight is
        dropped). Returns the caller's thread count, for ``end``."""
        caller = torch.get_num_threads()
        self.probe = None
        self.skip = 1  # a generation's first step may bind a new cache or build the plan: not a measure
        self._set(self.current)
        return caller

    def end(self, caller: int) -> None:
        """A generation ended: give the process back the caller's thread count."""
        self.probe = None
        self._set(caller)

    @property
    def threads(self) -> int:
        """The count the next step runs with."""
        return self.probe.threads if self.probe is not None else self.current

    # ---- one step ----------------------------------------------------------------------------------
    def observe(self, seconds: float, cpu_seconds: float) -> None:
        """Record one decode step (wall and process CPU seconds) that ran with ``self.threads``; may
        change the count for the next step."""
        threads = self.threads
        share = cpu_seconds / (seconds * threads) if seconds > 0 else 1.0
        self.history.append((threads, seconds, share))
        if self.skip:
            self.skip -= 1
            return
        self.step += 1
        if self.probe is not None:
            self._probe_step(seconds)
            return
        self.recent.append(seconds)
        self.shares.append(share)
        lower = [t for t in reversed(self.options) if t < self.current]  # nearest first
        higher = [t for t in reversed(self.options) if t > self.current]  # largest first
        if lower and self.step >= self.due_down and len(self.shares) == self.shares.maxlen and \
                statistics.median(self.shares) < self.spec.starved:
            self._start_probe(lower, "down")
        elif higher and self.step >= self.due_up:
            free = self._free(1)
            room = [t for t in higher if free is None or t <= free]
            if room:
                self._start_probe(room, "up")
            else:  # no room now: look again later, half as often
                self.gap_up = min(self.spec.max_interval, self.gap_up * 2)
                self.due_up = self.step + self.gap_up

    def _start_probe(self, queue: list[int], way: str) -> None:
        median = statistics.median(list(self.recent)[-3:])  # the steps as the load is now
        self.probe = _Probe(queue=queue, way=way, times=[], baseline=median, best=(median, self.current, []))
        self._set(self.probe.threads)

    def _probe_step(self, seconds: float) -> None:
        p, t = self.probe, self.probe.threads
        p.times.append(seconds)
        lost_early = seconds > self.spec.drift * p.baseline
        if not lost_early and len(p.times) < self.spec.probe_steps:
            return
        median = statistics.median(p.times)
        if not lost_early and median < p.best[0] * (1.0 - self.spec.margin):
            p.best = (median, t, list(p.times))
        p.queue.pop(0)
        p.times = []
        if p.queue:
            self._set(p.threads)
            return
        self.probe = None
        winner, times = p.best[1], p.best[2]
        if winner != self.current:
            self.current = winner
            self.recent = deque(times, maxlen=self.recent.maxlen)
            self.shares.clear()
            self.switches += 1
            self.gap_up = self.gap_down = self.spec.first_interval
            self.due_up = self.step + self.gap_up
            self.due_down = self.step
        elif p.way == "up":
            self.gap_up = min(self.spec.max_interval, self.gap_up * 2)
            self.due_up = self.step + self.gap_up
        else:  # starved, yet no lower count is faster: probe down again later, half as often
            self.shares.clear()
            self.gap_down = min(self.spec.max_interval, self.gap_down * 2)
            self.due_down = self.step + self.gap_down
        self._set(self.current)


@dataclass
class _Probe:
    queue: list[int]  # the candidates still to measure; the head is being measured
    way: str  # "down" (starved) or "up" (room)
    times: list[float]  # the head's steps so far
    baseline: float  # the current count's recent median, seconds per step
    best: tuple[float, int, list[float]]  # (median, threads, steps) of the fastest so far, the current first

    @property
    def threads(self) -> int:
        return self.queue[0]


def for_backend(name: str) -> Optional[ThreadGovernor]:
    """A governor when backend ``name``'s decode step is thread-count invariant, else None (fixed count)."""
    from fuelpipe.plan.backends import BACKENDS

    return ThreadGovernor() if BACKENDS.get(name).thread_invariant else None


def thread_use(governor: Optional[ThreadGovernor]) -> dict:
    """For results: whether the count adapted, how many decode steps ran at each count, and the switches."""
    if governor is None:
        return {"adaptive": False, "fixed": torch.get_num_threads()}
    steps: dict[int, int] = {}
    for threads, _, _ in governor.history:
        steps[threads] = steps.get(threads, 0) + 1
    return {"adaptive": True, "steps_at": {str(t): n for t, n in sorted(steps.items())},
            "switches": governor.switches, "chosen": governor.current}
