"""backend=aot builds one program per distinct layer shape, keeps it in the plan store, and binds each layer's
own weights (fuelpipe.plan.layer_segments, fuelpipe.plan.layer_programs).

Both halves of reuse: layers of one shape share a program, a second context (another process's, through the
store) loads it, another capacity and other weights of the same shapes are served by it, and they compute
their own reference; layers of another shape get their own program, and a program whose fixed sizes do not
fit is not used. The compiling tests share one store for the module: one compile of the tiny Llama's layer.
"""
from __future__ import annotations

import pytest
import torch

from fuelpipe.context import InferenceContext
from fuelpipe.oracles.faults import Fault
from fuelpipe.oracles.faulty import policy_for
from fuelpipe.plan.backends import BackendSpec, trace_step
from fuelpipe.plan.layer_programs import fits
from fuelpipe.plan.layer_segments import NotSegmentable, cut, group_by_signature, record_values
from fuelpipe.plan.plan_store import PlanCacheSpec
from fuelpipe.oracles.plan_cache_keys import one_element_changed
from fuelpipe.step import step_args, step_module_for
from models.registry import build_random_model

PROMPT, TOKENS = [1, 2, 3], [4, 5, 6, 7]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return str(tmp_path_factory.mktemp("layer-programs"))


def aot(store: str | None) -> BackendSpec:
    return BackendSpec(name="aot", plan_cache=PlanCacheSpec(dir=store))


def decode(ctx: InferenceContext, capacity: int = 32) -> torch.Tensor:
    cache = ctx.new_cache(capacity)
    rows = [ctx.prefill(cache, PROMPT)] + [ctx.decode(cache, t) for t in TOKENS]
    return torch.cat(rows)


def event(ctx: InferenceContext):
    return ctx.plan.session.program.cache_event


def build_of(ctx: InferenceContext):
    return ctx.plan.session.program.fn.layer_build


def test_layers_of_one_shape_share_one_program_bound_to_their_own_weights(store, threads):
    threads(1)
    model = build_random_model("llama", "tiny", seed=0)
    ctx = InferenceContext(model, aot(store))
    got = decode(ctx)
    want = decode(InferenceContext(model, "eager"))
    assert (got - want).abs().max().item() <= 1e-5
    build = build_of(ctx)
    assert build.shapes == 1 and build.hits + build.compiled == 1, event(ctx).detail
    calls = [m for name, m in ctx.plan.session.program.fn._run.named_children() if name.startswith("layer_")]
    assert len(calls) == model.config.num_hidden_layers
    assert calls[0].program is calls[1].program  # one library for both layers
    params = {p.data_ptr() for p in model.parameters()}
    for call in calls:  # each layer runs on its own tensors, by address (derived copies aside)
        assert sum(w.data_ptr() in params for w in call.weights) >= 3
    assert {w.data_ptr() for w in calls[0].weights}.isdisjoint({w.data_ptr() for w in calls[1].weights})


def test_a_second_context_loads_the_stored_program_at_any_capacity(store, threads):
    threads(1)
    model = build_random_model("llama", "tiny", seed=0)
    first = decode(InferenceContext(model, aot(store)))
    again = InferenceContext(model, aot(store))
    assert torch.equal(decode(again), first)
    assert event(again).status == "hit" and build_of(again).compiled == 0
    wider = InferenceContext(model, aot(store))  # the capacity is a symbol of the program: the same entry
    got = decode(wider, capacity=77)
    assert event(wider).status == "hit" and event(wider).key == event(again).key
    want = decode(InferenceContext(model, "eager"), capacity=77)
    assert (got - want).abs().max().item() <= 1e-5


def test_other_weights_of_the_same_shapes_hit_and_compute_their_own_logits(store, threads):
    threads(1)
    model = build_random_model("llama", "tiny", seed=0)
    other = one_element_changed(build_random_model("llama", "tiny", seed=0))
    base = InferenceContext(model, aot(store))
    decode(base)
    ctx = InferenceContext(other, aot(store))
    got = decode(ctx)
    assert event(ctx).status == "hit" and event(ctx).key == event(base).key  # no weights in the entry
    want = decode(InferenceContext(other, "eager"))
    assert (got - want).abs().max().item() <= 1e-5
    assert not torch.equal(got, decode(InferenceContext(model, "eager")))  # not the first model's answer


