#!/bin/bash
# Re-collection of issue 22, stage 3: the tasks the old 32-token limit still cuts at 512
# (niah_multivalue 19/50 full-KV answers cut inside a reference; vt 50/50 and fwe 41/50 stopped at
# the limit with reason unknown). Per-task default limits (niah 128, vt 64, fwe 50), the shipped
# runs' evictors, kvpress environment, one single-threaded process at low priority (one core of
# its own). Resumable: rerun this script (finished inputs are skipped).
set -u
cd "$(dirname "$0")/../.."
EVICTORS=snapkv,snapkv-perhead,h2o,h2o-perhead,streamingllm,pyramidkv,snapkv-perlayer,kvpress:SnapKVPress:window_size=32
COMMON="--k-max 64 --part-size 2 --dtype float32 --device cpu --no-progress"
for task in niah_multivalue vt fwe; do
  OMP_NUM_THREADS=1 nice -n 10 .venv-kvpress/bin/pagestats-collect --tasks "$task" \
    --context-length 512 --n 50 --evictors $EVICTORS $COMMON --out "parts/smollm2-512-$task-ruler-limits" \
    >> "parts/smollm2-512-$task-ruler-limits.log" 2>&1
done
