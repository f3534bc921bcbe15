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
grep -q '"parameter_count": *17' "$tmp/out" || { echo "FAIL inspect --json count"; cat "$tmp/out"; failures=$((failures + 1)); }

check "inspect a device" nonzero timeout 20 "$QKV" inspect /dev/zero
one_line_error "inspect a device"
check "train from a device" nonzero timeout 20 "$QKV" train --config /dev/zero --train /dev/null --out "$tmp/dev"
one_line_error "train from a device"
check "inspect missing file" nonzero "$QKV" inspect "$tmp/nope.safetensors"
one_line_error "inspect missing file"
head -c 5 "$FIXTURES/python_written_np.safetensors" >"$tmp/short.safetensors"
check "inspect truncated file" nonzero "$QKV" inspect "$tmp/short.safetensors"
one_line_error "inspect truncated file"
grep -q "shorter than the 8-byte header" "$tmp/err" || { echo "FAIL truncated message"; failures=$((failures + 1)); }
head -c 300 "$FIXTURES/python_written_np.safetensors" >"$tmp/cut.safetensors"
check "inspect cut data" nonzero "$QKV" inspect "$tmp/cut.safetensors"
one_line_error "inspect cut data"

# The demo, small: corpus, training, evaluation, translations, a model folder.
check "demo" 0 "$QKV" demo --out "$tmp/demo" --steps 30 --max-steps 30 --train-pairs 600 --test-pairs 40
grep -q "我是中国人" "$tmp/out" || { echo "FAIL demo does not translate the example"; failures=$((failures + 1)); }
# 30 steps cannot learn the checks: the demo must say so, not claim them.
grep -qE "^ +[0-9]+/24 right with the model saved at step [0-9]+; training ran 30 steps in [0-9]+ s: the budget of 30 steps ran out first" "$tmp/out" ||
  { echo "FAIL demo does not report its checks honestly"; failures=$((failures + 1)); }
grep -q "✗ 我是中国人" "$tmp/out" || grep -q "✓ 我是中国人" "$tmp/out" ||
  { echo "FAIL demo does not mark 我是中国人 right or wrong"; failures=$((failures + 1)); }
for f in config.json model.safetensors tokenizer.json trainer_state.json; do
  [ -f "$tmp/demo/model/$f" ] || { echo "FAIL demo wrote no model/$f"; failures=$((failures + 1)); }
done
# Training pairs drawn with repeats; no test or validation sentence among them.
[ "$(cut -f1 "$tmp/demo/zh-ja.train.tsv" | sort -u | wc -l)" -lt 600 ] ||
  { echo "FAIL demo's training pairs have no repeats"; failures=$((failures + 1)); }
[ -z "$(cat "$tmp/demo/zh-ja.test.tsv" "$tmp/demo/zh-ja.valid.tsv" | cut -f1 | grep -Fxf - <(cut -f1 "$tmp/demo/zh-ja.train.tsv"))" ] ||
  { echo "FAIL demo trains on a test or validation sentence"; failures=$((failures + 1)); }
[ -z "$(find "$tmp/demo" -name '*.tmp-*')" ] || { echo "FAIL demo left temporary files"; failures=$((failures + 1)); }
check "inspect model folder" 0 "$QKV" inspect "$tmp/demo/model"
grep -q 'decoder.layers.0.cross_attn.kv_proj.weight' "$tmp/out" || { echo "FAIL folder inspect lacks cross_attn"; failures=$((failures + 1)); }
check "demo bad steps" nonzero "$QKV" demo --out "$tmp/demo2" --steps -3
one_line_error "demo bad steps"

# Translation commands on the demo's files.
printf '我是中国人\n他吃苹果\n' >"$tmp/in.txt"
check "translate" 0 sh -c "\"$QKV\" translate --model \"$tmp/demo/model\" < \"$tmp/in.txt\""
[ "$(wc -l <"$tmp/out")" -eq 2 ] || { echo "FAIL translate: expected 2 lines"; cat "$tmp/out"; failures=$((failures + 1)); }
printf 'bad\xff\n' >"$tmp/bad.txt"
check "translate --dtype bf16" 0 sh -c "\"$QKV\" translate --model \"$tmp/demo/model\" --dtype bf16 < \"$tmp/in.txt\""
[ "$(wc -l <"$tmp/out")" -eq 2 ] || { echo "FAIL translate --dtype bf16: expected 2 lines"; cat "$tmp/out"; failures=$((failures + 1)); }
check "translate --dtype int8" 0 sh -c "\"$QKV\" translate --model \"$tmp/demo/model\" --dtype int8 < \"$tmp/in.txt\""
[ "$(wc -l <"$tmp/out")" -eq 2 ] || { echo "FAIL translate --dtype int8: expected 2 lines"; cat "$tmp/out"; failures=$((failures + 1)); }
cp "$tmp/out" "$tmp/translate-int8"
check "convert a translation model to int8" 0 "$QKV" convert --model "$tmp/demo/model" --out "$tmp/demo-int8" --dtype int8
check "translate with the int8 folder" 0 sh -c "\"$QKV\" translate --model \"$tmp/demo-int8\" < \"$tmp/in.txt\""
cmp -s "$tmp/out" "$tmp/translate-int8" || { echo "FAIL the int8 folder translates otherwise than --dtype int8"; failures=$((failures + 1)); }
check "translate invalid UTF-8" nonzero sh -c "\"$QKV\" translate --model \"$tmp/demo/model\" < \"$tmp/bad.txt\""
one_line_error "translate invalid UTF-8"
grep -q "line 1" "$tmp/err" || { echo "FAIL translate error lacks the line number"; failures=$((failures + 1)); }
check "translate attention map" 0 sh -c "\"$QKV\" translate --model \"$tmp/demo/model\" --attention-map \"$tmp/map.svg\" < \"$tmp/in.txt\""
grep -q '<svg' "$tmp/map.svg" && grep -q '>我<' "$tmp/map.svg" || { echo "FAIL attention map"; failures=$((failures + 1)); }
[ -f "$tmp/demo/attention.svg" ] || { echo "FAIL demo wrote no attention.svg"; failures=$((failures + 1)); }
check "translate replace invalid" 0 sh -c "\"$QKV\" translate --replace-invalid-utf8 --model \"$tmp/demo/model\" < \"$tmp/bad.txt\""
check "eval --json" 0 "$QKV" eval --json --model "$tmp/demo/model" --test "$tmp/demo/zh-ja.test.tsv"
for key in bleu chrf exact_match; do
  grep -q "\"$key\"" "$tmp/out" || { echo "FAIL eval --json lacks $key"; cat "$tmp/out"; failures=$((failures + 1)); }
