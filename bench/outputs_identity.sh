#!/usr/bin/env bash
# Issue 44 §7: the report and whatif outputs of one code tree, to compare byte for byte with another's.
#   bench/outputs_identity.sh TREE OUTDIR     (run from anywhere; TREE is a checkout, OUTDIR is created)
# Then: diff -r OUTDIR_before OUTDIR_after. Every command reads the shipped logs of TREE with the code of TREE
# (PYTHONPATH=TREE ahead of the installed package) and a fresh cache, so no validation record is shared.
set -euo pipefail
TREE=$(cd "$1" && pwd); OUT=$(mkdir -p "$2" && cd "$2" && pwd)
PY=${PY:-/work/main/.venv/bin/python}
export PYTHONPATH="$TREE" PAGESTATS_CACHE_DIR="$OUT/.cache" MPLBACKEND=Agg
cd "$TREE"
ps() { "$PY" -m pagestats "$@"; }
if [ -d controls ]; then LOGS=$(ls -d data/smollm2-*/ controls/*/); else LOGS=$(ls -d data/smollm2-*/ data/controls/*/); fi
ps report $LOGS --out "$OUT/report" >"$OUT/report.stdout" 2>"$OUT/report.stderr"
ps import page data/page-release/condensed/ --out "$OUT/release-runs" --source-commit df8ad09b9d5d6e2c0e70f2bceaf9fc5c55ec4845 --quiet
ps report "$OUT"/release-runs/*/ --out "$OUT/report-release" >"$OUT/report-release.stdout" 2>"$OUT/report-release.stderr"
i=0
while read -r args; do
  i=$((i+1))
  for src in data release; do
    if [ $src = data ]; then L=$LOGS; else L=$(ls -d "$OUT"/release-runs/*/); fi
    ps whatif $L $args >"$OUT/whatif-$src-$i.out" 2>"$OUT/whatif-$src-$i.err" || echo "exit $?" >>"$OUT/whatif-$src-$i.out"
  done
  echo "$i: $args" >>"$OUT/whatif-commands.txt"
done <<'ARGS'
--format csv
--format table
--format csv --by task,budget
--tau 0.04 --format csv --by evictor,budget
--policy z --format csv
--policy midpoint --format csv
--policy oracle --format csv
--layers 1-6 --format csv
--pairs-fraction 0.5 --pair-draws 3 --format csv
--input-draws 5 --format csv
--wide
ARGS
# the report's files carry paths of OUT; write them relative so two OUTs compare
grep -rl "$OUT" "$OUT" --exclude-dir=.cache 2>/dev/null | xargs -r sed -i "s#$OUT#OUT#g"
rm -rf "$OUT/.cache"
echo "outputs of $TREE written to $OUT"
