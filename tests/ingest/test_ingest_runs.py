"""Whole ingest runs: determinism, refusal to overwrite, skips and rejects, hostile tars,
dedup across shards, tokenization, and the CLI's --json summary."""

from __future__ import annotations

import io
import json
import struct
import tarfile
import zlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from flashfeed import Dataset, DatasetExistsError, storage
from flashfeed.cli import main as cli_main
from flashfeed.ingest import IngestConfig, run
from flashfeed.ingest.samplecorpus import jpeg_bytes, make_imagefolder, make_text_jsonl
from flashfeed.ingest.sources.tfrecord_format import encode_example, frame_record

pytestmark = pytest.mark.usefixtures("ray_session")


def _objects(prefix: str) -> dict[str, bytes]:
    return {url[len(prefix) :]: storage.read_bytes(url) for url in storage.list_files(prefix)}


def test_two_runs_give_identical_bytes(tmp_path: Path, s3_prefix: str) -> None:
    make_imagefolder(tmp_path / "src", classes=2, per_class=9)
    for dest in ("a", "b"):
        run(
            IngestConfig(
                source=str(tmp_path / "src"),
                dest=f"{s3_prefix}/{dest}",
                name="same",
                shard_size="8KB",
                seed=3,
                validate=True,
                max_image_side=40,
                jpeg_quality=85,
                progress="none",
            )
        )
    a, b = _objects(f"{s3_prefix}/a"), _objects(f"{s3_prefix}/b")
    assert a == b
    assert "/manifest.json" in a and not any("/_work/" in k for k in a)
    assert len([k for k in a if k.endswith(".tar")]) >= 2


def test_committed_dest_is_refused_unless_overwrite(tmp_path: Path, s3_prefix: str) -> None:
    make_imagefolder(tmp_path / "src", classes=1, per_class=3)
    cfg = dict(source=str(tmp_path / "src"), dest=s3_prefix, progress="none")
    run(IngestConfig(**cfg))
    before = storage.read_bytes(f"{s3_prefix}/manifest.json")
    with pytest.raises(DatasetExistsError, match="--overwrite"):
        run(IngestConfig(**cfg, seed=1))
    assert storage.read_bytes(f"{s3_prefix}/manifest.json") == before
    run(IngestConfig(**cfg, seed=1, samples_per_shard=1, overwrite=True))
    assert len(Dataset.open(s3_prefix).shards) == 3


def _bomb_png() -> bytes:
    ihdr = struct.pack(">IIBBBBB", 50_000, 50_000, 8, 0, 0, 0, 0)
    chunk = b"IHDR" + ihdr
    end = struct.pack(">I", 0) + b"IEND" + struct.pack(">I", zlib.crc32(b"IEND"))
    return (
        b"\x89PNG\r\n\x1a\n"
        + struct.pack(">I", len(ihdr))
        + chunk
        + struct.pack(">I", zlib.crc32(chunk))
        + end
    )