done
check "eval --beam 3" 0 "$QKV" eval --json --beam 3 --model "$tmp/demo/model" --test "$tmp/demo/zh-ja.test.tsv"
grep -q '"beam": *3' "$tmp/out" || { echo "FAIL eval --beam"; cat "$tmp/out"; failures=$((failures + 1)); }
# A folder's generation_config.json (as Hugging Face folders carry it) sets
# the beam and length when the command line does not; --beam still wins.
cp -r "$tmp/demo/model" "$tmp/gen-model"
echo '{"num_beams": 3, "length_penalty": 0.6, "early_stopping": true, "max_length": 40}' >"$tmp/gen-model/generation_config.json"
check "eval with generation_config.json" 0 "$QKV" eval --json --model "$tmp/gen-model" --test "$tmp/demo/zh-ja.test.tsv"
grep -q '"beam": *3' "$tmp/out" || { echo "FAIL eval takes num_beams"; cat "$tmp/out"; failures=$((failures + 1)); }
check "translate with generation_config.json" 0 sh -c "\"$QKV\" translate --model \"$tmp/gen-model\" < \"$tmp/in.txt\""
cp "$tmp/out" "$tmp/gen-default.txt"
check "translate --beam 3 with generation_config.json" 0 sh -c "\"$QKV\" translate --beam 3 --model \"$tmp/gen-model\" < \"$tmp/in.txt\""
cmp -s "$tmp/out" "$tmp/gen-default.txt" || { echo "FAIL translate's default beam is not num_beams"; failures=$((failures + 1)); }
check "eval --beam 1 with generation_config.json" 0 "$QKV" eval --json --beam 1 --model "$tmp/gen-model" --test "$tmp/demo/zh-ja.test.tsv"
grep -q '"beam": *1' "$tmp/out" || { echo "FAIL --beam wins over num_beams"; cat "$tmp/out"; failures=$((failures + 1)); }
# Its logits processors too: no <eos> before 12 outputs lengthens 私は中国人です.
echo '{"min_new_tokens": 12}' >"$tmp/gen-model/generation_config.json"
check "translate with min_new_tokens" 0 sh -c "\"$QKV\" translate --model \"$tmp/gen-model\" < \"$tmp/in.txt\""
[ "$(head -1 "$tmp/out" | LC_ALL=C.UTF-8 wc -m)" -ge 13 ] ||
  { echo "FAIL min_new_tokens not applied: $(head -1 "$tmp/out")"; failures=$((failures + 1)); }
echo '{"bad_words_ids": [[1000000]]}' >"$tmp/gen-model/generation_config.json"
check "translate with a bad word past the vocabulary" nonzero sh -c "\"$QKV\" translate --model \"$tmp/gen-model\" < \"$tmp/in.txt\""
one_line_error "translate with a bad word past the vocabulary"
echo '{"num_beams": 0}' >"$tmp/gen-model/generation_config.json"
check "translate with num_beams 0" nonzero sh -c "\"$QKV\" translate --model \"$tmp/gen-model\" < \"$tmp/in.txt\""
one_line_error "translate with num_beams 0"
grep -q 'generation_config.json: num_beams' "$tmp/err" || { echo "FAIL num_beams 0 error"; cat "$tmp/err"; failures=$((failures + 1)); }
check "translate --beam 0" nonzero "$QKV" translate --beam 0 --model "$tmp/demo/model"
one_line_error "translate --beam 0"
for len in 0 9223372036854775807; do
  check "translate --max-len $len" nonzero sh -c "\"$QKV\" translate --max-len $len --model \"$tmp/demo/model\" < \"$tmp/in.txt\""
  one_line_error "translate --max-len $len"
done
# A source past the limit (the model's learned positions, else 1024 tokens) is
# an error naming its line; --truncate-source cuts it with a notice instead.
{ echo "我是中国人"; printf '我%.0s' $(seq 3000); echo; } >"$tmp/long.txt"
check "translate a 3000-character line" nonzero sh -c "\"$QKV\" translate --model \"$tmp/demo/model\" < \"$tmp/long.txt\""
one_line_error "translate a 3000-character line"
grep -q "stdin line 2: a source of .* tokens, more than the limit" "$tmp/err" || { echo "FAIL long source error"; cat "$tmp/err"; failures=$((failures + 1)); }
check "translate --truncate-source" 0 sh -c "\"$QKV\" translate --truncate-source --model \"$tmp/demo/model\" < \"$tmp/long.txt\""
[ "$(wc -l <"$tmp/out")" -eq 2 ] && grep -q "stdin line 2: source cut to" "$tmp/err" || { echo "FAIL --truncate-source"; cat "$tmp/out" "$tmp/err"; failures=$((failures + 1)); }
check "eval --max-source-len 2" nonzero "$QKV" eval --max-source-len 2 --model "$tmp/demo/model" --test "$tmp/demo/zh-ja.test.tsv"
one_line_error "eval --max-source-len 2"
grep -q "zh-ja.test.tsv:1: a source of" "$tmp/err" || { echo "FAIL eval long source lacks file:line"; cat "$tmp/err"; failures=$((failures + 1)); }
check "translate --max-source-len -1" nonzero sh -c "echo x | \"$QKV\" translate --max-source-len -1 --model \"$tmp/demo/model\""
one_line_error "translate --max-source-len -1"
check "eval missing model" nonzero "$QKV" eval --model "$tmp/none" --test "$tmp/demo/zh-ja.test.tsv"
one_line_error "eval missing model"
check "train missing config" nonzero "$QKV" train --config "$tmp/none.json" --train "$tmp/demo/zh-ja.train.tsv" --out "$tmp/m"
one_line_error "train missing config"
printf '{"d_modle": 3}' >"$tmp/badcfg.json"
check "train bad config" nonzero "$QKV" train --config "$tmp/badcfg.json" --train "$tmp/demo/zh-ja.train.tsv" --out "$tmp/m"
one_line_error "train bad config"
grep -q "unknown key 'd_modle'" "$tmp/err" || { echo "FAIL bad config message"; failures=$((failures + 1)); }
printf '{"tokenizer": {"type": "words"}}' >"$tmp/badtok.json"
check "train bad tokenizer" nonzero "$QKV" train --config "$tmp/badtok.json" --train "$tmp/demo/zh-ja.train.tsv" --out "$tmp/m"
one_line_error "train bad tokenizer"
printf '{"tokenizer": {"type": "sentencepiece", "vocab_size": 20}}' >"$tmp/smalltok.json"
check "train too small a vocabulary" nonzero "$QKV" train --config "$tmp/smalltok.json" --train "$tmp/demo/zh-ja.train.tsv" --out "$tmp/m"
one_line_error "train too small a vocabulary"
[ ! -e "$tmp/m" ] || { echo "FAIL a failed train left a model folder"; failures=$((failures + 1)); }
# Sentence embeddings of a Hugging Face BertModel (sentence-transformers folder).
printf '我是中国人\nThe quick brown fox.\n' >"$tmp/sentences.txt"
check "embed" 0 sh -c "\"$QKV\" embed --model \"$FIXTURES/hf/bert\" < \"$tmp/sentences.txt\""
[ "$(wc -l <"$tmp/out")" -eq 2 ] && [ "$(head -1 "$tmp/out" | tr ',' '\n' | wc -l)" -eq 32 ] && grep -q '^\[-\?[0-9]' "$tmp/out" ||
  { echo "FAIL embed: expected two lists of 32 numbers"; head -c 300 "$tmp/out"; failures=$((failures + 1)); }
