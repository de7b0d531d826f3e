"""Small random-weight variants of the run's model config that reach the code tiny models never run.

Tiny models have no biases and no matrix large enough for the
``split_linears_across_threads`` pass (it splits only weights of at least
``MIN_SPLIT_ELEMENTS`` whose output width divides the thread count), so a
gate on them never runs the split GEMV, a fused linear with biases, or a
width the thread count does not divide. Each variant here keeps the run's
config (RoPE, norms, activation, tying: ``dataclasses.replace`` of it) on the
family's tiny geometry cut to two layers, turns every bias the family has
on, and widens the MLP and vocabulary so those matrices reach the split size:

* ``split``: intermediate 4096, vocab 4096 (the untied head and the fused
  gate/up split in the cols layout, down_proj in the rows layout);
* ``odd widths``: intermediate 4097, vocab 4099 (a prime: the head must not
  split at any thread count; gate/up are big but odd one by one).

Each variant runs on the run's backend (but see ``_traced_here``: on a
compiling backend the even widths compile only in the thread-split form),
KV layout and offset path at the run's own thread count (at least 2 on CPU:
one part splits nothing), and is checked twice: plan_once against replan
bit-exactly, and against the variant's ``reference_logits`` within the
tolerance (as ``vs_reference``).
On CPU with the split pass enabled, the ``split`` variant must have split.

When the plan chooses its linear forms by measurement (``measured_linears``),
the choice on this machine may skip a form another machine picks, so the
variants run once per explicit form pass instead (the thread split and the
panel kernel), each in place of the measured pass. The negative control swaps
in the forms that assemble their outputs in the wrong order
(SPLIT_PARTS_INTERLEAVED: interleaved split parts, reversed panel columns),
which no tiny model can expose.

On a compiling backend on a multi-core CPU the checks run in worker
processes, side by side (``fuelpipe.oracles.worker_pool``).
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Iterator, Optional

import torch

from fuelpipe.modes import PlanMode
from fuelpipe.oracles.faults import Fault
from fuelpipe.oracles.base import OracleInput, OracleResult, Setup, compare, compare_scaled, forced_logits, greedy_run
from fuelpipe.oracles.worker_pool import run_checks, worker_count
from fuelpipe.oracles.faulty import passes_under
from fuelpipe.plan.fx_passes import MEASURED_FORM_PASSES
from fuelpipe.random_init import randomize
from models.registry import build_config, family

NAME = "config_variants"
TOKENS = 4  # the prefill's token, the build token and two reused ones
SPLIT_PASS = "split_linears_across_threads"
MEASURED_PASSES = ("measured_linears", "measured_linears_allowing_copies")
# Fields taken from the family's tiny config: the variant's size, whatever the run's model is.
GEOMETRY = (
    "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
    "kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
    "moe_intermediate_size", "n_routed_experts", "n_shared_experts", "num_experts_per_tok", "first_k_dense_replace",
    "layer_types", "max_window_layers", "sliding_window", "sliding_window_pattern",
)
COMPILING_BACKENDS = ("inductor", "aot")
LAYERS = 2  # every variant's depth: what they test is per layer, and each layer costs trace time
BIASES = ("attention_bias", "mlp_bias")
VARIANTS = {
    "split": {"intermediate_size": 4096, "vocab_size": 4096},
    "odd widths": {"intermediate_size": 4097, "vocab_size": 4099},
}


def variant_configs(model) -> dict[str, object]:
    """name -> config: the run's config on the family's tiny geometry, biases on, the variant's widths."""
    config = model.config
    names = {f.name for f in dataclasses.fields(config)}
    tiny = build_config(model.family, "tiny")
    base = {k: getattr(tiny, k) for k in GEOMETRY if k in names}
    base.update({k: True for k in BIASES if k in names}, num_hidden_layers=min(LAYERS, tiny.num_hidden_layers))
    return {name: dataclasses.replace(config, **base, **widths) for name, widths in VARIANTS.items()}


@contextlib.contextmanager
def _threads(n: int) -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _rewritten(ctx, form_pass: str) -> int:
    """Linears the plan ran through ``form_pass`` (or its negative-control twin)."""
    session = ctx.plan.session
    applied = session.program.passes_applied if session is not None else {}
    return sum(n for name, n in applied.items() if name.startswith(form_pass))


@dataclasses.dataclass(frozen=True)
class VariantCheck:
    """One variant under one pass list: everything its check needs, picklable (it may run in a worker)."""

    family: str
    config: object
    seed: int
    setup: Setup
    prompt: tuple[int, ...]
    max_seq_len: int
    tolerance: Optional[float]
    fault: Fault
    device: str
    dtype: torch.dtype
    form_pass: str
    threads: int


def _check(job: VariantCheck) -> dict:
    config = job.config
    with _threads(job.threads):
        model = randomize(family(job.family).model_cls(config, device=job.device, dtype=job.dtype), seed=job.seed)
        prompt = [t % config.vocab_size for t in job.prompt]
        replan = job.setup.context(model, plan=PlanMode.replan, fault=job.fault)
        tokens, want = greedy_run(replan, job.setup.kv.new_cache(replan, job.max_seq_len), prompt, TOKENS)
        held = job.setup.context(model, plan=PlanMode.plan_once, fault=job.fault)
        got = forced_logits(held, job.setup.kv.new_cache(held, job.max_seq_len), prompt, tokens)
        _, first_replan = compare(want, got)
        ids = torch.tensor([prompt + tokens[:-1]], dtype=torch.int64, device=job.device)
        ref = list(model.reference_logits(ids)[0, len(prompt) - 1 :])
        worst, first_ref, _, _ = compare_scaled(ref, got, job.tolerance)
    return {"splits": _rewritten(held, SPLIT_PASS), "rewritten": _rewritten(held, job.form_pass),
            "replan_step": first_replan, "ref_step": first_ref, "err": worst,
            "biases": sorted(k for k in BIASES if getattr(config, k, False))}


