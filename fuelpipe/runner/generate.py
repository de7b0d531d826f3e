"""Text generation as part of a job: encode and check the request up front, then stream tokens, report speed.

``plan_generation`` runs in the job's up-front phase: every way the request cannot run (a prompt
that encodes to nothing, more positions than the model or the configured cache holds, a pool too
small for it) is a ``ConfigError`` there, before any generation or oracle runs.
"""
from __future__ import annotations

import contextlib
import logging
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any, Optional, TextIO

from omegaconf import DictConfig

from fuelpipe.batch import BatchSpec, ContinuousBatcher, Request, Sampling
from fuelpipe.bench.rss import PhasePeaks
from fuelpipe.config.validate import batch_spec
from fuelpipe.errors import ConfigError, RunInterrupted
from fuelpipe.runner.assemble import Assembly
from fuelpipe.sampling import Sampler, greedy, seeded
from fuelpipe.threads import for_backend, thread_use


@dataclass(frozen=True)
class GenerationRequest:
    prompt: str
    ids: tuple[int, ...]  # the encoded prompt
    max_new_tokens: int
    chat: bool
    capacity: int  # KV positions the cache is built with (kv.max_seq_len when set)
    sampler: Sampler
    # Several prompts (experiment.generate.prompts): served together by continuous batching.
    batch: tuple["GenerationRequest", ...] = ()
    batch_spec: Optional[BatchSpec] = None
    sampling: Optional[Sampling] = None

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
    gen = cfg.experiment.generate
    if len(gen.prompts):
        return _plan_batch(cfg, asm)
    prompt = cfg.prompt if cfg.prompt is not None else gen.prompt
    return _plan_one(cfg, asm, prompt)


def _plan_batch(cfg: DictConfig, asm: Assembly) -> GenerationRequest:
    """Several prompts: each is checked as a request of its own; a row holds the longest one."""
    gen = cfg.experiment.generate
    if cfg.prompt is not None:
        raise ConfigError("set either prompt=... (one prompt) or experiment.generate.prompts (several), not both")
    spec = batch_spec(cfg.batch)
    each = [_plan_one(cfg, asm, p, where=f"experiment.generate.prompts[{i}]") for i, p in enumerate(gen.prompts)]
    capacity = max(r.capacity for r in each)
    kv = asm.setup.kv
    if cfg.kv.layout == "paged" and kv.num_blocks is not None:
        blocks = max(kv.blocks_for(r.positions) for r in each)
        if blocks + 1 > kv.num_blocks:
            raise ConfigError(f"kv.num_blocks={kv.num_blocks} cannot hold the longest prompt's {blocks} blocks of "
                              f"{kv.block_size} (plus the null block)")
    sampling = Sampling(gen.temperature, gen.top_k, gen.seed)
    first = each[0]
    return GenerationRequest(first.prompt, first.ids, first.max_new_tokens, first.chat, capacity, first.sampler,
                             batch=tuple(each), batch_spec=spec, sampling=sampling)


def _plan_one(cfg: DictConfig, asm: Assembly, prompt: str, where: str = "") -> GenerationRequest:
    gen, tok = cfg.experiment.generate, asm.tokenizer
    which = f" ({where})" if where else ""
    n = cfg.max_new_tokens if cfg.max_new_tokens is not None else gen.max_new_tokens
    key = "max_new_tokens" if cfg.max_new_tokens is not None else "experiment.generate.max_new_tokens"
    if n < 1:
        raise ConfigError(f"{key} must be >= 1, got {n}")
    if not prompt.strip():
        raise ConfigError(f"the generation prompt{which} is empty ({prompt!r}); set prompt=\"...\"")
    chat = tok.chat_template is not None if gen.chat is None else gen.chat
    ids = tuple(tok.encode_chat([{"role": "user", "content": prompt}]) if chat else tok.encode(prompt))
    if not ids:
        raise ConfigError(f"the generation prompt{which} {prompt!r} encodes to no tokens (chat={chat})")
    sampler = greedy if gen.temperature == 0 else seeded(gen.temperature, gen.top_k, gen.seed)
    need = len(ids) + n - 1
    what = f"the generation{which} writes {need} positions ({len(ids)}-token prompt + {key}={n} - 1)"
    limit = asm.model.dims.max_position_embeddings
    if need > limit:
        raise ConfigError(f"{what}, beyond the model's max_position_embeddings {limit}")
    capacity = need
    if cfg.kv.max_seq_len is not None:
        capacity = cfg.kv.max_seq_len
        if need > capacity:
            raise ConfigError(f"{what}, more than kv.max_seq_len={capacity}")
    kv = asm.setup.kv
    if cfg.kv.layout == "paged" and kv.num_blocks is not None:
        blocks = kv.blocks_for(need)
        if blocks + 1 > kv.num_blocks:
            raise ConfigError(f"kv.num_blocks={kv.num_blocks} is too small: {what}, which need {blocks} blocks of "
                              f"{kv.block_size} plus the null block")
    return GenerationRequest(prompt, ids, n, chat, capacity, sampler)


