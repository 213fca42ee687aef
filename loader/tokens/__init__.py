"""flashfeed.loader.tokens.tokens."""
