"""The tokenizing path's per-process parts: one tokenizer load per process, the token
stream built without a list of every token, the tokenizer's threads, and a text source
read once per task across the task's shards."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from flashfeed.ingest import IngestConfig, run, tokenize
from flashfeed.ingest.raysetup import JEMALLOC_VARIABLE, ray_jemalloc, worker_malloc
from flashfeed.ingest.tokenize import TokenPacker, shared_packer, tokenizer_threads

from support.token_docs import byte_bpe, ingested_pieces, mixed_documents


@pytest.fixture
def tok(tmp_path: Path) -> str:
    return byte_bpe(tmp_path / "tok.json", mixed_documents(200, seed=1))


@pytest.mark.parametrize("dtype", [np.uint16, np.uint32])
@pytest.mark.parametrize("call_chars", [1, 300, 1 << 16])
def test_the_stream_is_each_documents_ids_then_eos(
    tok: str, dtype, call_chars: int, monkeypatch
) -> None:
    """The same stream whether the tokenizer sees a document per call, a few, or all."""
    monkeypatch.setattr(tokenize, "CALL_CHARS", call_chars)
    packer = TokenPacker(tok, seq_len=32)
    packer.dtype = dtype  # a vocabulary over 65,536 ids is stored as uint32
    docs = mixed_documents(50, seed=4)
    stream, lengths = packer.encode(docs)
    want = []
    for e in Tokenizer.from_file(tok).encode_batch(docs, add_special_tokens=False):
        want += [*e.ids, packer.eos_id]
    assert stream.dtype == dtype and stream.tolist() == want
    assert lengths.tolist() == [len(e.ids) + 1 for e in packer.tokenizer.encode_batch(docs)]


@pytest.mark.parametrize("parallel", [False, True])
def test_documents_go_to_the_tokenizer_in_order_in_calls_of_about_call_chars(
    tok: str, monkeypatch, parallel: bool
) -> None:
    """Every document once, in order; a call holds ``CALL_CHARS`` of text per thread the
    tokenizer may use, or one document that alone is longer."""
    docs = [*mixed_documents(80, seed=2), "x" * 5000, *mixed_documents(40, seed=3)]
    threads = (os.cpu_count() or 1) if parallel else 1
    per_thread = max(1, sum(map(len, docs)) // (8 * threads))  # several calls on any machine
    monkeypatch.setattr(tokenize, "CALL_CHARS", per_thread)
    packer = TokenPacker(tok, seq_len=32)
    calls: list[list[str]] = []
    real = packer.tokenizer.encode_batch_fast

    class Recording:
        def encode_batch_fast(self, batch: list[str], **kw):
            calls.append(batch)
            return real(batch, **kw)

    packer.tokenizer = Recording()
    with tokenizer_threads(parallel):
        packer.encode(docs)
    assert [d for c in calls for d in c] == docs
    per_call = per_thread * threads
    for c in calls[:-1]:
        size = sum(map(len, c))
        assert size >= per_call and size - len(c[-1]) < per_call
    assert len(calls) > 1


def test_a_packer_is_loaded_once_per_process_and_again_when_its_file_changes(
    tmp_path: Path, tok: str
) -> None:
    first = shared_packer(tok, seq_len=16, packing="best-fit")
    assert shared_packer(tok, seq_len=16, packing="best-fit") is first
    assert shared_packer(tok, seq_len=32, packing="best-fit") is not first
    bigger = byte_bpe(tmp_path / "tok2.json", mixed_documents(200, seed=1), vocab=300)
    os.replace(bigger, tok)
    again = shared_packer(tok, seq_len=16, packing="best-fit")
    assert again is not first and again.vocab_size < first.vocab_size


def test_a_missing_tokenizer_is_still_one_clear_line(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cannot load tokenizer"):
        shared_packer(str(tmp_path / "none.json"), seq_len=16)


@pytest.mark.parametrize("before", [None, "true"])
def test_tokenizer_threads_sets_the_variable_for_the_block_only(monkeypatch, before) -> None:
    if before is None:
        monkeypatch.delenv("TOKENIZERS_PARALLELISM", raising=False)
    else:
        monkeypatch.setenv("TOKENIZERS_PARALLELISM", before)
    with tokenizer_threads(False):
        assert os.environ["TOKENIZERS_PARALLELISM"] == "false"
    assert os.environ.get("TOKENIZERS_PARALLELISM") == before


@pytest.mark.usefixtures("ray_session")
def test_a_text_source_tokenized_into_many_shards_per_task(
    tmp_path: Path, s3_prefix: str, tok: str
) -> None:
    """Eight shards of one text partition on two CPUs: each task keeps the partition it
    read for its first shard, and every document comes back exactly, once."""
    docs = mixed_documents(160, seed=5)
    src = tmp_path / "corpus.jsonl"
    src.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    result = run(
        IngestConfig(
            source=str(src), dest=s3_prefix, format="arrow", tokenizer=tok, seq_len=48,
            packing="best-fit", samples_per_shard=20, source_format="text", progress="none",
        )
    )  # fmt: skip
    assert len(result.manifest.shards) == 8 and result.manifest.extra["tokens"]["documents"] == 160
    pieces = ingested_pieces(s3_prefix)
    assert sorted(pieces) == list(range(len(docs)))
    decoder = Tokenizer.from_file(tok)
    for d, text in enumerate(docs):
        ids = [t for s in sorted(pieces[d]) for t in pieces[d][s]]
        assert decoder.decode(ids[:-1], skip_special_tokens=False) == text


def test_a_shard_job_pickles_back_equal_through_rays_pickler() -> None:
    import ray.cloudpickle

    from flashfeed.ingest.shardtask import ShardJob
    from flashfeed.ingest.sources import Item

    job = ShardJob(3, (Item(7, "a.jsonl:8", 12, {"values": {"txt": "héllo"}}), Item(9, "b", 0)),
                   "f" * 32, recorded=False)  # fmt: skip
    back = ray.cloudpickle.loads(ray.cloudpickle.dumps(job))
    assert back == job and [type(it) for it in back.items] == [Item, Item]
    assert back.items[1].ref == {} and back.items[0].ref is not job.items[0].ref


@pytest.mark.usefixtures("ray_session")
def test_an_embedded_rays_task_workers_run_on_rays_jemalloc() -> None:
    """A task worker holds Ray's threads beside the task; glibc's malloc is fast only in a
    process of one thread, so the workers an embedded Ray starts preload Ray's jemalloc."""
    import ray

    lib = ray_jemalloc()
    if lib is None:
        pytest.skip("this Ray build ships no libjemalloc.so")

    def mapped_jemalloc() -> list[str]:  # defined here: Ray ships it by value
        with open("/proc/self/maps") as f:
            return sorted({ln.split()[-1] for ln in f if "jemalloc" in ln.rsplit("/", 1)[-1]})

    in_worker = ray.get(ray.remote(mapped_jemalloc).remote())
    assert in_worker == [os.path.realpath(lib)] or in_worker == [lib]
    assert "LD_PRELOAD" not in os.environ  # the driver's environment is its own again


