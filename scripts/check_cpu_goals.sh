#!/usr/bin/env bash
# #13's speed goals on the CPU this runs on, in one go: each bench with its
# PyTorch peer in the same run (rounds alternating), then one table of goal,
# measured ratio and whether it is met, headed by what `qkv info` says runs.
# The machines are shared and noisy: run it twice and report both.
#
#   scripts/check_cpu_goals.sh [PYTHON]     PYTHON: a Python with torch (default python3)
#
# Writes the benches' JSON to out/cpu-goals/ (one file per bench) and the
# table to stdout. Needs build/release/qkv (make build) and runs from the
# repository root.
set -euo pipefail
cd "$(dirname "$0")/.."
python="${1:-python3}"
qkv=build/release/qkv
[[ -x "$qkv" ]] || { echo "check_cpu_goals: $qkv not found; run make build first" >&2; exit 1; }
"$python" -c "import torch" 2>/dev/null || { echo "check_cpu_goals: $python has no torch (the peer)" >&2; exit 1; }
out=out/cpu-goals
mkdir -p "$out"
"$qkv" info > "$out/info.txt"
echo "bench vit (about 2 minutes) ..." >&2
"$qkv" bench vit --python "$python" --steps 20 --rounds 3 --json > "$out/vit.json"
echo "bench train (about 2 minutes) ..." >&2
"$qkv" bench train --python "$python" --rounds 3 --json > "$out/train.json"
echo "bench ops (about 3 minutes) ..." >&2
"$qkv" bench ops --python "$python" --rounds 3 --json > "$out/ops.json"
python3 - "$out" <<'PY'
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
info = (out / "info.txt").read_text().splitlines()
for line in info:
    if line.split(":")[0].strip() in ("cpu", "kernels", "gemm", "threads"):
        print(line)
vit = json.loads((out / "vit.json").read_text())
train = json.loads((out / "train.json").read_text())
ops = json.loads((out / "ops.json").read_text())
rows = [("bench vit, training / PyTorch", vit["train_ratio"], 1.5),
        ("bench vit, inference / PyTorch", vit["infer_ratio"], 1.2),
        ("bench train / PyTorch", train["ratio"], 1.5)]
for r in ops["matmul"]:
    rows.append((f"bench ops {r['name']} / faster peer", r.get("vs_best_peer"), 0.9))
print(f"\n{'goal':<48} {'measured':>9} {'needs':>6}  met")
missed = 0
for name, ratio, goal in rows:
    if ratio is None:
        print(f"{name:<48} {'-':>9} {goal:>5.2f}x  no peer")
        missed += 1
        continue
    ok = ratio >= goal
    missed += not ok
    print(f"{name:<48} {ratio:>8.2f}x {goal:>5.2f}x  {'yes' if ok else 'NO'}")
print(f"\n{len(rows) - missed} of {len(rows)} goals met in this run (JSON in {out}/)")
PY
