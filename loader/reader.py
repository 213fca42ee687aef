"""The external source's callback: sample bytes by plan position.

``BatchSource`` is the callback a DALI ``fn.external_source`` calls with a batch number: it
returns that batch of the plan, one list per field, read through a ``ShardReader``
(``shardreader.py``). Picklable; it opens its files lazily in the process that uses it.
"""

from __future__ import annotations

import os
from collections import deque
from typing import Any

import numpy as np

from flashfeed.errors import CorruptShardError
from flashfeed.runtime.lifeline import ParentLink

from .image.fields import FieldSpec, key_bytes, key_column
from .image.text import TextEncoder, decode_text, json_bytes, json_value, text_bytes
from .image.video import ClipOptions, clip_key, clip_start, probe_at
from .passorder import PassOrder
from .shardreader import ShardReader

__all__ = ["BatchSource", "ShardReader", "pass_path", "write_pass"]


class BatchSource:
    """``external_source`` callback: batch ``i`` of pass ``e`` -> one list per column of
    ``field_columns`` (a label field: one int64 array of the batch, when every sample has
    one; captions checked and, with ``text``, tokenized; JSON values picked), then the
    samples' ``key_bytes`` as one ``key_column`` (read with the sample, so the key names what
    was read).

    One DALI pipeline serves many passes: DALI's epoch index ``e`` (incremented by each
    ``reset()``) names the pass file ``pass-<e>.npz`` that ``write_pass`` stored before the
    pass began, holding its samples in plan order. The last batch may be short
    (``drop_last=False``); past the end it raises ``StopIteration``, which ends the pass.
    A reader process that unpickles it (DALI's ``spawn`` start) dies with the process that
    made it. ``keep``: it holds the last ``keep`` batches it returned, for a pipeline that
    reads them in place (``build_pipeline(shared=True)``).
    """

    def __init__(
        self,
        reader: ShardReader,
        *,
        batch_size: int,
        specs: tuple[FieldSpec, ...],
        pass_dir: str,
        text: TextEncoder | None = None,
        bucketed: bool = False,
        clips: ClipOptions | None = None,
        gpu: bool = False,
        keep: int = 0,
    ) -> None:
        if keep < 0:
            raise ValueError(f"keep must be >= 0, got {keep}")
        self.reader = reader
        #: the last ``keep`` batches returned, held so that DALI may read them in place
        #: (``external_source(no_copy=True)`` holds no reference of its own to what it reads)
        self.keep = keep
        self._held: deque[tuple[Any, ...]] = deque(maxlen=keep or 1)
        self.bucketed = bucketed
        self.clips = clips
        self.gpu = gpu
        self._draws: np.ndarray | None = None
        self._bounds: np.ndarray | None = None
        self._shapes: np.ndarray | None = None
        self.batch_size = batch_size
        self.specs = specs
        #: per field, once (``FieldSpec``'s kinds are properties that scan its extensions):
        #: "video", "label" (one parsed label), "bytes" (handed on as read) or "other"
        self._kinds = tuple(_kind(s) for s in specs)
        #: every field is bytes or a label, one plan row per sample: ``_plain_sample``
        self._plain = clips is None and all(k in ("bytes", "label") for k in self._kinds)
        self.text = text
        self.pass_dir = pass_dir
        self._epoch = -1
        self._shards = np.zeros(0, np.int64)
        self._rows = np.zeros(0, np.int64)
        self._num_batches = 0
        self._link = ParentLink()

    def close(self) -> None:
        """Let go of the batches held for DALI and unmap the open shards: a dropped
        pipeline may be kept by a cycle until a garbage collection, this source with it."""
        self._held.clear()
        self.reader.close()

    def _load(self, epoch: int) -> None:
        with np.load(pass_path(self.pass_dir, epoch)) as f:
            self._shards, self._rows = f["shards"], f["rows"]
            self._num_batches = int(f["num_batches"])
            self._bounds = f.get("bounds")
            self._shapes = f.get("shapes")
            self._draws = f.get("draws")
        if self.bucketed and self._shapes is None:
            raise ValueError(f"pass {epoch} of a bucketed pipeline names no bucket shapes")
        self._epoch = epoch

    def __call__(self, info: Any) -> tuple[list[np.ndarray], ...]:
        epoch, i = int(info.epoch_idx), int(info.iteration)
        if epoch != self._epoch:
            self._load(epoch)
        if i >= self._num_batches:
            raise StopIteration
        if self._bounds is not None:
            lo, hi = int(self._bounds[i]), int(self._bounds[i + 1])
        else:
            lo = i * self.batch_size
            hi = min(lo + self.batch_size, len(self._shards))
        per_field: list[list[Any]] = [[] for _ in self.specs]
        key_col: list[np.ndarray] = []
        per = self.clips.clips_per_video if self.clips is not None else 1
        kinds = self._kinds
        shards, rows = self._shards[lo:hi].tolist(), self._rows[lo:hi].tolist()
        if self._plain:  # image bytes and labels: each sample as memoised in its open shard
            for shard, row in zip(shards, rows, strict=True):
                values, kept_key = self._plain_sample(shard, row)
                for col, value in zip(per_field, values, strict=True):
                    col.append(value)
                key_col.append(kept_key)
            return self._hold(self._columns(per_field, key_col, lo, hi))
        for shard, row in zip(shards, rows, strict=True):
            # with several clips per video, plan row r is clip r % per of the sample r // per
            key, picked = self.reader.picked(shard, row // per, self.specs)
            key = clip_key(key, row % per, per)
            name = self.reader.name(shard)
            for spec, kind, got, col in zip(self.specs, kinds, picked, per_field, strict=True):
                if kind == "bytes" and got is not None:
                    col.append(got[1])
                elif kind == "label" and got is not None:
                    col.append(self.reader.label(shard, key, *got))
                elif kind == "video":
                    at = lo + len(key_col)
                    col.append(self._clip(spec, got, shard, key, at, row % per))
                else:
                    col.append(self._value(spec, got, shard, key))
            key_col.append(key_bytes(name, key))
        return self._hold(self._columns(per_field, key_col, lo, hi))

    def _hold(self, columns: tuple[Any, ...]) -> tuple[Any, ...]:
        """``columns``, kept among the last ``keep`` batches (the oldest let go) when asked."""
        if self.keep:
            self._held.append(columns)
        return columns

    def _plain_sample(self, shard: int, row: int) -> tuple[list[Any], np.ndarray]:
        """One sample of a pass whose fields are all bytes or labels (no clips): its values
        in ``specs`` order and its key bytes, made on its first read while its shard is open
        and kept with the open shard (a failing label raises each time, as it is not kept)."""
        reader = self.reader
        s = reader._shard(shard)
        got = s.memo.get(row)
        if got is not None:
            return got
        key, picked = reader.picked(shard, row, self.specs)
        values = [
            reader.label(shard, key, *p) if kind == "label" and p is not None
            else p[1] if p is not None
            else np.zeros(0, np.uint8)
            for kind, p in zip(self._kinds, picked, strict=True)
        ]  # fmt: skip
        got = (values, key_bytes(reader.name(shard), key))
        opened = reader._open.get(shard)  # picked() may have mapped the shard again
        if opened is not None and opened.view is None:  # complete: its bytes stay
            opened.memo[row] = got
        return got

    def _columns(
        self, per_field: list[list[Any]], key_col: list[np.ndarray], lo: int, hi: int
    ) -> tuple[list[np.ndarray], ...]:
        """The callback's columns from each field's values: see the class docstring."""
        cols: list[Any] = []
        for spec, values in zip(self.specs, per_field, strict=True):
            if spec.is_label and all(v.ndim == 0 for v in values):
                # labels as one array: DALI takes it whole instead of sample by sample
                cols.append(np.array(values, dtype=np.int64))
            elif spec.is_text and self.text is not None:
                cols += self.text.encode(values)
            elif spec.is_text:
                cols.append([text_bytes(v) for v in values])
            elif spec.is_video:
                cols += [list(c) for c in zip(*values, strict=True)] if values else [[], [], []]
            else:
                cols.append(values)
        if self.bucketed and self._shapes is not None:  # each sample's bucket (h, w); _load checks
            cols.append(list(self._shapes[lo:hi]))
        return (*cols, key_column(key_col))

    def _clip(
        self,
        spec: FieldSpec,
        got: tuple[str, np.ndarray] | None,
        shard: int,
        key: str,
        at: int,
        index: int,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """A video field of one sample: its bytes, the first frame of its clip ``index``
        (placed by the pass's draw for this position) and that frame's time in seconds."""
        where = f"shard {self.reader.shard_names[shard]} sample {key!r} field {spec.name!r}"
        if got is None or self.clips is None or self._draws is None:
            raise CorruptShardError(f"{where}: a video field needs its member and frames=")
        probe = probe_at(got[1], where=where)
        start = clip_start(
            probe, float(self._draws[at]), self.clips, where=where, gpu=self.gpu, index=index
        )
        seconds = start / probe.fps if probe.fps else 0.0
        return got[1], np.array(start, np.int32), np.array(seconds, np.float32)

    def _value(
        self, spec: FieldSpec, got: tuple[str, np.ndarray] | None, shard: int, key: str
    ) -> Any:
        """One field of one sample as the reader hands it on (a caption as ``str`` or None,
        to be encoded per batch)."""
        where = f"shard {self.reader.shard_names[shard]} sample {key!r}"
        if spec.json_key is not None:
            found, value = (False, None) if got is None else json_value(got[1], spec, where=where)
            return json_bytes(found, value)
        if got is None:
            return None if spec.is_text else np.zeros(0, np.uint8)
        ext, data = got
        if spec.is_label:
            return self.reader.label(shard, key, ext, data)
        if spec.is_text:
            return decode_text(data, ext, where=f"{where} field {spec.name!r}")
        return data


def _kind(spec: FieldSpec) -> str:
    """How ``BatchSource`` hands on a present field: see ``BatchSource._kinds``."""
    if spec.is_video:
        return "video"
    if spec.is_label:
        return "label"
    return "bytes" if spec.is_bytes else "other"


def pass_path(pass_dir: str, epoch: int) -> str:
    return os.path.join(pass_dir, f"pass-{epoch}.npz")


def write_pass(pass_dir: str, epoch: int, order: PassOrder) -> None:
    """Store a pass for ``BatchSource`` (atomically; the pass before last is removed)."""
    tmp = os.path.join(pass_dir, f".pass-{epoch}.tmp.npz")
    extra: dict[str, Any] = {}
    if order.bounds is not None:
        extra["bounds"] = order.bounds.astype(np.int64)
    if order.shapes is not None:
        extra["shapes"] = order.shapes.astype(np.float32)
    if order.draws is not None:
        extra["draws"] = order.draws.astype(np.float64)
    np.savez(tmp, shards=order.shards.astype(np.int64), rows=order.rows.astype(np.int64),
             num_batches=np.int64(order.num_batches), **extra)  # fmt: skip
    os.replace(tmp, pass_path(pass_dir, epoch))
    try:
        os.remove(pass_path(pass_dir, epoch - 2))
    except FileNotFoundError:
        pass
