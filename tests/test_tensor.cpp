// Tensor layout, views, dtypes and the autograd engine.
#include <omp.h>

#include "qkv/allocator.h"
#include "qkv/nn.h"
#include "qkv/ops.h"
#include "qkv/rng.h"
#include "tests/test_util.h"

namespace qkv {
namespace {

using testing::all_close;

TEST(Tensor, ContiguousLayout) {
  Tensor t = Tensor::zeros({2, 3, 4});
  EXPECT_EQ(t.strides(), (Shape{12, 4, 1}));
  EXPECT_EQ(t.numel(), 24);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.size(-1), 4);
  EXPECT_THROW(t.size(3), Error);
  EXPECT_THROW(Tensor::empty({2, -1}), Error);
}

TEST(Tensor, ShapesWhoseSizesOverflowAreErrors) {
  // Sizes multiply past 2^63, with or without a zero size among them (a
  // tensor of no elements still has strides), or one is negative.
  for (const Shape& bad : {Shape{0, int64_t(1) << 62, 4}, Shape{int64_t(1) << 32, int64_t(1) << 32},
                           Shape{3, -1}}) {
    EXPECT_THROW(Tensor::empty(bad), Error) << shape_str(bad);
    EXPECT_THROW(contiguous_strides(bad), Error) << shape_str(bad);
  }
  EXPECT_EQ(Tensor::empty({0, int64_t(1) << 40, 4}).numel(), 0);
  EXPECT_EQ(contiguous_strides({2, 0, 3}), (Shape{0, 3, 1}));
}

TEST(Tensor, BorrowedMemoryIsSharedAndReleasedOnce) {
  std::vector<float> block = {0, 1, 2, 3, 4, 5, 6, 7};
  int released = 0;
  {
    // Every other column of a 2x4 block: strides {4, 2}, as a NumPy a[:, ::2].
    Tensor t = Tensor::borrow(block.data(), block.size() * sizeof(float), DType::F32, {2, 2}, {4, 2},
                              [&] { ++released; });
    EXPECT_FALSE(t.is_contiguous());
    EXPECT_EQ(t.to_vector(), (std::vector<float>{0, 2, 4, 6}));
    Tensor view = t.slice(0, 1, 2);
    t = Tensor();
    EXPECT_EQ(released, 0);  // the view still holds the block
    view.fill_(9);
    EXPECT_EQ(block[4], 9);
    EXPECT_EQ(block[6], 9);
    EXPECT_EQ(block[5], 5);  // between the strided elements: untouched
  }
  EXPECT_EQ(released, 1);
  // A view past the block's end, or with a negative stride, is refused before it is made.
  EXPECT_THROW(Tensor::borrow(block.data(), 4 * sizeof(float), DType::F32, {2, 4}, {4, 1}, {}), Error);
  EXPECT_THROW(Tensor::borrow(block.data(), 32, DType::F32, {2}, {-1}, {}), Error);
}

// Building under a SkipInitGuard leaves the weights unset but takes the same
// numbers from the Rng, so what is drawn after it (dropout seeds) is the same;
// the initializers leave their tensor untouched.
TEST(Tensor, SkipInitGuardDrawsTheSameStreamAndSetsNothing) {
  Rng a(7), b(7);
  Tensor w = Tensor::full({4, 8}, 3.0f);
  {
    SkipInitGuard uninitialized;
    EXPECT_TRUE(skipping_init());
    Tensor::randn({5, 3}, a);
    Tensor::uniform({7}, a, -1, 1);
    normal_(w, a, 0.02f);
    uniform_fan_in_(w, 8, a);
    xavier_uniform_(w, a);
  }
  EXPECT_FALSE(skipping_init());
  Tensor::randn({5, 3}, b);
  Tensor::uniform({7}, b, -1, 1);
  Tensor v = Tensor::zeros({4, 8});
  normal_(v, b, 0.02f);
  uniform_fan_in_(v, 8, b);
  xavier_uniform_(v, b);
  EXPECT_EQ(a.next_bits(), b.next_bits());
  for (float x : w.to_vector()) ASSERT_EQ(x, 3.0f);
  EXPECT_NE(v.to_vector()[0], 0.0f);  // outside the guard the values are drawn
}

TEST(Tensor, ViewsShareStorage) {
  Tensor t = Tensor::from_vector({0, 1, 2, 3, 4, 5}, {2, 3});
  Tensor tr = t.transpose(0, 1);
  EXPECT_TRUE(tr.same_storage(t));
  EXPECT_FALSE(tr.is_contiguous());
  EXPECT_EQ(tr.to_vector(), (std::vector<float>{0, 3, 1, 4, 2, 5}));
  Tensor s = t.slice(1, 1, 3);
  EXPECT_TRUE(s.same_storage(t));
  EXPECT_EQ(s.offset(), 1);
  EXPECT_EQ(s.to_vector(), (std::vector<float>{1, 2, 4, 5}));
  Tensor r = t.reshape({3, 2});
  EXPECT_TRUE(r.same_storage(t));
  EXPECT_EQ(t.reshape({-1}).shape(), (Shape{6}));
  // A transposed tensor cannot be viewed flat: reshape copies.
  Tensor flat = tr.reshape({6});
  EXPECT_FALSE(flat.same_storage(t));
  EXPECT_EQ(flat.to_vector(), (std::vector<float>{0, 3, 1, 4, 2, 5}));
  EXPECT_THROW(t.reshape({4, 2}), Error);
  EXPECT_THROW(t.slice(0, 1, 3), Error);
  EXPECT_THROW(t.permute({0, 0}), Error);
  EXPECT_EQ(t.unsqueeze(0).shape(), (Shape{1, 2, 3}));
  EXPECT_EQ(t.unsqueeze(0).squeeze(0).shape(), (Shape{2, 3}));
}

TEST(Tensor, WritesThroughViews) {
  Tensor t = Tensor::zeros({3, 4});
  t.slice(1, 1, 3).fill_(2.0f);
  EXPECT_EQ(t.to_vector(), (std::vector<float>{0, 2, 2, 0, 0, 2, 2, 0, 0, 2, 2, 0}));
  t.transpose(0, 1).slice(0, 0, 1).copy_(Tensor::from_vector({7, 8, 9}, {1, 3}));
  EXPECT_EQ(t.to_vector()[0], 7);
  EXPECT_EQ(t.to_vector()[4], 8);
  EXPECT_EQ(t.to_vector()[8], 9);
}

TEST(Tensor, DTypeConversions) {
  Tensor f = Tensor::from_vector({1.5f, -2.25f, 65504.0f, 0.1f, 1e-7f}, {5});
  Tensor h = f.to(DType::F16);
  EXPECT_EQ(h.dtype(), DType::F16);
  std::vector<float> back = h.to_vector();
  EXPECT_EQ(back[0], 1.5f);
  EXPECT_EQ(back[1], -2.25f);
  EXPECT_EQ(back[2], 65504.0f);
  EXPECT_NEAR(back[3], 0.1f, 1e-4f);
  EXPECT_NEAR(back[4], 1e-7f, 6e-8f);  // subnormal half
  std::vector<float> bf = f.to(DType::BF16).to_vector();
  EXPECT_EQ(bf[0], 1.5f);
  EXPECT_NEAR(bf[3], 0.1f, 1e-3f);
  EXPECT_EQ(float_to_half(1e6f), 0x7c00);  // overflows to inf
  EXPECT_EQ(half_to_float(0x7c00), INFINITY);
  EXPECT_EQ(float_to_bf16(1.0f + 1.0f / 256), float_to_bf16(1.0f));  // ties round to even
  Tensor i = Tensor::from_ints({-3, 300}, {2});
  EXPECT_EQ(i.to(DType::I32).to_ints(), (std::vector<int64_t>{-3, 300}));
  EXPECT_EQ(i.to(DType::F32).to_vector(), (std::vector<float>{-3, 300}));
  EXPECT_THROW(i.data<float>(), Error);
}

TEST(Tensor, ConvertInPlaceIsSeenThroughEveryHandle) {
  // A module's member and its parameter list hold the same tensor: both see
  // the new dtype. A transposed view is converted in its own element order.
  Tensor w = Tensor::from_vector({1.5f, 0.1f, -3.0f, 7.0f, 2.0f, 1e-3f}, {2, 3}).set_requires_grad(true);
  Tensor alias = w;
  Tensor expected = w.to(DType::BF16);
  w.convert_(DType::BF16);
  EXPECT_EQ(alias.dtype(), DType::BF16);
  EXPECT_FALSE(alias.requires_grad());
  EXPECT_EQ(alias.to_vector(), expected.to_vector());
  Tensor t = Tensor::from_vector({1, 2, 3, 4, 5, 6}, {2, 3}).transpose(0, 1);
  const std::vector<float> before = t.to_vector();
  t.convert_(DType::BF16);
  EXPECT_EQ(t.to_vector(), before);
  Tensor computed = add(Tensor::ones({2}).set_requires_grad(true), Tensor::ones({2}));
  EXPECT_EQ(testing::error_of([&] { computed.convert_(DType::BF16); }),
            "convert_: a tensor computed by an op cannot change its dtype in place");
}

TEST(Tensor, EveryDTypeConvertsThroughItsTraits) {
  // Integers saturate at their type's range and NaN becomes 0 (a plain cast
  // is undefined there); between integer types the low bits are kept.
  Tensor f = Tensor::from_vector({300.0f, -300.0f, 2.9f, -2.9f, NAN, 1e30f}, {6});
  EXPECT_EQ(f.to(DType::I8).to_ints(), (std::vector<int64_t>{127, -128, 2, -2, 0, 127}));
  EXPECT_EQ(f.to(DType::U8).to_ints(), (std::vector<int64_t>{255, 0, 2, 0, 0, 255}));
  EXPECT_EQ(f.to(DType::I64).to_ints()[5], std::numeric_limits<int64_t>::max());
  EXPECT_EQ(Tensor::from_ints({257, -1}, {2}).to(DType::U8).to_ints(), (std::vector<int64_t>{1, 255}));
  EXPECT_EQ(Tensor::from_ints({-5, 100}, {2}).to(DType::I8).to(DType::F32).to_vector(), (std::vector<float>{-5, 100}));
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::I64, DType::I32, DType::I8, DType::U8}) {
    DType parsed;
    ASSERT_TRUE(parse_dtype(dtype_name(t), &parsed));
    EXPECT_EQ(parsed, t);
    EXPECT_EQ(dtype_traits(t).type, t);
    // Small integers survive every type, in blocks longer than the converter's.
    std::vector<float> v(2500);
    for (size_t i = 0; i < v.size(); ++i) v[i] = (float)(i % 100);
    EXPECT_EQ(Tensor::from_vector(v, {2500}).to(t).to(DType::F32).to_vector(), v) << dtype_name(t);
    EXPECT_EQ(Tensor::from_vector({7}, {}).to(t).item(), 7.0f) << dtype_name(t);
  }
  DType parsed;
  EXPECT_FALSE(parse_dtype("F64", &parsed));
}

