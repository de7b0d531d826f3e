"""Continuous batching: admit requests as others finish, decode every running one per batched step.

Design (also in docs/batching.md):

* **Admission.** Requests wait in FIFO order. One is admitted when a row is
  free and the cache can hold its whole need (prompt + max_new_tokens - 1
  positions) now; its slot or blocks are reserved up front, so a running
  request never runs out of room mid-run. A request that could never fit
  (longer than a row's capacity, more blocks than the pool has, positions
  past the model's limit) is refused at once with its own typed error; the
  others go on untouched.
* **Prefill beside the batch.** The prompts of the requests joining at one
  step run together in one packed prompt step (``fuelpipe.batch.packed_prefill``:
  all their tokens as one row, a block-diagonal mask, each token writing its
  own sequence's slot or blocks), between two batched steps. The running rows
  are not stepped during it and nothing of theirs is read or written, so their
  tokens cannot change. A packed step the checks refuse falls back to one
  prompt at a time, so a request that fails fails alone.
* **Decode.** Every running request feeds its last token in one batched step
  (the smallest bucket holding them); each samples its next token with its
  own sampler, so a seeded request draws the same tokens whatever its batch
  neighbours are. A request that finishes (stop id or max_new_tokens) frees
  its slot or blocks at once, and the next queued request may take them.
* **Cancel.** ``cancel`` ends a queued or running request whose reader went
  away (a server's client); a running one frees its slot or blocks at once.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import torch

from fuelpipe.batch.buckets import BatchSpec
from fuelpipe.batch.decoder import BatchDecoder
from fuelpipe.context import InferenceContext
from fuelpipe.token_ids import count_arg, token_id_list
from fuelpipe.errors import FuelpipeError, InputError, KvCapacityError
from fuelpipe.sampling import Sampler, SamplingParams, sampler_for


@dataclass(frozen=True)
class Sampling:
    """How a request picks tokens: greedy (temperature 0) or seeded sampling, with top-k, top-p, min-p and a
    repetition penalty as ``SamplingParams`` has them (all off by default; ``seed`` None draws a fresh seed)."""

    temperature: float = 0.0
    top_k: int = 0
    seed: Optional[int] = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0

    def __post_init__(self) -> None:
        self.params()  # SamplingParams checks every field (a ConfigError names the constraint and the value)

    def params(self) -> SamplingParams:
        return SamplingParams(self.temperature, self.top_k, self.top_p, self.min_p, self.repetition_penalty, self.seed)

    def sampler(self, prompt_ids: Sequence[int] = ()) -> Sampler:
        """A fresh sampler: its random stream (and, with a repetition penalty, the history it has seen, starting
        with ``prompt_ids``) belongs to one request."""
        return sampler_for(self.params(), prompt_ids)


@dataclass(frozen=True)
class Request:
    prompt_ids: tuple[int, ...]
    max_new_tokens: int
    stop_ids: tuple[int, ...] = ()
    sampling: Sampling = Sampling()
    name: str = ""

    @property
    def positions(self) -> int:
        """KV positions the request writes (the last sampled token is never fed back)."""
        return len(self.prompt_ids) + self.max_new_tokens - 1


@dataclass
class RequestResult:
    index: int  # submission order
    request: Request
    tokens: list[int] = field(default_factory=list)
    logits: list[torch.Tensor] = field(default_factory=list)  # per token [vocab] f32, when kept
    finish: str = "queued"  # queued | running | length | stop | refused | error | cancelled
    error: Optional[FuelpipeError] = None
    admitted_step: Optional[int] = None  # batched steps run before it joined
    finished_step: Optional[int] = None
    prefill_s: float = 0.0

    @property
    def done(self) -> bool:
        return self.finish in ("length", "stop", "refused", "error", "cancelled")


PACKED_PREFILL_TOKENS = 1024  # prompt tokens per packed prompt step (a longer prompt runs alone in its own)


def _token_chunks(runs: list, budget: int) -> list[list]:
    """``runs`` in order, grouped so each group's prompts hold at most ``budget`` tokens (or one prompt)."""
    chunks: list[list] = []
    size = 0
    for run in runs:
        n = len(run.result.request.prompt_ids)
        if not chunks or size + n > budget:
            chunks.append([])
            size = 0
        chunks[-1].append(run)
        size += n
    return chunks


class _Running:
    def __init__(self, result: RequestResult, handle, sampler: Sampler, stops: set[int]) -> None:
        self.result, self.handle, self.sampler, self.stops = result, handle, sampler, stops
        self.last: int = -1


