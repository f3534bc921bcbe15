// The synthetic Chinese -> Japanese corpus: a grammar and a lexicon written
// for qkv. Each rule builds the Chinese sentence and its Japanese translation
// side by side, so the pair is correct by construction.
//
//   copula      我是中国人 -> 私は中国人です / 不是 -> ではありません / 吗 -> ですか
//   verb        S [time] [在 place] V O -> S は [time] [place で] O を V-ます
//               (不 V -> V-ません; 昨天 V 了 -> V-ました; 昨天没 V -> V-ませんでした)
//   like        S 喜欢 O -> S は O が好きです
//   adjective   S 很 A -> S は A です (不 A -> A-くないです; いい -> よくないです)
//   counting    S 有 N 个/本/辆 O -> S は O を N つ/冊/台 持っています
//   possessive  我的朋友 -> 私の友達
#include <set>

#include "qkv/data.h"
#include "qkv/error.h"
#include "qkv/rng.h"

namespace qkv {
namespace {

struct Word {
  const char* zh;
  const char* ja;
};

// People who can be subjects. Possessed people are built from these two lists.
const Word kPronouns[] = {{"我", "私"},     {"你", "あなた"}, {"他", "彼"},     {"她", "彼女"},
                          {"我们", "私たち"}, {"他们", "彼ら"}, {"老师", "先生"}, {"田中", "田中さん"},
                          {"王先生", "王さん"}, {"李小姐", "李さん"}};
const Word kPossessors[] = {{"我", "私"}, {"你", "あなた"}, {"他", "彼"}, {"她", "彼女"}, {"我们", "私たち"}};
const Word kRelations[] = {{"朋友", "友達"}, {"妈妈", "お母さん"}, {"爸爸", "お父さん"}, {"哥哥", "お兄さん"},
                           {"妹妹", "妹さん"}, {"同学", "クラスメート"}, {"老师", "先生"}};

const Word kNationalities[] = {{"中国人", "中国人"},   {"日本人", "日本人"},   {"美国人", "アメリカ人"},
                               {"韩国人", "韓国人"},   {"英国人", "イギリス人"}, {"法国人", "フランス人"},
                               {"德国人", "ドイツ人"}};
const Word kOccupations[] = {{"学生", "学生"},     {"老师", "教師"},   {"医生", "医者"},   {"工程师", "エンジニア"},
                             {"警察", "警察官"},   {"厨师", "料理人"}, {"律师", "弁護士"}, {"歌手", "歌手"},
                             {"护士", "看護師"}};

// A transitive verb: its Japanese ます-stem and the objects it takes.
struct Verb {
  const char* zh;
  const char* ja_stem;  // 食べ + ます / ません / ました / ませんでした
  std::vector<Word> objects;
};
const std::vector<Verb>& verbs() {
  static const std::vector<Verb> v = {
      {"吃", "食べ", {{"苹果", "りんご"}, {"面包", "パン"}, {"米饭", "ご飯"}, {"鱼", "魚"}, {"蛋糕", "ケーキ"}}},
      {"喝", "飲み", {{"水", "水"}, {"茶", "お茶"}, {"咖啡", "コーヒー"}, {"牛奶", "牛乳"}}},
      {"看", "読み", {{"书", "本"}, {"报纸", "新聞"}, {"杂志", "雑誌"}}},
      {"看", "見", {{"电影", "映画"}, {"电视", "テレビ"}}},
      {"买", "買い", {{"书", "本"}, {"车", "車"}, {"衣服", "服"}, {"苹果", "りんご"}, {"面包", "パン"}}},
      {"学习", "勉強し", {{"日语", "日本語"}, {"汉语", "中国語"}, {"英语", "英語"}, {"数学", "数学"}}},
      {"写", "書き", {{"信", "手紙"}, {"报告", "レポート"}}},
  };
  return v;
}

const Word kPlaces[] = {{"学校", "学校"}, {"家", "家"},     {"图书馆", "図書館"}, {"东京", "東京"},
                        {"北京", "北京"}, {"公园", "公園"}, {"咖啡店", "喫茶店"}};
const Word kPresentTimes[] = {{"今天", "今日"}, {"明天", "明日"}, {"每天", "毎日"}};
const Word kLikes[] = {{"苹果", "りんご"}, {"咖啡", "コーヒー"}, {"茶", "お茶"},   {"电影", "映画"}, {"日语", "日本語"},
                       {"猫", "猫"},       {"狗", "犬"},         {"音乐", "音楽"}, {"鱼", "魚"},     {"数学", "数学"}};

// An i-adjective: Chinese, Japanese dictionary form, its negative stem (高 -> 高く).
struct Adjective {
  const char* zh;
  const char* ja;
  const char* ja_negative;  // + ないです
  const char* zh_negative;  // 不贵, 没有意思
};
const Adjective kBig{"大", "大きい", "大きく", "不大"}, kSmall{"小", "小さい", "小さく", "不小"},
    kExpensive{"贵", "高い", "高く", "不贵"}, kCheap{"便宜", "安い", "安く", "不便宜"},
    kInteresting{"有意思", "面白い", "面白く", "没有意思"}, kNew{"新", "新しい", "新しく", "不新"},
    kOld{"旧", "古い", "古く", "不旧"}, kHard{"难", "難しい", "難しく", "不难"},
    kEasy{"容易", "易しい", "易しく", "不容易"}, kGood{"好", "いい", "よく", "不好"},
    kCold{"冷", "寒い", "寒く", "不冷"}, kHot{"热", "暑い", "暑く", "不热"}, kBusy{"忙", "忙しい", "忙しく", "不忙"},
    kHappy{"高兴", "うれしい", "うれしく", "不高兴"}, kSleepy{"困", "眠い", "眠く", "不困"};

struct Topic {
  Word word;
  std::vector<Adjective> adjectives;
};
const std::vector<Topic>& topics() {
  static const std::vector<Topic> t = {
      {{"这本书", "この本"}, {kInteresting, kExpensive, kCheap, kNew, kOld, kHard, kEasy, kBig, kSmall}},
      {{"那本书", "あの本"}, {kInteresting, kExpensive, kCheap, kNew, kOld, kHard, kEasy}},
      {{"这辆车", "この車"}, {kBig, kSmall, kExpensive, kCheap, kNew, kOld, kGood}},
      {{"这个苹果", "このりんご"}, {kBig, kSmall, kExpensive, kCheap, kGood}},
      {{"今天的天气", "今日の天気"}, {kGood, kCold, kHot}},
      {{"这部电影", "この映画"}, {kInteresting, kNew, kOld, kGood}},
      {{"日语", "日本語"}, {kHard, kEasy, kInteresting}},
      {{"汉语", "中国語"}, {kHard, kEasy, kInteresting}},
      {{"这家咖啡店", "この喫茶店"}, {kBig, kSmall, kNew, kOld, kGood, kExpensive, kCheap}},
  };
  return t;
}
const Adjective kPersonAdjectives[] = {kBusy, kHappy, kSleepy, kCold, kHot};

struct Countable {
  Word word;
  const char* zh_classifier;  // 个 本 辆
  const char* ja_counter;     // つ 冊 台
};
const Countable kCountables[] = {{{"苹果", "りんご"}, "个", "つ"}, {{"蛋糕", "ケーキ"}, "个", "つ"},
                                 {{"书", "本"}, "本", "冊"},       {{"杂志", "雑誌"}, "本", "冊"},
                                 {{"车", "車"}, "辆", "台"}};
const char* kZhNumbers[] = {"一", "两", "三", "四", "五", "六", "七", "八", "九"};
const char* kJaNumbers[] = {"一", "二", "三", "四", "五", "六", "七", "八", "九"};

}  // namespace

ZhJaGenerator::ZhJaGenerator(uint64_t seed) : state_(mix64(seed ^ 0x7a686a61)) {}

uint64_t ZhJaGenerator::draw(uint64_t n) { return mix64(state_++) % n; }

template <class T, size_t N>
static const T& pick(const T (&arr)[N], uint64_t i) {
  return arr[i % N];
}

SentencePair ZhJaGenerator::next() {
  std::string zh, ja;
  // The subject: a person, sometimes someone's relation (possessive).
  auto subject = [&]() -> std::pair<std::string, std::string> {
    if (draw(4) == 0) {
      const Word& owner = pick(kPossessors, draw(100));
      const Word& rel = pick(kRelations, draw(100));
      return {std::string(owner.zh) + "的" + rel.zh, std::string(owner.ja) + "の" + rel.ja};
    }
    const Word& w = pick(kPronouns, draw(100));
    return {w.zh, w.ja};
  };
  const uint64_t kind = draw(100);
  const uint64_t mood = draw(3);  // 0 affirmative, 1 negative, 2 question
  if (kind < 25) {  // copula
    auto [szh, sja] = subject();
    const Word& pred = draw(2) ? pick(kNationalities, draw(100)) : pick(kOccupations, draw(100));
    if (mood == 0) zh = szh + "是" + pred.zh, ja = sja + "は" + pred.ja + "です";
    if (mood == 1) zh = szh + "不是" + pred.zh, ja = sja + "は" + pred.ja + "ではありません";
    if (mood == 2) zh = szh + "是" + pred.zh + "吗", ja = sja + "は" + pred.ja + "ですか";
  } else if (kind < 60) {  // transitive verb, SVO -> SOV
    auto [szh, sja] = subject();
    const Verb& v = verbs()[draw(verbs().size())];
    const Word& obj = v.objects[draw(v.objects.size())];
    const bool past = draw(4) == 0;
    std::string tzh, tja;
    if (past) tzh = "昨天", tja = "昨日";
    else if (draw(2)) {
      const Word& t = pick(kPresentTimes, draw(100));
      tzh = t.zh, tja = t.ja;
    }
    std::string pzh, pja;
    if (draw(2)) {
      const Word& p = pick(kPlaces, draw(100));
      pzh = std::string("在") + p.zh, pja = std::string(p.ja) + "で";
    }
    const std::string ja_head = sja + "は" + tja + pja + obj.ja + "を" + v.ja_stem;
    if (past) {
      if (mood == 0) zh = szh + tzh + pzh + v.zh + "了" + obj.zh, ja = ja_head + "ました";
      if (mood == 1) zh = szh + tzh + pzh + "没" + v.zh + obj.zh, ja = ja_head + "ませんでした";
      if (mood == 2) zh = szh + tzh + pzh + v.zh + "了" + obj.zh + "吗", ja = ja_head + "ましたか";
    } else {
      if (mood == 0) zh = szh + tzh + pzh + v.zh + obj.zh, ja = ja_head + "ます";
      if (mood == 1) zh = szh + tzh + pzh + "不" + v.zh + obj.zh, ja = ja_head + "ません";
      if (mood == 2) zh = szh + tzh + pzh + v.zh + obj.zh + "吗", ja = ja_head + "ますか";
    }
  } else if (kind < 72) {  // 喜欢: S は O が好きです
    auto [szh, sja] = subject();
    const Word& o = pick(kLikes, draw(100));
    if (mood == 0) zh = szh + "喜欢" + o.zh, ja = sja + "は" + o.ja + "が好きです";
    if (mood == 1) zh = szh + "不喜欢" + o.zh, ja = sja + "は" + o.ja + "が好きではありません";
    if (mood == 2) zh = szh + "喜欢" + o.zh + "吗", ja = sja + "は" + o.ja + "が好きですか";
  } else if (kind < 90) {  // adjective predicate
    std::string szh, sja;
    Adjective a;
    if (draw(3) == 0) {
      auto s = subject();
      szh = s.first, sja = s.second;
      a = pick(kPersonAdjectives, draw(100));
    } else {
      const Topic& t = topics()[draw(topics().size())];
      szh = t.word.zh, sja = t.word.ja;
      a = t.adjectives[draw(t.adjectives.size())];
    }
    if (mood == 0) zh = szh + "很" + a.zh, ja = sja + "は" + a.ja + "です";
    if (mood == 1) zh = szh + a.zh_negative, ja = sja + "は" + a.ja_negative + "ないです";
    if (mood == 2) zh = szh + a.zh + "吗", ja = sja + "は" + a.ja + "ですか";
  } else {  // counting: S 有 N 个 O -> S は O を N つ 持っています
    auto [szh, sja] = subject();
    const Countable& c = pick(kCountables, draw(100));
    const uint64_t n = draw(9);
    const std::string counted_zh = std::string(kZhNumbers[n]) + c.zh_classifier + c.word.zh;
    const std::string ja_head = sja + "は" + c.word.ja + "を" + kJaNumbers[n] + c.ja_counter + "持っています";
    if (mood == 2) zh = szh + "有" + counted_zh + "吗", ja = ja_head + "か";
    else zh = szh + "有" + counted_zh, ja = ja_head;
  }
  return {zh, ja};
}

const std::vector<SentencePair>& zh_ja_checks() {
  static const std::vector<SentencePair> checks = {
      {"我是中国人", "私は中国人です"},
      {"我不是中国人", "私は中国人ではありません"},
      {"你是日本人吗", "あなたは日本人ですか"},
      {"她的妈妈是医生吗", "彼女のお母さんは医者ですか"},
      {"这本书很有意思", "この本は面白いです"},
      {"那本书没有意思", "あの本は面白くないです"},
      {"这部电影有意思吗", "この映画は面白いですか"},
      {"这部电影很有意思", "この映画は面白いです"},
      {"这本书不贵", "この本は高くないです"},
      {"今天的天气很好", "今日の天気はいいです"},
      {"今天的天气不冷", "今日の天気は寒くないです"},
      {"这辆车不贵", "この車は高くないです"},
      {"日语很难", "日本語は難しいです"},
      {"我的朋友很忙", "私の友達は忙しいです"},
      {"我喜欢猫", "私は猫が好きです"},
      {"他不喜欢咖啡", "彼はコーヒーが好きではありません"},
      {"她喜欢音乐吗", "彼女は音楽が好きですか"},
      {"我不喝咖啡", "私はコーヒーを飲みません"},
      {"他昨天吃了苹果", "彼は昨日りんごを食べました"},
      {"他昨天没吃苹果", "彼は昨日りんごを食べませんでした"},
      {"我们明天在图书馆学习日语", "私たちは明日図書館で日本語を勉強します"},
      {"他有三辆车", "彼は車を三台持っています"},
      {"我有两本书", "私は本を二冊持っています"},
      {"她有五个苹果吗", "彼女はりんごを五つ持っていますか"},
  };
  return checks;
}

std::vector<SentencePair> synth_zh_ja(int64_t count, uint64_t seed, const std::vector<SentencePair>& exclude) {
  // The grammar makes a few million distinct sentences at most; the bound
  // also keeps the give-up count below (50 per pair) far from overflowing.
  constexpr int64_t kMaxPairs = 10000000;
  QKV_CHECK(count >= 0 && count <= kMaxPairs, "synth-zh-ja: --pairs ", count, ": expected 0 to ", kMaxPairs);
  std::set<std::string> seen;
  for (auto& p : exclude) seen.insert(p.first);
  ZhJaGenerator gen(seed);
  std::vector<SentencePair> out;
  int64_t misses = 0;
  while ((int64_t)out.size() < count) {
    SentencePair p = gen.next();
    if (!seen.insert(p.first).second) {
      QKV_CHECK(++misses < 50 * count + 100000, "synth-zh-ja: the grammar cannot make ", count,
                " distinct sentences (got ", out.size(), ")");
      continue;
    }
    out.push_back(std::move(p));
  }
  return out;
}

}  // namespace qkv
