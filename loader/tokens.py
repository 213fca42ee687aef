"""``TokenLoader``: fixed-length token sequences from memory-mapped Arrow shards.

Rows are gathered in plan order straight from the mapped shard into the batch buffer (one
copy, no deserialisation), as int64 or the stored width; on a GPU machine the buffer is a
pinned one from a reusable pool, copied with ``non_blocking=True`` on torch's current stream
and given back to the pool once a CUDA event says the copy is done; the same events time the
copy. Same plan, resume state, ledger, stats and read-ahead as ``Loader``.

With ``outputs`` (names from ``DOC_OUTPUTS``) a batch also holds what attention kernels take
for packed documents (``position_ids``, ``document_ids``, ``cu_seqlens``, ``max_seqlen``,
``labels``), computed from the rows' recorded segments (``segments.py``), never from EOS.

The first epoch streams as ``Loader``'s does. The pass's ``StreamFeeder`` starts the fill of
a shard only when a batch within reach needs it, fetches further ahead as measured, and
waits for a needed row's bytes only, never for the rest of the pass. flashfeed writes Arrow
shards in record batches of about 4 MiB whose byte and row ranges the schema message (the
file's first bytes) records (``flashfeed.arrowlayout``): a shard still arriving is viewed
record batch by record batch from the cache's part file (``arrowstream.py``), each one read
as soon as its bytes have landed, and the gather takes its rows from the view exactly as
from a whole shard's. A shard without that layout (another tool's, or an older flashfeed's)
is served once whole, as its footer at the very end is what locates its record batches.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Generator, Iterator, Sequence
from itertools import pairwise
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import torch

from flashfeed.dataset import Dataset
from flashfeed.errors import CorruptShardError
from flashfeed.mixture import Mixture

from .arrowcols import ArrowShardView, list_index, open_arrow_view
from .arrowstream import open_arriving_view
from .base import Made, PlannedLoader
from .convert import DeviceCopier, HostPool
from .fields import KEY
from .mixsource import MixtureDataset
from .parts import SharedKeywords, loader_parts
from .passorder import PassOrder
from .pipeline import batch_device, check_device
from .segments import DOC_OUTPUTS, Segments, document_outputs

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["DOC_OUTPUTS", "Batch", "TokenLoader"]

_DTYPES = {"int64", "int32", "int16", "uint16", "uint32", "int8", "uint8"}

#: one batch: column -> (batch, seq_len) tensor, and ``"__key__"``: each row's
#: ``<shard>/<key>`` (``__key__`` column of the shard, else the row number); with
#: ``outputs``, those too (``max_seqlen`` an int)
Batch = dict[str, torch.Tensor | list[str] | int]


class TokenLoader(PlannedLoader):
    """Batches ``{column: (batch, seq_len) tensor, "__key__": [<shard>/<key>, ...]}`` of an
    Arrow token dataset. ``device``: ``"auto"`` (this rank's GPU when torch sees CUDA),
    ``"cpu"`` or ``"gpu"``. ``outputs``: any of ``DOC_OUTPUTS`` (a dataset written with
    document columns, format version 3), e.g. ``outputs=DOC_OUTPUTS``. Every loader's
    keywords (``cache_dir``, ``rank``, ``seed``, ``ledger_dir``...): ``SharedKeywords``.

    >>> loader = TokenLoader("s3://b/tokens", batch_size=8, cache_dir="/nvme/ff")  # doctest: +SKIP
    >>> next(iter(loader))["tokens"].shape                                         # doctest: +SKIP
    torch.Size([8, 2048])
    """

    def __init__(
        self,
        dataset: str | Dataset | Mixture,
        *,
        batch_size: int,
        columns: Sequence[str] = ("tokens",),
        dtype: str | None = "int64",
        device: str = "auto",
        pin_memory: bool | None = None,
        max_open: int = 16,
        outputs: Sequence[str] = (),
        **shared: Unpack[SharedKeywords],
    ) -> None:
        if isinstance(columns, str) or not columns:
            raise ValueError(f"columns must be a non-empty sequence of names, got {columns!r}")
        if dtype is not None and dtype not in _DTYPES:
            raise ValueError(f"dtype must be None (stored width) or one of {sorted(_DTYPES)}")
        check_device(device)
        parts = loader_parts("TokenLoader", dataset, shard_format="arrow", keywords=shared)
        super().__init__(parts, batch_size=batch_size)
        self.columns = tuple(columns)
        self.outputs = _check_outputs(outputs, self.columns, self.dataset)
        self.dtype = dtype
        self.device = batch_device(device)
        self.pin_memory = self.device is not None if pin_memory is None else pin_memory
        #: pinned staging buffers and the events of the copies in flight (GPU only)
        self.host_pool = HostPool(per_shape=4 * (len(self.outputs) + len(self.columns)))
        self.copier = (
            DeviceCopier(self.device) if self.device is not None and self.pin_memory else None
        )
        self.max_open = max_open
        self._views: OrderedDict[int, ArrowShardView] = OrderedDict()
        self.bytes_delivered = 0

    def _view(self, shard: int) -> ArrowShardView:
        view = self._views.get(shard)
        if view is not None and view.arriving is not None:
            if view.catch_up():  # record batches landed since: check them as a whole shard's
                _check_shared_offsets(view)
            if view.stale:  # its fill ended without them (failed): the cache's next word
                del self._views[shard]
                view = None
        if view is None:
            view = self._open_view(shard)
            if view.num_rows != self.dataset.shards[shard].samples:
                raise ValueError(
                    f"shard {self.shard_names[shard]} has {view.num_rows} rows, the manifest "
                    f"says {self.dataset.shards[shard].samples}"
                )
            _check_shared_offsets(view)
            self._views[shard] = view
            while len(self._views) > self.max_open:
                self._views.popitem(last=False)
        else:
            self._views.move_to_end(shard)
        return view

    def _open_view(self, shard: int) -> ArrowShardView:
        """The shard's view: read batch by batch while its fill is under way (its schema
        records where its record batches lie), else mapped whole from local storage."""
        name = self.shard_names[shard]
        lists: tuple[str, ...] = ("doc_lens", "doc_ids") if self.outputs else ()
        if "document_offsets" in self.outputs:
            lists += ("doc_starts",)
        partial = self.source.partial(shard)
        if partial is not None and partial.layout is not None:
            try:
                return open_arriving_view(partial, self.columns, name=name, lists=lists)
            except FileNotFoundError:  # renamed into place meanwhile
                partial.progress.close()
        elif partial is not None:
            partial.progress.close()
        return open_arrow_view(self.source.local_path(shard), self.columns, name=name, lists=lists)

    def _gather(self, shards: np.ndarray, rows: np.ndarray) -> tuple[dict[str, Any], list[str]]:
        """Copy rows ``rows`` of shards ``shards``, in that order, from the mapped shards (one
        copy per row group of a shard, no per-row Python work), with their keys as
        ``<shard>/<key>``, read from the same rows."""
        order = np.argsort(shards, kind="stable")
        in_order = shards[order]
        cuts = [0, *(np.flatnonzero(in_order[1:] != in_order[:-1]) + 1).tolist(), len(order)]
        groups = [order[a:b] for a, b in pairwise(cuts)]
        out: dict[str, Any] = {}
        views = [self._view(int(shards[g[0]])) for g in groups]
        keys: list[str] = [""] * len(shards)
        for view, pos in zip(views, groups, strict=True):
            for p, key in zip(pos.tolist(), _row_keys(view, rows[pos]), strict=True):
                keys[p] = f"{view.name}/{key}"
        narrow: dict[str, np.ndarray] = {}
        for col in self.columns:
            first = views[0].columns[col][0]
            dtype = np.dtype(self.dtype) if self.dtype else first.dtype
            buf = self._buffer((len(shards), *first.shape[1:]), dtype)
            # rows are gathered at their stored width, then widened in one contiguous pass
            rows_at = buf if dtype == first.dtype else np.empty(buf.shape, first.dtype)
            for view, pos in zip(views, groups, strict=True):
                arrays = view.columns[col]
                if arrays[0].shape[1:] != first.shape[1:] or arrays[0].dtype != first.dtype:
                    raise ValueError(
                        f"shard {view.name}: column {col!r} has shape {arrays[0].shape[1:]} "
                        f"of {arrays[0].dtype}, other shards {first.shape[1:]} of "
                        f"{first.dtype}: sequences must have one length and type"
                    )
                if len(arrays) == 1:
                    rows_at[pos] = arrays[0][rows[pos]]
                    continue
                chunk, inner = view.locate(rows[pos])
                for c in np.unique(chunk).tolist():
                    sel = chunk == c
                    rows_at[pos[sel]] = arrays[c][inner[sel]]
            if rows_at is not buf:
                np.copyto(buf, rows_at, casting="unsafe")
            out[col] = buf
            narrow[col] = rows_at
        if self.outputs:
            seg = _gather_segments(views, groups, rows)
            where = f"a batch of {', '.join(sorted({v.name for v in views}))}"
            tokens = narrow["tokens"]
            docs = document_outputs(
                seg, tokens.shape[1], tokens, self.outputs, self._buffer, where=where
            )
            out.update(docs)  # type: ignore[arg-type]
        return out, keys

    def _buffer(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """The batch buffer: a pooled pinned one when it is copied to the GPU from here (it
        goes back to the pool when its copy is done); on the CPU a pooled one, reused once
        nothing refers to its batch (``HostPool``); else a new one the batch keeps."""
        if self.copier is not None:
            return self.copier.staging(shape, _torch_dtype(dtype)).numpy()
        if not self.pin_memory:
            return self.host_pool.take(shape, dtype).numpy()
        t = torch.empty(shape, dtype=_torch_dtype(dtype), pin_memory=self.pin_memory)
        return t.numpy()

    def __iter__(self) -> Iterator[Batch]:
        return self._pass_iter(self._run(self.begin_pass()))

    def _run(self, order: PassOrder) -> Generator[Batch, None, None]:
        feeder = self.stream(order, lookahead=1)
        try:
            yield from self._deliver_batches(order, feeder, lambda k: self._make(order, k))
            self._end_epoch()
        finally:
            feeder.close()

    def _make(self, order: PassOrder, k: int) -> Made[Batch]:
        """Batch ``k``: its rows gathered from the mapped shards, then sent to the device."""
        t1 = time.perf_counter()
        sl = order.batch_slice(k)
        if self.copier is not None:
            self.copier.begin()
        arrays, keys = self._gather(order.shards[sl], order.rows[sl])
        t2 = time.perf_counter()
        batch: Batch = {
            c: a if isinstance(a, int) else self._to_device(torch.from_numpy(a))
            for c, a in arrays.items()
        }
        batch[KEY] = keys
        h2d = time.perf_counter() - t2
        if self.copier is not None:
            self.copier.end()
            h2d = self.copier.take_h2d()  # GPU time of the copies finished so far
        self.bytes_delivered += sum(a.nbytes for a in arrays.values() if not isinstance(a, int))
        return Made(batch, keys, t2 - t1, h2d)

    def _to_device(self, t: torch.Tensor) -> torch.Tensor:
        if self.device is None:
            return t
        if self.copier is not None:
            return self.copier.send(t)  # t views a pooled pinned buffer
        return t.to(self.device)

    def close(self) -> None:
        """Wait for the copies in flight; close the stats log."""
        if self.copier is not None:
            self.copier.flush()
        super().close()

    def stats(self) -> dict[str, Any]:
        out = super().stats()
        elapsed = out["elapsed_s"]
        out["bytes"] = self.bytes_delivered
        out["gb_per_s"] = self.bytes_delivered / elapsed / 1e9 if elapsed > 0 else 0.0
        return out


def _check_outputs(
    outputs: Sequence[str], columns: tuple[str, ...], ds: Dataset | MixtureDataset
) -> tuple[str, ...]:
    if isinstance(outputs, str):
        raise ValueError(f"outputs must be a sequence of names, got {outputs!r}")
    unknown = [o for o in outputs if o not in DOC_OUTPUTS]
    if unknown:
        raise ValueError(f"outputs must be names from {list(DOC_OUTPUTS)}, got {unknown}")
    if not outputs:
        return ()
    if "tokens" not in columns:
        raise ValueError(f"outputs={list(outputs)} need the 'tokens' column in columns")
    if not {"doc_lens", "doc_ids", "doc_starts"} <= set(ds.manifest.schema):
        raise ValueError(
            f"dataset {ds.url} has no document boundaries (no doc_lens/doc_ids/doc_starts "
            "columns: "
            f"written before format version 3?): re-ingest it with --tokenizer, or read it "
            f"without outputs={list(outputs)}"
        )
    return tuple(o for o in DOC_OUTPUTS if o in outputs)


def _gather_segments(
    views: list[ArrowShardView], groups: list[np.ndarray], rows: np.ndarray
) -> Segments:
    """The segments of ``rows`` in batch order: gathered per shard (and record batch), then
    put in batch order with one more vectorised gather. ``doc_lens``, ``doc_ids`` and
    ``doc_starts`` share their offsets (checked when a shard is opened): one index each."""
    counts, lens, ids, starts, order = [], [], [], [], []
    for view, pos in zip(views, groups, strict=True):
        lists = view.lists or {}
        lv, iv, sv = lists["doc_lens"], lists["doc_ids"], lists.get("doc_starts")
        chunk, inner = view.locate(rows[pos]) if len(lv) > 1 else (None, rows[pos])
        for c in [0] if chunk is None else np.unique(chunk).tolist():
            sel = slice(None) if chunk is None else chunk == c
            n, idx = list_index(lv[c].offsets, inner[sel])
            counts.append(n)
            lens.append(lv[c].values[idx])
            ids.append(iv[c].values[idx])
            if sv is not None:
                starts.append(sv[c].values[idx])
            order.append(pos[sel])
    n_all = np.concatenate(counts)
    if len(order) == 1:
        back = np.argsort(order[0], kind="stable")
        if (back == np.arange(len(back))).all():  # already in batch order
            return Segments(n_all, lens[0], ids[0], starts[0] if starts else None)
    back = np.argsort(np.concatenate(order), kind="stable")  # batch position -> gathered row
    offsets = np.concatenate([[0], np.cumsum(n_all)])
    _, idx = list_index(offsets, back)
    seg_starts = np.concatenate(starts)[idx] if starts else None
    return Segments(n_all[back], np.concatenate(lens)[idx], np.concatenate(ids)[idx], seg_starts)


def _check_shared_offsets(view: ArrowShardView) -> None:
    """The document columns of a shard hold one entry per segment each: the same offsets
    (``_gather_segments`` indexes them all with one index)."""
    lists = view.lists or {}
    lens = lists.get("doc_lens", [])
    for name, other in lists.items():
        for a, b in zip(lens, other, strict=True):
            if a.offsets is not b.offsets and not np.array_equal(a.offsets, b.offsets):
                raise CorruptShardError(
                    f"shard {view.name}: column {name!r} does not hold one entry per segment "
                    "of 'doc_lens' (their row lengths differ)"
                )


def _row_keys(view: ArrowShardView, rows: np.ndarray) -> list[str]:
    """The keys of ``rows``: the shard's ``__key__`` column, else the row number."""
    if view.keys is None:
        return [str(r) for r in rows.tolist()]
    return [str(k) for k in view.keys.take(pa.array(rows)).to_pylist()]


def _torch_dtype(dtype: np.dtype) -> torch.dtype:
    return torch.from_numpy(np.zeros(0, dtype)).dtype
