"""The collector: runs a transformers model on RULER-style inputs and writes per-input logs
(docs/COLLECTION.md, docs/SCHEMA.md), and deploys the PAGE gate (:mod:`collectors.deploy`).

Its modules form a one-way order of layers; each imports only from the layers before it (lazy
imports included), and from :mod:`pagestats` only the NumPy/pyarrow parts (``defaults``,
``schema``, ``profile``; ``gatefile`` in ``deploy``, ``io`` in ``ray_launcher``):

0. :mod:`collectors.extras` — which extra each entry point needs, named in one line when missing
   (imports nothing of torch or of the collector).
1. :mod:`collectors.hf` — the transformers adapters: everything version-specific about
   transformers (the cache keyword, text config, attention registries, the decode kernel choice
   ``decode_attn_impl``); :mod:`collectors.tasks` — RULER-style inputs and scoring (no other
   collector module).
2. :mod:`collectors.model` — the checks made before the weights are read
   (:mod:`~collectors.model.checks`), then the loading (:mod:`~collectors.model.load`).
3. :mod:`collectors.evictors` — one class per base evictor, keyed by its CLI name: the keep rule
   (budget rule, protection) written once, each evictor's score; kvpress presses among them.
4. :mod:`collectors.capture` — the prefill with the observation window ā (and H2O's scores) captured.
5. :mod:`collectors.signals` — a_ℓ, pair Jaccards, D (Eq. 3) and the other prefill signals.
6. :mod:`collectors.decode` — evicted caches and the batched greedy decode of arms, the stop rule.
7. :mod:`collectors.sweep` — one prefill → the full-KV arm and every (evictor, budget) arm.
8. :mod:`collectors.writer` — sharded, atomic, resumable parquet output and the manifest.
9. :mod:`collectors.run` (the collection loop) → :mod:`collectors.ray_launcher` (Ray shards) →
    :mod:`collectors.cli` (``pagestats-collect``); beside them :mod:`collectors.deploy`
    (gate → log → ``GatedPress`` / ``gated_generate``).
"""
