"""Aspect-ratio buckets: the pure assignment and batching, image sizes in the shard table at
index and ingest time, and the bucketed Loader (one bucket per batch, the pixels of a cover
resize + crop, exact resume proven by the ledger, extreme aspect ratios skipped and counted)."""

from __future__ import annotations

import io
import json

import numpy as np
import pyarrow as pa
import pytest
from PIL import Image

from flashfeed.cli import main
from flashfeed.dataset import Dataset
from flashfeed.errors import ManifestError
from flashfeed.format.manifest import Manifest, commit_manifest
from flashfeed.format.shardtable import ShardTable
from flashfeed.loader import Loader
from flashfeed.loader.image.buckets import (
    NO_SIZE,
    TOO_MUCH_CROP,
    BucketOptions,
    assign_buckets,
    auto_buckets,
    bucket_order,
    parse_buckets,
)
from flashfeed.loader.telemetry.ledger import check_exactly_once, read_dropped
from flashfeed.shardio import shard_name, write_tar_shard

from support.loader_helpers import image_keys, resume_scenario, run_epochs

SHAPES = ((16, 32), (32, 16), (24, 24))  # wide, tall, square
#: (width, height) of the test images: wide, tall, square, a bit off each, and extremes
IMAGE_SIZES = [(40, 20), (20, 40), (30, 30), (44, 20), (22, 40), (33, 30)]


