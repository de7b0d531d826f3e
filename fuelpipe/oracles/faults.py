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
    # RoPE inverse frequencies theta ** -(i / d) instead of theta ** -(2i / d), planted in fuelpipe.rope, which the
    # decode path and every family's own reference share (so vs_reference cannot see it); see oracles/planted.py
    ROPE_FREQ_EXPONENT = "rope_freq_exponent"
    # The split-GEMV pass fills each part with every P-th output row but assembles the parts as blocks
    # (outputs permuted); only matrices big enough to split see it, which no tiny model has
    SPLIT_PARTS_INTERLEAVED = "split_parts_interleaved"
    # Batches. Every row of a batch step gets row 0's position (RoPE rows and mask), the ragged-batch bug
    SHARED_BATCH_POSITION = "shared_batch_position"
    # A padding row keeps the slot / block-table row of the sequence that last sat in that row (after it left)
    STALE_PADDING_ROW = "stale_padding_row"
    # The batch plan is keyed on which sequences are live, so every join or leave rebuilds it (over-keying)
    REBUILD_ON_JOIN = "rebuild_on_join"
    # The packed prompt step masks causally over the whole packed row: a prompt also attends the prompts packed
    # before it (the mask forgets which sequence each token belongs to)
    PACKED_PREFILL_CROSS_ROWS = "packed_prefill_cross_rows"
    # The persistent plan cache keys entries without the weight digest: a plan compiled (weights baked) for one
    # checkpoint is loaded for another of the same shapes
    PLAN_CACHE_IGNORES_WEIGHTS = "plan_cache_ignores_weights"
    # Every packed low-bit matrix dequantizes with twice its scale (a dequantizer reading the wrong scale)
    QUANT_WRONG_SCALE = "quant_wrong_scale"
    # backend=aot binds the package's weights by name; this binds each to another constant of the same shape
    # (a rotation among them: layer i runs on layer i+1's matrix), the class of a name mismatch between the
    # exported program and the package
    AOT_CONSTANTS_MISBOUND = "aot_constants_misbound"
    # kernel_parity feeds each C++ kernel its input without its tail: the linear kernels' activations with the last
    # 32-element block zeroed, slot attention's mask hiding every row's last slot (the class of a kernel that
    # drops an odd tail block or never reads a full row's last slot)
    KERNEL_TAIL_DROPPED = "kernel_tail_dropped"