def _traced_here(backend: str, variant: str, form: str, forms: dict, threads: int) -> bool:
    """Whether this check runs on the traced fx step although the run's backend compiles.

    With one check per linear form on a compiling backend (eight compiles, ~10 s each on 2 cores), the
    ``odd widths`` compile in every form: the widths a compile depends on are the generated loops' tails,
    which odd widths reach. The even ``split`` widths run traced (the same passes and kernels, no compile),
    except in the thread-split form when the threads do not divide the odd widths' fused gate/up
    (2 x 4097): then only the even widths reach a compiled split of it (and of the head)."""
    if backend not in COMPILING_BACKENDS or len(forms) < 2 or variant != "split":
        return False
    odd_gate_up = 2 * VARIANTS["odd widths"]["intermediate_size"]
    return form != SPLIT_PASS or odd_gate_up % threads == 0


def pass_sets(passes: tuple[str, ...], on_cpu: bool) -> dict[str, tuple[str, ...]]:
    """label -> the pass list to run the variants with: each explicit form in place of the measured pass."""
    if not on_cpu or not any(p in passes for p in MEASURED_PASSES):
        return {"": tuple(passes)}
    return {form: tuple(form if p in MEASURED_PASSES else p for p in passes) for form in MEASURED_FORM_PASSES}


def run(inp: OracleInput) -> OracleResult:
    p = next(inp.model.parameters())
    spec = inp.setup.backend
    on_cpu = p.device.type == "cpu"
    threads = max(2, torch.get_num_threads()) if on_cpu else torch.get_num_threads()
    jobs: dict[str, VariantCheck] = {}
    meta: dict[str, dict] = {}
    splitting = False
    forms = pass_sets(spec.fx_passes, on_cpu)
    for label, passes in forms.items():
        splitting |= on_cpu and spec.name != "eager" and SPLIT_PASS in passes
        setup = inp.setup.with_changes(backend=dataclasses.replace(spec, fx_passes=passes_under(inp.fault, passes)))
        for seed, (name, config) in enumerate(variant_configs(inp.model).items()):
            key = f"{name} [{label}]" if label else name
            on = setup.with_backend("fx") if _traced_here(spec.name, name, label, forms, threads) else setup
            jobs[key] = VariantCheck(inp.model.family, config, seed, on, tuple(inp.prompts[0]), inp.max_seq_len,
                                     inp.tolerance, inp.fault, str(p.device), p.dtype, label or SPLIT_PASS, threads)
            meta[key] = {"variant": name, "split_pass": SPLIT_PASS in passes, "form": label,
                         "backend": on.backend.name}
    # each compiling check builds its own program: on several cores, run the checks side by side
    workers = worker_count(sum(j.setup.backend.name in COMPILING_BACKENDS for j in jobs.values()), on_cpu)
    results = {key: {**r, **meta[key]} for key, r in run_checks(_check, jobs, workers).items()}
    problems = []
    for name, r in results.items():
        if r["replan_step"] is not None:
            problems.append(f"{name}: plan_once differs from replan from step {r['replan_step']}")
        if r["ref_step"] is not None:
            problems.append(f"{name}: max |logits - reference| {r['err']:.3g} beyond tolerance from step {r['ref_step']}")
        if spec.name != "eager" and on_cpu and r["split_pass"] and r["variant"] == "split" and r["splits"] == 0:
            problems.append(f"{name}: no linear was split at {threads} threads (the split path did not run)")
        if spec.name != "eager" and r["form"] and r["form"] != SPLIT_PASS and r["rewritten"] == 0:
            problems.append(f"{name}: no linear ran through {r['form']} (the form did not run)")
    why_unsplit = "" if splitting else (
        " (nothing splits: " + ("not on CPU" if not on_cpu else f"backend {spec.name} runs no {SPLIT_PASS}") + ")")
    summary = "; ".join(
        f"{name}: intermediate {VARIANTS[r['variant']]['intermediate_size']}, vocab {VARIANTS[r['variant']]['vocab_size']}, "
        f"{r['splits']} linears split, biases {', '.join(r['biases']) or 'none in this family'}, on {r['backend']}"
        for name, r in results.items()
    )
    return OracleResult(
        name=NAME,
        passed=not problems,
        metric={
            "variants": len(results),
            "threads": threads,
            "linears_split": sum(r["splits"] for r in results.values()),
            "compiled_checks": sum(r["backend"] in COMPILING_BACKENDS for r in results.values()),
            "max_abs_error": max(r["err"] for r in results.values()),
            "violations": len(problems),
        },
        tolerance=inp.tolerance,
        detail=("failed: " + "; ".join(problems) + " | " if problems else "")
        + f"{summary}; plan_once vs replan bit-exact and vs reference_logits within {inp.tolerance:g} x logit scale, "
        f"{TOKENS} tokens each on {spec.name} {inp.setup.kv.layout} at {threads} threads{why_unsplit}",
    )
