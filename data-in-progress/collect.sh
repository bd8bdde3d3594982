#!/bin/bash
# Re-collection of issue 22 (decode limits that fit the task): the tasks whose full-KV answers hit the
# shipped runs' 32-token limit, with the per-task defaults (niah 128, vt 64, fwe 50), the shipped runs'
# 8 evictors, kvpress environment, two single-threaded shards at once. Resumable: rerun this script.
set -u
cd "$(dirname "$0")/.."
EVICTORS=snapkv,snapkv-perhead,h2o,h2o-perhead,streamingllm,pyramidkv,snapkv-perlayer,kvpress:SnapKVPress:window_size=32
COMMON="--k-max 64 --part-size 2 --dtype float32 --device cpu --no-progress"
run() {  # context n out
  for s in 0 1; do
    OMP_NUM_THREADS=1 .venv-kvpress/bin/pagestats-collect --shard $s/2 --tasks niah_multikey_3,vt,fwe \
      --context-length "$1" --n "$2" --evictors $EVICTORS $COMMON --out "data-in-progress/$3" \
      > "data-in-progress/$3.shard$s.log" 2>&1 &
  done
  wait
}
run 512 50 smollm2-512-ruler-limits
run 1024 25 smollm2-1024-ruler-limits