check "embed --dtype int8" 0 sh -c "\"$QKV\" embed --model \"$FIXTURES/hf/bert\" --dtype int8 < \"$tmp/sentences.txt\""
cp "$tmp/out" "$tmp/embed-int8"
check "convert a Hugging Face BERT to int8" 0 "$QKV" convert --model "$FIXTURES/hf/bert" --out "$tmp/bert-int8" --dtype int8
check "embed with the int8 folder" 0 sh -c "\"$QKV\" embed --model \"$tmp/bert-int8\" < \"$tmp/sentences.txt\""
cmp -s "$tmp/out" "$tmp/embed-int8" || { echo "FAIL the int8 BERT folder embeds otherwise than --dtype int8"; failures=$((failures + 1)); }
{ echo a; yes the | head -40 | tr '\n' ' '; echo; } >"$tmp/long-sentence.txt"
check "embed a line past max_seq_length" nonzero sh -c "\"$QKV\" embed --model \"$FIXTURES/hf/bert\" < \"$tmp/long-sentence.txt\""
one_line_error "embed a line past max_seq_length"
grep -q "stdin line 2: 40 tokens" "$tmp/err" || { echo "FAIL embed long line message"; cat "$tmp/err"; failures=$((failures + 1)); }
check "embed --truncate" 0 sh -c "\"$QKV\" embed --truncate --model \"$FIXTURES/hf/bert\" < \"$tmp/long-sentence.txt\""
check "embed with a decoder" nonzero sh -c "echo x | \"$QKV\" embed --model \"$FIXTURES/hf/gpt2\""
one_line_error "embed with a decoder"
# A Hugging Face ViTForImageClassification folder: transformers' top class for the image (fish).
check "classify a Hugging Face ViT" 0 "$QKV" classify --model "$FIXTURES/hf/vit" "$FIXTURES/hf/vit.image0.png"
sed -n 2p "$tmp/out" | grep -q "fish" || { echo "FAIL classify HF ViT: expected fish first"; cat "$tmp/out"; failures=$((failures + 1)); }
# Train a tiny model in two halves with --resume.
printf '{"d_model": 32, "nhead": 4, "num_encoder_layers": 1, "num_decoder_layers": 1, "dim_feedforward": 64,\n "train": {"steps": 6, "batch_tokens": 256, "eval_every": 3, "eval_sentences": 4}}\n' >"$tmp/tiny.json"
check "train" 0 "$QKV" train --config "$tmp/tiny.json" --train "$tmp/demo/zh-ja.train.tsv" --out "$tmp/tiny"
# Overrides of the config's training options are checked, never ignored.
for flag in "--steps -5" "--steps 0" "--batch-tokens -1" "--lr nan" "--lr -1" "--lr inf" "--epochs 0" "--seed -1" "--precision fp8"; do
  check "train $flag" nonzero "$QKV" train --config "$tmp/tiny.json" --train "$tmp/demo/zh-ja.test.tsv" --out "$tmp/never" $flag
  one_line_error "train $flag"
  [ ! -e "$tmp/never" ] || { echo "FAIL train $flag wrote a folder"; failures=$((failures + 1)); }
done
[ -f "$tmp/tiny/trainer_state.safetensors" ] || { echo "FAIL train wrote no trainer_state.safetensors"; failures=$((failures + 1)); }
check "train --resume" 0 "$QKV" train --config "$tmp/tiny.json" --train "$tmp/demo/zh-ja.train.tsv" --out "$tmp/tiny" --steps 9 --resume
grep -q '"step": 9' "$tmp/tiny/trainer_state.json" || { echo "FAIL resume did not reach step 9"; cat "$tmp/tiny/trainer_state.json"; failures=$((failures + 1)); }
check "train --resume nothing to do" nonzero "$QKV" train --config "$tmp/tiny.json" --train "$tmp/demo/zh-ja.train.tsv" --out "$tmp/tiny" --steps 9 --resume
one_line_error "train --resume nothing to do"
# --config auto: a recipe from the data, said and saved.
check "train --config auto" 0 "$QKV" train --config auto --train "$tmp/demo/zh-ja.train.tsv" --out "$tmp/auto" --steps 3
grep -q "tokenizer: characters" "$tmp/out" && [ -f "$tmp/auto/recipe.json" ] && [ -f "$tmp/auto/model.safetensors" ] ||
  { echo "FAIL train --config auto"; cat "$tmp/out"; failures=$((failures + 1)); }
check "train --config auto --resume" nonzero "$QKV" train --config auto --train "$tmp/demo/zh-ja.train.tsv" --out "$tmp/auto" --resume
one_line_error "train --config auto --resume"
# Checkpoint averaging: two saves of one model, then refusals.
cp -r "$tmp/demo/model" "$tmp/demo-copy"
check "average" 0 "$QKV" average --out "$tmp/averaged" "$tmp/demo/model" "$tmp/demo-copy"
check "average translates" 0 sh -c "\"$QKV\" translate --model \"$tmp/averaged\" < \"$tmp/in.txt\""
check "average one folder" nonzero "$QKV" average --out "$tmp/averaged2" "$tmp/demo/model"
one_line_error "average one folder"
check "average two different models" nonzero "$QKV" average --out "$tmp/averaged3" "$tmp/demo/model" "$tmp/tiny"
one_line_error "average two different models"
# The workflow: train keeps its last saves, average takes them.
printf '{"d_model": 32, "nhead": 4, "num_encoder_layers": 1, "num_decoder_layers": 1, "dim_feedforward": 64,\n "train": {"steps": 6, "batch_tokens": 256, "eval_every": 2, "eval_sentences": 4, "keep_checkpoints": 2}}\n' >"$tmp/keep.json"
check "train keep_checkpoints" 0 "$QKV" train --config "$tmp/keep.json" --train "$tmp/demo/zh-ja.train.tsv" --out "$tmp/keep"
[ "$(ls "$tmp/keep/checkpoints" | tr '\n' ' ')" = "step-4 step-6 " ] || { echo "FAIL keep_checkpoints: $(ls "$tmp/keep/checkpoints")"; failures=$((failures + 1)); }
check "average the kept saves" 0 "$QKV" average --out "$tmp/keep-avg" "$tmp/keep/checkpoints/step-4" "$tmp/keep/checkpoints/step-6"
check "eval the average" 0 "$QKV" eval --json --model "$tmp/keep-avg" --test "$tmp/demo/zh-ja.test.tsv"
check "data synth" 0 "$QKV" data synth-zh-ja --pairs 5 --seed 3
[ "$(wc -l <"$tmp/out")" -eq 5 ] || { echo "FAIL synth: expected 5 lines"; failures=$((failures + 1)); }
check "data synth --repeats" 0 "$QKV" data synth-zh-ja --pairs 2000 --seed 3 --repeats --exclude "$tmp/demo/zh-ja.test.tsv"
[ "$(wc -l <"$tmp/out")" -eq 2000 ] && [ "$(cut -f1 "$tmp/out" | sort -u | wc -l)" -lt 2000 ] ||
  { echo "FAIL synth --repeats: expected 2000 lines with repeats"; failures=$((failures + 1)); }
