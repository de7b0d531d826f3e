"""Deliberate faults, injected only by negative controls.

Every oracle must be able to fail. These switches break the runtime in the
exact ways the oracles exist to catch; they are never set by a normal config.
"""
from __future__ import annotations

import enum


class Fault(enum.Enum):
    NONE = "none"
    STALE_OFFSET = "stale_offset"  # the held plan keeps the offset it was built with
    IGNORE_MODEL_IDENTITY = "ignore_model_identity"  # validity ignores shape_key (reuse across models)
    IGNORE_ALLOCATION = "ignore_allocation"  # validity ignores alloc_id (reuse across requests)
    REBUILD_EVERY_TOKEN = "rebuild_every_token"  # plan_once silently rebuilds (over-keying)
    NAIVE_DCE = "naive_dce"  # fx pass drops in-place KV writes as dead code
    UNSAFE_MASKED_SLOTS = "unsafe_masked_slots"  # masked KV slots reach attention as they are (NaN x 0 = NaN)
    STALE_ROPE = "stale_rope"  # a RoPE change never reaches decode: the context keeps its old RoPE tables
    PARTIAL_REBIND = "partial_rebind"  # rebind_kv commits each slot as it checks it: a refusal leaves it half-rebound
