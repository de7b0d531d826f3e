"""kv=ring: windowed layers keep only their window, and decode exactly as a contiguous cache does."""
import dataclasses
import sys
from pathlib import Path

import pytest
import torch

from fuelpipe.context import InferenceContext
from fuelpipe.errors import ConfigError, KvCapacityError
from fuelpipe.kv import ring
from fuelpipe.kv.layout import KV_LAYOUTS, StepSignature, layout_names, signature_for, signature_named
from fuelpipe.kv.spec import KvSpec
from fuelpipe.oracles.registry import ORACLES
from fuelpipe.runner.assemble import assemble
from fuelpipe.runner.oracles import run_one
from models.registry import FAMILIES, build_random_model

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "mistral_sw"  # the out-of-tree Mistral-style family

PROMPT = list(range(3, 14))  # 11 tokens: longer than the tiny models' 8-position window, so a ring wraps in prefill


def _model(family: str, size: str):
    if family != "mistral_sw":
        return build_random_model(family, size)
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(EXAMPLE))
        from fuelpipe_mistral_sw.family import FAMILY

        with FAMILIES.swapped(FAMILY):
            return build_random_model("mistral_sw", size)


def _decode(ctx, cache, steps: int = 14) -> list[torch.Tensor]:
    logits = [ctx.prefill(cache, PROMPT)]
    for _ in range(steps):
        logits.append(ctx.decode(cache, int(logits[-1].argmax())))
    return logits


@pytest.mark.parametrize("family,size", [("gemma3", "tiny"), ("mistral_sw", "tiny"), ("phi", "tiny")])
@pytest.mark.parametrize("backend", ["eager", "fx"])
def test_a_ring_decodes_what_a_contiguous_cache_decodes(family, size, backend):
    model = _model(family, size)
    ref = InferenceContext(model, backend="eager")
    want = _decode(ref, KvSpec("contiguous").new_cache(ref, 40))
    ctx = InferenceContext(model, backend=backend)
    cache = KvSpec("ring").new_cache(ctx, 40)
    got = _decode(ctx, cache)
    assert ctx.plan.stats.builds == 1 and ctx.plan.session.step_kind == "ring"
    assert [int(x.argmax()) for x in got] == [int(x.argmax()) for x in want]
    assert max(float((a - b).abs().max()) for a, b in zip(got, want)) < 1e-5


def test_ring_memory_is_the_window_on_windowed_layers_and_everything_on_full_ones():
    model = build_random_model("gemma3", "tiny")  # five layers through an 8-position window, one full
    ctx = InferenceContext(model, backend="eager")
    d = model.dims
    ring_cache, contiguous = KvSpec("ring").new_cache(ctx, 64), KvSpec("contiguous").new_cache(ctx, 64)
    per_position = 2 * d.n_kv_heads * d.head_dim * 4  # K and V, f32
    assert ring_cache.widths == (8, 8, 8, 8, 8, 64)
    assert ring_cache.nbytes() == per_position * (5 * 8 + 64)
    assert contiguous.nbytes() == per_position * 6 * 64
    assert ring_cache.bytes_per_token() == per_position  # one more position of capacity costs the full layer only


def test_rewinding_works_until_a_ring_wraps_then_is_refused_typed_and_changes_nothing():
    model = build_random_model("phi", "tiny")  # an 8-position window on every layer
    ctx = InferenceContext(model, backend="eager")
    cache = KvSpec("ring").new_cache(ctx, 40)
    first = [ctx.prefill(cache, [5, 6, 7])]
    for t in (8, 9):
        first.append(ctx.decode(cache, t))
    cache.truncate_to(3)  # nothing wrapped yet (5 positions in an 8-slot ring): a rewind is exact
    again = ctx.decode(cache, 8)
    assert torch.equal(again, first[1])
    for t in range(10, 20):
        ctx.decode(cache, t)
    length = cache.cached_len
    assert cache.rewind_floor == length
    with pytest.raises(KvCapacityError, match="cannot rewind once a ring has wrapped"):
        cache.truncate_to(length - 2)
    assert cache.cached_len == length
    cache.truncate_to(0)  # starting over needs nothing the ring forgot
    assert torch.equal(ctx.prefill(cache, [5, 6, 7]), first[0])


