"""InferenceContext: the persistent decode state for one model, and the generate loop.

The obvious loop is the fast one: ``ctx.generate(prompt_ids, 32)`` (or
``ctx.prefill`` then ``ctx.decode`` per token) reuses the held plan without
the caller knowing the word. Several requests may share one context, each
with its own cache; the held plan follows the cache it is asked to serve,
rebinding after a guarded check or rebuilding when the check refuses.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Optional, Sequence

import torch

from fuelpipe.backbone import OFFSET_MODES, DecodeBackbone
from fuelpipe.driver import HeldPlan
from fuelpipe.modes import PlanMode
from fuelpipe.errors import ConfigError, InputError
from fuelpipe.token_ids import count_arg, token_id_list, token_id_tensor, token_int
from fuelpipe.kv.batch import PagedBatch
from fuelpipe.kv.contiguous import ContiguousKvCache
from fuelpipe.kv.layout import layout_named, layout_of, signature_for
from fuelpipe.kv.paged import KvBlockPool
from fuelpipe.kv.sizes import check_size
from fuelpipe.masks import MaskRowTable
from fuelpipe.plan.backends import BACKENDS, BackendSpec
from fuelpipe.plan.policy import DEFAULT_POLICY, PlanPolicy
from fuelpipe.plan.prefill_program import PrefillPlans
from fuelpipe.plan.token_data import StepBuffers, TokenHostData, compute_token_host
from fuelpipe.rope import RopePlan, rope_tables
from fuelpipe.sampling import Sampler, greedy
from fuelpipe.threads import ThreadGovernor
from fuelpipe.step import step_module_for


@dataclass
class GenerationResult:
    prompt_ids: list[int]
    tokens: list[int]
    logits: list[torch.Tensor] = field(default_factory=list)  # per generated token, [vocab] f32
    prefill_s: float = 0.0
    decode_s: list[float] = field(default_factory=list)  # per decode step

    @property
    def ms_per_token(self) -> float:
        steps = self.decode_s[1:] or self.decode_s
        return 1000.0 * sum(steps) / max(1, len(steps))


class InferenceContext:
    def __init__(
        self,
        model: DecodeBackbone,
        backend: BackendSpec | str = "fx",
        plan: PlanMode | str = PlanMode.plan_once,
        *,
        offset_mode: Optional[str] = None,
        policy: PlanPolicy = DEFAULT_POLICY,
    ) -> None:
        if not isinstance(model, DecodeBackbone):
            raise ConfigError(f"InferenceContext needs a DecodeBackbone model, got {type(model).__name__}")
        spec = backend if isinstance(backend, BackendSpec) else BackendSpec(name=backend)
        mode = offset_mode or model.offset_mode
        if offset_mode is None and mode == "symbol" and BACKENDS.get(spec.name).ahead_of_time:
            mode = "tensor"  # the family's own path is a preference; a step compiled ahead of time takes tensors
        if mode not in OFFSET_MODES:
            raise ConfigError(f"offset_mode must be one of {list(OFFSET_MODES)}, got {mode!r}")
        self.model = model
        self.offset_mode = mode
        self.plan = HeldPlan(spec, PlanMode.parse(plan), mode, policy)
        self._rope_plan = model.rope_plan
        self._tables: Optional[tuple[torch.Tensor, torch.Tensor]] = None
        self._mask_rows: Optional[MaskRowTable] = None  # a decode step's mask rows (``_decode_mask``)
        self.prefill_plans = PrefillPlans(spec)  # the prompt step as a held program (eager backend: eager)
        # Adapts the thread count of ``generate`` / ``generate_iter`` to the machine's load
        # (fuelpipe.threads); None keeps the process's count fixed, as oracles and benchmarks want.
        self.thread_governor: Optional[ThreadGovernor] = None
        p = next(model.parameters())
        self.device, self.dtype = p.device, p.dtype

    def switch_model(self, model: DecodeBackbone) -> None:
        """Serve another model (for example a reload) through this context.

        The held plan is kept; its key, not this call, decides whether it may be
        reused, so a plan baked for the old model is rebuilt, never run on the new one.
        """
        if not isinstance(model, DecodeBackbone):
            raise ConfigError(f"switch_model needs a DecodeBackbone model, got {type(model).__name__}")
        self.model = model
        self.prefill_plans.drop()
        self._rope_plan = model.rope_plan
        self._tables = None
        p = next(model.parameters())
        self.device, self.dtype = p.device, p.dtype

    # ---- RoPE: per-token data, never part of the plan key --------------------------------
    @property
    def rope_plan(self) -> RopePlan:
        return self._rope_plan

    def set_rope_plan(self, plan: RopePlan) -> None:
        """Change RoPE frequencies/scaling. The held plan stays valid: rows are rebound per token."""
        own = self.model.rope_plan
        if (plan.rotary_dim, len(plan.specs), plan.layer_spec) != (own.rotary_dim, len(own.specs), own.layer_spec):
            raise ConfigError(
                "set_rope_plan may change frequencies and scaling only: rotary_dim, spec count and the "
                f"per-layer map must stay {(own.rotary_dim, len(own.specs), own.layer_spec)}, got "
                f"{(plan.rotary_dim, len(plan.specs), plan.layer_spec)}"
            )
        self._rope_plan = plan
        self._tables = self.plan.policy.tables_kept_on_rope_change(self._tables)

    def rope_tables(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._tables is None:
            self._tables = rope_tables(self._rope_plan, self.model.dims.max_position_embeddings)
        return self._tables

    # ---- caches --------------------------------------------------------------------------
    def new_pool(self, num_blocks: int, block_size: int, dtype: Optional[torch.dtype] = None) -> KvBlockPool:
        """A paged KV pool for this model; sequences come from ``pool.sequence(max_blocks_cap)``."""
        if self.model.latent_slots is not None:
            raise ConfigError(
                f"paged KV is not available for the MLA family {self.model.family!r}: it decodes from a latent cache "
                "(kv=latent); an expanded paged cache would give up MLA's memory saving"
            )
        d = self.model.dims
        return KvBlockPool(d.n_layers, d.n_kv_heads, d.head_dim, num_blocks, block_size, dtype or self.dtype, self.device)

    def check_positions(self, what: str, max_seq_len: int) -> int:
        """``max_seq_len`` checked: a positive int within the model's max_position_embeddings."""
        limit = self.model.dims.max_position_embeddings
        max_seq_len = check_size(what, "max_seq_len", max_seq_len)
        if max_seq_len > limit:
            raise ConfigError(f"max_seq_len {max_seq_len} exceeds the model's max_position_embeddings {limit}")
        return max_seq_len

    def own_layout(self):
        """The layout this model decodes from by default: latent for an MLA family, else contiguous."""
        return layout_named("latent" if self.model.latent_slots is not None else "contiguous")

    def new_cache(self, max_seq_len: int, dtype: Optional[torch.dtype] = None) -> ContiguousKvCache:
        return self.own_layout().new_cache(self, None, max_seq_len, dtype)

    def new_batch_cache(self, max_batch: int, max_seq_len: int, dtype: Optional[torch.dtype] = None):
        """A batch-slot cache of ``max_batch`` sequences x ``max_seq_len`` positions (latent for MLA families)."""
        return self.own_layout().new_batch(self, None, max_batch, max_seq_len, dtype)

    def new_paged_batch(self, pool: KvBlockPool, max_batch: int, max_blocks_cap: int) -> PagedBatch:
        """Up to ``max_batch`` sequences of ``pool``, each with a block table of ``max_blocks_cap`` entries."""
        self.check_cache(pool.sequence(1))
        return PagedBatch(pool, max_batch, max_blocks_cap)

    # ---- steps ---------------------------------------------------------------------------
    def check_batch_cache(self, kv) -> None:
        """A batch cache (``ctx.new_batch_cache``, ``ctx.new_paged_batch``) of a layout this model decodes from."""
        if not getattr(kv, "batched", False) or not all(
                hasattr(kv, a) for a in ("acquire", "release", "owns", "row_indices", "max_rows")):
            raise ConfigError(f"a batch decode needs a batch cache (ctx.new_batch_cache, ctx.new_paged_batch), "
                              f"got {type(kv).__name__}")
        self.check_cache(kv)

    def check_cache(self, cache) -> None:
        """The cache must have a layout and geometry this model decodes from; refuse before anything runs."""
        layout = layout_of(cache)
        if cache.dtype != self.dtype:
            raise ConfigError(f"cache dtype {cache.dtype} must equal the model's {self.dtype}")
        layout.check_cache(self.model, cache)

    def _host(self, cache, token_ids: torch.Tensor, id_range: Optional[tuple[int, int]] = None) -> TokenHostData:
        """The step's host data for ``token_ids`` [1, T] at the cache's next positions, every input checked
        first (``id_range``: the ids' (min, max) when the caller has them as ints, saving two tensor reads)."""
        self.check_cache(cache)
        if token_ids.dim() != 2 or token_ids.shape[0] != 1 or token_ids.shape[1] < 1:
            raise InputError(f"token_ids must have shape [1, T>=1], got {list(token_ids.shape)}")
        vocab = self.model.dims.vocab_size
        lo, hi = id_range if id_range is not None else (int(token_ids.min()), int(token_ids.max()))
        if lo < 0 or hi >= vocab:
            raise InputError(f"token ids must lie in [0, {vocab}), got range [{lo}, {hi}]")
        start, n = cache.cached_len, token_ids.shape[1]
        if start + n > self.model.dims.max_position_embeddings:
            raise InputError(
                f"positions [{start}, {start + n}) exceed the model's max_position_embeddings "
                f"{self.model.dims.max_position_embeddings}"
            )
        cache.check_room(start, n)  # a paged sequence allocates its blocks here, atomically
        cos, sin = self.rope_tables()
        return compute_token_host(
            token_ids.to(torch.int64), cos, sin, self.model.mask_plan, start, cache.width, self.dtype,
            write_index=cache.write_index(start, n), block_table=cache.block_table(),
            mask=self._decode_mask(start, cache.width) if n == 1 else None,
        )

    def _decode_mask(self, start: int, width: int) -> torch.Tensor:
        """A decode step's mask rows, a view of the context's ``MaskRowTable`` for this width (made on first use
        and again when the model's mask plan, the width or the dtype change)."""
        table = self._mask_rows
        if table is None or not table.serves(self.model.mask_plan, width, self.dtype):
            table = self._mask_rows = MaskRowTable(self.model.mask_plan, width, self.dtype)
        return table.row(start)

    def _prefill_step(self, signature):
        return self.prefill_plans.step(self.model, signature.name, lambda: step_module_for(self.model, signature))

    @torch.no_grad()
    def prefill(self, cache, token_ids: Sequence[int] | torch.Tensor) -> torch.Tensor:
        """Run the prompt (T positions at once) through the held prompt program (``fuelpipe.plan.prefill_program``;
        the eager step on the eager backend). Returns last logits [1, vocab] f32."""
        ids = token_id_tensor(token_ids)
        host = self._host(cache, ids)
        signature = signature_for(cache, self.offset_mode)
        buffers = StepBuffers(host, self.dtype, self.device)
        buffers.load(host)
        logits = self._prefill_step(signature)(*signature.arguments(buffers, host, cache.bound_tensors()))
        cache.advance(ids.shape[1])
        cache.bump_all_versions()
        return logits

    @torch.no_grad()
    def decode(self, cache, token_id: int | torch.Tensor) -> torch.Tensor:
        """One decode token through the held plan. Returns logits [1, vocab] f32."""
        if isinstance(token_id, torch.Tensor):
            if token_id.numel() != 1 or token_id.dtype.is_floating_point or token_id.dtype == torch.bool:
                raise InputError(f"decode takes one integer token id, got a {token_id.dtype} tensor of shape "
                                 f"{list(token_id.shape)}")
            ids = token_id.reshape(1, 1).to(torch.int64)
            host = self._host(cache, ids)
        else:
            tid = token_int(token_id)
            host = self._host(cache, torch.tensor([[tid]], dtype=torch.int64), id_range=(tid, tid))
        logits = self.plan.step(self.model, cache, host)
        cache.advance(1)
        cache.bump_all_versions()
        return logits

    def generate(
        self,
        prompt_ids: Sequence[int],
        max_new_tokens: int,
        *,
        sampler: Sampler = greedy,
        cache: Optional[ContiguousKvCache] = None,
        max_seq_len: Optional[int] = None,
        stop_ids: Sequence[int] = (),
        on_token: Optional[Callable[[int], None]] = None,
        keep_logits: bool = False,
    ) -> GenerationResult:
        """Prefill ``prompt_ids``, then sample up to ``max_new_tokens`` tokens.

        Everything is checked before anything runs: the arguments, the positions against the
        model's ``max_position_embeddings`` and the cache's capacity, and the cache's whole need is
        reserved (a paged sequence takes every block it will write now, or raises with the
        sequence and its pool untouched).
        """
        if on_token is not None and not callable(on_token):
            raise InputError(f"generate: on_token must be callable, got {type(on_token).__name__} {on_token!r}")
        result = GenerationResult([], [])
        for token in self.generate_iter(prompt_ids, max_new_tokens, sampler=sampler, cache=cache,
                                        max_seq_len=max_seq_len, stop_ids=stop_ids, keep_logits=keep_logits,
                                        result=result):
            if on_token is not None:
                on_token(token)
        return result

    def generate_iter(
        self,
        prompt_ids: Sequence[int],
        max_new_tokens: int,
        *,
        sampler: Sampler = greedy,
        cache: Optional[ContiguousKvCache] = None,
        max_seq_len: Optional[int] = None,
        stop_ids: Sequence[int] = (),
        keep_logits: bool = False,
        result: Optional[GenerationResult] = None,
    ) -> Iterator[int]:
        """``generate``'s tokens one at a time, each as soon as it is sampled.

        The arguments are checked and the cache reserved now, before the first token is asked for.
        A caller that stops asking ends the generation: the next decode step never runs. ``result``,
        when given, is filled as ``generate``'s result is (tokens, timings, logits).
        """
        prompt = token_id_list(prompt_ids, "generate: prompt_ids")
        if not prompt:
            raise InputError("generate: the prompt must hold at least one token")
        vocab = self.model.dims.vocab_size
        bad = sorted({t for t in prompt if not 0 <= t < vocab})
        if bad:
            raise InputError(f"generate: prompt token ids must lie in [0, {vocab}), got {bad[:8]}")
        max_new_tokens = count_arg("generate: max_new_tokens", max_new_tokens)
        stops = set(token_id_list(stop_ids, "generate: stop_ids"))
        if not callable(sampler):
            raise InputError(f"generate: sampler must be callable, got {type(sampler).__name__} {sampler!r}")
        need = len(prompt) + max(0, max_new_tokens - 1)  # the last sampled token is never fed back
        if cache is None:
            if max_seq_len is not None:
                max_seq_len = count_arg("generate: max_seq_len", max_seq_len)
                if max_seq_len < need:
                    raise InputError(
                        f"generate: max_seq_len {max_seq_len} < the {need} positions this generation writes")
            start = 0
        else:
            if not all(hasattr(cache, a) for a in ("cached_len", "max_seq_len", "reserve")):
                raise InputError("generate: cache must be a KV cache (ctx.new_cache(...), pool.sequence(...)), "
                                 f"got {type(cache).__name__}")
            start = cache.cached_len
        limit = self.model.dims.max_position_embeddings
        if start + need > limit:
            raise InputError(
                f"generate: positions [{start}, {start + need}) (prompt {len(prompt)} + max_new_tokens "
                f"{max_new_tokens} - 1) exceed the model's max_position_embeddings {limit}"
            )
        if cache is None:
            cache = self.new_cache(max_seq_len or need)
        elif cache.max_seq_len is None or cache.max_seq_len - cache.cached_len < need:
            raise InputError(
                f"generate: needs {need} free positions, cache has {cache.max_seq_len} - {cache.cached_len} used"
            )
        self.check_cache(cache)
        cache.reserve(start + need)  # all or nothing, before the prefill writes anything
        if result is None:
            result = GenerationResult(prompt, [])
        result.prompt_ids = prompt
        return self._steps(prompt, max_new_tokens, sampler, cache, stops, keep_logits, result)

    def _steps(self, prompt: list[int], max_new_tokens: int, sampler: Sampler, cache, stops: set[int],
               keep_logits: bool, result: GenerationResult) -> Iterator[int]:
        """The generate loop over checked arguments: sample, hand the token out, decode it unless it ends the run."""
        governor = self.thread_governor
        caller_threads = governor.begin() if governor is not None else 0
        try:
            t0 = time.perf_counter()
            logits = self.prefill(cache, prompt)  # at the governor's count: 2 spinning threads on a busy
            result.prefill_s = time.perf_counter() - t0  # machine cost a SmolLM2 prompt seconds
            for i in range(max_new_tokens):
                token = sampler(logits)
                result.tokens.append(token)
                if keep_logits:
                    result.logits.append(logits[0].clone())
                yield token
                if token in stops or i == max_new_tokens - 1:
                    break
                t0, c0 = time.perf_counter(), time.process_time() if governor is not None else 0.0
                logits = self.decode(cache, token)
                result.decode_s.append(time.perf_counter() - t0)
                if governor is not None:
                    governor.observe(result.decode_s[-1], time.process_time() - c0)
        finally:
            if governor is not None and caller_threads:
                governor.end(caller_threads)
