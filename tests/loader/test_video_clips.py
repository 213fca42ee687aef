"""Several clips per video per epoch (``clips_per_video=K``) through the DALI Loader on the
CPU (VP9 in webm): each clip is a sample of the plan keyed ``<key>#<j>``, ``"uniform"`` clips
sit evenly over the video, ``"random"`` ones are drawn per (seed, epoch, video, clip), the
frames equal a PyAV decode, and mid-epoch and elastic resume deliver every clip once (ledger
from delivered keys)."""

from __future__ import annotations

import numpy as np
import pytest

from flashfeed.errors import CorruptShardError
from flashfeed.loader import Loader
from flashfeed.loader.image.video import clip_draws
from flashfeed.loader.telemetry.ledger import check_exactly_once, read_dropped, read_ledger
from flashfeed.plan.mixture import Mixture, Source

from support.loader_helpers import resume_scenario, run_epochs
from support.videos import FPS, PERIOD, H, clip_errors, encode, reference_frames, write_videos

av = pytest.importorskip("av")

LENGTHS = [14 + 3 * i for i in range(8)]
SHARD = "shards/000000.tar"


@pytest.fixture(scope="module")
def videos(tmp_path_factory) -> tuple[str, dict[str, bytes]]:
    prefix = str(tmp_path_factory.mktemp("clips") / "ds")
    members = [encode(n, seed=i) for i, n in enumerate(LENGTHS)]
    write_videos(prefix, members)
    return prefix, {f"{SHARD}/v{i:03d}": m for i, m in enumerate(members)}


def clip_keys(k: int) -> list[str]:
    """Every clip of the dataset in plan-id order: video by video, clip by clip."""
    return [f"{SHARD}/v{i:03d}#{j}" for i in range(len(LENGTHS)) for j in range(k)]


def delivered(loader, batches=None) -> list[tuple[str, float]]:
    out = []
    for i, b in enumerate(loader):
        out += list(zip(b["__key__"], b["video_start"].tolist(), strict=True))
        if batches is not None and i + 1 == batches:
            break
    return out


def check_frames(batch, members, frames: int, stride: int) -> None:
    """Each delivered clip holds the frames start, start + stride, ... of a PyAV decode."""
    for clip, start_s, key in zip(batch["video"], batch["video_start"], batch["__key__"],
                                  strict=True):  # fmt: skip
        ref = reference_frames(members[key.rsplit("#", 1)[0]])
        start = round(float(start_s) * FPS)
        for k, errors in enumerate(clip_errors(clip, ref, frames)):
            want = start + stride * k
            assert errors[want] < 3.0, (key, k, errors[want])  # colour conversion only
            # nearest to the very frame asked for (frames PERIOD apart look alike)
            assert int(np.argmin(errors)) % PERIOD == want % PERIOD, (key, k)


