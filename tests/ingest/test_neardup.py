"""Near-duplicate removal and the quality filter on the session's real Ray, measured against
a corpus with planted edited copies whose exact Jaccard similarity is known."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from benchmarks.harness.plantedcorpus import PlantedCorpus, make_planted_corpus, write_jsonl
from flashfeed import Dataset, storage
from flashfeed.ingest import IngestConfig, run
from flashfeed.ingest.minhash import (
    band_keys,
    jaccard,
    lsh_for_recall,
    lsh_params,
    shingle_hashes,
    shingles,
    signatures,
)
from flashfeed.ingest.neardup import NearDupOptions, ScreenResult, clusters, screen
from flashfeed.ingest.nearpairs import GROUP_PAIRS, candidate_pairs, check_pairs
from flashfeed.ingest.sources import StorageContext, scan_source
from flashfeed.ingest.transforms import TransformOptions

pytestmark = pytest.mark.usefixtures("ray_session")

THRESHOLD = 0.7


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> tuple[PlantedCorpus, str]:
    corpus = make_planted_corpus(bases=300, seed=7)
    root = tmp_path_factory.mktemp("planted")
    write_jsonl(corpus.docs[:600], str(root / "a.jsonl"))
    write_jsonl(corpus.docs[600:], str(root / "b.jsonl.gz"))
    return corpus, str(root)


def _screen(url: str, backend: str, chunk_docs: int = 200) -> tuple[ScreenResult, list[int]]:
    """Screen the corpus; also each item's position in the corpus (its "id" column)."""
    ctx = StorageContext()
    scan = scan_source(url, "text", ctx)
    found = screen(
        scan.items,
        fmt="text",
        shared=scan.shared,
        ctx=ctx,
        kinds=scan.fields,
        transform=TransformOptions(),
        text_field="txt",
        near_dup=NearDupOptions(threshold=THRESHOLD, backend=backend),
        chunk_docs=chunk_docs,
    )
    return found, [it.index for it in scan.items]


@pytest.mark.parametrize("backend", ["rensa", "numpy"])
def test_planted_near_duplicates_found_with_recall_and_precision(
    planted: tuple[PlantedCorpus, str], backend: str
) -> None:
    corpus, url = planted
    found, order = _screen(url, backend)
    assert order == list(range(len(corpus.docs)))  # item index = position in the corpus
    root = found.kept_for
    cluster_of = {d: root.get(d, d) for d in range(len(corpus.docs))}
    above = [p for p in corpus.pairs if p.jaccard >= THRESHOLD]
    below = [p for p in corpus.pairs if p.jaccard < THRESHOLD - 0.2]
    assert len(above) > 300 and len(below) > 100
    recall = np.mean([cluster_of[p.base] == cluster_of[p.copy] for p in above])
    assert recall >= 0.95, recall
    # precision: a removed document has a member of its cluster at least THRESHOLD similar
    sh = [shingles(d, size=5) for d in corpus.docs]
    members: dict[int, list[int]] = defaultdict(list)
    for d, r in root.items():
        members[r].append(d)
    good = [
        any(jaccard(sh[d], sh[x]) >= THRESHOLD for x in [r, *members[r]] if x != d)
        for d, r in root.items()
    ]
    assert len(good) > 300
    assert np.mean(good) >= 0.95, np.mean(good)
    merged_below = np.mean([cluster_of[p.base] == cluster_of[p.copy] for p in below])
    assert merged_below <= 0.05, merged_below
    # candidate pairs below the threshold were dropped before the union-find
    stats = found.stats
    assert stats["candidate_pairs"] - stats["checked_below"] == stats["candidate_edges"]
    assert stats["checked_below"] > 0
    # each cluster keeps its smallest position, and every drop is counted with a reason
    assert all(r < d for d, r in root.items())
    assert {r.reason for r in found.rejects} <= {"duplicate", "near_duplicate"}
    assert len(found.rejects) == len(root) == len(corpus.docs) - len(found.kept)
    bands, rows = found.stats["bands"], found.stats["rows"]
    assert (bands, rows) == lsh_for_recall(THRESHOLD, 128) and bands * rows <= 128


