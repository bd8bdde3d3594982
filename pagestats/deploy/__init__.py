"""The gate outside the replay: ``calibrate`` freezes τ into ``gate.json`` (:mod:`.gatefile`; the
risk-controlled τ of Learn then Test in :mod:`.risk`), a deployed gate reads it (``collectors.deploy``),
and ``monitor`` compares the deployed gate's logs with its calibration.

This file imports nothing: :mod:`.gatefile` must load where polars and DuckDB are not installed.
"""
