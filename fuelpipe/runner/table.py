"""The results table a run prints: one line per oracle, then the benchmark."""
from __future__ import annotations

from typing import Any, Optional

from fuelpipe.runner.model_record import describe


def plan_cache_said(event: Optional[dict]) -> str:
    """How the decode plan came to be: loaded from the plan cache, compiled (and kept), or compiled privately."""
    if not event or not event.get("status"):
        return ""
    status, compile_s, load_s = event["status"], event.get("compile_s", 0.0), event.get("load_s", 0.0)
    if status == "hit":
        return f"; plan from the plan cache (loaded in {load_s:.1f} s)"
    if status == "private":
        return f"; plan compiled in {compile_s:.1f} s, not kept (backend.plan_cache.dir=null)"
    if status == "uncacheable":
        return f"; plan not kept ({event.get('detail', '')})"
    return f"; plan compiled in {compile_s:.1f} s and kept in the plan cache ({status})"


def render(doc: dict[str, Any]) -> str:
    cfg = doc["config"]
    m, b, p = cfg["model"], cfg["backend"], cfg["plan"]
    ran = doc.get("model")  # what was loaded; absent when nothing was
    name = _composed(m) if ran is None else (f"{ran['family']} {ran['size']}" if ran["size"] else
                                              f"{ran['family']} {ran['path']}")
    lines = [
        f"fuelpipe {doc['experiment']}: {name} {m['dtype']} | kv={cfg['kv']['layout']} "
        f"backend={b['name']} plan={p['mode']} device={doc['env']['device']} threads={doc['env']['threads']}"
    ]
    if ran is not None:
        lines.append(f"model: {describe(ran)}")
        if ran.get("family_mismatch"):
            lines.append(f"warning: {ran['family_mismatch']}")
    if doc.get("load"):
        lines.append(f"loaded: {doc['load']['summary']}")
    gen = doc.get("generation")
    if gen and "requests" in gen:  # several prompts, continuously batched
        bt = gen["batch"]
        done = sum(r["finish"] in ("length", "stop") for r in gen["requests"])
        rate = gen["decode_tokens_per_s"]
        lines.append(
            f"generated {gen['new_tokens']} tokens for {len(gen['requests'])} prompts ({done} finished) in batches of "
            f"up to {bt['max_batch']} (mean {bt['mean_batch'] or 0:.1f}): "
            f"{'-' if rate is None else f'{rate:.1f}'} decoded tokens/s (builds taken out), {bt['builds']} plan "
            f"build(s) {bt['builds_per_bucket']} {1000.0 * gen.get('plan_build_s', 0.0):.0f} ms, "
            f"{bt['plans_held']} held; "
            f"prompts {1000.0 * gen.get('prefill_s', 0.0):.0f} ms in {gen.get('prefill_calls', '?')} packed call(s); "
            f"KV {bt['kv_bytes_per_row'] / 2**20:.1f} MiB per row"
        )
    elif gen and gen.get("interrupted"):
        lines.append(f"generated {gen['new_tokens']} tokens from a {gen['prompt_tokens']}-token prompt, then interrupted "
                     f"(Ctrl-C): the text so far is in results.json generation.text")
    elif gen:
        speed = (f"decode {gen['ms_per_token']:.1f} ms/token ({gen['tokens_per_s']:.1f} tokens/s, median of "
                 f"{gen.get('steady_steps', '?')} steady steps)" if gen.get("tokens_per_s") else "decode -")
        first = gen.get("first_decode_ms")
        lines.append(
            f"generated {gen['new_tokens']} tokens from a {gen['prompt_tokens']}-token prompt: {speed}; "
            f"prefill {gen['prefill_ms']:.0f} ms"
            + (f" (its program build {gen['prefill_build_ms']:.0f} ms)" if gen.get("prefill_build_ms") else "")
            + f"; {gen['plan_builds']} plan build(s) {1000.0 * gen.get('plan_build_s', 0.0):.0f} ms"
            + (f" (first decode step {first:.0f} ms, build included)" if first is not None else "")
            + plan_cache_said(gen.get("plan_cache"))
            + threads_said(gen.get("threads"))
        )
    mem = doc.get("memory")
    if mem and mem.get("generate_peak_mb") is not None:
        peaks = ", ".join(f"{k} {v['peak_mb']:.0f}" for k, v in mem["phases"].items() if "peak_mb" in v)
        lines.append(
            f"memory: peak RSS MB per phase {peaks}" + ("" if mem["peak_resets"] else " (lifetime peaks: no reset)")
            + f"; weights {mem['weights_mb']:.0f} MB + KV {mem['kv_mb']:.1f} MB over a {mem['baseline_mb']:.0f} MB "
            f"baseline" + (f" (generation peak = baseline + {mem['generate_peak_over_weights_and_kv']:.2f}x that)"
                           if mem.get("generate_peak_over_weights_and_kv") is not None else ""))
    if doc.get("error"):
        lines.append(f"error: fuelpipe itself failed (a bug, not your configuration): {doc['error']['type']}: "
                     f"{doc['error']['message']}")
        lines.append("  (traceback above and in results.json error.traceback)")
    elif doc["reasons"] and doc["status"] == "uncaught":
        lines.append("uncaught: a negative control did not make its oracle fail:")
        lines += [f"  - {r}" for r in doc["reasons"]]
    elif doc["reasons"] and doc["status"] == "interrupted":
        lines.append("interrupted (Ctrl-C): what ran so far is kept, marked interrupted:")
        lines += [f"  - {r}" for r in doc["reasons"]]
    elif doc["reasons"]:
        lines.append(f"{doc['status']}: this combination cannot run:")
        lines += [f"  - {r}" for r in doc["reasons"]]
    if doc["oracles"]:
        lines.append(f"{'oracle':<21} {'result':<6} {'wall s':>7} {'builds':>6} {'peak MB':>7}  "
                     f"{'metric':<44} tolerance")
        for o in doc["oracles"]:
            verdict = verdict_of(o)
            control = f" [negative control: {o['fault']}]" if o["negative_control"] else ""
            twin = f" [on the {o['setup']['model']}]" if o.get("setup", {}).get("model") else ""
            peak = f"{o['peak_rss_mb']:.0f}" if o.get("peak_rss_mb") is not None else "-"
            lines.append(f"{o['name']:<21} {verdict:<6} {o['seconds']:>7.1f} {_builds(o):>6} {peak:>7}  "
                         f"{_metric(o['metric']):<44} {_tol(o['tolerance'])}{control}{twin}")
            if not o["passed"]:  # a failure says what diverged, a skip why nothing was checked
                lines.append(f"{'':<28}{o['detail']}")
    bench = doc["bench"]
    if bench:
        lines.append(
            f"bench ({bench['plan_mode']} on {bench['backend']}, {bench['tokens']} tokens after "
            f"{bench['warmup']} warm-up, cache_policy={bench['cache_policy']}):"
        )
        lines.append(
            f"  decode ms/token  median {bench['decode_ms_per_token']:.3f}  p90 {bench['decode_ms_p90']:.3f}  "
            f"({bench['tokens_per_s']:.1f} tokens/s, ~{bench['bandwidth_gb_s']:.2f} GB/s)"
        )
        lines.append(f"  prefill ms       {bench['prefill_ms']:.3f} ({bench['prompt_tokens']} prompt tokens)")
        lines.append(f"  plan build ms    {bench['plan_build_ms']:.3f} per build, {bench['plan_builds']} builds")
        pc = bench.get("plan_cache")
        if pc and pc.get("unused"):
            lines.append(f"  plan cache       not used: {pc['unused']}")
        elif pc:
            lines.append(f"  plan cache       {pc['hits']} hit(s), {pc['misses']} compiled{rebuilt_counts(pc)}"
                         + f": compile {pc['compile_ms']:.0f} ms, load {pc['load_ms']:.0f} ms ({pc['dir']})")
            if pc.get("detail"):
                lines.append(f"                   {pc['detail']}")
        if bench["replan_over_plan_once"] is not None:
            lines.append(f"  plan_once ms/token {bench['plan_once_ms_per_token']:.3f}")
            lines.append(f"  replan ms/token    {bench['replan_ms_per_token']:.3f}")
            lines.append(f"  replan/plan_once   {bench['replan_over_plan_once']:.2f}x")
        lines.append(
            f"  peak RSS {bench['peak_rss_mb']:.0f} MB, KV ({bench.get('kv_layout', 'contiguous')}) "
            f"{bench['kv_bytes']} bytes, {bench.get('kv_bytes_per_token')} bytes/token"
        )
        if bench.get("expanded_over_kv"):
            lines.append(
                f"  an expanded K/V cache would store {bench['expanded_kv_bytes_per_token']} bytes/token: "
                f"{bench['expanded_over_kv']:.2f}x this cache"
            )
    job_cache = doc.get("plan_cache")
    if job_cache:
        lines.append(f"plan cache (every build of this job): {job_cache['hits']} hit(s), {job_cache['misses']} "
                     f"compiled{rebuilt_counts(job_cache)} in {job_cache['dir']}")
        lines += [f"  rebuilt {entry}" for entry in job_cache["rebuilt"]]
    lines += stage_sections(doc)
    lines.append(f"status: {doc['status']}")
    return "\n".join(lines)