def test_worker_malloc_leaves_a_set_preload_and_can_be_turned_off(monkeypatch) -> None:
    if ray_jemalloc() is None:
        pytest.skip("this Ray build ships no libjemalloc.so")
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    with worker_malloc() as lib:
        assert lib is not None and os.environ["LD_PRELOAD"] == lib
    assert "LD_PRELOAD" not in os.environ
    monkeypatch.setenv(JEMALLOC_VARIABLE, "0")
    with worker_malloc() as lib:
        assert lib is None and "LD_PRELOAD" not in os.environ
    monkeypatch.delenv(JEMALLOC_VARIABLE)
    monkeypatch.setenv("LD_PRELOAD", "/usr/lib/libmine.so")
    with worker_malloc() as lib:
        assert lib is None and os.environ["LD_PRELOAD"] == "/usr/lib/libmine.so"
    assert os.environ["LD_PRELOAD"] == "/usr/lib/libmine.so"


def test_a_shard_job_ships_the_rows_its_fingerprint_pickled(tmp_path: Path) -> None:
    """The driver pickles a shard's rows once: for its fingerprint, and as what the job
    ships; the task gets the same items back."""
    import ray.cloudpickle

    from flashfeed.ingest import runner
    from flashfeed.ingest.sources import StorageContext, scan_source
    from flashfeed.ingest.sources.base import ItemRows

    src = tmp_path / "c.jsonl"
    src.write_text("".join(json.dumps({"text": d}) + "\n" for d in mixed_documents(30, seed=6)))
    config = IngestConfig(source=str(src), dest=str(tmp_path / "out"), samples_per_shard=8)
    ctx = StorageContext.resolve(None)
    scan = scan_source(str(src), "auto", ctx, fields={}, options={})
    jobs = runner._assign_shards(config, scan, scan.items, ctx, set()).jobs
    assert len(jobs) == 4
    for job in jobs:
        assert isinstance(job.items, ItemRows) and job.items.packed is not None
        assert pickle.loads(job.items.packed) == job.items.rows
        back = ray.cloudpickle.loads(ray.cloudpickle.dumps(job))
        assert back == job and back.fingerprint == job.fingerprint
        assert [it.ref["values"]["txt"] for it in back.items] == [
            scan.items[it.index].ref["values"]["txt"] for it in job.items
        ]
