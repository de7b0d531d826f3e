"""The on-disk plan store: atomic publishing, never trusting a damaged or mismatched entry, a size bound.

No compilation here: payloads are plain bytes (fuelpipe.plan.plan_store does not look inside them).
"""
from __future__ import annotations

import json
import multiprocessing
import os
import time

import pytest

from fuelpipe.errors import ConfigError
from fuelpipe.plan.plan_store import META, PAYLOAD, STALE_TMP_S, PlanCacheSpec, PlanStore

FIELDS = {"graph": "g", "weights": "w", "inputs": "i"}


def _writer(data: bytes, delay: float = 0.0):
    def write(path):
        time.sleep(delay)
        path.write_bytes(data)
    return write


def test_store_then_lookup_is_a_hit_with_the_payload_and_extra(tmp_path):
    store = PlanStore(tmp_path, 10**9)
    assert store.lookup("k1", FIELDS).status == "miss"
    path, published = store.store("k1", FIELDS, _writer(b"payload-1"), extra={"passes_applied": {"p": 3}})
    assert published and path.read_bytes() == b"payload-1"
    found = store.lookup("k1", FIELDS)
    assert found.hit and found.path == path and found.extra == {"passes_applied": {"p": 3}}
    assert list(store.tmp.iterdir()) == []  # nothing left half-written


@pytest.mark.parametrize("damage, status", [
    ("flip", "corrupt"), ("truncate", "corrupt"), ("meta", "corrupt"), ("payload_gone", "corrupt"),
    ("fields", "mismatch"),
])
def test_a_damaged_or_mismatched_entry_is_never_served_and_is_removed(tmp_path, damage, status):
    store = PlanStore(tmp_path, 10**9)
    path, _ = store.store("k1", FIELDS, _writer(b"0123456789" * 100))
    asked = FIELDS
    if damage == "flip":
        data = bytearray(path.read_bytes())
        data[500] ^= 0xFF
        path.write_bytes(bytes(data))
    elif damage == "truncate":
        path.write_bytes(path.read_bytes()[:-1])
    elif damage == "meta":
        (path.parent / META).write_text("{not json")
    elif damage == "payload_gone":
        path.unlink()
    else:
        asked = {**FIELDS, "weights": "other"}
    found = store.lookup("k1", asked)
    assert found.status == status and found.path is None and found.detail
    assert not store.entry("k1").exists()  # moved out: the next build writes a fresh entry
    assert store.lookup("k1", FIELDS).status == "miss"


@pytest.mark.parametrize("occupant", ["file", "link"])
def test_a_plain_file_at_an_entry_path_is_reported_moved_out_and_the_next_store_publishes(tmp_path, occupant):
    store = PlanStore(tmp_path, 10**9)
    store.root.mkdir(parents=True)
    blocker = store.entry("k1")
    if occupant == "file":
        blocker.write_bytes(b"not an entry")
    else:
        blocker.symlink_to(tmp_path / "nowhere")
    found = store.lookup("k1", FIELDS)
    assert found.status == "corrupt" and "not an entry folder" in found.detail  # reported, not a silent miss
    assert not os.path.lexists(blocker)
    path, published = store.store("k1", FIELDS, _writer(b"payload"))
    assert published and store.lookup("k1", FIELDS).hit and path.read_bytes() == b"payload"
    assert list(store.tmp.iterdir()) == []  # the moved-out file was deleted, not left in .tmp


def test_a_file_that_appears_at_the_entry_path_before_publishing_does_not_block_it(tmp_path):
    store = PlanStore(tmp_path, 10**9)

    def write_then_block(path):
        path.write_bytes(b"payload")
        store.entry("k1").write_bytes(b"written by something else meanwhile")

    path, published = store.store("k1", FIELDS, write_then_block)
    assert published and store.lookup("k1", FIELDS).hit and path.read_bytes() == b"payload"
    assert list(store.tmp.iterdir()) == []


def test_a_second_writer_of_one_key_keeps_the_first_entry(tmp_path):
    store = PlanStore(tmp_path, 10**9)
    first, published_first = store.store("k1", FIELDS, _writer(b"first"))
    second, published_second = store.store("k1", FIELDS, _writer(b"second"))
    assert (published_first, published_second) == (True, False)
    assert second == first and first.read_bytes() == b"first"
    assert store.lookup("k1", FIELDS).hit
    assert list(store.tmp.iterdir()) == []


def _race(root: str, tag: bytes, queue) -> None:
    store = PlanStore(root, 10**9)
    path, published = store.store("shared", FIELDS, _writer(tag * 1000, delay=0.5))
    queue.put((published, path.read_bytes()[:len(tag)]))


def test_concurrent_writers_in_two_processes_leave_one_valid_entry(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_race, args=(str(tmp_path), tag, queue)) for tag in (b"A", b"B")]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    answers = [queue.get(timeout=5) for _ in procs]
    assert sorted(published for published, _ in answers) == [False, True]
    winner = next(tag for published, tag in answers if published)
    assert all(tag == winner for _, tag in answers)  # the loser reads the winner's entry
    store = PlanStore(tmp_path, 10**9)
    assert [e[2].name for e in store.entries()] == ["shared"]
    found = store.lookup("shared", FIELDS)
    assert found.hit and found.path.read_bytes() == winner * 1000
    assert list(store.tmp.iterdir()) == []


def test_least_recently_used_entries_go_past_the_bound_and_the_newest_stays(tmp_path):
    store = PlanStore(tmp_path, max_bytes=2500)
    for i, name in enumerate(("old", "used", "new")):
        store.store(name, FIELDS, _writer(b"x" * 1000))
        os.utime(store.entry(name) / META, (1000 + i, 1000 + i))
        if name == "used":
            assert store.lookup("old", FIELDS).hit  # a hit refreshes "old": now "used" is the oldest
    names = {e[2].name for e in store.entries()}
    assert "new" in names and len(names) == 2 and store.total_bytes() <= 2500 + 2 * 400
    assert "used" not in names


def test_a_single_entry_over_the_bound_is_kept(tmp_path):
    store = PlanStore(tmp_path, max_bytes=10)
    store.store("big", FIELDS, _writer(b"x" * 1000))
    assert store.lookup("big", FIELDS).hit


def test_abandoned_staging_folders_are_cleared(tmp_path):
    store = PlanStore(tmp_path, 10**9)
    stale = store.tmp / "k-dead"
    stale.mkdir(parents=True)
    (stale / PAYLOAD).write_bytes(b"half")
    old = time.time() - STALE_TMP_S - 10
    os.utime(stale, (old, old))
    store.store("k1", FIELDS, _writer(b"ok"))
    assert not stale.exists()


def test_meta_records_key_size_and_checksum(tmp_path):
    store = PlanStore(tmp_path, 10**9)
    path, _ = store.store("k1", FIELDS, _writer(b"abc"))
    meta = json.loads((path.parent / META).read_text())
    assert meta["key"] == FIELDS and meta["bytes"] == 3 and len(meta["sha256"]) == 64


def test_bad_settings_are_typed_errors(tmp_path):
    with pytest.raises(ConfigError, match="max_gb"):
        PlanCacheSpec(dir=str(tmp_path), max_gb=0)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(ConfigError, match="cannot be used"):
        PlanStore(blocker, 10**9)