def test_misbound_layer_weights_are_caught_by_the_reference(store, threads):
    """The negative control of the weight binding: each weight given the next same-shape weight of its layer."""
    threads(1)
    model = build_random_model("llama", "tiny", seed=0)
    ctx = InferenceContext(model, aot(store), policy=policy_for(Fault.AOT_CONSTANTS_MISBOUND))
    got = decode(ctx)
    want = decode(InferenceContext(model, "eager"))
    assert (got - want).abs().max().item() > 1e-3


def _cut(family: str):
    model = build_random_model(family, "tiny", seed=0)
    ctx = InferenceContext(model, "fx")
    cache = ctx.new_cache(16)
    ctx.prefill(cache, PROMPT)
    ctx.decode(cache, 4)
    session = ctx.plan.session  # its buffers hold the last token's data: the arguments of a real step
    gm, _ = trace_step(step_module_for(model, session.step_kind), BackendSpec().fx_passes)
    args = step_args(session.step_kind, session.buffers, None, session.bound_kv())
    return cut(gm, record_values(gm, args), model.config.num_hidden_layers)


@pytest.mark.parametrize("family, shapes", [("llama", 1), ("gemma3", 1), ("qwen3", 1), ("deepseek_v2", 2)])
def test_equal_layers_share_a_signature_and_different_ones_do_not(family, shapes):
    the_cut = _cut(family)
    assert len(group_by_signature(the_cut.segments)) == shapes  # deepseek: a dense layer, then MoE layers
    for s in the_cut.segments:
        assert all(isinstance(t, torch.Tensor) for t in s.state) and s.inputs and s.outputs


def test_a_program_is_used_only_where_its_fixed_sizes_fit():
    k = torch.zeros(1, 2, 40, 8)
    assert fits([[1, -1, -1, 8]], [k]) is None
    assert "fixes" in fits([[1, -1, -1, 16]], [k])
    assert "inputs" in fits([[1, -1, -1, 8], [1]], [k])


def test_a_graph_that_cannot_be_cut_is_said_so():
    import torch.fx as fx

    class TwoLayers(torch.nn.Module):
        def forward(self, x):
            return x + 1

    gm = fx.symbolic_trace(TwoLayers())
    values = record_values(gm, (torch.ones(2),))
    with pytest.raises(NotSegmentable, match="layers found"):
        cut(gm, values, n_layers=2)


