#!/usr/bin/env bash
# UKAN on the GPU machine: the ukan tests on cuda (CUDA-graph capture included), the benchmark, the per-path timings.
# Usage: OUT=/some/dir bash scripts/ukan_gpu_check.sh
set -euo pipefail
OUT="${OUT:-/tmp/ukan_gpu_check}"
mkdir -p "$OUT"
python3 -m pytest tests/test_ukan.py -q -x -rs 2>&1 | tee "$OUT/tests.txt"
python3 -m warpkan.cli bench ukan --device cuda --out "$OUT/bench" 2>&1 | tee "$OUT/bench.txt"
python3 scripts/ukan_perf.py --out "$OUT" 2>&1 | grep "N=" | tee "$OUT/perf.txt"
python3 scripts/ukan_host_overhead.py 2>&1 | grep "N=" | tee "$OUT/host_overhead.txt"
