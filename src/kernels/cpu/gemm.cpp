// Fast GEMM: the single place qkv calls BLAS (OpenBLAS, OpenMP build).
#include <cblas.h>

#include "src/kernels/kernels.h"

namespace qkv::cpu {

void gemm(const GemmArgs& g) {
  if (g.m == 0 || g.n == 0) return;
  cblas_sgemm(CblasRowMajor, g.trans_a ? CblasTrans : CblasNoTrans, g.trans_b ? CblasTrans : CblasNoTrans,
              (blasint)g.m, (blasint)g.n, (blasint)g.k, g.alpha, g.a, (blasint)g.lda, g.b, (blasint)g.ldb, g.beta,
              g.c, (blasint)g.ldc);
}

}  // namespace qkv::cpu
