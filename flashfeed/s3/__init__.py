"""Our S3 client: SigV4 signing, signed and ranged GETs, the PUT path, options and retry rules."""
