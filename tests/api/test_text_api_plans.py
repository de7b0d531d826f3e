"""A TextModel keeps its KV cache between generations, so its held plan is reused, not rebuilt per call,
and two interleaved streams still never share a cache."""
from __future__ import annotations

import pytest
from _support.weights_helpers import write_llama_gguf

import fuelpipe
from fuelpipe.api.cache_shelf import MIN_POSITIONS, positions_for
from models.registry import build_random_model


@pytest.fixture(scope="module")
def tm(tmp_path_factory):
    path = write_llama_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf", build_random_model("llama", "tiny", seed=5))
    return fuelpipe.load(path, backend="fx")


def test_repeated_generations_build_the_decode_plan_once(tm):
    before = tm.context.plan.stats.builds
    texts = [tm.generate("hello there", max_new_tokens=12).text for _ in range(3)]
    texts.append(tm.generate("a different prompt, longer than the first", max_new_tokens=20).text)
    assert tm.context.plan.stats.builds - before <= 1, "one build for the kept cache, then reuse"
    assert texts[0] == texts[1] == texts[2], "a rewound cache leaks nothing into the next generation"


def test_a_rewound_cache_gives_the_text_of_a_fresh_one(tm):
    long_first = tm.generate("x " * 40, max_new_tokens=30).text  # fills positions the next run will not write
    kept = tm.generate("short", max_new_tokens=8)
    fresh = fuelpipe.load(tm.tokenizer.source, backend="fx").generate("short", max_new_tokens=8)
    assert long_first and kept.tokens == fresh.tokens


def test_interleaved_streams_each_get_their_own_cache(tm):
    solo_a = tm.generate("alpha beta", max_new_tokens=16).text
    solo_b = tm.generate("gamma delta epsilon", max_new_tokens=16).text
    a, b = tm.stream("alpha beta", max_new_tokens=16), tm.stream("gamma delta epsilon", max_new_tokens=16)
    got_a, got_b = [], []
    for _ in range(64):  # alternate one piece each until both end
        for it, got in ((a, got_a), (b, got_b)):
            piece = next(it, None)
            if piece is not None:
                got.append(piece)
    assert "".join(got_a) == solo_a and "".join(got_b) == solo_b


def test_a_request_past_the_model_positions_is_refused_in_its_own_words(tm):
    from fuelpipe.errors import InputError

    with pytest.raises(InputError, match="max_position_embeddings"):
        tm.generate("hello", max_new_tokens=10_000)
    assert tm.generate("hello", max_new_tokens=4).text is not None  # the shelf is intact afterwards


def test_positions_come_in_powers_of_two_within_the_model():
    assert positions_for(1, 8192) == MIN_POSITIONS
    assert positions_for(MIN_POSITIONS + 1, 8192) == 2 * MIN_POSITIONS
    assert positions_for(700, 600) == 700  # never below the need (the context refuses it, not the shelf)
    assert positions_for(100, 300) == 300
