"""The `flashfeed cache` commands: warm, status, verify, evict."""
