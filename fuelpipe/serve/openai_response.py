"""OpenAI's response bodies: a whole completion, a streamed chunk, the usage, the model list.

A completion is a ``text_completion`` with ``choices[0].text``; a chat completion is a ``chat.completion``
with ``choices[0].message``. Streamed, each piece of text is one chunk (a chat stream's first chunk carries
the assistant role, its pieces ``delta.content``); the last chunk carries ``finish_reason``, and with
``stream_options.include_usage`` one more chunk with no choices carries the usage.
"""
from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from typing import Optional

_serial = itertools.count(1)  # deliberate process-global counter: response ids (itertools.count is thread-safe)

OBJECTS = {"completion": ("text_completion", "text_completion"), "chat": ("chat.completion", "chat.completion.chunk")}


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int

    def body(self) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens}


class Responder:
    """The bodies of one response: one id and creation time for the whole completion or stream."""

    def __init__(self, kind: str, model: str) -> None:
        self.kind, self.model = kind, model
        prefix = "cmpl" if kind == "completion" else "chatcmpl"
        self.id, self.created = f"{prefix}-{next(_serial):08d}", int(time.time())

    def _head(self, streamed: bool) -> dict:
        return {"id": self.id, "object": OBJECTS[self.kind][streamed], "created": self.created, "model": self.model}

    def whole(self, text: str, finish_reason: str, usage: Usage) -> dict:
        if self.kind == "completion":
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        else:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                      "finish_reason": finish_reason}
        return {**self._head(False), "choices": [choice], "usage": usage.body()}

    def chunk(self, text: str, finish_reason: Optional[str] = None, *, first: bool = False) -> dict:
        if self.kind == "completion":
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        else:
            delta = {"role": "assistant", "content": text} if first else {"content": text} if text else {}
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        return {**self._head(True), "choices": [choice]}

    def usage_chunk(self, usage: Usage) -> dict:
        return {**self._head(True), "choices": [], "usage": usage.body()}


def model_list(model_id: str, created: int) -> dict:
    return {"object": "list", "data": [model_card(model_id, created)]}


def model_card(model_id: str, created: int) -> dict:
    return {"id": model_id, "object": "model", "created": created, "owned_by": "fuelpipe"}
