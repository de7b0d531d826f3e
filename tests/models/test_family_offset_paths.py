"""Both KV write-offset paths stay alive: Llama decodes on the tensor path, Phi on the symbol path.

On the symbol path the write offset (``cached_len``) and the live length
(``attended_len``) are per-pass host integers, inputs of the held program;
binding either wrong must change Phi's logits. The tensor-path program does
not even take them (its offset is the ``write_index`` tensor), so varying them
cannot change Llama's logits, while a wrong ``write_index`` does.
"""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from _support.family_helpers import PROMPT, forced_tokens, run_decode
from fuelpipe.plan.token_data import compute_token_host
from fuelpipe.rope import rope_tables
from models.registry import build_random_model

SYMBOLS = {"cached_len", "attended_len"}


def held_after_decoding(fam: str, n_tokens: int = 10):
    """A family's tiny model decoded past the window on its own path, plus the next token's host data."""
    model = build_random_model(fam, "tiny", seed=5)
    tokens = forced_tokens(n_tokens + 1)
    decoded = run_decode(model, tokens[:-1])
    cos, sin = rope_tables(model.rope_plan, model.dims.max_position_embeddings)
    cache = decoded.cache
    host = compute_token_host(
        torch.tensor([[tokens[-1]]]), cos, sin, model.mask_plan, cache.cached_len, cache.max_seq_len, torch.float32
    )
    return model, decoded, host


def placeholders(session) -> set[str]:
    return {n.target for n in session.program.fn.graph.nodes if n.op == "placeholder"}


def test_each_family_declares_its_path():
    assert build_random_model("llama", "tiny").offset_mode == "tensor"
    assert build_random_model("phi", "tiny").offset_mode == "symbol"


def test_phi_symbol_bindings_are_load_bearing():
    model, decoded, host = held_after_decoding("phi")
    session = decoded.ctx.plan.session
    assert decoded.ctx.offset_mode == "symbol" and SYMBOLS <= placeholders(session)
    assert "write_index" not in placeholders(session)
    assert host.cached_len == len(PROMPT) + 10 > model.mask_plan.sliding_window

    before = [t.clone() for t in decoded.cache.bound_tensors()]

    def call(cached_len: int, attended_len: int) -> torch.Tensor:
        kv = [t.clone() for t in before]  # the program writes in place: every call starts from the same cache
        return session.program.fn(host.token_ids, host.rope_cos, host.rope_sin, host.mask, cached_len, attended_len, kv)

    right = call(host.cached_len, host.attended_len)
    wrong = {
        "cached_len - 1": call(host.cached_len - 1, host.attended_len),
        "cached_len + 1": call(host.cached_len + 1, host.attended_len),
        "attended_len - 1": call(host.cached_len, host.attended_len - 1),
    }
    for what, logits in wrong.items():
        assert (logits - right).abs().max().item() > 1e-3, f"binding {what} left Phi's logits unchanged"
    assert torch.equal(right, decoded.ctx.decode(decoded.cache, int(host.token_ids)))  # the held program, bound right


def test_llama_tensor_program_ignores_symbols():
    _, decoded, host = held_after_decoding("llama")
    session = decoded.ctx.plan.session
    assert decoded.ctx.offset_mode == "tensor"
    assert "write_index" in placeholders(session) and not SYMBOLS & placeholders(session)

    right = session.realize_token(host)
    for cached_len, attended_len in ((0, 1), (host.cached_len - 3, host.attended_len + 7)):
        varied = session.realize_token(replace(host, cached_len=cached_len, attended_len=attended_len))
        assert torch.equal(varied, right), f"cached_len={cached_len} attended_len={attended_len} reached Llama"
    # Its offset binding is the write_index tensor, and that one is load-bearing.
    misplaced = session.realize_token(replace(host, write_index=host.write_index - 1))
    assert (misplaced - right).abs().max().item() > 1e-3


@pytest.mark.parametrize("fam", ["llama", "phi"])
def test_forced_onto_the_other_path_still_decodes(fam):
    """The divergence is a choice, not a limitation: each path serves either family correctly."""
    model = build_random_model(fam, "tiny", seed=5)
    other = "symbol" if model.offset_mode == "tensor" else "tensor"
    tokens = forced_tokens(12)
    own, forced = run_decode(model, tokens), run_decode(model, tokens, offset_mode=other)
    assert forced.ctx.offset_mode == other
    assert (own.logits - forced.logits).abs().max().item() <= 1e-5