TEST(Allocator, BytesAreWrittenForPeople) {
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(1536), "1.50 KiB");
  EXPECT_EQ(format_bytes(900ull << 20), "900 MiB");
  EXPECT_EQ(format_bytes(23193000000ull), "21.6 GiB");
  EXPECT_EQ(format_bytes(~0ull), "16.0 EiB");
}

// The meta device: shapes and dtypes, no memory; reading values is an error.
TEST(Tensor, MetaTensorsHaveShapesAndNoMemory) {
  Rng rng(1);
  const uint64_t before = allocator_stats().bytes_in_use;
  Tensor w, ids;
  {
    DefaultDeviceGuard meta(Device::Meta);
    EXPECT_EQ(default_device(), Device::Meta);
    w = Tensor::randn({1024, 1024}, rng);
    ids = Tensor::from_ints({1, 2, 3}, {3});
    Tensor z = Tensor::zeros({4}, DType::BF16);
    EXPECT_EQ(z.dtype(), DType::BF16);
    EXPECT_EQ(z.device(), Device::Meta);
  }
  EXPECT_EQ(default_device(), Device::Cpu);
  EXPECT_EQ(allocator_stats().bytes_in_use, before);
  EXPECT_EQ(w.device(), Device::Meta);
  EXPECT_EQ(w.shape(), (Shape{1024, 1024}));
  EXPECT_STREQ(device_name(w.device()), "meta");
  // Views, conversions and clones stay on the meta device, still allocating nothing.
  EXPECT_EQ(w.transpose(0, 1).slice(0, 0, 8).device(), Device::Meta);
  EXPECT_EQ(w.to(DType::BF16).device(), Device::Meta);
  EXPECT_EQ(w.clone().device(), Device::Meta);
  EXPECT_EQ(allocator_stats().bytes_in_use, before);
  // Copying into one only checks the shape; reading one is an error.
  w.copy_(Tensor::zeros({1024, 1024}));
  EXPECT_THROW(w.copy_(Tensor::zeros({2})), Error);
  EXPECT_EQ(testing::error_of([&] { w.data<float>(); }), "a [1024,1024] tensor on the meta device has no values to read");
  EXPECT_THROW(ids.to_ints(), Error);
  EXPECT_THROW(Tensor::zeros({2}).copy_(ids.slice(0, 0, 2)), Error);
  // The generator moves on as it would have: what follows draws the same numbers.
  Rng cpu_rng(1);
  Tensor::randn({1024, 1024}, cpu_rng);
  EXPECT_EQ(Tensor::randn({3}, rng).to_vector(), Tensor::randn({3}, cpu_rng).to_vector());
}

