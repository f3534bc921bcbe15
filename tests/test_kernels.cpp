// The kernels that the tensor core, the tape, dropout, batched matmul and the
// optimizers hand their element loops to (src/kernels/kernels.h): each level
// the CPU runs against its reference twin, on sizes large enough to take the
// threaded paths, and the tables themselves.
#include <omp.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <bit>
#include <cstring>
#include <functional>
#include <limits>
#include <utility>

#include "qkv/dtype.h"
#include "qkv/ops.h"
#include "qkv/rng.h"
#include "src/kernels/kernels.h"
#include "tests/test_util.h"

namespace qkv {
namespace {

using testing::all_close;

std::vector<const Kernels*> levels() {
  std::vector<const Kernels*> out;
  for (CpuIsa isa : {CpuIsa::Generic, CpuIsa::Avx2, CpuIsa::Avx512})
    if (isa_supported(isa)) out.push_back(&cpu::kernels(isa));
  return out;
}

TEST(Kernels, TablesSayWhatTheyAre) {
  EXPECT_STREQ(ref::table().name, "reference");
  EXPECT_STREQ(cpu::kernels(CpuIsa::Generic).name, "cpu generic");
  EXPECT_EQ(&kernels_for(Device::Cpu), &cpu::kernels());
  {
    ReferenceKernelsGuard guard;
    EXPECT_EQ(&kernels_for(Device::Cpu), &ref::table());
  }
  EXPECT_EQ(testing::error_of([] { kernels_for(Device::Meta); }),
            "ops do not run on the meta device: its tensors have no values");
}

// Permuted and sliced views of every element size, small (one thread) and
// large (split between threads), into contiguous and strided destinations.
TEST(Kernels, StridedCopyMatchesTheReference) {
  omp_set_num_threads(2);
  Rng rng(2);
  for (const Kernels* k : levels()) {
    for (size_t es : {1, 2, 4, 8}) {
      for (const Shape& shape : {Shape{3, 5, 7}, Shape{2, 64, 40, 33}, Shape{1}, Shape{}}) {
        const int64_t n = shape_numel(shape);
        std::vector<uint8_t> src(n * es), dst_fast(n * es * 2, 0xab), dst_ref(n * es * 2, 0xab);
        for (auto& b : src) b = (uint8_t)(rng.next_bits() & 0xff);
        // Source: the transpose of the first two dimensions; destination: every other element.
        StridedCopy c;
        Shape view = shape, cs = contiguous_strides(shape), src_strides = cs;
        if (shape.size() >= 2) {
          std::swap(view[0], view[1]);
          std::swap(src_strides[0], src_strides[1]);
        }
        Shape dst_strides = contiguous_strides(view);
        for (int64_t& s : dst_strides) s *= 2;
        c.rank = (int64_t)shape.size();
        c.shape = view.data(), c.src_strides = src_strides.data(), c.dst_strides = dst_strides.data();
        c.elem_size = es;
        c.src = src.data();
        c.dst = dst_fast.data();
        k->strided_copy(c);
        c.dst = dst_ref.data();
        ref::strided_copy(c);
        EXPECT_EQ(dst_fast, dst_ref) << k->name << " elem " << es << " shape " << shape_str(shape);
        // Both contiguous: one block, split between threads when large.
        c.shape = shape.data(), c.src_strides = c.dst_strides = cs.data();
        c.dst = dst_fast.data();
        k->strided_copy(c);
        EXPECT_EQ(std::memcmp(dst_fast.data(), src.data(), n * es), 0) << k->name << " contiguous";
      }
    }
  }
}

TEST(Kernels, AccumulateAndDropoutMaskMatchTheReference) {
  omp_set_num_threads(2);
  Rng rng(3);
  for (const Kernels* k : levels()) {
    for (int64_t n : {100, 200000}) {
      Tensor acc = Tensor::randn({n}, rng), x = Tensor::randn({n}, rng);
      Tensor a_fast = acc.clone(), a_ref = acc.clone();
      k->accumulate(a_fast.data<float>(), x.data<float>(), n);
      ref::accumulate(a_ref.data<float>(), x.data<float>(), n);
      EXPECT_TRUE(all_close(a_fast, a_ref, 0, 0)) << k->name;
      Tensor m_fast = Tensor::empty({n}), m_ref = Tensor::empty({n});
      k->dropout_mask(rng, 1234, 0.3f, m_fast.data<float>(), n);
      ref::dropout_mask(rng, 1234, 0.3f, m_ref.data<float>(), n);
      EXPECT_TRUE(all_close(m_fast, m_ref, 0, 0)) << k->name;
      const std::vector<float> m = m_fast.to_vector();
      const double dropped = (double)std::count(m.begin(), m.end(), 0.0f) / n;
      if (n > 1000) {
        EXPECT_NEAR(dropped, 0.3, 0.01) << k->name;
      }
      EXPECT_TRUE(std::all_of(m.begin(), m.end(), [](float v) { return v == 0.0f || v == 1.0f / 0.7f; }));
    }
  }
}

// Conversions between F32, F16 and BF16, bit for bit the scalar ones of
// qkv/dtype.h (the reference): every 16-bit pattern of F16 and BF16 (NaNs
// with payloads, signalling ones, subnormals, infinities) into each other
// and F32; into F16 and BF16, float32 values of every exponent from random
// bits plus those that round at the edges (ties to even, float16's overflow
// at 65520, its subnormals and their ties, float32 subnormals); lengths with
// a tail past the vectors, one thread's and split between two. Each of
// these failed it: F16C rounding toward zero instead of to nearest, its NaN
// payloads kept (not made sign | 0x7e00), a float16 NaN widened by F16C
// alone (made quiet).
TEST(Kernels, ConvertFloatsMatchesTheReference) {
  omp_set_num_threads(2);
  Rng rng(13);
  std::vector<uint32_t> f32_bits;
  for (int i = 0; i < 200000; ++i) f32_bits.push_back((uint32_t)rng.next_bits());
  for (float v : {0.0f, -0.0f, INFINITY, -INFINITY, NAN, -NAN, std::numeric_limits<float>::max(), 65504.0f, 65519.996f,
                  65520.0f, std::ldexp(1.0f, -24), std::ldexp(1.0f, -25), std::ldexp(3.0f, -26),
                  std::ldexp(1.0f, -14) * 1.00048828125f, 1.0f + std::ldexp(1.0f, -8), 1.0f + std::ldexp(3.0f, -8),
                  1.0f + std::ldexp(1.0f, -11), 1.0f + std::ldexp(3.0f, -11), std::ldexp(1.0f, -140)})
    f32_bits.push_back(std::bit_cast<uint32_t>(v));
  for (uint32_t payload : {0x7f800001u, 0xffa00000u, 0x7fc00123u, 0x7fbfffffu}) f32_bits.push_back(payload);
  std::vector<uint16_t> all16(65536 + 7);
  for (size_t i = 0; i < all16.size(); ++i) all16[i] = (uint16_t)(i * 40503u);  // every pattern, in a scrambled order
  for (const Kernels* k : levels())
    for (DType from : {DType::F32, DType::F16, DType::BF16})
      for (DType to : {DType::F32, DType::F16, DType::BF16})
        for (int64_t n : {int64_t{37}, from == DType::F32 ? (int64_t)f32_bits.size() : (int64_t)all16.size()}) {
          const void* x = from == DType::F32 ? (const void*)f32_bits.data() : (const void*)all16.data();
          const size_t bytes = n * (to == DType::F32 ? 4 : 2);
          std::vector<uint8_t> fast(bytes, 0xab), want(bytes);
          k->convert_floats(from, x, to, fast.data(), n);
          ref::convert_floats(from, x, to, want.data(), n);
          for (int64_t i = 0; i < n; ++i) {
            const size_t w = to == DType::F32 ? 4 : 2;
            ASSERT_EQ(std::memcmp(fast.data() + i * w, want.data() + i * w, w), 0)
                << k->name << " " << dtype_name(from) << " -> " << dtype_name(to) << " element " << i << " of " << n;
          }
        }
  omp_set_num_threads(1);
}

// Blockwise int8 quantization, bit for bit int8_block_scale and
// int8_quantize (the reference): rows of whole and partial blocks, values
// halfway between two steps (ties to even), NaN and infinity in a block,
// a block of values too small for a scale (zeros), one thread's rows and
// two. Rounding the scaled values toward zero failed it.
TEST(Kernels, QuantizeInt8RowsMatchesTheReference) {
  omp_set_num_threads(2);
  Rng rng(14);
  for (const Kernels* k : levels())
    for (auto [rows, cols] : {std::pair<int64_t, int64_t>{3, 100}, {5, 32}, {700, 96}}) {
      Tensor x = Tensor::randn({rows, cols}, rng);
      float* v = x.data<float>();
      for (int64_t c = 0; c < std::min<int64_t>(cols, 32); ++c)  // row 0's first block: amax 127, halves between steps
        v[c] = c == 0 ? 127.0f : (float)(c % 9) - 4.5f;
      v[cols + 3] = NAN, v[cols + 20] = NAN;  // a NaN in each half of row 1's first block
      v[cols + 40 < 2 * cols ? cols + 40 : cols + 5] = INFINITY;
      for (int64_t c = 0; c < std::min<int64_t>(cols, 32); ++c) v[2 * cols + c] = std::ldexp(1.0f, -130) * (c % 3);
      const int64_t blocks = (cols + kInt8Block - 1) / kInt8Block;
      std::vector<int8_t> q(rows * cols, 99), q_ref(rows * cols);
      std::vector<float> s(rows * blocks, NAN), s_ref(rows * blocks);
      k->quantize_int8_rows(v, q.data(), s.data(), rows, cols);
      ref::quantize_int8_rows(v, q_ref.data(), s_ref.data(), rows, cols);
      EXPECT_EQ(q, q_ref) << k->name << " " << rows << " x " << cols;
      EXPECT_EQ(std::memcmp(s.data(), s_ref.data(), s.size() * sizeof(float)), 0)
          << k->name << " " << rows << " x " << cols;
      EXPECT_EQ(q[1], -4) << k->name << ": -3.5 (scale 1) to the even step";
    }
  omp_set_num_threads(1);
}

// Many small products (one per thread) and a few large ones, with the second
// operand broadcast (every offset 0), and k == 0 (zeros).
TEST(Kernels, BatchedGemmMatchesTheReference) {
  omp_set_num_threads(2);
  Rng rng(4);
  for (const Kernels* k : levels()) {
    for (auto [batch, m, n, kk] : {std::array<int64_t, 4>{12, 9, 7, 5}, {3, 70, 90, 80}, {4, 3, 2, 0}}) {
      Tensor a = Tensor::randn({batch, m, std::max<int64_t>(kk, 1)}, rng), b = Tensor::randn({kk, n}, rng);
      std::vector<int64_t> a_off(batch), b_off(batch, 0);
      for (int64_t i = 0; i < batch; ++i) a_off[i] = i * m * std::max<int64_t>(kk, 1);
      GemmArgs g;
      g.m = m, g.n = n, g.k = kk;
      g.a = a.data<float>(), g.lda = std::max<int64_t>(kk, 1), g.b = b.data<float>(), g.ldb = n, g.ldc = n;
      Tensor c_fast = Tensor::full({batch, m, n}, NAN), c_ref = Tensor::full({batch, m, n}, NAN);
      g.c = c_fast.data<float>();
      k->gemm_batched(g, batch, a_off.data(), b_off.data(), m * n);
      g.c = c_ref.data<float>();
      ref::gemm_batched(g, batch, a_off.data(), b_off.data(), m * n);
      // BLAS sums k in blocks: partial sums, then their sum (two roundings deep).
      EXPECT_TRUE(testing::float32_close(c_fast, c_ref, {.terms = std::max<int64_t>(kk, 1), .stages = 2}))
          << k->name << " batch " << batch << " k " << kk;
    }
  }
}

// gemm_bf16 on every level, and on avx512 each of its paths the CPU has
// (AMX tiles, AVX512-BF16, widened float32), named for failure messages.
using Bf16Path = std::pair<std::string, void (*)(const GemmBf16Args&)>;
std::vector<Bf16Path> bf16_paths() {
  std::vector<Bf16Path> paths;
  for (const Kernels* k : levels()) paths.push_back({k->name, k->gemm_bf16});
  if (isa_supported(CpuIsa::Avx512)) {
    if (cpu::avx512::amx_bf16_usable()) paths.push_back({"avx512 AMX", &cpu::avx512::gemm_bf16_amx});
    if (cpu::avx512::avx512_bf16_usable()) paths.push_back({"avx512 AVX512-BF16", &cpu::avx512::gemm_bf16_avx512_bf16});
    paths.push_back({"avx512 widened", &cpu::avx512::gemm_bf16_widened});
  }
  return paths;
}

// A bfloat16 GEMM case: shape, the row padding of the operands, alpha, beta, a bias or none.
struct Bf16Case {
  int64_t m, n, k, pad;
  float alpha, beta;
  bool bias;
};

// A case's operands: A [m, k] (row stride lda = k + pad) and B [n, k] (row
// stride ldb), bfloat16 from normal values, and their widened float32 copies.
struct Bf16Operands {
  int64_t lda, ldb;
  std::vector<uint16_t> a, b;
  Tensor a32, b32;
  Bf16Operands(const Bf16Case& c, int64_t ldb, Rng& rng) : lda(c.k + c.pad), ldb(ldb), a(c.m * lda), b(c.n * ldb) {
    for (auto& v : a) v = float_to_bf16(rng.next_normal());
    for (auto& v : b) v = float_to_bf16(rng.next_normal());
    a32 = Tensor::zeros({c.m, lda}), b32 = Tensor::zeros({c.n, ldb});
    for (size_t i = 0; i < a.size(); ++i) a32.data<float>()[i] = bf16_to_float(a[i]);
    for (size_t i = 0; i < b.size(); ++i) b32.data<float>()[i] = bf16_to_float(b[i]);
  }
  // The case's product of these operands, its bias when c.bias; C (row stride ldc) is the caller's.
  GemmBf16Args args(const Bf16Case& c, int64_t ldc, const Tensor& bias) const {
    GemmBf16Args g;
    g.m = c.m, g.n = c.n, g.k = c.k, g.alpha = c.alpha, g.beta = c.beta;
    g.a = a.data(), g.lda = lda, g.b = b.data(), g.ldb = ldb, g.ldc = ldc;
    g.bias = c.bias ? bias.data<float>() : nullptr;
    return g;
  }
  // The same product in float32 on the widened copies, for gemm_close's bound.
  GemmArgs float32(const GemmBf16Args& g) const {
    GemmArgs f;
    f.trans_b = true, f.m = g.m, f.n = g.n, f.k = g.k, f.alpha = g.alpha, f.beta = g.beta;
    f.a = a32.data<float>(), f.lda = lda, f.b = b32.data<float>(), f.ldb = ldb, f.ldc = g.ldc, f.bias = g.bias;
    return f;
  }
};

// The bfloat16 GEMM on every level and, on avx512, on each of its paths the
// CPU has (AMX tiles, AVX512-BF16, widened float32), on ragged shapes that
// leave partial tiles on every side, strided rows, alpha, beta and bias, with
// each operand in bfloat16 or float32, held as is or transposed. A
// product of two bfloat16 values is exact in float32, so the bound is the
// float32 dot product's (gemm_close) on the widened inputs. Dropping a term
// (packing k - 1 of A's) failed every case on the AMX and AVX512-BF16 paths;
// in the 67 x 45 x 130 case by an error of 1.2 against a bound of 1.4e-3;
// dropping the last k of a transposed A (in its packing) failed 140 checks;
// AMX tiles started at zero instead of the bias failed the 96 x 80 x 64
// and 40 x 520 x 530 cases; the second panel of B skipped failed the latter;
// a transposed operand's tiles stored in the order they are packed (chunk by
// chunk) instead of at their place failed 384 checks.
TEST(Kernels, GemmBf16MatchesTheReference) {
  omp_set_num_threads(2);
  Rng rng(6);
  const std::vector<Bf16Path> paths = bf16_paths();
  for (const Bf16Case& c :
       {Bf16Case{1, 1, 1, 0, 1, 0, false}, Bf16Case{3, 5, 7, 2, 0.5f, 0.75f, true}, Bf16Case{17, 33, 31, 0, 1, 0, true},
        Bf16Case{33, 17, 65, 3, 1, 1, false}, Bf16Case{67, 45, 130, 1, -2, 0, true},
        Bf16Case{130, 70, 300, 0, 1, 0.5f, true}, Bf16Case{256, 96, 64, 0, 1, 0, false},
        Bf16Case{5, 300, 33, 4, 1, 0, true}, Bf16Case{4, 6, 0, 0, 1, 0.5f, true},
        // whole 32 x 32 blocks that start their tiles at C (beta 1) or at the bias and
        // store into C; three rows of blocks, split between threads by columns
        Bf16Case{70, 64, 96, 0, 1, 1, false}, Bf16Case{96, 80, 64, 2, 1, 0, true},
        // B more than one panel (A then packed whole)
        Bf16Case{40, 520, 530, 0, 1, 0, true},
        // up to 4 rows: the streaming path, with a tail of k and split between threads
        Bf16Case{4, 300, 1000, 3, 1, 0.5f, true}, Bf16Case{2, 40, 64, 0, 1, 0, false},
        Bf16Case{1, 700, 100, 0, 1, 0, true}}) {
    const int64_t lda = c.k + c.pad, ldb = c.k + 2 * c.pad, ldc = c.n + c.pad;
    const Bf16Operands ops(c, ldb, rng);
    const std::vector<uint16_t>&a = ops.a, &b = ops.b;
    Tensor bias = Tensor::randn({c.n}, rng), c0 = Tensor::randn({c.m, ldc}, rng);
    GemmBf16Args g = ops.args(c, ldc, bias);
    Tensor ref_c = c0.clone();
    g.c = ref_c.data<float>();
    ref::gemm_bf16(g);
    const GemmArgs f = ops.float32(g);  // the same product in float32, for the bound
    // Each operand four ways: bfloat16 or float32 (its values the bfloat16
    // ones plus noise below half a bfloat16 unit, so that rounding gives them
    // back), each as [rows, k] or held transposed as [k, rows] (row stride
    // rows + pad); all must give the one reference product.
    struct Forms {
      std::vector<uint16_t> bf16, bf16_t;
      std::vector<float> f32, f32_t;
      int64_t ld_t;
    };
    auto forms = [&](const std::vector<uint16_t>& x, int64_t rows, int64_t ld) {
      Forms out{x, {}, {}, {}, rows + c.pad + 1};
      out.bf16_t.assign(std::max<int64_t>(c.k, 1) * out.ld_t, 0);
      out.f32_t.assign(out.bf16_t.size(), 0.0f);
      for (uint16_t v : x) out.f32.push_back(bf16_to_float(v) * (1.0f + 0.001f * (rng.next_uniform() - 0.5f)));
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t p = 0; p < c.k; ++p) {
          out.bf16_t[p * out.ld_t + r] = x[r * ld + p];
          out.f32_t[p * out.ld_t + r] = out.f32[r * ld + p];
        }
      return out;
    };
    const Forms fa = forms(a, c.m, lda), fb = forms(b, c.n, ldb);
    for (int form = 0; form < 16; ++form) {
      const bool a_f32 = form & 1, a_t = form & 2, b_f32 = form & 4, b_t = form & 8;
      g.a = a_f32 ? nullptr : a_t ? fa.bf16_t.data() : fa.bf16.data();
      g.a_f32 = !a_f32 ? nullptr : a_t ? fa.f32_t.data() : fa.f32.data();
      g.lda = a_t ? fa.ld_t : lda, g.a_transposed = a_t;
      g.b = b_f32 ? nullptr : b_t ? fb.bf16_t.data() : fb.bf16.data();
      g.b_f32 = !b_f32 ? nullptr : b_t ? fb.f32_t.data() : fb.f32.data();
      g.ldb = b_t ? fb.ld_t : ldb, g.b_transposed = b_t;
      // In inference too: on a level without AVX512-BF16, B bfloat16 as it lies meets the register tiles.
      for (const auto& [name, gemm_bf16] : paths)
        for (bool inference : {false, true}) {
          Tensor out = c0.clone();
          g.c = out.data<float>(), g.inference = inference;
          gemm_bf16(g);
          g.inference = false;
          EXPECT_TRUE(testing::gemm_close(f, c0, out, ref_c))
              << name << (inference ? " inference " : " ") << c.m << "x" << c.n << "x" << c.k << " A "
              << (a_f32 ? "float32" : "bfloat16") << (a_t ? " transposed" : "") << ", B "
              << (b_f32 ? "float32" : "bfloat16") << (b_t ? " transposed" : "");
        }
      // B packed once and given alone (b null), as a Linear that keeps only its packed
      // weight gives it: up to 4 rows take a GEMV of the packed layout, more the tiles.
      for (const Kernels* level : levels()) {
        const int64_t words = level->gemm_bf16_packed_b_words(c.n, c.k);
        if (words == 0 || b_f32 || b_t) continue;
        std::vector<uint32_t> packed((size_t)words);
        level->gemm_bf16_pack_b(g, packed.data());
        GemmBf16Args h = g;
        h.b = nullptr, h.b_packed = packed.data();
        Tensor out = c0.clone();
        h.c = out.data<float>();
        level->gemm_bf16(h);
        EXPECT_TRUE(testing::gemm_close(f, c0, out, ref_c))
            << level->name << " B packed only, " << c.m << "x" << c.n << "x" << c.k << " A "
            << (a_f32 ? "float32" : "bfloat16") << (a_t ? " transposed" : "");
      }
      Tensor out = c0.clone();  // the reference itself, on the same forms
      g.c = out.data<float>();
      ref::gemm_bf16(g);
      EXPECT_TRUE(testing::gemm_close(f, c0, out, ref_c)) << "reference, form " << form;
    }
  }
}

// GemmBf16Args::a_sums (a Linear's bias gradient, summed by dW's product as
// it packs dy) on every level against the reference's float64 sums, with the
// product itself unchanged: a transposed float32 A, summed while packed on a
// CPU with AVX512-BF16 (37 rows and k 100 leave edge tiles on both sides;
// k 2048 is 64 chunks), apart for A as rows and for up to 4 rows. Dropping
// the last chunk from the packed sums failed the 37 x 100 and 64 x 2048
// cases on avx512; the edge tiles' sums left out, the 37 x 100 one.
TEST(Kernels, GemmBf16SumsTheRowsOfA) {
  omp_set_num_threads(2);
  Rng rng(12);
  struct Case {
    int64_t m, n, k;
    bool transposed;
  };
  for (const Case& c : {Case{37, 20, 100, true}, Case{64, 48, 2048, true}, Case{37, 20, 100, false},
                        Case{3, 10, 50, true}, Case{16, 5, 0, true}}) {
    const int64_t lda = c.transposed ? c.m + 3 : c.k + 3;
    Tensor a = Tensor::randn({std::max<int64_t>(c.transposed ? c.k : c.m, 1), lda}, rng);
    Tensor b = Tensor::randn({c.n, std::max<int64_t>(c.k, 1)}, rng);
    GemmBf16Args g;
    g.m = c.m, g.n = c.n, g.k = c.k, g.a_f32 = a.data<float>(), g.lda = lda, g.a_transposed = c.transposed;
    g.b_f32 = b.data<float>(), g.ldb = std::max<int64_t>(c.k, 1), g.ldc = c.n;
    Tensor ref_c = Tensor::zeros({c.m, c.n}), ref_sums = Tensor::full({c.m}, NAN);
    g.c = ref_c.data<float>(), g.a_sums = ref_sums.data<float>();
    ref::gemm_bf16(g);
    for (const Kernels* level : levels()) {
      Tensor out = Tensor::zeros({c.m, c.n}), sums = Tensor::full({c.m}, NAN), plain = Tensor::zeros({c.m, c.n});
      g.c = out.data<float>(), g.a_sums = sums.data<float>();
      level->gemm_bf16(g);
      g.c = plain.data<float>(), g.a_sums = nullptr;
      level->gemm_bf16(g);
      const std::string what = std::string(level->name) + " " + std::to_string(c.m) + "x" + std::to_string(c.k) +
                               (c.transposed ? " transposed" : "");
      EXPECT_TRUE(testing::float32_close(sums, ref_sums, {.terms = std::max<int64_t>(c.k, 1), .stages = 2})) << what;
      EXPECT_EQ(std::memcmp(out.data<float>(), plain.data<float>(), sizeof(float) * c.m * c.n), 0)
          << what << ": the product moved";
    }
  }
}

// GemmBf16Args::act_out (a Linear's activation under mixed precision,
// computed as the blocks of C are stored): on every level and each avx512
// path the CPU has, C is the product without it, bit for bit, and act_out
// is GELU of C (the level's unary_forward, to its float32 rounding), into
// a buffer of its own and in place (act_out = c). 64 x 64 x 96 with a bias
// stores whole AMX blocks in place; 37 x 45 leaves edges (finish_tile); 3
// rows take the streaming path, activated apart. Without the activation on
// the in-place blocks, the 64 x 64 and 37 x 45 cases (its first block whole)
// failed on AMX, through the level and the path.
TEST(Kernels, GemmBf16ActivatesCAsItStoresIt) {
  omp_set_num_threads(2);
  Rng rng(13);
  struct Case {
    int64_t m, n, k;
  };
  std::vector<Bf16Path> paths;
  for (const Kernels* level : levels()) paths.push_back({level->name, level->gemm_bf16});
  if (isa_supported(CpuIsa::Avx512)) {
    if (cpu::avx512::amx_bf16_usable()) paths.push_back({"avx512 AMX", &cpu::avx512::gemm_bf16_amx});
    if (cpu::avx512::avx512_bf16_usable()) paths.push_back({"avx512 AVX512-BF16", &cpu::avx512::gemm_bf16_avx512_bf16});
  }
  for (const Case& c : {Case{64, 64, 96}, Case{37, 45, 70}, Case{3, 20, 50}}) {
    Tensor a = Tensor::randn({c.m, c.k}, rng), b = Tensor::randn({c.n, c.k}, rng), bias = Tensor::randn({c.n}, rng);
    GemmBf16Args g;
    g.m = c.m, g.n = c.n, g.k = c.k, g.a_f32 = a.data<float>(), g.lda = c.k, g.b_f32 = b.data<float>(), g.ldb = c.k;
    g.ldc = c.n, g.bias = bias.data<float>(), g.act = UnaryOp::Gelu, g.ld_act = c.n;
    for (const auto& [name, gemm_bf16] : paths) {
      if (c.m <= 4 && name.rfind("avx512 ", 0) == 0) continue;  // (the avx512 paths themselves take more than 4 rows)
      Tensor plain = Tensor::zeros({c.m, c.n}), out = Tensor::zeros({c.m, c.n}), act = Tensor::full({c.m, c.n}, NAN);
      g.c = plain.data<float>(), g.act_out = nullptr;
      gemm_bf16(g);
      g.c = out.data<float>(), g.act_out = act.data<float>();
      gemm_bf16(g);
      const std::string what = name + " " + std::to_string(c.m) + "x" + std::to_string(c.n);
      EXPECT_EQ(std::memcmp(out.data<float>(), plain.data<float>(), sizeof(float) * c.m * c.n), 0) << what;
      Tensor want = Tensor::empty({c.m, c.n});
      ref::unary_forward(UnaryOp::Gelu, plain.data<float>(), want.data<float>(), want.numel());
      EXPECT_TRUE(testing::float32_close(act, want, {.terms = 1, .stages = 8})) << what;
      Tensor same = Tensor::zeros({c.m, c.n});
      g.c = same.data<float>(), g.act_out = same.data<float>();
      gemm_bf16(g);
      EXPECT_TRUE(testing::float32_close(same, want, {.terms = 1, .stages = 8})) << what << " in place";
    }
  }
}

// For 1, 7 and 64 rows: run(m, i, c), a product of the m rows of A from row
// i on against a weight whose float32 copy is w32 [n, k], with bias, into c
// [m, n], gives the bits of the level's float32 register tiles over a32 [64,
// k] and w32, and each row alone the bits it got beside the others. With k
// 100 a tail of 4 values follows the last whole vector on both levels, and
// n 39 leaves a last group of 3 columns; 1 and 7 rows take the four-stream
// sweep (7: tiles of 4 or 2 rows and a shorter last one), 64 the blocked one.
void expect_float32_tiles_bits(const Kernels& level, const Tensor& a32, const Tensor& w32, const Tensor& bias,
                               const std::function<void(int64_t, int64_t, float*)>& run) {
  const int64_t n = w32.size(0), k = w32.size(1);
  for (int64_t m : {1, 7, 64}) {
    Tensor c = Tensor::zeros({m, n}), expect = Tensor::zeros({m, n});
    run(m, 0, c.data<float>());
    GemmArgs f;
    f.trans_b = true, f.inference = true, f.m = m, f.n = n, f.k = k;
    f.a = a32.data<float>(), f.lda = k, f.b = w32.data<float>(), f.ldb = k;
    f.c = expect.data<float>(), f.ldc = n, f.bias = bias.data<float>();
    level.gemm(f);
    EXPECT_EQ(0, std::memcmp(c.data<float>(), expect.data<float>(), sizeof(float) * m * n)) << level.name << " " << m;
    for (int64_t i = 0; i < m; i += 3) {
      Tensor alone = Tensor::zeros({1, n});
      run(1, i, alone.data<float>());
      EXPECT_EQ(0, std::memcmp(alone.data<float>(), c.data<float>() + i * n, sizeof(float) * n))
          << level.name << " row " << i << " of " << m;
    }
  }
}

// The float16-weight GEMM on every level against the reference, on ragged
// shapes (k past the vector width, tails), strided rows, alpha, beta, bias,
// k = 0, up to 4 rows (streamed, or tiles from k 16 on the avx2 and avx512
// levels), up to 64 (tiles there) and more (widened). A stays float32, so the
// bound is the float32 dot product's (gemm_close) on the widened weight.
// When every level streamed up to 4 rows with vector loops, dropping the
// last k of the scalar tail failed every streamed case whose k left a tail
// on that level (2 x 17 x 65 on all three, 4 x 300 x 1000 on generic and
// avx512).
TEST(Kernels, GemmF16MatchesTheReference) {
  omp_set_num_threads(2);
  Rng rng(9);
  struct Case {
    int64_t m, n, k, pad;
    float alpha, beta;
    bool bias;
  };
  for (const Case& c : {Case{1, 1, 1, 0, 1, 0, false}, Case{3, 5, 7, 2, 0.5f, 0.75f, true}, Case{4, 33, 31, 0, 1, 0, true},
                        Case{2, 17, 65, 3, 1, 1, false}, Case{4, 300, 1000, 3, 1, 0.5f, true},
                        Case{1, 700, 100, 0, 1, 0, true}, Case{17, 33, 100, 2, 1, 0, true},
                        Case{67, 45, 130, 1, -2, 0.5f, true}, Case{4, 6, 0, 0, 1, 0.5f, true},
                        Case{9, 6, 0, 0, 1, 0.5f, true}}) {
    const int64_t lda = c.k + c.pad, ldb = c.k + 2 * c.pad, ldc = c.n + c.pad;
    Tensor a = Tensor::randn({c.m, lda}, rng), wide = Tensor::zeros({c.n, ldb});
    std::vector<uint16_t> b(c.n * ldb);
    for (size_t i = 0; i < b.size(); ++i) {
      b[i] = float_to_half(rng.next_normal());
      wide.data<float>()[i] = half_to_float(b[i]);
    }
    Tensor bias = Tensor::randn({c.n}, rng), c0 = Tensor::randn({c.m, ldc}, rng);
    GemmF16Args g;
    g.m = c.m, g.n = c.n, g.k = c.k, g.alpha = c.alpha, g.beta = c.beta;
    g.a = a.data<float>(), g.lda = lda, g.b = b.data(), g.ldb = ldb, g.ldc = ldc;
    g.bias = c.bias ? bias.data<float>() : nullptr;
    Tensor ref_c = c0.clone();
    g.c = ref_c.data<float>();
    ref::gemm_f16(g);
    GemmArgs f;  // the same product in float32, for the bound
    f.trans_b = true, f.m = c.m, f.n = c.n, f.k = c.k, f.alpha = c.alpha, f.beta = c.beta;
    f.a = a.data<float>(), f.lda = lda, f.b = wide.data<float>(), f.ldb = ldb, f.ldc = ldc, f.bias = g.bias;
    for (const Kernels* k : levels()) {
      Tensor out = c0.clone();
      g.c = out.data<float>();
      k->gemm_f16(g);
      EXPECT_TRUE(testing::gemm_close(f, c0, out, ref_c)) << k->name << " " << c.m << "x" << c.n << "x" << c.k;
    }
  }
}

TEST(Kernels, GemmF16SaysHowItRuns) {
  EXPECT_STREQ(ref::table().gemm_f16_path(), "reference (float64 sums)");
  EXPECT_STREQ(cpu::kernels(CpuIsa::Generic).gemm_f16_path(),
               "plain widening (rows streamed up to 4), the float32 GEMM on widened copies above");
  for (CpuIsa isa : {CpuIsa::Avx2, CpuIsa::Avx512}) {
    if (!isa_supported(isa)) continue;
    EXPECT_STREQ(cpu::kernels(isa).gemm_f16_path(),
                 "register tiles widening W with F16C for 1 to 64 rows (k >= 16), the float32 GEMM on widened "
                 "copies above");
  }
}

// Up to 64 rows against a float16 weight, the avx2 and avx512 levels give
// each output the bits of their float32 register tiles over the weight's
// float32 copy (F16C widens exactly), and a row alone gets the bits it got
// beside the others (expect_float32_tiles_bits): a stream's tokens do not
// depend on the streams beside it.
TEST(Kernels, F16WeightTilesGiveTheFloat32TilesBits) {
  omp_set_num_threads(2);
  Rng rng(37);
  const int64_t n = 39, k = 100;
  Tensor a = Tensor::randn({64, k}, rng), wide = Tensor::zeros({n, k}), bias = Tensor::randn({n}, rng);
  std::vector<uint16_t> b(n * k);
  for (size_t i = 0; i < b.size(); ++i) {
    b[i] = float_to_half(rng.next_normal());
    wide.data<float>()[i] = half_to_float(b[i]);
  }
  int levels_run = 0;
  for (const Kernels* level : levels()) {
    if (std::string(level->gemm_f16_path()).rfind("register tiles", 0) != 0) continue;
    ++levels_run;
    expect_float32_tiles_bits(*level, a, wide, bias, [&](int64_t m, int64_t i, float* c) {
      GemmF16Args g;
      g.m = m, g.n = n, g.k = k, g.a = a.data<float>() + i * k, g.lda = k, g.b = b.data(), g.ldb = k;
      g.c = c, g.ldc = n, g.bias = bias.data<float>();
      level->gemm_f16(g);
    });
  }
  if (levels_run == 0) GTEST_SKIP() << "no level this CPU runs has the register tiles";
}

// A B packed once (gemm_bf16_pack_b, what a Linear keeps for its BF16
// weight) gives the product of B packed on the call, bit for bit, on every
// level and avx512 path that reads one (the others report 0 words and are
// not given one): rows 1 to 130, partial blocks on every side, beta and
// bias, A in float32 or bfloat16, B more than one panel. Up to 4 rows a
// level's gemm_bf16 given a packed B takes a GEMV of the packed layout,
// whose sums run in another order than the streaming one's: those are
// held to the reference in GemmBf16MatchesTheReference instead. And the
// packing undone (gemm_bf16_unpack_b) gives B back, bit for bit. Packing B
// with its last k left out (gemm_bf16_pack_b with k - 1) failed every case
// with more than 4 rows.
TEST(Kernels, GemmBf16WithBPackedOnceIsTheSameProduct) {
  omp_set_num_threads(2);
  Rng rng(12);
  bool any = false;
  for (const Kernels* level : levels()) {
    using Path = std::pair<std::string, void (*)(const GemmBf16Args&)>;
    std::vector<Path> paths = {{level->name, level->gemm_bf16}};
    if (level->isa == CpuIsa::Avx512) {
      if (cpu::avx512::amx_bf16_usable()) paths.push_back({"avx512 AMX", &cpu::avx512::gemm_bf16_amx});
      if (cpu::avx512::avx512_bf16_usable())
        paths.push_back({"avx512 AVX512-BF16", &cpu::avx512::gemm_bf16_avx512_bf16});
    }
    struct Case {
      int64_t m, n, k;
      float beta;
    };
    for (const Case& c : {Case{1, 37, 33, 0}, Case{4, 301, 203, 0.5f}, Case{5, 37, 33, 0}, Case{17, 301, 203, 1},
                          Case{64, 96, 64, 0}, Case{130, 70, 300, 0.5f}, Case{40, 520, 530, 0}}) {
      const int64_t words = level->gemm_bf16_packed_b_words(c.n, c.k);
      if (words == 0) continue;
      any = true;
      Tensor a = Tensor::randn({c.m, c.k}, rng), w = Tensor::randn({c.n, c.k}, rng).to(DType::BF16);
      Tensor ab = a.to(DType::BF16), bias = Tensor::randn({c.n}, rng), c0 = Tensor::randn({c.m, c.n}, rng);
      GemmBf16Args g;
      g.m = c.m, g.n = c.n, g.k = c.k, g.beta = c.beta, g.bias = bias.data<float>();
      g.lda = c.k, g.b = w.data<uint16_t>(), g.ldb = c.k, g.ldc = c.n;
      std::vector<uint32_t> packed((size_t)words);
      level->gemm_bf16_pack_b(g, packed.data());
      std::vector<uint16_t> unpacked((size_t)(c.n * c.k));
      level->gemm_bf16_unpack_b(c.n, c.k, packed.data(), unpacked.data());
      EXPECT_EQ(0, std::memcmp(unpacked.data(), w.data<uint16_t>(), unpacked.size() * sizeof(uint16_t)))
          << level->name << " unpacked " << c.n << " x " << c.k;
      for (const auto& [name, run] : paths) {
        if (name == level->name && c.m <= 4) continue;  // the packed layout's own GEMV (see above)
        for (bool a_bf16 : {false, true}) {
          GemmBf16Args h = g;
          if (a_bf16)
            h.a = ab.data<uint16_t>();
          else
            h.a_f32 = a.data<float>();
          Tensor per_call = c0.clone(), once = c0.clone();
          h.c = per_call.data<float>();
          run(h);
          h.c = once.data<float>(), h.b_packed = packed.data();
          run(h);
          EXPECT_EQ(0, std::memcmp(per_call.data<float>(), once.data<float>(), per_call.numel() * sizeof(float)))
              << name << ": " << c.m << " x " << c.n << " x " << c.k << (a_bf16 ? ", A bfloat16" : "");
        }
      }
    }
  }
  if (!any) GTEST_SKIP() << "no kernel level of this CPU reads a packed B (no AMX-BF16 or AVX512-BF16)";
}

// C written in bfloat16 (GemmBf16Args::c_bf16) on every level and avx512
// path, B as it lies or packed once: within the float32 bound of
// GemmBf16MatchesTheReference plus the rounding of C to bfloat16 (2^-8 of
// |C|), its padding columns untouched. A in bfloat16 with k a multiple of
// 32 and an even row stride is read where it lies (a_in_place), its last
// rows past a whole block copied: 70, 96 and 130 rows leave such a block
// on the AMX and AVX512-BF16 paths. Then each case again with GELU and
// SiLU applied before the rounding (has_act), against the reference's C
// through the same activation. Rounding C by truncation in the vector
// epilogue (bf16_of) failed every case on the AMX, AVX512-BF16 and packed-B
// paths (when the AMX path still rounded its whole rows with it too); the
// AMX path's whole rows without their bias failed 1 x 37 x 64
// (B packed) and 96 x 80 x 64; rows of A read in place with the packed
// rows' stride failed the 64- and 96-deep cases here and in
// GemmBf16MatchesTheReference; the activation (has_act) left out of the AMX
// plain rows failed the GELU cases of 96 x 80 x 64 and 64 x 520 x 512, and
// left out of their staged rows (other activations) the SiLU ones.
TEST(Kernels, GemmBf16WritesBfloat16C) {
  omp_set_num_threads(2);
  Rng rng(13);
  const std::vector<Bf16Path> paths = bf16_paths();
  for (const Bf16Case& c : {Bf16Case{1, 37, 64, 0, 1, 0, true}, Bf16Case{3, 5, 7, 2, 0.5f, 0.75f, true},
                            Bf16Case{70, 64, 96, 0, 1, 1, false}, Bf16Case{96, 80, 64, 2, 1, 0, true},
                            Bf16Case{130, 70, 300, 1, -2, 0.5f, true}, Bf16Case{64, 520, 512, 0, 1, 0, true},
                            Bf16Case{4, 6, 0, 0, 1, 0.5f, true}}) {
    const int64_t ldb = c.k, ldc = c.n + c.pad;
    const Bf16Operands ops(c, ldb, rng);
    // C0 holds bfloat16 values, so that beta reads the same C in both formats.
    Tensor bias = Tensor::randn({c.n}, rng), c0 = Tensor::randn({c.m, ldc}, rng).to(DType::BF16);
    const Tensor c0_f32 = c0.to(DType::F32);
    GemmBf16Args g = ops.args(c, ldc, bias);
    Tensor ref_c = c0_f32.clone();
    g.c = ref_c.data<float>();
    ref::gemm_bf16(g);
    g.c = nullptr;
    const GemmArgs f = ops.float32(g);    // the same product in float32, for the bound
    const auto into = [&](Tensor& out) {  // g with its C a fresh copy of c0, in bfloat16
      out = c0.clone();
      GemmBf16Args h = g;
      h.c_bf16 = out.data<uint16_t>();
      return h;
    };
    for (const auto& [name, gemm_bf16] : paths) {
      Tensor out;
      gemm_bf16(into(out));
      EXPECT_TRUE(testing::gemm_close(f, c0_f32, out.to(DType::F32), ref_c, 1.0 / 256))
          << name << " " << c.m << "x" << c.n << "x" << c.k;
    }
    for (const Kernels* level : levels()) {  // B packed once
      const int64_t words = level->gemm_bf16_packed_b_words(c.n, c.k);
      if (words == 0) continue;
      std::vector<uint32_t> packed((size_t)words);
      level->gemm_bf16_pack_b(g, packed.data());
      Tensor out;
      GemmBf16Args h = into(out);
      h.b = nullptr, h.b_packed = packed.data();
      level->gemm_bf16(h);
      EXPECT_TRUE(testing::gemm_close(f, c0_f32, out.to(DType::F32), ref_c, 1.0 / 256))
          << level->name << " B packed, " << c.m << "x" << c.n << "x" << c.k;
    }
    Tensor out;  // the reference's own bfloat16 C
    ref::gemm_bf16(into(out));
    EXPECT_TRUE(testing::gemm_close(f, c0_f32, out.to(DType::F32), ref_c, 1.0 / 256))
        << "reference " << c.m << "x" << c.n << "x" << c.k;
    // With an activation before the rounding (has_act): GELU (the AMX plain
    // rows apply it in registers) and SiLU (through unary_forward), against
    // the reference's C through the same activation.
    for (UnaryOp act : {UnaryOp::Gelu, UnaryOp::Silu}) {
      Tensor want = ref_c.clone();
      ref::unary_forward(act, want.data<float>(), want.data<float>(), want.numel());
      float flag = 0;
      GemmArgs fa = f;  // gemm_close's bound through an activation (only act_out's presence is read)
      fa.act_out = &flag;
      for (const auto& [name, gemm_bf16] : paths) {
        Tensor out;
        GemmBf16Args h = into(out);
        h.has_act = true, h.act = act;
        gemm_bf16(h);
        const Tensor c0_act = c0_f32;
        EXPECT_TRUE(testing::gemm_close(fa, c0_act, out.to(DType::F32), want, 1.0 / 256))
            << name << " " << c.m << "x" << c.n << "x" << c.k << (act == UnaryOp::Gelu ? " GELU" : " SiLU");
      }
    }
  }
}

TEST(Kernels, GemmBf16SaysHowItRuns) {
  EXPECT_STREQ(ref::table().gemm_bf16_path(), "reference (float64 sums)");
  EXPECT_STREQ(cpu::kernels(CpuIsa::Generic).gemm_bf16_path(), "the float32 GEMM on widened inputs");
  const char* tiles =
      "register tiles widening B for 1 to 64 rows in inference, the float32 GEMM on widened inputs above";
  if (isa_supported(CpuIsa::Avx2)) {
    EXPECT_STREQ(cpu::kernels(CpuIsa::Avx2).gemm_bf16_path(), tiles);
  }
  if (isa_supported(CpuIsa::Avx512)) {
    const std::string path = cpu::kernels(CpuIsa::Avx512).gemm_bf16_path();
    EXPECT_EQ(path, cpu::avx512::amx_bf16_usable()      ? "AMX-BF16 tiles (AVX512-BF16 for up to 4 rows)"
                    : cpu::avx512::avx512_bf16_usable() ? "AVX512-BF16"
                                                        : tiles);
  }
}

// On a level without AVX512-BF16, a bfloat16 weight in inference meets
// gemm's register tiles, widened as they load it: each output must be the
// very bits of the float32 tiles over the widened copy, and a row's the
// same alone as among 7 or 64 (a stream's output whatever is decoded beside
// it; expect_float32_tiles_bits). Widening with a shift of 15 instead of 16
// on avx2 failed it, and GemmBf16MatchesTheReference.
TEST(Kernels, Bf16WeightTilesGiveTheFloat32TilesBits) {
  omp_set_num_threads(2);
  Rng rng(31);
  const int64_t n = 39, k = 100;
  const Bf16Operands ops(Bf16Case{64, n, k, 0, 1, 0, true}, k, rng);
  Tensor bias = Tensor::randn({n}, rng);
  int levels_run = 0;
  for (const Kernels* level : levels()) {
    if (std::string(level->gemm_bf16_path()).rfind("register tiles", 0) != 0) continue;
    ++levels_run;
    expect_float32_tiles_bits(*level, ops.a32, ops.b32, bias, [&](int64_t m, int64_t i, float* c) {
      GemmBf16Args g;
      g.m = m, g.n = n, g.k = k, g.a = ops.a.data() + i * k, g.lda = k, g.b = ops.b.data(), g.ldb = k;
      g.c = c, g.ldc = n, g.bias = bias.data<float>(), g.inference = true;
      level->gemm_bf16(g);
    });
  }
  if (levels_run == 0) GTEST_SKIP() << "every level this CPU runs has AVX512-BF16, or no tiles";
}

// The int8-weight GEMM on every level and every path of the avx512 one,
// against its float64 twin, on the shapes of the bf16 test: ragged k (a last
// block shorter than 32, a last 64-byte chunk with one block), strided rows,
// alpha, beta, bias, k = 0, a row of A with an all-zero block (scale 0), and
// up to 4 rows (the integer paths) and more (AMX or VNNI tiles, or dequantized). All
// sides multiply the same quantized values, so the bound is float32's:
// gamma_(k+4) of the sum of |terms| (the "+4" for rounding the two scales'
// product, or both dequantized operands, and the product), plus one unit of
// the result. Skipping the last 64-value chunk of the VNNI path failed the
// first case with k > 64 (2 x 17 x 65) by 0.51 against a bound of 2.4e-4;
// skipping the last group of 4 k in each block of the VNNI tiles failed
// 17 x 33 x 100 by 31.9 against 4.5e-4. AMX-INT8: leaving out the last
// block's scaling, or loading rows 0-15 of a block into both A tiles,
// failed 67 x 45 x 130; quantizing A rounding toward zero (the vector
// quantizer) failed 3 x 5 x 7; the gathered panels' compensation left at
// the plain sum (not times -128) failed 17 x 33 x 100.
TEST(Kernels, GemmInt8MatchesTheReference) {
  omp_set_num_threads(2);
  Rng rng(8);
  using Path = std::pair<std::string, void (*)(const GemmInt8Args&)>;
  std::vector<Path> paths;
  for (const Kernels* k : levels()) paths.push_back({k->name, k->gemm_int8});
  if (isa_supported(CpuIsa::Avx512)) {
    if (cpu::avx512::amx_int8_usable()) paths.push_back({"avx512 AMX-INT8", &cpu::avx512::gemm_int8_amx});
    if (cpu::avx512::avx512_vnni_usable()) paths.push_back({"avx512 VNNI", &cpu::avx512::gemm_int8_vnni});
    paths.push_back({"avx512 dequantized", &cpu::avx512::gemm_int8_dequantized});
    paths.push_back({"avx512 pair sums", &cpu::avx512::gemm_int8_pairs});
  }
  struct Case {
    int64_t m, n, k, pad;
    float alpha, beta;
    bool bias;
  };
  for (const Case& c :
       {Case{1, 1, 1, 0, 1, 0, false}, Case{3, 5, 7, 2, 0.5f, 0.75f, true}, Case{4, 33, 31, 0, 1, 0, true},
        Case{2, 17, 65, 3, 1, 1, false}, Case{1, 45, 130, 1, -2, 0, true}, Case{4, 300, 1000, 3, 1, 0.5f, true},
        Case{1, 700, 96, 0, 1, 0, true}, Case{2, 40, 64, 0, 1, 0, false}, Case{17, 33, 100, 2, 1, 0, true},
        Case{67, 45, 130, 1, 1, 0.5f, true},
        // more than 4 rows: every remainder of the VNNI tiles' 4 rows, several panels of 32
        Case{130, 70, 300, 0, 1, 0.5f, true}, Case{9, 100, 64, 1, -1, 0, false}, Case{7, 64, 33, 0, 1, 0, true},
        Case{4, 6, 0, 0, 1, 0.5f, true},
        // AMX: a last block of 32 rows with 13 (a partial first tile) and with 18
        // (a partial second one); 22 panels of a long k, two groups per thread; its fewest rows
        Case{45, 40, 96, 1, 1, 0.5f, true}, Case{50, 33, 64, 0, 2, 0, false}, Case{40, 700, 1000, 0, 1, 0, true},
        Case{24, 64, 64, 0, 1, 0, true}}) {
    const int64_t kb = (c.k + 31) / 32, lda = c.k + c.pad, ldb = c.k + 2 * c.pad, lds = kb + c.pad,
                  ldc = c.n + c.pad;
    Tensor a = Tensor::randn({c.m, lda}, rng), w = Tensor::randn({c.n, ldb}, rng);
    if (c.m > 1 && c.k > 32) std::fill_n(a.data<float>() + lda, 32, 0.0f);  // row 1, block 0: all zeros
    if (c.m > 2 && c.k > 32) std::fill_n(a.data<float>() + 2 * lda, 32, 1e-38f);  // row 2, block 0: below normal
    std::vector<int8_t> q(c.n * ldb, 0);
    std::vector<float> scales(c.n * lds, 0.0f);
    for (int64_t j = 0; j < c.n; ++j)
      for (int64_t b = 0; b < kb; ++b) {
        const int64_t p0 = b * 32, len = std::min<int64_t>(32, c.k - p0);
        const float* x = w.data<float>() + j * ldb + p0;
        scales[j * lds + b] = int8_block_scale(x, len);
        int8_quantize(x, len, scales[j * lds + b], q.data() + j * ldb + p0);
      }
    Tensor bias = Tensor::randn({c.n}, rng), c0 = Tensor::randn({c.m, ldc}, rng);
    GemmInt8Args g;
    g.m = c.m, g.n = c.n, g.k = c.k, g.alpha = c.alpha, g.beta = c.beta;
    g.a = a.data<float>(), g.lda = lda, g.b = q.data(), g.ldb = ldb, g.scales = scales.data(), g.ld_scale = lds;
    g.ldc = ldc, g.bias = c.bias ? bias.data<float>() : nullptr;
    Tensor ref_c = c0.clone();
    g.c = ref_c.data<float>();
    ref::gemm_int8(g);
    // The sum of |terms|: the reference on |A| and |W| (quantizing rounds
    // symmetrically, so |A| quantizes to the magnitudes of A's values).
    Tensor abs_a = a.clone(), magnitude = Tensor::zeros({c.m, ldc});
    for (int64_t i = 0; i < abs_a.numel(); ++i) abs_a.data<float>()[i] = std::fabs(abs_a.data<float>()[i]);
    std::vector<int8_t> abs_q(q.size());
    for (size_t i = 0; i < q.size(); ++i) abs_q[i] = (int8_t)std::abs(q[i]);
    GemmInt8Args ga = g;
    ga.a = abs_a.data<float>(), ga.b = abs_q.data(), ga.alpha = 1, ga.beta = 0, ga.bias = nullptr;
    ga.c = magnitude.data<float>();
    ref::gemm_int8(ga);
    const double gamma = (c.k + 4) * testing::kFloat32Unit;
    for (const auto& [name, gemm_int8] : paths) {
      Tensor out = c0.clone();
      g.c = out.data<float>();
      gemm_int8(g);
      for (int64_t i = 0; i < c.m; ++i)
        for (int64_t j = 0; j < ldc; ++j) {
          const int64_t at = i * ldc + j;
          const float got = out.data<float>()[at], want = ref_c.data<float>()[at], before = c0.data<float>()[at];
          if (j >= c.n) {
            ASSERT_EQ(got, before) << name << ": padding [" << i << "," << j << "] changed";
            continue;
          }
          const double rest = std::fabs(want) + std::fabs(c.beta * before) + (c.bias ? std::fabs(bias.data<float>()[j]) : 0);
          const double bound =
              gamma * std::fabs(c.alpha) * magnitude.data<float>()[at] + 2 * testing::kFloat32Unit * rest;
          ASSERT_LE(std::fabs((double)got - want), bound)
              << name << " " << c.m << "x" << c.n << "x" << c.k << " element [" << i << "," << j << "]: " << got
              << " vs " << want;
        }
    }
  }
}

TEST(Kernels, Int8QuantizationRoundsToTheNearestStepOfItsBlock) {
  const float x[6] = {2.5f, 3.5f, -2.5f, 0.49f, -127.0f, 100.7f};  // max |x| 127: steps of exactly 1
  EXPECT_EQ(int8_block_scale(x, 6), 1.0f);
  int8_t q[32];
  int8_quantize(x, 6, 1.0f, q);
  EXPECT_EQ(std::vector<int>(q, q + 6), (std::vector<int>{2, 4, -2, 0, -127, 101}));  // ties to even
  Rng rng(3);
  std::vector<float> y(32);
  for (float& v : y) v = rng.next_normal();
  const float d = int8_block_scale(y.data(), 32);
  int8_quantize(y.data(), 32, d, q);
  for (int i = 0; i < 32; ++i) EXPECT_LE(std::fabs(q[i] * d - y[i]), d / 2 * (1 + 1e-5)) << i;
  const float zeros[3] = {0, 0, 0};
  EXPECT_EQ(int8_block_scale(zeros, 3), 0.0f);
  int8_quantize(zeros, 3, 0.0f, q);
  EXPECT_EQ(std::vector<int>(q, q + 3), (std::vector<int>{0, 0, 0}));
  // A block whose largest value is under about 1e-37 has a scale below the
  // smallest normal float, whose reciprocal overflows: its values are 0; so is a NaN.
  const float tiny[3] = {1e-38f, 0.0f, -2e-38f}, with_nan[3] = {1.0f, NAN, -1.0f};
  int8_quantize(tiny, 3, int8_block_scale(tiny, 3), q);
  EXPECT_EQ(std::vector<int>(q, q + 3), (std::vector<int>{0, 0, 0}));
  int8_quantize(with_nan, 3, int8_block_scale(with_nan, 3), q);
  EXPECT_EQ(std::vector<int>(q, q + 3), (std::vector<int>{127, 0, -127}));
}

TEST(Kernels, GemmInt8SaysHowItRuns) {
  EXPECT_STREQ(ref::table().gemm_int8_path(), "reference (float64 sums)");
  EXPECT_STREQ(cpu::kernels(CpuIsa::Generic).gemm_int8_path(),
               "int32 loops for up to 4 rows, the float32 GEMM on dequantized weights above");
  const char* pairs = "AVX2 pair sums (VPMADDUBSW) for up to 64 rows, the float32 GEMM on dequantized weights above";
  if (isa_supported(CpuIsa::Avx2)) EXPECT_STREQ(cpu::kernels(CpuIsa::Avx2).gemm_int8_path(), pairs);
  if (isa_supported(CpuIsa::Avx512)) {
    EXPECT_STREQ(cpu::kernels(CpuIsa::Avx512).gemm_int8_path(),
                 cpu::avx512::amx_int8_usable() ? "AMX-INT8 tiles from 24 rows (AVX512-VNNI below)"
                 : cpu::avx512::avx512_vnni_usable()
                     ? "AVX512-VNNI (rows streamed up to 4, register-blocked tiles above)"
                     : pairs);
  }
}

// The pair sums (AVX2 without VNNI): a row of A alone gets the bits it got
// beside up to 63 others, so a stream's tokens do not depend on the streams
// beside it (k 100: a last block of 4 values; n 39: 9 groups of four rows of
// W and 3 left over). And the largest pair VPMADDUBSW can meet, 127 x 127
// twice, does not saturate its int16 sum: A all -1 and W all 1 quantize to
// -127 and 127 everywhere, and every output is -k.
TEST(Kernels, Int8PairSumsGiveARowItsOwnBits) {
  omp_set_num_threads(2);
  using Path = std::pair<std::string, void (*)(const GemmInt8Args&)>;
  std::vector<Path> paths;
  if (isa_supported(CpuIsa::Avx2)) paths.push_back({"avx2", cpu::kernels(CpuIsa::Avx2).gemm_int8});
  if (isa_supported(CpuIsa::Avx512)) paths.push_back({"avx512 pair sums", &cpu::avx512::gemm_int8_pairs});
  if (paths.empty()) GTEST_SKIP() << "no AVX2 on this CPU";
  Rng rng(41);
  const int64_t n = 39, k = 100, kb = 4, m_max = 64;
  Tensor a = Tensor::randn({m_max, k}, rng), w = Tensor::randn({n, k}, rng), bias = Tensor::randn({n}, rng);
  std::vector<int8_t> q(n * k);
  std::vector<float> scales(n * kb);
  auto quantize_w = [&] {
    for (int64_t j = 0; j < n; ++j)
      for (int64_t b = 0; b < kb; ++b) {
        const int64_t p0 = b * 32, len = std::min<int64_t>(32, k - p0);
        scales[j * kb + b] = int8_block_scale(w.data<float>() + j * k + p0, len);
        int8_quantize(w.data<float>() + j * k + p0, len, scales[j * kb + b], q.data() + j * k + p0);
      }
  };
  quantize_w();
  GemmInt8Args g;
  g.n = n, g.k = k, g.b = q.data(), g.ldb = k, g.scales = scales.data(), g.ld_scale = kb;
  g.ldc = n, g.bias = bias.data<float>();
  for (const auto& [name, gemm_int8] : paths)
    for (int64_t m : {1, 7, 64}) {
      Tensor c = Tensor::zeros({m, n});
      g.m = m, g.a = a.data<float>(), g.lda = k, g.c = c.data<float>();
      gemm_int8(g);
      for (int64_t i = 0; i < m; i += 3) {
        Tensor alone = Tensor::zeros({1, n});
        GemmInt8Args h = g;
        h.m = 1, h.a = a.data<float>() + i * k, h.c = alone.data<float>();
        gemm_int8(h);
        EXPECT_EQ(0, std::memcmp(alone.data<float>(), c.data<float>() + i * n, sizeof(float) * n))
            << name << " row " << i << " of " << m;
      }
    }
  std::fill_n(a.data<float>(), a.numel(), -1.0f);
  std::fill_n(w.data<float>(), w.numel(), 1.0f);
  quantize_w();
  ASSERT_EQ(q[0], 127);
  for (const auto& [name, gemm_int8] : paths) {
    Tensor c = Tensor::zeros({m_max, n});
    g.m = m_max, g.a = a.data<float>(), g.c = c.data<float>(), g.bias = nullptr;
    gemm_int8(g);
    for (int64_t i = 0; i < c.numel(); ++i) ASSERT_NEAR(c.data<float>()[i], -(float)k, 1e-4 * k) << name << " " << i;
  }
}

// AdamW and SGD steps and the clipping sums over tensors of several sizes
// (the large ones split between threads, the small ones not).
TEST(Kernels, OptimizerStepsMatchTheReference) {
  omp_set_num_threads(2);
  Rng rng(5);
  const std::vector<int64_t> sizes = {3, 1000, 150000, 17};
  for (const Kernels* k : levels()) {
    std::vector<Tensor> p, g, m, v;
    for (int64_t n : sizes) {
      p.push_back(Tensor::randn({n}, rng)), g.push_back(Tensor::randn({n}, rng));
      m.push_back(Tensor::randn({n}, rng, 0.1f)), v.push_back(scale(Tensor::randn({n}, rng), 0.0f));
    }
    auto spans_of = [&](std::vector<Tensor>& pp, std::vector<Tensor>& mm, std::vector<Tensor>& vv) {
      std::vector<ParamSpan> s;
      for (size_t i = 0; i < sizes.size(); ++i)
        s.push_back({pp[i].data<float>(), g[i].data<float>(), mm[i].data<float>(), vv[i].data<float>(), sizes[i]});
      return s;
    };
    auto copies = [](const std::vector<Tensor>& t) {
      std::vector<Tensor> c;
      for (const Tensor& x : t) c.push_back(x.clone());
      return c;
    };
    std::vector<Tensor> pf = copies(p), mf = copies(m), vf = copies(v), pr = copies(p), mr = copies(m), vr = copies(v);
    const AdamWStep a{.beta1 = 0.9f, .beta2 = 0.99f, .eps = 1e-8f, .step_size = 0.01f, .bc2_sqrt = 0.3f, .decay = 0.999f};
    k->adamw_step(a, spans_of(pf, mf, vf));
    ref::adamw_step(a, spans_of(pr, mr, vr));
    for (size_t i = 0; i < sizes.size(); ++i) {
      EXPECT_TRUE(all_close(pf[i], pr[i], 1e-6f, 1e-6f)) << k->name << " adamw p " << i;
      EXPECT_TRUE(all_close(vf[i], vr[i], 1e-6f, 1e-6f)) << k->name << " adamw v " << i;
    }
    const SgdStep s{.lr = 0.1f, .momentum = 0.9f, .weight_decay = 0.01f};
    k->sgd_step(s, spans_of(pf, mf, vf));
    ref::sgd_step(s, spans_of(pr, mr, vr));
    for (size_t i = 0; i < sizes.size(); ++i) EXPECT_TRUE(all_close(pf[i], pr[i], 1e-6f, 1e-6f)) << k->name << " sgd";
    std::vector<FloatSpan> fs;
    for (size_t i = 0; i < sizes.size(); ++i) fs.push_back({g[i].data<float>(), sizes[i]});
    const double fast = k->sum_of_squares(fs), reference = ref::sum_of_squares(fs);
    EXPECT_NEAR(fast, reference, 1e-9 * reference) << k->name;
    EXPECT_NEAR(reference, 151020.0, 3 * std::sqrt(2.0 * 151020));  // a sum of squares of N(0,1) draws
    std::vector<Tensor> gf = copies(g);
    std::vector<FloatSpan> ff;
    for (size_t i = 0; i < sizes.size(); ++i) ff.push_back({gf[i].data<float>(), sizes[i]});
    k->scale_spans(ff, 0.5f);
    for (size_t i = 0; i < sizes.size(); ++i)
      EXPECT_TRUE(all_close(gf[i], scale(g[i], 0.5f), 0, 0)) << k->name << " scale";
  }
}

// The flash pair against its naive twin: padding (a batch with no keys),
// causal with more queries than keys, grouped queries, a packed layout, one
// query row (decoding: plain loops instead of GEMMs; lengths across key
// tiles), and batches in buffers of their own (FlashShape::k_batches, as the
// KV caches of decoding streams; forward only), and a short sequence whose
// head size (24) is not a multiple of 16 (the avx512 level's small products
// in registers transpose K 16 x 16 at a time, the last block part full), and
// long ones whose products take the panels with packed operands.
// Dropping the accumulation of the one-row p V loop, or the last key of a
// one-row group of 16, or reading k_batches as one buffer, fails; so does leaving K untransposed in the small products,
// or cutting a causal query tile's products short of its packed key tile.
TEST(Kernels, FlashAttentionMatchesTheReference) {
  omp_set_num_threads(2);
  struct Case {
    int64_t batch, heads, kv_heads, t, s, dh;
    bool causal, packed;
    std::vector<int64_t> lengths;
    bool separate = false;
  };
  const std::vector<Case> cases = {
      {3, 4, 2, 40, 150, 32, false, false, {150, 7, 0}},
      {1, 2, 1, 200, 50, 16, true, false, {}},
      {2, 4, 2, 70, 70, 16, true, true, {70, 33}},
      {3, 4, 2, 1, 150, 32, false, false, {150, 64, 1}},
      {3, 4, 2, 1, 150, 32, false, false, {150, 65, 0}, true},
      // One query row on the avx512 level: keys 16 at a time with their dots
      // summed across lanes together (Dh a multiple of 16 up to 128: 45 and
      // 17 keys, a part-full last group), o in registers 64 floats at a time
      // (Dh 128: two rounds; 80: a part-full round; 24: the plain dot, and
      // masked lanes of o).
      {2, 2, 2, 1, 45, 64, false, false, {45, 17}},
      {1, 3, 3, 1, 33, 128, false, false, {}},
      {1, 2, 2, 1, 20, 80, false, false, {}},
      {1, 2, 1, 1, 40, 24, false, false, {}},
      {2, 2, 2, 20, 37, 24, false, false, {}},
      // A ViT's 17 tokens: tiles of 9 + 8 rows, the 17th key's column of K^T
      // and V^T copied alone.
      {4, 2, 2, 17, 17, 32, false, false, {}},
      // Short sequences on the avx512 level (at most 16 queries and keys:
      // short_head): a ViT's 16 tokens; causal rows that see more keys than
      // there are queries, grouped queries, a part-full vector of dims and a
      // batch that sees nothing; the packed layout with 64 dims.
      {4, 2, 2, 16, 16, 32, false, false, {}},
      {3, 4, 2, 5, 9, 24, true, false, {9, 3, 0}},
      {2, 2, 1, 12, 12, 64, true, true, {}},
      // Head size 64 and full tiles: the float32 products on gemm's panels
      // with K, V, Q and dO packed once (on_panels), causal query tiles that
      // see part of a packed key tile, a last key tile of 4 keys, a batch
      // whose padding ends a tile 3 keys in, grouped queries; and the packed
      // layout.
      {2, 4, 2, 150, 260, 64, true, false, {260, 131}},
      {1, 2, 2, 200, 200, 64, false, true, {}},
  };
  for (const Kernels* k : levels()) {
    for (const Case& c : cases) {
      Rng rng(31);
      FlashShape f{c.batch, c.heads, c.kv_heads, c.t, c.s, c.dh, c.dh};
      f.scale = 1.0f / std::sqrt((float)c.dh), f.causal = c.causal;
      f.key_lengths = c.lengths.empty() ? nullptr : c.lengths.data();
      const int64_t width = (c.heads + 2 * c.kv_heads) * c.dh;
      const int64_t q_n = c.packed ? c.batch * c.t * width : c.batch * c.heads * c.t * c.dh;
      const int64_t kv_n = c.packed ? 0 : c.batch * c.kv_heads * c.s * c.dh;
      const int64_t k_at = c.packed ? c.heads * c.dh : q_n, v_at = c.packed ? (c.heads + c.kv_heads) * c.dh : q_n + kv_n;
      if (c.packed) {
        f.q = {c.t * width, c.dh, width};
        f.k = f.q, f.v = f.q;
        f.o = {c.t * c.heads * c.dh, c.dh, c.heads * c.dh};
      }
      const int64_t total = q_n + 2 * kv_n, out_n = c.batch * c.heads * c.t * c.dh, lse_n = c.batch * c.heads * c.t;
      Tensor in = Tensor::randn({total}, rng), dout = Tensor::randn({out_n}, rng);
      const float* p = in.data<float>();
      Tensor out_f = Tensor::empty({out_n}), out_r = Tensor::empty({out_n});
      Tensor lse_f = Tensor::empty({lse_n}), lse_r = Tensor::empty({lse_n});
      // Separate: batch b's keys and values are the last batch's, and so on
      // backwards (each batch its own pointer; no batch stride reaches them).
      std::vector<const float*> k_batches, v_batches;
      for (int64_t b = 0; c.separate && b < c.batch; ++b) {
        const int64_t from = (c.batch - 1 - b) * c.kv_heads * c.s * c.dh;
        k_batches.push_back(p + k_at + from), v_batches.push_back(p + v_at + from);
      }
      if (c.separate) f.k_batches = k_batches.data(), f.v_batches = v_batches.data();
      k->flash_attention_forward(f, p, c.separate ? nullptr : p + k_at, c.separate ? nullptr : p + v_at,
                                 out_f.data<float>(), lse_f.data<float>());
      ref::flash_attention_forward(f, p, c.separate ? nullptr : p + k_at, c.separate ? nullptr : p + v_at,
                                   out_r.data<float>(), lse_r.data<float>());
      const std::string what = std::string(k->name) + " t " + std::to_string(c.t) + (c.packed ? " packed" : "") +
                               (c.separate ? " separate" : "");
      EXPECT_TRUE(all_close(out_f, out_r, 1e-5f, 1e-4f)) << what;
      Tensor out_alone = Tensor::empty({out_n});  // without lse (inference): the same output
      k->flash_attention_forward(f, p, c.separate ? nullptr : p + k_at, c.separate ? nullptr : p + v_at,
                                 out_alone.data<float>(), nullptr);
      EXPECT_TRUE(all_close(out_alone, out_f, 0, 0)) << what << " without lse";
      const std::vector<float> lf = lse_f.to_vector(), lr = lse_r.to_vector();
      for (int64_t i = 0; i < lse_n; ++i) {
        if (std::isinf(lr[i])) {
          EXPECT_EQ(lf[i], lr[i]) << what << " row " << i;  // -inf: the row sees no key
        } else {
          EXPECT_NEAR(lf[i], lr[i], 1e-4f * (1 + std::fabs(lr[i]))) << what << " row " << i;
        }
      }
      const bool last_batch_sees_nothing = !c.lengths.empty() && c.lengths.back() == 0;
      EXPECT_EQ(std::isinf(lr.back()), last_batch_sees_nothing) << what;
      if (c.separate) {  // the twin read the batches in their own buffers, as the same batches contiguous would
        FlashShape whole = f;
        whole.k_batches = whole.v_batches = nullptr;
        std::vector<float> reversed((size_t)(2 * kv_n));
        const int64_t per = c.kv_heads * c.s * c.dh;
        for (int64_t b = 0; b < c.batch; ++b)
          for (int64_t part = 0; part < 2; ++part)
            std::copy_n(p + (part ? v_at : k_at) + (c.batch - 1 - b) * per, per,
                        reversed.data() + part * kv_n + b * per);
        Tensor out_w = Tensor::empty({out_n}), lse_w = Tensor::empty({lse_n});
        ref::flash_attention_forward(whole, p, reversed.data(), reversed.data() + kv_n, out_w.data<float>(),
                                     lse_w.data<float>());
        EXPECT_TRUE(all_close(out_r, out_w, 0, 0)) << what;
        continue;  // forward only
      }
      // The fast backward starts on NaN and the reference on zeros: every element
      // of dq, dk and dv must be written (keys hidden by padding, a batch that
      // sees nothing, causal rows, the packed layout's interleaved heads).
      Tensor d_f = Tensor::full({total}, NAN), d_r = Tensor::zeros({total});
      float* df = d_f.data<float>();
      float* dr = d_r.data<float>();
      k->flash_attention_backward(f, p, p + k_at, p + v_at, out_r.data<float>(), dout.data<float>(),
                                  lse_r.data<float>(), df, df + k_at, df + v_at);
      ref::flash_attention_backward(f, p, p + k_at, p + v_at, out_r.data<float>(), dout.data<float>(),
                                    lse_r.data<float>(), dr, dr + k_at, dr + v_at);
      EXPECT_TRUE(all_close(d_f, d_r, 1e-4f, 1e-3f)) << what;
    }
  }
}

// A short sequence (2 to 16 queries, at most 16 keys, heads of at most 64
// dims) takes a path of its own on the avx512 level (short_head in
// src/kernels/cpu/flash_attention.cpp), which promises the tile path's bits.
// A sequence of 20 queries takes the tile path; where its first rows see
// the same keys as the short sequence's rows (key lengths of at most the
// short one's keys; causal with the same S - T), those rows are the short
// sequence's attention, so each of their outputs and lse must be the same
// float. (Summing a row's p in another order than lane_sums16's fails this.)
TEST(Kernels, ShortSequenceAttentionHasTheTilePathsBits) {
  if (!isa_supported(CpuIsa::Avx512)) GTEST_SKIP() << "no avx512 level on this CPU: the short path does not run";
  omp_set_num_threads(2);
  struct Case {
    int64_t heads, kv_heads, dh, dv;
    bool causal;
    int64_t t, s, s_tiles;  // the short sequence's queries and keys; the 20-query one's keys
    std::vector<int64_t> lengths;
  };
  const std::vector<Case> cases = {
      {2, 2, 32, 32, true, 16, 16, 20, {16, 11, 3}},  // a ViT's 16 tokens, causal
      {4, 2, 24, 24, false, 16, 16, 20, {16, 9, 0}},  // grouped heads, a part-full vector, a batch seeing nothing
      {2, 1, 64, 64, true, 16, 16, 20, {16, 16, 16}},
      {3, 3, 16, 48, false, 5, 16, 20, {16, 1, 7}},  // lanes past the rows, dv != dh
      {2, 2, 32, 16, true, 16, 5, 9, {5, 5, 2}},     // causal rows that see no key
  };
  const int64_t B = 3, T = 20;
  const Kernels& k = cpu::kernels(CpuIsa::Avx512);
  for (const Case& c : cases) {
    Rng rng(5);
    const int64_t q_n = B * c.heads * T * c.dh, k_n = B * c.kv_heads * T * c.dh, v_n = B * c.kv_heads * T * c.dv;
    const Tensor in = Tensor::randn({q_n + k_n + v_n}, rng);
    const float* q = in.data<float>();
    // Both sequences read and write [B, heads, 20, d]; the short one its first rows of each head.
    const auto attend = [&](int64_t t, int64_t s, Tensor& out, Tensor& lse) {
      FlashShape f{B, c.heads, c.kv_heads, t, s, c.dh, c.dv};
      f.scale = 1.0f / std::sqrt((float)c.dh), f.causal = c.causal, f.key_lengths = c.lengths.data();
      f.q = {c.heads * T * c.dh, T * c.dh, c.dh};
      f.k = {c.kv_heads * T * c.dh, T * c.dh, c.dh};
      f.v = {c.kv_heads * T * c.dv, T * c.dv, c.dv};
      f.o = {c.heads * T * c.dv, T * c.dv, c.dv};
      out = Tensor::zeros({B * c.heads * T * c.dv}), lse = Tensor::zeros({B * c.heads * t});
      k.flash_attention_forward(f, q, q + q_n, q + q_n + k_n, out.data<float>(), lse.data<float>());
    };
    Tensor out_short, lse_short, out_tiles, lse_tiles;
    attend(c.t, c.s, out_short, lse_short);
    attend(T, c.s_tiles, out_tiles, lse_tiles);
    const float* os = out_short.data<float>();
    const float* ot = out_tiles.data<float>();
    const float* ls = lse_short.data<float>();
    const float* lt = lse_tiles.data<float>();
    int64_t differ = 0, unseen = 0;
    for (int64_t bh = 0; bh < B * c.heads; ++bh)
      for (int64_t i = 0; i < c.t; ++i) {
        differ += ls[bh * c.t + i] != lt[bh * T + i];
        unseen += std::isinf(ls[bh * c.t + i]);
        for (int64_t d = 0; d < c.dv; ++d) differ += os[(bh * T + i) * c.dv + d] != ot[(bh * T + i) * c.dv + d];
      }
    const std::string what = "heads " + std::to_string(c.heads) + "/" + std::to_string(c.kv_heads) + " dh " +
                             std::to_string(c.dh) + " t " + std::to_string(c.t) + " s " + std::to_string(c.s);
    EXPECT_EQ(differ, 0) << what;
    EXPECT_LT(unseen, B * c.heads * c.t) << what;  // some rows see keys: not only zeros and -inf on both sides
  }
}

}  // namespace
}  // namespace qkv

