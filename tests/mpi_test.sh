#!/usr/bin/env bash
# Data-parallel training over MPI (docs/distributed.md), two processes on
# this machine: for each family, 20 steps with 2 processes x half the batch
# equal 20 steps of one process x the whole batch; --resume continues a
# 2-process run exactly; processes given different data refuse to start; a
# process killed mid-run ends the other with an error, and the last checkpoint
# still resumes.
#
#   mpi_test.sh QKV COMPARE_RUNS MPI(ON|OFF)
set -u
QKV="$1"
COMPARE="$2"
if [ "$3" != ON ]; then
  echo "skipped: qkv was built without MPI (scripts/install-deps.sh installs libopenmpi-dev)"
  exit 77
fi
command -v mpirun >/dev/null || { echo "FAIL: qkv was built with MPI but there is no mpirun"; exit 1; }
# CI runs as root, which Open MPI refuses unless told; two processes on a
# machine that may have fewer free cores.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPIRUN=(mpirun --oversubscribe --bind-to none -q)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0
fail() { echo "FAIL $*"; failures=$((failures + 1)); }
run() {  # run NAME COMMAND...: must succeed
  local name="$1"
  shift
  if "$@" >"$tmp/out" 2>"$tmp/err"; then echo "ok   $name"; else fail "$name: exit $?"; sed 's/^/  /' "$tmp/err" | tail -5; fi
}
# The bound, element by element: |a - b| <= 1e-7 + 1e-6 |a|. The two runs
# sum the same numbers in another order (each process averages its shard,
# the all-reduce adds the shards, the GEMMs see half the rows), so float32
# rounding differs in the last bits, and 20 AdamW steps carry it; a weight
# whose gradient crosses zero moves by a rounding-sized amount in absolute
# terms, hence the 1e-7 floor (about one float32 step at 1.0). A lost shard
# moves weights by about the learning rate, 1e-3 and more.
#
# AdamW's eps is 1e-4 here, not 1e-8. A step moves a weight by lr m / (sqrt(v)
# + eps): where the gradient g is near eps, the step follows g's rounding
# noise dg (about lr dg / eps), however small g is. With eps 1e-8, a weight
# whose gradient was 1.4e-8 (one of the 1,024 weights of the lm's first
# k_proj; the others moved a full first step, so their gradients were well above eps) stepped 1.45e-4 in one run and 3.8e-7 more or less in
# the other, past the floor, after a change of summation order in the
# attention kernel alone. With eps 1e-4, lr dg / eps is about 1e-9 for a dg
# of 1e-10 (float32's rounding of a gradient of 1e-3): two orders below the
# floor. (A doubled gradient shows only where g is near eps: elsewhere
# AdamW's step ignores the gradient's scale.)
same() {  # same NAME DIR_A DIR_B RTOL ATOL
  if "$COMPARE" "$2" "$3" "$4" "$5" >"$tmp/cmp"; then echo "ok   $1: $(tail -1 "$tmp/cmp")"; else fail "$1"; cat "$tmp/cmp"; fi
}

"$QKV" data synth-zh-ja --pairs 600 --out "$tmp/pairs.tsv" >/dev/null
cut -f2 "$tmp/pairs.tsv" >"$tmp/text.txt"
# No dropout (each process would draw its own masks) and no key bias: its
# true gradient is zero (softmax ignores a constant added to every score), so
# it only ever receives rounding noise, which AdamW scales to full steps.
printf '{"d_model": 32, "nhead": 4, "num_encoder_layers": 1, "num_decoder_layers": 1, "dim_feedforward": 64,
 "dropout": 0, "qkv_layout": "separate", "k_bias": false,
 "train": {"steps": 20, "batch_tokens": 512, "eval_every": 10, "eval_sentences": 8, "warmup_steps": 5,
 "adam_eps": 1e-4}}\n' >"$tmp/mt.json"
printf '{"arch": "decoder", "tokenizer": "bytes", "d_model": 32, "nhead": 4, "num_layers": 2, "dim_feedforward": 64,
 "context": 24, "dropout": 0, "qkv_layout": "separate", "k_bias": false,
 "train": {"steps": 20, "batch_size": 5, "eval_every": 10, "warmup_steps": 4, "adam_eps": 1e-4}}\n' >"$tmp/lm.json"
