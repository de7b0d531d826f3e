"""``load`` a checkpoint as a ``TextModel``: strings in, strings out, through the held-plan generate loop.

``generate`` / ``chat`` return a ``Completion``; ``stream`` / ``stream_chat`` yield its text in pieces.
Every parameter is checked before anything runs (``ConfigError`` for a setting, ``InputError`` for a
prompt or messages). Greedy (the default) picks exactly the tokens ``InferenceContext.generate`` does.
"""
from __future__ import annotations

import os
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional, Sequence

import torch

from fuelpipe.api.cache_shelf import CacheShelf
from fuelpipe.api.pieces import TextPieces
from fuelpipe.context import InferenceContext
from fuelpipe.errors import ConfigError, InputError
from fuelpipe.plan.aot_program import prewarm_compiler
from fuelpipe.plan.backends import AUTO_CACHE_DIR, BACKENDS, BackendSpec, plan_cache_dir
from fuelpipe.plan.plan_store import PlanCacheSpec
from fuelpipe.registry import did_you_mean
from fuelpipe.sampling import SamplingParams, sampler_for
from fuelpipe.threads import for_backend
from fuelpipe.weights import TextTokenizer, load_model
from fuelpipe.weights.named import NAMED, named_path

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class Completion:
    text: str  # the generated text, cut before a stop string (which never appears in it)
    tokens: tuple[int, ...]  # the sampled ids, ending with EOS or the token that completed a stop string
    finish_reason: str  # "stop" (EOS or a stop string) or "length" (max_new_tokens reached)
    prompt_tokens: int


class TextModel:
    """A loaded model, its tokenizer and the ``InferenceContext`` that holds its plan."""

    def __init__(self, context: InferenceContext, tokenizer: TextTokenizer) -> None:
        self.context = context
        self.tokenizer = tokenizer
        self.shelf = CacheShelf(context)  # one cache kept between generations: the held plan stays valid

    @property
    def model(self):
        return self.context.model

    def generate(self, prompt: str, *, max_new_tokens: int = 64, temperature: float = 0.0, top_k: int = 0,
                 top_p: float = 1.0, min_p: float = 0.0, repetition_penalty: float = 1.0,
                 stop: Sequence[str] = (), seed: Optional[int] = None) -> Completion:
        """Continue ``prompt`` (encoded with BOS as the checkpoint asks)."""
        run = self._start(self._encode(prompt), max_new_tokens, SamplingParams(
            temperature, top_k, top_p, min_p, repetition_penalty, seed), stop)
        return _finish(run, "".join(_stream(run)))

    def chat(self, messages: list[dict], *, max_new_tokens: int = 64, temperature: float = 0.0, top_k: int = 0,
             top_p: float = 1.0, min_p: float = 0.0, repetition_penalty: float = 1.0,
             stop: Sequence[str] = (), seed: Optional[int] = None) -> Completion:
        """The assistant's reply to ``messages`` ([{"role": ..., "content": ...}]) through the chat template."""
        run = self._start(self._encode_chat(messages), max_new_tokens, SamplingParams(
            temperature, top_k, top_p, min_p, repetition_penalty, seed), stop)
        return _finish(run, "".join(_stream(run)))

    def stream(self, prompt: str, **settings) -> Iterator[str]:
        """``generate``'s text in pieces as the tokens come (same keyword settings); the pieces join to its text."""
        return self._pieces(self._encode(prompt), **settings)

    def stream_chat(self, messages: list[dict], **settings) -> Iterator[str]:
        """``chat``'s text in pieces as the tokens come (same keyword settings)."""
        return self._pieces(self._encode_chat(messages), **settings)

    # ---- internals -----------------------------------------------------------------------
    def _pieces(self, ids: list[int], *, max_new_tokens: int = 64, temperature: float = 0.0, top_k: int = 0,
                top_p: float = 1.0, min_p: float = 0.0, repetition_penalty: float = 1.0,
                stop: Sequence[str] = (), seed: Optional[int] = None) -> Iterator[str]:
        run = self._start(ids, max_new_tokens, SamplingParams(temperature, top_k, top_p, min_p,
                                                              repetition_penalty, seed), stop)
        return _stream(run)

    def _encode(self, prompt: str) -> list[int]:
        if not isinstance(prompt, str):
            raise InputError(f"prompt must be a str, got {type(prompt).__name__} {prompt!r}")
        ids = self.tokenizer.encode(prompt)
        if not ids:
            raise InputError(f"the prompt {prompt!r} encodes to no tokens")
        return ids

    def _encode_chat(self, messages: list[dict]) -> list[int]:
        if not isinstance(messages, (list, tuple)) or not messages or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                for m in messages):
            raise InputError("messages must be a non-empty list of {'role': str, 'content': str} dicts, got "
                             f"{messages!r}")
        if not self.tokenizer.chat_template:
            raise InputError(f"chat needs a chat template, and {self.tokenizer.source} carries none; "
                             "use generate(prompt) instead")
        return self.tokenizer.encode_chat(list(messages))

    def _start(self, ids: list[int], max_new_tokens: int, params: SamplingParams, stop: Sequence[str]) -> "_Run":
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
        if isinstance(stop, str):
            stop = (stop,)
        if not all(isinstance(s, str) and s for s in stop):
            raise ConfigError(f"stop must be a sequence of non-empty strings, got {stop!r}")
        tok = self.tokenizer
        cache = self.shelf.take(len(ids) + max_new_tokens - 1)
        try:
            tokens = self.context.generate_iter(ids, max_new_tokens, sampler=sampler_for(params, ids),
                                                cache=cache, stop_ids=tok.stop_ids)
        except BaseException:
            self.shelf.put(cache)
            raise
        return _Run(self.shelf.lend(tokens, cache), TextPieces(tok.decode, stop), set(tok.stop_ids), len(ids))


