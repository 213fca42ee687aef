"""flashfeed.loader.image.image."""