# 30 8x8 images of two classes (dark and light, with noise), as IDX files.
mkdir -p "$tmp/idx"
idx_images() {
  printf '\0\0\010\003\0\0\0\036\0\0\0\010\0\0\0\010'
  LC_ALL=C awk 'BEGIN { srand(7); for (i = 0; i < 30; i++) for (p = 0; p < 64; p++)
    printf "%c", (i % 2 ? 128 : 0) + int(rand() * 120) + 1 }'
}
idx_images >"$tmp/idx/train-images-idx3-ubyte"
{ printf '\0\0\010\001\0\0\0\036'; for i in $(seq 15); do printf '\0\001'; done; } >"$tmp/idx/train-labels-idx1-ubyte"
cp "$tmp/idx/train-images-idx3-ubyte" "$tmp/idx/t10k-images-idx3-ubyte"
cp "$tmp/idx/train-labels-idx1-ubyte" "$tmp/idx/t10k-labels-idx1-ubyte"
printf '{"arch": "vit", "image_size": 8, "patch_size": 4, "d_model": 16, "nhead": 2, "num_layers": 1, "num_classes": 2,
 "dropout": 0, "qkv_bias": false,
 "train": {"epochs": 3, "batch_size": 7, "warmup_steps": 2, "augment_flip": true, "adam_eps": 1e-4}}\n' >"$tmp/vit.json"

for family in mt lm vit; do
  data="$tmp/pairs.tsv"
  [ $family = lm ] && data="$tmp/text.txt"
  [ $family = vit ] && data="$tmp/idx"
  run "$family: one process" "$QKV" train --config "$tmp/$family.json" --train "$data" --out "$tmp/$family-1" --threads 1
  run "$family: 2 processes" "${MPIRUN[@]}" -np 2 "$QKV" train --config "$tmp/$family.json" --train "$data" --out "$tmp/$family-2"
  grep -q "2 processes x 1 thread$" "$tmp/out" || fail "$family: the 2-process run does not say so"
  same "$family: 2 processes x half the batch = 1 x the whole" "$tmp/$family-1" "$tmp/$family-2" 1e-6 1e-7
done

# --resume with the same number of processes continues exactly.
run "resume: first 10 steps" "${MPIRUN[@]}" -np 2 "$QKV" train --config "$tmp/mt.json" --train "$tmp/pairs.tsv" --out "$tmp/half" --steps 10
run "resume: steps 11-20" "${MPIRUN[@]}" -np 2 "$QKV" train --config "$tmp/mt.json" --train "$tmp/pairs.tsv" --out "$tmp/half" --resume
same "resume: 10 + 10 steps = 20 steps" "$tmp/mt-2" "$tmp/half" 0 0

# Two "machines": network namespaces joined by a veth pair, one process in
# each, Open MPI's TCP transport on their addresses only. mpirun starts in the
# first; its "ssh" to the second is `ip netns exec` (the file system is shared,
# as a cluster's is). Needs root (CAP_NET_ADMIN): CI has it; elsewhere this
# part says it is skipped.
a="qkv$$a" b="qkv$$b"
cleanup_netns() { ip netns del "$a" 2>/dev/null; ip netns del "$b" 2>/dev/null; }
trap 'cleanup_netns; rm -rf "$tmp"' EXIT
if ip netns add "$a" 2>/dev/null && ip netns add "$b" && ip link add "${a}v" type veth peer name "${b}v" &&
    ip link set "${a}v" netns "$a" && ip link set "${b}v" netns "$b" &&
    ip -n "$a" addr add 10.77.0.1/24 dev "${a}v" && ip -n "$b" addr add 10.77.0.2/24 dev "${b}v" &&
    ip -n "$a" link set "${a}v" up && ip -n "$b" link set "${b}v" up && ip -n "$a" link set lo up && ip -n "$b" link set lo up; then
  printf '#!/bin/sh\n# the ssh of mpirun: HOST COMMAND, run in the namespace of the second host\nshift\nexec ip netns exec %s /bin/sh -c "$*"\n' "$b" >"$tmp/agent.sh"
  chmod +x "$tmp/agent.sh"
  printf '10.77.0.1 slots=1\n10.77.0.2 slots=1\n' >"$tmp/hosts"
  run "two hosts: 2 processes over TCP between network namespaces" timeout 120 ip netns exec "$a" "${MPIRUN[@]}" \
    --hostfile "$tmp/hosts" -np 2 --mca plm_rsh_agent "$tmp/agent.sh" --mca btl self,tcp \
    --mca btl_tcp_if_include 10.77.0.0/24 --mca oob_tcp_if_include 10.77.0.0/24 \
    "$QKV" train --config "$tmp/mt.json" --train "$tmp/pairs.tsv" --out "$tmp/hosts-2"
  same "two hosts: 2 processes x half the batch = 1 x the whole" "$tmp/mt-1" "$tmp/hosts-2" 1e-6 1e-7
else
  echo "skipped two hosts: cannot create network namespaces here (needs root with CAP_NET_ADMIN and iproute2)"
fi
cleanup_netns