def _composed(m: dict[str, Any]) -> str:
    """The composed model config: family and size for random/shipped weights, the file for a checkpoint path."""
    if m.get("weights") in ("gguf", "hf_dir") and m.get("path"):
        return f"{m['weights']} {m['path']}"
    return f"{m['family']} {m['size']}"
def rebuilt_counts(pc: dict[str, Any]) -> str:
    """`` (1 corrupt entry rebuilt)`` per status where a stored entry was thrown out and compiled again."""
    from fuelpipe.plan.cache_ledger import REBUILT

    return "".join(f" ({v} {k} entry rebuilt)" for k, v in (pc.get("statuses") or {}).items() if k in REBUILT)


def verdict_of(oracle: dict[str, Any]) -> str:
    """PASS, FAIL, or SKIP (the oracle checked nothing; never counted as a pass)."""
    if oracle.get("skipped", False):
        return "SKIP"
    if oracle.get("negative_control") and oracle["passed"]:
        return "PASS (fault NOT caught)"
    return "PASS" if oracle["passed"] else "FAIL"


def _builds(oracle: dict[str, Any]) -> str:
    """Programs the oracle built ('-' in documents written before they were counted)."""
    return str(oracle["builds"]) if "builds" in oracle else "-"


def _metric(metric: dict[str, Any]) -> str:
    parts = []
    for key, value in metric.items():
        shown = f"{value:.3g}" if isinstance(value, float) else ("-" if value is None else str(value))
        parts.append(f"{key}={shown}")
    return " ".join(parts)


def _tol(tolerance) -> str:
    if tolerance is None:
        return "counts"
    return "bit-exact" if tolerance == 0 else f"{tolerance:g}"


def stage_sections(doc: dict[str, Any]) -> list[str]:
    """Each registered stage's rendering of its section of ``doc`` (stages absent from ``doc`` add nothing)."""
    from fuelpipe.errors import ConfigError
    from fuelpipe.stages import ordered_stages

    try:
        stages = ordered_stages()
    except ConfigError as err:  # a broken installed stage: say so, render the rest of the report
        return [f"(experiment stage sections not rendered: {err})"]
    return [stage.render(doc[stage.results_key]) for stage in stages
            if stage.render is not None and doc.get(stage.results_key)]


def threads_said(use) -> str:
    """How the decode threads were chosen, for the generation line."""
    if not use:
        return ""
    if not use.get("adaptive"):
        return f"; threads fixed at {use['fixed']}"
    steps = ", ".join(f"{n} at {t}" for t, n in use["steps_at"].items())
    return f"; threads adapted to the load (decode steps {steps}; {use['switches']} switch(es))"
