"""flashfeed.s3."""