class _NoWindowRing(ring.RingKv):
    """Planted bug: the ring's mask forgets the window, so a query also attends the slot one window back."""

    def write_and_read(self, k, v, mask):
        keys, values, own = super().write_and_read(k, v, mask)
        pos = self.write_pos  # [B, T]
        held = pos[:, :1] - 1 - torch.remainder(pos[:, :1] - 1 - torch.arange(self.window), self.window)
        key_pos = torch.cat([held, pos], dim=1)  # [B, W + T]
        causal = (key_pos[:, None, :] >= 0) & (pos[:, :, None] >= key_pos[:, None, :])  # the window check dropped
        return keys, values, torch.zeros_like(own).masked_fill(~causal[:, None], float("-inf"))


def _faulty_ring():
    def views(backbone, a, kv):
        out = ring.RING.views(backbone, a, kv)
        return [_NoWindowRing(v.k_rings, v.v_rings, v.write_pos, v.slot_ids, v.window)
                if isinstance(v, ring.RingKv) else v for v in out]

    faulty = StepSignature("ring", ("write_index",), views)

    @dataclasses.dataclass(frozen=True)
    class FaultyRing(ring.RingLayout):
        def signatures(self):
            return (faulty,)

        def signature(self, offset_mode, *, batched=False, packed=False):
            return faulty

    return FaultyRing()


@pytest.mark.parametrize("model", ["gemma3_tiny", "phi_tiny"])
def test_vs_reference_passes_on_the_ring_and_catches_a_ring_that_forgets_its_window(compose_cfg, model):
    cfg = compose_cfg([f"model={model}", "kv=ring", "backend=eager", "experiment.new_tokens=12"])
    healthy = run_one(cfg, assemble(cfg), ORACLES["vs_reference"])
    assert healthy.passed, healthy.detail
    with KV_LAYOUTS.swapped(_faulty_ring()):
        planted = run_one(cfg, assemble(cfg), ORACLES["vs_reference"])
    assert not planted.passed, f"a ring attending a window back passed vs_reference: {planted.detail}"


@pytest.mark.parametrize("name", ["batch_vs_solo", "batch_isolation"])
def test_batch_oracles_pass_on_ring_batches_and_catch_their_faults(compose_cfg, name):
    base = ["model=gemma3_tiny", "kv=ring", "backend=eager", "batch.max_batch=4", "batch.buckets=[1,2,4]",
            "experiment.new_tokens=6"]
    cfg = compose_cfg(base)
    healthy = run_one(cfg, assemble(cfg), ORACLES[name])
    assert healthy.passed, healthy.detail
    cfg = compose_cfg([*base, f"experiment.oracles.{name}.inject_fault=true"])
    control = run_one(cfg, assemble(cfg), ORACLES[name])
    assert not control.passed, f"{name}'s negative control passed on a ring batch: {control.detail}"


def test_the_ring_is_a_registered_layout_with_its_own_signatures():
    assert {"contiguous", "paged", "latent", "ring"} <= set(layout_names())
    assert signature_named("ring").inputs == ("write_index",) and not signature_named("ring").symbolic
    assert signature_named("batch_ring").inputs == ("write_index", "slot_ids")
    assert signature_named("packed_ring").packed
    model = build_random_model("gemma3", "tiny")
    ctx = InferenceContext(model, backend="eager")
    for offset in ("tensor", "symbol"):  # a ring needs the step's positions as a tensor, whatever the path
        assert signature_for(KvSpec("ring").new_cache(ctx, 16), offset).name == "ring"
    assert signature_for(KvSpec("ring").new_batch(ctx, 2, 16), "symbol").name == "batch_ring"


def test_bad_layouts_and_unservable_models_are_typed_errors():
    with pytest.raises(ConfigError, match="did you mean 'ring'"):
        KvSpec("rign")
    mla = InferenceContext(build_random_model("deepseek_v2", "tiny"), backend="eager")
    with pytest.raises(ConfigError, match="kv=ring cannot serve deepseek_v2: .*MLA"):
        KvSpec("ring").new_cache(mla, 16)
    gemma = InferenceContext(build_random_model("gemma3", "tiny"), backend="eager")
    other = InferenceContext(build_random_model("phi", "tiny"), backend="eager")
    with pytest.raises(ConfigError, match="geometry|windows"):
        gemma.prefill(KvSpec("ring").new_cache(other, 16), [1, 2])