def test_same_input_same_kept_set_whatever_the_chunking(
    planted: tuple[PlantedCorpus, str],
) -> None:
    _, url = planted
    a, _ = _screen(url, "rensa", chunk_docs=97)
    b, _ = _screen(url, "rensa", chunk_docs=1000)
    assert a.stats["chunks"] != b.stats["chunks"]
    assert [it.index for it in a.kept] == [it.index for it in b.kept]
    assert a.kept_for == b.kept_for


def test_ingest_removes_near_duplicates_and_counts_them(
    planted: tuple[PlantedCorpus, str], s3_prefix: str
) -> None:
    corpus, url = planted
    exact = corpus.docs[5]
    write_jsonl([exact, "a short one", exact], str(Path(url).parent / "extra" / "c.jsonl"))
    src = f"{s3_prefix}/src"
    for p in sorted(Path(url).iterdir()):
        storage.put_file(str(p), f"{src}/{p.name}")
    storage.put_file(str(Path(url).parent / "extra" / "c.jsonl"), f"{src}/c.jsonl")

    def ingest(dest: str, part_bytes: str) -> set[str]:
        result = run(
            IngestConfig(
                source=src,
                dest=dest,
                source_format="text",
                format="arrow",
                near_dup_threshold=THRESHOLD,
                source_options={"text": {"part_bytes": part_bytes}},
                samples_per_shard=150,
                progress="none",
            )
        )
        m = result.manifest
        assert m.extra["near_dup"]["threshold"] == THRESHOLD
        assert m.skipped["duplicate"] >= 2  # the two planted exact copies of docs[5] at least
        assert m.skipped["near_duplicate"] > 300
        assert sum(m.skipped.values()) + m.num_samples == len(corpus.docs) + 3
        assert "neardup" in result.phases
        return {str(f["txt"]) for _, f in Dataset.open(dest)}

    first = ingest(f"{s3_prefix}/one", "64MiB")
    again = ingest(f"{s3_prefix}/two", "20KiB")  # other partitions, other Ray tasks
    assert first == again
    assert exact in first and "a short one" in first
    rejects = storage.read_bytes(f"{s3_prefix}/one/rejects.jsonl").decode().splitlines()
    dup = [json.loads(r) for r in rejects if json.loads(r)["reason"] == "duplicate"]
    assert any(r["source"].startswith(f"{src}/c.jsonl") for r in dup)


def test_quality_filter_runs_in_the_tasks_and_counts_reasons(tmp_path: Path) -> None:
    docs = ["spam spam buy now", "a fine document about rivers", "short", "another fine text"]
    write_jsonl(docs, str(tmp_path / "src" / "a.jsonl"))

    def keep(text: str) -> str | None:  # shipped to the Ray tasks by value
        if "spam" in text:
            return "spam"
        return "short" if len(text.split()) < 2 else None

    result = run(
        IngestConfig(
            source=str(tmp_path / "src"),
            dest=str(tmp_path / "ds"),
            source_format="text",
            format="arrow",
            quality_filter=keep,
            progress="none",
        )
    )
    assert result.manifest.skipped == {"quality:short": 1, "quality:spam": 1}
    got = {str(f["txt"]) for _, f in Dataset.open(str(tmp_path / "ds"))}
    assert got == {"a fine document about rivers", "another fine text"}
    assert result.manifest.config["quality_filter"].endswith("keep")

    def broken(text: str) -> str | None:
        return 42  # type: ignore[return-value]

    with pytest.raises(ValueError, match="quality_filter must return None") as err:
        run(
            IngestConfig(
                source=str(tmp_path / "src"),
                dest=str(tmp_path / "ds2"),
                source_format="text",
                format="arrow",
                quality_filter=broken,
                progress="none",
            )
        )
    assert "\n" not in str(err.value) and "a.jsonl" in str(err.value)


