"""What a loader tells about itself: batch stats, Prometheus metrics, live status, ledgers."""
