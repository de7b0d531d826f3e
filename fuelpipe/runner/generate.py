"""Text generation as part of a job: encode and check the request up front, then stream tokens, report speed.

``plan_generation`` runs in the job's up-front phase: every way the request cannot run (a prompt
that encodes to nothing, more positions than the model or the configured cache holds, a pool too
small for it) is a ``ConfigError`` there, before any generation or oracle runs.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Any, Optional, TextIO

from omegaconf import DictConfig

from fuelpipe.config.schema import KvLayout
from fuelpipe.errors import ConfigError
from fuelpipe.runner.assemble import Assembly
from fuelpipe.sampling import Sampler, greedy, seeded


@dataclass(frozen=True)
class GenerationRequest:
    prompt: str
    ids: tuple[int, ...]  # the encoded prompt
    max_new_tokens: int
    chat: bool
    capacity: int  # KV positions the cache is built with (kv.max_seq_len when set)
    sampler: Sampler

    @property
    def positions(self) -> int:
        """KV positions the generation writes: the last sampled token is never fed back."""
        return len(self.ids) + self.max_new_tokens - 1


def generation_wanted(cfg: DictConfig, asm: Assembly) -> bool:
    enabled = cfg.experiment.generate.enabled
    return asm.tokenizer is not None if enabled is None else bool(enabled)


def plan_generation(cfg: DictConfig, asm: Assembly) -> Optional[GenerationRequest]:
    """The checked request, or None when the job generates nothing; raises ``ConfigError`` naming the numbers."""
    if not generation_wanted(cfg, asm):
        return None
    gen, tok = cfg.experiment.generate, asm.tokenizer
    prompt = cfg.prompt if cfg.prompt is not None else gen.prompt
    n = cfg.max_new_tokens if cfg.max_new_tokens is not None else gen.max_new_tokens
    key = "max_new_tokens" if cfg.max_new_tokens is not None else "experiment.generate.max_new_tokens"
    if n < 1:
        raise ConfigError(f"{key} must be >= 1, got {n}")
    if not prompt.strip():
        raise ConfigError(f"the generation prompt is empty ({prompt!r}); set prompt=\"...\"")
    chat = tok.chat_template is not None if gen.chat is None else gen.chat
    ids = tuple(tok.encode_chat([{"role": "user", "content": prompt}]) if chat else tok.encode(prompt))
    if not ids:
        raise ConfigError(f"the generation prompt {prompt!r} encodes to no tokens (chat={chat})")
    sampler = greedy if gen.temperature == 0 else seeded(gen.temperature, gen.top_k, gen.seed)
    need = len(ids) + n - 1
    what = f"the generation writes {need} positions ({len(ids)}-token prompt + {key}={n} - 1)"
    limit = asm.model.dims.max_position_embeddings
    if need > limit:
        raise ConfigError(f"{what}, beyond the model's max_position_embeddings {limit}")
    capacity = need
    if cfg.kv.max_seq_len is not None:
        capacity = cfg.kv.max_seq_len
        if need > capacity:
            raise ConfigError(f"{what}, more than kv.max_seq_len={capacity}")
    kv = asm.setup.kv
    if cfg.kv.layout is KvLayout.paged and kv.num_blocks is not None:
        blocks = kv.blocks_for(need)
        if blocks + 1 > kv.num_blocks:
            raise ConfigError(f"kv.num_blocks={kv.num_blocks} is too small: {what}, which need {blocks} blocks of "
                              f"{kv.block_size} plus the null block")
    return GenerationRequest(prompt, ids, n, chat, capacity, sampler)


def run_generation(cfg: DictConfig, asm: Assembly, req: Optional[GenerationRequest],
                   out: TextIO = sys.stdout) -> Optional[dict[str, Any]]:
    """Generate ``req`` with the run's backend, plan mode and KV strategy."""
    if req is None:
        return None
    gen, tok = cfg.experiment.generate, asm.tokenizer
    ctx = asm.setup.context(asm.model)
    cache = asm.setup.kv.new_cache(ctx, req.capacity)
    shown, tokens = "", []

    def stream(token: int) -> None:
        nonlocal shown
        tokens.append(token)
        text = tok.decode(tokens)
        if gen.stream and text.startswith(shown):  # print only what is new (whole characters)
            out.write(text[len(shown):])
            out.flush()
            shown = text

    if gen.stream:
        out.write(f"--- {req.prompt}\n")
    t0 = time.perf_counter()
    result = ctx.generate(list(req.ids), req.max_new_tokens, sampler=req.sampler, cache=cache,
                          stop_ids=tok.stop_ids, on_token=stream)
    wall = time.perf_counter() - t0
    text = tok.decode(result.tokens)
    if gen.stream:
        out.write(text[len(shown):] + "\n---\n")
    decode_s = sum(result.decode_s)
    steps = len(result.decode_s)
    return {
        "prompt": req.prompt,
        "chat_template": req.chat,
        "prompt_tokens": len(req.ids),
        "text": text,
        "tokens": result.tokens,
        "new_tokens": len(result.tokens),
        "stopped_early": len(result.tokens) < req.max_new_tokens,
        "prefill_ms": 1000.0 * result.prefill_s,
        "ms_per_token": 1000.0 * decode_s / steps if steps else None,
        "tokens_per_s": steps / decode_s if decode_s else None,
        "wall_s": wall,
        "kv_capacity": req.capacity,
        "plan_builds": ctx.plan.stats.builds,
        "load": asm.load,
    }
