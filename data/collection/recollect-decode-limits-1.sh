#!/bin/bash
# Re-collection of issue 22 (decode limits that fit the task), in order of what the 32-token limit cut:
# full-KV answers that end inside a reference (niah_multikey_3 16/50 and niah_multiquery 13/50 at 512;
# MK3 8/15 in the draw-1 run, 3/25 at 1,024 and 6/25 in the query-agnostic run). Per-task default limits
# (niah 128), the shipped runs' evictors, kvpress environment, two single-threaded shards at once.
# Resumable: rerun this script (finished inputs are skipped).
set -u
cd "$(dirname "$0")/../.."
EVICTORS=snapkv,snapkv-perhead,h2o,h2o-perhead,streamingllm,pyramidkv,snapkv-perlayer,kvpress:SnapKVPress:window_size=32
COMMON="--k-max 64 --part-size 2 --dtype float32 --device cpu --no-progress"
run() {  # tasks context n out evictors [extra options]
  for s in 0 1; do
    OMP_NUM_THREADS=1 .venv-kvpress/bin/pagestats-collect --shard $s/2 --tasks "$1" \
      --context-length "$2" --n "$3" --evictors "$5" $COMMON ${6:-} --out "parts/$4" \
      >> "parts/$4.shard$s.log" 2>&1 &
  done
  wait
}
run niah_multikey_3,niah_multiquery 512 50 smollm2-512-ruler-limits $EVICTORS
run niah_multikey_3 512 15 smollm2-512-draw1-ruler-limits snapkv "--seed 1"
run niah_multikey_3 1024 25 smollm2-1024-ruler-limits $EVICTORS
run niah_multikey_3 512 25 smollm2-512-query-agnostic-ruler-limits $EVICTORS "--mode query-agnostic"
