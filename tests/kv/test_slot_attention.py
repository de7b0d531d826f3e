"""The batch-slot attention kernel: the readable gather-then-attend form, computed in place.

``fuelpipe.kv.slot_attention.slot_attention`` is the reference; ``fast_slot_attention``
runs the C++ operator (float32, CPU). The kernel never reads a masked slot, so what a
masked slot holds (NaN poison, another sequence's rows) cannot change a bit of the output.
"""
import pytest
import torch

from _support.batch_helpers import WIDTH, tiny
from _support.batch_helpers import batch_cache as _batch_cache
from fuelpipe.batch import BatchDecoder, BatchSpec
from fuelpipe.context import InferenceContext
from fuelpipe.oracles.faults import Fault
from fuelpipe.oracles.faulty import policy_for
from fuelpipe.kv import slot_attention as sa
from fuelpipe.plan.backends import BackendSpec
from fuelpipe.plan.default_passes import DEFAULT_FX_PASSES
from fuelpipe.plan.panels import kernels_available

pytestmark = pytest.mark.skipif(kernels_available() is not None, reason=f"kernels: {kernels_available()}")

NEG = float("-inf")


def _case(B=5, H=6, Hkv=2, T=1, S=40, D=32, Dv=None, N=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    Dv = Dv or D
    q = torch.randn(B, H, T, D, generator=g)
    k_buf = torch.randn(N, Hkv, S, D, generator=g)
    v_buf = torch.randn(N, Hkv, S, Dv, generator=g)
    slots = torch.randperm(N, generator=g)[:B]
    lens = torch.randint(1, S - T + 1, (B,), generator=g)
    pos = torch.arange(S)
    limit = lens[:, None, None] + torch.arange(T)[None, :, None]  # [B, T, 1]: row b's query t sees [0, limit]
    mask = torch.where(pos[None, None, :] <= limit, 0.0, NEG)[:, None]  # [B, 1, T, S]
    return q, k_buf, v_buf, slots, mask


def _both(q, k_buf, v_buf, slots, mask, scale=0.2):
    return sa.slot_attention(q, k_buf, v_buf, slots, mask, scale), sa.fast_slot_attention(q, k_buf, v_buf, slots, mask, scale)


@pytest.mark.parametrize("shape", [dict(), dict(H=4, Hkv=4), dict(H=8, Hkv=1, D=64), dict(T=3), dict(Dv=16),
                                   dict(B=1, N=1), dict(D=20, S=9)])
def test_kernel_equals_the_readable_form(shape):
    ref, fast = _both(*_case(**shape))
    assert fast.shape == ref.shape
    torch.testing.assert_close(fast, ref, rtol=1e-5, atol=1e-6)


def test_parity_check_catches_a_wrong_slot():
    """Negative control of the parity check above: the kernel fed another row's slot must be caught."""
    q, k_buf, v_buf, slots, mask = _case()
    ref = sa.slot_attention(q, k_buf, v_buf, slots, mask, 0.2)
    wrong = sa.fast_slot_attention(q, k_buf, v_buf, slots.roll(1), mask, 0.2)
    with pytest.raises(AssertionError):
        torch.testing.assert_close(wrong, ref, rtol=1e-5, atol=1e-6)


def test_sliding_window_and_broadcast_mask():
    q, k_buf, v_buf, slots, _ = _case(B=3, T=2)
    S = k_buf.shape[2]
    pos = torch.arange(S)
    window = torch.where((pos >= 10) & (pos <= 20), 0.0, NEG)  # one band for every row and query
    for mask in (window.expand(1, 1, 1, S), window.expand(3, 1, 2, S).contiguous(), window.expand(3, 1, 2, S)):
        ref, fast = _both(q, k_buf, v_buf, slots, mask)
        torch.testing.assert_close(fast, ref, rtol=1e-5, atol=1e-6)


def test_masked_slots_are_never_read():
    """NaN and inf in every masked position, and in slots no row owns: the output does not move a bit."""
    q, k_buf, v_buf, slots, mask = _case()
    clean = sa.fast_slot_attention(q, k_buf, v_buf, slots, mask, 0.2)
    hidden = torch.ones(k_buf.shape[0], 1, k_buf.shape[2], 1, dtype=torch.bool)  # [N, 1, S, 1]: unowned slots whole
    for b, slot in enumerate(slots.tolist()):
        hidden[slot, 0, :, 0] = (mask[b, 0] == NEG).all(0)
    k_bad = torch.where(hidden, torch.full_like(k_buf, float("nan")), k_buf)
    v_bad = torch.where(hidden, torch.full_like(v_buf, float("inf")), v_buf)
    poisoned = sa.fast_slot_attention(q, k_bad, v_bad, slots, mask, 0.2)
    assert torch.equal(poisoned, clean)
    assert torch.isfinite(poisoned).all()


def test_a_live_nan_reaches_its_own_row_only():
    q, k_buf, v_buf, slots, mask = _case()
    clean = sa.fast_slot_attention(q, k_buf, v_buf, slots, mask, 0.2)
    v_buf = v_buf.clone()
    v_buf[slots[2], 0, 0, 0] = float("nan")  # position 0 is live for every row
    out = sa.fast_slot_attention(q, k_buf, v_buf, slots, mask, 0.2)
    assert torch.isnan(out[2]).any()
    others = [b for b in range(len(slots)) if b != 2]
    assert torch.equal(out[others], clean[others])


def test_nothing_attendable_gives_zero_like_the_reference():
    q, k_buf, v_buf, slots, mask = _case(B=2)
    mask = mask.clone()
    mask[1] = NEG
    ref, fast = _both(q, k_buf, v_buf, slots, mask)
    assert torch.equal(fast[1], torch.zeros_like(fast[1]))
    torch.testing.assert_close(fast, ref, rtol=1e-5, atol=1e-6)


def test_rows_and_threads_do_not_change_a_result():
    q, k_buf, v_buf, slots, mask = _case(B=6)
    together = sa.fast_slot_attention(q, k_buf, v_buf, slots, mask, 0.2)
    alone = torch.cat([sa.fast_slot_attention(q[b:b + 1], k_buf, v_buf, slots[b:b + 1], mask[b:b + 1], 0.2)
                       for b in range(6)])
    assert torch.equal(together, alone)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = sa.fast_slot_attention(q, k_buf, v_buf, slots, mask, 0.2)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, together)


