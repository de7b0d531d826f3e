import pytest
import torch

from fuelpipe.errors import KvByteLengthError, KvCapacityError, KvLayerError, KvNoCapacityError
from fuelpipe.kv.contiguous import K, V, ContiguousKvCache

L, HKV, S, D = 2, 3, 8, 4


def make(dtype=torch.float32):
    return ContiguousKvCache.with_capacity(L, HKV, D, S, dtype, "cpu")


def test_preallocated_zeroed_buffers_with_known_residency():
    c = make()
    for i in range(L):
        lay = c.layer(i)
        assert lay.k.shape == (1, HKV, S, D) and lay.v.shape == (1, HKV, S, D)
        assert torch.count_nonzero(lay.k) == 0 and torch.count_nonzero(lay.v) == 0
    assert c.device_location == torch.device("cpu")
    assert c.bytes_per_token() == 2 * L * HKV * D * 4
    assert c.nbytes() == 2 * L * HKV * S * D * 4


def test_bf16_cache():
    c = make(torch.bfloat16)
    assert c.layer(0).k.dtype == torch.bfloat16 and c.bytes_per_token() == 2 * L * HKV * D * 2


def test_alloc_id_remints_on_storage_change_only():
    c = make()
    first = c.alloc_id
    c.advance(5)
    c.truncate_to(2)  # speculative rollback: same allocation
    assert c.alloc_id == first and c.cached_len == 2
    c.reset()  # zero in place: same allocation
    assert c.alloc_id == first and c.cached_len == 0
    k_before = c.layer(0).k
    c.clear()  # fresh buffers: new allocation
    assert c.alloc_id != first and c.layer(0).k is not k_before
    assert c.device_location == torch.device("cpu")
    second = c.alloc_id
    c.set_layer(1, torch.zeros(1, HKV, S, D), torch.zeros(1, HKV, S, D))
    assert c.alloc_id not in (first, second)
    assert c.device_location is None  # caller-supplied storage: residency cannot be proven


def test_with_dims_cache_has_no_residency_and_refuses_writes():
    c = ContiguousKvCache.with_dims(L, HKV, D)
    assert c.device_location is None and not c.has_capacity
    with pytest.raises(KvNoCapacityError, match="no fixed capacity"):
        c.write_bytes(0, K, 0, 1, b"\0" * (HKV * D * 4))


def test_write_bytes_is_head_major_and_in_place():
    c = make()
    buf = c.layer(1).v
    alloc = c.alloc_id
    src = torch.arange(HKV * 2 * D, dtype=torch.float32).view(1, HKV, 2, D)
    c.write_bytes(1, V, 3, 2, src.numpy().tobytes())
    assert c.layer(1).v is buf and c.alloc_id == alloc
    assert torch.equal(buf[:, :, 3:5], src)
    assert torch.count_nonzero(buf[:, :, :3]) == 0 and torch.count_nonzero(buf[:, :, 5:]) == 0
    assert c.layer(1).v_version == 1 and c.layer(1).k_version == 0


@pytest.mark.parametrize(
    "args, err, text",
    [
        ((0, K, 7, 2), KvCapacityError, "exceed max_seq_len 8"),
        ((0, K, -1, 1), KvCapacityError, "exceed max_seq_len"),
        ((5, K, 0, 1), KvLayerError, "layer 5 out of range"),
        ((0, 2, 0, 1), KvLayerError, "slot must be"),
    ],
)
def test_write_bytes_refusals_are_typed_and_change_nothing(args, err, text):
    c = make()
    layer, slot, start, n = args
    before = [t.clone() for t in c.bound_tensors()]
    with pytest.raises(err, match=text):
        c.write_bytes(layer, slot, start, n, b"\1" * (n * HKV * D * 4))
    assert all(torch.equal(a, b) for a, b in zip(before, c.bound_tensors()))


def test_write_bytes_wrong_length_names_expected_size():
    c = make()
    with pytest.raises(KvByteLengthError, match=r"got 5 bytes, expected 48"):
        c.write_bytes(0, K, 0, 1, b"\0" * 5)


def test_capacity_and_geometry_errors():
    c = make()
    with pytest.raises(KvCapacityError, match="exceed max_seq_len 8"):
        c.advance(9)
    with pytest.raises(KvCapacityError, match="n_kv_heads must be >= 1"):
        ContiguousKvCache.with_capacity(1, 0, 4, 8)
    with pytest.raises(KvCapacityError, match="max_seq_len must be >= 1"):
        ContiguousKvCache.with_capacity(1, 1, 4, 0)
    with pytest.raises(KvCapacityError, match="new_len must be >= 0"):
        c.truncate_to(-1)


def test_set_layer_checks_caller_storage():
    c = make()
    with pytest.raises(KvLayerError, match=r"k must be \[1, n_kv_heads=3, 8, head_dim=4\] of torch.float32, got \[1, 3, 9, 4\]"):
        c.set_layer(0, torch.zeros(1, HKV, S + 1, D), torch.zeros(1, HKV, S + 1, D))
    with pytest.raises(KvLayerError, match="got \\[1, 3, 8, 4\\] of torch.bfloat16"):
        c.set_layer(0, torch.zeros(1, HKV, S, D, dtype=torch.bfloat16), torch.zeros(1, HKV, S, D))
    first = c.alloc_id
    assert c.alloc_id == first  # refused: nothing replaced


def test_latent_set_slot_checks_caller_storage():
    from fuelpipe.kv.latent import LatentKvCache

    c = LatentKvCache(2, ((4,), (2,)), 8)
    with pytest.raises(KvLayerError, match=r"slot 1 must be \[8, 2\] of torch.float32, got \[8, 4\]"):
        c.set_slot(0, 1, torch.zeros(8, 4))
