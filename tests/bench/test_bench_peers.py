"""The peers benchmark: its clock, floor, summary, F32 GGUF twin and CLI run."""
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import run_cli
from fuelpipe.runner.job import run_job
from fuelpipe.bench.peers import trace as trace_mod
from fuelpipe.bench.peers.experiment import best_fuelpipe
from fuelpipe.bench.peers.floor import Bandwidth, decode_floor, kv_bytes_read, weight_bytes_per_token
from fuelpipe.bench.peers.run import SystemRecord, add_ratios, compare, summarize
from fuelpipe.bench.peers.systems import FuelpipeSystem, PeerSystem
from fuelpipe.bench.peers.trace import RunTrace, TokenClock
from fuelpipe.kernels import path_choice
from models.registry import build_random_model

BW = Bandwidth(10.0, "fixed", 1.0, 1)


def test_clock_splits_first_token_from_step_gaps(monkeypatch):
    ticks = iter([100.0, 100.5, 100.6, 100.8])  # start, then three tokens
    monkeypatch.setattr(trace_mod.time, "perf_counter", lambda: next(ticks))
    clock = TokenClock()
    clock.start()
    for t in (7, 8, 9):
        clock.token(t)
    tr = clock.trace()
    assert tr.tokens == [7, 8, 9]
    assert tr.first_token_ms == pytest.approx(500.0)
    assert tr.step_ms == pytest.approx([100.0, 200.0])


def test_weight_bytes_count_a_tied_head_once_and_one_embedding_row_otherwise():
    tied = build_random_model("llama", "tiny", seed=0, tie_word_embeddings=True)
    untied = build_random_model("llama", "tiny", seed=0, tie_word_embeddings=False)
    params = lambda m: sum(p.numel() * 4 for p in {id(p): p for p in m.parameters()}.values())  # noqa: E731
    assert weight_bytes_per_token(tied) == params(tied)  # the table is read in full, as the head
    emb = untied.embed_tokens.weight
    assert weight_bytes_per_token(untied) == params(untied) - emb.numel() * 4 + emb.shape[1] * 4


def test_floor_is_bytes_over_bandwidth(tiny_llama):
    d = tiny_llama.dims
    floor = decode_floor(tiny_llama, prompt_len=8, new_tokens=4, bandwidth=BW)
    kv = kv_bytes_read(d.n_layers, d.n_kv_heads, d.head_dim, 8 + 2.0, 4)
    assert floor.kv_bytes == kv
    assert floor.ms_per_token == pytest.approx((weight_bytes_per_token(tiny_llama) + kv) / 10e9 * 1000)


class Fake(PeerSystem):
    def __init__(self, name, group, tokens, steps, weights="f32"):
        self.name, self.group, self._tokens, self._steps, self.weights = name, group, tokens, steps, weights


def record(name, group, tokens, steps, weights="f32", reps=1) -> SystemRecord:
    rec = SystemRecord(Fake(name, group, tokens, steps, weights))
    rec.timed = [RunTrace(tokens, 50.0, [x + 0.5 * i for x in steps]) for i in range(reps)]
    return rec


def summary(recs, peers):
    floor = decode_floor(build_random_model("llama", "tiny", seed=0), 8, 4, BW)
    rows = summarize(recs, floor, "transformers dynamic")
    add_ratios(rows, peers)
    return rows, {r["system"]: r for r in rows}


def test_summary_ratios_and_the_reference_token_check():
    rows, by = summary([
        record("transformers dynamic", "transformers", [1, 2, 3], [40.0, 40.0]),
        record("fuelpipe fx plan_once contiguous", "fuelpipe", [1, 2, 3], [20.0, 20.0]),
        # Negative control: a faster row with different tokens must be flagged and never win.
        record("fuelpipe eager plan_once contiguous", "fuelpipe", [1, 2, 4], [10.0, 10.0]),
    ], ["transformers dynamic"])
    assert by["fuelpipe fx plan_once contiguous"]["tokens_match_reference"] is True
    wrong = by["fuelpipe eager plan_once contiguous"]
    assert wrong["tokens_match_reference"] is False and wrong["tokens_agreeing"] == 2
    assert by["fuelpipe fx plan_once contiguous"]["vs"]["transformers dynamic"] == pytest.approx(2.0)
    best = best_fuelpipe(rows, ["transformers dynamic"])
    assert best["system"] == "fuelpipe fx plan_once contiguous"
    assert best["verdicts"] == ["2.00x faster than transformers dynamic"]


