"""The datasets the stages read, written with flashfeed's own shard writers and committed:
photos scattered over tar shards as ingest does, random bytes (transfer only), small noisy
JPEGs (decode only) and random token rows; and photos in webdataset ``ShardWriter`` tars
adopted with ``flashfeed index``. Seeded: the same arguments give the same bytes."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from flashfeed import Dataset
from flashfeed.format.manifest import Manifest, commit_manifest
from flashfeed.shardio import shard_name, write_arrow_shard, write_tar_shard

__all__ = [
    "gnutar_dataset",
    "grain_jpegs",
    "image_dataset",
    "noise_jpeg_dataset",
    "random_dataset",
    "shardwriter_dataset",
    "token_dataset",
]

Prefix = str | os.PathLike[str]


def _check(**counts: int) -> None:
    for name, v in counts.items():
        if v < 1:
            raise ValueError(f"{name} must be >= 1, got {v}")


def image_dataset(
    prefix: Prefix,
    files: Sequence[tuple[Path, int]],
    shards: int,
    *,
    seed: int = 0,
    name: str = "bench",
    storage_options: dict[str, Any] | None = None,
    overwrite: bool = False,
) -> list[str]:
    """``files`` (``(jpeg, label)``) as a webdataset dataset of ``shards`` tar shards, samples
    scattered by a seeded permutation as ingest does; the shard paths."""
    _check(shards=shards)
    order = np.random.default_rng(seed).permutation(len(files))
    per = -(-len(files) // shards)
    base, infos = str(prefix), []
    for s in range(shards):
        samples = [
            (f"img-{i:07d}", {"jpg": files[i][0].read_bytes(), "cls": str(files[i][1]).encode()})
            for i in order[s * per : (s + 1) * per].tolist()
        ]
        info = write_tar_shard(base, shard_name(s, "tar"), samples, storage_options=storage_options)
        infos.append(info)
    m = Manifest(
        name=name, shard_format="webdataset", schema={"jpg": "image", "cls": "label"},
        shards=tuple(infos),
    )  # fmt: skip
    commit_manifest(base, m, storage_options=storage_options, overwrite=overwrite)
    return [f"{base.rstrip('/')}/{i.path}" for i in infos]


def random_dataset(
    prefix: str,
    shards: int,
    size: int,
    *,
    per_shard: int = 4,
    seed: int = 0,
    storage_options: dict[str, Any] | None = None,
) -> Dataset:
    """``shards`` tar shards of about ``size`` bytes of random data (``per_shard`` samples a
    shard): what moving bytes costs, with nothing to decode."""
    _check(shards=shards, size=size, per_shard=per_shard)
    rng = np.random.default_rng(seed)
    infos = []
    for i in range(shards):
        member = max(1, size // per_shard - 1024)
        samples = [(f"s{i:04d}-{j:04d}", {"bin": rng.bytes(member)}) for j in range(per_shard)]
        infos.append(
            write_tar_shard(prefix, shard_name(i, "tar"), samples, storage_options=storage_options)
        )
    m = Manifest(
        name="bench", shard_format="webdataset", schema={"bin": "bytes"}, shards=tuple(infos)
    )
    commit_manifest(prefix, m, storage_options=storage_options)
    return Dataset.open(prefix, storage_options=storage_options)


def noise_jpeg_dataset(
    prefix: Prefix,
    *,
    shards: int,
    per_shard: int,
    height: int,
    width: int,
    quality: int,
    tinted: bool = False,
) -> str:
    """Noisy JPEGs with ``.cls`` labels (sample ``n`` has label ``n % 10``): uniform noise, or
    with ``tinted`` one colour per image plus gaussian grain (about a real photo's decode
    cost at 400x300)."""
    from PIL import Image

    _check(shards=shards, per_shard=per_shard, height=height, width=width)
    rng = np.random.default_rng(0)
    base, infos, n = str(prefix), [], 0
    for i in range(shards):
        samples = []
        for j in range(per_shard):
            if tinted:
                px = rng.integers(0, 255, (1, 1, 3)) + rng.normal(0, 40, (height, width, 3))
                pixels = px.clip(0, 255).astype("uint8")
            else:
                pixels = rng.integers(0, 255, (height, width, 3), dtype=np.uint8)
            buf = io.BytesIO()
            Image.fromarray(pixels).save(buf, format="JPEG", quality=quality)
            samples.append(
                (f"s{i:04d}-{j:05d}", {"jpg": buf.getvalue(), "cls": str(n % 10).encode()})
            )
            n += 1
        infos.append(write_tar_shard(base, shard_name(i, "tar"), samples))
    m = Manifest(
        name="noise", shard_format="webdataset", schema={"jpg": "image", "cls": "label"},
        shards=tuple(infos),
    )  # fmt: skip
    commit_manifest(base, m)
    return base


def grain_jpegs(folder: Path, count: int, *, seed: int = 0) -> list[tuple[Path, int]]:
    """``count`` high-entropy JPEG files of about 200 KB (gaussian grain over one tint per
    image, a photo's 4:3 at 896-1152 px wide, quality 50) with labels ``n % 10``, written
    once under ``folder`` (kept when already there)."""
    from PIL import Image

    _check(count=count)
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for n in range(count):
        path = folder / f"grain{n:06d}.jpg"
        if not path.exists():
            rng = np.random.default_rng([seed, n])  # each file its own: the same bytes again
            width = int(rng.integers(896, 1153))
            height = width * 3 // 4
            tint = rng.integers(0, 255, (1, 1, 3))
            pixels = (tint + rng.normal(0, 40, (height, width, 3))).clip(0, 255)
            tmp = path.with_suffix(".tmp")
            Image.fromarray(pixels.astype("uint8")).save(tmp, format="JPEG", quality=50)
            os.replace(tmp, path)
        out.append((path, n % 10))
    return out


def token_dataset(prefix: Prefix, *, rows: int, seq_len: int, shards: int = 8) -> str:
    """``rows`` rows of ``seq_len`` random int32 tokens (vocabulary 50,000) in ``shards``
    Arrow shards, shard ``s`` drawn with seed ``s``; kept when already there."""
    import pyarrow as pa

    _check(rows=rows, seq_len=seq_len, shards=shards)
    base = str(prefix)
    if Path(base, "manifest.json").exists():
        return base
    per = rows // shards
    infos = []
    for s in range(shards):
        vals = np.random.default_rng(s).integers(0, 50000, per * seq_len, dtype=np.int32)
        table = pa.table({"tokens": pa.FixedSizeListArray.from_arrays(pa.array(vals), seq_len)})
        infos.append(write_arrow_shard(base, shard_name(s, "arrow"), table))
    m = Manifest(name="tok", shard_format="arrow", schema={"tokens": "int32"}, shards=tuple(infos))
    commit_manifest(base, m, overwrite=True)
    return base


#: seeded captions of the GNU tar layout are drawn from these
_CAPTION_WORDS = ("a", "photo", "of", "the", "red", "blue", "small", "large", "dog", "cat",
                  "tree", "house", "street", "river", "city")  # fmt: skip


def _adopt(out: Path) -> None:
    """Index the tars under ``out`` and commit their manifest (``flashfeed index``)."""
    cli = [sys.executable, "-m", "flashfeed.cli", "index", str(out), "--no-progress"]
    subprocess.run(cli, check=True)


def shardwriter_dataset(files: Sequence[tuple[Path, int]], out: Path, shard_mib: int) -> int:
    """``files`` in webdataset ``ShardWriter`` tars of ``shard_mib`` MiB, adopted with
    ``flashfeed index``; the number of shards (kept when already there)."""
    import webdataset as wds

    _check(shard_mib=shard_mib)
    if (out / "manifest.json").exists():
        return len(list(out.glob("*.tar")))
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    with wds.ShardWriter(str(out / "%06d.tar"), maxsize=shard_mib << 20, verbose=0) as sink:
        for i, (path, label) in enumerate(files):
            sink.write({"__key__": f"img{i:07d}", "jpg": path.read_bytes(), "cls": str(label)})
    _adopt(out)
    return len(list(out.glob("*.tar")))


def gnutar_dataset(files: Sequence[tuple[Path, int]], out: Path, shard_mb: int) -> int:
    """``files`` as img2dataset lays a sample out (``<key>.jpg``, a caption ``<key>.txt``,
    ``<key>.json`` of its metadata) in shards of about ``shard_mb`` MB written by GNU ``tar``
    from a folder, adopted with ``flashfeed index``; the number of shards (kept when already
    there). Seeded captions: the same files give the same bytes (up to tar's own times)."""
    import json

    _check(shard_mb=shard_mb)
    if (out / "manifest.json").exists():
        return len(list(out.glob("*.tar")))
    shutil.rmtree(out, ignore_errors=True)
    staging = out.with_name(out.name + ".files")
    shutil.rmtree(staging, ignore_errors=True)
    out.mkdir(parents=True)
    staging.mkdir(parents=True)
    rng = np.random.default_rng(7)
    names: list[str] = []
    size, shards = 0, 0
    try:
        for i, (path, _label) in enumerate(files):
            key = f"{i:09d}"
            caption = " ".join(rng.choice(_CAPTION_WORDS, size=int(rng.integers(5, 20))))
            data = path.read_bytes()
            meta = {"key": key, "caption": caption, "url": f"https://example.com/{path.name}",
                    "similarity": float(rng.random())}  # fmt: skip
            for ext, body in (("jpg", data), ("txt", caption.encode()),
                              ("json", json.dumps(meta).encode())):  # fmt: skip
                (staging / f"{key}.{ext}").write_bytes(body)
                names.append(f"{key}.{ext}")
            size += len(data)
            if size >= shard_mb * 1_000_000 or i == len(files) - 1:
                tar = ["tar", "--format=gnu", "-cf", str(out / f"{shards:05d}.tar")]
                subprocess.run([*tar, "-C", str(staging), *names], check=True)
                shards, size, names = shards + 1, 0, []
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    _adopt(out)
    return shards
