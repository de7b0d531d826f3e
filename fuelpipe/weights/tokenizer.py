"""Text <-> token ids for a loaded checkpoint, built from GGUF metadata or an HF ``tokenizer.json``.

A GGUF file carries its tokenizer as metadata (``tokenizer.ggml.*``). We
rebuild it as a ``tokenizers.Tokenizer`` following llama.cpp's reading of
those keys:

* ``model = gpt2``: byte-level BPE from ``tokens`` + ``merges``; the
  pre-tokenizer split is chosen by ``tokenizer.ggml.pre`` from a table
  (an unknown one is refused rather than guessed).
* ``model = llama``: SentencePiece-style BPE: spaces become ``▁``, unknown
  characters fall back to ``<0xNN>`` byte tokens, and adjacent pieces merge
  highest ``score`` first. The file lists no merges, so they are derived:
  every split of a normal token into two vocabulary pieces is a merge ranked
  by that token's score.

Control and user-defined tokens (``token_type`` 3 / 4, and the unknown
token) are matched whole in the text, as llama.cpp does. BOS/EOS follow
``add_bos_token`` / ``add_eos_token`` (llama.cpp's defaults when absent: BOS
for SentencePiece vocabularies, none for BPE). A ``tokenizer.chat_template``
is rendered with a sandboxed jinja2 environment.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

from fuelpipe.errors import InputError
from fuelpipe.weights.errors import TokenizerLoadError

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6  # llama.cpp token types

# Pre-tokenizer splits, by tokenizer.ggml.pre (llama.cpp's regex for each pre-type). GPT-2's own split is
# ByteLevel's built-in regex, so it needs no entry of its own.
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")


@dataclass(frozen=True)
class _BpePre:
    split: Optional[str] = None  # regex whose matches are isolated; None: GPT-2's (ByteLevel's built-in)
    digits_alone: bool = False  # split every \p{N} character off first
    ignore_merges: bool = False  # a word already in the vocabulary is not merged further


_BPE_PRE: dict[str, _BpePre] = {
    "default": _BpePre(),
    "gpt2": _BpePre(),
    "smollm": _BpePre(digits_alone=True),
    "starcoder": _BpePre(digits_alone=True),
    "llama-bpe": _BpePre(_LLAMA3_SPLIT, ignore_merges=True),
    "qwen2": _BpePre(_QWEN2_SPLIT),
}


@dataclass
class TextTokenizer:
    """Encode prompts, decode outputs, render chat prompts.

    ``encode`` adds BOS/EOS as the checkpoint asks (``add_special_tokens=False`` adds none);
    ``stop_ids`` are the ids that end a generation.
    """

    backend: Tokenizer
    source: Path
    bos_id: Optional[int] = None
    eos_id: Optional[int] = None
    add_bos: bool = False  # prepend BOS in encode() (when the backend does not already)
    add_eos: bool = False
    chat_template: Optional[str] = None
    extra_stop_ids: tuple[int, ...] = ()
    special_tokens: dict[str, str] = field(default_factory=dict)  # bos_token/eos_token strings for templates

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    @property
    def stop_ids(self) -> tuple[int, ...]:
        ids = [self.eos_id] if self.eos_id is not None else []
        return tuple(dict.fromkeys(ids + list(self.extra_stop_ids)))

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        ids = self.backend.encode(text, add_special_tokens=add_special_tokens).ids
        if add_special_tokens:
            if self.add_bos and self.bos_id is not None and (not ids or ids[0] != self.bos_id):
                ids = [self.bos_id] + ids
            if self.add_eos and self.eos_id is not None:
                ids = ids + [self.eos_id]
        return ids

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def render_chat(self, messages: list[dict[str, str]], *, add_generation_prompt: bool = True, **extra) -> str:
        if not self.chat_template:
            raise InputError(f"{self.source}: the checkpoint carries no chat template")
        from jinja2 import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str):
            raise InputError(f"chat template refused the messages: {message}")

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals.update(raise_exception=raise_exception, strftime_now=lambda fmt: datetime.now().strftime(fmt))
        env.filters["tojson"] = lambda x, indent=None, **_: json.dumps(x, ensure_ascii=False, indent=indent)
        try:
            template = env.from_string(self.chat_template)
            return template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                   **self.special_tokens, **extra)
        except TemplateError as e:
            raise TokenizerLoadError(self.source, f"chat template failed to render: {e}") from None

    def encode_chat(self, messages: list[dict[str, str]], *, add_generation_prompt: bool = True) -> list[int]:
        """Render the chat template and encode it; the template writes its own BOS, so none is added."""
        return self.encode(self.render_chat(messages, add_generation_prompt=add_generation_prompt),
                           add_special_tokens=False)


# ---- from GGUF metadata ------------------------------------------------------------------
def tokenizer_from_gguf(path: Path, md: dict[str, Any]) -> TextTokenizer:
    kind = md.get("tokenizer.ggml.model")
    tokens = md.get("tokenizer.ggml.tokens")
    if kind is None or tokens is None:
        raise TokenizerLoadError(path, "GGUF metadata has no tokenizer.ggml.model / tokenizer.ggml.tokens")
    n = len(tokens)
    types = np.asarray(md.get("tokenizer.ggml.token_type", np.full(n, NORMAL)), dtype=np.int64)
    if len(types) != n:
        raise TokenizerLoadError(path, f"tokenizer.ggml.token_type has {len(types)} entries for {n} tokens")
    vocab: dict[str, int] = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t, i)  # a repeated spelling keeps its first id, as llama.cpp's lookup does
    if kind == "gpt2":
        backend = _gguf_bpe(path, md, vocab)
        default_bos = False
    elif kind == "llama":
        backend = _gguf_spm(path, md, tokens, vocab, types)
        default_bos = True
    else:
        raise TokenizerLoadError(path, f"tokenizer.ggml.model {kind!r} is not supported; supported: gpt2, llama")
    # Matched whole in the text: control and unknown tokens as specials (dropped by decode), user-defined as text.
    special = set(np.flatnonzero((types == CONTROL) | (types == UNKNOWN)).tolist())
    unk = md.get("tokenizer.ggml.unknown_token_id")
    if unk is not None and 0 <= unk < n:
        special.add(unk)
    backend.add_special_tokens([AddedToken(tokens[i], normalized=False, special=True) for i in sorted(special)])
    backend.add_tokens([AddedToken(tokens[i], normalized=False, special=False)
                        for i in np.flatnonzero(types == USER_DEFINED).tolist()])
    bos, eos = md.get("tokenizer.ggml.bos_token_id"), md.get("tokenizer.ggml.eos_token_id")
    eot = md.get("tokenizer.ggml.eot_token_id")
    return TextTokenizer(
        backend=backend,
        source=path,
        bos_id=bos,
        eos_id=eos,
        add_bos=bool(md.get("tokenizer.ggml.add_bos_token", default_bos)),
        add_eos=bool(md.get("tokenizer.ggml.add_eos_token", False)),
        chat_template=md.get("tokenizer.chat_template"),
        extra_stop_ids=(eot,) if eot is not None else (),
        special_tokens={"bos_token": tokens[bos] if bos is not None else "",
                        "eos_token": tokens[eos] if eos is not None else ""},
    )


def _gguf_bpe(path: Path, md: dict[str, Any], vocab: dict[str, int]) -> Tokenizer:
    merges = md.get("tokenizer.ggml.merges")
    if merges is None:
        raise TokenizerLoadError(path, "a gpt2 (BPE) tokenizer needs tokenizer.ggml.merges")
    pre_name = md.get("tokenizer.ggml.pre", "default")
    if pre_name not in _BPE_PRE:
        raise TokenizerLoadError(path, f"tokenizer.ggml.pre {pre_name!r} is not supported; supported: "
                                       f"{', '.join(sorted(_BPE_PRE))}")
    pre = _BPE_PRE[pre_name]
    pairs = []
    for m in merges:
        a, sep, b = m.partition(" ")
        if not sep:
            raise TokenizerLoadError(path, f"merge {m!r} is not two space-separated pieces")
        pairs.append((a, b))
    tok = _backend(path, lambda: models.BPE(vocab=vocab, merges=pairs, fuse_unk=False,
                                            ignore_merges=pre.ignore_merges))
    steps = [pre_tokenizers.Digits(individual_digits=True)] if pre.digits_alone else []
    if pre.split is None:
        steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True))
    else:
        steps += [pre_tokenizers.Split(Regex(pre.split), behavior="isolated"),
                  pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    tok.pre_tokenizer = pre_tokenizers.Sequence(steps)
    tok.decoder = decoders.ByteLevel()
    return tok


def _backend(path: Path, build) -> Tokenizer:
    try:
        return Tokenizer(build())
    except Exception as e:  # tokenizers raises a bare Exception (e.g. a merge naming an unknown piece)
        raise TokenizerLoadError(path, f"the tokenizer metadata does not make a valid BPE model: {e}") from None


def _spm_merges(tokens: list[str], vocab: dict[str, int], types: np.ndarray, scores: np.ndarray) -> list[tuple[str, str]]:
    """Every split of a normal token into two mergeable pieces, best (highest score, then lowest id) first."""
    normal = np.flatnonzero(types == NORMAL)
    mergeable = {tokens[i] for i in normal}
    ranked = normal[np.lexsort((normal, -scores[normal]))]  # visit tokens best first: no sort of the pairs
    merges = []
    for i in ranked.tolist():
        t = tokens[i]
        if vocab[t] != i:
            continue
        for k in range(1, len(t)):
            a = t[:k]
            if a in mergeable:
                b = t[k:]
                if b in mergeable:
                    merges.append((a, b))
    return merges


def _gguf_spm(path: Path, md: dict[str, Any], tokens: list[str], vocab: dict[str, int], types: np.ndarray) -> Tokenizer:
    scores = md.get("tokenizer.ggml.scores")
    if scores is None:
        raise TokenizerLoadError(path, "a llama (SentencePiece) tokenizer needs tokenizer.ggml.scores")
    scores = np.asarray(scores, dtype=np.float64)
    unk = md.get("tokenizer.ggml.unknown_token_id")
    has_bytes = bool((types == BYTE).any())
    merges = _spm_merges(tokens, vocab, types, scores)
    tok = _backend(path, lambda: models.BPE(vocab=vocab, merges=merges, unk_token=tokens[unk] if unk is not None else None,
                                            fuse_unk=True, byte_fallback=has_bytes))
    prefix = bool(md.get("tokenizer.ggml.add_space_prefix", True))
    steps = [normalizers.Prepend("▁")] if prefix else []
    tok.normalizer = normalizers.Sequence(steps + [normalizers.Replace(" ", "▁")])
    dec = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    tok.decoder = decoders.Sequence(dec + ([decoders.Strip(" ", 1, 0)] if prefix else []))
    return tok


# ---- from an HF directory ----------------------------------------------------------------
def tokenizer_from_hf_dir(path: Path) -> Optional[TextTokenizer]:
    """``tokenizer.json`` (+ ``tokenizer_config.json``, ``generation_config.json``); None if there is none."""
    tj = path / "tokenizer.json"
    if not tj.is_file():
        return None
    try:
        backend = Tokenizer.from_file(str(tj))
    except Exception as e:  # tokenizers raises a bare Exception on a malformed file
        raise TokenizerLoadError(tj, f"cannot read tokenizer.json: {e}") from None
    tcfg = _read_json(path / "tokenizer_config.json")
    gen = _read_json(path / "generation_config.json") or _read_json(path / "config.json")

    def token_text(key: str) -> Optional[str]:
        v = tcfg.get(key)
        return v.get("content") if isinstance(v, dict) else v

    def token_id(text: Optional[str]) -> Optional[int]:
        return backend.token_to_id(text) if text else None

    bos_text, eos_text = token_text("bos_token"), token_text("eos_token")
    bos = token_id(bos_text) if bos_text else _first(gen.get("bos_token_id"))
    eos_ids = gen.get("eos_token_id")
    eos_list = [eos_ids] if isinstance(eos_ids, int) else list(eos_ids or [])
    eos = token_id(eos_text) if eos_text else (eos_list[0] if eos_list else None)
    template = tcfg.get("chat_template")
    if isinstance(template, list):  # named templates: take the default one
        template = next((t["template"] for t in template if t.get("name") == "default"), None)
    jinja_file = path / "chat_template.jinja"
    if template is None and jinja_file.is_file():
        template = jinja_file.read_text()
    return TextTokenizer(
        backend=backend,
        source=tj,
        bos_id=bos,
        eos_id=eos,
        add_bos=bool(tcfg.get("add_bos_token", False)),
        add_eos=False,  # the tokenizer.json post-processor owns EOS
        chat_template=template,
        extra_stop_ids=tuple(i for i in eos_list if i != eos),
        special_tokens={"bos_token": bos_text or "", "eos_token": eos_text or ""},
    )


def _read_json(p: Path) -> dict:
    if not p.is_file():
        return {}
    try:
        return json.loads(p.read_text())
    except ValueError as e:
        raise TokenizerLoadError(p, f"not valid JSON: {e}") from None


def _first(v):
    return v[0] if isinstance(v, list) and v else v
