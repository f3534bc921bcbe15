#!/usr/bin/env bash
# Drives the qkv program as a user would: help, good and bad input, exit codes.
set -u
QKV="$1"
FIXTURES="$2"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0
check() {  # check NAME EXPECTED_STATUS(0|nonzero) COMMAND...
  local name="$1" expect="$2"
  shift 2
  "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  if { [ "$expect" = 0 ] && [ $rc -ne 0 ]; } || { [ "$expect" = nonzero ] && [ $rc -eq 0 ]; }; then
    echo "FAIL $name: exit $rc"; sed 's/^/  stderr: /' "$tmp/err"; failures=$((failures + 1))
  else
    echo "ok   $name"
  fi
}
one_line_error() {  # the last check's stderr is exactly one line starting with "qkv:"
  local name="$1"
  if [ "$(wc -l <"$tmp/err")" -ne 1 ] || ! grep -q '^qkv: ' "$tmp/err"; then
    echo "FAIL $name: expected one 'qkv: ...' line on stderr, got:"; cat "$tmp/err"; failures=$((failures + 1))
  fi
}

check "help" 0 "$QKV" --help
grep -q inspect "$tmp/out" || { echo "FAIL help lists inspect"; failures=$((failures + 1)); }
check "inspect --help" 0 "$QKV" inspect --help
check "bench --help" 0 "$QKV" bench --help
check "nonsense flag" nonzero "$QKV" --no-such-flag
one_line_error "nonsense flag"
check "unknown subcommand" nonzero "$QKV" frobnicate
one_line_error "unknown subcommand"

check "inspect python file" 0 "$QKV" inspect "$FIXTURES/python_written_np.safetensors"
for want in f32 F16 I64 '\[2,3\]' 'parameters' 'source'; do
  grep -q "$want" "$tmp/out" || { echo "FAIL inspect output lacks $want"; cat "$tmp/out"; failures=$((failures + 1)); }
done
check "inspect --json" 0 "$QKV" inspect --json "$FIXTURES/python_written_np.safetensors"
grep -q '"parameter_count": *15' "$tmp/out" || { echo "FAIL inspect --json count"; cat "$tmp/out"; failures=$((failures + 1)); }

check "inspect missing file" nonzero "$QKV" inspect "$tmp/nope.safetensors"
one_line_error "inspect missing file"
head -c 5 "$FIXTURES/python_written_np.safetensors" >"$tmp/short.safetensors"
check "inspect truncated file" nonzero "$QKV" inspect "$tmp/short.safetensors"
one_line_error "inspect truncated file"
grep -q "shorter than the 8-byte header" "$tmp/err" || { echo "FAIL truncated message"; failures=$((failures + 1)); }
head -c 300 "$FIXTURES/python_written_np.safetensors" >"$tmp/cut.safetensors"
check "inspect cut data" nonzero "$QKV" inspect "$tmp/cut.safetensors"
one_line_error "inspect cut data"

# A model folder: the demo writes one; inspect reads it back.
check "demo" 0 "$QKV" demo --out "$tmp/demo" --steps 150
[ -f "$tmp/demo/model.safetensors" ] && [ -f "$tmp/demo/config.json" ] || { echo "FAIL demo wrote no model"; failures=$((failures + 1)); }
ls "$tmp/demo" | grep -q 'tmp' && { echo "FAIL demo left temporary files"; failures=$((failures + 1)); }
check "inspect model folder" 0 "$QKV" inspect "$tmp/demo"
grep -q 'fc1.weight' "$tmp/out" || { echo "FAIL folder inspect lacks fc1.weight"; failures=$((failures + 1)); }
check "demo bad steps" nonzero "$QKV" demo --out "$tmp/demo2" --steps -3
one_line_error "demo bad steps"

# Benchmarks: a tiny run of each suite prints its table; a wrong suite is one clear error.
check "bench attention tiny" 0 "$QKV" bench attention --n 64 96 --seconds 0.01 --python false
grep -q "flash" "$tmp/out" && grep -q "naive" "$tmp/out" || { echo "FAIL bench attention table"; cat "$tmp/out"; failures=$((failures + 1)); }
check "bench attention json" 0 "$QKV" bench attention --json --n 64 --seconds 0.01 --python false
grep -q '"peak_extra_bytes"' "$tmp/out" || { echo "FAIL bench attention json"; failures=$((failures + 1)); }
check "bench unknown suite" nonzero "$QKV" bench frobnicate
one_line_error "bench unknown suite"

if [ $failures -ne 0 ]; then echo "$failures CLI check(s) failed"; exit 1; fi
echo "all CLI checks passed"