def test_every_skip_reason_is_counted_and_listed(tmp_path: Path, s3_prefix: str) -> None:
    rng = np.random.default_rng(1)
    media = tmp_path / "src" / "media"
    media.mkdir(parents=True)
    good = [jpeg_bytes(rng) for _ in range(4)]
    for i, b in enumerate(good):
        (media / f"ok{i}.jpg").write_bytes(b)
    (media / "dup.jpg").write_bytes(good[0])
    (media / "broken.jpg").write_bytes(good[1][:200])
    (media / "bomb.png").write_bytes(_bomb_png())
    rows = [{"image": f"media/ok{i}.jpg", "text": f"ok {i}"} for i in range(4)]
    rows += [
        {"image": "media/dup.jpg", "text": "ok 0"},
        {"image": "media/broken.jpg", "text": "broken"},
        {"image": "media/bomb.png", "text": "bomb"},
        {"image": "media/nowhere.jpg", "text": "missing"},
    ]
    (tmp_path / "src" / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "text").mkdir()
    texts = [{"text": t} for t in ["keep me", "   ", "\u00a0\n", "me too"]]
    texts.append({"text": "bad label", "label": "seven"})
    (tmp_path / "text" / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in texts))
    result = run(
        IngestConfig(
            source=str(tmp_path / "src" / "rows.jsonl"),
            dest=f"{s3_prefix}/img",
            validate=True,
            dedup=True,
            samples_per_shard=2,
            progress="none",
        )
    )
    assert result.manifest.skipped == {
        "duplicate": 1,
        "missing_media": 1,
        "too_many_pixels": 1,
        "undecodable": 1,
    }
    assert result.manifest.num_samples == 4
    rejects = [
        json.loads(line)
        for line in storage.read_bytes(f"{s3_prefix}/img/rejects.jsonl").decode().splitlines()
    ]
    by_reason = {r["reason"]: r for r in rejects}
    assert by_reason["duplicate"]["source"].endswith("rows.jsonl:5")
    assert "rows.jsonl:1" in by_reason["duplicate"]["detail"]
    assert by_reason["undecodable"]["source"].endswith("rows.jsonl:6")
    assert "nowhere.jpg" in by_reason["missing_media"]["detail"]
    text = run(
        IngestConfig(source=str(tmp_path / "text"), dest=f"{s3_prefix}/txt", progress="none")
    )
    assert text.manifest.skipped == {"bad_value": 1, "empty_text": 2}
    assert sorted(f["txt"] for _, f in Dataset.open(f"{s3_prefix}/txt")) == [b"keep me", b"me too"]


def test_bad_tfrecord_crc_is_skipped_and_counted(tmp_path: Path, s3_prefix: str) -> None:
    recs = [frame_record(encode_example({"text": f"r{i}".encode()})) for i in range(3)]
    bad = bytearray(recs[1])
    bad[14] ^= 0xFF
    (tmp_path / "x.tfrecord").write_bytes(recs[0] + bytes(bad) + recs[2])
    result = run(IngestConfig(source=str(tmp_path / "x.tfrecord"), dest=s3_prefix, progress="none"))
    assert result.manifest.skipped == {"bad_crc": 1}
    assert sorted(f["txt"] for _, f in Dataset.open(s3_prefix)) == [b"r0", b"r2"]


def _hostile_tar() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:

        def add(name: str, data: bytes = b"x", **kw: object) -> None:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            for k, v in kw.items():
                setattr(info, k, v)
            tar.addfile(info, io.BytesIO(data) if info.isfile() else None)

        add("good/s0.txt", b"fine")
        add("/etc/evil.txt")
        add("../up/escape.txt")
        add("link.txt", b"", type=tarfile.SYMTYPE, linkname="/etc/passwd", size=0)
        add("dev.txt", b"", type=tarfile.CHRTYPE, devmajor=1, devminor=3, size=0)
        add("good/s1.txt", b"also fine")
    return buf.getvalue()


def test_hostile_tar_members_are_rejected_by_name(tmp_path: Path, s3_prefix: str) -> None:
    storage.write_bytes(f"{s3_prefix}/src/000.tar", _hostile_tar())
    result = run(IngestConfig(source=f"{s3_prefix}/src", dest=f"{s3_prefix}/ds", progress="none"))
    assert result.manifest.skipped == {"hostile_member": 4}
    assert sorted(f["txt"] for _, f in Dataset.open(f"{s3_prefix}/ds")) == [b"also fine", b"fine"]
    details = storage.read_bytes(f"{s3_prefix}/ds/rejects.jsonl").decode()
    for member in ("/etc/evil.txt", "../up/escape.txt", "link.txt", "dev.txt"):
        assert repr(member) in details.replace('\\"', '"')
    assert "link to '/etc/passwd'" in details