def _image(w: int, h: int, seed: int) -> bytes:
    """A smooth gradient (so a resize is predictable) with a per-image offset."""
    y, x = np.mgrid[0:h, 0:w]
    r = (x * 200 // max(w - 1, 1)) % 256
    g = (y * 200 // max(h - 1, 1)) % 256
    b = np.full_like(r, (seed * 37) % 200 + 20)
    img = np.stack([r, g, b], -1).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="PNG")
    return buf.getvalue()


def write_sized(prefix: str, sizes: list[int], *, extreme: tuple[int, ...] = ()) -> list[str]:
    """Shards of png samples of ``IMAGE_SIZES`` in turn (``extreme``: sample numbers made
    200x2, an aspect ratio of 100:1), then ``flashfeed index``; returns the keys."""
    n = 0
    for i, count in enumerate(sizes):
        samples = []
        for _ in range(count):
            w, h = (200, 2) if n in extreme else IMAGE_SIZES[n % len(IMAGE_SIZES)]
            samples.append((f"s{i}-{n:04d}", {"png": _image(w, h, n), "cls": b"%d" % (n % 3)}))
            n += 1
        write_tar_shard(prefix, shard_name(i, "tar"), samples)
    assert main(["index", prefix]) == 0
    return image_keys(prefix)


# -- the pure parts ---------------------------------------------------------------------------


def test_each_size_goes_to_the_nearest_aspect_ratio_and_the_crop_loss_is_exact():
    sizes = np.array([[40, 20], [20, 40], [30, 30], [36, 30], [200, 2], [0, 0]], np.int32)
    bucket, lost, reason = assign_buckets(sizes, BucketOptions(SHAPES, max_crop=0.5))
    assert bucket.tolist() == [0, 1, 2, 2, -1, -1]
    assert reason.tolist() == [0, 0, 0, 0, 2, 1]
    # 36x30 to 24x24: scaled by 0.8 to 28.8x24, cropped to 24x24: loses 1 - 24/28.8
    assert lost[:3].tolist() == [0.0, 0.0, 0.0]
    assert lost[3] == pytest.approx(1 - 24 / 28.8)
    # 200x2 to 16x32 (w/h 2): scaled by 8 to 1600x16, keeps 32 of 1600 columns
    assert lost[4] == pytest.approx(1 - 32 / 1600)


def test_bucket_batches_hold_one_bucket_and_every_sample_once():
    rng = np.random.default_rng(1)
    ids = rng.permutation(1000)
    bucket = rng.integers(0, 3, 1000)
    bucket[rng.choice(1000, 20, replace=False)] = -1
    reason = np.where(bucket < 0, 2, 0).astype(np.int8)
    lost = np.zeros(1000)
    keep = bucket_order(ids, bucket, lost, reason, batch_size=16, drop_last=False)
    drop = bucket_order(ids, bucket, lost, reason, batch_size=16, drop_last=True)
    by_id = dict(zip(ids.tolist(), bucket.tolist(), strict=True))
    for got in (keep, drop):
        for a, b in zip(got.bounds[:-1], got.bounds[1:], strict=True):
            assert len({by_id[i] for i in got.ids[a:b].tolist()}) == 1
        assert sorted([*got.ids.tolist(), *got.dropped.tolist()]) == list(range(1000))
        assert got.skipped == {TOO_MUCH_CROP: 20}
    sizes = np.diff(keep.bounds)
    assert (sizes[:-3] == 16).all() and (sizes[-3:] < 16).all()  # one short tail per bucket
    assert (np.diff(drop.bounds) == 16).all()
    assert len(drop.dropped) == 20 + sizes[-3:].sum()
    # deterministic, and the full batches come in plan order of completion
    again = bucket_order(ids, bucket, lost, reason, batch_size=16, drop_last=False)
    assert np.array_equal(again.ids, keep.ids)
    where = {i: p for p, i in enumerate(ids.tolist())}
    done = [max(where[i] for i in keep.ids[a:b].tolist()) for a, b in zip(
        keep.bounds[:-4], keep.bounds[1:-3], strict=True)]  # fmt: skip
    assert done == sorted(done)


def test_auto_buckets_keep_the_ratios_the_data_has():
    sizes = np.array([[40, 20]] * 50 + [[30, 30]] * 49 + [[10, 40]], np.int32)
    assert auto_buckets(sizes, image_size=32, min_share=0.05) == ((32, 32), (24, 48))
    assert auto_buckets(np.zeros((0, 2), np.int32), image_size=32) == ((32, 32),)


@pytest.mark.parametrize(
    "value,match",
    [("square", "buckets must be 'auto' or"), ([], "buckets must be"),
     ([(16, 0)], r"a bucket must be \(height, width\)"), ([(16, 16), (16, 16)], "repeat")],
)  # fmt: skip
def test_bad_buckets_are_named(value, match):
    with pytest.raises(ValueError, match=match):
        parse_buckets(value)


# -- image sizes in the shard table -----------------------------------------------------------


def test_index_records_image_sizes_and_old_tables_still_read(tmp_path):
    prefix = str(tmp_path / "ds")
    write_sized(prefix, [7, 5])
    table = Dataset.open(prefix).manifest.table
    assert table.has_image_sizes
    got = table.image_sizes(np.array([0, 0, 1, 1]), np.array([0, 2, 0, 4]))
    assert got.tolist() == [list(IMAGE_SIZES[0]), list(IMAGE_SIZES[2]), list(IMAGE_SIZES[1]),
                            list(IMAGE_SIZES[5])]  # fmt: skip
    # the table round-trips through its IPC file; without the columns it reads as before
    again = ShardTable.read_ipc(table.to_ipc(), source="t")
    assert again.has_image_sizes and again.digest == table.digest
    old = table.to_arrow().drop_columns(["widths", "heights"])
    plain = ShardTable.from_arrow(old, source="old")
    assert not plain.has_image_sizes and plain.digest == table.digest
    assert plain.image_sizes(np.array([0]), np.array([0])).tolist() == [[0, 0]]


def test_bad_image_size_columns_are_named():
    table = ShardTable.from_columns(
        path=["a.tar"], samples=[2], bytes=[10], checksum=["xxh3_128:00"]
    ).to_arrow()
    sizes = pa.array([[1, 2, 3]], pa.list_(pa.int32()))
    with pytest.raises(ManifestError, match=r"'widths', row 0: 3 entries for 2 samples"):
        ShardTable.from_arrow(table.append_column("widths", sizes).append_column(
            "heights", sizes), source="t")  # fmt: skip
    with pytest.raises(ManifestError, match="'widths' without its pair"):
        ShardTable.from_arrow(table.append_column("widths", sizes), source="t")


def test_ingest_records_image_sizes(tmp_path, ray_session):
    from flashfeed.ingest import IngestConfig, run

    src = tmp_path / "src" / "cls0"
    src.mkdir(parents=True)
    for n, (w, h) in enumerate(IMAGE_SIZES):
        buf = io.BytesIO()
        Image.fromarray(np.zeros((h, w, 3), np.uint8)).save(buf, format="JPEG")
        (src / f"img{n}.jpg").write_bytes(buf.getvalue())
    result = run(
        IngestConfig(source=str(tmp_path / "src"), dest=str(tmp_path / "out"),
                     samples_per_shard=4, progress="none")
    )  # fmt: skip
    table = result.manifest.table
    assert table.has_image_sizes
    ds = Dataset.open(str(tmp_path / "out"))
    seen = []
    for i, info in enumerate(ds.shards):
        rows = np.arange(info.samples)
        sizes = ds.manifest.table.image_sizes(np.full(len(rows), i), rows)
        for (key, members), (w, h) in zip(ds.iter_shard(info), sizes.tolist(), strict=True):
            assert Image.open(io.BytesIO(members["jpg"])).size == (w, h), key
            seen.append((w, h))
    assert sorted(seen) == sorted(IMAGE_SIZES)


# -- the bucketed Loader ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def sized(tmp_path_factory) -> tuple[str, list[str]]:
    prefix = str(tmp_path_factory.mktemp("sized") / "ds")
    return prefix, write_sized(prefix, [40, 38, 42], extreme=(5,))


def _bucket_of(n: int) -> int:
    return {0: 0, 1: 1, 2: 2}[n % 3]  # IMAGE_SIZES alternate wide, tall, square


def test_every_batch_holds_one_bucket_and_reports_counts(sized):
    prefix, _ = sized
    loader = Loader(prefix, batch_size=8, buckets=list(SHAPES), drop_last=False, py_workers=1)
    seen = []
    for batch in loader:
        ns = [int(k.rsplit("-", 1)[1]) for k in batch["__key__"]]
        (b,) = {_bucket_of(n) for n in ns}
        assert tuple(batch["image"].shape) == (len(ns), 3, *SHAPES[b])
        seen += ns
    assert sorted(seen) == [n for n in range(120) if n != 5]  # 200x2 skipped, all else once
    report = loader.bucket_report()
    assert [b["samples"] for b in report["buckets"]] == [40, 40, 39]
    assert [b["batches"] for b in report["buckets"]] == [5, 5, 5]
    assert report["skipped"] == {TOO_MUCH_CROP: 1} and report["dropped"] == 0
    # wide images alternate 40x20 (no loss) and 44x20 (scaled to 35.2x16, cropped to 32x16)
    assert report["buckets"][0]["crop_lost"] == pytest.approx((1 - 32 / 35.2) / 2)
    assert report["buckets"][2]["crop_lost"] == pytest.approx((1 - 24 / 26.4) * 19 / 39)
    assert loader.stats()["buckets"] == report


def test_bucketed_eval_pixels_are_a_cover_resize_and_centre_crop(sized):
    import torch
    import torch.nn.functional as F

    prefix, _ = sized
    loader = Loader(prefix, batch_size=4, buckets=list(SHAPES), shuffle=False, train=False)
    batch = next(iter(loader))
    mean = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1) * 255
    std = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1) * 255
    got = batch["image"] * std + mean
    ds = Dataset.open(prefix)
    members = {f"{ds.shards[0].path}/{k}": m for k, m in ds.iter_shard(ds.shards[0])}
    for img, key in zip(got, batch["__key__"], strict=True):
        src = np.asarray(Image.open(io.BytesIO(members[key]["png"])).convert("RGB"))
        h, w = img.shape[1:]
        scale = max(w / src.shape[1], h / src.shape[0])
        rh, rw = round(src.shape[0] * scale), round(src.shape[1] * scale)
        ref = F.interpolate(
            torch.from_numpy(src).permute(2, 0, 1)[None].float(), size=(rh, rw),
            mode="bilinear", align_corners=False, antialias=True,
        )[0]  # fmt: skip
        top, left = (rh - h) // 2, (rw - w) // 2
        ref = ref[:, top : top + h, left : left + w]
        assert (img - ref).abs().mean() < 6, key  # DALI's and torch's filters differ a little


