"""The one shared decode driver: build, reuse, rebind or rebuild a held plan, for every family.

Nothing here knows which family it is driving; it sees a ``DecodeBackbone``
and a KV cache. Plan modes:

* ``replan``    build (trace, optimise, compile) a fresh program every token, run it, discard it.
* ``plan_once`` build once, hold it, rebind only per-token data; rebind or rebuild on a key change.

The same two modes (``fuelpipe.modes.PlanMode``) drive every KV layout; ``plan_once`` is the default.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Optional

import torch

from fuelpipe.backbone import DecodeBackbone
from fuelpipe.plan.backends import BackendSpec, build_program
from fuelpipe.plan.derived_weights import forget as forget_derived
from fuelpipe.plan.fx_passes import passes_for_rows
from fuelpipe.plan.policy import DEFAULT_POLICY, PlanPolicy
from fuelpipe.plan.session import DecodeSession
from fuelpipe.plan.token_data import StepBuffers, TokenHostData
from fuelpipe.plan.validity import PlanKey, PlanValidity, RebindRefused
from fuelpipe.plan.weights_identity import pin_weights, weights_identity
from fuelpipe.kv.layout import StepSignature, signature_for
from fuelpipe.modes import PlanMode




@dataclass
class PlanStats:
    """What the driver did, for accounting oracles and reports."""

    builds: int = 0
    rebinds: int = 0
    refusals: list[str] = field(default_factory=list)
    build_s: float = 0.0
    # Persistent plan cache (backend.plan_cache): builds served from disk, and where build time went.
    compile_s: float = 0.0
    cache_load_s: float = 0.0
    cache_statuses: dict[str, int] = field(default_factory=dict)  # hit / miss / corrupt / mismatch -> builds
    cache_detail: str = ""  # the last corrupt or mismatched entry: what was wrong with it
    last_validity: Optional[PlanValidity] = None  # the verdict on the held plan at the last step that had one

    @property
    def cache_hits(self) -> int:
        return self.cache_statuses.get("hit", 0)

    @property
    def cache_misses(self) -> int:
        """Builds that compiled: a miss, or a corrupt / mismatched entry rebuilt."""
        return sum(self.cache_statuses.values()) - self.cache_hits


def live_key(backbone: DecodeBackbone, cache, seq: int, policy: PlanPolicy = DEFAULT_POLICY) -> PlanKey:
    """The key the live (model, cache, step) would need a plan to have.

    ``cache`` is a ContiguousKvCache or a PagedSequence: it names its own geometry
    (max_seq_len, or max_blocks_cap and block_size) and its allocation (the pool's id).
    """
    return policy.key(PlanKey(
        geometry=cache.plan_geometry(seq),
        n_layers=cache.n_layers,
        cache_dtype=cache.dtype,
        shape_key=backbone.shape_key(),
        weights=weights_identity(backbone),
        alloc_id=cache.alloc_id,
    ))


def build_session(
    backbone: DecodeBackbone,
    cache,
    spec: BackendSpec,
    signature: StepSignature,
    host: TokenHostData,
    key: PlanKey,
    policy: PlanPolicy = DEFAULT_POLICY,
) -> DecodeSession:
    passes = passes_for_rows(spec.fx_passes, host.batch)  # a batch step's linears are GEMMs
    # the rows each linear sees (measured passes choose by them)
    spec = policy.backend(dataclasses.replace(spec, fx_passes=passes, rows=host.batch))
    step = policy.step_module(backbone, signature)
    program = build_program(spec, step, signature.name)
    device = cache.bound_tensors()[0].device
    buffers = StepBuffers(host, cache.dtype, device)
    return policy.session_class(
        program,
        key,
        cache.bound_tensors(),
        cache.device_location,
        buffers,
        signature,
        weights_pin=pin_weights(backbone),
    )


class HeldPlan:
    """Owns at most one held DecodeSession and applies the plan mode's reuse rules."""

    def __init__(self, spec: BackendSpec, mode: PlanMode, offset_mode: str,
                 policy: PlanPolicy = DEFAULT_POLICY) -> None:
        self.spec = spec
        self.mode = mode
        self.offset_mode = offset_mode
        self.policy = policy  # how plans are keyed, built and reused (fuelpipe.plan.policy)
        self.session: Optional[DecodeSession] = None
        self.stats = PlanStats()

    def drop(self) -> None:
        """Forget the held plan (and the shared derived weight copies: the next build derives them afresh)."""
        self.session = None
        forget_derived()

    def _build_and_run(self, backbone, cache, host, key) -> torch.Tensor:
        t0 = time.perf_counter()
        signature = signature_for(cache, self.offset_mode)  # the cache's layout owns its step
        session = build_session(backbone, cache, self.spec, signature, host, key, self.policy)
        logits = session.realize_first(host)
        self.stats.builds += 1
        self.stats.build_s += time.perf_counter() - t0
        event = session.program.cache_event
        if event is not None and event.status != "uncacheable":
            self.stats.compile_s += event.compile_s
            self.stats.cache_load_s += event.load_s
            self.stats.cache_statuses[event.status] = self.stats.cache_statuses.get(event.status, 0) + 1
            if event.detail:
                self.stats.cache_detail = f"{event.status}: {event.detail} (entry {event.key})"
        self.session = session
        return logits

    def step(self, backbone: DecodeBackbone, cache, host: TokenHostData) -> torch.Tensor:
        key = live_key(backbone, cache, host.seq, self.policy)
        if self.mode is PlanMode.replan or not self.policy.reuses_plans():
            self.session = None
            logits = self._build_and_run(backbone, cache, host, key)
            if self.mode is PlanMode.replan:
                self.session = None  # replan discards the program after use
            return logits
        session = self.session
        if session is None:
            return self._build_and_run(backbone, cache, host, key)
        validity = session.validity_for(key)
        self.stats.last_validity = validity
        if validity is PlanValidity.ALLOCATION_CHANGED:
            try:
                session.rebind_kv(cache)
                self.stats.rebinds += 1
                validity = PlanValidity.VALID
            except RebindRefused as refused:
                self.stats.refusals.append(str(refused.refusal))
        if validity is not PlanValidity.VALID:
            return self._build_and_run(backbone, cache, host, key)
        return session.realize_token(host)
