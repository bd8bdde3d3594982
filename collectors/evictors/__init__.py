"""Base evictors: one class per evictor, one registry keyed by the CLI name (PAGE §4, Table 2, App. C).

Each evictor turns one prefill into the prompt positions an arm keeps. :class:`Evictor` writes the
keep rule once (the budget rule, protection, deterministic top selection); each evictor writes only
its score. ``kvpress:<Press>`` presses keep kvpress's own rule. :func:`parse` is the one reader of an
evictor's name.
"""

from collectors.evictors.base import Evictor, n_kept
from collectors.evictors.registry import EVICTORS, capture_options, parse, parse_all

__all__ = ["EVICTORS", "Evictor", "capture_options", "n_kept", "parse", "parse_all"]
