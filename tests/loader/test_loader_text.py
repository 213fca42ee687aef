"""Image-text samples through the DALI Loader: captions as str or token ids with a mask, JSON
values by key, shards written by webdataset and by the webdataset test data, and every bad
caption or JSON member named by shard and sample."""

from __future__ import annotations

import gzip
import io
import json
import shutil
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from flashfeed.cli import main
from flashfeed.errors import CorruptShardError
from flashfeed.format.manifest import Manifest, commit_manifest
from flashfeed.loader import Loader
from flashfeed.shardio import shard_name, write_tar_shard

WORDS = ["a", "red", "cat", "sits", "on", "the", "old", "green", "mat", "near", "two",
         "small", "dogs", "under", "one", "tall", "tree"]  # fmt: skip


def _jpeg(value: int, size: int = 8) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.full((size, size, 3), value, np.uint8)).save(buf, format="JPEG")
    return buf.getvalue()


def caption_of(key: str) -> str:
    """A caption that names its sample (so every batch proves the pairing), of a length that
    varies with it, with a non-ASCII word."""
    n = int(key.rsplit("-", 1)[1])
    return f"{key} " + " ".join(WORDS[(n + j) % len(WORDS)] for j in range(n % 9)) + " café"


def meta_of(key: str) -> dict:
    n = int(key.rsplit("-", 1)[1])
    return {"id": n, "score": n / 4, "source": {"url": f"http://x/{n}"}}


def write_dataset(prefix: str, sizes: list[int], **override) -> list[str]:
    """Shards of jpg + txt + json samples keyed ``s<shard>-<n>``; ``override`` maps a key to
    the members that replace (value bytes) or drop (value None) the default ones."""
    infos, keys, n = [], [], 0
    img = _jpeg(90)
    for i, count in enumerate(sizes):
        samples = []
        for _ in range(count):
            key = f"s{i}-{n:04d}"
            members = {
                "jpg": img,
                "txt": caption_of(key).encode(),
                "json": json.dumps(meta_of(key)).encode(),
            }
            for ext, value in override.get(key, {}).items():
                if value is None:
                    members.pop(ext)
                else:
                    members[ext] = value
            samples.append((key, members))
            keys.append(key)
            n += 1
        infos.append(write_tar_shard(prefix, shard_name(i, "tar"), samples))
    commit_manifest(
        prefix, Manifest(name="pairs", shard_format="webdataset", schema={}, shards=tuple(infos))
    )
    return keys


def tiny_tokenizer(path: Path, texts: list[str], *, pad: bool = True) -> str:
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    special = ["<unk>", "<s>", "</s>"] + (["<pad>"] if pad else [])
    tok.train_from_iterator(texts, trainers.WordLevelTrainer(special_tokens=special))
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>",
        special_tokens=[("<s>", tok.token_to_id("<s>")), ("</s>", tok.token_to_id("</s>"))],
    )
    tok.save(str(path))
    return str(path)


FIELDS = {"image": "jpg", "caption": "txt", "id": "json:id", "score": "json:score"}


@pytest.fixture(scope="module")
def pairs(tmp_path_factory) -> tuple[str, list[str]]:
    prefix = str(tmp_path_factory.mktemp("pairs") / "ds")
    return prefix, write_dataset(prefix, [23, 17, 20])


@pytest.mark.parametrize("py_workers", [0, 1])
def test_captions_and_json_values_come_out_beside_their_images(pairs, py_workers):
    prefix, keys = pairs
    fields = {**FIELDS, "url": "json:source.url"}
    kw = dict(batch_size=8, image_size=8, fields=fields, seed=4, py_workers=py_workers)
    loader = Loader(prefix, **kw)
    seen = []
    for batch in loader:
        names = [k.rsplit("/", 1)[1] for k in batch["__key__"]]
        assert batch["image"].shape == (8, 3, 8, 8)
        assert batch["caption"] == [caption_of(k) for k in names]
        assert batch["id"].dtype == torch.int64
        assert batch["id"].tolist() == [meta_of(k)["id"] for k in names]
        assert batch["score"].dtype == torch.float64
        assert batch["score"].tolist() == [meta_of(k)["score"] for k in names]
        assert batch["url"] == [meta_of(k)["source"]["url"] for k in names]
        seen += names
    assert len(seen) == 56 and len(set(seen)) == 56 and set(seen) <= set(keys)
    assert seen != sorted(seen)  # shuffled, and still paired


