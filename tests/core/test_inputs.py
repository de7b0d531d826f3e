"""Bad input gets a typed error naming the constraint and the value; nothing is computed or lost."""
import pytest
import torch

from fuelpipe.context import InferenceContext
from fuelpipe.errors import ConfigError, InputError, KvCapacityError
from fuelpipe.plan.backends import BackendSpec
from fuelpipe.sampling import seeded


def test_token_out_of_vocab(tiny_llama):
    ctx = InferenceContext(tiny_llama)
    cache = ctx.new_cache(16)
    with pytest.raises(InputError, match=r"\[0, 256\), got range \[3, 999\]"):
        ctx.prefill(cache, [3, 999])
    assert cache.cached_len == 0


def test_empty_prompt_and_negative_tokens(tiny_llama):
    ctx = InferenceContext(tiny_llama)
    with pytest.raises(InputError, match="at least one token"):
        ctx.generate([], 4)
    with pytest.raises(InputError, match="max_new_tokens must be >= 0, got -1"):
        ctx.generate([1], -1)
    with pytest.raises(InputError, match="got range"):
        ctx.prefill(ctx.new_cache(8), [-1])


def test_float_ids_refused(tiny_llama):
    ctx = InferenceContext(tiny_llama)
    with pytest.raises(InputError, match="must be integers"):
        ctx.prefill(ctx.new_cache(8), torch.tensor([1.0, 2.0]))


def test_capacity_overflow_is_typed_and_leaves_cache_intact(tiny_llama):
    ctx = InferenceContext(tiny_llama)
    cache = ctx.new_cache(6)
    ctx.prefill(cache, [1, 2, 3, 4, 5, 6])
    before = [t.clone() for t in cache.bound_tensors()]
    with pytest.raises(KvCapacityError, match=r"positions \[6, 7\) exceed max_seq_len 6"):
        ctx.decode(cache, 1)
    assert cache.cached_len == 6
    assert all(torch.equal(a, b) for a, b in zip(before, cache.bound_tensors()))
    with pytest.raises(ConfigError, match="exceeds the model's max_position_embeddings 512"):
        ctx.new_cache(10_000)


def test_generate_with_a_too_small_cache(tiny_llama):
    ctx = InferenceContext(tiny_llama)
    with pytest.raises(InputError, match="needs 11 free positions"):  # the 10th token is never fed back
        ctx.generate([1, 2], 10, cache=ctx.new_cache(8))
    with pytest.raises(InputError, match="max_seq_len 5 < the 12 positions"):
        ctx.generate([1, 2, 3], 10, max_seq_len=5)
    result = ctx.generate([1, 2, 3], 4, cache=ctx.new_cache(6))  # exactly enough: 3 + 4 - 1
    assert len(result.tokens) == 4


def test_bad_backend_and_plan_names(tiny_llama):
    with pytest.raises(ConfigError, match="unknown backend .inductr.; did you mean .inductor."):
        InferenceContext(tiny_llama, "inductr")
    with pytest.raises(ConfigError, match="plan mode must be one of"):
        InferenceContext(tiny_llama, "fx", "plan-once")
    with pytest.raises(ConfigError, match="unknown fx passes"):
        BackendSpec("fx", fx_passes=("fuse_everything",))
    with pytest.raises(ConfigError, match="offset_mode must be one of"):
        InferenceContext(tiny_llama, offset_mode="device")


def test_seeded_sampling_is_reproducible(tiny_llama):
    ctx = InferenceContext(tiny_llama)
    a = ctx.generate([1, 2, 3], 12, sampler=seeded(0.8, top_k=20, seed=7)).tokens
    b = ctx.generate([1, 2, 3], 12, sampler=seeded(0.8, top_k=20, seed=7)).tokens
    c = ctx.generate([1, 2, 3], 12, sampler=seeded(0.8, top_k=20, seed=8)).tokens
    assert a == b and a != c
    with pytest.raises(ConfigError, match="temperature must be > 0"):
        seeded(0.0)


def test_decode_token_ids_must_be_one_integer(tiny_llama):
    import numpy as np

    ctx = InferenceContext(tiny_llama)
    cache = ctx.new_cache(16)
    ctx.prefill(cache, [np.int64(3), 4])  # numpy integers are integers
    with pytest.raises(InputError, match="must be integers, got float 3.7"):
        ctx.decode(cache, 3.7)
    with pytest.raises(InputError, match="must be integers, got True"):
        ctx.decode(cache, True)
    with pytest.raises(InputError, match=r"one integer token id, got a torch.int64 tensor of shape \[2\]"):
        ctx.decode(cache, torch.tensor([3, 4]))
    assert cache.cached_len == 2


