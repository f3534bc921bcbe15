// Two training runs' model folders compared (tests/mpi_test.sh): every F32
// tensor of their trainer_state.safetensors (weights, AdamW moments) close
// element by element, |a - b| <= ATOL + RTOL |a| (numpy.allclose's rule);
// every integer tensor (step, RNG streams, data order) identical (but the
// per-process RNG counters only a multi-process run saves); and every
// number of the validation history in trainer_state.json within RTOL.
//
//   qkv_compare_runs DIR_A DIR_B RTOL ATOL
//
// Prints the worst element (its difference over its bound); exits 1 past a
// bound, naming the tensor.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "qkv/io.h"

using namespace qkv;

namespace {

double worst = 0;  // the largest difference over its bound
std::string worst_name;
int failures = 0;

void differs(const std::string& what, double a, double b, double rtol, double atol) {
  const double bound = atol + rtol * std::abs(a), diff = std::abs(a - b);
  const double ratio = bound > 0 ? diff / bound : (diff > 0 ? INFINITY : 0);
  if (ratio > worst) worst = ratio, worst_name = what;
  if (ratio > 1) {
    std::printf("FAIL %s: %.9g vs %.9g, a difference of %.3g > %.3g\n", what.c_str(), a, b, diff, bound);
    ++failures;
  }
}

void compare_json(const nlohmann::json& a, const nlohmann::json& b, const std::string& where, double rtol) {
  if (a.is_number_float() || b.is_number_float()) {
    differs(where, a.get<double>(), b.get<double>(), rtol, 0);
  } else if (a.is_object() && b.is_object() && a.size() == b.size()) {
    for (auto& [k, v] : a.items())  // "seconds" is how long it took, not what it learnt
      if (k != "seconds") compare_json(v, b.contains(k) ? b[k] : nlohmann::json(), where + "." + k, rtol);
  } else if (a.is_array() && b.is_array() && a.size() == b.size()) {
    for (size_t i = 0; i < a.size(); ++i) compare_json(a[i], b[i], where + "[" + std::to_string(i) + "]", rtol);
  } else if (a != b) {
    std::printf("FAIL %s: %s vs %s\n", where.c_str(), a.dump().c_str(), b.dump().c_str());
    ++failures;
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: qkv_compare_runs DIR_A DIR_B RTOL ATOL\n");
    return 2;
  }
  const std::string a_dir = argv[1], b_dir = argv[2];
  const double rtol = std::atof(argv[3]), atol = std::atof(argv[4]);
  try {
    const SafetensorsFile a = load_safetensors(a_dir + "/trainer_state.safetensors");
    const SafetensorsFile b = load_safetensors(b_dir + "/trainer_state.safetensors");
    // Each process's RNG counters (rng.ranks.*) are what only a run of several
    // processes has; everything else must be in both.
    auto shared = [](const SafetensorsFile& f) {
      size_t n = 0;
      for (const auto& [name, t] : f.tensors) n += name.rfind("rng.ranks.", 0) != 0;
      return n;
    };
    if (shared(a) != shared(b)) {
      std::printf("FAIL: %zu tensors vs %zu\n", shared(a), shared(b));
      return 1;
    }
    for (const auto& [name, x] : a.tensors) {
      if (name.rfind("rng.ranks.", 0) == 0) continue;
      const Tensor* y = b.find(name);
      if (!y || y->shape() != x.shape() || y->dtype() != x.dtype()) {
        std::printf("FAIL %s: missing or of another shape or type in %s\n", name.c_str(), b_dir.c_str());
        ++failures;
        continue;
      }
      if (x.dtype() != DType::F32) {
        if (x.to_ints() != y->to_ints()) std::printf("FAIL %s: differs\n", name.c_str()), ++failures;
        continue;
      }
      const Tensor xc = x.contiguous(), yc = y->contiguous();
      const float *p = xc.data<float>(), *q = yc.data<float>();
      const int before = failures;
      for (int64_t i = 0; i < x.numel() && failures == before; ++i)
        differs(name + "[" + std::to_string(i) + "]", p[i], q[i], rtol, atol);
    }
    compare_json(nlohmann::json::parse(read_file(a_dir + "/trainer_state.json"))["history"],
                 nlohmann::json::parse(read_file(b_dir + "/trainer_state.json"))["history"], "history", rtol);
  } catch (const std::exception& e) {
    std::printf("FAIL: %s\n", e.what());
    return 1;
  }
  std::printf("worst element at %.2f of its bound (%s); rtol %g, atol %g\n", worst, worst_name.c_str(), rtol, atol);
  return failures ? 1 : 0;
}