def test_a_slower_best_row_says_how_much_slower_and_other_arithmetic_stands_apart():
    rows, by = summary([
        record("transformers dynamic", "transformers", [1, 2, 3], [40.0, 40.0]),
        record("llama.cpp F32", "llama.cpp", [1, 2, 3], [40.0 / 1.25, 40.0 / 1.25]),
        record("llama.cpp Q4_1", "llama.cpp", [1, 2, 9], [10.0, 10.0], weights="q4_1"),
        record("fuelpipe fx plan_once contiguous", "fuelpipe", [1, 2, 3], [40.0, 40.0]),
    ], ["transformers dynamic", "llama.cpp F32", "llama.cpp Q4_1"])
    best = best_fuelpipe(rows, ["transformers dynamic", "llama.cpp F32", "llama.cpp Q4_1"])
    assert "1.25x slower than llama.cpp F32" in best["verdicts"]
    assert any(v.startswith("1.00x faster than transformers dynamic (level") for v in best["verdicts"])
    assert best["other_arithmetic"] == ["4.00x slower than llama.cpp Q4_1"]
    q = by["llama.cpp Q4_1"]
    assert q["achieved_gb_s"] is None and q["over_floor"] is None  # the f32 floor says nothing about Q4_1
    assert by["llama.cpp F32"]["over_floor"] is not None


@pytest.mark.parametrize("mine, theirs, verdict", [
    ([10, 11, 12], [13, 14, 15], "faster"), ([13, 14], [10, 12.9], "slower"), ([10, 14], [12, 13], "level"),
])
def test_verdicts_need_non_overlapping_repetitions(mine, theirs, verdict):
    assert compare(mine, theirs) == verdict


def test_missing_peer_is_reported_not_raised():
    s = Fake("llama.cpp F32", "llama.cpp", [], [])
    s.missing = "not installed: pip install llama-cpp-python"
    floor = decode_floor(build_random_model("llama", "tiny", seed=0), 8, 4, BW)
    rows = summarize([SystemRecord(s)], floor, None)
    assert rows == [{"system": "llama.cpp F32", "group": "llama.cpp", "weights": "f32", "status": s.missing}]