def test_uniform_clips_sit_evenly_over_each_video_and_equal_a_pyav_decode(videos):
    prefix, members = videos
    loader = Loader(prefix, batch_size=4, fields={"video": "webm"}, frames=3, stride=2,
                    image_size=H, clip="uniform", clips_per_video=3, seed=2,
                    py_workers=0)  # fmt: skip
    assert len(loader) == 6  # 8 videos x 3 clips in batches of 4
    got: dict[str, float] = {}
    for batch in loader:
        assert batch["video"].shape == (4, 3, 3, H, H)
        check_frames(batch, members, 3, 2)
        for key, start in zip(batch["__key__"], batch["video_start"].tolist(), strict=True):
            assert key not in got, key
            got[key] = start
    assert sorted(got) == clip_keys(3)
    for i, n in enumerate(LENGTHS):
        fits = n - 5 + 1  # starts that leave room for 3 frames at stride 2
        starts = [round(got[f"{SHARD}/v{i:03d}#{j}"] * FPS) for j in range(3)]
        # the middle of each third of the starts that fit: spread, in order, never equal
        assert starts == [(2 * j + 1) * fits // 6 for j in range(3)], (n, starts)
        assert starts[0] < starts[1] < starts[2]


def test_random_clips_are_drawn_per_video_clip_and_epoch(videos):
    prefix, members = videos
    kw = dict(batch_size=4, fields={"video": "webm"}, frames=2, stride=3, image_size=H,
              clips_per_video=2, seed=7, py_workers=0)  # fmt: skip
    loader = Loader(prefix, **kw)
    full = []
    for batch in loader:
        check_frames(batch, members, 2, 3)
        full += list(zip(batch["__key__"], batch["video_start"].tolist(), strict=True))
    assert sorted(k for k, _ in full) == clip_keys(2)
    assert full == delivered(Loader(prefix, **kw))  # the seed decides, nothing else
    starts = dict(full)
    for i, n in enumerate(LENGTHS):
        fits = n - 4 + 1
        for j in range(2):
            draw = clip_draws(7, 0, np.array([i]), np.array([j]))[0]
            assert round(starts[f"{SHARD}/v{i:03d}#{j}"] * FPS) == min(int(draw * fits), fits - 1)
    # the two clips of a video are independent draws: most videos get two different starts
    assert sum(starts[f"{SHARD}/v{i:03d}#0"] != starts[f"{SHARD}/v{i:03d}#1"]
               for i in range(8)) >= 4  # fmt: skip
    later = Loader(prefix, **kw)
    later.set_epoch(1)
    assert dict(delivered(later)) != starts  # another epoch, other clips
    # clip 0 of each video starts where a one-clip loader's clip starts
    single = dict(delivered(Loader(prefix, **{**kw, "clips_per_video": 1})))
    assert {k: starts[f"{k}#0"] for k in single} == single


def test_mid_epoch_resume_reads_the_same_clips_in_the_same_order(videos):
    prefix, _ = videos
    kw = dict(batch_size=3, fields={"video": "webm"}, frames=2, stride=2, image_size=16,
              clips_per_video=3, seed=4, py_workers=0)  # fmt: skip
    full = delivered(Loader(prefix, **kw))
    assert len(full) == 24
    first = Loader(prefix, **kw)
    head = delivered(first, batches=3)
    state = first.state_dict()
    assert state["clips_per_video"] == 3 and state["num_samples"] == 24
    resumed = Loader(prefix, **kw)
    resumed.load_state_dict(state)
    assert head + delivered(resumed) == full  # keys and clip starts alike


def _factory(prefix, drop_last):
    def make(rank, world, ledger_dir):
        return Loader(
            prefix, batch_size=2, fields={"video": "webm"}, frames=2, stride=2, image_size=16,
            clips_per_video=3, clip="random", rank=rank, world_size=world, seed=11,
            drop_last=drop_last, ledger_dir=ledger_dir, py_workers=0,
        )  # fmt: skip

    return make


@pytest.mark.parametrize("drop_last", [True, False])
def test_resume_mid_epoch_equals_the_uninterrupted_run_by_the_ledger(videos, tmp_path, drop_last):
    prefix, _ = videos
    full, resumed = resume_scenario(
        _factory(prefix, drop_last), tmp_path, before=2, after=2, stop=3, epochs=2
    )
    assert full == resumed  # the same clip keys, rank by rank, in the same order
    for d in ("full", "resumed"):
        checks = check_exactly_once(str(tmp_path / d), clip_keys(3), epochs=[0, 1])
        assert all(c.ok for c in checks.values()), [str(c) for c in checks.values()]
        assert all(c.delivered == 24 for c in checks.values())  # 24 clips on 2 ranks of 2


@pytest.mark.parametrize("drop_last", [True, False])
def test_elastic_resume_delivers_every_remaining_clip_once(videos, tmp_path, drop_last):
    """2 ranks take 2 batches of epoch 0, 3 ranks finish it: every clip once (or dropped
    and named with ``drop_last``), each at the start the uninterrupted run gave it."""
    prefix, _ = videos
    make = _factory(prefix, drop_last)
    whole = {}
    for r in range(2):
        whole.update(delivered(make(r, 2, None)))
    assert sorted(whole) == clip_keys(3)
    ledger = str(tmp_path / "ledger")
    states, got = [], {}
    for r in range(2):
        loader = make(r, 2, ledger)
        got.update(delivered(loader, batches=2))
        states.append(loader.state_dict())
    assert states[0] == states[1]
    for r in range(3):
        loader = make(r, 3, ledger)
        loader.load_state_dict(states[0])
        for key, start in delivered(loader):
            # without drop_last a short rank repeats a clip (counted below), same start
            assert key not in got or (not drop_last and got[key] == start), key
            got[key] = start
    assert {k: whole[k] for k in got} == got  # each clip where the plan put it
    check = check_exactly_once(ledger, clip_keys(3), epochs=[0])[0]
    if drop_last:
        assert check.ok, str(check)
        assert check.delivered + check.dropped == 24 and check.dropped < 3 * 2
        assert check.delivered == len(got)
    else:  # nothing missing; a short rank repeats a clip of its own
        assert check.missing == [] and check.unknown == 0 and not read_dropped(ledger)
        assert sum(n - 1 for n in check.duplicates.values()) < 3
    assert sum(len(v) for v in read_ledger(ledger).values()) == check.delivered


def test_a_video_shorter_than_one_clip_names_the_clip(tmp_path):
    prefix = str(tmp_path / "ds")
    write_videos(prefix, [encode(12), encode(5)])
    loader = Loader(prefix, batch_size=4, fields={"video": "webm"}, frames=4, stride=2,
                    image_size=16, shuffle=False, clips_per_video=2,
                    clip="uniform")  # fmt: skip
    with pytest.raises(CorruptShardError, match=r"sample 'v001#0' field 'video': the video has "
                       r"5 frames; a clip of 4 frames at stride 2 needs 7"):  # fmt: skip
        list(loader)


def test_clip_options_and_states_of_another_count_are_refused(videos, tmp_path):
    prefix, _ = videos
    kw = dict(batch_size=2, fields={"video": "webm"}, frames=2, image_size=16, py_workers=0)
    with pytest.raises(ValueError, match=r"clips_per_video must be an integer >= 1, got 0"):
        Loader(prefix, clips_per_video=0, **kw)
    with pytest.raises(ValueError, match=r"clip='center' takes one clip per video, got "
                       r"clips_per_video=2: use clip='uniform'"):  # fmt: skip
        Loader(prefix, clips_per_video=2, clip="center", **kw)
    with pytest.raises(ValueError, match=r"clips_per_video=2 needs a video field and frames="):
        Loader(prefix, batch_size=2, fields={"image": "jpg"}, clips_per_video=2)
    with pytest.raises(ValueError, match=r"clips_per_video=2 reads video clips; buckets="):
        Loader(prefix, clips_per_video=2, buckets=[(16, 16)], **kw)
    other = str(tmp_path / "other")
    write_videos(other, [encode(12, seed=3)])
    mix = Mixture((Source(prefix, 1, "a"), Source(other, 1, "b")))
    with pytest.raises(ValueError, match=r"clips_per_video=2 plans the clips of one dataset, "
                       r"not a mixture"):  # fmt: skip
        Loader(mix, clips_per_video=2, **kw)
    three = Loader(prefix, clips_per_video=3, **kw)
    state, _ = run_epochs(three, [0], stop_after=2)
    with pytest.raises(ValueError, match=r"saved reading 3 clip\(s\) per video, this loader "
                       r"reads 2: make it with clips_per_video=3"):  # fmt: skip
        Loader(prefix, clips_per_video=2, **kw).load_state_dict(state)
    with pytest.raises(ValueError, match=r"saved reading 3 clip\(s\) per video, this loader "
                       r"reads 1"):  # fmt: skip
        Loader(prefix, **kw).load_state_dict(state)


def test_unshuffled_clips_come_video_by_video_clip_by_clip(videos):
    """Plan id i is clip i % K of video i // K: in dataset order, a video's clips in a row."""
    prefix, _ = videos
    loader = Loader(prefix, batch_size=4, fields={"video": "webm"}, frames=2, image_size=16,
                    clips_per_video=2, clip="uniform", shuffle=False, drop_last=False,
                    py_workers=0)  # fmt: skip
    assert [k for k, _ in delivered(loader)] == clip_keys(2)
