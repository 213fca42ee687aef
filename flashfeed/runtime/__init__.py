"""flashfeed.runtime."""