def test_the_default_plan_cache_folder_follows_the_environment(monkeypatch, tmp_path):
    from fuelpipe.plan.backends import plan_cache_dir, user_cache_dir

    monkeypatch.delenv("FUELPIPE_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert user_cache_dir() == tmp_path / "xdg" / "fuelpipe"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert user_cache_dir() == tmp_path / "home" / ".cache" / "fuelpipe"
    monkeypatch.setenv("FUELPIPE_CACHE_DIR", str(tmp_path / "mine"))
    assert plan_cache_dir("auto", "aot") == str(tmp_path / "mine")
    assert plan_cache_dir("auto", "inductor") is None  # its entries carry the weights: only a named folder
    assert plan_cache_dir("auto", "fx") is None
    assert plan_cache_dir(None, "aot") is None  # null: off
    assert plan_cache_dir(str(tmp_path / "named"), "inductor") == str(tmp_path / "named")


def test_an_unwritable_default_folder_builds_privately_and_says_so(monkeypatch, tmp_path, caplog):
    from fuelpipe.plan.backends import plan_cache_dir

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("FUELPIPE_CACHE_DIR", str(blocker / "fuelpipe"))
    with caplog.at_level("WARNING"):
        assert plan_cache_dir("auto", "aot") is None
    assert "cannot be written" in caplog.text


def test_the_shipped_default_is_aot_with_the_user_plan_cache(compose_cfg):
    cfg = compose_cfg(tiny=False)
    assert cfg.backend.name == "aot" and cfg.backend.plan_cache.dir == "auto"
    assert cfg.model.family == "llama"


def _build_error(what: str):
    from torch._inductor.exc import CppCompileError, InductorError

    return InductorError(CppCompileError(["g++"], what), None)  # as inductor raises it


def test_a_failed_build_for_the_cpus_vector_flags_is_retried_with_inductors_probe(monkeypatch, tmp_path, caplog):
    """The compile trusts the CPU's flags (no probe); a compiler that cannot build for them gets one more
    build with inductor's own probe, and the thread count the compile ran at is given back."""
    import torch._inductor
    from torch._inductor import cpu_vec_isa

    from fuelpipe.plan import layer_programs

    calls = []

    def fake_compile(exported, package_path, inductor_configs):
        calls.append((dict(inductor_configs), torch.get_num_threads()))
        if len(calls) == 1:
            raise _build_error("g++: error: unrecognized command-line option '-mavx512vnni'")

    monkeypatch.setattr(torch._inductor, "aoti_compile_and_package", fake_compile)
    cleared = []
    monkeypatch.setattr(cpu_vec_isa.valid_vec_isa_list, "cache_clear", lambda: cleared.append(1))
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        layer_programs._aoti_compile(object(), tmp_path / "p.pt2")
        after = torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
    assert [c.get("cpp.vec_isa_ok", "unset") for c, _ in calls] == [True, None]  # None: inductor probes
    assert all(n == layer_programs.compile_threads() for _, n in calls)  # compiled for the cores
    assert after == 1  # the caller's count is given back
    assert len(cleared) == 2  # the ISA list made under the trust is dropped, before the retry and after it
    assert "retrying with inductor's ISA probe" in caplog.text


@pytest.mark.parametrize("first, second, retried", [
    (RuntimeError("a lowering error"), None, False),  # not a build error: raised at once, no second compile
    ("build", RuntimeError("no compiler"), True),  # the retry's own error is raised
])
def test_only_a_build_error_is_retried_and_a_second_failure_is_raised(monkeypatch, tmp_path, first, second, retried):
    import torch._inductor

    from fuelpipe.plan import layer_programs

    calls = []

    def fails(exported, package_path, inductor_configs):
        calls.append(1)
        err = (_build_error("bad flag") if first == "build" else first) if len(calls) == 1 else second
        raise err

    monkeypatch.setattr(torch._inductor, "aoti_compile_and_package", fails)
    with pytest.raises(RuntimeError, match="no compiler" if retried else "a lowering error"):
        layer_programs._aoti_compile(object(), tmp_path / "p.pt2")
    assert len(calls) == (2 if retried else 1)


def test_a_signature_holds_each_weights_exact_shape():
    """The weights' sizes are compiled in: layers share a program only where every weight has the same
    shape and strides, whatever the code (a width a layer's code does not spell is still told apart)."""
    from fuelpipe.plan.layer_segments import input_class, weight_class

    for segment in _cut("deepseek_v2").segments:
        assert segment.state and all(repr(weight_class(t)) in segment.signature for t in segment.state)
        assert all(str(tuple(t.shape)) in repr(weight_class(t)) for t in segment.state)
    assert weight_class(torch.zeros(4, 8)) != weight_class(torch.zeros(4, 9))
    assert input_class(torch.zeros(4, 8)) == input_class(torch.zeros(4, 9))  # inputs: sizes are symbols


def test_a_call_at_more_threads_than_the_program_was_built_for_runs_at_its_count():
    from fuelpipe.plan.layer_programs import LayerCall

    seen = []
    call = LayerCall(lambda flat: seen.append(torch.get_num_threads()) or flat, [torch.zeros(2)])
    call.most_threads = 1
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        call(torch.ones(2))
        after = torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
    assert seen == [1] and after == 2
