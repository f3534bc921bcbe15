// Translation: text in, text out (greedy or beam search), corpus scores, and
// the typed model-folder reader.
#include "qkv/checkpoint.h"
#include "qkv/infer.h"

namespace qkv {

std::vector<std::string> translate_texts(TranslationModel& m, const std::vector<std::string>& sources, int64_t max_len,
                                         int64_t beam) {
  std::vector<std::vector<int64_t>> ids;
  for (auto& s : sources) ids.push_back(m.tokenizer->encode(s));
  std::vector<std::string> out;
  if (beam > 1) {
    for (auto& h : beam_translate(*m.model, ids, max_len, {.beam = beam})) out.push_back(m.tokenizer->decode(h.tokens));
  } else {
    for (auto& t : greedy_translate(*m.model, ids, max_len)) out.push_back(m.tokenizer->decode(t));
  }
  return out;
}

TranslationScores score_translation(TranslationModel& m, const std::vector<SentencePair>& pairs, int64_t max_len,
                                    int64_t beam) {
  std::vector<std::string> sources, refs;
  for (auto& [src, tgt] : pairs) sources.push_back(src), refs.push_back(tgt);
  std::vector<std::string> hyps = translate_texts(m, sources, max_len, beam);
  int64_t exact = 0;
  for (size_t i = 0; i < hyps.size(); ++i) exact += hyps[i] == refs[i];
  TranslationScores s;
  s.sentences = (int64_t)hyps.size();
  s.bleu = bleu_char(hyps, refs);
  s.chrf = chrf(hyps, refs);
  s.exact_match = hyps.empty() ? 0.0 : 100.0 * exact / hyps.size();
  return s;
}

TranslationModel load_translation_model(const std::string& dir, const std::string& command) {
  ModelFolder f = load_model_folder(dir, Task::Translate, command);
  return {f.tokenizer, std::dynamic_pointer_cast<Seq2Seq>(f.model)};
}

}  // namespace qkv
