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
file's first bytes) records (``flashfeed.format.arrowlayout``): a shard still arriving is viewed
record batch by record batch from the cache's part file (``arrowstream.py``), each one read
as soon as its bytes have landed, and the gather takes its rows from the view exactly as
from a whole shard's. A shard without that layout (another tool's, or an older flashfeed's)
streams the same way once the walk of its messages has found a row's record batch
(``flashfeed.format.ipcwalk``); one with dictionary columns streams in file order.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from flashfeed.dataset import Dataset
from flashfeed.plan.mixture import Mixture

from ..base import Made, PlannedLoader
from ..image.convert import DeviceCopier, HostPool
from ..image.fields import KEY
from ..image.pipeline import batch_device, check_device
from ..mixsource import MixtureDataset
from ..openshard import OpenShard, default_max_open
from ..parts import SharedKeywords, loader_parts
from ..passorder import PassOrder
from .arrowcols import ArrowShardView, open_arrow_view
from .arrowstream import open_arriving_view
from .docwarm import warm_loader
from .rowgather import copy_rows, gather_rows
from .segments import DOC_OUTPUTS, check_outputs, check_shared_offsets
from .tokenrows import RowTable

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from .docrows import DocRows

__all__ = ["DOC_OUTPUTS", "Batch", "TokenLoader", "default_max_open"]

#: the (B, L) int64 document outputs, each a plane of a CPU batch's pooled block
_PLANES = ("position_ids", "document_ids", "labels", "document_offsets")
_DTYPES = {"int64", "int32", "int16", "uint16", "uint32", "int8", "uint8"}

#: one batch: column -> (batch, seq_len) tensor, and ``"__key__"``: each row's
#: ``<shard>/<key>`` (``__key__`` column of the shard, else the row number); with
#: ``outputs``, those too (``max_seqlen`` an int)
Batch = dict[str, torch.Tensor | list[str] | int]


