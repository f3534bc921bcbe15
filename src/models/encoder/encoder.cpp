// The text encoder, its config, and sentence embeddings (qkv/encoder.h).
#include "qkv/encoder.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "qkv/checkpoint.h"
#include "src/config/names.h"

template <>
struct qkv::config::EnumNames<qkv::SentencePooling> {
  static constexpr std::pair<SentencePooling, const char*> values[] = {{SentencePooling::Mean, "mean"},
                                                                       {SentencePooling::Cls, "cls"}};
};

namespace qkv {

static const config::Fields<EncoderConfig>& encoder_fields() {
  using C = EncoderConfig;
  static const config::Fields<C> fields =
      config::Fields<C>()
          .constant("arch", "encoder")
          .add("vocab_size", &C::vocab_size).at_least(0).at_most(config::limits::kVocab)
          .add("num_layers", &C::num_layers).at_least(1).at_most(config::limits::kLayers)
          .add("context", &C::context).at_least(2).at_most(config::limits::kPositions)
          .add("type_vocab_size", &C::type_vocab_size).at_least(1).at_most(1 << 16)
          .add("max_tokens", &C::max_tokens).at_least(0).at_most(config::limits::kPositions)
          .add("pooling", &C::pooling)
          .add("normalize", &C::normalize)
          .include(config::block_fields())
          .skip("train")
          .skip("tokenizer");
  return fields;
}

EncoderConfig EncoderConfig::from_json(const std::string& text, const std::string& source) {
  EncoderConfig c = encoder_fields().parse(text, source);
  c.check(source);
  QKV_CHECK(c.positions == PositionKind::Learned, source, ": an encoder has learned positions (\"positions\": \"learned\")");
  QKV_CHECK(c.mlp == MLPKind::Dense, source, ": an encoder has a dense MLP (\"mlp\": \"dense\")");
  return c;
}

std::string EncoderConfig::to_json() const { return encoder_fields().write(*this).dump(2); }

TextEncoder::TextEncoder(const EncoderConfig& c, Rng& rng) : config_(c) {
  QKV_CHECK(c.vocab_size > 0, "encoder: vocab_size must be set (got ", c.vocab_size, ")");
  embed_tokens = register_module("embed", std::make_shared<Embedding>(c.vocab_size, c.d_model, rng));
  normal_(embed_tokens->weight, rng, 0.02f);
  positions = register_module("positions", std::make_shared<LearnedPositionalEmbedding>(c.context, c.d_model, rng));
  token_types = register_module("token_types", std::make_shared<Embedding>(c.type_vocab_size, c.d_model, rng));
  normal_(token_types->weight, rng, 0.02f);
  embed_norm = register_module("embed_norm", std::make_shared<LayerNorm>(c.d_model, c.norm_eps));
  const TransformerLayerOptions lo = c.layer_options();
  for (int64_t i = 0; i < c.num_layers; ++i)
    layers.push_back(register_module("layers." + std::to_string(i), std::make_shared<TransformerEncoderLayer>(lo, rng)));
  dropout = register_module("dropout", std::make_shared<Dropout>(c.dropout, rng.next_bits()));
}

Tensor TextEncoder::forward(const Tensor& ids, const std::vector<int64_t>& lengths) {
  QKV_CHECK(ids.dim() == 2 && (size_t)ids.size(0) == lengths.size(), "encoder: ids must be [B, T] with B lengths, got ",
            shape_str(ids.shape()), " and ", lengths.size(), " lengths");
  const int64_t T = ids.size(1);
  QKV_CHECK(T <= config_.context, "encoder: ", T, " tokens exceed the context of ", config_.context);
  for (int64_t n : lengths) QKV_CHECK(n >= 1 && n <= T, "encoder: a length of ", n, " for ", T, " positions");
  // Every token is of type 0 (one text): the first row of the type table.
  Tensor x = add(add(embed_tokens->forward(ids), positions->forward(T)), token_types->weight.slice(0, 0, 1));
  x = dropout->forward(embed_norm->forward(x));
  const Tensor real = Tensor::from_ints(lengths, {(int64_t)lengths.size()});
  for (auto& layer : layers) x = layer->forward(x, {.key_padding_lengths = real});
  return x;
}

Tensor TextEncoder::embed(const Tensor& ids, const std::vector<int64_t>& lengths, bool normalize) {
  NoGradGuard no_grad;
  const Tensor h = forward(ids, lengths).contiguous();
  const int64_t B = h.size(0), T = h.size(1), D = h.size(2);
  Tensor out = Tensor::zeros({B, D});
  const float* hs = h.data<float>();
  float* o = out.data<float>();
  for (int64_t b = 0; b < B; ++b) {
    float* row = o + b * D;
    const int64_t n = config_.pooling == SentencePooling::Cls ? 1 : lengths[(size_t)b];
    for (int64_t t = 0; t < n; ++t)
      for (int64_t d = 0; d < D; ++d) row[d] += hs[(b * T + t) * D + d];
    for (int64_t d = 0; d < D; ++d) row[d] /= (float)n;
    if (normalize || config_.normalize) {  // as torch.nn.functional.normalize: x / max(|x|, 1e-12)
      double sq = 0;
      for (int64_t d = 0; d < D; ++d) sq += (double)row[d] * row[d];
      const float norm = (float)std::max(std::sqrt(sq), 1e-12);
      for (int64_t d = 0; d < D; ++d) row[d] /= norm;
    }
  }
  return out;
}

std::string TextEncoder::summary() const {
  const EncoderConfig& c = config_;
  return "encoder: d_model " + std::to_string(c.d_model) + ", " + std::to_string(c.num_layers) + " layers, " +
         std::to_string(c.nhead) + " heads, " + std::to_string(parameter_count()) + " parameters, vocabulary " +
         std::to_string(c.vocab_size) + ", " + config::name_of(c.pooling) + " pooling" +
         (c.normalize ? ", normalized" : "");
}

EmbeddingModel load_embedding_model(const std::string& dir, const std::string& command, const std::string& dtype) {
  ModelFolder f = load_model_folder(dir, Task::Embed, command, {dtype});
  QKV_CHECK(f.tokenizer, command, ": ", dir, " has no tokenizer (tokenizer.json)");
  return {f.tokenizer, std::dynamic_pointer_cast<TextEncoder>(f.model)};
}

std::vector<std::vector<float>> embed_texts(EmbeddingModel& m, const std::vector<std::string>& texts, bool normalize,
                                            EmbedLimit limit, const std::function<std::string(size_t)>& where,
                                            std::vector<int64_t>* tokens,
                                            const std::function<void(size_t, size_t)>& progress) {
  const Tokenizer& tok = *m.tokenizer;
  const std::vector<int64_t>& prefix = tok.specials().prefix;
  const std::vector<int64_t>& suffix = tok.specials().suffix;
  const EncoderConfig& c = m.model->config();
  const int64_t context = c.max_tokens > 0 ? std::min(c.max_tokens, c.context) : c.context;
  const int64_t room = context - (int64_t)(prefix.size() + suffix.size());
  QKV_CHECK(room >= 1, "embed: the context of ", context, " tokens leaves no room between the special tokens");
  std::vector<std::vector<int64_t>> inputs;
  if (tokens) tokens->clear();
  for (size_t i = 0; i < texts.size(); ++i) {
    std::vector<int64_t> body = tok.encode(texts[i]);
    if ((int64_t)body.size() > room) {
      QKV_CHECK(limit.truncate, where ? where(i) : "embed: text " + std::to_string(i + 1), ": ", body.size(),
                " tokens, more than the ", room, " the model reads (", context,
                " with its special tokens); --truncate cuts it to fit");
      body.resize((size_t)room);
    }
    std::vector<int64_t> ids = prefix;
    ids.insert(ids.end(), body.begin(), body.end());
    ids.insert(ids.end(), suffix.begin(), suffix.end());
    if (tokens) tokens->push_back((int64_t)ids.size());
    inputs.push_back(std::move(ids));
  }
  // Batches of similar lengths, so that little is padding: in order of
  // length, up to 32 texts, and a text joins a batch only if the batch's
  // padding stays within a quarter of its tokens. 32 texts of 10 to 62
  // tokens had been one batch padded to 62, 42% of it padding.
  std::vector<size_t> order(inputs.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return inputs[a].size() < inputs[b].size(); });
  std::vector<std::vector<float>> out(inputs.size());
  constexpr size_t kBatch = 32;
  for (size_t first = 0, n; first < order.size(); first += n) {
    size_t real = inputs[order[first]].size();
    for (n = 1; n < kBatch && first + n < order.size(); ++n) {
      const size_t longest = inputs[order[first + n]].size();
      if (4 * (n + 1) * longest > 5 * (real + longest)) break;
      real += longest;
    }
    const int64_t T = (int64_t)inputs[order[first + n - 1]].size();
    std::vector<int64_t> ids((size_t)(n * T), 0), lengths;
    for (size_t k = 0; k < n; ++k) {
      const std::vector<int64_t>& in = inputs[order[first + k]];
      std::copy(in.begin(), in.end(), ids.begin() + (ptrdiff_t)(k * T));
      lengths.push_back((int64_t)in.size());
    }
    const Tensor e = m.model->embed(Tensor::from_ints(ids, {(int64_t)n, T}), lengths, normalize);
    const int64_t D = e.size(1);
    for (size_t k = 0; k < n; ++k)
      out[order[first + k]].assign(e.data<float>() + k * D, e.data<float>() + (k + 1) * D);
    if (progress) progress(first + n, order.size());
  }
  return out;
}

}  // namespace qkv