[ -z "$(cut -f1 "$tmp/demo/zh-ja.test.tsv" | grep -Fxf - <(cut -f1 "$tmp/out"))" ] ||
  { echo "FAIL synth --repeats: an excluded sentence appears"; failures=$((failures + 1)); }
check "data synth bad pairs" nonzero "$QKV" data synth-zh-ja --pairs 0
one_line_error "data synth bad pairs"
check "data synth too many pairs" nonzero "$QKV" data synth-zh-ja --pairs 9223372036854775807
one_line_error "data synth too many pairs"
check "data synth bad tier" nonzero "$QKV" data synth-zh-ja --pairs 5 --tier medium
one_line_error "data synth bad tier"
# The hard tier names each pair's category; eval scores each one, with intervals.
check "data synth hard" 0 "$QKV" data synth-zh-ja --tier hard --pairs 200 --seed 2 --exclude "$tmp/demo/zh-ja.train.tsv" --out "$tmp/hard.tsv"
[ "$(awk -F'\t' 'NF == 3' "$tmp/hard.tsv" | wc -l)" -eq 200 ] || { echo "FAIL hard tier: expected 3 columns"; failures=$((failures + 1)); }
check "eval by category" 0 "$QKV" eval --json --model "$tmp/demo/model" --test "$tmp/hard.tsv"
python3 - "$tmp/out" <<'PY' || failures=$((failures + 1))
import json, sys
r = json.load(open(sys.argv[1]))
cats = r.get("categories", {})
assert sum(c["sentences"] for c in cats.values()) == r["sentences"] == 200, r
assert {"relative", "counter", "copy"} <= set(cats), sorted(cats)
# The model's translations depend on the CPU's rounding after 30 steps, and a
# percentile interval need not contain the corpus score, so only what holds
# for any output is asserted here (tests/test_translation.cpp checks the
# intervals themselves on fixed sentences).
for name, c in cats.items():
    lo, hi = c["chrf_ci95"]
    assert 0 <= lo <= hi <= 100 and 0 <= c["chrf"] <= 100, (name, c)
lo, hi = r["chrf_ci95"]
assert 0 <= lo <= hi <= 100 and r["bootstrap_resamples"] == 1000, r
PY
check "eval text by category" 0 "$QKV" eval --bootstrap 0 --model "$tmp/demo/model" --test "$tmp/hard.tsv"
grep -q "^    relative " "$tmp/out" && ! grep -q "interval" "$tmp/out" || { echo "FAIL eval text by category"; cat "$tmp/out"; failures=$((failures + 1)); }

# The Vision Transformer on a tiny IDX folder: 4 images of 8x8, two classes.
mkdir -p "$tmp/idx"
{ printf '\0\0\010\003\0\0\0\004\0\0\0\010\0\0\0\010'; head -c 128 /dev/zero; head -c 128 /dev/zero | tr '\0' '\377'; } >"$tmp/idx/train-images-idx3-ubyte"
printf '\0\0\010\001\0\0\0\004\0\0\001\001' >"$tmp/idx/train-labels-idx1-ubyte"
cp "$tmp/idx/train-images-idx3-ubyte" "$tmp/idx/t10k-images-idx3-ubyte"
cp "$tmp/idx/train-labels-idx1-ubyte" "$tmp/idx/t10k-labels-idx1-ubyte"
printf '{"arch": "vit", "image_size": 8, "patch_size": 4, "d_model": 8, "nhead": 2, "num_layers": 1, "num_classes": 2,\n "class_names": ["dark", "light"], "train": {"epochs": 2, "batch_size": 2, "warmup_steps": 1}}\n' >"$tmp/vit.json"
check "train vit" 0 "$QKV" train --config "$tmp/vit.json" --train "$tmp/idx" --out "$tmp/vit"
for f in config.json model.safetensors trainer_state.json trainer_state.safetensors; do
  [ -f "$tmp/vit/$f" ] || { echo "FAIL train vit wrote no $f"; failures=$((failures + 1)); }
