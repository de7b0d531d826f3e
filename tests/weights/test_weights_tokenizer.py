"""GGUF tokenizer metadata -> tokenizer, on small hand-made vocabularies (the real ones are in test_weights_real)."""
from pathlib import Path

import numpy as np
import pytest

from fuelpipe.errors import InputError
from fuelpipe.weights.errors import TokenizerLoadError
from fuelpipe.weights.tokenizer import BYTE, CONTROL, NORMAL, tokenizer_from_gguf
from _support.weights_helpers import byte_level_alphabet

SOURCE = Path("synthetic.gguf")


def bpe_metadata(pre: str) -> dict:
    tokens = byte_level_alphabet() + ["<|end|>"]
    return {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre, "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": np.array([NORMAL] * 256 + [CONTROL]), "tokenizer.ggml.merges": [],
            "tokenizer.ggml.eos_token_id": 256}


@pytest.mark.parametrize("pre, pieces", [
    ("default", ["ab", "Ġ12345", "ĠÂ½"]),
    ("smollm", ["ab", "Ġ", "1", "2", "3", "4", "5", "Ġ", "Â½"]),
    ("llama-bpe", ["ab", "Ġ", "123", "45", "Ġ", "Â½"]),
    ("qwen2", ["ab", "Ġ", "1", "2", "3", "4", "5", "Ġ", "Â½"]),
])
def test_pre_type_picks_the_split(pre, pieces):
    tok = tokenizer_from_gguf(SOURCE, bpe_metadata(pre))
    assert [p for p, _ in tok.backend.pre_tokenizer.pre_tokenize_str("ab 12345 ½")] == pieces
    text = "ab 12345 ½<|end|>"
    ids = tok.encode(text)
    assert ids[-1] == 256 and tok.decode(ids) == "ab 12345 ½" and tok.decode(ids, skip_special_tokens=False) == text
    assert tok.stop_ids == (256,)


def test_unknown_pre_type_is_refused_not_guessed():
    with pytest.raises(TokenizerLoadError) as info:
        tokenizer_from_gguf(SOURCE, bpe_metadata("falcon"))
    assert str(SOURCE) in str(info.value) and "'falcon'" in str(info.value) and "smollm" in str(info.value)


def spm_metadata(scores: dict[str, float]) -> dict:
    """<unk> <s> </s>, 256 byte tokens, then normal pieces with the given scores."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + list(scores)
    types = [2, CONTROL, CONTROL] + [BYTE] * 256 + [NORMAL] * len(scores)
    return {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.scores": np.array([0.0] * 259 + list(scores.values()), dtype=np.float32),
            "tokenizer.ggml.token_type": np.array(types), "tokenizer.ggml.bos_token_id": 1,
            "tokenizer.ggml.eos_token_id": 2, "tokenizer.ggml.unknown_token_id": 0,
            "tokenizer.ggml.add_space_prefix": False}


PIECES = {"▁": -1.0, "a": -2.0, "b": -3.0, "c": -4.0, "ab": -5.0, "bc": -6.0, "▁ab": -7.0}


def test_sentencepiece_merges_highest_score_first_with_byte_fallback_and_bos():
    tok = tokenizer_from_gguf(SOURCE, spm_metadata(PIECES))
    vocab = tok.backend.get_vocab()
    ids = tok.encode("abc abé")
    # BOS (SentencePiece default), "ab" beats "bc" on score, " ab" is one piece, é falls back to its UTF-8 bytes.
    assert [tok.backend.id_to_token(i) for i in ids] == ["<s>", "ab", "c", "▁ab", "<0xC3>", "<0xA9>"]
    assert ids[0] == vocab["<s>"] and tok.decode(ids) == "abc abé"
    assert tok.encode("abc", add_special_tokens=False) == [vocab["ab"], vocab["c"]]


def test_negative_control_sentencepiece_scores_decide_the_merge():
    tok = tokenizer_from_gguf(SOURCE, spm_metadata({**PIECES, "bc": -4.5}))  # now "bc" outranks "ab"
    assert [tok.backend.id_to_token(i) for i in tok.encode("abc", add_special_tokens=False)] == ["a", "bc"]


def test_chat_template_renders_and_refusals_are_typed():
    md = {**bpe_metadata("default"), "tokenizer.chat_template": (
        "{% for m in messages %}{% if m['role'] == 'tool' %}{{ raise_exception('no tools') }}{% endif %}"
        "<{{ m['role'] }}>{{ m['content'] }}{{ eos_token }}{% endfor %}{% if add_generation_prompt %}<a>{% endif %}")}
    tok = tokenizer_from_gguf(SOURCE, md)
    assert tok.render_chat([{"role": "user", "content": "hi"}]) == "<user>hi<|end|><a>"
    assert tok.encode_chat([{"role": "user", "content": "hi"}])[-4] == 256
    with pytest.raises(InputError, match="no tools"):
        tok.render_chat([{"role": "tool", "content": "x"}])
    with pytest.raises(InputError, match="no chat template"):
        tokenizer_from_gguf(SOURCE, bpe_metadata("default")).render_chat([])
