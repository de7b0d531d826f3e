"""The engine: one thread owns the model's continuous batcher; requests arrive on a queue, tokens leave on each
request's own queue.

Only the engine thread touches the batcher, its cache and the model. Any other thread (an HTTP handler)
calls ``submit`` and gets a ``Ticket``: the ticket says first whether the batcher took the request or refused
it (a request that can never fit), then hands out the tokens as the batched steps decode them, then how the
request finished. ``cancel`` (the reader went away, or a stop string ended its text) frees the request's row
before the engine's next step. A batched step that raises fails the requests it ran, never the engine.
"""
from __future__ import annotations

import queue
import sys
import threading
import traceback
from dataclasses import dataclass
from typing import Iterator, Optional, Union

from fuelpipe.batch import BatchDecoder, ContinuousBatcher, Request, RequestResult
from fuelpipe.context import InferenceContext
from fuelpipe.errors import ConfigError, FuelpipeError

DEFAULT_MAX_SEQ_LEN = 2048  # positions per batch row when the model allows as many


@dataclass(frozen=True)
class EngineSpec:
    max_batch: int = 4  # requests decoded at once (rows of the batch cache)
    max_seq_len: Optional[int] = None  # positions per row (prompt + completion); None: 2048 or the model's limit

    def __post_init__(self) -> None:
        b = self.max_batch
        if isinstance(b, bool) or not isinstance(b, int) or b < 1:
            raise ConfigError(f"max_batch must be an integer >= 1, got {b!r}")
        n = self.max_seq_len
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 2):
            raise ConfigError(f"max_seq_len must be an integer >= 2 (a prompt token and a new one), got {n!r}")

    def row_positions(self, model_limit: int) -> int:
        """Positions per row: as set (the cache refuses more than ``model_limit``), else the default capped."""
        return self.max_seq_len if self.max_seq_len is not None else min(DEFAULT_MAX_SEQ_LEN, model_limit)


class EngineStopped(FuelpipeError):
    """The engine stopped (the server is shutting down) before the request finished."""


@dataclass(frozen=True)
class Finished:
    reason: str  # the batcher's finish: length | stop | cancelled | refused | error
    error: Optional[Exception] = None


_ACCEPTED = "accepted"
Event = Union[str, list, Finished]  # _ACCEPTED, then token chunks (list[int]), then one Finished


class Ticket:
    """One request's side of the engine: read on the submitting thread, written by the engine thread."""

    def __init__(self, request: Request) -> None:
        self.request = request
        self.finished: Optional[Finished] = None  # set once the reader has seen the end
        self._events: queue.SimpleQueue[Event] = queue.SimpleQueue()
        self._result: Optional[RequestResult] = None  # the batcher's record (engine thread only)
        self._sent = 0  # tokens of the result already handed out (engine thread only)

    def refusal(self) -> Optional[Finished]:
        """Wait until the engine has taken the request: None when it runs (or waits for a row), else the refusal."""
        event = self._events.get()
        if event == _ACCEPTED:
            return None
        assert isinstance(event, Finished), f"the first event of a ticket is its admission, got {event!r}"
        self.finished = event
        return event

    def tokens(self) -> Iterator[int]:
        """The request's tokens as they are decoded; ``finished`` says why they ended."""
        while self.finished is None:
            event = self._events.get()
            if isinstance(event, Finished):
                self.finished = event
            else:
                yield from event


