#!/usr/bin/env bash
# pagestats-collect as a SLURM job array, for clusters without Ray: array task i runs shard i/N.
# The writer is atomic and resumable, so a preempted or requeued task reruns the same command and
# skips what it finished; rerun a failed index with `sbatch --array=3 docs/slurm_collect.sh`.
# Submit from the repository root (after `make gpu-env`), then validate once the array is done:
#   JOB=$(sbatch --parsable docs/slurm_collect.sh)
#   sbatch --dependency=afterok:$JOB --wrap ".venv-gpu/bin/pagestats validate runs/qwen15b-4k"
# MODEL, OUT, DEVICE, DTYPE and PYTHON may be set in the environment; arguments are passed on.
#SBATCH --job-name=pagestats-collect
#SBATCH --array=0-7
#SBATCH --gres=gpu:1
#SBATCH --cpus-per-task=4
#SBATCH --time=12:00:00
#SBATCH --requeue
set -euo pipefail
PYTHON=${PYTHON:-.venv-gpu/bin/python}
MODEL=${MODEL:-Qwen/Qwen2.5-1.5B-Instruct}
OUT=${OUT:-runs/qwen15b-4k}
DEVICE=${DEVICE:-cuda}
DTYPE=${DTYPE:-bfloat16}
exec "$PYTHON" -m collectors --model "$MODEL" --device "$DEVICE" --dtype "$DTYPE" \
    --tasks niah_multikey_3,niah_multiquery,vt,fwe --context-length 4096 --n 100 --out "$OUT" \
    --shard "$SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT" --no-progress "$@"
