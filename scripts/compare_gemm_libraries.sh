#!/usr/bin/env bash
# The GEMM libraries side by side on this CPU, for the README's choice:
# OpenBLAS as qkv loads it (kernel chosen from CPU features), OpenBLAS
# choosing its kernel itself (by CPU model), BLIS (kernels by CPU features)
# and oneDNN (JIT per instruction set), each sgemm on the shapes of
# `qkv bench ops`, with the same threads, in one run.
#
# Needs the libraries: apt-get install libblis4-openmp libdnnl2 (the
# comparison only; qkv itself uses OpenBLAS). Usage:
#   scripts/compare_gemm_libraries.sh [THREADS] [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
threads=${1:-$(nproc)}
seconds=${2:-0.2}
qkv=build/release/qkv
[ -x $qkv ] || { echo "compare_gemm_libraries: build first (make build)" >&2; exit 1; }
bin=$(mktemp -d)/gemm_libraries
trap 'rm -rf "$(dirname "$bin")"' EXIT
g++ -O2 -std=c++17 bench/gemm_libraries.cpp -o "$bin" -ldl

openblas=/usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so.0
blis=/usr/lib/x86_64-linux-gnu/blis-openmp/libblis.so.4
dnnl=$(ls /usr/lib/x86_64-linux-gnu/libdnnl.so.[0-9] 2>/dev/null | head -1 || true)
# The kernel qkv chooses, as `qkv info` reports it.
core=$($qkv info --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["gemm_kernel"])')

export OMP_NUM_THREADS=$threads BLIS_NUM_THREADS=$threads
$qkv info --threads "$threads"
echo
{
  OPENBLAS_CORETYPE=$core "$bin" "OpenBLAS $core (qkv's choice)" cblas $openblas "$seconds"
  env -u OPENBLAS_CORETYPE "$bin" "OpenBLAS (its own choice)" cblas $openblas "$seconds"
  OPENBLAS_CORETYPE=Prescott "$bin" "OpenBLAS Prescott (SSE3)" cblas $openblas "$seconds"
  if [ -e $blis ]; then "$bin" "BLIS" cblas $blis "$seconds"; else echo "compare_gemm_libraries: no BLIS ($blis)" >&2; fi
  if [ -n "$dnnl" ]; then "$bin" "oneDNN" dnnl "$dnnl" "$seconds"; else echo "compare_gemm_libraries: no oneDNN" >&2; fi
} | python3 -c '
import json, sys
rows = [json.loads(l) for l in sys.stdin]
labels = list(dict.fromkeys(r["label"] for r in rows))
shapes = list(dict.fromkeys(r["shape"] for r in rows))
g = {(r["label"], r["shape"]): r["gflops"] for r in rows}
kernel = {r["label"]: r["kernel"] for r in rows}
print("sgemm GFLOP/s, %s threads" % sys.argv[1])
print("%-32s" % "library (kernel)" + "".join("%12s" % s[:11] for s in shapes))
for l in labels:
    print("%-32s" % ("%s [%s]" % (l, kernel[l]))[:32] + "".join("%12.1f" % g.get((l, s), float("nan")) for s in shapes))
' "$threads"
