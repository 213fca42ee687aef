"""A reader's view of its peers' holdings is a compact ``ShardSet`` per peer and dataset: the
same shards as plain sets would hold, through full announcements and deltas, in at most
min(4 k, n / 8) bytes for k of n shards."""

from __future__ import annotations

import base64
import json
import pickle
import zlib

import numpy as np
import pytest

from flashfeed.cache.peer.announce import _unvarints, _varints, encode_held
from flashfeed.cache.peer.holdings import HoldingsLog, apply, since_param
from flashfeed.cache.peer.shardset import ShardSet


def _bound(k: int, n: int) -> int:
    return min(4 * k, -(-n // 8))


def _varints_by_hand(values: list[int]) -> bytes:
    out = bytearray()
    for v in values:
        while v >= 0x80:
            out.append((v & 0x7F) | 0x80)
            v >>= 7
        out.append(v)
    return bytes(out)


def test_varints_match_leb128_written_by_hand_and_refuse_cut_or_long_ones():
    rng = np.random.default_rng(7)
    for size in (0, 1, 3, 1000):
        values = (rng.integers(0, 1 << 33, size) >> rng.integers(0, 33, size)).tolist()
        assert _varints(np.array(values, dtype=np.int64)) == _varints_by_hand(values)
        assert _unvarints(_varints_by_hand(values)).tolist() == values
    with pytest.raises(ValueError, match="cut short"):
        _unvarints(b"\x05\x80")
    with pytest.raises(ValueError, match="over 5 bytes"):
        _unvarints(b"\xff\xff\xff\xff\xff\x01")


@pytest.mark.parametrize("count", [1, 7, 8, 9, 1000, 1_000_000])
def test_a_set_keeps_the_smaller_of_array_and_bitmap_and_answers_like_a_set(count):
    rng = np.random.default_rng(count)
    for k in sorted({0, 1, count // 40, count // 32, count // 31, count // 2, count}):
        ref = set(rng.choice(count, k, replace=False).tolist())
        for s in (ShardSet(ref, count=count), ShardSet.from_blob(encode_held(ref, count), count)):
            assert len(s) == k and s.nbytes == _bound(k, count), (repr(s), k)
            assert s == ref and ref == s and s == frozenset(ref) and list(s) == sorted(ref)
            assert s != ref | {count} and hash(s) == hash(frozenset(ref))
            probe = rng.integers(-3, count + 3, 500)
            assert s.contains(probe).tolist() == [int(p) in ref for p in probe]
            assert [int(p) in s for p in probe] == [int(p) in ref for p in probe]
            assert [np.int32(p) in s for p in probe[:50]] == [int(p) in ref for p in probe[:50]]
            assert "3" not in s and None not in s
            assert pickle.loads(pickle.dumps(s)) == s
            assert (s | {0}) == ref | {0} and isinstance(s - ref, frozenset) and not (s - ref)


def test_a_million_shard_dataset_costs_at_most_a_bitmap_per_peer():
    n = 1_000_000
    rng = np.random.default_rng(3)
    sizes = {}
    for k in (1_000, 3_000, 31_250, 125_000, 600_000, n):
        s = ShardSet.from_blob(encode_held(rng.choice(n, k, replace=False), n), n)
        sizes[k] = s.nbytes
    assert sizes[1_000] == 4_000 and sizes[3_000] == 12_000  # a share: its numbers, 4 B each
    assert max(sizes.values()) == 125_000  # any holdings: one bit a shard
    for k in (125_000, 600_000, n):
        assert sizes[k] == 125_000


def test_full_announcements_and_deltas_give_the_reference_sets_under_random_churn():
    """A node's holdings drift across the array/bitmap switch and back (grow, churn, shrink,
    a new version of a dataset, a dataset gone); readers asking every 1, 3 and 9 versions
    apply what the server answers (deltas; the full one past the log's 6 versions) and hold
    exactly the server's sets, within the bound."""
    rng = np.random.default_rng(11)
    counts = {"a": 4096, "b": 50_000}
    held = {"a": set(), "b": set(rng.choice(50_000, 40, replace=False).tolist())}
    log = HoldingsLog(max_versions=6)
    log.update({k: (counts[k], v) for k, v in held.items()})
    readers = {lag: apply(None, json.loads(log.body(None))) for lag in (1, 3, 9)}
    answers = {lag: [] for lag in readers}
    plan = [200] * 6 + [0] * 6 + [-250] * 6  # "a" crosses 4096 / 32 = 128 numbers both ways
    forms = set()
    for step, grow in enumerate(plan, 1):
        for key, n in counts.items():
            have = held[key]
            if grow > 0:
                have |= set(rng.integers(0, n, grow).tolist())
            out = rng.choice(sorted(have), min(len(have), max(-grow, 5)), replace=False)
            have -= set(out.tolist())
            have |= set(rng.integers(0, n, 5).tolist())
        if step == 8:  # dataset "b" comes back as another version, with another count
            counts["b"] = 60_000
            held["b"] = set(rng.choice(60_000, 3000, replace=False).tolist())
        if step == 14:  # and goes
            held.pop("b")
            counts.pop("b")
        log.update({k: (counts[k], v) for k, v in held.items()})
        for lag, state in readers.items():
            if step % lag:
                continue
            body = json.loads(log.body(since_param(*state[:2])))
            answers[lag].append(body["full"])
            readers[lag] = state = apply(state, body)
            assert state[1] == log.version and set(state[2]) == set(held)
            for key, h in state[2].items():
                assert h.complete == held[key] and h.count == counts[key]
                assert h.complete.nbytes == _bound(len(held[key]), counts[key])
                forms.add((key, h.complete.form))
    assert not any(answers[1]) and not any(answers[3]) and all(answers[9])
    assert {("a", "array"), ("a", "bitmap")} <= forms


def test_a_delta_of_changes_only_moves_what_it_names():
    n = 1 << 20
    rng = np.random.default_rng(5)
    for k in (500, 200_000):  # an array, a bitmap
        ref = set(rng.choice(n, k, replace=False).tolist())
        base = ShardSet(ref, count=n)
        added = set(rng.integers(0, n, 300).tolist()) | set(list(ref)[:10])
        removed = set(list(ref)[10:60]) | set(list(added)[:7])  # removed wins, as sets
        got = base.updated(ShardSet(added, count=n), ShardSet(removed, count=n))
        assert got == (ref | added) - removed and base == ref  # the old one is untouched
        assert got.nbytes == _bound(len(got), n)
        nothing = ShardSet(count=n)
        assert base.updated(nothing, nothing) is base
    with pytest.raises(ValueError, match="a delta over 10 and 10 shards to a set of 20"):
        ShardSet(count=20).updated(ShardSet(count=10), ShardSet(count=10))


def test_malformed_or_out_of_range_holdings_are_refused():
    with pytest.raises(ValueError, match=r"shard numbers must be in \[0, 4\)"):
        ShardSet([4], count=4)
    with pytest.raises(ValueError, match="count must be in"):
        ShardSet(count=-1)
    with pytest.raises(ValueError, match="unknown encoding"):
        ShardSet.from_blob(b"X" + zlib.compress(b"\x00"), 8)
    with pytest.raises(ValueError, match="bitmap of 2 bytes for 8 shards"):
        ShardSet.from_blob(b"B" + zlib.compress(b"\x00\x00"), 8)
    with pytest.raises(ValueError, match="beyond the dataset"):
        ShardSet.from_blob(encode_held([9], 10), 5)
    # bits past the shard count in a bitmap's last byte name no shard
    s = ShardSet.from_blob(b"B" + zlib.compress(bytes([0xFF, 0xFF])), 12)
    assert list(s) == list(range(12)) and len(s) == 12
    with pytest.raises(ValueError, match="announcement"):
        body = {"instance": "i", "version": 1, "full": True}
        blob = base64.b64encode(b"D" + zlib.compress(b"\x80")).decode()
        apply(None, {**body, "datasets": {"k": {"count": 9, "held": blob, "filling": []}}})