def test_options_are_checked_and_named() -> None:
    for kwargs, words in [
        ({"near_dup_threshold": 1.0}, "near_dup_threshold must be"),
        ({"near_dup_threshold": 0.8, "near_dup_shingle_size": 0}, "near_dup_shingle_size"),
        ({"near_dup_threshold": 0.8, "near_dup_shingle_unit": "line"}, "near_dup_shingle_unit"),
        ({"near_dup_threshold": 0.8, "near_dup_num_perm": 1}, "near_dup_num_perm"),
        ({"near_dup_threshold": 0.8, "near_dup_backend": "x"}, "near_dup_backend"),
        ({"quality_filter": "nomodule"}, "module:function"),
        ({"quality_filter": "json:no_such_function"}, "cannot be loaded"),
    ]:
        with pytest.raises(ValueError, match=words):
            IngestConfig(source="s", dest="d", **kwargs)  # type: ignore[arg-type]
    cfg = IngestConfig(source="s", dest="d", quality_filter="json:loads")
    assert cfg.quality_function() is json.loads


def test_minhash_estimates_jaccard_and_bands_follow_the_threshold() -> None:
    rng = np.random.default_rng(0)
    base = " ".join(f"w{i}" for i in rng.integers(0, 5000, 400))
    words = base.split()
    for frac in (0.02, 0.1, 0.3):
        edited = " ".join("zz" if rng.random() < frac else w for w in words)
        true = jaccard(shingles(base, size=5), shingles(edited, size=5))
        for backend in ("rensa", "numpy"):
            sig = signatures(
                [shingle_hashes(t, size=5) for t in (base, edited)],
                num_perm=256,
                seed=1,
                backend=backend,
            )
            est = float(np.mean(sig[0] == sig[1]))
            assert abs(est - true) < 0.1, (backend, frac, est, true)
    assert len(shingle_hashes("", size=5)) == 0
    assert len(shingle_hashes("two words", size=5)) == 1  # a short text is one shingle
    assert len(shingle_hashes("abcdef", size=3, unit="char")) == 4
    lo, hi = lsh_params(0.5, 128), lsh_params(0.9, 128)
    assert lo[1] < hi[1]  # a higher threshold wants longer bands
    sig = signatures([shingle_hashes(base, size=5)] * 2, num_perm=128, seed=0)
    keys = band_keys(sig, bands=4, rows=8)
    assert keys.shape == (2, 4) and (keys[0] == keys[1]).all() and len(set(keys[0])) == 4


def test_candidates_sharing_a_band_key_are_kept_only_when_their_signatures_agree() -> None:
    rng = np.random.default_rng(3)
    sig = rng.integers(0, 2**63, size=(4, 128), dtype=np.uint64)
    sig[1, :115] = sig[0, :115]  # docs 0 and 1: 90% of the values agree
    sig[2, :40] = sig[0, :40]  # doc 2: 31% with doc 0, no more with doc 1
    rows = np.zeros(5, dtype=[("key", np.uint64), ("band", np.int32), ("doc", np.int64)])
    rows["key"] = [7, 7, 7, 9, 9]  # one LSH collision links all of 0, 1, 2 in band 0
    rows["band"] = [0, 0, 0, 1, 1]
    rows["doc"] = [2, 0, 1, 3, 3]  # doc 3 twice under one key: no pair with itself
    pairs = candidate_pairs(5, rows)
    assert pairs.tolist() == [[0, 1, 0], [0, 2, 0], [1, 2, 0]]  # every pair of the group
    kept = check_pairs(0.7, pairs, (np.array([2, 3]), sig[2:]), (np.array([0, 1]), sig[:2]))
    assert kept.tolist() == [[0, 1, 0]]  # unchecked, 2 would join the cluster of 0 and 1
    assert clusters(kept) == {0: 0, 1: 0}


def test_a_large_group_pairs_each_document_with_a_bounded_number_before_it() -> None:
    n = GROUP_PAIRS + 10
    rows = np.zeros(n, dtype=[("key", np.uint64), ("band", np.int32), ("doc", np.int64)])
    rows["key"], rows["doc"] = 1, np.arange(n)[::-1]
    pairs = candidate_pairs(9, rows)
    assert len(pairs) == sum(min(j, GROUP_PAIRS) for j in range(n))
    assert (pairs[:, 1] - pairs[:, 0]).max() == GROUP_PAIRS and (pairs[:, 0] < pairs[:, 1]).all()


