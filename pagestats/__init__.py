"""pagestats: offline analysis of gated KV-cache eviction logs (PAGE).

Data flows one way: logs → :mod:`pagestats.io` → :mod:`pagestats.replay` →
:mod:`pagestats.metrics` / :mod:`pagestats.stats` → :mod:`pagestats.tables` /
:mod:`pagestats.figures` → :mod:`pagestats.report` and the CLI. Nothing here imports
torch or transformers.
"""

__version__ = "0.1.0"
