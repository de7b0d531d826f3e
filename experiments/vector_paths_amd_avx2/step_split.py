"""Where a decode step's time goes: SmolLM2-135M, aot plan_once, 200 tokens at a 300-position cache.

    python experiments/vector_paths_amd_avx2/step_split.py THREADS [int8|int4]

The whole step is ``ctx.decode`` + ``greedy``; inside it the program (the assembled step), inside that the 30
layer library calls, and inside those the f32 linears by the kernel's own clock (``f32_rows_clock_ns``, no
profiler; quantized rows have no clock, so their linears stay in "layers"). The head is the clock's time
outside the layer calls; the glue is the program's time outside the layer calls and the head.
"""
import statistics
import sys
import time

import torch

import fuelpipe
from fuelpipe.plan import layer_programs
from fuelpipe.quant.formats import QuantSpec
from fuelpipe.quant.modules import quantize_model
from fuelpipe.sampling import greedy

threads = int(sys.argv[1])
m = fuelpipe.load("smollm2_135m", backend="aot", threads=threads)
ctx = m.context
if len(sys.argv) > 2:
    quantize_model(ctx.model, QuantSpec(sys.argv[2], 32, "int16"))
    ctx.plan.drop()
prompt = [1, 504, 3458, 282, 4649, 314, 253, 1789]
ctx.generate(prompt, 4)
cache = ctx.new_cache(300)
token = greedy(ctx.prefill(cache, prompt))
for _ in range(4):
    token = greedy(ctx.decode(cache, token))
clock = torch.ops.fuelpipe_kernels.f32_rows_clock_ns
calls: list[tuple[int, int]] = []
run_layer = layer_programs.LayerProgram.__call__


def timed_layer(self, flat):
    c, t = clock(), time.perf_counter_ns()
    out = run_layer(self, flat)
    calls.append((time.perf_counter_ns() - t, clock() - c))
    return out


layer_programs.LayerProgram.__call__ = timed_layer
session = ctx.plan.session
program = session.program.fn
program_calls: list[tuple[int, int]] = []


def timed_program(*args):
    c, t = clock(), time.perf_counter_ns()
    out = program(*args)
    program_calls.append((time.perf_counter_ns() - t, clock() - c))
    return out


session.program.fn = timed_program
rows = []
for _ in range(200):
    calls.clear()
    program_calls.clear()
    t = time.perf_counter_ns()
    token = greedy(ctx.decode(cache, token))
    step = time.perf_counter_ns() - t
    layers, layer_linears = sum(c[0] for c in calls), sum(c[1] for c in calls)
    prog, prog_linears = program_calls[0]
    head = prog_linears - layer_linears
    rows.append((step, layer_linears, layers - layer_linears, head, prog - layers - head, step - prog))
step, lin, rest, head, glue, outside = (statistics.median(c) / 1e6 for c in zip(*rows))
print(f"threads {threads}{' ' + sys.argv[2] if len(sys.argv) > 2 else ''}: step {step:.2f} ms; layers' f32 linears "
      f"{lin:.2f}; the layers' rest {rest:.2f}; head {head:.2f}; glue in the program {glue:.2f}; outside the program "
      f"{outside:.2f}")