def _factory(prefix, **kw):
    def make(rank, world, ledger_dir):
        return Loader(
            prefix, batch_size=4, buckets=list(SHAPES), rank=rank, world_size=world, seed=9,
            ledger_dir=ledger_dir, py_workers=0, train=False, **kw,
        )  # fmt: skip

    return make


@pytest.mark.parametrize("drop_last", [True, False])
@pytest.mark.parametrize("stop", [3, 7])
def test_bucketed_mid_epoch_resume_equals_uninterrupted(sized, tmp_path, stop, drop_last):
    prefix, keys = sized
    full, resumed = resume_scenario(
        _factory(prefix, drop_last=drop_last), tmp_path, before=2, after=2, stop=stop
    )
    assert full == resumed
    for d in ("full", "resumed"):
        checks = check_exactly_once(str(tmp_path / d), keys, epochs=[0, 1])
        assert all(c.ok for c in checks.values()), [str(c) for c in checks.values()]
    dropped = read_dropped(str(tmp_path / "full"))
    assert 5 in dropped[0] and 5 in dropped[1]  # the 100:1 image, named in the ledger


def _elastic(make, ledger, *, before, after, stop):
    """``before`` ranks take ``stop`` batches of epoch 0 in lock-step, then ``after`` ranks
    load rank 0's state and finish the epoch: the new ranks' batches (keys, image shape) and
    their states at the end."""
    states = []
    for r in range(before):
        state, seen = run_epochs(make(r, before, ledger), [0], stop_after=stop)
        assert seen == stop
        states.append(state)
    assert all(s == states[0] for s in states)
    batches, finals = [], []
    for r in range(after):
        loader = make(r, after, ledger)
        loader.load_state_dict(states[0])
        expected = len(loader)
        got = [(b["__key__"], tuple(b["image"].shape)) for b in loader]
        assert len(got) == expected > 0
        batches.append(got)
        finals.append(loader.state_dict())
    return batches, finals


