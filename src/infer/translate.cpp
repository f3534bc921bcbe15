// Translation: text in, text out (greedy or beam search), corpus scores, and
// the typed model-folder reader.
#include "qkv/checkpoint.h"
#include "qkv/infer.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>

#include "qkv/io.h"
#include "src/core/json.h"

namespace qkv {

int64_t source_token_limit(const TranslationModel& m, const SourceLimit& limit) {
  const int64_t own = m.model->max_source_len();
  QKV_CHECK(limit.max_tokens >= 0, "max-source-len ", limit.max_tokens, " is negative");
  QKV_CHECK(own == 0 || limit.max_tokens <= own, "max-source-len ", limit.max_tokens, " is past the model's ", own,
            " learned positions");
  return limit.max_tokens > 0 ? limit.max_tokens : own > 0 ? own : kDefaultMaxSourceTokens;
}

std::vector<int64_t> encode_source(const TranslationModel& m, const std::string& text, const SourceLimit& limit,
                                   const std::string& where, bool* cut) {
  const int64_t most = source_token_limit(m, limit);
  const DecodingIds decoding = m.model->decoding_ids();
  std::vector<int64_t> ids = decoding.source(m.tokenizer->encode(text));
  const int64_t n = (int64_t)ids.size();
  if (cut) *cut = n > most;
  if (n <= most) return ids;
  QKV_CHECK(limit.truncate, where, ": a source of ", n, " tokens, more than the limit of ", most,
            " (--max-source-len raises it", m.model->max_source_len() > 0 ? " up to the model's learned positions" : "",
            "; --truncate-source cuts it)");
  ids.resize((size_t)most);
  if (decoding.source_eos) ids.back() = decoding.eos;  // cut as transformers' truncation cuts: the eos stays last
  return ids;
}

GenerationDefaults read_generation_defaults(const std::string& dir, int64_t vocab) {
  GenerationDefaults d;
  const std::string path = dir + "/generation_config.json";
  if (!std::filesystem::exists(path)) return d;
  const nlohmann::json g = parse_json(read_file(path), path);
  QKV_CHECK(g.is_object(), path, ": expected a JSON object");
  d.from_file = true;
  const auto count = [&](const char* name, int64_t low, int64_t high) -> int64_t {
    const nlohmann::json& v = g[name];
    QKV_CHECK(v.is_number_integer() && v.get<int64_t>() >= low && v.get<int64_t>() <= high, path, ": ", name,
              " must be a whole number from ", low, " to ", high, ", got ", v.dump());
    return v.get<int64_t>();
  };
  const auto given = [&](const char* name) { return g.contains(name) && !g[name].is_null(); };  // null: not given
  if (given("num_beams")) d.num_beams = count("num_beams", 1, 64);
  if (given("length_penalty")) {
    const nlohmann::json& v = g["length_penalty"];
    QKV_CHECK(v.is_number() && std::isfinite(v.get<double>()), path, ": length_penalty must be a number, got ",
              v.dump());
    d.length_penalty = v.get<float>();
  }
  if (given("early_stopping")) {
    const nlohmann::json& v = g["early_stopping"];
    QKV_CHECK(v.is_boolean() || v == "never", path, ": early_stopping must be true, false or \"never\", got ",
              v.dump());
    d.early_stopping = v == "never"    ? EarlyStopping::Never
                       : v.get<bool>() ? EarlyStopping::First
                                       : EarlyStopping::Heuristic;
  }
  if (given("repetition_penalty")) {
    const nlohmann::json& v = g["repetition_penalty"];
    QKV_CHECK(v.is_number() && v.get<double>() > 0 && std::isfinite(v.get<double>()), path,
              ": repetition_penalty must be a positive number, got ", v.dump());
    d.rules.repetition_penalty = v.get<float>();
  }
  if (given("no_repeat_ngram_size")) d.rules.no_repeat_ngram_size = count("no_repeat_ngram_size", 0, 1 << 20);
  if (given("bad_words_ids")) {
    const nlohmann::json& v = g["bad_words_ids"];
    const auto id_list = [](const nlohmann::json& w) {
      if (!w.is_array() || w.empty()) return false;
      for (const nlohmann::json& id : w)
        if (!id.is_number_integer() || id.get<int64_t>() < 0) return false;
      return true;
    };
    QKV_CHECK(v.is_array() && !v.empty() && std::all_of(v.begin(), v.end(), id_list), path,
              ": bad_words_ids must be a non-empty list of non-empty lists of token ids, got ", v.dump());
    d.rules.bad_words = v.get<std::vector<std::vector<int64_t>>>();
    for (const auto& w : d.rules.bad_words)
      for (int64_t id : w)
        QKV_CHECK(vocab <= 0 || id < vocab, path, ": bad_words_ids: id ", id, " is past the vocabulary of ", vocab);
  }
  // min_length counts what comes before the outputs (a translation's start token, a decoder's prompt).
  if (given("min_length")) d.rules.min_length = count("min_length", 0, 1 << 20);
  if (given("min_new_tokens")) d.rules.min_new_tokens = count("min_new_tokens", 0, 1 << 20);
  if (given("max_new_tokens"))
    d.decoder_max_new_tokens = d.max_new_tokens = count("max_new_tokens", 1, std::numeric_limits<int64_t>::max());
  else if (given("max_length"))  // the decoder's start token counts in it
    d.max_new_tokens = count("max_length", 2, std::numeric_limits<int64_t>::max()) - 1;
  if (given("do_sample")) {
    QKV_CHECK(g["do_sample"].is_boolean(), path, ": do_sample must be true or false, got ", g["do_sample"].dump());
    d.do_sample = g["do_sample"].get<bool>();
  }
  const auto number = [&](const char* name, double low, double high) -> float {
    const nlohmann::json& v = g[name];
    QKV_CHECK(v.is_number() && v.get<double>() >= low && v.get<double>() <= high, path, ": ", name,
              " must be a number from ", low, " to ", high, ", got ", v.dump());
    return v.get<float>();
  };
  if (given("temperature")) d.temperature = number("temperature", 0, 1e6);
  if (given("top_k")) d.top_k = count("top_k", 0, std::numeric_limits<int32_t>::max());
  if (given("top_p")) d.top_p = number("top_p", 0, 1);
  QKV_CHECK(d.top_p > 0, path, ": top_p must be above 0, got 0");
  if (given("min_p")) d.min_p = number("min_p", 0, 1);
  if (given("typical_p")) d.typical_p = number("typical_p", 0, 1);
  QKV_CHECK(d.typical_p > 0, path, ": typical_p must be above 0, got 0");
  for (auto [name, cutoff] : {std::pair{"epsilon_cutoff", &d.epsilon_cutoff}, std::pair{"eta_cutoff", &d.eta_cutoff}}) {
    if (!given(name)) continue;
    const float v = number(name, 0, 1);
    *cutoff = v < 1 ? v : 0.0f;  // generate() leaves out a cutoff of 1, as it does 0
  }
  return d;
}

TranslationDecoding translation_decoding(const TranslationModel& m, int64_t beam, int64_t max_len) {
  QKV_CHECK(beam >= 0 && max_len >= 0, "translate: beam and max_len must not be negative, got ", beam, " and ",
            max_len);
  TranslationDecoding d;
  d.beam = beam > 0 ? beam : m.generation.num_beams;
  d.max_len = max_len > 0                       ? max_len
              : m.generation.max_new_tokens > 0 ? std::min(m.generation.max_new_tokens, kMaxDecodeLength)
                                                : 128;
  return d;
}

std::vector<std::string> translate_ids(TranslationModel& m, const std::vector<std::vector<int64_t>>& sources,
                                       int64_t max_len, int64_t beam) {
  std::vector<std::string> out;
  const Tokenizer& target = m.tokenizer->target();
  if (beam > 1) {
    const BeamOptions o{.beam = beam,
                        .length_penalty = m.generation.length_penalty,
                        .early_stopping = m.generation.early_stopping,
                        .rules = m.generation.rules};
    for (auto& h : beam_translate(*m.model, sources, max_len, o)) out.push_back(target.decode(h.tokens));
  } else {
    for (auto& t : greedy_translate(*m.model, sources, max_len, 64, m.generation.rules))
      out.push_back(target.decode(t));
  }
  return out;
}

std::vector<std::string> translate_texts(TranslationModel& m, const std::vector<std::string>& sources, int64_t max_len,
                                         int64_t beam, const SourceLimit& limit) {
  std::vector<std::vector<int64_t>> ids;
  for (size_t i = 0; i < sources.size(); ++i)
    ids.push_back(encode_source(m, sources[i], limit, "source sentence " + std::to_string(i + 1)));
  return translate_ids(m, ids, max_len, beam);
}

TranslationScores score_translation(TranslationModel& m, const std::vector<std::vector<int64_t>>& sources,
                                    const std::vector<std::string>& references, int64_t max_len, int64_t beam,
                                    int64_t resamples) {
  QKV_CHECK(sources.size() == references.size(), "score_translation: ", sources.size(), " sources but ",
            references.size(), " references");
  std::vector<std::string> hyps = translate_ids(m, sources, max_len, beam);
  int64_t exact = 0;
  for (size_t i = 0; i < hyps.size(); ++i) exact += hyps[i] == references[i];
  TranslationScores s;
  s.sentences = (int64_t)hyps.size();
  s.bleu = bleu_char(hyps, references);
  s.chrf = chrf(hyps, references);
  s.exact_match = hyps.empty() ? 0.0 : 100.0 * exact / hyps.size();
  if (resamples > 0 && !hyps.empty()) s.confidence = bootstrap_confidence(hyps, references, resamples);
  s.hypotheses = std::move(hyps);
  return s;
}

std::vector<TranslationCheck> check_translations(TranslationModel& m, const std::vector<SentencePair>& pairs,
                                                 int64_t max_len) {
  NoGradGuard no_grad;
  const bool training = m.model->is_training();
  m.model->eval();
  std::vector<std::string> sources;
  for (auto& p : pairs) sources.push_back(p.first);
  std::vector<std::string> out = translate_texts(m, sources, max_len);
  if (training) m.model->train();
  std::vector<TranslationCheck> checks;
  for (size_t i = 0; i < pairs.size(); ++i) checks.push_back({pairs[i].first, pairs[i].second, out[i]});
  return checks;
}

std::vector<CategoryScores> scores_by_category(const std::vector<std::string>& hyps,
                                               const std::vector<std::string>& refs,
                                               const std::vector<std::string>& categories, int64_t resamples) {
  QKV_CHECK(hyps.size() == refs.size() && refs.size() == categories.size(), "scores_by_category: ", hyps.size(),
            " hypotheses, ", refs.size(), " references, ", categories.size(), " categories");
  std::vector<std::string> order;
  std::map<std::string, std::pair<std::vector<std::string>, std::vector<std::string>>> groups;
  for (size_t i = 0; i < categories.size(); ++i) {
    const std::string name = categories[i].empty() ? "(none)" : categories[i];
    auto [it, added] = groups.try_emplace(name);
    if (added) order.push_back(name);
    it->second.first.push_back(hyps[i]);
    it->second.second.push_back(refs[i]);
  }
  std::vector<CategoryScores> out;
  if (order.size() == 1 && order[0] == "(none)") return out;
  for (const std::string& name : order) {
    const auto& [h, r] = groups[name];
    int64_t exact = 0;
    for (size_t i = 0; i < h.size(); ++i) exact += h[i] == r[i];
    CategoryScores c{name, chrf(h, r), bleu_char(h, r), 100.0 * (double)exact / (double)h.size(), (int64_t)h.size(), {}};
    if (resamples > 0) c.chrf_interval = bootstrap_confidence(h, r, resamples).chrf;
    out.push_back(std::move(c));
  }
  return out;
}

TranslationScores score_translation(TranslationModel& m, const std::vector<SentencePair>& pairs, int64_t max_len,
                                    int64_t beam, const SourceLimit& limit) {
  std::vector<std::vector<int64_t>> sources;
  std::vector<std::string> refs;
  for (size_t i = 0; i < pairs.size(); ++i) {
    sources.push_back(encode_source(m, pairs[i].first, limit, "pair " + std::to_string(i + 1)));
    refs.push_back(pairs[i].second);
  }
  return score_translation(m, sources, refs, max_len, beam);
}

TranslationModel load_translation_model(const std::string& dir, const std::string& command, const std::string& dtype) {
  return translation_model(load_model_folder(dir, Task::Translate, command, {dtype}), dir);
}

TranslationModel translation_model(const ModelFolder& folder, const std::string& dir) {
  return {folder.tokenizer, std::dynamic_pointer_cast<Seq2Seq>(folder.model), read_generation_defaults(dir)};
}

}  // namespace qkv
