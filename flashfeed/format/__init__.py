"""The dataset contract's formats: manifest, shard table, tar and Arrow shards, indexes, media."""
