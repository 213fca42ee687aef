"""The development S3 server's old import path: it lives in ``flashfeed.cli.devstore``."""

from __future__ import annotations

from flashfeed.cli.devstore import DEFAULT_BUCKET, EmbeddedStore, StoreInfo, find_weed

__all__ = ["DEFAULT_BUCKET", "EmbeddedStore", "StoreInfo", "find_weed"]
