#!/usr/bin/env bash
# PolyKAN on the GPU machine: the poly tests (cpu and cuda, CUDA-graph capture included), the host-overhead
# counts, and the benchmark. Usage: OUT=/some/dir scripts/poly_gpu_check.sh   (OUT defaults to ./poly_gpu_out)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-poly_gpu_out}"
mkdir -p "$OUT"
status=0
python3 -m pytest tests/test_poly.py -q -x 2>&1 | tee "$OUT/test_poly.txt" || status=1
python3 -m pytest tests/test_native.py -q -k poly 2>&1 | tee "$OUT/test_native_poly.txt" || status=1
# host cost per call with the kernel bodies skipped (CPU; counts of launches/allocations are device-independent)
python3 scripts/poly_host_overhead.py --repeat 1000 2>&1 | grep '^|' | tee "$OUT/host_overhead.md" || status=1
python3 -m warpkan.cli bench poly --device cuda --out "$OUT/bench" 2>&1 | tee "$OUT/bench.txt" || status=1
exit $status