namespace qkv {
namespace {

double bf16_round(float x) { return bf16_to_float(float_to_bf16(x)); }

// The flash pair with bfloat16 products (FlashShape::bf16) against its twin,
// which rounds the same factors. They differ by where p is rounded (the fast
// forward rounds exp(s - m) before dividing by the row's sum; the backward's
// p and ds are float32 values against the twin's float64 ones, and may round
// to the other neighbour). bfloat16 keeps 8 significant bits, so a rounding
// moves a value by at most 2^-8 of itself, and a product term of one side by
// 2^-7 against the other's. So each element's bound is 2^-7 (plus float32
// summation, plus the scores'
// float32 error carried into p) times the sum of its terms' magnitudes,
// computed here in float64 from the rounded factors, plus, for dq and dk, the
// float32 error of dp - D (which can cancel) times |k| or |q|. Dropping a key
// tile, a rescale or a term of ds moves an element by a whole term, far past
// 2^-7 of the sum (checked by hand on the fast kernel).
TEST(Kernels, FlashAttentionInBfloat16MatchesItsTwinWithinTheRoundingBound) {
  omp_set_num_threads(2);
  struct Case {
    int64_t batch, heads, kv_heads, t, s, dh;
    bool causal;
    std::vector<int64_t> lengths;
  };
  const std::vector<Case> cases = {
      {2, 4, 2, 40, 150, 32, false, {150, 7}},
      {1, 2, 1, 200, 50, 16, true, {}},
      {1, 2, 2, 130, 130, 64, true, {}},
      // From 128 queries and keys the avx512 level packs (and, with AVX512-BF16,
      // runs softmax_row_into_packed): keys cut by padding mid-chunk, a batch
      // that sees nothing, grouped heads, a last query tile of 12 rows.
      {2, 4, 2, 140, 300, 32, false, {201, 0}},
      // Causal with more queries than keys: rows 0-69 see no key, in tiles
      // whose later rows do.
      {1, 2, 1, 200, 130, 32, true, {}},
  };
  for (const Kernels* kt : levels()) {
    for (const Case& c : cases) {
      Rng rng(37);
      FlashShape f{c.batch, c.heads, c.kv_heads, c.t, c.s, c.dh, c.dh};
      f.scale = 1.0f / std::sqrt((float)c.dh), f.causal = c.causal, f.bf16 = true;
      f.key_lengths = c.lengths.empty() ? nullptr : c.lengths.data();
      const int64_t B = c.batch, H = c.heads, Hk = c.kv_heads, T = c.t, S = c.s, D = c.dh, G = H / Hk;
      Tensor q = Tensor::randn({B * H * T * D}, rng), k = Tensor::randn({B * Hk * S * D}, rng);
      Tensor v = Tensor::randn({B * Hk * S * D}, rng), dout = Tensor::randn({B * H * T * D}, rng);
      const float *qp = q.data<float>(), *kp = k.data<float>(), *vp = v.data<float>(), *dp = dout.data<float>();
      Tensor out_f = Tensor::empty({B * H * T * D}), out_r = Tensor::empty({B * H * T * D});
      Tensor lse_f = Tensor::empty({B * H * T}), lse_r = Tensor::empty({B * H * T});
      kt->flash_attention_forward(f, qp, kp, vp, out_f.data<float>(), lse_f.data<float>());
      ref::flash_attention_forward(f, qp, kp, vp, out_r.data<float>(), lse_r.data<float>());
      Tensor dq_f = Tensor::full({B * H * T * D}, NAN), dk_f = Tensor::full({B * Hk * S * D}, NAN),
             dv_f = Tensor::full({B * Hk * S * D}, NAN);
      Tensor dq_r = Tensor::empty({B * H * T * D}), dk_r = Tensor::empty({B * Hk * S * D}),
             dv_r = Tensor::empty({B * Hk * S * D});
      kt->flash_attention_backward(f, qp, kp, vp, out_r.data<float>(), dp, lse_r.data<float>(), dq_f.data<float>(),
                                   dk_f.data<float>(), dv_f.data<float>());
      ref::flash_attention_backward(f, qp, kp, vp, out_r.data<float>(), dp, lse_r.data<float>(), dq_r.data<float>(),
                                    dk_r.data<float>(), dv_r.data<float>());
      // The bounds: M (times u) and E (as it is), by element of out, dq, dk, dv.
      std::vector<double> m_out(B * H * T * D), m_q(B * H * T * D), e_q(B * H * T * D), m_k(B * Hk * S * D),
          e_k(B * Hk * S * D), m_v(B * Hk * S * D);
      const double ulp24 = std::ldexp(1.0, -24);
      double eta = 0;  // the largest relative error of a p from its score's float32 sum
      const float* o = out_r.data<float>();
      for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t i = 0; i < T; ++i) {
            const int64_t hk = h / G, qi = ((b * H + h) * T + i) * D;
            int64_t n = f.key_lengths ? std::clamp<int64_t>(c.lengths[b], 0, S) : S;
            if (c.causal) n = std::min(n, i + S - T + 1);
            if (n <= 0) continue;
            std::vector<double> s(n), p(n);
            double mx = -INFINITY, l = 0;
            for (int64_t j = 0; j < n; ++j) {
              double dot = 0, mag = 0;
              for (int64_t d = 0; d < D; ++d) {
                const double t = bf16_round(qp[qi + d]) * bf16_round(kp[((b * Hk + hk) * S + j) * D + d]);
                dot += t, mag += std::fabs(t);
              }
              s[j] = f.scale * dot, mx = std::max(mx, s[j]);
              eta = std::max(eta, 2 * f.scale * (D + 2) * ulp24 * mag);
            }
            for (int64_t j = 0; j < n; ++j) l += std::exp(s[j] - mx);
            double Dsum = 0, Dmag = 0;
            for (int64_t d = 0; d < D; ++d) Dsum += (double)dp[qi + d] * o[qi + d], Dmag += std::fabs(dp[qi + d] * o[qi + d]);
            for (int64_t j = 0; j < n; ++j) {
              const int64_t kj = ((b * Hk + hk) * S + j) * D;
              const double pj = std::exp(s[j] - mx) / l;
              double dpj = 0, dpmag = 0;
              for (int64_t d = 0; d < D; ++d) {
                const double t = bf16_round(dp[qi + d]) * bf16_round(vp[kj + d]);
                dpj += t, dpmag += std::fabs(t);
              }
              const double ds = std::fabs(pj * (dpj - Dsum));
              const double ds_err = pj * (2 * D + 4) * ulp24 * (dpmag + Dmag) + ds * eta;
              for (int64_t d = 0; d < D; ++d) {
                m_out[qi + d] += pj * std::fabs(bf16_round(vp[kj + d]));
                m_v[kj + d] += pj * std::fabs(bf16_round(dp[qi + d]));
                m_q[qi + d] += f.scale * ds * std::fabs(bf16_round(kp[kj + d]));
                e_q[qi + d] += f.scale * ds_err * std::fabs(bf16_round(kp[kj + d]));
                m_k[kj + d] += f.scale * ds * std::fabs(bf16_round(qp[qi + d]));
                e_k[kj + d] += f.scale * ds_err * std::fabs(bf16_round(qp[qi + d]));
              }
            }
          }
      const double u = std::ldexp(1.0, -7) + 2 * eta + (S + T + 2 * D + 8) * ulp24;
      const std::string what = std::string(kt->name) + " t " + std::to_string(T) + " dh " + std::to_string(D);
      auto within = [&](const Tensor& fast, const Tensor& twin, const std::vector<double>& m,
                        const std::vector<double>* e, const char* name) {
        const std::vector<float> a = fast.to_vector(), r = twin.to_vector();
        int64_t bad = 0;
        for (size_t x = 0; x < a.size(); ++x) {
          const double bound = u * m[x] + (e ? (*e)[x] : 0.0) + 1e-30;
          if (!(std::fabs((double)a[x] - r[x]) <= bound) && bad++ < 3)
            ADD_FAILURE() << what << " " << name << "[" << x << "]: " << a[x] << " vs " << r[x] << ", bound " << bound;
        }
        EXPECT_EQ(bad, 0) << what << " " << name;
      };
      within(out_f, out_r, m_out, nullptr, "out");
      within(dv_f, dv_r, m_v, nullptr, "dv");
      within(dq_f, dq_r, m_q, &e_q, "dq");
      within(dk_f, dk_r, m_k, &e_k, "dk");
      const std::vector<float> lf = lse_f.to_vector(), lr = lse_r.to_vector();
      for (size_t i = 0; i < lf.size(); ++i) {
        if (std::isinf(lr[i])) EXPECT_EQ(lf[i], lr[i]) << what << " lse " << i;  // a row that sees no key
        else EXPECT_NEAR(lf[i], lr[i], (T + S) * 4 * ulp24 * (1 + std::fabs(lr[i]))) << what << " lse " << i;
      }
    }
  }
}

// A NaN among the keys makes every score of its column NaN, and every query
// that sees it must come out NaN, on every level, in float32 and bfloat16
// (130 tokens: the avx512 level's packed path), as in the reference: a
// level whose exponential clamped NaN to a finite score once gave the mean
// of V there instead, and an lse of -inf.
TEST(Kernels, FlashAttentionCarriesANaNScoreToTheOutput) {
  const int64_t T = 130, D = 32;
  for (const Kernels* kt : levels()) {
    for (const bool bf16 : {false, true}) {
      Rng rng(3);
      FlashShape f{1, 1, 1, T, T, D, D};
      f.scale = 1.0f / std::sqrt((float)D), f.bf16 = bf16;
      Tensor q = Tensor::randn({T * D}, rng), k = Tensor::randn({T * D}, rng), v = Tensor::randn({T * D}, rng);
      k.data<float>()[5 * D + 3] = NAN;  // key 5, seen by every query
      for (const bool reference : {false, true}) {
        Tensor out = Tensor::empty({T * D}), lse = Tensor::empty({T});
        (reference ? ref::flash_attention_forward : kt->flash_attention_forward)(
            f, q.data<float>(), k.data<float>(), v.data<float>(), out.data<float>(), lse.data<float>());
        const std::vector<float> o = out.to_vector();
        const int64_t finite = std::count_if(o.begin(), o.end(), [](float x) { return !std::isnan(x); });
        EXPECT_EQ(finite, 0) << (reference ? "reference" : kt->name) << (bf16 ? " bf16" : " f32");
      }
    }
  }
}

// The rounding itself, exactly: with q = 0 every key weighs 1/S, and each
// exp(0) = 1 is exact, so the output is v as rounded to bfloat16: 1 + 2^-12
// becomes 1 (it lies halfway below 1 + 2^-7 and rounds to even), on every
// level, where the float32 kernels keep it.
TEST(Kernels, FlashAttentionInBfloat16RoundsTheValues) {
  const int64_t S = 70, D = 16;
  Tensor q = Tensor::zeros({D}), k = Tensor::randn({S * D}, *std::make_unique<Rng>(5)),
         v = Tensor::full({S * D}, 1.0f + std::ldexp(1.0f, -12));
  for (const Kernels* kt : levels()) {
    for (bool bf16 : {false, true}) {
      FlashShape f{1, 1, 1, 1, S, D, D};
      f.scale = 0.25f, f.bf16 = bf16;
      Tensor out = Tensor::empty({D}), lse = Tensor::empty({1});
      kt->flash_attention_forward(f, q.data<float>(), k.data<float>(), v.data<float>(), out.data<float>(),
                                  lse.data<float>());
      for (float x : out.to_vector()) {
        if (bf16) EXPECT_EQ(x, 1.0f) << kt->name;
        else EXPECT_NEAR(x, 1.0f + std::ldexp(1.0f, -12), 1e-6f) << kt->name;
      }
    }
  }
}

}  // namespace
}  // namespace qkv