class ContinuousBatcher:
    """Serve many requests through one batch cache and one ``BatchDecoder`` (one held plan per bucket)."""

    def __init__(self, ctx: InferenceContext, kv, spec: BatchSpec | int | None = None, *,
                 keep_logits: bool = False,
                 on_token: Optional[Callable[[int, int], None]] = None,
                 decoder: Optional[BatchDecoder] = None) -> None:
        """``decoder``: a ``BatchDecoder`` over the same ``kv`` to serve through (a server's long-lived one,
        whose bucket plans are already built); by default a new one."""
        self.ctx, self.kv = ctx, kv
        if decoder is not None and (decoder.kv is not kv or decoder.ctx is not ctx):
            raise InputError("ContinuousBatcher: the given decoder serves another cache or context; "
                             "pass the kv and ctx it was built with")
        self.decoder = decoder if decoder is not None else BatchDecoder(ctx, kv, spec)
        self.keep_logits = keep_logits
        self.on_token = on_token  # (request index, token)
        self.results: list[RequestResult] = []
        self._queue: deque[RequestResult] = deque()
        self._running: list[_Running] = []
        self.decode_s = 0.0  # time in batched steps
        self.prefill_s = 0.0
        self.prefill_calls = 0  # packed prompt steps run
        self.batch_sizes: list[int] = []  # live rows per batched step
        self.step_s: list[float] = []  # seconds per batched step

    # ---- requests ------------------------------------------------------------------------
    def submit(self, request: Request) -> RequestResult:
        """Queue ``request``; malformed input raises ``InputError``, a request that can never fit is refused."""
        req = self._checked(request)
        result = RequestResult(len(self.results), req)
        self.results.append(result)
        reason = self._never_fits(req)
        if reason is not None:
            result.finish, result.error = "refused", reason
        else:
            self._queue.append(result)
        return result

    def _checked(self, r: Request) -> Request:
        if not isinstance(r, Request):
            raise InputError(f"submit takes a Request, got {type(r).__name__}")
        prompt = tuple(token_id_list(r.prompt_ids, "Request.prompt_ids"))
        if not prompt:
            raise InputError("Request.prompt_ids must hold at least one token")
        vocab = self.ctx.model.dims.vocab_size
        bad = sorted({t for t in prompt if not 0 <= t < vocab})
        if bad:
            raise InputError(f"Request.prompt_ids must lie in [0, {vocab}), got {bad[:8]}")
        n = count_arg("Request.max_new_tokens", r.max_new_tokens)
        if n < 1:
            raise InputError(f"Request.max_new_tokens must be >= 1, got {n}")
        stops = tuple(token_id_list(r.stop_ids, "Request.stop_ids"))
        if not isinstance(r.sampling, Sampling):
            raise InputError(f"Request.sampling must be a Sampling, got {type(r.sampling).__name__}")
        return Request(prompt, n, stops, r.sampling, str(r.name))

    def _never_fits(self, req: Request) -> Optional[FuelpipeError]:
        need = req.positions
        limit = self.ctx.model.dims.max_position_embeddings
        what = f"request {req.name or len(self.results) - 1!r} writes {need} positions ({len(req.prompt_ids)}-token " \
               f"prompt + max_new_tokens {req.max_new_tokens} - 1)"
        if need > limit:
            return InputError(f"{what}, beyond the model's max_position_embeddings {limit}")
        if need > self.kv.width:
            return KvCapacityError(f"{what}, more than a batch row holds ({self.kv.width} positions)")
        beyond = self.kv.never_holds(need)
        if beyond is not None:
            return KvCapacityError(f"{what}, {beyond}")
        return None

    def _fits_now(self, req: Request) -> bool:
        if not self.kv.free_rows:
            return False
        return self.kv.holds_now(req.positions)

    def cancel(self, result: RequestResult) -> bool:
        """End ``result``'s request now (its reader went away): a queued one leaves the queue, a running one
        frees its slot or blocks at once. False when it had already finished."""
        if result.done:
            return False
        if result in self._queue:
            self._queue.remove(result)
            result.finish, result.finished_step = "cancelled", self.decoder.steps
            return True
        run = next((r for r in self._running if r.result is result), None)
        if run is None:
            raise InputError(f"cancel: request {result.request.name or result.index!r} is not one this batcher runs")
        self._finish(run, "cancelled")
        return True

    # ---- running -------------------------------------------------------------------------
    def _emit(self, run: _Running, logits_row: torch.Tensor) -> None:
        """Sample ``run``'s next token from its logits [1, vocab]; finish it when done."""
        res = run.result
        try:
            token = run.sampler(logits_row)
        except FuelpipeError as err:  # a non-finite row fails this request only
            self._finish(run, "error", err)
            return
        res.tokens.append(token)
        if self.keep_logits:
            res.logits.append(logits_row[0].clone())
        if self.on_token is not None:
            self.on_token(res.index, token)
        run.last = token
        if token in run.stops:
            self._finish(run, "stop")
        elif len(res.tokens) == res.request.max_new_tokens:
            self._finish(run, "length")

    def _finish(self, run: _Running, how: str, error: Optional[FuelpipeError] = None) -> None:
        run.result.finish, run.result.error = how, error
        run.result.finished_step = self.decoder.steps
        self.kv.release(run.handle)  # its slot or blocks are free at once
        if run in self._running:
            self._running.remove(run)

    def _admit(self) -> None:
        """Take every queued request that fits now, then run their prompts packed (one call per
        ``PACKED_PREFILL_TOKENS`` tokens) and emit each one's first token."""
        joining: list[_Running] = []
        while self._queue and self._fits_now(self._queue[0].request):
            res = self._queue.popleft()
            req = res.request
            run = _Running(res, self.kv.acquire(), req.sampling.sampler(req.prompt_ids), set(req.stop_ids))
            res.finish, res.admitted_step = "running", self.decoder.steps
            try:
                run.handle.reserve(req.positions)  # all its room now, or refused with nothing taken
            except FuelpipeError as err:
                self._finish(run, "error", err)
                continue
            joining.append(run)
        for chunk in _token_chunks(joining, PACKED_PREFILL_TOKENS):
            self._prefill(chunk)

    def _prefill(self, chunk: list[_Running]) -> None:
        t0 = time.perf_counter()
        try:
            logits = self.decoder.prefill([r.handle for r in chunk], [list(r.result.request.prompt_ids) for r in chunk])
            outcome = [(run, logits[i : i + 1], None) for i, run in enumerate(chunk)]
        except FuelpipeError:
            # The packed step checks everything before it runs, so nothing was written: run each prompt alone,
            # and a request that fails fails alone.
            outcome = []
            for run in chunk:
                try:
                    outcome.append((run, self.ctx.prefill(run.handle, list(run.result.request.prompt_ids)), None))
                except FuelpipeError as err:
                    outcome.append((run, None, err))
        took = time.perf_counter() - t0
        self.prefill_s += took
        self.prefill_calls += 1
        for run, logits_row, err in outcome:
            run.result.prefill_s = took  # the call its prompt ran in
            if err is not None:
                self._finish(run, "error", err)
                continue
            self._running.append(run)
            self._emit(run, logits_row)

    def step(self) -> bool:
        """Admit what fits, then run one batched decode step. False when nothing is left to do."""
        self._admit()
        if not self._running and self._queue:
            # Nothing runs, so nothing will free room: what the head needs is held outside this batcher
            # (sequences acquired from the same cache or pool by hand). Refuse it instead of waiting forever.
            res = self._queue.popleft()
            res.finish, res.error = "refused", KvCapacityError(
                f"request {res.request.name or res.index!r} needs {res.request.positions} positions but nothing this "
                f"batcher runs holds the room it lacks ({self.kv.free_room()}); the rest is held outside the batcher")
            return True
        if not self._running:
            return False
        runs = list(self._running)
        t0 = time.perf_counter()
        logits = self.decoder.step([r.handle for r in runs], [r.last for r in runs])  # [n, vocab]
        took = time.perf_counter() - t0
        self.decode_s += took
        self.step_s.append(took)
        self.batch_sizes.append(len(runs))
        for i, run in enumerate(runs):
            self._emit(run, logits[i : i + 1])
        return bool(self._running or self._queue)

    def run(self, requests: Sequence[Request] = ()) -> list[RequestResult]:
        """Submit ``requests``, serve everything queued to completion; results in submission order."""
        for r in requests:
            self.submit(r)
        while self.step():
            pass
        return list(self.results)

    def describe(self) -> dict:
        tokens = sum(len(r.tokens) for r in self.results)
        decoded = sum(self.batch_sizes)
        build_s = sum(p.stats.build_s for p in self.decoder.plans.values())
        steady = self.decode_s - build_s
        return {**self.decoder.describe(), "requests": len(self.results),
                "refused": sum(r.finish == "refused" for r in self.results),
                "errors": sum(r.finish == "error" for r in self.results),
                "cancelled": sum(r.finish == "cancelled" for r in self.results),
                "tokens": tokens, "decode_s": self.decode_s, "prefill_s": self.prefill_s,
                "prefill_calls": self.prefill_calls,
                # steady state: the bucket plans' builds (inside the steps that built them) taken out
                "decode_tokens_per_s": decoded / steady if steady > 0 else None,
                "plan_build_s": build_s,
                "mean_batch": decoded / len(self.batch_sizes) if self.batch_sizes else None,
                "bytes_per_row": self.kv.bytes_per_slot()}
