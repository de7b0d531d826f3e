"""One request's text as the engine decodes its tokens: pieces cut at stop strings, whole characters only.

The pieces are ``TextModel.stream``'s (``fuelpipe.api.pieces``), so a served greedy completion has the text
``TextModel.generate`` gives. A stop string ends the text and cancels the request, so its row is free at the
engine's next step; so does a reader that stops reading (``close``, or the generator dropped).
"""
from __future__ import annotations

from typing import Iterator, Optional, Sequence

from fuelpipe.api.pieces import TextPieces
from fuelpipe.errors import FuelpipeError
from fuelpipe.serve.engine import Engine, Ticket
from fuelpipe.serve.openai_response import Usage


class GenerationFailed(FuelpipeError):
    """The request failed while it ran (a non-finite logits row, a failed batched step, the server stopping)."""


class TextRun:
    def __init__(self, engine: Engine, ticket: Ticket, decode, stop: Sequence[str], prompt_tokens: int) -> None:
        self.engine, self.ticket = engine, ticket
        self.text = TextPieces(decode, stop)
        self.prompt_tokens = prompt_tokens
        self.finish_reason: Optional[str] = None  # "stop" or "length" once the text has ended

    def pieces(self) -> Iterator[str]:
        """The completion's text in pieces; they join to the whole text. Raises ``GenerationFailed``."""
        try:
            for token in self.ticket.tokens():
                piece = self.text.push(token)
                if piece:
                    yield piece
                if self.text.stopped:
                    self.finish_reason = "stop"
                    return
            finished = self.ticket.finished
            if finished.reason not in ("stop", "length"):
                raise GenerationFailed(f"the request ended with {finished.reason}: {finished.error}")
            self.finish_reason = finished.reason  # "stop": an end-of-text id; "length": max_tokens reached
            piece = self.text.flush()
            if piece:
                yield piece
        finally:
            self.engine.cancel(self.ticket)  # a stop string, or a reader gone: free the row (nothing if finished)

    @property
    def usage(self) -> Usage:
        return Usage(self.prompt_tokens, len(self.text.ids))