def test_other_dtypes_take_the_readable_form():
    q, k_buf, v_buf, slots, mask = (t.bfloat16() if t.is_floating_point() else t for t in _case())
    assert torch.equal(sa.fast_slot_attention(q, k_buf, v_buf, slots, mask, 0.2),
                       sa.slot_attention(q, k_buf, v_buf, slots, mask, 0.2))


def test_bad_arguments_are_refused_naming_the_value():
    q, k_buf, v_buf, slots, mask = _case(N=7)
    with pytest.raises(RuntimeError, match=r"slot_ids\[0\]=7 is outside \[0, 7\)"):
        sa.fast_slot_attention(q, k_buf, v_buf, torch.full_like(slots, 7), mask, 0.2)
    with pytest.raises(RuntimeError, match="multiple of KV heads"):
        sa.fast_slot_attention(q[:, :5], k_buf, v_buf, slots, mask, 0.2)
    with pytest.raises(RuntimeError, match="mask must be"):
        sa.fast_slot_attention(q, k_buf, v_buf, slots, mask[..., :-1], 0.2)


@pytest.mark.parametrize("fam,offset", [("llama", "tensor"), ("gemma3", "symbol")])
def test_batch_plans_run_the_kernel_and_match_the_readable_form(fam, offset):
    """The default passes put the kernel into a batch-slot plan; its logits match a plan without the pass."""
    model = tiny(fam)
    without = tuple(p for p in DEFAULT_FX_PASSES if p != "slot_attention_kernel")
    runs = {}
    for name, passes in (("kernel", DEFAULT_FX_PASSES), ("readable", without)):
        ctx = InferenceContext(model, BackendSpec("fx", fx_passes=passes), "plan_once", offset_mode=offset)
        kv = _batch_cache(ctx, "contiguous")
        dec = BatchDecoder(ctx, kv, BatchSpec(4, (4,)))
        rows = [kv.acquire() for _ in range(3)]
        firsts = [ctx.prefill(r, p)[0] for r, p in zip(rows, ([3, 4, 5], [6], [7, 8, 9, 10, 11]))]
        tokens, out = [int(f.argmax()) for f in firsts], []
        for _ in range(WIDTH // 4):  # crosses gemma3's sliding window
            logits = dec.step(rows, tokens)
            out.append(logits)
            tokens = logits.argmax(-1).tolist()
        program = next(iter(dec.plans.values())).session.program
        runs[name] = (torch.stack(out), program)
    _assert_kernel_in_one_and_readable_in_other(runs, model.dims.n_layers)


@pytest.mark.parametrize("fault", [Fault.NONE, Fault.UNSAFE_MASKED_SLOTS])
def test_masked_poison_reaches_logits_only_under_the_unsafe_fault(fault):
    """Negative control of the kernel's NaN-proofing on a real batch plan: a row's own positions past its
    length hold NaN. The kernel never reads them; the UNSAFE_MASKED_SLOTS fault takes the gathered form
    with masked slots uncleaned, so NaN x 0 reaches the logits and the poison must show."""
    model = tiny("llama")
    ctx = InferenceContext(model, "fx", "plan_once", offset_mode="tensor", policy=policy_for(fault))
    kv = _batch_cache(ctx, "contiguous")
    dec = BatchDecoder(ctx, kv, BatchSpec(2, (2,)))
    rows = [kv.acquire() for _ in range(2)]
    firsts = [ctx.prefill(r, p)[0] for r, p in zip(rows, ([3, 4, 5], [6, 7]))]
    for t in kv.bound_tensors():  # every position no row has written yet: NaN
        t[:, :, 8:].fill_(float("nan"))
    logits = dec.step(rows, [int(f.argmax()) for f in firsts])
    program = next(iter(dec.plans.values())).session.program
    kernel_nodes = [n for n in program.fn.graph.nodes if n.target is sa.fast_slot_attention]
    if fault is Fault.NONE:
        assert kernel_nodes and torch.isfinite(logits).all()
    else:
        assert not kernel_nodes and torch.isnan(logits).all(-1).any()


@pytest.mark.parametrize("fam,offset", [("llama", "tensor"), ("gemma3", "symbol")])
def test_one_sequence_plans_run_the_kernel_and_match_the_readable_form(fam, offset):
    """One-sequence decode too: the default passes find the view's ``slot_attention`` leaf in the traced step
    (a view that bound the function at import would inline the readable form, and the pass would find
    nothing), and the logits match a plan without the pass."""
    model = tiny(fam)
    without = tuple(p for p in DEFAULT_FX_PASSES if p != "slot_attention_kernel")
    runs = {}
    for name, passes in (("kernel", DEFAULT_FX_PASSES), ("readable", without)):
        ctx = InferenceContext(model, BackendSpec("fx", fx_passes=passes), "plan_once", offset_mode=offset)
        cache = ctx.new_cache(WIDTH + 8)
        out = [ctx.prefill(cache, [3, 4, 5, 6])[0]]
        for _ in range(WIDTH):  # crosses gemma3's sliding window
            out.append(ctx.decode(cache, int(out[-1].argmax()))[0])
        runs[name] = (torch.stack(out), ctx.plan.session.program)
    _assert_kernel_in_one_and_readable_in_other(runs, model.dims.n_layers)


def _assert_kernel_in_one_and_readable_in_other(runs: dict, n_layers: int) -> None:
    """runs: {"kernel" | "readable": (logits, program)}; the pass swapped every layer's leaf, the logits agree."""
    kernel_logits, kernel_program = runs["kernel"]
    readable_logits, readable_program = runs["readable"]
    targets = {n.target for n in kernel_program.fn.graph.nodes if n.op == "call_function"}
    assert sa.fast_slot_attention in targets and sa.slot_attention not in targets
    assert kernel_program.passes_applied["slot_attention_kernel"] == n_layers
    assert sa.slot_attention in {n.target for n in readable_program.fn.graph.nodes if n.op == "call_function"}
    torch.testing.assert_close(kernel_logits, readable_logits, rtol=1e-5, atol=1e-5)