TEST(Tensor, SeededRandomIsReproducible) {
  Rng a(42), b(42), c(43);
  EXPECT_TRUE(all_close(Tensor::randn({100}, a), Tensor::randn({100}, b), 0, 0));
  EXPECT_FALSE(all_close(Tensor::randn({100}, a), Tensor::randn({100}, c), 0, 0));
  Rng d(1);
  std::vector<float> v = Tensor::randn({20000}, d).to_vector();
  double m = 0, s = 0;
  for (float x : v) m += x;
  m /= v.size();
  for (float x : v) s += (x - m) * (x - m);
  EXPECT_NEAR(m, 0.0, 0.03);
  EXPECT_NEAR(std::sqrt(s / v.size()), 1.0, 0.03);
}

TEST(Tensor, LargeCopiesSplitAcrossThreadsCopyEveryElement) {
  omp_set_num_threads(2);  // large copies take the threaded path
  Rng rng(3);
  Tensor x = Tensor::randn({6, 70, 5, 33}, rng);  // 277 KB
  std::vector<float> v = x.to_vector();
  Tensor same = x.clone();
  EXPECT_EQ(same.to_vector(), v);
  Tensor moved = x.permute({2, 0, 3, 1}).contiguous();  // strided source, every row a gather
  ASSERT_EQ(moved.shape(), (Shape{5, 6, 33, 70}));
  const float* m = moved.data<float>();
  int64_t wrong = 0;
  for (int64_t a = 0; a < 6; ++a)
    for (int64_t b = 0; b < 70; ++b)
      for (int64_t c = 0; c < 5; ++c)
        for (int64_t d = 0; d < 33; ++d)
          wrong += m[((c * 6 + a) * 33 + d) * 70 + b] != v[((a * 70 + b) * 5 + c) * 33 + d];
  EXPECT_EQ(wrong, 0);
  Tensor big = Tensor::randn({7, 90, 5, 33}, rng);  // 416 KB; its slice is over the threaded size too
  std::vector<float> bv = big.to_vector();
  Tensor sliced = big.slice(1, 3, 88).contiguous();  // rows of a view, split between threads at uneven points
  ASSERT_EQ(sliced.shape(), (Shape{7, 85, 5, 33}));
  const float* sl = sliced.data<float>();
  wrong = 0;
  for (int64_t a = 0; a < 7; ++a)
    for (int64_t b = 0; b < 85; ++b)
      for (int64_t r = 0; r < 5 * 33; ++r) wrong += sl[(a * 85 + b) * 165 + r] != bv[(a * 90 + b + 3) * 165 + r];
  EXPECT_EQ(wrong, 0);
  omp_set_num_threads(1);
}

