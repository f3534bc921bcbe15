// Mixture of Experts with top-k routing and a load-balancing loss (see qkv/blocks.h).
//
// Routing is a discrete choice and has no gradient; the gates (renormalized
// router probabilities of the chosen experts) do, so the router learns from
// the loss through the gates and through the auxiliary loss's P_e.
#include <algorithm>
#include <numeric>

#include "qkv/blocks.h"

namespace qkv {

MixtureOfExperts::MixtureOfExperts(int64_t d_model, int64_t hidden, MoEOptions o, Rng& rng) : options_(o) {
  QKV_CHECK(o.num_experts >= 1 && o.top_k >= 1 && o.top_k <= o.num_experts, "MixtureOfExperts: top_k ", o.top_k,
            " must be in [1, num_experts = ", o.num_experts, "]");
  QKV_CHECK(o.expert != MLPKind::MoE, "MixtureOfExperts: experts must be Dense or SwiGLU");
  router = register_module("router", std::make_shared<Linear>(LinearOptions{d_model, o.num_experts, false}, rng));
  for (int64_t e = 0; e < o.num_experts; ++e) {
    std::shared_ptr<FeedForward> expert;
    if (o.expert == MLPKind::SwiGLU) expert = std::make_shared<SwiGLU>(d_model, hidden, rng);
    else expert = std::make_shared<DenseFeedForward>(MLPOptions{d_model, hidden, d_model, o.activation}, rng);
    experts.push_back(register_module("experts." + std::to_string(e), expert));
  }
}

Tensor MixtureOfExperts::forward(const Tensor& x_in) {
  const int64_t E = options_.num_experts, K = options_.top_k, D = x_in.size(-1);
  Tensor x = x_in.reshape({-1, D});
  const int64_t N = x.size(0);
  Tensor probs = softmax(router->forward(x));  // [N, E]

  // Top-k per token (ties go to the lower expert index); tokens grouped by expert.
  std::vector<float> p = probs.to_vector();
  std::vector<float> chosen(N * E, 0.0f);
  std::vector<std::vector<int64_t>> tokens(E);
  std::vector<int64_t> order(E);
  for (int64_t t = 0; t < N; ++t) {
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + K, order.end(), [&](int64_t a, int64_t b) {
      return p[t * E + a] != p[t * E + b] ? p[t * E + a] > p[t * E + b] : a < b;
    });
    for (int64_t j = 0; j < K; ++j) {
      chosen[t * E + order[j]] = 1.0f;
      tokens[order[j]].push_back(t);
    }
  }
  // gates: the chosen experts' probabilities, renormalized to sum to 1 per token.
  Tensor selected = mul(probs, Tensor::from_vector(chosen, {N, E}));
  Tensor gates = div(selected, sum(selected, {-1}, {.keepdim = true}));

  std::vector<Tensor> outputs;
  std::vector<int64_t> rows;
  counts_.assign(E, 0);
  for (int64_t e = 0; e < E; ++e) {
    counts_[e] = (int64_t)tokens[e].size();
    if (tokens[e].empty()) continue;
    Tensor ids = Tensor::from_ints(tokens[e], {counts_[e]});
    Tensor y = experts[e]->forward(embedding(x, ids));                 // one matmul chain over its tokens
    outputs.push_back(mul(y, embedding(gates, ids).slice(1, e, e + 1)));  // times the gate [n_e, 1]
    rows.insert(rows.end(), tokens[e].begin(), tokens[e].end());
  }
  Tensor y = index_add_rows(concat(outputs, 0), Tensor::from_ints(rows, {(int64_t)rows.size()}), N);

  std::vector<float> fraction(E);
  for (int64_t e = 0; e < E; ++e) fraction[e] = (float)counts_[e] / (float)(N * K);
  aux_loss_ = scale(sum(mul(mean(probs, {0}), Tensor::from_vector(fraction, {E}))),
                    (float)E * options_.aux_loss_weight);
  Shape out_shape = x_in.shape();
  return y.reshape(out_shape);
}

}  // namespace qkv
