// Shared helpers for the tests: tensor comparison with stated tolerances.
#pragma once

#include <gtest/gtest.h>

#include <stdlib.h>

#include <cmath>
#include <functional>
#include <map>
#include <string>

#include "qkv/io.h"
#include "qkv/tensor.h"

namespace qkv::testing {

// |a - b| <= atol + rtol * |b| element-wise; reports the worst element.
inline ::testing::AssertionResult all_close(const Tensor& a, const Tensor& b, float atol, float rtol) {
  if (a.shape() != b.shape())
    return ::testing::AssertionFailure() << "shapes differ: " << shape_str(a.shape()) << " vs " << shape_str(b.shape());
  std::vector<float> va = a.to_vector(), vb = b.to_vector();
  double worst = 0;
  size_t worst_i = 0;
  for (size_t i = 0; i < va.size(); ++i) {
    double excess = std::fabs((double)va[i] - vb[i]) - (atol + rtol * std::fabs((double)vb[i]));
    bool nan_mismatch = std::isnan(va[i]) != std::isnan(vb[i]);
    if (nan_mismatch) return ::testing::AssertionFailure() << "NaN mismatch at element " << i;
    if (excess > worst) {
      worst = excess;
      worst_i = i;
    }
  }
  if (worst > 0)
    return ::testing::AssertionFailure() << "element " << worst_i << ": " << va[worst_i] << " vs " << vb[worst_i]
                                         << " (atol " << atol << ", rtol " << rtol << ")";
  return ::testing::AssertionSuccess();
}

// Central differences (loss(x + eps) - loss(x - eps)) / 2 eps for every element
// of the contiguous F32 tensor x, which is perturbed in place and restored.
inline Tensor numeric_gradient(Tensor& x, const std::function<double()>& loss, float eps) {
  std::vector<float> numeric(x.numel());
  float* p = x.data<float>();
  for (int64_t k = 0; k < x.numel(); ++k) {
    const float saved = p[k];
    p[k] = saved + eps;
    const double up = loss();
    p[k] = saved - eps;
    const double down = loss();
    p[k] = saved;
    numeric[k] = (float)((up - down) / (2 * eps));
  }
  return Tensor::from_vector(numeric, x.shape());
}

inline std::string fixture(const std::string& name) { return std::string(QKV_FIXTURES_DIR) + "/" + name; }

// The tensors of a fixture file, read once per test process.
inline const std::map<std::string, Tensor>& fixture_tensors(const std::string& name) {
  static std::map<std::string, std::map<std::string, Tensor>> loaded;
  auto it = loaded.find(name);
  if (it == loaded.end()) it = loaded.emplace(name, load_safetensors(fixture(name)).as_map()).first;
  return it->second;
}

// A fresh folder /tmp/qkv_<name>_XXXXXX for one test's files.
inline std::string temp_dir(const std::string& name = "test") {
  std::string tmpl = "/tmp/qkv_" + name + "_XXXXXX";
  const char* d = mkdtemp(tmpl.data());
  EXPECT_NE(d, nullptr) << "cannot make " << tmpl;
  return d ? d : "";
}

}  // namespace qkv::testing
