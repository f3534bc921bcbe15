#!/usr/bin/env bash
# Fails when a kernel variant's object file defines a global or weak symbol
# outside its own namespace qkv::cpu::<level>.
#
# The variants are the same sources compiled for different instruction sets.
# An inline function or template instance (std::vector<float>::resize, say)
# that two variants both emit is one weak symbol to the linker, which keeps
# one copy for every caller: the AVX-512 one could then run on a CPU without
# AVX-512 and die on an illegal instruction. Keeping every defined name of a
# variant inside its namespace rules that out.
#
# Usage: check_kernel_variants.sh NM LEVEL... -- OBJECT...
set -euo pipefail
nm=$1; shift
levels=()
while [ "$1" != "--" ]; do levels+=("$1"); shift; done
shift
bad=0
for obj in "$@"; do
  isa=""
  for l in "${levels[@]}"; do
    case "$obj" in *"/qkv_kernels_$l.dir/"*) isa=$l ;; esac
  done
  [ -n "$isa" ] || { echo "check_kernel_variants: $obj is in no variant's folder" >&2; exit 1; }
  # Defined symbols with external or weak linkage (upper-case types, u, v, w).
  while IFS= read -r line; do
    name=${line#* * }
    case "$name" in
      "qkv::cpu::$isa::"* | *" for qkv::cpu::$isa::"*) ;;
      DW.ref.__gxx_personality_v0) ;;  # the C++ exception personality's address: data, the same in every object
      "typeinfo for "* | "typeinfo name for "*) ;;  # data, the same in every object (UBSan emits them for function types)
      __clang_call_terminate) ;;  # clang's two-call helper (begin the catch, terminate): no instruction of any level
      *) echo "check_kernel_variants: ${obj##*/} ($isa) defines '$name' outside qkv::cpu::$isa" >&2; bad=1 ;;
    esac
  done < <("$nm" -C --defined-only "$obj" | awk '$2 ~ /^[A-Zuvw]$/')
done
exit $bad