def test_cache_dtype_and_model_switches(tiny_llama):
    from models.registry import build_random_model

    ctx = InferenceContext(tiny_llama)
    with pytest.raises(ConfigError, match="cache dtype torch.bfloat16 must equal the model's torch.float32"):
        ctx.prefill(ctx.new_cache(8, torch.bfloat16), [1, 2])
    ctx.switch_model(build_random_model("llama", "tiny", seed=2, dtype=torch.bfloat16))
    cache = ctx.new_cache(8)
    assert cache.dtype == torch.bfloat16
    ctx.prefill(cache, [1, 2])
    assert ctx.decode(cache, 3).dtype == torch.float32  # logits are f32 whatever the model dtype


def test_set_rope_plan_may_change_frequencies_only(tiny_llama):
    from fuelpipe.rope import RopePlan, RopeSpec

    ctx = InferenceContext(tiny_llama)
    d, n = tiny_llama.dims.head_dim, tiny_llama.dims.n_layers
    two_specs = RopePlan((RopeSpec(1e4, d), RopeSpec(1e6, d)), (0, 1))
    with pytest.raises(ConfigError, match="frequencies and scaling only"):
        ctx.set_rope_plan(two_specs)
    ctx.set_rope_plan(RopePlan.uniform(RopeSpec(5e5, d), n))  # allowed


def test_greedy_picks_the_first_of_equal_maxima_as_torch_argmax_on_every_dtype_and_layout():
    from fuelpipe.sampling import greedy

    gen = torch.Generator().manual_seed(0)
    rows = [torch.randn(1, 49152, generator=gen) for _ in range(20)]
    tied = torch.zeros(1, 9)
    tied[0, [2, 5, 7]] = 3.0  # three equal maxima: the first wins
    rows += [tied, torch.full((1, 4), -1.0), torch.tensor([[-0.0, 0.0, -1.0]]), torch.tensor([[0.0, -0.0]]),
             torch.tensor([[-6.0e4, 2.0, 2.0]])]
    wide = torch.randn(3, 64, generator=gen).t()  # a non-contiguous row
    rows += [wide[:1], wide[5:6]]
    for row in rows:
        for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
            r = row.to(dtype)
            assert greedy(r) == int(torch.argmax(r[0])), (dtype, r)
    assert greedy(tied) == 2


def test_a_row_whose_finite_values_overflow_the_sum_is_not_refused():
    from fuelpipe.sampling import check_finite, greedy

    row = torch.full((1, 8), 3e38)
    row[0, 6] = 3.1e38
    assert not torch.isfinite(row.sum())  # the fast check's sum overflows; the exact check clears the row
    check_finite(row[0])
    assert greedy(row) == 6


def test_greedy_falls_back_to_torch_where_numpy_cannot_read_the_row():
    from fuelpipe.sampling import greedy

    row = torch.tensor([[0.5, 3.0, 3.0, -1.0]])
    assert greedy(row.requires_grad_()) == 1  # a row that requires grad
    negated = torch.tensor([[-0.5, -3.0, 1.0]]).neg()  # a negated view: numpy cannot read it as it lies
    assert greedy(negated) == int(torch.argmax(negated[0])) == 1
    half = torch.full((1, 70000), 60000.0, dtype=torch.float16)  # its own-dtype sum overflows: not refused
    half[0, 123] = 65000.0
    assert greedy(half) == 123


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("form", ["f32", "f64", "bf16", "negated", "requires_grad"])
def test_greedy_refuses_every_non_finite_value_on_the_numpy_and_the_torch_path(bad, form):
    from fuelpipe.errors import NonFiniteLogitsError
    from fuelpipe.sampling import greedy

    row = torch.randn(1, 49152, generator=torch.Generator().manual_seed(1))
    row[0, 777] = bad
    row = {"f32": row, "f64": row.double(), "bf16": row.bfloat16(), "negated": row.neg().neg(),
           "requires_grad": row.clone().requires_grad_()}[form]
    with pytest.raises(NonFiniteLogitsError, match=r"1 non-finite values of 49152 \(first: id 777"):
        greedy(row)
