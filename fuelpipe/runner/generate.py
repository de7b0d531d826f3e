"""Text generation as part of a job: encode, stream tokens as they come, report speed."""
from __future__ import annotations

import sys
import time
from typing import Any, Optional, TextIO

from omegaconf import DictConfig

from fuelpipe.runner.assemble import Assembly
from fuelpipe.sampling import greedy, seeded


def generation_wanted(cfg: DictConfig, asm: Assembly) -> bool:
    enabled = cfg.experiment.generate.enabled
    return asm.tokenizer is not None if enabled is None else bool(enabled)


def run_generation(cfg: DictConfig, asm: Assembly, out: TextIO = sys.stdout) -> Optional[dict[str, Any]]:
    """Generate from the configured prompt with the run's backend, plan mode and KV strategy."""
    if not generation_wanted(cfg, asm):
        return None
    gen, tok = cfg.experiment.generate, asm.tokenizer
    prompt = cfg.prompt if cfg.prompt is not None else gen.prompt
    n = cfg.max_new_tokens if cfg.max_new_tokens is not None else gen.max_new_tokens
    chat = tok.chat_template is not None if gen.chat is None else gen.chat
    ids = tok.encode_chat([{"role": "user", "content": prompt}]) if chat else tok.encode(prompt)
    ctx = asm.setup.context(asm.model)
    cache = asm.setup.kv.new_cache(ctx, len(ids) + n)
    sampler = greedy if gen.temperature == 0 else seeded(gen.temperature, gen.top_k, gen.seed)
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
        out.write(f"--- {prompt}\n")
    t0 = time.perf_counter()
    result = ctx.generate(ids, n, sampler=sampler, cache=cache, stop_ids=tok.stop_ids, on_token=stream)
    wall = time.perf_counter() - t0
    text = tok.decode(result.tokens)
    if gen.stream:
        out.write(text[len(shown):] + "\n---\n")
    decode_s = sum(result.decode_s)
    steps = len(result.decode_s)
    return {
        "prompt": prompt,
        "chat_template": chat,
        "prompt_tokens": len(ids),
        "text": text,
        "tokens": result.tokens,
        "new_tokens": len(result.tokens),
        "stopped_early": len(result.tokens) < n,
        "prefill_ms": 1000.0 * result.prefill_s,
        "ms_per_token": 1000.0 * decode_s / steps if steps else None,
        "tokens_per_s": steps / decode_s if decode_s else None,
        "wall_s": wall,
        "plan_builds": ctx.plan.stats.builds,
        "load": asm.load,
    }