def test_tokenized_captions_follow_the_pad_and_truncate_rule(pairs, tmp_path):
    from tokenizers import Tokenizer

    prefix, keys = pairs
    path = tiny_tokenizer(tmp_path / "tok.json", [caption_of(k) for k in keys])
    ref = Tokenizer.from_file(path)
    pad = ref.token_to_id("<pad>")
    max_len = 7  # the longest caption has 2 + 1 + 8 + 1 tokens: some are cut, some padded
    loader = Loader(
        prefix, batch_size=10, image_size=8, fields=FIELDS, tokenizer=path, max_len=max_len,
        shuffle=False, drop_last=False, py_workers=1,
    )  # fmt: skip
    cut = padded = 0
    for batch in loader:
        ids, mask = batch["caption"], batch["caption_mask"]
        assert ids.dtype == mask.dtype == torch.int64 and ids.shape[1] == max_len
        for row, m, key in zip(ids.tolist(), mask.tolist(), batch["__key__"], strict=True):
            full = ref.encode(caption_of(key.rsplit("/", 1)[1])).ids
            n = min(len(full), max_len)
            assert m == [1] * n + [0] * (max_len - n)
            assert row[n:] == [pad] * (max_len - n)
            if len(full) > max_len:  # truncation keeps the end token: room is made for it
                cut += 1
                assert row[0] == full[0] and row[-1] == ref.token_to_id("</s>")
            else:
                padded += 1
                assert row[:n] == full
    assert cut and padded


def test_a_tokenizer_without_a_pad_token_pads_with_zero(pairs, tmp_path):
    prefix, keys = pairs
    path = tiny_tokenizer(tmp_path / "tok.json", [caption_of(k) for k in keys], pad=False)
    loader = Loader(
        prefix, batch_size=4, image_size=8, fields={"image": "jpg", "text": "txt"},
        tokenizer=path, max_len=40, shuffle=False, py_workers=0,
    )  # fmt: skip
    batch = next(iter(loader))
    short = batch["text_mask"].sum(1)
    assert (short < 40).all()
    assert all((row[n:] == 0).all() for row, n in zip(batch["text"], short.tolist(), strict=True))


def test_webdataset_shardwriter_pairs_load_in_two_lines_after_index(tmp_path):
    import webdataset as wds

    out = tmp_path / "laion"
    out.mkdir()
    rows = [
        {"__key__": f"{i:06d}", "jpg": _jpeg(i * 5), "txt": f"photo {i} of a thing",
         "json": json.dumps({"width": 8, "height": 8, "similarity": i / 100})}
        for i in range(30)
    ]  # fmt: skip
    with wds.ShardWriter(str(out / "%05d.tar"), maxcount=12, verbose=0) as w:
        for r in rows:
            w.write(r)
    assert main(["index", str(out)]) == 0

    loader = Loader(str(out), batch_size=6, fields={"image": "jpg", "caption": "txt",
                                                     "similarity": "json:similarity"})  # fmt: skip
    got = {}
    for batch in loader:
        for k, c, s in zip(
            batch["__key__"], batch["caption"], batch["similarity"].tolist(), strict=True
        ):
            got[k.rsplit("/", 1)[1]] = (c, s)
    theirs = {
        s["__key__"]: (s["txt"], s["json"]["similarity"])
        for s in wds.WebDataset(str(out / "{00000..00002}.tar"), shardshuffle=False).decode()
    }
    assert got == theirs and len(got) == 30


def test_realdata_png_and_cls_pairs_read_as_webdataset_decodes_them(realdata, tmp_path):
    """The webdataset test corpus (``sample.tgz``: png + cls), unpacked and adopted by
    ``flashfeed index``: each decoded png beside its own label, in the shard's order."""
    import webdataset as wds

    src = realdata / "webdataset-testdata" / "sample.tgz"
    out = tmp_path / "sample"
    out.mkdir()
    (out / "sample.tar").write_bytes(gzip.decompress(src.read_bytes()))
    assert main(["index", str(out)]) == 0

    def decoded(nodes):
        from nvidia.dali import fn, types

        return {"image": fn.decoders.image(nodes["image"], output_type=types.GRAY),
                "label": nodes["label"]}  # fmt: skip

    loader = Loader(
        str(out), batch_size=16, fields={"image": "png", "label": "cls"}, pipeline=decoded,
        shuffle=False, drop_last=False,
    )  # fmt: skip
    got = [
        (k.rsplit("/", 1)[1], int(label), img.numpy().squeeze(-1))
        for b in loader
        for k, label, img in zip(b["__key__"], b["label"], b["image"], strict=True)
    ]
    theirs = list(wds.WebDataset(str(src), shardshuffle=False).decode("l8"))
    assert len(got) == len(theirs) == 90
    for (key, label, img), s in zip(got, theirs, strict=True):
        assert (key, label) == (s["__key__"], s["cls"])
        assert np.array_equal(img, s["png"])  # png is lossless: the same pixels


