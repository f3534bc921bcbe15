// Building a translation model from its config: one place that knows every arch.
#include <nlohmann/json.hpp>

#include "qkv/conv_seq2seq.h"
#include "qkv/models.h"
#include "src/core/json.h"

namespace qkv {

std::vector<int64_t> beam_rows(int64_t sentences, int64_t k) {
  QKV_CHECK(k >= 1, "expand_beams: k must be at least 1, got ", k);
  std::vector<int64_t> rows;
  for (int64_t s = 0; s < sentences; ++s)
    for (int64_t i = 0; i < k; ++i) rows.push_back(s);
  return rows;
}

void Seq2Seq::expand_beams(DecodeState& state, int64_t sentences, int64_t k) {
  select_rows(state, beam_rows(sentences, k));
}

std::shared_ptr<Seq2Seq> make_seq2seq(const std::string& config_json, const std::string& source, int64_t vocab_size,
                                      Rng& rng) {
  nlohmann::json j = parse_json(config_json, source);
  QKV_CHECK(j.is_object(), source, ": expected a JSON object");
  const std::string arch = j.value("arch", "transformer");
  j["vocab_size"] = vocab_size;
  if (arch == "transformer") {
    TransformerConfig c = TransformerConfig::from_json(j.dump(), source);
    return std::make_shared<TranslationTransformer>(c, rng);
  }
  if (arch == "rnn_attention") {
    RnnAttentionConfig c = RnnAttentionConfig::from_json(j.dump(), source);
    return std::make_shared<RnnAttention>(c, rng);
  }
  if (arch == "conv") {
    ConvSeq2SeqConfig c = ConvSeq2SeqConfig::from_json(j.dump(), source);
    return std::make_shared<ConvSeq2Seq>(c, rng);
  }
  fail(source, ": 'arch' is '", arch, "', expected one of: transformer, rnn_attention, conv");
}

}  // namespace qkv
