"""Paged KV on the symbol path: only the live blocks are gathered, and the step is unchanged."""
import pytest
import torch

from fuelpipe.context import InferenceContext
from fuelpipe.kv.layout import signature_for
from fuelpipe.kv import views


def decode_run(model, backend, offset_mode, tokens, block_size=4):
    ctx = InferenceContext(model, backend, offset_mode=offset_mode)
    seq = ctx.new_pool(num_blocks=8, block_size=block_size).sequence(6)  # 24 positions of capacity
    out = [ctx.prefill(seq, [3, 1, 4])[0]]
    out += [ctx.decode(seq, t)[0] for t in tokens]  # crosses block boundaries at 4, 8, 12
    return ctx, seq, torch.stack(out)


TOKENS = [1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7]


def test_symbol_path_on_a_paged_cache_is_the_live_block_step(tiny_llama):
    ctx, seq, _ = decode_run(tiny_llama, "fx", "symbol", TOKENS[:1])
    assert signature_for(seq, "symbol").name == "paged_symbol" and signature_for(seq, "tensor").name == "paged"
    assert ctx.plan.session.step_kind == "paged_symbol"


@pytest.mark.parametrize("backend", ["fx", "inductor"])
def test_live_block_step_matches_the_padded_table_step_with_one_plan(tiny_llama, backend):
    ctx, _, live = decode_run(tiny_llama, backend, "symbol", TOKENS)
    _, _, padded = decode_run(tiny_llama, "fx", "tensor", TOKENS)
    torch.testing.assert_close(live, padded, atol=1e-5, rtol=0)
    assert ctx.plan.stats.builds == 1  # the live length is per-pass data, not part of the plan
    if backend == "inductor":
        # dynamo specialises the first sizes it sees (a single live block, ...) before compiling the
        # live length as a symbol; after that, new lengths reuse the compiled code.
        before = ctx.plan.session.compiles
        seq = ctx.new_pool(num_blocks=8, block_size=4).sequence(6)
        ctx.prefill(seq, [3, 1, 4] + TOKENS[:9])
        for t in (2, 7, 1, 8):  # live lengths 13..16 on a new request: block counts seen before
            ctx.decode(seq, t)
        assert before <= 3 and ctx.plan.session.compiles == before


def test_negative_control_dropping_the_partial_block_is_caught(tiny_llama, monkeypatch):
    """Rounding the live block count down (losing the partly filled block) changes the answer."""
    _, _, right = decode_run(tiny_llama, "fx", "symbol", TOKENS[:3])
    real_init = views.PagedPrefixKv.__init__

    def floor_blocks(self, *args):
        real_init(self, *args)
        attended_len = args[-1]
        self.live_blocks = attended_len // self.k_pool.shape[1]
        self.live_width = self.live_blocks * self.k_pool.shape[1]

    monkeypatch.setattr(views.PagedPrefixKv, "__init__", floor_blocks)
    _, _, wrong = decode_run(tiny_llama, "fx", "symbol", TOKENS[:3])
    assert (wrong - right).abs().max() > 1e-3