@dataclass
class _Run:
    tokens: Iterator[int]
    pieces: TextPieces
    stop_ids: set[int]
    prompt_tokens: int


def _stream(run: _Run) -> Iterator[str]:
    for token in run.tokens:
        piece = run.pieces.push(token)
        if piece:
            yield piece
        if run.pieces.stopped:
            run.tokens.close()  # the stop string ends the run: no further decode step
            return
    piece = run.pieces.flush()
    if piece:
        yield piece


def _finish(run: _Run, text: str) -> Completion:
    ids = run.pieces.ids
    stopped = run.pieces.stopped or (bool(ids) and ids[-1] in run.stop_ids)
    return Completion(text, tuple(ids), "stop" if stopped else "length", run.prompt_tokens)


def load(name_or_path: str | os.PathLike, *, dtype: torch.dtype | str = torch.float32,
         backend: str | BackendSpec = "aot", threads: Optional[int] = None) -> TextModel:
    """A named checkpoint (``smollm2_135m``, ``gemma3_270m``) or a local ``.gguf`` file / HF directory.

    ``threads=N`` fixes torch's intra-op threads for the whole process (``torch.set_num_threads``).
    Left at None, generation adapts its thread count to the machine's load (``fuelpipe.threads``): all
    cores alone, fewer when other processes want them; on the eager backend the count stays fixed.
    Every argument is checked before the weights are read."""
    if isinstance(backend, BackendSpec):
        spec = backend
    else:
        spec = BackendSpec(name=backend)
        # plans persist in the user's cache folder, as the CLI's default backend.plan_cache.dir=auto does
        spec = dataclasses.replace(spec, plan_cache=PlanCacheSpec(dir=plan_cache_dir(AUTO_CACHE_DIR, backend)))
    if isinstance(dtype, str):
        if dtype not in DTYPES:
            raise ConfigError(did_you_mean("dtype", dtype, DTYPES))
        dtype = DTYPES[dtype]
    if dtype not in DTYPES.values():
        raise ConfigError(f"dtype must be one of {list(DTYPES)}, got {dtype!r}")
    if threads is not None:
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ConfigError(f"threads must be an integer >= 1, got {threads!r}")
    if not isinstance(name_or_path, (str, os.PathLike)):
        raise ConfigError(f"load takes a checkpoint name or path, got {type(name_or_path).__name__} {name_or_path!r}")
    source = _resolve(name_or_path)
    if threads is not None:
        torch.set_num_threads(threads)
    if BACKENDS.get(spec.name).ahead_of_time:
        prewarm_compiler()  # inductor's import overlaps reading the weights
    model, tokenizer, _ = load_model(source, dtype=dtype)
    if tokenizer is None:
        raise ConfigError(f"{source}: the checkpoint has no tokenizer (an HF directory needs tokenizer.json); "
                          "the text API needs one")
    context = InferenceContext(model, spec)
    if threads is None:
        context.thread_governor = for_backend(spec.name)
    return TextModel(context, tokenizer)


def _resolve(name_or_path: str | os.PathLike) -> Path:
    """A named checkpoint's file, or the path as given when it names a file or directory (or looks like a path)."""
    text = os.fspath(name_or_path)
    if text in NAMED:
        return named_path(text)
    path = Path(text).expanduser()
    if path.exists() or isinstance(name_or_path, os.PathLike) or os.sep in text or path.suffix:
        return path  # load_model names a missing or unreadable path itself
    raise ConfigError(did_you_mean("named checkpoint", text, NAMED) + "; or pass a .gguf file or an HF directory")
