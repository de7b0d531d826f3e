"""The fx optimisation passes do real work and keep the step's meaning."""
import torch
import torch.fx as fx

from fuelpipe.oracles.faulty.fx_passes import naive_eliminate_dead_code
from fuelpipe.plan.fx_passes import eliminate_dead_code_keeping_writes, fuse_sibling_linears
from fuelpipe.step import step_module_for


def linears(gm):
    return [n for n in gm.graph.nodes if n.op == "call_module" and isinstance(gm.get_submodule(n.target), torch.nn.Linear)]


def test_fusion_merges_qkv_and_gate_up_and_keeps_logits(tiny_llama):
    from fuelpipe.context import InferenceContext

    step = step_module_for(tiny_llama, "tensor")
    gm = fx.symbolic_trace(step)
    before = len(linears(gm))
    groups = fuse_sibling_linears(gm)
    n_layers = tiny_llama.dims.n_layers
    assert groups == 2 * n_layers  # q/k/v and gate/up in every layer
    assert len(linears(gm)) == before - 3 * n_layers  # 5 linears -> 2 per layer
    # Same outputs as the unfused step on identical inputs and identical (fresh) caches.
    ctx = InferenceContext(tiny_llama, "eager")
    outs = []
    for program in (step, gm):
        cache = ctx.new_cache(16)
        host = ctx._host(cache, torch.tensor([[5, 6, 7]]))
        kv = cache.bound_tensors()
        outs.append(program(host.token_ids, host.rope_cos, host.rope_sin, host.mask, host.write_index, kv))
    torch.testing.assert_close(outs[0], outs[1], atol=1e-6, rtol=0)


class Writer(torch.nn.Module):
    def forward(self, x, buf, cl: int):
        buf.narrow(0, cl, 1).copy_(x)  # result unused: only the side effect matters
        return buf.narrow(0, 0, cl + 1).sum()


def test_dce_keeps_in_place_writes_and_naive_dce_does_not():
    kept = fx.symbolic_trace(Writer())
    eliminate_dead_code_keeping_writes(kept)
    dropped = fx.symbolic_trace(Writer())
    naive_eliminate_dead_code(dropped)
    assert any(n.target == "copy_" for n in kept.graph.nodes)
    assert not any(n.target == "copy_" for n in dropped.graph.nodes)
    buf_a, buf_b = torch.zeros(4, 2), torch.zeros(4, 2)
    x = torch.ones(1, 2)
    assert kept(x, buf_a, 2).item() == 2.0 and buf_a[2].sum() == 2.0
    assert dropped(x, buf_b, 2).item() == 0.0 and buf_b.sum() == 0.0