def decode_speed(decode_s: list[float]) -> dict[str, Any]:
    """Steady-state decode speed, with the plan build and the first step apart.

    The first decode step builds the plan (plan_once; replan builds in every step, which is its steady
    state). Averaging it in made a 48-token generation print ~2x the benchmark's ms/token, so the
    reported ms/token is the median of the steps after the first; the build, the first step and the
    all-in mean are reported beside it.
    """
    steady = decode_s[1:] or decode_s
    median = 1000.0 * statistics.median(steady) if steady else None
    return {
        "ms_per_token": median,  # steady state: median of the decode steps after the first
        "tokens_per_s": 1000.0 / median if median else None,
        "steady_steps": len(steady) if decode_s else 0,
        "first_decode_ms": 1000.0 * decode_s[0] if decode_s else None,  # the plan build lands here
        "mean_ms_per_token_all_steps": 1000.0 * sum(decode_s) / len(decode_s) if decode_s else None,
    }


def run_generation(cfg: DictConfig, asm: Assembly, req: Optional[GenerationRequest],
                   out: TextIO = sys.stdout, phases: Optional[PhasePeaks] = None) -> Optional[dict[str, Any]]:
    """Generate ``req`` with the run's backend, plan mode and KV strategy (``phases``: memory per phase)."""
    if req is None:
        return None
    phases = phases or PhasePeaks()
    if req.batch:
        phases.start("generate")
        return _run_batch(cfg, asm, req, out)
    gen, tok = cfg.experiment.generate, asm.tokenizer
    ctx = asm.setup.context(asm.model)
    if cfg.backend.threads is None:  # left to fuelpipe: follow the machine's load (fuelpipe.threads)
        ctx.thread_governor = for_backend(cfg.backend.name)
    cache = asm.setup.kv.new_cache(ctx, req.capacity)
    shown, tokens = "", []

    def stream(token: int) -> None:
        nonlocal shown
        tokens.append(token)
        if len(tokens) <= 2:  # the prompt is done; then the first decode step (the plan build) is done
            phases.start("first_decode" if len(tokens) == 1 else "decode")
        text = tok.decode(tokens)
        if gen.stream and text.startswith(shown):  # print only what is new (whole characters)
            out.write(text[len(shown):])
            out.flush()
            shown = text

    if gen.stream:
        out.write(f"--- {req.prompt}\n")
    phases.start("prefill")  # the prompt, with its program's build
    t0 = time.perf_counter()
    try:
        with _phase_logs_quiet(gen.stream):
            result = ctx.generate(list(req.ids), req.max_new_tokens, sampler=req.sampler, cache=cache,
                                  stop_ids=tok.stop_ids, on_token=stream)
    except KeyboardInterrupt:  # Ctrl-C: end the streamed text visibly and keep what was generated
        text = tok.decode(tokens)
        if gen.stream:
            out.write(text[len(shown):] + "\n--- [interrupted]\n")
            out.flush()
        raise RunInterrupted({"generation": {
            "prompt": req.prompt, "chat_template": req.chat, "prompt_tokens": len(req.ids), "text": text,
            "tokens": list(tokens), "new_tokens": len(tokens), "interrupted": True,
            "wall_s": time.perf_counter() - t0}}) from None
    wall = time.perf_counter() - t0
    text = tok.decode(result.tokens)
    if gen.stream:
        out.write(text[len(shown):] + "\n---\n")
    speed = decode_speed(result.decode_s)
    return {
        "prompt": req.prompt,
        "chat_template": req.chat,
        "prompt_tokens": len(req.ids),
        "text": text,
        "tokens": result.tokens,
        "new_tokens": len(result.tokens),
        "stopped_early": len(result.tokens) < req.max_new_tokens,
        "prefill_ms": 1000.0 * result.prefill_s,
        "prefill_build_ms": 1000.0 * ctx.prefill_plans.build_s,  # the prompt program's build, inside prefill_ms
        **speed,
        "wall_s": wall,
        "kv_capacity": req.capacity,
        "kv_bytes": cache.nbytes(),
        "plan_builds": ctx.plan.stats.builds,
        "plan_build_s": ctx.plan.stats.build_s,
        "plan_cache_hits": ctx.plan.stats.cache_hits,
        # what the decode plan's build did: compiled, loaded from the plan cache, or neither (fx, eager)
        "plan_cache": _event_record(ctx),
        "threads": thread_use(ctx.thread_governor),
        "load": asm.load,
    }


