"""Greedy 64-token replies of SmolLM2-135M int8/int4 (16-bit activations, aot) on every vector path."""
import sys, torch
from fuelpipe.weights import load_model
from fuelpipe.weights.named import named_path
from fuelpipe.quant.modules import quantize_model
from fuelpipe.quant.formats import QuantSpec, QuantKind
from fuelpipe.context import InferenceContext
from fuelpipe.plan.backends import BackendSpec
from fuelpipe.plan.plan_store import PlanCacheSpec
from fuelpipe.kernels.build import vector_paths, forced_vector_path
torch.set_num_threads(2)
for kind in ("int8", "int4"):
    model, tok, _ = load_model(named_path("smollm2_135m"))
    quantize_model(model, QuantSpec(QuantKind(kind), 32, "int16"))
    ctx = InferenceContext(model, BackendSpec(name="aot", plan_cache=PlanCacheSpec(dir="/tmp/pc_isa")))
    prompts = [tok.encode(p) for p in ("The old lighthouse keeper climbed the spiral stairs every evening",
                                         "The capital of France is", "def fibonacci(n):")]
    outs = {}
    for path in vector_paths():
        with forced_vector_path(path):
            outs[path] = [ctx.generate(p, 64).tokens for p in prompts]
    ref = outs["avx2"]
    for path, o in outs.items():
        same = [sum(a == b for a, b in zip(x, y)) for x, y in zip(o, ref)]
        print(f"{kind} {path}: tokens equal to avx2's per prompt {same} of 64")
