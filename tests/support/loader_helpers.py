"""Small datasets for the loader tests: tiny JPEGs with known labels, Arrow token shards."""

from __future__ import annotations

import io
import json

import numpy as np
import pyarrow as pa
from PIL import Image

from flashfeed.dataset import Dataset
from flashfeed.format.manifest import Manifest, commit_manifest
from flashfeed.shardio import shard_name, write_arrow_shard, write_tar_shard

__all__ = ["label_of", "make_image_dataset", "make_token_dataset"]


def label_of(key: str, classes: int) -> int:
    return int(key.rsplit("-", 1)[1]) % classes


def _jpeg(rng: np.random.Generator, label: int, size: int) -> bytes:
    base = np.full((size, size, 3), (label * 37) % 200, np.uint8)
    noise = rng.integers(0, 40, (size, size, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(base + noise).save(buf, format="JPEG", quality=80)
    return buf.getvalue()


def make_image_dataset(
    prefix: str,
    shard_sizes: list[int],
    *,
    classes: int = 10,
    size: int = 32,
    label_ext: str = "cls",
    sorted_classes: bool = False,
    storage_options: dict | None = None,
    overwrite: bool = False,
) -> Manifest:
    """Shards of JPEG samples keyed ``s<shard>-<n>``; label = n % classes (or the shard's
    class when ``sorted_classes``), as ``.cls`` text or ``.json``."""
    rng = np.random.default_rng(0)
    infos, n = [], 0
    jpegs = [_jpeg(rng, c, size) for c in range(classes)]
    for i, count in enumerate(shard_sizes):
        samples = []
        for _ in range(count):
            label = i % classes if sorted_classes else n % classes
            key = f"s{i:04d}-{n:06d}" if not sorted_classes else f"s{i:04d}-{n:06d}-{label}"
            enc = (
                str(label).encode() if label_ext == "cls" else json.dumps({"label": label}).encode()
            )
            samples.append((key, {"jpg": jpegs[label], label_ext: enc}))
            n += 1
        infos.append(
            write_tar_shard(prefix, shard_name(i, "tar"), samples, storage_options=storage_options)
        )
    manifest = Manifest(
        name="test-images",
        shard_format="webdataset",
        schema={"jpg": "image/jpeg", label_ext: "label"},
        shards=tuple(infos),
    )
    commit_manifest(prefix, manifest, storage_options=storage_options, overwrite=overwrite)
    return manifest


def make_token_dataset(
    prefix: str,
    shard_sizes: list[int],
    *,
    seq_len: int = 16,
    dtype: str = "int32",
    storage_options: dict | None = None,
    overwrite: bool = False,
    batch_bytes: int | None = 4 << 20,
) -> Manifest:
    """Arrow shards with a fixed-size ``tokens`` column; row n holds n, n+1, ... (so each
    sequence names its own global id) and ``__key__`` ``t<n>``; record batches of about
    ``batch_bytes`` (None: one per 8,192 rows, no layout recorded, as written before)."""
    infos, n = [], 0
    for i, count in enumerate(shard_sizes):
        ids = np.arange(n, n + count)
        values = (ids[:, None] * 7 + np.arange(seq_len)[None, :]).astype(dtype)
        tokens = pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), seq_len)
        table = pa.table({"__key__": [f"t{j:07d}" for j in ids], "tokens": tokens})
        infos.append(
            write_arrow_shard(
                prefix,
                shard_name(i, "arrow"),
                table,
                storage_options=storage_options,
                batch_bytes=batch_bytes,
            )
        )
        n += count
    manifest = Manifest(
        name="test-tokens",
        shard_format="arrow",
        schema={"__key__": "string", "tokens": f"fixed_size_list<{dtype}>[{seq_len}]"},
        shards=tuple(infos),
    )
    commit_manifest(prefix, manifest, storage_options=storage_options, overwrite=overwrite)
    return manifest


def run_epochs(loader, epochs, *, stop_after: int | None = None):
    """Iterate ``epochs`` with ``set_epoch``; return the state after ``stop_after`` batches of
    the first one (or after the last epoch) and how many batches were seen."""
    seen = 0
    for e in epochs:
        loader.set_epoch(e)
        for _ in loader:
            seen += 1
            if stop_after is not None and seen == stop_after:
                return loader.state_dict(), seen
    return loader.state_dict(), seen


def resume_scenario(factory, tmp_path, *, before: int, after: int, stop: int, epochs: int = 2):
    """Ledgers of one uninterrupted run on ``before`` ranks and of a run interrupted after
    ``stop`` batches of epoch 0 and resumed on ``after`` ranks: ``(full, resumed)``, each
    ``{epoch: [hash, ...]}``. Every rank is its own loader; ranks advance in lock-step."""
    from flashfeed.loader.telemetry.ledger import read_ledger

    full_dir, res_dir = str(tmp_path / "full"), str(tmp_path / "resumed")
    for r in range(before):
        run_epochs(factory(r, before, full_dir), range(epochs))
    states = []
    for r in range(before):
        state, seen = run_epochs(factory(r, before, res_dir), range(epochs), stop_after=stop)
        assert seen == stop, f"rank {r} ran out after {seen} batches"
        states.append(state)
    # every rank saved the same position; any one of them resumes the job
    assert all(s == states[0] for s in states)
    for r in range(after):
        loader = factory(r, after, res_dir)
        loader.load_state_dict(states[r % before])
        run_epochs(loader, range(states[0]["epoch"], epochs))
    return read_ledger(full_dir), read_ledger(res_dir)


def image_keys(prefix: str) -> list[str]:
    """Every sample of a webdataset dataset as ``<shard>/<key>``, in dataset order."""
    ds = Dataset.open(prefix)
    return [f"{s.path}/{e.key}" for i, s in enumerate(ds.shards) for e in ds.read_index(i)]


def token_keys(prefix: str) -> list[str]:
    """Every row of a ``make_token_dataset`` dataset as ``<shard>/t<n>``, in dataset order."""
    ds = Dataset.open(prefix)
    out, n = [], 0
    for s in ds.shards:
        out += [f"{s.path}/t{j:07d}" for j in range(n, n + s.samples)]
        n += s.samples
    return out


def image_samples(prefix: str) -> dict[tuple[int, int], tuple[bytes, int, str]]:
    """(shard, row) -> (jpg bytes, label, ``<shard>/<key>``) of every sample of an image
    dataset, read straight from its tar files (what a loader must deliver)."""
    ds = Dataset.open(prefix)
    out = {}
    for i, info in enumerate(ds.shards):
        with open(f"{prefix}/{info.path}", "rb") as f:
            tar = f.read()
        for row, entry in enumerate(ds.read_index(i)):
            part = {c.ext: tar[c.offset : c.offset + c.size] for c in entry.components}
            out[i, row] = (part["jpg"], int(part["cls"]), f"{info.path}/{entry.key}")
    return out


class _NoSource:
    """A batch source stand-in for a runner whose pipeline never runs."""

    def close(self) -> None:
        pass


def stub_runner():
    """A ``DaliRunner`` whose build makes no DALI pipeline (its pass folder is real)."""
    from flashfeed.loader.image.dali_runner import DaliRunner

    return DaliRunner(lambda source: (object(), ["x"]), lambda pass_dir: _NoSource())  # type: ignore[arg-type,return-value]
