# qkv: the two commands a new user needs are `make demo` and `make test`.
JOBS ?= $(shell nproc)
QKV := build/release/qkv

.PHONY: all deps build demo test test-asan fuzz fuzz-smoke bench fixtures interop clean

all: build

deps:
	@scripts/install-deps.sh

build: deps
	@cmake --preset release >/dev/null
	@cmake --build --preset release -j $(JOBS)

demo: build
	@$(QKV) demo --out out/demo

test: build
	@ctest --preset release -j $(JOBS)

# The test suite under AddressSanitizer + UndefinedBehaviorSanitizer.
test-asan: deps
	@cmake --preset asan >/dev/null
	@cmake --build --preset asan -j $(JOBS)
	@ASAN_OPTIONS=detect_leaks=1 ctest --preset asan -j $(JOBS)

# The libFuzzer harnesses (tests/fuzz), built with clang, ASan and UBSan.
fuzz:
	@scripts/install-deps.sh --fuzz
	@cmake --preset fuzz >/dev/null
	@cmake --build --preset fuzz -j $(JOBS)

# Each harness for FUZZ_SECONDS (two at a time); docs/reliability.md has longer runs.
FUZZ_SECONDS ?= 30
fuzz-smoke: fuzz
	@scripts/fuzz.sh $(FUZZ_SECONDS)

bench: build
	@$(QKV) bench ops
	@$(QKV) bench attention
	@$(QKV) bench train
	@test -d out/demo/model && $(QKV) bench decode || echo "bench decode: run make demo first (it needs a trained model)"

# Regenerate the golden fixtures from PyTorch, the tokenizer.json fixtures and the Hugging Face folders
# (needs: pip install torch safetensors numpy tokenizers transformers).
fixtures:
	python3 scripts/make_fixtures.py
	python3 scripts/make_tokenizer_fixtures.py
	python3 scripts/make_hf_fixtures.py

# Python's safetensors loads a file qkv wrote (needs the same Python packages).
interop: build
	QKV_INTEROP_OUT=build/qkv_written.safetensors build/release/tests/qkv_tests --gtest_filter='*WritesFileForPython*'
	python3 scripts/make_fixtures.py --check-qkv-file build/qkv_written.safetensors

clean:
	rm -rf build out