done
grep -q "test accuracy" "$tmp/out" || { echo "FAIL train vit reports no test accuracy"; cat "$tmp/out"; failures=$((failures + 1)); }
check "train vit --resume" 0 "$QKV" train --config "$tmp/vit.json" --train "$tmp/idx" --out "$tmp/vit" --epochs 3 --resume
grep -q '"epoch": 3' "$tmp/vit/trainer_state.json" || { echo "FAIL vit resume did not reach epoch 3"; failures=$((failures + 1)); }
check "train vit bf16" 0 "$QKV" train --config "$tmp/vit.json" --train "$tmp/idx" --out "$tmp/vit-bf16" --epochs 1 --precision bf16
grep -q "bf16 mixed precision" "$tmp/out" && grep -q "test accuracy" "$tmp/out" || { echo "FAIL train vit bf16"; cat "$tmp/out"; failures=$((failures + 1)); }
check "train vit --steps" nonzero "$QKV" train --config "$tmp/vit.json" --train "$tmp/idx" --out "$tmp/vit2" --steps 3
one_line_error "train vit --steps"
check "eval vit --json" 0 "$QKV" eval --json --model "$tmp/vit" --test "$tmp/idx"
grep -q '"accuracy"' "$tmp/out" && grep -q '"confusion"' "$tmp/out" || { echo "FAIL eval vit --json"; cat "$tmp/out"; failures=$((failures + 1)); }
check "eval vit" 0 "$QKV" eval --model "$tmp/vit" --test "$tmp/idx"
grep -q "confusion matrix" "$tmp/out" || { echo "FAIL eval vit table"; cat "$tmp/out"; failures=$((failures + 1)); }
check "classify --index" 0 "$QKV" classify --model "$tmp/vit" --test "$tmp/idx" --index 0 --index 3 --top-k 2 --attention-map "$tmp/rollout.png"
grep -q "light" "$tmp/out" || { echo "FAIL classify lacks class names"; cat "$tmp/out"; failures=$((failures + 1)); }
[ "$(head -c 4 "$tmp/rollout.png" | od -An -c | tr -d ' ')" = "211PNG" ] || { echo "FAIL rollout is not a PNG"; failures=$((failures + 1)); }
check "classify --dtype bf16" 0 "$QKV" classify --model "$tmp/vit" --test "$tmp/idx" --index 0 --top-k 2 --dtype bf16
grep -q "light" "$tmp/out" || { echo "FAIL classify --dtype bf16 lacks class names"; cat "$tmp/out"; failures=$((failures + 1)); }
check "classify --dtype int8" 0 "$QKV" classify --model "$tmp/vit" --test "$tmp/idx" --index 0 --top-k 2 --dtype int8
grep -q "light" "$tmp/out" || { echo "FAIL classify --dtype int8 lacks class names"; cat "$tmp/out"; failures=$((failures + 1)); }
check "classify a PNG" 0 "$QKV" classify --model "$tmp/vit" "$tmp/rollout.png"
check "classify a text file" nonzero "$QKV" classify --model "$tmp/vit" "$tmp/vit.json"
one_line_error "classify a text file"
check "classify missing image" nonzero "$QKV" classify --model "$tmp/vit" "$tmp/none.png"
one_line_error "classify missing image"
# A sharded Hugging Face folder: inspect lists the tensors of every shard.
check "inspect a sharded folder" 0 "$QKV" inspect "$FIXTURES/hf/qwen3"
want=$(python3 -c 'import json, sys; print(len(json.load(open(sys.argv[1]))["weight_map"]))' "$FIXTURES/hf/qwen3/model.safetensors.index.json")
{ grep -q "^3 shards$" "$tmp/out" && grep -q "^$want tensors, " "$tmp/out" && grep -q "self_attn.k_norm.weight" "$tmp/out"; } ||
  { echo "FAIL inspect a sharded folder"; cat "$tmp/out"; failures=$((failures + 1)); }