# With dropout each process draws its own masks from its own stream, and a
# resume gives each its own back: 10 + 10 steps are 20, bit for bit. A
# resume with another number of processes is refused.
sed 's/"dropout": 0,/"dropout": 0.2,/' "$tmp/mt.json" >"$tmp/mtd.json"
run "dropout: 20 steps" "${MPIRUN[@]}" -np 2 "$QKV" train --config "$tmp/mtd.json" --train "$tmp/pairs.tsv" --out "$tmp/drop"
run "dropout: first 10 steps" "${MPIRUN[@]}" -np 2 "$QKV" train --config "$tmp/mtd.json" --train "$tmp/pairs.tsv" --out "$tmp/drop-half" --steps 10
run "dropout: steps 11-20" "${MPIRUN[@]}" -np 2 "$QKV" train --config "$tmp/mtd.json" --train "$tmp/pairs.tsv" --out "$tmp/drop-half" --resume
same "dropout: 10 + 10 steps = 20 steps, each process its own masks" "$tmp/drop" "$tmp/drop-half" 0 0
if "$QKV" train --config "$tmp/mtd.json" --train "$tmp/pairs.tsv" --out "$tmp/drop-half" --steps 30 --resume >"$tmp/out" 2>"$tmp/err"; then
  fail "resume a 2-process run with one: ran"
else
  grep -q "this run was saved by 2 processes, not 1; resume it with as many (mpirun -np 2)" "$tmp/err" &&
    echo "ok   resume a 2-process run with one: refused" || { fail "resume with another N: no clear error"; cat "$tmp/err"; }
fi

# Processes started on different data refuse, all of them, before any step.
head -n 500 "$tmp/pairs.tsv" >"$tmp/fewer.tsv"
if "${MPIRUN[@]}" -np 1 "$QKV" train --config "$tmp/mt.json" --train "$tmp/pairs.tsv" --out "$tmp/mixed" : \
    -np 1 "$QKV" train --config "$tmp/mt.json" --train "$tmp/fewer.tsv" --out "$tmp/mixed" >"$tmp/out" 2>"$tmp/err"; then
  fail "different data: started"
elif ! grep -q "every process must run the same command on the same files" "$tmp/err"; then
  fail "different data: no clear error"; cat "$tmp/err"
elif [ -e "$tmp/mixed/trainer_state.safetensors" ]; then
  fail "different data: wrote a checkpoint"
else
  echo "ok   different data: refused ($(grep -m1 '^qkv' "$tmp/err"))"
fi

# Only qkv train runs across processes.
if "${MPIRUN[@]}" -np 2 "$QKV" translate --model "$tmp/mt-2" </dev/null >"$tmp/out" 2>"$tmp/err"; then
  fail "translate under mpirun -np 2: ran"
else
  grep -q "only qkv train runs across the processes" "$tmp/err" && echo "ok   translate under mpirun -np 2: refused" ||
    { fail "translate under mpirun -np 2: no clear error"; cat "$tmp/err"; }
fi

# A process killed mid-run: the other ends, non-zero, within seconds; the
# last checkpoint resumes.
printf '{"d_model": 32, "nhead": 4, "num_encoder_layers": 1, "num_decoder_layers": 1, "dim_feedforward": 64,
 "train": {"steps": 100000, "batch_tokens": 512, "eval_every": 20, "eval_sentences": 2}}\n' >"$tmp/long.json"
"${MPIRUN[@]}" -np 2 "$QKV" train --config "$tmp/long.json" --train "$tmp/pairs.tsv" --out "$tmp/killed" \
  >"$tmp/killed.out" 2>"$tmp/killed.err" &
launcher=$!
for _ in $(seq 300); do [ -e "$tmp/killed/trainer_state.safetensors" ] && break; sleep 0.1; done
victim=$(pgrep -n -f -- "--out $tmp/killed")  # the newest: one of the two qkv processes
if [ -z "$victim" ] || [ ! -e "$tmp/killed/trainer_state.safetensors" ]; then
  fail "kill: the run never saved a checkpoint"; kill "$launcher" 2>/dev/null
else
  kill -9 "$victim"
  start=$(date +%s)
  wait "$launcher"
  rc=$?
  took=$(( $(date +%s) - start ))
  if [ $rc -eq 0 ]; then
    fail "kill: mpirun exited 0"
  elif [ "$took" -gt 20 ]; then
    fail "kill: the other process took $took s to end"
  else
    echo "ok   kill: mpirun exited $rc after $took s"
  fi
  pgrep -f -- "--out $tmp/killed" >/dev/null && { fail "kill: a process is left"; pkill -9 -f -- "--out $tmp/killed"; }
  run "kill: the last checkpoint resumes" "${MPIRUN[@]}" -np 2 "$QKV" train --config "$tmp/long.json" --train "$tmp/pairs.tsv" \
    --out "$tmp/killed" --resume --steps "$(( $(grep -o '"step": [0-9]*' "$tmp/killed/trainer_state.json" | head -1 | grep -o '[0-9]*$') + 2 ))"
fi

echo "$failures failures"
[ "$failures" -eq 0 ]
