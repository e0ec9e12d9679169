#!/usr/bin/env bash
# On the GPU machine, from the project root, after warp is staged into /tmp/site:
#   bash scripts/gpu_session.sh "<pytest targets>" "<bench families>" ["<pytest -k expression>"]
# The GPU machine's warp has no CPU compiler, so by default only the cuda-parametrised tests run there
# (the CPU ones run in CI).
# Runs the tests with cuda present (one xdist worker per core but one: the whole -k cuda selection took 246 s
# on the 16-core H200 machine from a cold kernel cache) and the benchmarks on cuda; logs and results go to $OUT.
set -uo pipefail
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
tests=${1:-tests}
families=${2:-}
select=${3:-cuda}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -m warpkan.cli info | tee -a "$OUT/gpu.txt"
if [ "$tests" != "none" ]; then
  workers=$(( $(nproc) > 2 ? $(nproc) - 1 : 1 ))
  python3 -m pytest $tests -k "$select" -q -p no:cacheprovider --timeout=900 -n "$workers" 2>&1 | tee "$OUT/tests.log" | tail -25
fi
for family in $families; do
  python3 -m warpkan.cli bench "$family" --device cuda --out "$OUT/bench" 2>&1 | tee "$OUT/bench-$family.log" | tail -40
done
