"""Every request of a continuously batched run equals its own B = 1 run.

The shared schedule (``batch_runs``) runs through one ``ContinuousBatcher``:
rows of different lengths, joins and leaves mid-run, bucket changes, padding
rows and a refused request. Each served request must produce the same greedy
tokens as its solo run (at least 32 of them) and logits within the dtype's
tolerance (scaled by the logit size: a GEMM and a GEMV round differently).
The refused one must be refused with a typed error, alone. The negative
control injects SHARED_BATCH_POSITION (every row decoded at row 0's position).
"""
from __future__ import annotations

from fuelpipe.errors import InputError, KvCapacityError
from fuelpipe.oracles.base import OracleInput, OracleResult, compare_scaled
from fuelpipe.oracles.batch_runs import batcher, schedule, solo_runs


def run(inp: OracleInput) -> OracleResult:
    sched = schedule(inp)
    solo = solo_runs(inp, sched)
    b = batcher(inp, sched.capacity, keep_logits=True)
    results = [b.submit(req) for req in sched.requests[:2]]
    refused = b.submit(sched.refused)  # refused between the others: it must not disturb them
    results += [b.submit(req) for req in sched.requests[2:]]
    b.run()
    problems, worst, allowed_max, compared = [], 0.0, 0.0, 0
    if refused.finish != "refused" or not isinstance(refused.error, (KvCapacityError, InputError)):
        problems.append(f"the too-long request ended {refused.finish!r} ({refused.error!r}), expected refused "
                        "with a KvCapacityError or InputError")
    for res, (tokens, logits) in zip(results, solo):
        name = res.request.name
        if res.finish not in ("length", "stop"):
            problems.append(f"{name} ended {res.finish!r}: {res.error}")
            continue
        if res.tokens != tokens:
            first = next((i for i, (a, c) in enumerate(zip(res.tokens, tokens)) if a != c), min(len(res.tokens),
                                                                                                len(tokens)))
            problems.append(f"{name}: greedy tokens differ from its solo run at token {first} "
                            f"(batch {res.tokens[first:first + 3]} vs solo {tokens[first:first + 3]})")
        n = min(len(res.logits), len(logits))
        err, step, _, allowed = compare_scaled(logits[:n], res.logits[:n], inp.tolerance)
        worst, allowed_max, compared = max(worst, err), max(allowed_max, allowed), compared + n
        if step is not None:
            problems.append(f"{name}: logits differ from solo by {err:.3g} > {allowed:.3g} from token {step}")
    d = b.describe()
    return OracleResult(
        name="batch_vs_solo",
        passed=not problems,
        metric={"max_abs_error": worst, "allowed": allowed_max, "requests": len(results), "tokens_compared": compared,
                "min_tokens": min(len(t) for t, _ in solo), "steps": d["steps"], "mean_batch": d["mean_batch"],
                "builds_per_bucket": d["builds_per_bucket"], "refused": d["refused"]},
        tolerance=inp.tolerance,
        detail="; ".join(problems[:4]) + (f" (+{len(problems) - 4} more)" if len(problems) > 4 else "")
        if problems else
        f"{len(results)} requests ({compared} tokens, >= {min(len(t) for t, _ in solo)} each) equal their solo runs "
        f"(max err {worst:.3g} <= {allowed_max:.3g}); mean batch {d['mean_batch']:.2f} over {d['steps']} steps; "
        "the too-long request refused alone",
    )
