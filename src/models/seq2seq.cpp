// Beam bookkeeping shared by the translation families, and building one from its config (through the registry).
#include <nlohmann/json.hpp>

#include "qkv/models.h"
#include "qkv/registry.h"
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
  const Family& family = family_of_config(config_json, source);
  QKV_CHECK(family.domain == Domain::Translation, source, ": arch '", family.arch, "' is ", family.description,
            ", not a translation model");
  nlohmann::json j = parse_json(config_json, source);
  j["vocab_size"] = vocab_size;
  return std::dynamic_pointer_cast<Seq2Seq>(family.build(j.dump(), source, rng));
}

}  // namespace qkv