# A Hugging Face folder with its tokenizer.json generates text; without one, the commands that need text say so.
check "generate from a Hugging Face folder" 0 "$QKV" generate --model "$FIXTURES/hf/llama" --prompt "我是中国人 -> 私は" --temperature 0 --max-new-tokens 16
# The prompt, then what transformers' generate() gave (the fixture's "text").
python3 -c 'import json, sys; e = json.load(open(sys.argv[1])); print(e["prompt"] + e["text"])' "$FIXTURES/hf/llama.expected.json" >"$tmp/expected"
cmp -s "$tmp/out" "$tmp/expected" || { echo "FAIL generate from a Hugging Face folder"; cat "$tmp/out"; failures=$((failures + 1)); }
# The sampling flags not given come from the folder's generation_config.json: do_sample false is greedy
# (whatever its temperature), its max_new_tokens the length; a flag given wins over the file.
mkdir -p "$tmp/hf-sampling" && cp "$FIXTURES/hf/llama/config.json" "$FIXTURES/hf/llama/model.safetensors" "$FIXTURES/hf/llama/tokenizer.json" "$tmp/hf-sampling/"
printf '{"eos_token_id": 1, "do_sample": false, "temperature": 0.6, "max_new_tokens": 5}\n' >"$tmp/hf-sampling/generation_config.json"
check "generate, the folder's sampling" 0 "$QKV" generate --model "$tmp/hf-sampling" --prompt "我是中国人 -> 私は"
cp "$tmp/out" "$tmp/folder-greedy"
check "generate, greedy by flags" 0 "$QKV" generate --model "$FIXTURES/hf/llama" --prompt "我是中国人 -> 私は" --temperature 0 --max-new-tokens 5
cmp -s "$tmp/out" "$tmp/folder-greedy" || { echo "FAIL generate: the folder's do_sample false and max_new_tokens"; cat "$tmp/folder-greedy" "$tmp/out"; failures=$((failures + 1)); }
check "generate, flags over the folder's" 0 "$QKV" generate --model "$tmp/hf-sampling" --prompt "我是中国人 -> 私は" --temperature 0.9 --seed 3 --max-new-tokens 8
cp "$tmp/out" "$tmp/folder-sampled"
check "generate, sampled" 0 "$QKV" generate --model "$FIXTURES/hf/llama" --prompt "我是中国人 -> 私は" --temperature 0.9 --seed 3 --max-new-tokens 8
cmp -s "$tmp/out" "$tmp/folder-sampled" || { echo "FAIL generate: flags over the folder's"; cat "$tmp/folder-sampled" "$tmp/out"; failures=$((failures + 1)); }
check "generate, greedy 8" 0 "$QKV" generate --model "$FIXTURES/hf/llama" --prompt "我是中国人 -> 私は" --temperature 0 --max-new-tokens 8
! cmp -s "$tmp/out" "$tmp/folder-sampled" || { echo "FAIL generate: --temperature 0.9 over the folder's do_sample false still greedy"; failures=$((failures + 1)); }
printf '{"do_sample": "yes"}\n' >"$tmp/hf-sampling/generation_config.json"
check "generate, a bad generation_config.json" nonzero "$QKV" generate --model "$tmp/hf-sampling" --prompt "a"
one_line_error "generate, a bad generation_config.json"
# qkv chat: a line of stdin is a user message in the folder's chat template (the qwen2 fixture's, a default
# system message first); the answer is what generate continues that text with, up to <|im_end|>. A second line
# outgrows the 64-token context: the oldest turn goes, with a note on stderr.
chat_prompt=$'<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n'
check "generate on the chat prompt" 0 "$QKV" generate --model "$FIXTURES/hf/qwen2" --prompt "$chat_prompt" --temperature 0 --max-new-tokens 6
python3 -c 'import sys; t = open(sys.argv[1], encoding="utf-8").read()[len(sys.argv[2]):-1]; print(t.split("<|im_end|>")[0])' "$tmp/out" "$chat_prompt" >"$tmp/expected"
check "chat" 0 sh -c "printf 'hello\n' | '$QKV' chat --model '$FIXTURES/hf/qwen2' --temperature 0 --max-new-tokens 6"
cmp -s "$tmp/out" "$tmp/expected" || { echo "FAIL chat answers as generate continues its prompt"; cat "$tmp/out" "$tmp/expected"; failures=$((failures + 1)); }
check "chat, two turns" 0 sh -c "printf 'hello\n\nthe cat\n' | '$QKV' chat --model '$FIXTURES/hf/qwen2' --temperature 0 --max-new-tokens 6"
[ "$(wc -l <"$tmp/out")" -eq 2 ] && grep -q "oldest turn was dropped" "$tmp/err" || { echo "FAIL chat, two turns"; cat "$tmp/out" "$tmp/err"; failures=$((failures + 1)); }
check "chat without a template" nonzero sh -c "echo hi | '$QKV' chat --model '$FIXTURES/hf/llama'"
one_line_error "chat without a template"
check "chat, invalid UTF-8" nonzero sh -c "printf 'hi\n\377\n' | '$QKV' chat --model '$FIXTURES/hf/qwen2' --max-new-tokens 2"
one_line_error "chat, invalid UTF-8"
mkdir -p "$tmp/hf-no-tokenizer" && cp "$FIXTURES/hf/llama/config.json" "$FIXTURES/hf/llama/model.safetensors" "$tmp/hf-no-tokenizer/"
check "generate without a tokenizer" nonzero "$QKV" generate --model "$tmp/hf-no-tokenizer" --prompt "a"
one_line_error "generate without a tokenizer"
printf '{"model": {"type": "WordLevel"}}' >"$tmp/hf-no-tokenizer/tokenizer.json"
check "generate with an unread tokenizer" nonzero "$QKV" generate --model "$tmp/hf-no-tokenizer" --prompt "a"
one_line_error "generate with an unread tokenizer"
grep -q "tokenizer.json: model: model type 'WordLevel' is not supported yet" "$tmp/err" || { echo "FAIL unread tokenizer message"; cat "$tmp/err"; failures=$((failures + 1)); }
rm "$tmp/hf-no-tokenizer/tokenizer.json"
check "serve a folder without a tokenizer" nonzero timeout 20 "$QKV" serve --model "$tmp/hf-no-tokenizer" --port 0
one_line_error "serve a folder without a tokenizer"
grep -q "tokenizer" "$tmp/err" || { echo "FAIL serve without a tokenizer message"; cat "$tmp/err"; failures=$((failures + 1)); }
check "serve a missing folder" nonzero timeout 20 "$QKV" serve --model "$tmp/none" --port 0
one_line_error "serve a missing folder"
check "serve --port 70000" nonzero timeout 20 "$QKV" serve --model "$tmp/vit" --port 70000
one_line_error "serve --port 70000"
head -c 100 "$tmp/idx/t10k-images-idx3-ubyte" >"$tmp/idx/t10k-images-idx3-ubyte.cut"
mv "$tmp/idx/t10k-images-idx3-ubyte.cut" "$tmp/idx/t10k-images-idx3-ubyte"
check "eval vit truncated IDX" nonzero "$QKV" eval --model "$tmp/vit" --test "$tmp/idx"
one_line_error "eval vit truncated IDX"
grep -q "t10k-images-idx3-ubyte: truncated" "$tmp/err" || { echo "FAIL truncated IDX message"; cat "$tmp/err"; failures=$((failures + 1)); }
# The benchmarks build the recipe's model, read from the repository root.
check "bench vit outside the repository" nonzero bash -c "cd '$tmp' && '$QKV' bench vit --steps 1 --python false"
one_line_error "bench vit outside the repository"
check "bench generate --model" 0 bash -c "cd '$FIXTURES/../..' && '$QKV' bench generate --model '$FIXTURES/hf/llama' --json --python false"
grep -q '"impl": "qkv int8"' "$tmp/out" || { echo "FAIL bench generate --model json"; head -c 600 "$tmp/out"; failures=$((failures + 1)); }
check "bench embed --model" 0 bash -c "cd '$FIXTURES/../..' && '$QKV' bench embed --model '$FIXTURES/hf/bert' --sentences 6 --json --python false"
grep -q '"impl": "qkv bf16"' "$tmp/out" && grep -q '"tokens_per_s"' "$tmp/out" || { echo "FAIL bench embed json"; head -c 600 "$tmp/out"; failures=$((failures + 1)); }
check "bench embed without --model" nonzero "$QKV" bench embed --python false
one_line_error "bench embed without --model"
check "bench vit tiny" 0 bash -c "cd '$FIXTURES/../..' && '$QKV' bench vit --steps 1 --rounds 1 --json --python false"
grep -q '"qkv_train_images_per_s"' "$tmp/out" || { echo "FAIL bench vit json"; failures=$((failures + 1)); }
python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); sys.exit(not (d["rounds"] == 1 and len(d["qkv_train_images_per_s_by_round"]) == 1 and d["torch_train_images_per_s_by_round"] == [] and d["train_ratio"] is None))' "$tmp/out" \
  || { echo "FAIL bench vit --rounds 1 json: one figure for qkv, none for an absent peer"; failures=$((failures + 1)); }
# A Hugging Face ViT folder: inference in three dtypes, two rounds, the peer absent.
check "bench vit --model" 0 "$QKV" bench vit --model "$FIXTURES/hf/vit" --images 3 --steps 1 --rounds 2 --json --python false
python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); sys.exit(not ([r["impl"] for r in d["qkv"]] == ["qkv f32", "qkv bf16", "qkv int8"] and all(len(r["images_per_s_by_round"]) == 2 and r["images_per_s"] > 0 for r in d["qkv"]) and d["images"] == 3 and d["infer_ratio"] is None and d["peer"]))' "$tmp/out" \
  || { echo "FAIL bench vit --model json: three dtypes, two rounds each, no peer"; head -c 800 "$tmp/out"; failures=$((failures + 1)); }