TEST(Autograd, ChainAndAccumulation) {
  Tensor x = Tensor::from_vector({1, 2, 3}, {3}).set_requires_grad(true);
  // y = sum(x * x + 3x) -> dy/dx = 2x + 3
  Tensor y = sum(add(mul(x, x), scale(x, 3.0f)));
  y.backward();
  EXPECT_EQ(x.grad().to_vector(), (std::vector<float>{5, 7, 9}));
  // Gradients accumulate across backward calls until zeroed.
  sum(x).backward();
  EXPECT_EQ(x.grad().to_vector(), (std::vector<float>{6, 8, 10}));
  x.zero_grad();
  EXPECT_FALSE(x.grad().defined());
}

TEST(Autograd, SharedInputsAndViews) {
  Tensor x = Tensor::from_vector({1, 2, 3, 4}, {2, 2}).set_requires_grad(true);
  // The same gradient buffer flows to both operands of add; each must own its copy.
  Tensor y = add(x, x);
  Tensor z = sum(mul(y, x.transpose(0, 1)));
  z.backward();
  // z = sum_ij 2 x_ij x_ji -> dz/dx_ij = 4 x_ji
  EXPECT_EQ(x.grad().to_vector(), (std::vector<float>{4, 12, 8, 16}));
}

// A first gradient nothing else can reach becomes the leaf's .grad() without a
// copy; one passed straight through to two leaves (add) must still give each
// leaf its own buffer, and later accumulation must not leak from one to the other.
TEST(Autograd, FirstGradientTakenOnlyWhenUnshared) {
  Tensor a = Tensor::from_vector({1, 2}, {2}).set_requires_grad(true);
  Tensor b = Tensor::from_vector({3, 4}, {2}).set_requires_grad(true);
  Tensor w = Tensor::from_vector({5, 6}, {2});
  sum(mul(add(a, b), w)).backward();  // mul's backward makes a fresh d(add); add passes it to both
  EXPECT_EQ(a.grad().to_vector(), (std::vector<float>{5, 6}));
  EXPECT_EQ(b.grad().to_vector(), (std::vector<float>{5, 6}));
  EXPECT_NE(a.grad().data<float>(), b.grad().data<float>());
  sum(scale(a, 2.0f)).backward();  // accumulates into a's buffer only
  EXPECT_EQ(a.grad().to_vector(), (std::vector<float>{7, 8}));
  EXPECT_EQ(b.grad().to_vector(), (std::vector<float>{5, 6}));
  // A gradient kept alive elsewhere (here: the caller's seed) is copied, not taken.
  Tensor c = Tensor::from_vector({1, 2}, {2}).set_requires_grad(true);
  Tensor seed = Tensor::from_vector({1, 1}, {2});
  c.backward(seed);
  EXPECT_NE(c.grad().data<float>(), seed.data<float>());
  sum(c).backward();
  EXPECT_EQ(seed.to_vector(), (std::vector<float>{1, 1}));
  EXPECT_EQ(c.grad().to_vector(), (std::vector<float>{2, 2}));
}