@contextlib.contextmanager
def _phase_logs_quiet(streaming: bool):
    """While text streams to stdout, the plan build's phase line (logged to stdout too) would land in the
    middle of a sentence: it is held back; the generate line then says how the plan was built."""
    if not streaming:
        yield
        return
    logger = logging.getLogger("fuelpipe.plan.session")
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(level)


def _event_record(ctx) -> Optional[dict[str, Any]]:
    session = getattr(ctx.plan, "session", None)
    event = getattr(getattr(session, "program", None), "cache_event", None)
    return event.record() if event is not None else None


def _run_batch(cfg: DictConfig, asm: Assembly, req: GenerationRequest, out: TextIO) -> dict[str, Any]:
    """Every prompt through one continuous batcher: rows join as others finish (see fuelpipe.batch.scheduler)."""
    gen, tok = cfg.experiment.generate, asm.tokenizer
    ctx = asm.setup.context(asm.model)
    spec = req.batch_spec
    kv = asm.setup.kv.new_batch(ctx, spec.max_batch, req.capacity)
    batcher = ContinuousBatcher(ctx, kv, spec)
    base = req.sampling
    for i, r in enumerate(req.batch):  # request i samples with seed + i: its own stream, whatever its neighbours
        sampling = Sampling(base.temperature, base.top_k, base.seed + i)
        batcher.submit(Request(r.ids, r.max_new_tokens, tuple(tok.stop_ids), sampling, name=f"prompt{i}"))
    t0 = time.perf_counter()
    results = batcher.run()
    wall = time.perf_counter() - t0
    rows = []
    for r, res in zip(req.batch, results):
        text = tok.decode(res.tokens)
        if gen.stream:
            out.write(f"--- [{res.index}] {r.prompt}\n{text}\n")
        rows.append({"prompt": r.prompt, "prompt_tokens": len(r.ids), "text": text, "tokens": res.tokens,
                     "new_tokens": len(res.tokens), "finish": res.finish,
                     "error": None if res.error is None else f"{type(res.error).__name__}: {res.error}",
                     "joined_at_step": res.admitted_step, "finished_at_step": res.finished_step,
                     "prefill_ms": 1000.0 * res.prefill_s})
    if gen.stream:
        out.write("---\n")
    d = batcher.describe()
    total = sum(len(res.tokens) for res in results)
    return {
        "requests": rows,
        "chat_template": req.chat,
        "batch": {"max_batch": spec.max_batch, "buckets": list(spec.buckets), "kv": cfg.kv.layout,
                  "kv_bytes_per_row": d["bytes_per_row"], "kv_bytes": kv.nbytes(), "steps": d["steps"],
                  "mean_batch": d["mean_batch"], "builds": d["builds"], "builds_per_bucket": d["builds_per_bucket"],
                  "plans_held": d["plans_held"], "plan_buffer_bytes": d["plan_buffer_bytes"],
                  "plan_weight_bytes": d["plan_weight_bytes"]},
        "new_tokens": total,
        "decode_tokens_per_s": d["decode_tokens_per_s"],  # steady: bucket plan builds taken out
        "plan_build_s": d["plan_build_s"],
        "tokens_per_s": total / wall if wall else None,  # everything: prompts, builds, decode
        "prefill_s": d["prefill_s"],
        "prefill_calls": d["prefill_calls"],
        "decode_s": d["decode_s"],
        "wall_s": wall,
        "kv_capacity": req.capacity,
        "kv_bytes": kv.nbytes(),
        "load": asm.load,
    }