def test_union_find_keeps_each_clusters_smallest_id() -> None:
    edges = np.array([[5, 9, 0], [2, 5, 0], [7, 8, 1], [8, 11, 0]], dtype=np.int64)
    assert clusters(edges) == {2: 2, 5: 2, 9: 2, 7: 7, 8: 7, 11: 7}


def test_the_readme_text_example_runs(tmp_path: Path) -> None:
    import re
    import subprocess
    import sys

    from support import REPO

    blocks = re.findall(r"```python\n(.*?)```", (REPO / "README.md").read_text(), flags=re.S)
    (block,) = [b for b in blocks if "near_dup_threshold" in b]
    script = tmp_path / "text_example.py"
    script.write_text(block)
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=600, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    skipped, counts = proc.stdout.strip().splitlines()[-2:]
    assert "'near_duplicate':" in skipped and "'quality:short':" in skipped
    before, after = int(counts.split()[0]), int(counts.split()[2])
    assert after < before


def test_command_line_flags_reach_the_config_and_a_textless_source_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import argparse

    from flashfeed.ingest.cli import build_config, register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    with pytest.raises(SystemExit):
        parser.parse_args(["ingest", "--help"])
    help_text = capsys.readouterr().out
    for flag in ("--near-dup-threshold J", "--quality-filter MODULE:FUNCTION", "--text-column"):
        assert flag in help_text
    args = parser.parse_args(
        ["ingest", "SRC", "DEST", "--near-dup-threshold", "0.75", "--near-dup-shingle-size",
         "7", "--near-dup-shingle-unit", "char", "--near-dup-num-perm", "64",
         "--near-dup-backend", "numpy", "--quality-filter", "json:loads",
         "--text-column", "body", "--text-max-doc-bytes", "1MiB"]
    )  # fmt: skip
    cfg = build_config(args)
    assert cfg.near_dup_options() == NearDupOptions(
        threshold=0.75, shingle_size=7, shingle_unit="char", num_perm=64, backend="numpy"
    )
    assert cfg.source_options == {"text": {"column": "body", "max_doc_bytes": "1MiB"}}
    assert cfg.quality_function() is json.loads
    (tmp_path / "t.csv").write_text("a,b\n1,2\n3,4\n")
    with pytest.raises(ValueError, match="work on one text field"):
        run(
            IngestConfig(
                source=str(tmp_path / "t.csv"),
                dest=str(tmp_path / "ds"),
                near_dup_threshold=0.8,
                progress="none",
            )
        )


def test_text_source_near_dup_then_tokenized(tmp_path: Path) -> None:
    """The pretraining path in one run: a .jsonl.zst corpus, near-duplicates removed on Ray,
    the kept documents tokenized and packed with their boundaries."""
    import zstandard

    from support.token_docs import byte_bpe

    corpus = make_planted_corpus(bases=40, seed=3, words=(20, 60))
    body = "".join(json.dumps({"text": d}) + "\n" for d in corpus.docs).encode()
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "c.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(body))
    tok = byte_bpe(tmp_path / "tok.json", corpus.docs[:50])
    result = run(
        IngestConfig(
            source=str(tmp_path / "src"),
            dest=str(tmp_path / "ds"),
            format="arrow",
            tokenizer=tok,
            seq_len=64,
            packing="best-fit",
            near_dup_threshold=THRESHOLD,
            progress="none",
        )
    )
    m = result.manifest
    assert m.source["format"] == "text"  # auto-detected from the .zst
    removed = m.skipped.get("duplicate", 0) + m.skipped["near_duplicate"]
    assert removed > 20
    assert m.extra["tokens"]["documents"] == len(corpus.docs) - removed


def test_samples_without_text_are_never_duplicates_of_each_other() -> None:
    from flashfeed.ingest.neardup import _rows

    opts = NearDupOptions(threshold=THRESHOLD)
    rows, (signed, _, _) = _rows(opts, [0, 1, 2, 3], ["", "", "the same words here",
                                                   "the same words here"])  # fmt: skip
    assert sorted(set(rows["doc"].tolist())) == [2, 3] and signed.tolist() == [2, 3]
    edges = candidate_pairs(opts.bands_rows[0], rows)
    assert clusters(edges) == {2: 2, 3: 2}
    assert edges[:, 2].max() == 1  # linked as exact duplicates