# A peer whose logits are not the model's shape: the bench says they do not
# match (it printed "within inf" before), as bench embed does for vectors.
cat >"$tmp/peer-vit" <<'PEER'
#!/bin/sh
echo '{"images_per_s": 1.0, "transformers": "0", "torch": "0", "attention": "eager", "first": [[0.5, 0.5]]}'
PEER
cat >"$tmp/peer-embed" <<'PEER'
#!/bin/sh
echo '{"sentences_per_s": 1.0, "version": "0", "torch": "0", "first": [[0.5], "not a vector"]}'
PEER
chmod +x "$tmp/peer-vit" "$tmp/peer-embed"
check "bench vit --model, a peer of another shape" 0 "$QKV" bench vit --model "$FIXTURES/hf/vit" --images 3 --steps 1 --rounds 1 --python "$tmp/peer-vit"
grep -q "images do NOT match qkv's float32" "$tmp/out" || { echo "FAIL bench vit: a peer of another shape is reported"; cat "$tmp/out"; failures=$((failures + 1)); }
check "bench embed --model, a peer of another shape" 0 bash -c "cd '$FIXTURES/../..' && '$QKV' bench embed --model '$FIXTURES/hf/bert' --sentences 6 --python '$tmp/peer-embed'"
grep -q "sentences do NOT match qkv's float32" "$tmp/out" || { echo "FAIL bench embed: a peer of another shape is reported"; cat "$tmp/out"; failures=$((failures + 1)); }
check "bench vit --model, not a folder" nonzero "$QKV" bench vit --model "$tmp/no-such-folder" --python false
one_line_error "bench vit --model, not a folder"
check "bench vit --images 0" nonzero "$QKV" bench vit --model "$FIXTURES/hf/vit" --images 0 --python false
one_line_error "bench vit --images 0"
check "bench vit --model --precision bf16" nonzero "$QKV" bench vit --model "$FIXTURES/hf/vit" --precision bf16 --python false
one_line_error "bench vit --model --precision bf16"

# A decoder language model on a short text, then generation from it.
for i in $(seq 30); do printf 'the cat sat on the mat.\n\n' >>"$tmp/lm.txt"; done
printf '{"arch": "decoder", "d_model": 32, "nhead": 4, "num_layers": 1, "dim_feedforward": 64, "context": 32,\n "train": {"steps": 20, "batch_size": 4, "eval_every": 10}}\n' >"$tmp/lm.json"
check "train decoder" 0 "$QKV" train --config "$tmp/lm.json" --train "$tmp/lm.txt" --out "$tmp/lm"
grep -q "perplexity" "$tmp/out" || { echo "FAIL train decoder reports no perplexity"; cat "$tmp/out"; failures=$((failures + 1)); }
check "train decoder --resume" 0 "$QKV" train --config "$tmp/lm.json" --train "$tmp/lm.txt" --out "$tmp/lm" --steps 30 --resume
grep -q '"step": 30' "$tmp/lm/trainer_state.json" || { echo "FAIL decoder resume did not reach step 30"; failures=$((failures + 1)); }
# Fine-tuning a Hugging Face folder: no config needed; the result is a qkv folder that generates.
for i in $(seq 300); do echo "the quick brown fox jumps over the lazy dog $i"; done >"$tmp/ft.txt"  # more than its 512 positions
check "train --init" 0 "$QKV" train --init "$FIXTURES/hf/llama" --train "$tmp/ft.txt" --out "$tmp/ft" --steps 3
check "generate from the fine-tuned folder" 0 "$QKV" generate --model "$tmp/ft" --prompt "the cat" --max-new-tokens 4 --temperature 0
check "train --init with a model config" nonzero "$QKV" train --init "$FIXTURES/hf/llama" --config "$tmp/lm.json" --train "$tmp/lm.txt" --out "$tmp/ft2"
one_line_error "train --init with a model config"
printf '{"train": {"steps": ' >"$tmp/broken.json"
check "train --init with a broken config" nonzero "$QKV" train --init "$FIXTURES/hf/llama" --config "$tmp/broken.json" --train "$tmp/lm.txt" --out "$tmp/ft2"
one_line_error "train --init with a broken config"
grep -q "broken.json: not valid JSON" "$tmp/err" || { echo "FAIL train --init with a broken config names it"; cat "$tmp/err"; failures=$((failures + 1)); }
check "train --init a missing folder" nonzero "$QKV" train --init "$tmp/nope" --train "$tmp/lm.txt" --out "$tmp/ft2"
one_line_error "train --init a missing folder"
[ ! -e "$tmp/ft2" ] || { echo "FAIL a refused train --init left a folder"; failures=$((failures + 1)); }
check "generate" 0 "$QKV" generate --model "$tmp/lm" --prompt "the cat" --max-new-tokens 10 --temperature 0.8 --top-k 5 --top-p 0.9 --seed 2
grep -q "^the cat" "$tmp/out" || { echo "FAIL generate does not echo the prompt"; cat "$tmp/out"; failures=$((failures + 1)); }
check "generate --dtype bf16" 0 "$QKV" generate --model "$tmp/lm" --prompt "the cat" --max-new-tokens 5 --dtype bf16
grep -q "^the cat" "$tmp/out" || { echo "FAIL generate --dtype bf16 does not echo the prompt"; cat "$tmp/out"; failures=$((failures + 1)); }
check "generate --dtype f8" nonzero "$QKV" generate --model "$tmp/lm" --dtype f8
one_line_error "generate --dtype f8"
# qkv convert: a smaller folder that loads anywhere, in its dtype, with the same output as --dtype.
for dtype in bf16 f16 int8; do
  check "generate --dtype $dtype, greedy" 0 "$QKV" generate --model "$tmp/lm" --prompt "the cat" --max-new-tokens 8 --temperature 0 --dtype $dtype
  cp "$tmp/out" "$tmp/generate-$dtype"
  check "convert --dtype $dtype" 0 "$QKV" convert --model "$tmp/lm" --out "$tmp/lm-$dtype" --dtype $dtype
  grep -q "Linear weights in $dtype" "$tmp/out" || { echo "FAIL convert $dtype says nothing"; cat "$tmp/out"; failures=$((failures + 1)); }
  [ "$(stat -c %s "$tmp/lm-$dtype/model.safetensors")" -lt "$(stat -c %s "$tmp/lm/model.safetensors")" ] ||
    { echo "FAIL the $dtype folder is not smaller"; failures=$((failures + 1)); }
  check "generate from the $dtype folder" 0 "$QKV" generate --model "$tmp/lm-$dtype" --prompt "the cat" --max-new-tokens 8 --temperature 0
  cmp -s "$tmp/out" "$tmp/generate-$dtype" || { echo "FAIL the $dtype folder generates otherwise than --dtype $dtype"; failures=$((failures + 1)); }
  check "eval the $dtype folder" 0 "$QKV" eval --model "$tmp/lm-$dtype" --test "$tmp/lm.txt" --json
  grep -q '"perplexity"' "$tmp/out" || { echo "FAIL eval the $dtype folder"; cat "$tmp/out"; failures=$((failures + 1)); }
