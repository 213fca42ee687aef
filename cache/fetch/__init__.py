"""Fetching shards into the cache: ranged GETs in need order, adaptive concurrency, fills."""