@pytest.mark.parametrize(
    "before,after,stop,drop_last",
    [(2, 3, 3, True), (2, 3, 7, True), (3, 2, 4, True), (2, 3, 5, False), (3, 1, 2, False)],
)
def test_bucketed_elastic_resume_mid_epoch_delivers_the_rest_once(
    sized, tmp_path, before, after, stop, drop_last
):
    prefix, keys = sized
    ledger = str(tmp_path / "ledger")
    make = _factory(prefix, drop_last=drop_last)
    batches, finals = _elastic(make, ledger, before=before, after=after, stop=stop)
    for rank in batches:
        short = []
        for ks, shape in rank:
            ns = [int(k.rsplit("-", 1)[1]) for k in ks]
            (b,) = {_bucket_of(n) for n in ns}  # one bucket per batch, at its shape
            assert shape == (len(ns), 3, *SHAPES[b])
            if len(ns) < 4:
                short.append(b)
        # drop_last: only full batches; else at most one short batch per bucket, at the end
        assert short == [] if drop_last else len(short) == len(set(short))
    check = check_exactly_once(ledger, keys, epochs=[0])[0]
    dropped = read_dropped(ledger)[0]
    assert 5 in dropped  # the 100:1 image, skipped and named
    assert {f["dropped"] for f in finals} == {len(dropped)}  # the state says what is dropped
    if drop_last:
        assert check.ok, str(check)  # delivered or recorded as dropped, each exactly once
        assert check.delivered + check.dropped == 120
        assert len({len(rank) for rank in batches}) == 1  # ranks step together
        assert check.dropped < 3 * 4 * after + after  # a short tail per bucket and rank
    else:
        # nothing lost, nothing dropped but the skipped image; a short rank repeats a few
        assert check.missing == [] and check.unknown == 0 and dropped == [5]
        assert sum(n - 1 for n in check.duplicates.values()) < after


