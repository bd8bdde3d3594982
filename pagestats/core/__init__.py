"""The definitions every stage reads: the log schema (v2), the paper's defaults, D (Eq. 3), the gate
rule and the metrics' SQL (Eq. 2), the column conventions, the policy registry, the escaping of names
for each output format and the checks of output paths.

Nothing here imports another stage of pagestats, and this file imports nothing, so that the collector
and a deployed gate (``collectors``) read the schema and a gate file without loading the analysis.
"""
