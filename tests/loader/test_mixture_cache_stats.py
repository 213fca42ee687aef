"""A mixture's sources share one node cache, and each reports its own counters:
``stats()["cache"]["sources"][name]`` counts that source's shards, not the whole cache's."""

from __future__ import annotations

from flashfeed.dataset import Dataset
from flashfeed.loader import TokenLoader
from flashfeed.plan.mixture import Mixture, Source

from support.loader_helpers import make_token_dataset


def test_cache_counters_per_source_are_each_sources_own(s3_prefix, s3_info, tmp_path):
    opts = s3_info.storage_options()
    urls = {}
    for name, sizes in (("x", [20, 25]), ("y", [30, 10, 12])):
        urls[name] = f"{s3_prefix}/{name}"
        make_token_dataset(urls[name], sizes, seq_len=4, storage_options=opts)
    mix = Mixture((Source(urls["x"], 1, "x"), Source(urls["y"], 1, "y")))
    loader = TokenLoader(mix, batch_size=5, cache_dir=str(tmp_path / "cache"),
                         storage_options=opts, drop_last=False)  # fmt: skip
    keys = [k for b in loader for k in b["__key__"]]
    stats = loader.stats()["cache"]
    loader.close()
    for name in ("x", "y"):
        read = {k.split(":", 1)[1].rsplit("/", 1)[0] for k in keys if k.startswith(name + ":")}
        ds = Dataset.open(urls[name], storage_options=opts)
        own = stats["sources"][name]
        assert own["misses"] == len(read)  # a cold cache: each shard read fetched once
        assert own["bytes_fetched"] == sum(s.bytes for s in ds.shards if s.path in read)
    assert (stats["sources"]["x"]["bytes_fetched"] + stats["sources"]["y"]["bytes_fetched"]
            == stats["bytes_fetched"])  # fmt: skip
