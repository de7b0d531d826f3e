"""The persistent plan's content key: the same for the same plan in any process, different for any change that matters.

No compilation: keys are computed on traced tiny-model steps.
"""
from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest
import torch
import torch.fx as fx

from fuelpipe.context import InferenceContext
from fuelpipe.oracles.faulty.specs import PlanCacheIgnoringWeights
from fuelpipe.plan.plan_cache_key import content_key
from fuelpipe.step import step_args, step_module_for
from models.registry import build_random_model


def _key(model, capacity: int = 32, passes=("fuse_sibling_linears",)):
    """The content key of ``model``'s tensor-path decode step at ``capacity``."""
    ctx = InferenceContext(model, "eager")
    cache = ctx.new_cache(capacity)
    ctx.prefill(cache, [1, 2, 3])
    host = ctx._host(cache, torch.tensor([[4]]))
    from fuelpipe.plan.token_data import StepBuffers

    buffers = StepBuffers(host, cache.dtype, torch.device("cpu"))
    buffers.load(host)
    step = step_module_for(model, "tensor")
    args = step_args("tensor", buffers, host, cache.bound_tensors())
    return content_key(fx.symbolic_trace(step), args, step_kind="tensor", backend="inductor",
                       fx_passes=passes)


def test_same_weights_in_another_instance_give_the_same_key():
    a = build_random_model("llama", "tiny", seed=0)
    b = copy.deepcopy(a)  # new objects, ids, storages: nothing process-local may enter the key
    assert _key(a).digest() == _key(b).digest()