class TokenLoader(PlannedLoader):
    """Batches ``{column: (batch, seq_len) tensor, "__key__": [<shard>/<key>, ...]}`` of an
    Arrow token dataset. ``device``: ``"auto"`` (this rank's GPU when torch sees CUDA),
    ``"cpu"`` or ``"gpu"``. ``outputs``: any of ``DOC_OUTPUTS`` (a dataset written with
    document columns, format version 3), e.g. ``outputs=DOC_OUTPUTS``. ``max_open``:
    shards kept mapped (None: ``default_max_open``, what the plan reads at once). Every loader's
    keywords (``cache_dir``, ``rank``, ``seed``, ``ledger_dir``...): ``SharedKeywords``.

    >>> loader = TokenLoader("s3://b/tokens", batch_size=8, cache_dir="/nvme/ff")  # doctest: +SKIP
    >>> next(iter(loader))["tokens"].shape                                         # doctest: +SKIP
    torch.Size([8, 2048])
    """

    def __init__(
        self,
        dataset: str | Dataset | Mixture | Mapping[str, Any],
        *,
        batch_size: int,
        columns: Sequence[str] = ("tokens",),
        dtype: str | None = "int64",
        device: str = "auto",
        pin_memory: bool | None = None,
        max_open: int | None = None,
        outputs: Sequence[str] = (),
        **shared: Unpack[SharedKeywords],
    ) -> None:
        if isinstance(columns, str) or not columns:
            raise ValueError(f"columns must be a non-empty sequence of names, got {columns!r}")
        if dtype is not None and dtype not in _DTYPES:
            raise ValueError(f"dtype must be None (stored width) or one of {sorted(_DTYPES)}")
        check_device(device)
        if max_open is not None and (
            isinstance(max_open, bool) or not isinstance(max_open, int) or max_open < 1
        ):
            raise ValueError(
                f"max_open must be None (from the plan) or an int >= 1, got {max_open!r}"
            )
        parts = loader_parts("TokenLoader", dataset, shard_format="arrow", keywords=shared)
        super().__init__(parts, batch_size=batch_size)
        self.columns = tuple(columns)
        self.outputs = check_outputs(outputs, self.columns, self.dataset)
        self.dtype = dtype
        self._dtype = np.dtype(dtype) if dtype else None
        #: columns gathered row by row (with ``outputs``, the kernel writes the tokens)
        self._gathered = [c for c in self.columns if not self.outputs or c != "tokens"]
        #: the (B, L) int64 outputs of a document batch (``_output_buffers``)
        self._planes = sum(n in self.outputs for n in _PLANES)
        self._fill: Any = None  # ``docrows.row_outputs``, imported by the first document batch
        self.device = batch_device(device)
        self.pin_memory = self.device is not None if pin_memory is None else pin_memory
        #: pinned staging buffers and the events of the copies in flight (GPU only)
        self.host_pool = HostPool(per_shape=4 * (len(self.outputs) + len(self.columns)))
        self.copier = (
            DeviceCopier(self.device) if self.device is not None and self.pin_memory else None
        )
        sources = len(self.dataset.names) if isinstance(self.dataset, MixtureDataset) else 1
        self.max_open = max_open or default_max_open(sources, parts.options.window)
        self._views: dict[int, OpenShard] = {}
        #: the batch that last read each open shard (the least recent is closed first)
        self._used: dict[int, int] = {}
        self._tick = 0  # batches gathered
        self._whole = True  # no open shard is still arriving (``_open_all``)
        self._rows: RowTable | None = None  # of the open shards: remade when they change
        self._docs: tuple[RowTable, DocRows] | None = None  # remade with its RowTable
        self._scratch: dict[str, np.ndarray] = {}
        #: column -> row shape, type and the shard that set them (``_check_row_types``)
        self._row_types: dict[str, tuple[tuple[int, ...], np.dtype, str]] = {}
        self.bytes_delivered = 0
        #: the document kernels compiled meanwhile (``docwarm.py``), waited for by batch 1
        self._warm = warm_loader(self.dataset.manifest.schema, dtype) if self.outputs else None

    def _open(self, shard: int) -> OpenShard:
        """Shard ``shard`` viewed and checked (the ``max_open`` most recent are kept); a
        shard still arriving takes in the record batches landed since it was last asked."""
        got = self._views.get(shard)
        if got is not None and got.view.arriving is not None:
            if got.view.catch_up():  # record batches landed since: check them as a whole's
                check_shared_offsets(got.view)
                self._check_row_types(got.view)
                got.landed()
                self._rows = None  # its record batches may have moved on: table them again
            if got.view.stale:  # its fill ended without them (failed): the cache's next word
                del self._views[shard]
                got = None
        if got is not None:
            return got
        self._rows = None
        view = self._open_view(shard)
        if view.num_rows != self.dataset.shards[shard].samples:
            raise ValueError(
                f"shard {self.shard_names[shard]} has {view.num_rows} rows, the manifest "
                f"says {self.dataset.shards[shard].samples}"
            )
        check_shared_offsets(view)
        self._check_row_types(view)
        got = self._views[shard] = OpenShard(shard, view)
        views, used = self._views, self._used
        used[shard] = self._tick
        while len(views) > self.max_open:  # the least recently read goes
            victim = min(views, key=used.__getitem__)
            del views[victim], used[victim]
        return got

    def _open_all(self, shards: dict[int, None]) -> Mapping[int, OpenShard]:
        """``_open`` of each shard. Once they are all open and whole (a pass under way
        over local shards), one set test and one dict update, no Python step per shard (a
        mixture's batch spans a window of shards per source): the map returned is then
        that of every open shard."""
        views = self._views
        self._tick += 1
        self._used.update(dict.fromkeys(shards, self._tick))  # none of them closes here
        if self._whole and views.keys() >= shards.keys():
            return views
        opened = {}
        for s in shards:
            got = views.get(s)
            if got is None or got.view.arriving is not None:
                got = self._open(s)
            opened[s] = got
        self._whole = all(o.view.arriving is None for o in views.values())
        return opened

    def _open_view(self, shard: int) -> ArrowShardView:
        """The shard's view: read batch by batch while its fill is under way (its schema
        records where its record batches lie), else mapped whole from local storage."""
        name = self.shard_names[shard]
        lists: tuple[str, ...] = ("doc_lens", "doc_ids") if self.outputs else ()
        if "document_offsets" in self.outputs:
            lists += ("doc_starts",)
        partial = self.source.partial(shard)
        if partial is not None and (partial.layout is not None or partial.walk is not None):
            try:
                view = open_arriving_view(partial, self.columns, name=name, lists=lists)
                if not view.stale:
                    return view
            except FileNotFoundError:  # renamed into place meanwhile
                partial.progress.close()
        elif partial is not None:
            partial.progress.close()
        return open_arrow_view(self.source.local_path(shard), self.columns, name=name, lists=lists)

    def _check_row_types(self, view: ArrowShardView) -> None:
        """Every record batch of every shard holds each column at one row shape and type
        (those of the first shard opened), checked once per open (and per arrival of record
        batches), not per batch. A record batch not landed yet holds no rows to check."""
        for col in self.columns:
            for arr in view.columns[col]:
                if not len(arr):
                    continue
                shape, dtype, name = self._row_types.setdefault(
                    col, (arr.shape[1:], arr.dtype, view.name)
                )
                if arr.shape[1:] != shape or arr.dtype != dtype:
                    raise ValueError(
                        f"shard {view.name}: column {col!r} has shape {arr.shape[1:]} of "
                        f"{arr.dtype}, shard {name} {shape} of {dtype}: sequences must have "
                        "one length and type"
                    )

    def _gather(self, shards: np.ndarray, rows: np.ndarray) -> tuple[dict[str, Any], list[str]]:
        """Copy rows ``rows`` of shards ``shards``, in that order, from the mapped shards
        straight into the batch buffer (``rowgather.py``: one compiled copy, no Python per
        row or per shard, so a batch over many shards, as a mixture's is, costs what one
        over few does), with their keys as ``<shard>/<key>``.
        With ``outputs``, the tokens are read in place by the document kernel instead,
        which writes them and the outputs in one pass (``docrows.py``)."""
        sl = shards.tolist()
        need = dict.fromkeys(sl)
        opened = self._open_all(need)
        table = self._row_table(opened)
        out: dict[str, Any] = dict.fromkeys(self.columns)
        for col in self._gathered:
            shape, stored, _ = self._row_types[col]  # every row's (_check_row_types)
            dtype = self._dtype or stored
            buf = out[col] = self._buffer((len(sl), *shape), dtype)
            if not gather_rows(table, col, shards, rows, buf):  # compiled: rows it can read
                # rows are copied at their stored width, then widened in one contiguous pass
                rows_at = buf if dtype == stored else self._narrow(col, buf.shape, stored)
                copy_rows(table, col, shards, rows, rows_at)
                if rows_at is not buf:
                    np.copyto(buf, rows_at, casting="unsafe")
        keys = table.keys(sl, rows)
        if self.outputs:
            docs = self._doc_rows(table, opened, need)
            tokens, alloc = self._output_buffers(len(sl), docs.like)
            out["tokens"] = tokens

            def where() -> str:  # named only in an error
                return f"a batch of {', '.join(sorted(opened[s].view.name for s in need))}"

            out.update(self._fill(docs, shards, rows, self.outputs, tokens, alloc, where=where))
        return out, keys

    def _doc_rows(
        self, table: RowTable, opened: Mapping[int, OpenShard], need: dict[int, None]
    ) -> DocRows:
        """The ``DocRows`` of the open shards, remade with their ``RowTable`` (of the
        batch's shards alone when the table is not the loader's)."""
        docs = self._docs
        if docs is not None and docs[0] is table:
            return docs[1]
        from .docrows import DocRows, row_outputs

        if self._warm is not None:
            self._warm.wait()  # what is left of the compile (its error, if it failed)
            self._warm = None
        self._fill = row_outputs
        views = self._views if table is self._rows else {s: opened[s] for s in need}
        self._docs = (table, DocRows(views))
        return self._docs[1]

    def _output_buffers(
        self, batch: int, like: np.ndarray
    ) -> tuple[np.ndarray, Callable[[tuple[int, ...], np.dtype], np.ndarray]]:
        """A document batch's token buffer and the allocator of its (B, L) int64 outputs.
        On the CPU pool path they are the planes of one pooled ``(n, B, L)`` int64 block
        (the tokens too when they are int64): one pool look-up per batch, not one per
        output; the block is reused once nothing refers to any of them (``HostPool``)."""
        dtype = self._dtype or like.dtype
        shape = (batch, like.shape[1])
        if self.copier is not None or self.pin_memory:
            return self._buffer(shape, dtype), self._buffer
        wide = dtype == np.int64
        block = self.host_pool.array((self._planes + wide, *shape), np.dtype(np.int64))
        planes = iter(block)  # each plane a view that holds the block
        tokens = next(planes) if wide else self._buffer(shape, dtype)
        return tokens, lambda _shape, _dtype: next(planes)

    def _row_table(self, opened: Mapping[int, OpenShard]) -> RowTable:
        """The ``RowTable`` of every open shard (they hold ``opened``), kept until a shard
        opens; of ``opened`` alone when it holds more than ``max_open`` shards."""
        if len(opened) > self.max_open:
            return RowTable(opened, self.columns)
        if self._rows is None:
            self._rows = RowTable(self._views, self.columns)
        return self._rows

    def _narrow(self, col: str, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """Column ``col``'s rows at the stored width, then widened into the batch buffer:
        scratch kept per column (the batch never holds it), remade when its shape changes."""
        got = self._scratch.get(col)
        if got is None or got.shape != shape or got.dtype != dtype:
            got = self._scratch[col] = np.empty(shape, dtype)
        return got

    def _buffer(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """The batch buffer: a pooled pinned one when it is copied to the GPU from here (it
        goes back to the pool when its copy is done); on the CPU a pooled one, reused once
        nothing refers to its batch (``HostPool``); else a new one the batch keeps."""
        if self.copier is not None:
            return self.copier.staging(shape, _torch_dtype(dtype)).numpy()
        if not self.pin_memory:
            return self.host_pool.array(shape, dtype)
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
        batch: Batch = {}
        nbytes = 0
        for c, a in arrays.items():
            if isinstance(a, int):  # max_seqlen
                batch[c] = a
            else:
                nbytes += a.nbytes
                t = torch.from_numpy(a)
                batch[c] = t if self.device is None else self._to_device(t)
        batch[KEY] = keys
        h2d = time.perf_counter() - t2
        if self.copier is not None:
            self.copier.end()
            h2d = self.copier.take_h2d()  # GPU time of the copies finished so far
        self.bytes_delivered += nbytes
        return Made(batch, keys, t2 - t1, h2d)

    def _to_device(self, t: torch.Tensor) -> torch.Tensor:
        if self.device is None:
            return t
        if self.copier is not None:
            return self.copier.send(t)  # t views a pooled pinned buffer
        return t.to(self.device)

    def close(self) -> None:
        """Wait for the copies in flight; let go of the open shards (their memory maps: a
        shard the cache evicts or a dataset removed meanwhile would otherwise keep its pages
        and disk blocks while this object lives); close the stats log. A later pass opens
        the shards it reads again."""
        if self.copier is not None:
            self.copier.flush()
        for got in self._views.values():
            if got.view.arriving is not None:
                got.view.arriving.progress.close()
        self._views.clear()
        self._used.clear()
        self._rows = self._docs = None
        self._whole = True
        super().close()

    def stats(self) -> dict[str, Any]:
        out = super().stats()
        elapsed = out["elapsed_s"]
        out["bytes"] = self.bytes_delivered
        out["gb_per_s"] = self.bytes_delivered / elapsed / 1e9 if elapsed > 0 else 0.0
        return out


def _torch_dtype(dtype: np.dtype) -> torch.dtype:
    return torch.from_numpy(np.zeros(0, dtype)).dtype
