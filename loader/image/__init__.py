"""The image loader: DALI pipelines, fields, labels, captions, buckets, video clips."""
