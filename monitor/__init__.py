"""The monitor room: what reads a loader's telemetry back, for people.

``flashfeed top`` (``top``: the ranks of this node and its cache, live, from the status files
and the cache's own counters), ``flashfeed report`` (``report``: a stats log summarized and
its stalls plotted as a PNG; ``htmlreport``: one page for a whole run) and the readers they
share (``status``: status files; ``runlog``: stats logs; ``binning``: batches into time
bins). The loader writes that telemetry (``flashfeed.loader.telemetry.stats``, ``.status``,
``.prometheus``) in the formats ``flashfeed.telemetry`` defines; nothing here imports torch,
DALI or the loader, so these commands run on any machine that can read the files.
"""

from __future__ import annotations

__all__: list[str] = []