def test_f32_twin_holds_the_dequantized_values_and_every_key(tmp_path):
    import gguf  # a core dependency (the GGUF reader's constants), never skipped
    from fuelpipe.bench.peers.f32_gguf import f32_gguf_path

    src = tmp_path / "tiny.Q4_1.gguf"
    rng = np.random.default_rng(0)
    w = rng.standard_normal((4, 64)).astype(np.float32)
    q = gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q4_1)
    writer = gguf.GGUFWriter(src, arch="llama")
    writer.add_block_count(1)
    writer.add_file_type(3)  # MOSTLY_Q4_1
    writer.add_string("tokenizer.ggml.model", "gpt2")
    writer.add_tensor("blk.0.w", q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q4_1)
    writer.add_tensor("norm", np.arange(64, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    out = f32_gguf_path(src, tmp_path / "cache")
    r = gguf.GGUFReader(out)
    tensors = {t.name: t for t in r.tensors}
    assert {t.tensor_type for t in r.tensors} == {gguf.GGMLQuantizationType.F32}
    expected = gguf.quants.dequantize(q, gguf.GGMLQuantizationType.Q4_1)
    np.testing.assert_array_equal(np.asarray(tensors["blk.0.w"].data).reshape(4, 64), expected)
    assert np.abs(expected - w).max() > 0  # the twin holds Q4_1's values, not the original floats
    np.testing.assert_array_equal(np.asarray(tensors["norm"].data), np.arange(64, dtype=np.float32))
    assert r.get_field("general.file_type").contents() == 0
    assert r.get_field("tokenizer.ggml.model").contents() == "gpt2"
    assert r.get_field("llama.block_count").contents() == 1
    mtime = out.stat().st_mtime_ns
    assert f32_gguf_path(src, tmp_path / "cache") == out and out.stat().st_mtime_ns == mtime  # reused


def test_cli_bench_peers_writes_table_chart_and_results(tmp_path):
    rec = tmp_path / "record"
    proc = run_cli(
        "experiment=bench_peers", "experiment.peers.prompt_tokens=8", "experiment.peers.new_tokens=4",
        "experiment.peers.reps=1", "experiment.peers.backends=[eager,fx]", "experiment.peers.kv_layouts=[contiguous,paged]",
        "experiment.peers.replan_new_tokens={eager: 4, fx: 3}", f"experiment.peers.record_dir={rec}",
        "experiment.peers.quantized_backends=[fx]", "experiment.peers.quantized=[int8,int4,int8:f32]",
        "experiment.peers.f32_prefetch=[0]", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads((tmp_path / "run" / "results.json").read_text())
    rows = {r["system"]: r for r in doc["peers"]["rows"]}
    assert len([r for r in rows.values() if r["group"] == "fuelpipe" and r["status"] == "ok"]) == 2 * 8 + 3
    forced = rows["fuelpipe fx plan_once contiguous prefetch=0"]  # the f32 row again, software prefetch off
    assert forced["f32_prefetch_bytes"] == 0 and forced["ms_per_token"] > 0
    assert rows["fuelpipe fx plan_once contiguous"]["f32_prefetch_bytes"] in path_choice.PREFETCH_BYTES
    # the quantized rows: same prompt, their own weights column (16-bit activations unless an entry says f32)
    for kind in ("int8/g32/a16", "int4/g32/a16", "int8/g32"):
        row = rows[f"fuelpipe fx plan_once contiguous {kind}"]
        assert row["status"] == "ok" and row["weights"] == kind and row["ms_per_token"] > 0
    once = rows["fuelpipe fx plan_once paged"]
    assert once["plan_builds"] == 1 and once["plan_rebinds"] >= 1  # one build, rebound to each request's pool
    assert once["replan_over_plan_once"] > 0 and once["plan_build_ms"] > 0
    assert once["warmup_run_s"] > 0 and len(once["rep_medians_ms"]) == 1
    assert rows["fuelpipe fx replan contiguous"]["new_tokens"] == 3
    for layout in ("contiguous", "paged"):  # the untimed bit check: prompt row + the replan row's 2 decode steps
        assert rows[f"fuelpipe fx plan_once {layout}"]["plan_once_vs_replan"] == {
            "steps": 3, "bit_identical": True, "rows_differing": 0, "max_abs_diff": 0.0}
    assert rows["fuelpipe eager plan_once paged"]["plan_once_vs_replan"]["steps"] == 4
    assert "plan_once_vs_replan" not in rows["fuelpipe fx plan_once contiguous int8/g32/a16"]  # no replan twin
    assert rows["transformers dynamic"]["status"].startswith("needs the checkpoint as a GGUF file")
    for d in (tmp_path / "run", rec):
        assert (d / "peers.png").stat().st_size > 0
        assert "| fuelpipe fx plan_once contiguous |" in (d / "peers.md").read_text()
        assert "| yes (3 rows) |" in (d / "peers.md").read_text()


@pytest.mark.parametrize(
    "override, reason",
    [
        ("experiment.peers.backends=[fxx]", "unknown experiment.peers.backends entry 'fxx'; did you mean 'fx'?"),
        ("experiment.peers.new_tokens=2", "experiment.peers.new_tokens must be >= 3"),
        ("experiment.peers.f32_prefetch=[0,-64]", "experiment.peers.f32_prefetch entries must be in [0, 65536] bytes, got -64"),
        ("experiment.peers.f32_prefetch=[0,0]", "experiment.peers.f32_prefetch entries must be distinct (each names a row)"),
        ("experiment.peers.prompt_tokens=99", "experiment.peers.prompt_tokens=99 but the first prompt holds only 8"),
        ("experiment.peers.new_tokens=5000 experiment.peers.prompt_tokens=8",
         "experiment.peers.prompt_tokens + new_tokens = 5008 exceeds the model's max_position_embeddings"),
    ],
)
def test_bench_peers_refuses_bad_settings_with_the_reason(compose_cfg, override, reason):
    doc = run_job(compose_cfg(["experiment=bench_peers", *override.split(" ")]))
    assert doc["status"] == "config_error"
    assert any(reason in r for r in doc["reasons"]), doc["reasons"]


def test_cli_exits_2_on_a_bad_peers_setting(tmp_path):
    proc = run_cli("experiment=bench_peers", "experiment.peers.reps=0", f"hydra.run.dir={tmp_path}", cwd=tmp_path)
    assert proc.returncode == 2
    assert "experiment.peers.reps must be >= 1, got 0" in proc.stdout


@pytest.mark.slow
def test_real_smollm2_fuelpipe_matches_transformers_tokens(tmp_path):
    pytest.importorskip("transformers", reason="the transformers peer is the test extra: pip install -e '.[test]'")
    proc = run_cli(
        "experiment=bench_peers", "experiment.peers.new_tokens=12", "experiment.peers.reps=1",
        "experiment.peers.backends=[fx]", "experiment.peers.plans=[plan_once]", "experiment.peers.kv_layouts=[contiguous]",
        "experiment.peers.transformers=[dynamic]", "experiment.peers.llama_cpp=false",
        f"hydra.run.dir={tmp_path}", cwd=tmp_path, default_model=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = {r["system"]: r for r in json.loads(Path(tmp_path / "results.json").read_text())["peers"]["rows"]}
    assert rows["fuelpipe fx plan_once contiguous"]["tokens_match_reference"] is True


def test_plan_bits_sees_a_replan_row_that_computes_something_else():
    """Negative control for the table's ``= replan bits``: a twin on other weights differs, and says where."""
    from fuelpipe.bench.peers.plan_bits import compare_plan_once_to_replan
    from fuelpipe.kv.spec import KvSpec
    from fuelpipe.plan.backends import BackendSpec

    model = build_random_model("llama", "tiny", seed=3)
    other = build_random_model("llama", "tiny", seed=3)
    with torch.no_grad():
        other.layers[1].mlp.down_proj.weight[0, 0] += 1e-3  # one weight, one layer
    kv = KvSpec(layout="contiguous", block_size=16)
    once = FuelpipeSystem(model, BackendSpec(name="fx"), "plan_once", kv)
    same = compare_plan_once_to_replan(once, FuelpipeSystem(model, BackendSpec(name="fx"), "replan", kv),
                                       [3, 17, 42, 7], 3)
    assert same == {"steps": 4, "bit_identical": True, "rows_differing": 0, "max_abs_diff": 0.0}
    wrong = compare_plan_once_to_replan(once, FuelpipeSystem(other, BackendSpec(name="fx"), "replan", kv),
                                        [3, 17, 42, 7], 3)
    assert not wrong["bit_identical"] and wrong["rows_differing"] == 4 and wrong["max_abs_diff"] > 0
