"""The benchmark stages: each measures one part of flashfeed beside its peers and the limit
that bounds it, through the harness only; run one with ``python -m benchmarks.stages.<name>``."""
