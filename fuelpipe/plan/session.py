"""DecodeSession: one held step program, its bound KV, and the key it is valid for."""
from __future__ import annotations

import logging
import time
from typing import Optional

import torch

from dataclasses import replace

from fuelpipe.errors import PlanError
from fuelpipe.plan.backends import StepProgram
from fuelpipe.kv.layout import StepSignature
from fuelpipe.plan.token_data import StepBuffers, TokenHostData
from fuelpipe.plan.weights_identity import WeightsPin
from fuelpipe.plan.validity import (
    KvRebindSource,
    PlanKey,
    PlanValidity,
    RebindRefusal,
    RebindRefused,
    RefusalReason,
    StorageFingerprint,
    interchangeable,
)

log = logging.getLogger(__name__)


class DecodeSession:
    """A built decode-step program held across tokens.

    Only per-token data is rebound (into ``buffers``); weights are baked into
    the program and the KV tensors in ``kv_bound`` are its bound state, written
    in place each step. ``realize_count`` counts reused tokens (0 right after
    the build), the device-independent plan-hit signal.
    """

    def __init__(
        self,
        program: StepProgram,
        key: PlanKey,
        kv_bound: list[torch.Tensor],
        kv_location: Optional[torch.device],
        buffers: StepBuffers,
        signature: StepSignature,
        *,
        weights_pin: Optional[WeightsPin] = None,
    ) -> None:
        self.program = program
        self._key = key
        self._kv_bound = list(kv_bound)
        self._kv_location = kv_location
        self.buffers = buffers
        self.signature = signature  # the program's inputs, from the cache's layout
        self.step_kind = signature.name
        self.realize_count = 0
        self.build_s = program.trace_s
        # Everything the key's weight identity names stays alive while the plan is held,
        # so no id or storage address it compares on can be recycled by a newcomer.
        self._weights_pin = weights_pin

    # ---- validity -------------------------------------------------------------------------
    @property
    def key(self) -> PlanKey:
        return self._key

    def validity_for(self, live: PlanKey) -> PlanValidity:
        return self._key.compare(live)

    def is_valid_for(self, live: PlanKey) -> bool:
        return self.validity_for(live) is PlanValidity.VALID

    # ---- guarded rebind -------------------------------------------------------------------
    def rebind_kv(self, source: KvRebindSource) -> None:
        """Re-point the plan's bound KV at ``source``'s storage, or raise ``RebindRefused``.

        Checked against the tensors actually bound into this plan, not against
        the cache's description of itself. Everything is staged before anything
        is mutated, so a refusal leaves the plan exactly as it was.
        Call only when ``validity_for`` answered ALLOCATION_CHANGED.
        """
        incoming_loc = source.rebind_location()
        if incoming_loc is None or self._kv_location is None:
            raise RebindRefused(RebindRefusal(RefusalReason.RESIDENCY_UNKNOWN))
        if incoming_loc != self._kv_location:
            raise RebindRefused(
                RebindRefusal(RefusalReason.RESIDENCY_DIFFERS, baked=str(self._kv_location), incoming=str(incoming_loc))
            )
        staged: list[torch.Tensor] = []
        n_layers = self._key.n_layers
        per_layer = len(self._kv_bound) // n_layers  # K/V: 2; a latent cache: its slot count
        for layer in range(n_layers):
            for which in range(per_layer):
                incoming = source.rebind_slot(layer, which)
                if incoming is None:
                    raise RebindRefused(RebindRefusal(RefusalReason.MISSING_SLOT, layer, which))
                baked = self._kv_bound[per_layer * layer + which]
                if baked is None:
                    raise RebindRefused(RebindRefusal(RefusalReason.UNBAKED_SLOT, layer, which))
                if not interchangeable(baked, incoming):
                    raise RebindRefused(
                        RebindRefusal(
                            RefusalReason.STORAGE_DIFFERS,
                            layer,
                            which,
                            baked=StorageFingerprint.of(baked).short(),
                            incoming=StorageFingerprint.of(incoming).short(),
                        )
                    )
                staged.append(incoming)
                self._slot_checked(per_layer * layer + which, incoming)
        self._kv_bound = staged
        self._key = _with_alloc(self._key, source.alloc_id)

    def _slot_checked(self, index: int, incoming: torch.Tensor) -> None:
        """Called as each bound slot passes the rebind check; nothing is committed until all have."""

    def bound_kv(self) -> list[torch.Tensor]:
        return list(self._kv_bound)

    def _drop_bound_slot(self, layer: int, which: int) -> None:
        """Test hook: simulate an internal inconsistency (a bound slot gone missing)."""
        self._kv_bound[len(self._kv_bound) // self._key.n_layers * layer + which] = None  # type: ignore

    # ---- running --------------------------------------------------------------------------
    def _token_data(self, host: TokenHostData) -> TokenHostData:
        """The per-token data this token runs with: the caller's, as it is."""
        return host

    def _call(self, host: TokenHostData) -> torch.Tensor:
        host = self._token_data(host)
        self.buffers.load(host)
        return self.program.fn(*self.signature.arguments(self.buffers, host, self._kv_bound))

    def realize_first(self, host: TokenHostData) -> torch.Tensor:
        """Run the build token (includes any lazy compilation, counted as build time)."""
        t0 = time.perf_counter()
        if self.program.compiles_on_first_call:
            log.info("phase: compile (backend=%s, %s step)", self.program.backend, self.step_kind)
        with self.program.first_call_context():
            out = self._call(host)
        if self.program.compiles_on_first_call:
            self.build_s += time.perf_counter() - t0
            if self.program.counter is not None and self.program.compiles < 1:
                # dynamo ran the step without handing a graph to inductor (for example a
                # recompile limit): the "inductor" plan would silently be eager.
                raise PlanError(f"{self.program.backend} backend compiled nothing for the decode step; refusing to run it as eager")
        return out

    def realize_token(self, host: TokenHostData) -> torch.Tensor:
        """Reuse the held plan for one more token."""
        out = self._call(host)
        self.realize_count += 1
        return out

    # ---- introspection --------------------------------------------------------------------
    @property
    def node_count(self) -> Optional[int]:
        p = self.program
        if p.node_count is not None:
            return p.node_count
        return p.counter.node_count if p.counter is not None else None

    @property
    def compiles(self) -> int:
        return self.program.compiles


def _with_alloc(key: PlanKey, alloc_id) -> PlanKey:
    return replace(key, alloc_id=alloc_id)