@pytest.mark.parametrize("drop_last", [True, False])
def test_bucketed_resplits_across_nodes_take_every_sample_once(tmp_path, drop_last):
    """The plan alone, on more samples and several nodes: 4 ranks (2 a node) take 5 batches,
    6 ranks (3 a node) take 3, then 3 ranks (one node) read the rest; lock-step ranks
    deliver one-bucket batches, and what is delivered and dropped is the epoch, once."""
    from flashfeed.loader.distributed import DistContext
    from flashfeed.loader.image.bucketplan import BucketPlanner
    from flashfeed.loader.position import Position
    from flashfeed.plan.plan import PlanOptions, Segment

    prefix = str(tmp_path / "ds")
    write_sized(prefix, [230, 170, 200], extreme=(7, 300))
    manifest = Dataset.open(prefix).manifest
    planner = BucketPlanner(BucketOptions(SHAPES), manifest, 8)
    options = PlanOptions(seed=3, drop_last=drop_last)
    delivered: list[int] = []
    dropped: list[int] = []
    prior: list[Segment] = []
    for world, rpn, batches in [(4, 2, 5), (6, 3, 3), (3, 3, None)]:
        taken = set()
        for rank in range(world):
            p = Position(
                manifest.shard_samples, DistContext(rank, world, rpn), options, prior=list(prior)
            )
            order = planner.pass_order(p)
            k = order.num_batches if batches is None else batches
            assert k <= order.num_batches
            for b in range(k):
                ids = order.ids[order.batch_slice(b)]
                assert len({_bucket_of(int(i)) for i in ids}) == 1
                assert len(ids) == 8 or (batches is None and not drop_last)
                delivered += ids.tolist()
            taken.add(order.bounds[k])
            if batches is None:
                dropped += planner.order(p).dropped.tolist() + planner.surplus(p).tolist()
        if batches is not None:
            assert taken == {8 * batches}  # every rank took as many samples
            prior.append(Segment(world, rpn, 8 * batches))
    assert set(delivered).isdisjoint(dropped)
    assert sorted(dropped) == sorted(set(dropped))
    assert 7 in dropped and 300 in dropped  # the 100:1 images, skipped
    everything = sorted(set(delivered) | set(dropped))
    assert everything == list(range(600))
    if drop_last:
        assert len(delivered) == len(set(delivered))  # once each
    else:
        assert sorted(dropped) == [7, 300]  # only the skipped; short ranks repeat a few
        assert len(delivered) - len(set(delivered)) < 3


def test_bucketed_elastic_resume_inside_the_short_batches_is_refused(sized, tmp_path):
    prefix, _ = sized
    make = _factory(prefix, drop_last=False)
    a = make(1, 2, None)  # rank 1 holds the skipped 100:1 image: 59 samples, short batches
    batches = list(a)
    full = sum(1 for b in batches if len(b["__key__"]) == 4)
    assert full < len(batches)
    state, _ = run_epochs(make(1, 2, None), [0], stop_after=full + 1)  # one short batch
    assert state["segments"][-1][2] % 4 != 0 and not state["finished"]
    b = make(0, 3, None)
    with pytest.raises(ValueError, match=r"short last batches of the buckets"):
        b.load_state_dict(state)
    expected = len(b)
    assert len(list(b)) == expected > 0  # the refused state left the loader as it was
    c = make(1, 2, None)  # the topology that saved it resumes it
    c.load_state_dict(state)
    assert len(list(c)) == len(batches) - full - 1