def test_realdata_gzipped_text_members_read_and_tokenize(realdata, tmp_path):
    """``testgz.tar`` of the webdataset test data: 1000 ``.txt.gz`` documents, read as a
    caption field (gunzipped) through a pipeline with no image."""
    src = realdata / "webdataset-testdata" / "testgz.tar"
    out = tmp_path / "gz"
    out.mkdir()
    shutil.copy(src, out / "testgz.tar")
    (out / "testgz.tar").chmod(0o644)
    assert main(["index", str(out)]) == 0
    with tarfile.open(src) as tar:
        texts = {
            m.name.split(".", 1)[0]: gzip.decompress(tar.extractfile(m).read()).decode()  # type: ignore[union-attr]
            for m in tar.getmembers()
        }

    def passthrough(nodes):
        return {"text": nodes["text"]}

    loader = Loader(str(out), batch_size=100, fields={"text": "txt.gz"}, pipeline=passthrough)
    got = {
        k.rsplit("/", 1)[1]: t for b in loader for k, t in zip(b["__key__"], b["text"], strict=True)
    }
    assert got == texts

    path = tiny_tokenizer(tmp_path / "tok.json", list(texts.values()))
    tok_loader = Loader(
        str(out), batch_size=100, fields={"text": "txt.gz"}, tokenizer=path, max_len=64,
        pipeline=lambda nodes: {"ids": nodes["text"], "mask": nodes["text_mask"]},
    )  # fmt: skip
    batch = next(iter(tok_loader))
    assert batch["ids"].shape == batch["mask"].shape == (100, 64)
    assert 0 < batch["mask"].float().mean() <= 1


def test_a_caption_that_is_not_utf8_is_named(tmp_path):
    prefix = str(tmp_path / "ds")
    write_dataset(prefix, [12], **{"s0-0005": {"txt": b"caf\xe9 latin-1"}})
    loader = Loader(prefix, batch_size=4, image_size=8, fields=FIELDS, shuffle=False)
    with pytest.raises(
        CorruptShardError,
        match=r"shards/000000\.tar sample 's0-0005' field 'caption': caption \.txt is not "
        r"UTF-8 \(byte 3 of 12: b'\\xe9'\)",
    ):
        list(loader)


@pytest.mark.parametrize("py_workers", [0, 1])
def test_a_missing_caption_is_named_unless_optional_then_none_and_counted(tmp_path, py_workers):
    prefix = str(tmp_path / "ds")
    drop = {f"s0-{n:04d}": {"txt": None} for n in (2, 7, 8)}
    write_dataset(prefix, [12], **drop)
    kw = dict(batch_size=4, image_size=8, fields=FIELDS, shuffle=False, py_workers=py_workers)
    missing = (
        r"sample 's0-0002' has no txt member for field 'caption' \(it has \['jpg', 'json'\]\); "
        r"pass optional=\['caption'\]"
    )
    with pytest.raises(CorruptShardError, match=missing):
        list(Loader(prefix, **kw))
    loader = Loader(prefix, optional=["caption"], **kw)
    captions = [c for b in loader for c in b["caption"]]
    assert [n for n, c in enumerate(captions) if c is None] == [2, 7, 8]
    assert captions[0] == caption_of("s0-0000")
    assert loader.stats()["missing"] == {"caption": 3}


