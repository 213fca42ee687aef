"""What every stage shares: one store start (``store``), one corpus maker (``corpus``), one
rounds runner (``rounds``), one results writer (``results``), and how a benchmark module runs
as a child (``child``)."""
