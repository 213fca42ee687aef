"""flashfeed.cli."""
