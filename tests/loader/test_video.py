"""Video clips through the DALI Loader on the CPU (VP9 in webm): the frames of each clip equal
a PyAV decode of the same frames, clips are placed by the plan (same seed and epoch, same
clips; resume reads the rest), and bad videos are named."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from flashfeed.errors import CorruptShardError
from flashfeed.loader import Loader
from flashfeed.loader.image.video import ClipOptions, UnsupportedCodecError, clip_draws

from support.videos import FPS, H, W, clip_errors, encode, reference_frames, write_videos

av = pytest.importorskip("av")


@pytest.fixture(scope="module")
def videos(tmp_path_factory) -> tuple[str, dict[str, bytes]]:
    prefix = str(tmp_path_factory.mktemp("videos") / "ds")
    members = [encode(14 + 3 * i, seed=i) for i in range(8)]
    write_videos(prefix, members)
    return prefix, {f"shards/000000.tar/v{i:03d}": m for i, m in enumerate(members)}


@pytest.mark.parametrize("py_workers", [0, 1])
def test_clip_frames_equal_a_pyav_decode_of_the_same_frames(videos, py_workers):
    prefix, members = videos
    loader = Loader(
        prefix, batch_size=4, fields={"video": "webm;mp4"}, frames=3, stride=2, image_size=H,
        seed=1, py_workers=py_workers,
    )  # fmt: skip
    seen = 0
    for batch in loader:
        assert batch["video"].shape == (4, 3, 3, H, H) and batch["video"].dtype == torch.float32
        for clip, start_s, key in zip(batch["video"], batch["video_start"], batch["__key__"],
                                      strict=True):  # fmt: skip
            ref = reference_frames(members[key])
            start = round(float(start_s) * FPS)
            assert start >= 0 and start + 4 < len(ref)
            for k, errors in enumerate(clip_errors(clip, ref, 3)):  # centre crops
                # within 3 levels of PyAV's decode (colour conversion), and nearest to the
                # very frame asked for: the clip holds the frames start, start+2, start+4
                assert errors[start + 2 * k] < 3.0, (key, k, errors[start + 2 * k])
                assert int(np.argmin(errors)) == start + 2 * k
            seen += 1
    assert seen == 8


def test_clips_are_placed_by_seed_and_epoch_and_resume_exactly(videos):
    prefix, _ = videos

    def starts(loader, batches=None):
        out = []
        for i, b in enumerate(loader):
            out += list(zip(b["__key__"], b["video_start"].tolist(), strict=True))
            if batches is not None and i + 1 == batches:
                break
        return out

    kw = dict(batch_size=2, fields={"video": "webm"}, frames=2, stride=3, image_size=16,
              seed=5, py_workers=0)  # fmt: skip
    full = starts(Loader(prefix, **kw))
    assert full == starts(Loader(prefix, **kw))
    other = Loader(prefix, **kw)
    other.set_epoch(1)
    assert starts(other) != full  # another epoch, other clips
    first = Loader(prefix, **kw)
    head = starts(first, batches=2)
    state = first.state_dict()
    resumed = Loader(prefix, **kw)
    resumed.load_state_dict(state)
    assert head + starts(resumed) == full
    draws = clip_draws(5, 0, np.arange(1000))
    assert draws.min() >= 0 and draws.max() < 1 and abs(draws.mean() - 0.5) < 0.05


def test_center_clips_take_the_middle_of_each_video(videos):
    prefix, members = videos
    loader = Loader(prefix, batch_size=8, fields={"video": "webm"}, frames=4, stride=1,
                    clip="center", image_size=16)  # fmt: skip
    batch = next(iter(loader))
    for key, start_s in zip(batch["__key__"], batch["video_start"].tolist(), strict=True):
        n = len(reference_frames(members[key]))
        assert round(start_s * FPS) == (n - 4) // 2


def test_a_corrupt_or_truncated_video_is_named(tmp_path):
    good = encode(12)
    prefix = str(tmp_path / "ds")
    write_videos(prefix, [good, good[: len(good) // 3], good])
    loader = Loader(prefix, batch_size=3, fields={"video": "webm"}, frames=2, image_size=16,
                    shuffle=False)  # fmt: skip
    named = r"sample 'v001' field 'video': (not a readable video|the video has \d+ frames)"
    with pytest.raises(CorruptShardError, match=named):
        list(loader)
    prefix2 = str(tmp_path / "ds2")
    write_videos(prefix2, [good, b"this is not a video at all" * 10])
    loader2 = Loader(prefix2, batch_size=2, fields={"video": "webm"}, frames=2, image_size=16,
                     shuffle=False)  # fmt: skip
    with pytest.raises(CorruptShardError, match=r"sample 'v001' field 'video': not a readable"):
        list(loader2)


def test_a_video_shorter_than_one_clip_is_named(tmp_path):
    prefix = str(tmp_path / "ds")
    write_videos(prefix, [encode(12), encode(5)])
    loader = Loader(prefix, batch_size=2, fields={"video": "webm"}, frames=4, stride=2,
                    image_size=16, shuffle=False)  # fmt: skip
    with pytest.raises(CorruptShardError, match=r"sample 'v001' field 'video': the video has 5 "
                       r"frames; a clip of 4 frames at stride 2 needs 7"):  # fmt: skip
        list(loader)


def test_h264_on_a_cpu_decode_names_the_codec_and_what_decodes_it(tmp_path):
    if "libx264" not in av.codecs_available:
        pytest.skip("this PyAV has no H.264 encoder")
    prefix = str(tmp_path / "ds")
    write_videos(prefix, [encode(12, codec="libx264", fmt="mp4")], ext="mp4")
    loader = Loader(prefix, batch_size=1, fields={"video": "mp4"}, frames=2, image_size=16,
                    device="cpu")  # fmt: skip
    named = (
        r"codec 'h264' cannot be decoded on the CPU \(DALI decodes vp8, vp9, mjpeg there\); "
        r"h264 decodes with NVDEC"
    )
    with pytest.raises(UnsupportedCodecError, match=named):
        list(loader)


def test_bad_video_options_are_clear_errors(videos):
    prefix, _ = videos
    with pytest.raises(ValueError, match=r"video field\(s\) \['video'\] need frames="):
        Loader(prefix, batch_size=2, fields={"video": "webm"})
    with pytest.raises(ValueError, match=r"frames= needs a video field"):
        Loader(prefix, batch_size=2, fields={"image": "jpg"}, frames=4)
    with pytest.raises(ValueError, match=r"stride must be an integer >= 1, got 0"):
        ClipOptions(4, 0)
    with pytest.raises(
        ValueError, match=r"clip must be 'random', 'uniform' or 'center', got 'middle'"
    ):
        Loader(prefix, batch_size=2, fields={"video": "webm"}, frames=2, clip="middle")


def test_a_folder_of_videos_ingests_with_probed_metadata_and_counted_skips(tmp_path, ray_session):
    import json

    from flashfeed.dataset import Dataset
    from flashfeed.ingest import IngestConfig, run

    src = tmp_path / "src"
    (src / "walks").mkdir(parents=True)
    lengths = [12, 15, 18]
    for i, n in enumerate(lengths):
        (src / "walks" / f"clip{i}.webm").write_bytes(encode(n, seed=i))
    (src / "walks" / "broken.webm").write_bytes(encode(12)[:200])  # truncated
    (src / "empty.mp4").write_bytes(b"")  # zero-length
    (src / "notes.txt").write_text("not a video")
    result = run(
        IngestConfig(source=str(src), dest=str(tmp_path / "out"), samples_per_shard=2,
                     progress="none", shuffle=False)
    )  # fmt: skip
    m = result.manifest
    assert m.source["format"] == "videofolder"
    assert m.skipped == {"undecodable_video": 2}
    assert m.schema == {  # the fields the listing found, the empty mp4's too
        "mp4": "video/mp4", "mp4.json": "application/json",
        "webm": "video/webm", "webm.json": "application/json",
    }  # fmt: skip
    ds = Dataset.open(str(tmp_path / "out"))
    metas = sorted((json.loads(f["webm.json"]) for _, f in ds), key=lambda d: d["frames"])
    assert [d["frames"] for d in metas] == lengths
    assert all(d["codec"] == "vp9" and d["fps"] == FPS for d in metas)
    assert all((d["width"], d["height"]) == (W, H) for d in metas)
    assert [d["duration"] for d in metas] == [n / FPS for n in lengths]
    # the metadata is a JSON field away for the loader, beside the clips
    loader = Loader(str(tmp_path / "out"), batch_size=3, image_size=16, frames=4,
                    fields={"video": "webm", "frames": "webm.json:frames"})  # fmt: skip
    batch = next(iter(loader))
    assert sorted(batch["frames"].tolist()) == lengths
    assert batch["video"].shape == (3, 4, 3, 16, 16)
