"""``PackedLoader``: documents of a dataset indexed in place, packed on the fly into rows.

The plan is the one every loader reads: each unit (a Parquet row group, a block of JSONL
lines) is a shard, each row a document, shuffled, split over ranks and windowed as shards
and samples are. This rank's documents, in plan order, are read as token ids (a column of
ids as it is; a text column tokenized here, each document its tokens plus EOS) and packed
back to back into rows of ``seq_len``: a document that does not fit continues at the start
of the next row. Each row records its segments, so the document outputs of ``TokenLoader``
(``position_ids``, ``document_ids``, ``cu_seqlens``, ``max_seqlen``, ``labels``,
``document_offsets``) come with it; ``document_ids`` are the documents' plan ids. Other
columns of the documents' rows pass through by name: per row, each piece's document's value,
in the order of its keys.

The state says where a run stopped: documents of this rank consumed, and how many tokens of
the next one were already delivered. Each rank packs its own documents: its own state
resumes it on the same world size; the states of every rank resume the job on any other
(``packedstate.py``).

A mixture (of in-place sources and ingested Arrow datasets of documents, ``mixdocs.py``) is
planned as every loader plans one (``MixPosition``): its documents have virtual ids (the
sources' rows end to end), its keys name their source, and the states of every rank merge
as one dataset's do (``packedmix.py``).
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from flashfeed.dataset import Dataset
from flashfeed.plan.mixture import Mixture

from ..datasetinfo import check_version
from ..mixposition import MixPosition, plan_position
from ..mixsource import MixtureDataset
from ..parts import loader_parts
from ..position import PlanPosition
from ..telemetry.ledger import Ledger
from ..unitread import DocTokens, UnitReader
from .decoded import keep_units
from .mixdocs import MixDocReader, document_check, source_columns
from .packbatch import packed_batches
from .packedmix import merge_mix_states, plan_state
from .packedrows import tokenizer_eos
from .packedstate import merge_states
from .packkernel import warm_packing
from .segments import DOC_OUTPUTS

__all__ = ["PackedLoader"]


class PackedLoader:
    """Batches ``{"tokens": (batch_size, seq_len) int64, "__key__": [[<unit>/<row>, ...] per
    row], **outputs}`` from a Parquet or JSONL dataset indexed in place, or from a mixture of
    such datasets and ingested Arrow datasets of documents (``mixdocs.py``). ``__key__`` is a
    ``SegmentKeys``: that list of lists, its strings made when first read.

    ``column``: a column of token ids (lists of ints) or of text; text needs ``tokenizer``
    (a ``tokenizer.json`` path). A mixture's sources may name it apart: ``{source: column}``.
    ``outputs``: any of ``DOC_OUTPUTS``. ``columns``: other
    columns carried as ``batch[name]``, a list per row of each piece's document's value,
    aligned with ``__key__``. ``pad_id``: fills the
    last row of an epoch when ``drop_last=False``. ``max_open``: units kept decoded;
    ``decode_ahead``: units read and tokenized ahead of need, in background threads (0:
    when needed, in the caller's thread). ``keep_decoded``: a folder on local flash that
    keeps units decoded (tokens per document, at most ``keep_decoded_bytes``), so that a
    later epoch, or another rank of the node, maps them instead of decoding or tokenizing
    them again (``decoded.py``). Every loader's keywords
    (``cache_dir``, ``rank``, ``seed``, ``ledger_dir``...): ``SharedKeywords``.
    """

    def __init__(
        self,
        dataset: str | Dataset | Mixture | Mapping[str, Any],
        *,
        batch_size: int,
        seq_len: int,
        column: str | Mapping[str, str] = "text",
        tokenizer: str | None = None,
        eos_token: str | None = None,
        pad_id: int = 0,
        outputs: Sequence[str] = (),
        columns: Sequence[str] = (),
        max_open: int = 16,
        decode_ahead: int = 2,
        keep_decoded: str | None = None,
        keep_decoded_bytes: int | str = "16GiB",
        **shared: Any,  # ``SharedKeywords``, checked by ``loader_parts``
    ) -> None:
        for name, v in (("batch_size", batch_size), ("seq_len", seq_len), ("max_open", max_open)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        if isinstance(decode_ahead, bool) or not isinstance(decode_ahead, int) or decode_ahead < 0:
            raise ValueError(f"decode_ahead must be an integer >= 0, got {decode_ahead!r}")
        if isinstance(outputs, str) or any(o not in DOC_OUTPUTS for o in outputs):
            raise ValueError(f"outputs must be names from {list(DOC_OUTPUTS)}, got {outputs!r}")
        if isinstance(columns, str) or not all(isinstance(c, str) for c in columns):
            raise ValueError(f"columns must be a sequence of column names, got {columns!r}")
        for c in columns:
            if c in ("tokens", "__key__", *DOC_OUTPUTS):
                raise ValueError(f"columns: {c!r} is a name of the batch's own outputs")
        self.columns = tuple(dict.fromkeys(columns))
        parts = loader_parts(
            "PackedLoader", dataset, shard_format=("parquet", "jsonl"), keywords=shared,
            mixture_check=document_check(column, self.columns),
        )  # fmt: skip
        ds = parts.dataset
        if isinstance(ds, Dataset):
            if not isinstance(column, str):
                raise ValueError(f"column must be a column name for one dataset, got {column!r}")
            own_column = column
            for c in (column, *self.columns):
                if c not in ds.manifest.schema:
                    raise ValueError(
                        f"{ds.url} has no column {c!r}; its columns: {sorted(ds.manifest.schema)}"
                    )
        self.dataset = ds
        self.parts = parts
        self.ctx = parts.ctx
        self.source = parts.source
        self.batch_size = batch_size
        self.seq_len = seq_len
        self.column: str | dict[str, str] = column if isinstance(column, str) else dict(column)
        self.pad_id = pad_id
        self.outputs = tuple(o for o in DOC_OUTPUTS if o in outputs)
        self.max_open = max_open
        tokenizer_json, eos_id = tokenizer_eos(tokenizer, eos_token)
        self.position: PlanPosition
        self.reader: UnitReader | MixDocReader
        self.mixed = isinstance(ds, MixtureDataset)
        if isinstance(ds, MixtureDataset):  # documents have virtual ids: sources end to end
            self.column = source_columns(ds.names, column)
            self.reader = MixDocReader(ds, self.column, tokenizer_json=tokenizer_json,
                                       eos_id=eos_id, extra=self.columns)  # fmt: skip
        else:
            self.reader = UnitReader(ds, column=own_column, tokenizer_json=tokenizer_json,
                                     eos_id=eos_id, extra=self.columns)  # fmt: skip
        self.position = plan_position(ds, parts.ctx, parts.options)
        self.kept = keep_units(self.reader, keep_decoded, keep_decoded_bytes)
        warm_packing()  # the batch passes compiled meanwhile (``packbatch.py``)
        sizes = np.asarray(ds.manifest.shard_samples, np.int64)
        self._starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self.doc_offset = 0  # tokens of the next document already delivered
        #: after a resume on another world size: documents delivered before, and the token
        #: a document stopped inside continues from (``packedstate.py``)
        self.skip: set[int] = set()
        self.resume_at: dict[int, int] = {}
        self._finished = False
        #: units read (or being read) in plan order, the least recently used dropped first
        self._units: OrderedDict[int, Future[DocTokens] | _Later] = OrderedDict()
        self._got: dict[int, DocTokens] = {}  # the units of ``_units`` already read
        self._counted: set[int] = set()  # units whose skips are counted
        self.decode_ahead = decode_ahead
        self._pool: ThreadPoolExecutor | None = None
        self._names: dict[int, str] = {}  # unit -> its path and "/" (keys)
        self._last: tuple[int, Any] = (-1, None)  # the unit read last, and its documents
        #: units of this pass in order of first need, and where each is first needed
        self._firsts: tuple[np.ndarray, np.ndarray] = (np.zeros(0, np.int64),) * 2
        self.skipped: Counter[str] = Counter()
        self.ledger = (
            Ledger(parts.telemetry.ledger_dir, rank=self.ctx.rank, world_size=self.ctx.world_size)
            if parts.telemetry.ledger_dir
            else None
        )
        self.tokens_delivered = 0
        self._dropped = np.zeros(0, np.int64)

    @property
    def epoch(self) -> int:
        return self.position.epoch

    def set_epoch(self, epoch: int) -> None:
        self._finished = False
        if epoch != self.position.epoch:
            self._new_epoch()
        self.position.set_epoch(epoch)

    def _new_epoch(self) -> None:
        """What the last epoch left to skip or continue does not carry into another."""
        self.doc_offset = 0
        self.skip, self.resume_at = set(), {}

    # --- state ------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """This rank's position: the plan's (as every loader's), the documents it consumed,
        the tokens of the next one already delivered, and what an earlier resume on another
        world size left to skip or continue (``packedstate.py``)."""
        state = self.position.state_dict()
        state.update(
            kind="packed", plan="mixture" if self.mixed else "dataset",
            url=self.dataset.url, rank=self.ctx.rank, seq_len=self.seq_len,
            column=self.column, doc_offset=self.doc_offset, finished=self._finished,
            consumed=self.position.consumed,
            prior=[[g.world_size, g.ranks_per_node, g.samples_per_rank]
                   for g in getattr(self.position, "prior", ())],
            skip=sorted(self.skip), resume_at=sorted([d, o] for d, o in self.resume_at.items()),
        )  # fmt: skip
        return state

    def load_state_dict(self, state: dict[str, Any] | Sequence[dict[str, Any]]) -> None:
        """Continue from this rank's own state (same world size), or from the states of
        every rank of the job that saved them (any world size: gather them with
        ``torch.distributed.all_gather_object``)."""
        states = [state] if isinstance(state, dict) else list(state)
        for s in states:
            if not isinstance(s, dict) or s.get("kind") != "packed":
                raise ValueError("not a PackedLoader state (no kind='packed')")
            if isinstance(self.dataset, Dataset):  # a mixture's position checks its sources
                check_version(s, self.dataset)
            if s.get("seq_len") != self.seq_len or s.get("column") != self.column:
                raise ValueError(
                    f"the state packed column {s.get('column')!r} into rows of "
                    f"{s.get('seq_len')}, this loader {self.column!r} into {self.seq_len}"
                )
        mine = [s for s in states if s.get("rank") == self.ctx.rank]
        same = states[0].get("world_size") == self.ctx.world_size
        if same and len(states) == 1 and mine:
            self.position.load_state_dict(self._plan_state(states[0]))
            self.doc_offset = int(states[0].get("doc_offset") or 0)
            self.skip = {int(d) for d in states[0].get("skip", [])}
            self.resume_at = {int(d): int(o) for d, o in states[0].get("resume_at", [])}
        elif len(states) == 1 and states[0].get("world_size") != 1:
            raise ValueError(
                f"a PackedLoader state of one rank resumes on that rank and world size (saved "
                f"by rank {states[0].get('rank')} of {states[0].get('world_size')}, this is "
                f"rank {self.ctx.rank} of {self.ctx.world_size}): each rank packs its own "
                "documents; on another world size give the states of every rank"
            )
        elif isinstance(self.position, MixPosition):
            for s in states:
                self._plan_state(s)
            position, self.skip, self.resume_at = merge_mix_states(states, self.position)
            self.position.load_state_dict(position)
            self.doc_offset = 0
        else:
            position, self.skip, self.resume_at = merge_states(
                states, self.position.shard_sizes, self.position.options
            )
            self.position.load_state_dict(position)
            self.doc_offset = 0
        self._finished = all(bool(s.get("finished", False)) for s in states)

    def _plan_state(self, state: dict[str, Any]) -> dict[str, Any]:
        """The plan's part of a packed state (a mixture's: ``packedmix.plan_state``)."""
        if isinstance(self.position, MixPosition):
            return plan_state(state, self.position)
        return state

    # --- reading ----------------------------------------------------------------------------

    def _submit(self, shard: int) -> Future[DocTokens] | _Later:
        """Unit ``shard`` read and tokenized, in the background when ``decode_ahead``; a unit
        kept decoded whose bytes are at hand is read where it is first needed (a check and a
        map: cheaper than a thread's round trip)."""
        if self._pool is None and self.decode_ahead:
            self._pool = ThreadPoolExecutor(self.decode_ahead, thread_name_prefix="ff-unit")
        fut: Future[DocTokens] | _Later
        if self._pool is None or self.reader.at_hand(self.source, shard):
            fut = _Later(self.reader, self.source, shard)
        else:
            fut = self._pool.submit(self.reader.read, self.source, shard)
        self._units[shard] = fut
        while len(self._units) > self.max_open:
            self._got.pop(self._units.popitem(last=False)[0], None)
        return fut

    def _unit(self, shard: int) -> DocTokens:
        if shard == self._last[0]:  # the same unit as the document before: no look-up
            return self._last[1]
        got = self._got.get(shard)
        if got is not None:  # read before and still open: no wait on its future
            self._units.move_to_end(shard)
            self._last = (shard, got)
            return got
        fut = self._units.get(shard)
        if fut is None:
            fut = self._submit(shard)
        else:
            self._units.move_to_end(shard)
        got = fut.result()
        if shard not in self._counted:
            self._counted.add(shard)
            self.skipped.update(got.skipped)
        self._got[shard] = got
        self._last = (shard, got)
        return got

    def key(self, shard: int, row: int) -> str:
        """``<unit path>/<row>``: the document's key in batches and the ledger."""
        return f"{self.key_prefix(shard)}{row}"

    def key_prefix(self, shard: int) -> str:
        """``<unit path>/``: what the keys of unit ``shard``'s documents start with."""
        name = self._names.get(shard)
        if name is None:
            name = self._names[shard] = self.dataset.manifest.shard_path(shard) + "/"
        return name

    def __iter__(self) -> Iterator[dict[str, Any]]:
        if self._finished:
            self.position.next_epoch()
            self._new_epoch()
            self._finished = False
        plan = self.position.rank_plan()
        ids = plan.samples
        if len(plan.repeated):  # the plan pads a short share with repeats: packing needs none
            ids = ids[: max(0, len(ids) - len(plan.repeated))]
        self._dropped = plan.dropped
        shards = np.searchsorted(self._starts, ids, side="right") - 1
        rows = ids - self._starts[shards]
        return packed_batches(self, ids, shards, rows)

    def _ahead(self, pos: int) -> int:
        """Hint the source at the next units this rank reads from pass position ``pos`` on
        (a cold epoch streams), and start reading and tokenizing the next ``decode_ahead``
        of them; the position at which the next unit is first needed."""
        units, first = self._firsts
        k = int(np.searchsorted(first, pos, side="right"))
        nxt = units[max(k - 1, 0) : k + self.max_open // 2].tolist()
        self.source.fetch_ahead(nxt)
        for s in nxt[: self.decode_ahead + 1]:
            if s not in self._units:
                self._submit(s)
        return int(first[k]) if k < len(first) else 1 << 62

    def _end(self, unfinished: list[int]) -> None:
        """The epoch's end on this rank: what the plan drops (``drop_last``) and the
        documents begun only in a last partial batch go to the ledger as dropped."""
        self._finished = True
        if self.ledger is not None:
            # what a resume on another world size skips was delivered before: not dropped
            gone = [d for d in self._dropped.tolist() if d not in self.skip] + unfinished
            if gone:
                self.ledger.record_dropped(self.position.epoch, gone)

    def stats(self) -> dict[str, Any]:
        return {
            "tokens": self.tokens_delivered,
            "skipped": dict(self.skipped),
            "source": self.source.stats(),
            **({"kept": self.kept.stats()} if self.kept is not None else {}),
        }

    def close(self) -> None:
        """Stop the background reads (the ones running finish) and let go of the units."""
        self._last = (-1, None)
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        self._units.clear()
        self._got.clear()


class _Later:
    """A unit read when its result is first asked for, in the asking thread; what the read
    raised is raised there, as a future's would be."""

    __slots__ = ("_args", "_error", "_got")

    def __init__(self, reader: Any, source: Any, shard: int) -> None:
        self._args: tuple[Any, Any, int] | None = (reader, source, shard)
        self._got: list[DocTokens] = []
        self._error: BaseException | None = None

    def result(self) -> DocTokens:
        if self._args is not None:
            reader, source, shard = self._args
            self._args = None
            try:
                self._got.append(reader.read(source, shard))
            except BaseException as exc:
                self._error = exc
        if self._error is not None:
            raise self._error
        return self._got[0]
