"""The real SmolLM2-135M: 8 concurrent greedy requests of different prompt lengths, each equal to its solo run."""
import pytest

from fuelpipe.context import InferenceContext
from fuelpipe.runner.job import run_job
from fuelpipe.weights.loader import load_named

PROMPTS = [
    "Hi!",
    "What is the capital of France?",
    "Explain in two sentences why the sky is blue.",
    "Write a haiku about a cache that forgets nothing.",
    "List three prime numbers larger than one hundred.",
    "Summarise, in one paragraph, a story about a lighthouse keeper who finds a message in a bottle.",
    "Describe step by step how you would check that a batched decoder answers exactly like one request alone.",
    "Translate to French: the quick brown fox jumps over the lazy dog while the rain keeps falling on the roof.",
]
NEW_TOKENS = 32


@pytest.mark.slow
def test_eight_concurrent_requests_through_the_cli_equal_their_solo_runs(compose_cfg):
    cfg = compose_cfg(["model=smollm2_135m", "experiment=generate", f"max_new_tokens={NEW_TOKENS}",
                       "experiment.generate.stream=false", "batch.max_batch=8"], tiny=False)
    cfg.experiment.generate.prompts = PROMPTS
    doc = run_job(cfg)
    assert doc["status"] == "ok", doc.get("reasons")
    gen = doc["generation"]
    rows = gen["requests"]
    assert [r["prompt"] for r in rows] == PROMPTS
    assert len({r["prompt_tokens"] for r in rows}) == len(PROMPTS)  # every prompt length differs
    batch = gen["batch"]
    assert batch["max_batch"] == 8 and batch["mean_batch"] > 6  # they really ran together
    assert batch["builds"] == len(batch["builds_per_bucket"]) and batch["kv_bytes_per_row"] > 0

    loaded = load_named("smollm2_135m")
    ctx = InferenceContext(loaded.model, "fx", "plan_once")
    tok = loaded.tokenizer
    for row in rows:
        ids = tok.encode_chat([{"role": "user", "content": row["prompt"]}])
        solo = ctx.generate(ids, NEW_TOKENS, stop_ids=tok.stop_ids, max_seq_len=gen["kv_capacity"])
        assert row["tokens"] == solo.tokens, row["prompt"]
        assert row["finish"] in ("length", "stop") and row["text"] == tok.decode(solo.tokens)
