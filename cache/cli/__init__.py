"""flashfeed.cache.cli."""