class Engine:
    def __init__(self, context: InferenceContext, spec: Optional[EngineSpec] = None) -> None:
        spec = spec or EngineSpec()
        self.context, self.spec = context, spec
        self.width = spec.row_positions(context.model.dims.max_position_embeddings)
        self.kv = context.new_batch_cache(spec.max_batch, self.width)
        self.decoder = BatchDecoder(context, self.kv, spec.max_batch)  # its bucket plans live as long as the engine
        self._batcher = self._fresh_batcher()
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._live: list[Ticket] = []  # taken by the batcher, not finished yet
        self.counts = {"requests": 0, "refused": 0, "cancelled": 0, "errors": 0, "tokens": 0, "peak_batch": 0}
        self._stopping = threading.Event()
        self._gate = threading.Lock()  # a submit lands before the stop message or is refused, never after it
        self._thread = threading.Thread(target=self._loop, name="fuelpipe-engine", daemon=True)
        self._thread.start()

    # ---- any thread ----------------------------------------------------------------------
    def submit(self, request: Request) -> Ticket:
        ticket = Ticket(request)
        with self._gate:
            if self._stopping.is_set():
                ticket._events.put(Finished("refused", EngineStopped("the server is shutting down")))
            else:
                self._inbox.put(("submit", ticket))
        return ticket

    def cancel(self, ticket: Ticket) -> None:
        """Free ``ticket``'s row at the next step; nothing when it has finished already."""
        if ticket.finished is None and not self._stopping.is_set():
            self._inbox.put(("cancel", ticket))

    def stats(self) -> dict:
        return {**self.counts, "in_flight": len(self._live), "max_batch": self.spec.max_batch,
                "row_positions": self.width}

    def stop(self, timeout: float = 10.0) -> None:
        """Stop after the current step; every unfinished request ends with ``EngineStopped``."""
        with self._gate:
            self._stopping.set()
            self._inbox.put(("stop", None))
        self._thread.join(timeout)

    # ---- the engine thread ---------------------------------------------------------------
    def _fresh_batcher(self) -> ContinuousBatcher:
        return ContinuousBatcher(self.context, self.kv, decoder=self.decoder)

    def _loop(self) -> None:
        while True:
            try:
                kind, ticket = self._inbox.get(block=not self._live)  # idle: sleep until a request comes
            except queue.Empty:
                kind = None
            while kind is not None:
                if kind == "stop":
                    self._end_all(EngineStopped("the server stopped before the request finished"))
                    return
                self._take(kind, ticket)
                try:
                    kind, ticket = self._inbox.get_nowait()
                except queue.Empty:
                    kind = None
            if self._live:
                self._step()

    def _take(self, kind: str, ticket: Ticket) -> None:
        if kind == "cancel":
            if ticket in self._live and self._batcher.cancel(ticket._result):
                self.counts["cancelled"] += 1
            return
        self.counts["requests"] += 1
        try:
            result = self._batcher.submit(ticket.request)
        except FuelpipeError as err:  # a request the batcher refuses to take
            refusal = Finished("refused", err)
        except Exception as err:  # a bug: this request fails, the engine goes on
            traceback.print_exc(file=sys.stderr)
            refusal = Finished("error", err)
        else:
            refusal = Finished("refused", result.error) if result.finish == "refused" else None
        if refusal is not None:
            self.counts["refused" if refusal.reason == "refused" else "errors"] += 1
            ticket._events.put(refusal)
            return
        ticket._result = result
        self._live.append(ticket)
        ticket._events.put(_ACCEPTED)

    def _step(self) -> None:
        try:
            self._batcher.step()
        except Exception as err:  # a bug in a batched step: the requests it ran fail, the engine goes on
            traceback.print_exc(file=sys.stderr)
            self._end_all(err)
            return
        if self._batcher.batch_sizes:
            self.counts["peak_batch"] = max(self.counts["peak_batch"], self._batcher.batch_sizes[-1])
        for ticket in list(self._live):
            result = ticket._result
            if len(result.tokens) > ticket._sent:
                ticket._events.put(result.tokens[ticket._sent:])
                self.counts["tokens"] += len(result.tokens) - ticket._sent
                ticket._sent = len(result.tokens)
            if result.done:
                self.counts["errors"] += result.finish == "error"
                ticket._events.put(Finished(result.finish, result.error))
                self._live.remove(ticket)
        if not self._live:
            self._batcher = self._fresh_batcher()  # idle: the finished requests' records go, the plans stay

    def _end_all(self, error: Exception) -> None:
        for ticket in self._live:
            if not ticket._result.done:
                self._batcher.cancel(ticket._result)  # its row is free again
            ticket._events.put(Finished("error", error))
            self.counts["errors"] += 1
        self._live.clear()
        self._batcher = self._fresh_batcher()