def test_bucketed_resume_at_the_end_of_an_epoch_takes_any_world_size(sized):
    prefix, _ = sized
    a = _factory(prefix)(0, 2, None)
    for _ in a:
        pass
    c = _factory(prefix)(1, 3, None)
    c.load_state_dict(a.state_dict())
    assert len(list(c)) > 0 and c.epoch == 1  # the next epoch, on three ranks


def test_a_dataset_without_recorded_sizes_names_the_fix(tmp_path):
    prefix = str(tmp_path / "ds")
    info = write_tar_shard(prefix, shard_name(0, "tar"), [("k", {"png": _image(8, 8, 0)})])
    commit_manifest(
        prefix, Manifest(name="old", shard_format="webdataset", schema={}, shards=(info,))
    )
    with pytest.raises(ValueError, match=r"image sizes.*records.*flashfeed index --overwrite"):
        Loader(prefix, batch_size=2, buckets="auto")


def test_auto_buckets_come_from_the_recorded_sizes(sized):
    prefix, _ = sized
    loader = Loader(prefix, batch_size=8, image_size=32, buckets="auto", max_crop=0.99)
    shapes = [tuple(b["shape"]) for b in loader.bucket_report()["buckets"]]
    # 20x40 is 1:2; 22x40 is nearer 24x40 (3:5, what 2:3 rounds to); 100:1 is under 1%
    assert shapes == [(48, 24), (40, 24), (32, 32), (24, 48)]
    report = loader.bucket_report()
    # max_crop=0.99 keeps the 200x2 image (it keeps 2% of its area in the 24x48 bucket)
    assert report["skipped"] == {} and NO_SIZE not in report["skipped"]
    # 20, 20, 39 and 41 samples (40 wide and the 100:1); batches of 8 and drop_last
    assert [b["samples"] for b in report["buckets"]] == [16, 16, 32, 40]
    assert report["dropped"] == 4 + 4 + 7 + 1
    assert json.dumps(report)  # plain values, for logs


def test_with_drop_last_every_rank_yields_the_same_batches_count(sized):
    prefix, _ = sized
    make = _factory(prefix)
    loaders = [make(r, 3, None) for r in range(3)]
    lengths = [len(ld) for ld in loaders]  # before the epoch: after it, len is the next one's
    counts = [len(list(ld)) for ld in loaders]
    assert counts[0] > 0 and counts == lengths == [counts[0]] * 3
    reports = [ld.bucket_report() for ld in loaders]
    assert all(sum(b["samples"] for b in r["buckets"]) == 4 * counts[0] for r in reports)


def test_buckets_refuse_a_mixture_at_construction(tmp_path):
    from flashfeed.plan.mixture import Mixture, Source

    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    write_sized(a, [6])
    write_sized(b, [4, 3])
    mix = Mixture((Source(a, 1, "a"), Source(b, 1, "b")))
    why = (
        r"buckets= reads one dataset, not a mixture: a bucketed batch waits for its bucket to "
        r"fill, .* a mixture's resume state is each source's count read as a prefix of that "
        r"order .* bucket each source's Loader on its own and interleave their batches by "
        r"weight, or read the mixture without buckets"
    )
    with pytest.raises(ValueError, match=why):
        Loader(mix, batch_size=2, buckets=list(SHAPES))
    plain = Loader(mix, batch_size=2, image_size=16)  # the same mixture without buckets reads
    keys = [k for batch in plain for k in batch["__key__"]]
    plain.close()
    assert len(keys) >= 6 and {k.split(":")[0] for k in keys} == {"a", "b"}