def test_the_key_is_the_same_in_another_process():
    code = ("from tests.plan.test_plan_cache_key import _key; from models.registry import build_random_model; "
            "print(_key(build_random_model('llama', 'tiny', seed=0)).digest())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == _key(build_random_model("llama", "tiny", seed=0)).digest()


def test_one_changed_weight_element_changes_the_key_and_only_its_weights_field():
    a = build_random_model("llama", "tiny", seed=0)
    b = copy.deepcopy(a)
    with torch.no_grad():
        next(iter(b.parameters())).view(-1)[7] += 1e-3
    ka, kb = _key(a), _key(b)
    assert ka.digest() != kb.digest()
    assert [f for f in ka.fields() if ka.fields()[f] != kb.fields()[f]] == ["weights"]


def test_without_the_weight_digest_other_weights_collide():
    """What the negative control (Fault.PLAN_CACHE_IGNORES_WEIGHTS) does: the key cannot tell them apart."""
    a, b = build_random_model("llama", "tiny", seed=0), build_random_model("llama", "tiny", seed=1)
    assert _key(a).digest() != _key(b).digest()
    ignoring = PlanCacheIgnoringWeights()
    assert ignoring.filed_key(_key(a)).digest() == ignoring.filed_key(_key(b)).digest()


def test_geometry_structure_and_recipe_each_change_the_key():
    base = build_random_model("llama", "tiny", seed=0)
    k = _key(base)
    assert _key(base, capacity=48).inputs != k.inputs  # KV capacity: the plan's geometry
    eps = build_random_model("llama", "tiny", seed=0, rms_norm_eps=1e-3)  # same tensors, other constant
    assert _key(eps).weights == k.weights and _key(eps).graph != k.graph
    deeper = build_random_model("llama", "tiny", seed=0, num_hidden_layers=3)
    assert _key(deeper).graph != k.graph
    assert _key(base, passes=()).digest() != k.digest()


def test_the_key_names_no_process_local_identity():
    fields = _key(build_random_model("llama", "tiny", seed=0)).fields()
    text = json.dumps(fields)
    assert set(fields) == {"graph", "weights", "inputs", "step_kind", "backend", "fx_passes", "recipe_source",
                           "threads", "torch_version", "cpu_capability", "machine", "fuelpipe_version", "format"}
    assert "0x" not in text and "id(" not in text


def test_the_machine_the_code_is_compiled_for_is_in_the_key():
    """inductor compiles with -march=native: another CPU model or flag set must never share an entry.

    The setting is changed through inductor's own ``patch`` (a context manager that restores it): a
    monkeypatch of a config proxy can leave the option deleted, which breaks every later cold compile."""
    from torch._inductor import config as inductor_config

    model = build_random_model("llama", "tiny", seed=0)
    here = _key(model)
    with inductor_config.patch({"cpp.march": "x86-64-v2"}):
        other = _key(model)
    assert other.machine != here.machine and other.digest() != here.digest()


def test_an_installed_pass_is_keyed_by_its_source_file(tmp_path):
    from fuelpipe.plan.fx_passes import FX_PASSES, FxPass
    import importlib.util

    src = tmp_path / "my_pass_mod.py"
    src.write_text("def run(gm):\n    return 0\n")
    spec = importlib.util.spec_from_file_location("my_pass_mod", src)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    with FX_PASSES.swapped(FxPass("my_noop_pass", mod.run)):
        from fuelpipe.plan.plan_cache_key import recipe_source_digest

        before = recipe_source_digest(("my_noop_pass",))
        src.write_text("def run(gm):\n    return 1  # edited\n")
        assert recipe_source_digest(("my_noop_pass",)) != before


# ---- the gate's key checks (fuelpipe.oracles.plan_cache_keys): on any backend, no compilation ----------------------

def _gate_key_checks(fault=None):
    import dataclasses

    from fuelpipe.modes import PlanMode
    from fuelpipe.oracles.faults import Fault
    from fuelpipe.oracles.base import OracleInput, Setup
    from fuelpipe.oracles.plan_cache_keys import key_checks
    from fuelpipe.plan.backends import BackendSpec

    inp = OracleInput(model=build_random_model("llama", "tiny", seed=0), setup=Setup(BackendSpec(), PlanMode.plan_once),
                      prompts=((1, 2, 3, 4, 5),), new_tokens=4, max_seq_len=16,
                      other_model=lambda: build_random_model("llama", "tiny", seed=1))
    return {c.name: c for c in key_checks(dataclasses.replace(inp, fault=fault or Fault.NONE))}


def test_the_gate_checks_both_halves_of_the_key_on_the_default_backend():
    checks = _gate_key_checks()
    assert all(c.ok for c in checks.values()), [(n, c.seen) for n, c in checks.items() if not c.ok]
    assert sum("-> the same key" in n for n in checks) == 3 and sum("-> another key" in n for n in checks) >= 6


def _key_with_object_ids(mp):
    """Over-keying: the weights digest names the tensors' storage addresses (process-local)."""
    from fuelpipe.plan import plan_cache_key

    original = plan_cache_key.weights_digest
    mp.setattr(plan_cache_key, "weights_digest", lambda gm: original(gm) + str(next(gm.parameters()).data_ptr()))


@pytest.mark.parametrize("plant,broken", [
    ("plan_key_without_threads", "another thread count"),
    ("plan_key_without_pass_sources", "a pass's source edited"),
    ("key_with_object_ids", "another instance of the same weights"),
])
def test_a_key_bug_fails_the_gate_key_checks(monkeypatch, plant, broken):
    from _support import planted_gate  # imported here: another process imports this module's _key without tests/ on its path

    (_key_with_object_ids if plant == "key_with_object_ids" else getattr(planted_gate, plant))(monkeypatch)
    failed = [n for n, c in _gate_key_checks().items() if not c.ok]
    assert any(broken in n for n in failed), failed


def test_the_plan_cache_negative_control_is_caught_by_the_key_checks():
    from fuelpipe.oracles.faults import Fault

    failed = [n for n, c in _gate_key_checks(Fault.PLAN_CACHE_IGNORES_WEIGHTS).items() if not c.ok]
    assert failed == ["key: other weights -> another key"]
