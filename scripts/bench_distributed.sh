#!/usr/bin/env bash
# Data-parallel scaling on this machine (docs/distributed.md): the same
# training, one process with all threads against mpirun with one process per
# core and a thread each, on the shape of `qkv bench train` (d_model 256,
# 4 heads, 3+3 layers, ff 1024; a global batch of 4096 tokens). Prints the
# tokens/s of both, their ratio, and the measured share of step time spent
# waiting in the all-reduce.
#
#   scripts/bench_distributed.sh [STEPS] [QKV]
set -euo pipefail
steps="${1:-40}"
qkv="${2:-build/release/qkv}"
cores=$(nproc)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
"$qkv" data synth-zh-ja --pairs 20000 --out "$tmp/pairs.tsv" >/dev/null
printf '{"d_model": 256, "nhead": 4, "num_encoder_layers": 3, "num_decoder_layers": 3, "dim_feedforward": 1024,
 "dropout": 0.1, "train": {"steps": %d, "batch_tokens": 4096, "warmup_steps": 10, "eval_every": 100000,
 "eval_sentences": 0}}\n' "$steps" >"$tmp/config.json"

rate() { grep -o '[0-9]* tok/s' "$1" | tail -1 | grep -o '^[0-9]*'; }
echo "CPU: $(lscpu | sed -n 's/^Model name: *//p'), $cores cores; $steps steps of up to 4096 tokens"
"$qkv" train --config "$tmp/config.json" --train "$tmp/pairs.tsv" --out "$tmp/one" --threads "$cores" >"$tmp/one.log"
one=$(rate "$tmp/one.log")
echo "1 process x $cores threads:  $one tokens/s"
mpirun -q --bind-to core -np "$cores" "$qkv" train --config "$tmp/config.json" --train "$tmp/pairs.tsv" \
  --out "$tmp/many" >"$tmp/many.log"
many=$(rate "$tmp/many.log")
echo "$cores processes x 1 thread: $many tokens/s  ($(awk -v a="$many" -v b="$one" 'BEGIN { printf "%.2f", a / b }')x)"
grep '^all-reduce' "$tmp/many.log" | sed 's/^/  /'
