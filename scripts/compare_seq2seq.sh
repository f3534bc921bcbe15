#!/usr/bin/env bash
# C17: convolution, recurrence and attention on one corpus. Trains the three
# shipped zh-ja recipes on the same data with the same steps and batches and
# prints markdown tables: parameters, held-out chrF after 100/200/400 steps,
# final chrF with its 95% bootstrap interval, BLEU and exact match, training
# seconds and target tokens/s (the last progress line, validation included),
# greedy decoding sentences/s (qkv eval on the held-out set, model loading
# included); on the hard tier also chrF per category.
#
# Usage: scripts/compare_seq2seq.sh [--tier easy|hard] [--steps N] [OUT_DIR]
#   easy (default): 20,000 distinct pairs of the demo's grammar (like the demo's corpus until it drew
#     them with repeats, 2026-12-05) and 500 held out, the recipes' 400 steps
#   hard: qkv data synth-zh-ja --tier hard, 20,000 pairs and 1,000 held out, 1,200 steps unless --steps
set -euo pipefail
cd "$(dirname "$0")/.."
QKV=build/release/qkv
TIER=easy
STEPS=
while [ $# -gt 0 ]; do
  case "$1" in
    --tier) TIER=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    -*) echo "compare_seq2seq.sh: unknown option $1" >&2; exit 2 ;;
    *) break ;;
  esac
done
case "$TIER" in easy|hard) ;; *) echo "compare_seq2seq.sh: --tier easy or hard, not $TIER" >&2; exit 2 ;; esac
OUT=${1:-out/compare-$TIER}
mkdir -p "$OUT"
TRAIN=$OUT/zh-ja.train.tsv
TEST=$OUT/zh-ja.test.tsv
HELD_OUT=500
[ "$TIER" = hard ] && HELD_OUT=1000
$QKV data synth-zh-ja --tier "$TIER" --pairs 20000 --seed 1 --out "$TRAIN" >/dev/null
$QKV data synth-zh-ja --tier "$TIER" --pairs $HELD_OUT --seed 2 --exclude "$TRAIN" --out "$TEST" >/dev/null
[ -z "$STEPS" ] && [ "$TIER" = hard ] && STEPS=1200
STEP_ARGS=()
[ -n "$STEPS" ] && STEP_ARGS=(--steps "$STEPS")

for recipe in conv rnn-attention transformer; do
  dir=$OUT/$recipe
  rm -rf "$dir"
  echo "training $recipe (${STEPS:-400} steps) ..." >&2
  start=$(date +%s)
  $QKV train --config configs/$recipe-zh-ja.json --train "$TRAIN" --valid "$TEST" --out "$dir" "${STEP_ARGS[@]}" \
    >"$OUT/$recipe.log"
  echo $(( $(date +%s) - start )) >"$OUT/$recipe.seconds"
  $QKV inspect --json "$dir" >"$OUT/$recipe.inspect.json"
  start=$(date +%s%N)
  $QKV eval --json --model "$dir" --test "$TEST" >"$OUT/$recipe.eval.json"
  echo $(( $(date +%s%N) - start )) >"$OUT/$recipe.eval_ns"
done

python3 - "$OUT" <<'PY'
import json, re, sys
out = sys.argv[1]
rows, categories = [], []
for recipe in ("conv", "rnn-attention", "transformer"):
    e = json.load(open(f"{out}/{recipe}.eval.json"))
    params = json.load(open(f"{out}/{recipe}.inspect.json"))["parameter_count"]
    hist = {h["step"]: h["chrf"] for h in json.load(open(f"{out}/{recipe}/trainer_state.json"))["history"]}
    tps = re.findall(r"([0-9]+) tok/s", open(f"{out}/{recipe}.log").read())
    secs = int(open(f"{out}/{recipe}.seconds").read())
    decode = e["sentences"] * 1e9 / int(open(f"{out}/{recipe}.eval_ns").read())
    rows.append((recipe, params, hist, e, tps[-1] if tps else "?", secs, decode))
    for c in e.get("categories", {}):
        if c not in categories:
            categories.append(c)
print("| model | parameters | chrF @100 | chrF @200 | chrF @400 | chrF (95% interval) | BLEU | exact match "
      "| train s | train tokens/s | decode sentences/s |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for recipe, params, hist, e, tps, secs, decode in rows:
    at = " | ".join("%.2f" % hist[s] if s in hist else "-" for s in (100, 200, 400))
    lo, hi = e["chrf_ci95"]
    print(f"| {recipe} | {params:,} | {at} | {e['chrf']:.2f} ({lo:.2f}-{hi:.2f}) | {e['bleu']:.2f} "
          f"| {e['exact_match']:.1f}% | {secs} | {tps} | {decode:,.0f} |")
if categories:
    print()
    print("| category (held-out sentences) | " + " | ".join(r[0] for r in rows) + " |")
    print("|---|" + "---|" * len(rows))
    for c in categories:
        n = rows[0][3]["categories"][c]["sentences"]
        cells = []
        for r in rows:
            k = r[3]["categories"][c]
            cells.append("%.1f (%.1f-%.1f)" % (k["chrf"], k["chrf_ci95"][0], k["chrf_ci95"][1]))
        print(f"| {c} ({n}) | " + " | ".join(cells) + " |")
PY