// A backward function that hands out its incoming gradient, a view of it, and
// a tensor it keeps: no leaf may end up sharing memory with another leaf or
// with the kept tensor.
TEST(Autograd, FirstGradientNeverSharedWithViewsOrKeptTensors) {
  Tensor a = Tensor::zeros({4}).set_requires_grad(true);
  Tensor b = Tensor::zeros({2, 2}).set_requires_grad(true);
  Tensor c = Tensor::zeros({4}).set_requires_grad(true);
  Tensor kept = Tensor::full({4}, 3.0f);
  Tensor out = Tensor::zeros({4});
  record_op(out, "probe", {a, b, c}, [kept](const BackwardArgs& g) -> std::vector<Tensor> {
    return {g.grad_out, g.grad_out.reshape({2, 2}), kept};
  });
  sum(scale(out, 2.0f)).backward();
  EXPECT_EQ(a.grad().to_vector(), (std::vector<float>{2, 2, 2, 2}));
  EXPECT_EQ(b.grad().to_vector(), (std::vector<float>{2, 2, 2, 2}));
  EXPECT_EQ(c.grad().to_vector(), (std::vector<float>{3, 3, 3, 3}));
  EXPECT_NE(a.grad().data<float>(), b.grad().data<float>());
  EXPECT_NE(c.grad().data<float>(), kept.data<float>());
  kept.fill_(0.0f);
  a.grad().fill_(5.0f);
  EXPECT_EQ(b.grad().to_vector(), (std::vector<float>{2, 2, 2, 2}));
  EXPECT_EQ(c.grad().to_vector(), (std::vector<float>{3, 3, 3, 3}));
}

TEST(Autograd, NoGradRecordsNothing) {
  Tensor w = Tensor::ones({2}).set_requires_grad(true);
  {
    NoGradGuard no_grad;
    Tensor y = mul(w, w);
    EXPECT_FALSE(y.requires_grad());
    EXPECT_TRUE(y.is_leaf());
  }
  Tensor y = mul(w, w);
  EXPECT_TRUE(y.requires_grad());
  EXPECT_FALSE(y.is_leaf());
  EXPECT_FALSE(y.detach().requires_grad());
  EXPECT_THROW(Tensor::zeros({2}).backward(), Error);
  EXPECT_THROW(y.backward(), Error);  // not a scalar
}

TEST(Autograd, BackwardFreesTheGraph) {
  Tensor w = Tensor::ones({256, 256}).set_requires_grad(true);
  uint64_t before = allocator_stats().bytes_in_use;
  {
    Tensor loss = sum(tanh(matmul(w, w)));
    loss.backward();
  }
  w.zero_grad();
  EXPECT_EQ(allocator_stats().bytes_in_use, before);
}

}  // namespace
}  // namespace qkv
