#!/usr/bin/env bash
# C17: convolution, recurrence and attention on one corpus. Trains the three
# shipped zh-ja recipes on the same data with the same budget and prints a
# markdown table: parameters, held-out chrF after 100/200/400 steps, final
# BLEU and exact match, training target tokens/s (the last progress line,
# validation time included), and greedy decoding sentences/s (qkv eval on the
# held-out set, model loading included).
# Usage: scripts/compare_seq2seq.sh [OUT_DIR]   (needs the demo's corpus: make demo, or it makes one)
set -euo pipefail
cd "$(dirname "$0")/.."
QKV=build/release/qkv
OUT=${1:-out/compare}
mkdir -p "$OUT"
TRAIN=out/demo/zh-ja.train.tsv
TEST=out/demo/zh-ja.test.tsv
if [ ! -f "$TRAIN" ] || [ ! -f "$TEST" ]; then
  TRAIN=$OUT/zh-ja.train.tsv
  TEST=$OUT/zh-ja.test.tsv
  $QKV data synth-zh-ja --pairs 20000 --seed 1 --out "$TRAIN" >/dev/null
  $QKV data synth-zh-ja --pairs 500 --seed 2 --exclude "$TRAIN" --out "$TEST" >/dev/null
fi
echo "| model | parameters | chrF @100 | chrF @200 | chrF @400 | BLEU | exact match | train tokens/s | decode sentences/s |"
echo "|---|---|---|---|---|---|---|---|---|"
for recipe in conv rnn-attention transformer; do
  dir=$OUT/$recipe
  $QKV train --config configs/$recipe-zh-ja.json --train "$TRAIN" --valid "$TEST" --out "$dir" >"$OUT/$recipe.log"
  tps=$(grep -o '[0-9]* tok/s' "$OUT/$recipe.log" | tail -1 | cut -d' ' -f1)
  params=$($QKV inspect --json "$dir" | python3 -c 'import json,sys; print(json.load(sys.stdin)["parameter_count"])')
  chrf=$(python3 -c "import json; h=json.load(open('$dir/trainer_state.json'))['history']; d={r['step']: r['chrf'] for r in h}; print(' | '.join('%.2f' % d.get(s, float('nan')) for s in (100, 200, 400)))")
  start=$(date +%s%N)
  scores=$($QKV eval --json --model "$dir" --test "$TEST")
  eval_ns=$(( $(date +%s%N) - start ))
  sents=$(python3 -c "import json; print(json.loads('$scores')['sentences'])")
  echo "| $recipe | $params | $chrf | $(python3 -c "import json; d=json.loads('$scores'); print('%.2f | %.1f%%' % (d['bleu'], d['exact_match']))") | $tps | $(( sents * 1000000000 / eval_ns )) |"
done
