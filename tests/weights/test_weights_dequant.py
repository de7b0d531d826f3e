"""Our numpy dequant kernels against gguf.quants.dequantize, bit for bit, with a sensitivity control."""
import numpy as np
import pytest
from gguf import quants as gguf_quants
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as Q

from fuelpipe.weights.dequant import SUPPORTED_TYPES, dequantize
from _support.weights_helpers import real_gguf_path
from fuelpipe.weights.gguf_file import GgufFile

ROWS, BLOCKS_PER_ROW = 3, 4
# Byte offsets of each block's f16 scale fields: random bytes there would be inf/nan, so they get sane values.
F16_FIELDS = {Q.Q4_0: (0,), Q.Q4_1: (0, 2), Q.Q5_0: (0,), Q.Q5_1: (0, 2), Q.Q8_0: (0,), Q.Q4_K: (0, 2),
              Q.Q5_K: (0, 2), Q.Q6_K: (208,)}


def random_tensor(qtype: Q, seed: int = 0) -> tuple[np.ndarray, tuple[int, int]]:
    """Random GGML bytes for a [ROWS, cols] tensor of ``qtype``, as a uint8 [ROWS, row_bytes] array."""
    rng = np.random.default_rng(seed)
    block, type_size = GGML_QUANT_SIZES[qtype]
    cols = block * BLOCKS_PER_ROW if block > 1 else 64
    if qtype == Q.F32:
        return rng.normal(size=(ROWS, cols)).astype("<f4").view(np.uint8), (ROWS, cols)
    if qtype == Q.F16:
        return rng.normal(size=(ROWS, cols)).astype("<f2").view(np.uint8), (ROWS, cols)
    raw = rng.integers(0, 256, size=(ROWS, cols // block * type_size), dtype=np.uint8)
    blocks = raw.reshape(-1, type_size)
    for off in F16_FIELDS.get(qtype, ()):
        blocks[:, off : off + 2] = rng.normal(size=(len(blocks), 1)).astype("<f2").view(np.uint8)
    return raw, (ROWS, cols)


@pytest.mark.parametrize("qtype", SUPPORTED_TYPES, ids=lambda t: t.name)
def test_dequant_matches_gguf_reference_bit_exact(qtype):
    raw, shape = random_tensor(qtype)
    ours = dequantize(raw.reshape(-1), int(qtype), shape)
    ref = gguf_quants.dequantize(raw, qtype)
    assert ours.dtype == np.float32 and ours.shape == shape
    np.testing.assert_array_equal(ours, ref.astype(np.float32))


@pytest.mark.parametrize("qtype", [t for t in SUPPORTED_TYPES if GGML_QUANT_SIZES[t][0] > 1], ids=lambda t: t.name)
def test_negative_control_one_flipped_byte_changes_exactly_its_block(qtype):
    """The comparison above can fail: a one-byte change in the quant data moves that block's output only."""
    raw, shape = random_tensor(qtype, seed=1)
    block, type_size = GGML_QUANT_SIZES[qtype]
    before = dequantize(raw.reshape(-1), int(qtype), shape).reshape(-1, block)
    hit = raw.copy().reshape(-1, type_size)
    hit[5, type_size - 3] ^= 0x11  # a quant byte, never Q6_K's trailing d (bytes 208..209)
    after = dequantize(hit.reshape(-1), int(qtype), shape).reshape(-1, block)
    changed = np.flatnonzero((before != after).any(axis=1))
    assert changed.tolist() == [5]


def test_dequant_refuses_a_byte_count_that_does_not_match_the_shape():
    raw, shape = random_tensor(Q.Q8_0)
    with pytest.raises(ValueError, match="needs"):
        dequantize(raw.reshape(-1)[:-1], int(Q.Q8_0), shape)


def test_real_smollm2_tensors_match_gguf_reference():
    """One tensor of each type in the shipped SmolLM2 file (Q8_0 embedding, Q4_1 projection, F32 norm)."""
    f = GgufFile(real_gguf_path("smollm2_135m"))
    seen = {}
    for info in f.tensors.values():
        seen.setdefault(info.type_name, info)
    assert set(seen) == {"Q8_0", "Q4_1", "F32"}
    for info in seen.values():
        raw = f.raw(info)
        ours = dequantize(raw, info.ggml_type, info.shape)
        ref = gguf_quants.dequantize(raw.reshape(info.shape[0], -1) if len(info.shape) > 1 else raw,
                                     Q(info.ggml_type))
        np.testing.assert_array_equal(ours, ref.reshape(info.shape), err_msg=info.name)
