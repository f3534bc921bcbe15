// Internal: the BLAS library, loaded at run time with its kernel chosen by
// qkv from CPU features.
//
// OpenBLAS built with DYNAMIC_ARCH (Debian's) picks its kernel set once, in a
// constructor that runs when the library is loaded, from a table of CPU
// models; a model it does not know (newer Intel Xeons, for 0.3.21) gets the
// SSE3 "Prescott" kernels, 3-4x slower. The only documented way to choose is
// the OPENBLAS_CORETYPE variable, read by that constructor. So qkv does not
// link OpenBLAS: on first use it sets the variable from the features it read
// (unless the user set it), loads the library with dlopen, and restores the
// environment, so that child processes (a Python peer with its own BLAS) see
// what they would have seen.
#pragma once

#include <cblas.h>

namespace qkv::blas {

using SgemmFn = decltype(&cblas_sgemm);

// cblas_sgemm of the loaded library (loading it on the first call).
SgemmFn sgemm();

}  // namespace qkv::blas
