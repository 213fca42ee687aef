"""flashfeed.format."""