def test_dedup_is_across_shards_and_deterministic(tmp_path: Path, s3_prefix: str) -> None:
    src = make_imagefolder(tmp_path / "src", classes=2, per_class=6)
    # the same photo filed under both classes, and twice in one: 3 duplicates
    (src / "class_01" / "copy_a.jpg").write_bytes((src / "class_00" / "img_0000.jpg").read_bytes())
    (src / "class_01" / "copy_b.jpg").write_bytes((src / "class_00" / "img_0001.jpg").read_bytes())
    (src / "class_00" / "zz.jpg").write_bytes((src / "class_00" / "img_0002.jpg").read_bytes())
    outs = []
    for d in ("a", "b"):
        r = run(
            IngestConfig(
                source=str(src),
                dest=f"{s3_prefix}/{d}",
                name="x",
                dedup=True,
                samples_per_shard=2,
                progress="none",
            )
        )
        outs.append(_objects(f"{s3_prefix}/{d}"))
        assert r.manifest.skipped == {"duplicate": 3} and r.manifest.num_samples == 12
    assert outs[0] == outs[1]
    images = [f["jpg"] for _, f in Dataset.open(f"{s3_prefix}/a")]
    assert len(set(images)) == len(images) == 12


def _tiny_tokenizer(path: Path, texts: list[str], vocab: int) -> str:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(
        texts, trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<unk>", "</s>"])
    )
    tok.save(str(path))
    return str(path)


def test_tokenized_arrow_rows_packed_with_eos(tmp_path: Path, s3_prefix: str) -> None:
    from tokenizers import Tokenizer

    src = make_text_jsonl(tmp_path / "c.jsonl", rows=60)
    texts = [json.loads(line)["text"] for line in src.read_text().splitlines()]
    tok_path = _tiny_tokenizer(tmp_path / "tok.json", texts, vocab=120)
    result = run(
        IngestConfig(
            source=str(src),
            dest=s3_prefix,
            format="arrow",
            tokenizer=tok_path,
            seq_len=16,
            samples_per_shard=30,
            shuffle=False,
            progress="none",
        )
    )
    m = result.manifest
    assert m.schema["tokens"] == "fixed_size_list<item: uint16>[16]"
    assert m.requires == ("token-documents",) and m.format_version == 3
    tok = Tokenizer.from_file(tok_path)
    eos = tok.token_to_id("</s>")
    assert m.extra["tokens"]["eos_id"] == eos and m.extra["tokens"]["dtype"] == "uint16"
    ds = Dataset.open(s3_prefix)
    table = pa.ipc.open_file(pa.py_buffer(ds.read_shard(0))).read_all()
    assert table.schema.field("tokens").type == pa.list_(pa.uint16(), 16)
    flat = np.asarray(table.column("tokens").combine_chunks().flatten())
    expected: list[int] = []
    for t in texts[:30]:
        expected += [*tok.encode(t, add_special_tokens=False).ids, eos]
    # concatenation: the documents one after the other; the last row padded, nothing dropped
    pad = m.extra["tokens"]["pad_id"]
    assert flat.tolist() == expected + [pad] * (len(flat) - len(expected))
    assert len(flat) - len(expected) < 16
    assert m.extra["tokens"]["padding_tokens"] == 16 * m.num_samples - m.extra["tokens"]["tokens"]
    assert m.extra["tokens"]["truncated_tokens"] == 0


def test_cli_json_summary(
    tmp_path: Path, s3_prefix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    make_imagefolder(tmp_path / "src", classes=2, per_class=3)
    rc = cli_main(
        ["ingest", str(tmp_path / "src"), s3_prefix, "--samples-per-shard", "4", "--json"]
    )
    assert rc == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["shards"] == 2 and summary["samples"] == 6 and summary["skipped"] == {}
    assert cli_main(["ingest", str(tmp_path / "src"), s3_prefix, "--json"]) == 1
    assert "already exists" in capsys.readouterr().err
    assert cli_main(["ingest", str(tmp_path / "nothing"), f"{s3_prefix}-x"]) == 1
    assert "does not exist" in capsys.readouterr().err
