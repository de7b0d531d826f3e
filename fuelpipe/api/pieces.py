"""Generated tokens as text pieces: decoded incrementally, cut at stop strings, whole characters only.

Each token re-decodes the generated ids and hands out only the new suffix. A trailing U+FFFD (bytes of a
character whose remaining bytes are still to come) and a trailing prefix of a stop string are held back,
so no piece is ever taken back: the pieces join to the final text.
"""
from __future__ import annotations

from typing import Sequence

REPLACEMENT = "\ufffd"


class TextPieces:
    def __init__(self, decode, stop: Sequence[str] = ()) -> None:
        self.decode = decode  # ids -> text
        self.stop = tuple(stop)
        self.ids: list[int] = []
        self.text = ""  # the decoded text so far, cut before a stop string once one is found
        self.shown = 0  # characters of ``text`` already handed out
        self.stopped = False  # a stop string was found

    def push(self, token: int) -> str:
        """Add one token; the text that is now certain (possibly empty)."""
        self.ids.append(token)
        text = self.decode(self.ids)
        if not text.startswith(self.text[:self.shown]):  # an earlier piece changed: wait for it to settle
            return ""
        cut = min((i for i in (text.find(s) for s in self.stop) if i >= 0), default=-1)
        if cut >= 0:
            self.text, self.stopped = text[:cut], True
            return self.flush()
        self.text = text
        ready = len(text) - max(self._held_stop(text), len(text) - len(text.rstrip(REPLACEMENT)))
        piece = text[self.shown:ready] if ready > self.shown else ""
        self.shown = max(self.shown, ready)
        return piece

    def flush(self) -> str:
        """Everything not yet handed out (at the end of the generation)."""
        piece = self.text[self.shown:]
        self.shown = len(self.text)
        return piece

    def _held_stop(self, text: str) -> int:
        """Length of the longest end of ``text`` that begins some stop string."""
        return max((n for s in self.stop for n in range(min(len(s) - 1, len(text)), 0, -1)
                    if s.startswith(text[-n:])), default=0)
