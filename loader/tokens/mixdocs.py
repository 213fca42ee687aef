"""Documents of a mixture's sources, for ``PackedLoader``: each source read as documents of
its column, whether indexed in place (units: Parquet row groups, blocks of JSONL lines) or
an ingested Arrow dataset (each shard a unit, each row a document: what ``flashfeed
ingest`` writes without a tokenizer, text in field ``txt``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa

from flashfeed.dataset import Dataset
from flashfeed.errors import CorruptShardError
from flashfeed.format.inplace import FileChangedError

from ..unitread import DocTokens, UnitReader

__all__ = ["ArrowDocReader", "MixDocReader", "document_check", "source_columns"]

#: shard formats whose rows ``PackedLoader`` reads as documents in a mixture
DOC_FORMATS = ("parquet", "jsonl", "arrow")


def source_columns(names: Sequence[str], column: str | Mapping[str, str]) -> dict[str, str]:
    """The column each source's documents are read from: one name for all, or per source."""
    if isinstance(column, str):
        return dict.fromkeys(names, column)
    if not isinstance(column, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in column.items()
    ):
        raise ValueError(f"column must be a name or a mapping source -> name, got {column!r}")
    unknown = sorted(set(column) - set(names))
    missing = [n for n in names if n not in column]
    if unknown or missing:
        raise ValueError(f"column= names sources {sorted(column)}; the mixture's are {list(names)}")
    return {n: column[n] for n in names}


def document_check(column: str | Mapping[str, str], extra: Sequence[str]) -> Any:
    """The check of a mixture's sources for ``PackedLoader``: each one's rows are documents
    (Parquet or JSONL indexed in place, or ingested Arrow rows, not packed token rows) with
    its column and every column of ``extra``; one line naming the source otherwise."""

    def check(names: Sequence[str], datasets: Sequence[Dataset]) -> None:
        columns = source_columns(names, column)
        for name, ds in zip(names, datasets, strict=True):
            m = ds.manifest
            if m.shard_format not in DOC_FORMATS or (
                m.shard_format != "arrow" and ds.in_place is None
            ):
                raise ValueError(
                    f"source {name!r} ({ds.url}) holds {m.shard_format} shards: PackedLoader "
                    "reads documents of Parquet or JSONL indexed in place and of ingested "
                    "Arrow datasets"
                )
            schema = dict(m.schema)
            for c in (columns[name], *extra):
                if c not in schema:
                    raise ValueError(
                        f"source {name!r} ({ds.url}) has no column {c!r}; its columns: "
                        f"{sorted(schema)}"
                    )
            kind = str(schema[columns[name]])
            if kind.startswith("fixed_size_list"):
                raise ValueError(
                    f"source {name!r} ({ds.url}): column {columns[name]!r} holds rows of "
                    f"packed tokens ({kind}), not documents: TokenLoader reads it"
                )

    return check


class ArrowDocReader(UnitReader):
    """Reads shards of an ingested Arrow dataset as ``DocTokens``: each row a document of
    ``column`` (text, tokenized here, or a list of token ids)."""

    def read(self, source: Any, shard: int) -> DocTokens:
        path = source.local_path(shard)  # the shard here and checked (cache or in place)
        return self.kept_unit(shard) or self.keep(shard, self._decode_file(path, shard))

    def _decode_file(self, path: str, shard: int) -> DocTokens:
        info = self.dataset.shards[shard]
        name = f"{self.dataset.url}/{info.path}"
        try:
            with pa.memory_map(path) as f:
                table = pa.ipc.open_file(f).read_all()
        except (OSError, pa.ArrowInvalid) as exc:
            raise CorruptShardError(f"{name}: not a readable Arrow file ({exc})") from None
        if table.num_rows != info.samples:
            raise CorruptShardError(
                f"{name}: holds {table.num_rows} rows, the index says {info.samples}"
            )
        extra = {c: table.column(c).to_pylist() for c in self.extra}
        values = self.column_values(table.column(self.column), name)
        got = values if isinstance(values, DocTokens) else self._tokens(values, name)
        return DocTokens(got.offsets, got.values, got.skipped, extra)


class MixDocReader:
    """Reads a mixture's virtual shards as ``DocTokens``: each through its source's reader
    and shard source; a failure names the source. Picklable."""

    def __init__(
        self,
        mix: Any,
        columns: Mapping[str, str],
        *,
        tokenizer_json: str | None,
        eos_id: int | None,
        extra: tuple[str, ...] = (),
    ) -> None:
        self.mix = mix
        self.readers: list[UnitReader] = [
            (ArrowDocReader if ds.manifest.shard_format == "arrow" else UnitReader)(
                ds, column=columns[n], tokenizer_json=tokenizer_json, eos_id=eos_id, extra=extra
            )
            for n, ds in zip(mix.names, mix.datasets, strict=True)
        ]

    def at_hand(self, source: Any, shard: int) -> bool:
        s, local = self.mix.locate_shard(shard)
        return self.readers[s].at_hand(source.sources[s], local)

    def read(self, source: Any, shard: int) -> DocTokens:
        s, local = self.mix.locate_shard(shard)
        try:
            return self.readers[s].read(source.sources[s], local)
        except (CorruptShardError, FileChangedError, FileNotFoundError) as exc:
            raise type(exc)(f"source {self.mix.names[s]!r}: {exc}") from None
