import threading

from fuelpipe.identity import KvAllocId, ModelInstanceId, ShapeKeyHasher, fnv1a64, shape_key
from models.registry import build_config, build_random_model


def test_fnv1a64_known_vectors():
    assert fnv1a64(b"") == 0xCBF29CE484222325
    assert fnv1a64(b"a") == 0xAF63DC4C8601EC8C
    assert fnv1a64(b"foobar") == 0x85944171F73967E8


def test_model_ids_are_never_recycled_across_threads_or_frees():
    ids: list[int] = []
    lock = threading.Lock()

    def mint():
        got = [build_random_model("llama", "tiny").instance_id.value for _ in range(20)]
        with lock:
            ids.extend(got)  # each model is dropped right away: its id must still never come back

    threads = [threading.Thread(target=mint) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(ids) == len(set(ids)) == 80
    assert ModelInstanceId.mint().value > max(ids)


def test_each_counter_is_unique_under_contention():
    values: list[int] = []
    lock = threading.Lock()

    def mint():
        got = [KvAllocId.mint().value for _ in range(1000)]
        with lock:
            values.extend(got)

    threads = [threading.Thread(target=mint) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(values) == len(set(values)) == 8000


def test_shape_key_covers_instance_and_structure_but_not_rope():
    a = build_random_model("llama", "tiny", seed=0)
    b = build_random_model("llama", "tiny", seed=0)  # same numbers, different instance
    assert a.shape_key() != b.shape_key()
    assert a.shape_key() == a.shape_key()
    cfg = build_config("llama", "tiny")
    structure = a.structure()
    assert "rope_theta" not in structure and "rope_scaling" not in structure
    k1 = shape_key("llama", structure, a.instance_id)
    assert k1 == a.shape_key()
    assert shape_key("llama", {**structure, "rms_norm_eps": 1e-6}, a.instance_id) != k1
    assert shape_key("qwen3", structure, a.instance_id) != k1
    # RoPE fields do not move the key: a model differing only in rope_theta/scaling keys equal.
    import dataclasses

    from models.llama import LlamaModel
    from fuelpipe.rope import RopeScaling

    other = LlamaModel(dataclasses.replace(cfg, rope_theta=5e5, rope_scaling=RopeScaling("llama3", 8.0)))
    assert other.structure() == LlamaModel(cfg).structure()


def test_hasher_encoding_is_self_delimiting():
    h1 = ShapeKeyHasher().value(("ab", "c")).finish()
    h2 = ShapeKeyHasher().value(("a", "bc")).finish()
    assert h1 != h2
    assert ShapeKeyHasher().value(1).finish() != ShapeKeyHasher().value("1").finish()
    assert ShapeKeyHasher().value(True).finish() != ShapeKeyHasher().value(1).finish()
