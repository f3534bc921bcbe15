# qkv: the two commands a new user needs are `make demo` and `make test`.
JOBS ?= $(shell nproc)
QKV := build/release/qkv

.PHONY: all deps build demo test test-asan bench clean

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

bench: build
	@$(QKV) bench ops

clean:
	rm -rf build out