def test_a_missing_optional_caption_tokenizes_to_padding(tmp_path):
    prefix = str(tmp_path / "ds")
    keys = write_dataset(prefix, [8], **{"s0-0001": {"txt": None}})
    path = tiny_tokenizer(tmp_path / "tok.json", [caption_of(k) for k in keys])
    loader = Loader(
        prefix, batch_size=4, image_size=8, fields=FIELDS, optional=["caption"], tokenizer=path,
        max_len=12, shuffle=False,
    )  # fmt: skip
    from tokenizers import Tokenizer

    first = len(Tokenizer.from_file(path).encode(caption_of("s0-0000")).ids)
    batch = next(iter(loader))
    assert batch["caption_mask"].sum(1).tolist()[:2] == [first, 0]
    assert first > 2 and loader.stats()["missing"] == {"caption": 0}  # tokens hide it


def test_a_json_member_without_the_key_is_named_unless_optional(tmp_path):
    prefix = str(tmp_path / "ds")
    write_dataset(prefix, [8], **{"s0-0006": {"json": b'{"id": 6}'}})
    kw = dict(batch_size=4, image_size=8, fields=FIELDS, shuffle=False)
    with pytest.raises(
        CorruptShardError,
        match=r"sample 's0-0006': \.json has no key 'score' for field 'score' \(it has \['id'\]\)",
    ):
        list(Loader(prefix, **kw))
    loader = Loader(prefix, optional=["score"], **kw)
    scores = [b["score"] for b in loader]
    assert scores[0].tolist() == [0.0, 0.25, 0.5, 0.75]
    assert scores[1] == [1.0, 1.25, None, 1.75]  # a list where a value is missing
    assert loader.stats()["missing"] == {"score": 1}


def test_a_json_member_that_is_not_json_is_named(tmp_path):
    prefix = str(tmp_path / "ds")
    write_dataset(prefix, [4], **{"s0-0003": {"json": b"{not json"}})
    with pytest.raises(CorruptShardError, match=r"sample 's0-0003': \.json is not JSON"):
        list(Loader(prefix, batch_size=4, image_size=8, fields=FIELDS, shuffle=False))


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"optional": ["nope"]}, r"optional must name fields of fields= .*'nope'"),
        ({"optional": "caption"}, r"optional must name fields"),
        ({"tokenizer": "/no/such/tokenizer.json"}, r"cannot load tokenizer '/no/such"),
        ({"tokenizer": 3}, r"tokenizer must be a tokenizer.json path"),
        ({"fields": {"image": "jpg", "x": "json:"}}, r"field 'x': a JSON value is one"),
        ({"fields": {"image": "jpg", "x": "json:a;json:b"}}, r"field 'x': a JSON value is one"),
    ],
)
def test_bad_text_options_are_clear_errors(pairs, kwargs, match):
    kw = {"fields": FIELDS, **kwargs}
    with pytest.raises(ValueError, match=match):
        Loader(pairs[0], batch_size=4, **kw)


def test_tokenizer_options_are_checked(pairs, tmp_path):
    prefix, keys = pairs
    path = tiny_tokenizer(tmp_path / "tok.json", [caption_of(k) for k in keys])
    with pytest.raises(ValueError, match="max_len must be >= 1, got 0"):
        Loader(prefix, batch_size=4, fields=FIELDS, tokenizer=path, max_len=0)
    with pytest.raises(ValueError, match=r"tokenizer= needs a text field"):
        Loader(prefix, batch_size=4, fields={"image": "jpg"}, tokenizer=path)


def test_the_readme_pairs_example_runs(tmp_path):
    import ast
    import re
    import subprocess
    import sys

    from support import REPO

    blocks = re.findall(r"```python\n(.*?)```", (REPO / "README.md").read_text(), flags=re.S)
    (pairs,) = [b for b in blocks if "ShardWriter" in b]
    (buckets,) = [b for b in blocks if "bucket_report()" in b]  # it reads the pairs' dataset
    script = tmp_path / "pairs.py"
    script.write_text(pairs + buckets + "print(loader.bucket_report()['buckets'][0])\n")
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    pairs_line = next(x for x in lines if x.startswith("torch.Size([8, 3, 32, 32]) ['photo "))
    assert pairs_line.endswith("torch.float64")
    # the 64x48 images (4:3) go to the 32x48 bucket (3:2): scaled to 48x36, a ninth cropped
    first = ast.literal_eval(lines[-1])
    assert first["shape"] == [32, 48] and (first["samples"], first["batches"]) == (40, 5)
    assert first["crop_lost"] == pytest.approx(1 / 9)
