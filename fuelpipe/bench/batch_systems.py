"""The systems ``experiment=bench_batch`` times: B prompts in, B greedy continuations out, one call each.

Every system receives the same token-id prompts and returns each row's
tokens, the whole call's wall time (prefills included) and, where it can
say, the time of its full-width decode steps alone. Peers that are not
installed carry ``missing`` (reported, never an error).

* fuelpipe: a ``ContinuousBatcher`` over batch slots (``contiguous``) or the
  paged pool (``paged``), one held plan per bucket, on a configured backend;
  the context (and its plans) lives across calls, as in a server.
* transformers ``generate`` on a left-padded batch: ``padded`` (DynamicCache),
  ``static`` (StaticCache), ``static_compile`` (StaticCache + generate's own
  torch.compile, forced on CPU); ``continuous``: ``generate_batch``
  (transformers' continuous batching over a paged cache).
* llama.cpp: every row a sequence id of one ``llama_batch`` per step
  (llama-cpp-python's low-level API), on the F32 twin of the GGUF.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from fuelpipe.batch import BatchSpec, ContinuousBatcher, Request
from fuelpipe.batch.decoder import BatchDecoder
from fuelpipe.bench.peers.systems import shared_hf_model, transformers_missing
from fuelpipe.context import InferenceContext
from fuelpipe.modes import PlanMode
from fuelpipe.kv.spec import KvSpec
from fuelpipe.plan.backends import BackendSpec


@dataclass
class BatchRun:
    tokens: list[list[int]]  # per row, in prompt order
    wall_s: float  # the whole call: every prefill and every decode step
    decode_s: Optional[float] = None  # full-width decode steps only (after the first), when the system reports them
    decode_steps: int = 0
    extra: dict = field(default_factory=dict)


class BatchSystem:
    name: str = ""
    group: str = ""  # fuelpipe | transformers | llama.cpp
    missing: Optional[str] = None

    def setup(self) -> None:
        """Load what the system needs; called once, before any timed call."""

    def run(self, prompts: list[list[int]], new_tokens: int) -> BatchRun:
        raise NotImplementedError

    def details(self) -> dict:
        return {}


class FuelpipeBatch(BatchSystem):
    group = "fuelpipe"

    def __init__(self, model, backend: BackendSpec, kv: KvSpec, max_batch: int, width: int) -> None:
        self.model, self.backend, self.kv = model, backend, kv
        self.spec = BatchSpec(max_batch)
        self.width = width  # positions per row: the longest prompt plus the most new tokens of any call
        self.name = f"fuelpipe {backend.name} {kv.layout}"
        self.ctx = InferenceContext(model, backend, PlanMode.plan_once)
        self.last: Optional[ContinuousBatcher] = None
        self.cache = self.decoder = None

    def setup(self) -> None:
        """One batch cache and one decoder for every call, as a server keeps them: bucket plans are built in
        the warm-up pass and reused by the timed ones (a call with fresh caches would rebuild them)."""
        self.cache = self.kv.new_batch(self.ctx, self.spec.max_batch, self.width)
        self.decoder = BatchDecoder(self.ctx, self.cache, self.spec)

    def batcher(self, **kwargs) -> ContinuousBatcher:
        """A batcher over the long-lived cache and decoder (the previous call's sequences are all released)."""
        if self.decoder is None:
            self.setup()
        return ContinuousBatcher(self.ctx, self.cache, self.spec, decoder=self.decoder, **kwargs)

    def run(self, prompts: list[list[int]], new_tokens: int) -> BatchRun:
        width = max(len(p) for p in prompts) + new_tokens
        if width > self.width:
            raise ValueError(f"{self.name}: a call needs {width} positions per row, the bench sized rows for {self.width}")
        batcher = self.batcher()
        t0 = time.perf_counter()
        results = batcher.run([Request(tuple(p), new_tokens, name=str(i)) for i, p in enumerate(prompts)])
        wall = time.perf_counter() - t0
        full = [i for i, size in enumerate(batcher.batch_sizes) if size == len(prompts)][1:]
        self.last = batcher
        return BatchRun([r.tokens for r in results], wall, sum(batcher.step_s[i] for i in full) if full else None,
                        len(full))

    def details(self) -> dict:
        d = self.last.describe() if self.last is not None else {}
        return {k: d.get(k) for k in ("builds_per_bucket", "plans_held", "plan_buffer_bytes", "plan_weight_bytes",
                                      "bytes_per_row")} | {"fx_passes": list(self.backend.fx_passes)}


class TransformersBatch(BatchSystem):
    group = "transformers"
    MODES = ("padded", "static", "static_compile", "continuous")

    def __init__(self, gguf_path: Optional[Path], mode: str, shared: dict) -> None:
        if mode not in self.MODES:
            raise ValueError(f"transformers batch mode must be one of {self.MODES}, got {mode!r}")
        self.path, self.mode, self._shared = gguf_path, mode, shared
        self.name = f"transformers {mode.replace('_', '+')}"
        self.missing = transformers_missing()
        if self.missing:
            return
        import transformers

        if gguf_path is None:
            self.missing = "needs the checkpoint as a GGUF file (model.weights=shipped or gguf)"
        elif mode == "continuous" and not hasattr(transformers.GenerationMixin, "generate_batch"):
            self.missing = f"transformers {transformers.__version__} has no continuous batching (generate_batch)"

    def setup(self) -> None:
        self.model = shared_hf_model(self.path, self._shared)

    def run(self, prompts: list[list[int]], new_tokens: int) -> BatchRun:
        if self.mode == "continuous":
            return self._continuous(prompts, new_tokens)
        width = max(len(p) for p in prompts)
        ids = torch.zeros(len(prompts), width, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, p in enumerate(prompts):  # left padding: every row's last prompt token in the last column
            ids[i, width - len(p):] = torch.tensor(p)
            mask[i, width - len(p):] = 1
        t0 = time.perf_counter()
        with torch.no_grad():
            out = self.model.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                      **self._generate_kwargs())
        wall = time.perf_counter() - t0
        return BatchRun([row[width:].tolist() for row in out], wall)

    def _generate_kwargs(self) -> dict:
        from fuelpipe.bench.peers.systems import generate_kwargs

        # "padded" is the dynamic cache on a left-padded batch
        return generate_kwargs("dynamic" if self.mode == "padded" else self.mode) | {"pad_token_id": 0}

    def _continuous(self, prompts: list[list[int]], new_tokens: int) -> BatchRun:
        import logging

        import transformers

        config = transformers.GenerationConfig(max_new_tokens=new_tokens, do_sample=False, eos_token_id=-1,
                                               pad_token_id=0)
        logging.getLogger("ContinuousBatchingLogger").setLevel(logging.ERROR)
        t0 = time.perf_counter()
        with torch.no_grad():
            out = self.model.generate_batch([list(p) for p in prompts], generation_config=config, warmup=False)
        wall = time.perf_counter() - t0
        rows = [out[k].generated_tokens for k in sorted(out, key=lambda k: int(k.rsplit("_", 1)[-1]))]
        return BatchRun([list(r) for r in rows], wall)


class LlamaCppBatch(BatchSystem):
    """llama.cpp batched decode: each row a sequence id; one ``llama_decode`` per step for every row."""

    group = "llama.cpp"

    def __init__(self, gguf_path: Optional[Path], threads: int, n_ctx: int, max_batch: int) -> None:
        self.path, self.threads, self.n_ctx, self.max_batch = gguf_path, threads, n_ctx, max_batch
        self.name = "llama.cpp F32"
        try:
            import llama_cpp  # noqa: F401
        except ImportError:
            self.missing = "not installed: pip install llama-cpp-python (builds from source, ~9 min on 2 cores)"

    def setup(self) -> None:
        import llama_cpp as lc
        from llama_cpp import Llama

        self.llm = Llama(model_path=str(self.path), n_threads=self.threads, n_threads_batch=self.threads,
                         n_ctx=self.n_ctx, verbose=False)  # the model (and its tokenizer); its own context unused
        # A context of our own: llama-cpp-python's high-level object serves one sequence only.
        params = lc.llama_context_default_params()
        params.n_ctx = params.n_batch = params.n_ubatch = self.n_ctx * self.max_batch  # room for every row
        params.n_seq_max = self.max_batch
        params.n_threads = params.n_threads_batch = self.threads
        self.ctx = lc.llama_init_from_model(self.llm._model.model, params)
        if not self.ctx:
            raise RuntimeError("llama_init_from_model failed for the batched context")

    def run(self, prompts: list[list[int]], new_tokens: int) -> BatchRun:
        import llama_cpp as lc

        ctx, n_vocab = self.ctx, self.llm.n_vocab()
        lc.llama_memory_clear(lc.llama_get_memory(ctx), True)
        rows = len(prompts)
        total = sum(len(p) for p in prompts)
        batch = lc.llama_batch_init(max(total, rows), 0, rows)
        tokens: list[list[int]] = [[] for _ in prompts]
        try:
            t0 = time.perf_counter()
            n = 0
            last_index = []
            for seq, p in enumerate(prompts):  # every prompt in one batch, each its own sequence
                for pos, tok in enumerate(p):
                    _put(batch, n, tok, pos, seq, logits=pos == len(p) - 1)
                    n += 1
                last_index.append(n - 1)
            batch.n_tokens = n
            _decode(lc, ctx, batch)
            decode_s, steps = 0.0, 0
            for step in range(new_tokens):
                for seq in range(rows):
                    logits = np.ctypeslib.as_array(lc.llama_get_logits_ith(ctx, last_index[seq]), shape=(n_vocab,))
                    tokens[seq].append(int(np.argmax(logits)))
                if step == new_tokens - 1:
                    break
                for seq in range(rows):
                    _put(batch, seq, tokens[seq][-1], len(prompts[seq]) + step, seq, logits=True)
                batch.n_tokens = rows
                last_index = list(range(rows))
                s0 = time.perf_counter()
                _decode(lc, ctx, batch)
                if step > 0:
                    decode_s, steps = decode_s + time.perf_counter() - s0, steps + 1
            wall = time.perf_counter() - t0
        finally:
            lc.llama_batch_free(batch)
        return BatchRun(tokens, wall, decode_s if steps else None, steps)


def _put(batch, i: int, token: int, pos: int, seq: int, logits: bool) -> None:
    batch.token[i] = token
    batch.pos[i] = pos
    batch.n_seq_id[i] = 1
    batch.seq_id[i][0] = seq
    batch.logits[i] = logits


def _decode(lc, ctx, batch) -> None:
    rc = lc.llama_decode(ctx, batch)
    if rc != 0:
        raise RuntimeError(f"llama_decode returned {rc}")
