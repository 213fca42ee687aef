"""flashfeed.cache.warm."""