done
check "convert onto itself" nonzero "$QKV" convert --model "$tmp/lm" --out "$tmp/lm" --dtype int8
one_line_error "convert onto itself"
check "convert --dtype f8" nonzero "$QKV" convert --model "$tmp/lm" --out "$tmp/lm-f8" --dtype f8
one_line_error "convert --dtype f8"
check "convert a missing folder" nonzero "$QKV" convert --model "$tmp/nope" --out "$tmp/nope-int8" --dtype int8
one_line_error "convert a missing folder"
[ ! -e "$tmp/nope-int8" ] || { echo "FAIL a failed convert left a folder"; failures=$((failures + 1)); }
check "generate too long a prompt" nonzero "$QKV" generate --model "$tmp/lm" --prompt "$(printf 'x%.0s' $(seq 40))"
one_line_error "generate too long a prompt"
check "serve --ctx past the context" nonzero timeout 20 "$QKV" serve --model "$tmp/lm" --port 0 --ctx 33
one_line_error "serve --ctx past the context"
grep -q "past the model's context of 32" "$tmp/err" || { echo "FAIL serve --ctx message"; cat "$tmp/err"; failures=$((failures + 1)); }
check "generate --truncate-prompt" 0 "$QKV" generate --model "$tmp/lm" --prompt "$(printf 'x%.0s' $(seq 40))" --max-new-tokens 3 --truncate-prompt
check "generate bad top-p" nonzero "$QKV" generate --model "$tmp/lm" --top-p 1.5
one_line_error "generate bad top-p"
check "eval decoder" 0 "$QKV" eval --model "$tmp/lm" --test "$tmp/lm.txt" --json
grep -q '"perplexity"' "$tmp/out" || { echo "FAIL eval decoder"; cat "$tmp/out"; failures=$((failures + 1)); }
# A folder of the wrong kind: one line saying what it holds, for every command that reads one.
check "generate a translation model" nonzero "$QKV" generate --model "$tmp/demo/model" --prompt x
one_line_error "generate a translation model"
grep -q "holds a translation Transformer (arch 'transformer')" "$tmp/err" || { echo "FAIL generate wrong kind"; cat "$tmp/err"; failures=$((failures + 1)); }
check "translate a decoder" nonzero bash -c "echo x | '$QKV' translate --model '$tmp/lm'"
one_line_error "translate a decoder"
check "classify a decoder" nonzero "$QKV" classify --model "$tmp/lm" "$tmp/rollout.png"
one_line_error "classify a decoder"
check "resume another arch" nonzero "$QKV" train --config "$tmp/lm.json" --train "$tmp/lm.txt" --out "$tmp/vit" --resume
one_line_error "resume another arch"
printf 'good\nbad\377\n' >"$tmp/badlm.txt"
check "train decoder invalid UTF-8" nonzero "$QKV" train --config "$tmp/lm.json" --train "$tmp/badlm.txt" --out "$tmp/lm2"
one_line_error "train decoder invalid UTF-8"
grep -q "line 2: invalid UTF-8" "$tmp/err" || { echo "FAIL decoder UTF-8 error lacks the line"; cat "$tmp/err"; failures=$((failures + 1)); }

# Benchmarks: a tiny run of each suite prints its table; a wrong suite is one clear error.
check "bench attention tiny" 0 "$QKV" bench attention --n 64 96 --seconds 0.01 --rounds 1 --python false
grep -q "flash" "$tmp/out" && grep -q "naive" "$tmp/out" || { echo "FAIL bench attention table"; cat "$tmp/out"; failures=$((failures + 1)); }
check "bench attention json" 0 "$QKV" bench attention --json --n 64 --seconds 0.01 --rounds 2 --python false
grep -q '"peak_extra_bytes"' "$tmp/out" || { echo "FAIL bench attention json"; failures=$((failures + 1)); }
# Two rounds, one row per kernel still (each keeps its best round): flash and naive at n = 64.
python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); sys.exit(not (d["rounds"] == 2 and [r["impl"] for r in d["rows"]] == ["flash", "naive"]))' "$tmp/out" \
  || { echo "FAIL bench attention --rounds 2 json"; failures=$((failures + 1)); }
check "bench train tiny" 0 "$QKV" bench train --steps 1 --rounds 1 --json --python false
grep -q '"qkv_tokens_per_s"' "$tmp/out" || { echo "FAIL bench train json"; failures=$((failures + 1)); }
grep -q '"gemm_kernel"' "$tmp/out" || { echo "FAIL bench json lacks what ran (runtime)"; failures=$((failures + 1)); }
check "bench train --rounds 0" nonzero "$QKV" bench train --rounds 0 --python false
one_line_error "bench train --rounds 0"
check "bench decode" 0 "$QKV" bench decode --model "$tmp/demo/model" --test "$tmp/demo/zh-ja.test.tsv" --sentences 5 --json
grep -q '"greedy, uncached"' "$tmp/out" || { echo "FAIL bench decode json"; cat "$tmp/out"; failures=$((failures + 1)); }
check "bench vit bf16" 0 bash -c "cd '$FIXTURES/../..' && '$QKV' bench vit --steps 1 --rounds 1 --json --python false --precision bf16"
grep -q '"precision": "bf16"' "$tmp/out" || { echo "FAIL bench vit bf16 json"; failures=$((failures + 1)); }
check "bench train unknown precision" nonzero "$QKV" bench train --precision fp8 --python false
one_line_error "bench train unknown precision"
check "bench unknown suite" nonzero "$QKV" bench frobnicate
one_line_error "bench unknown suite"

# What runs: the CPU, the kernel level and the GEMM kernel; a forced level.
check "info" 0 "$QKV" info
for want in '^cpu: ' '^features: ' '^kernels: ' '^gemm: ' '^blas: .*OpenBLAS' '^threads: '; do
  grep -q "$want" "$tmp/out" || { echo "FAIL info lacks $want"; cat "$tmp/out"; failures=$((failures + 1)); }
done
check "info --json" 0 "$QKV" info --json
grep -q '"gemm_kernel"' "$tmp/out" || { echo "FAIL info --json"; cat "$tmp/out"; failures=$((failures + 1)); }
check "--version says what runs" 0 "$QKV" --version
grep -q '^kernels: ' "$tmp/out" || { echo "FAIL --version lacks the kernels"; cat "$tmp/out"; failures=$((failures + 1)); }
check "QKV_ISA=generic" 0 env QKV_ISA=generic "$QKV" info
grep -q '^kernels:  generic (forced by QKV_ISA' "$tmp/out" || { echo "FAIL QKV_ISA=generic"; cat "$tmp/out"; failures=$((failures + 1)); }
check "QKV_ISA nonsense" nonzero env QKV_ISA=avx3 "$QKV" info
one_line_error "QKV_ISA nonsense"
check "threads too many" nonzero "$QKV" info --threads 100000
one_line_error "threads too many"
check "threads negative" nonzero "$QKV" info --threads -2
one_line_error "threads negative"

if [ $failures -ne 0 ]; then echo "$failures CLI check(s) failed"; exit 1; fi
echo "all CLI checks passed"
