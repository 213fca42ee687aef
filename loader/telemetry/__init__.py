"""flashfeed.loader.telemetry."""
