"""An OpenAI request body checked into a ``GenerationSpec``, or an ``ApiError`` naming the field and its value.

Every field the server reads is checked here, before anything is queued. A field OpenAI defines that the
server cannot honour is refused unless it holds its "off" value (``n`` 1, ``logprobs`` false, penalties 0
...), so a client never gets silently different behaviour; a field OpenAI does not define is refused as
unrecognized, as OpenAI does. ``top_k``, ``min_p`` and ``repetition_penalty`` are accepted as extensions
(``extra_body`` in the openai client).
"""
from __future__ import annotations

import json
import numbers
from dataclasses import dataclass
from typing import Any, Optional

from fuelpipe.batch import Sampling
from fuelpipe.errors import ConfigError

COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions; chat runs to the end of the row


class ApiError(Exception):
    """An HTTP error answered with OpenAI's error body."""

    def __init__(self, status: int, message: str, param: Optional[str] = None,
                 type: str = "invalid_request_error", code: Optional[str] = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.type, self.code = status, message, param, type, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class GenerationSpec:
    kind: str  # "completion" (``prompt``) or "chat" (``messages``)
    model: str
    prompt: Optional[str]
    messages: Optional[tuple[dict, ...]]  # ({"role": str, "content": str}, ...)
    max_tokens: Optional[int]  # None: as many as the row holds after the prompt
    sampling: Sampling
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool  # stream_options.include_usage: a last chunk carries the usage


# field -> the values that mean "off" (accepted, and nothing changes)
OFF_VALUES: dict[str, tuple] = {
    "n": (None, 1), "best_of": (None, 1), "echo": (None, False), "suffix": (None, ""),
    "logprobs": (None, False), "top_logprobs": (None, 0), "logit_bias": (None, {}),
    "frequency_penalty": (None, 0), "presence_penalty": (None, 0),
    "tools": (None, []), "tool_choice": (None, "none"), "functions": (None, []), "function_call": (None, "none"),
    "parallel_tool_calls": (None, True, False), "response_format": (None, {"type": "text"}),
}
IGNORED = ("user", "metadata", "store", "service_tier")  # bookkeeping OpenAI keeps; it changes no token
SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "seed")
COMMON = ("model", "max_tokens", "stop", "stream", "stream_options", *SAMPLING_FIELDS)
FIELDS = {
    "completion": {"prompt", *COMMON, *OFF_VALUES, *IGNORED} - {"tools", "tool_choice", "functions", "function_call",
                                                                "parallel_tool_calls", "response_format",
                                                                "top_logprobs"},
    "chat": {"messages", "max_completion_tokens", *COMMON, *OFF_VALUES, *IGNORED} - {"best_of", "echo", "suffix"},
}


def parse_body(raw: bytes) -> dict:
    """The request body as a JSON object."""
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ApiError(400, f"the request body is not valid JSON ({err}); got {raw[:80]!r}") from None
    if not isinstance(body, dict):
        raise ApiError(400, f"the request body must be a JSON object, got {type(body).__name__} {_short(body)}")
    return body


def generation_spec(kind: str, body: dict) -> GenerationSpec:
    """``body`` of a /v1/completions (kind "completion") or /v1/chat/completions (kind "chat") request, checked."""
    unknown = sorted(set(body) - FIELDS[kind])
    if unknown:
        raise ApiError(400, f"unrecognized request argument supplied: {unknown[0]} (fuelpipe serve's {kind} "
                            f"requests take {sorted(FIELDS[kind])})", param=unknown[0])
    for name, off in OFF_VALUES.items():
        if name in body and body[name] not in off:
            raise ApiError(400, f"{name}={_short(body[name])} is not supported by fuelpipe serve (only "
                                f"{' or '.join(_short(v) for v in off if v is not None)})", param=name)
    model = _typed(body, "model", str, required=True)
    if kind == "completion":
        prompt, messages = _typed(body, "prompt", str, required=True, what="a string (one prompt)"), None
        max_tokens = _max_tokens(body, "max_tokens", COMPLETION_DEFAULT_MAX_TOKENS)
    else:
        prompt, messages = None, _messages(body.get("messages"))
        max_tokens = _max_tokens(body, "max_completion_tokens", _max_tokens(body, "max_tokens", None))
    stream = _typed(body, "stream", bool) or False
    options = _typed(body, "stream_options", dict) or {}
    if options and not stream:
        raise ApiError(400, "stream_options is only allowed with stream: true", param="stream_options")
    if set(options) - {"include_usage"}:
        raise ApiError(400, f"stream_options takes include_usage only, got {sorted(options)}", param="stream_options")
    include_usage = _typed(options, "include_usage", bool) or False
    return GenerationSpec(kind, model, prompt, messages, max_tokens, _sampling(body), _stop(body.get("stop")),
                          stream, include_usage)


def _sampling(body: dict) -> Sampling:
    values = {name: body[name] for name in SAMPLING_FIELDS if body.get(name) is not None}
    values.setdefault("seed", None)  # no seed: a fresh one per request
    try:
        return Sampling(**values)
    except ConfigError as err:  # SamplingParams names the field first: "top_p must lie in (0, 1] ..., got 1.5"
        field = str(err).split()[0]
        raise ApiError(400, str(err), param=field if field in SAMPLING_FIELDS else None) from None


def _max_tokens(body: dict, name: str, default: Optional[int]) -> Optional[int]:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ApiError(400, f"{name} must be an integer >= 1, got {_short(value)}", param=name)
    return int(value)


def _stop(value: Any) -> tuple[str, ...]:
    stops = [] if value is None else [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise ApiError(400, f"stop must be a non-empty string or a list of them, got {_short(value)}", param="stop")
    return tuple(stops)


def _messages(value: Any) -> tuple[dict, ...]:
    if not isinstance(value, list) or not value:
        raise ApiError(400, f"messages must be a non-empty list, got {_short(value)}", param="messages")
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ApiError(400, f"messages[{i}] must be an object with a string role, got {_short(m)}",
                           param=f"messages[{i}]")
        out.append({"role": m["role"], "content": _content(m.get("content"), i)})
    return tuple(out)


def _content(content: Any, i: int) -> str:
    """A message's text: a string, or a list of text parts joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    raise ApiError(400, f"messages[{i}].content must be a string or a list of text parts (fuelpipe serve reads "
                        f"text only), got {_short(content)}", param=f"messages[{i}].content")


def _typed(body: dict, name: str, kind: type, *, required: bool = False, what: str = "") -> Any:
    value = body.get(name)
    if value is None:
        if required:
            raise ApiError(400, f"{name} is required", param=name)
        return None
    if not isinstance(value, kind):
        raise ApiError(400, f"{name} must be {what or 'a ' + kind.__name__}, got {type(value).__name__} "
                            f"{_short(value)}", param=name)
    return value


def _short(value: Any, limit: int = 80) -> str:
    text = json.dumps(value) if not isinstance(value, (bytes, set)) else repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."
