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
//
// The hard tier (ZhJaTier::Hard) adds, beside a fifth of easy sentences:
//   relative     我昨天买的书很有意思 -> 私が昨日買った本は面白いです
//   time_place   昨天我在图书馆看了书 -> 昨日、私は図書館で本を読みました (both orders)
//   counter      他买了二十三个苹果 -> 彼はりんごを二十三個買いました (つ below ten, 個 from ten)
//   comparative  这本书比那本书贵 -> この本はあの本より高いです / 没有 ... -> ほど ... くないです
//   aspect       我吃过饺子 -> 私は餃子を食べたことがあります; 他在看书 -> 彼は本を読んでいます
//   contrast     every topic with every adjective, 很 / 没有 / 吗
//   copy         names and figures carried over: 王小明有37本书 -> 王小明さんは本を37冊持っています
//   long         time, place and an object with its own relative clause:
//                昨天我在图书馆看了王明写的小说 -> 昨日、私は図書館で王明さんが書いた小説を読みました
#include <set>
#include <tuple>

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


// --- the hard tier's lexicon ---

// A verb with the Japanese forms the hard constructions need.
struct HardVerb {
  const char* zh;
  const char* ja_stem;  // 読み (+ ます)
  const char* ja_ta;    // 読んだ (relative clauses, 过)
  const char* ja_te;    // 読んで (在: progressive)
  std::vector<Word> objects;
};
const std::vector<HardVerb>& hard_verbs() {
  static const std::vector<HardVerb> v = {
      {"吃", "食べ", "食べた", "食べて",
       {{"苹果", "りんご"}, {"面包", "パン"}, {"米饭", "ご飯"}, {"鱼", "魚"}, {"蛋糕", "ケーキ"}, {"饺子", "餃子"},
        {"香蕉", "バナナ"}}},
      {"喝", "飲み", "飲んだ", "飲んで",
       {{"水", "水"}, {"茶", "お茶"}, {"咖啡", "コーヒー"}, {"牛奶", "牛乳"}, {"果汁", "ジュース"}, {"啤酒", "ビール"}}},
      {"看", "読み", "読んだ", "読んで",
       {{"书", "本"}, {"报纸", "新聞"}, {"杂志", "雑誌"}, {"小说", "小説"}, {"漫画", "漫画"}}},
      {"看", "見", "見た", "見て", {{"电影", "映画"}, {"电视", "テレビ"}, {"比赛", "試合"}, {"照片", "写真"}}},
      {"买", "買い", "買った", "買って",
       {{"书", "本"}, {"车", "車"}, {"衣服", "服"}, {"电脑", "パソコン"}, {"鞋", "靴"}, {"帽子", "帽子"}}},
      {"学习", "勉強し", "勉強した", "勉強して",
       {{"日语", "日本語"}, {"汉语", "中国語"}, {"英语", "英語"}, {"数学", "数学"}, {"历史", "歴史"},
        {"法语", "フランス語"}}},
      {"写", "書き", "書いた", "書いて", {{"信", "手紙"}, {"报告", "レポート"}, {"小说", "小説"}, {"日记", "日記"}}},
      {"做", "作り", "作った", "作って", {{"菜", "料理"}, {"蛋糕", "ケーキ"}, {"饺子", "餃子"}}},
      {"听", "聞き", "聞いた", "聞いて", {{"音乐", "音楽"}, {"广播", "ラジオ"}}},
  };
  return v;
}

const HardVerb* verb_with_stem(const std::string& ja_stem) {
  for (const HardVerb& h : hard_verbs())
    if (ja_stem == h.ja_stem) return &h;
  return nullptr;
}

const Adjective kDelicious{"好吃", "おいしい", "おいしく", "不好吃"}, kLong{"长", "長い", "長く", "不长"},
    kFar{"远", "遠い", "遠く", "不远"};

// Something made, bought or read, the adjectives it takes, and the verbs (by
// their Chinese and Japanese stem in hard_verbs) that make a relative clause of it.
struct RelativeNoun {
  Word word;
  std::vector<Adjective> adjectives;
  std::vector<const char*> ja_stems;
};
const std::vector<RelativeNoun>& relative_nouns() {
  static const std::vector<RelativeNoun> n = {
      {{"书", "本"}, {kInteresting, kExpensive, kCheap, kHard, kNew, kOld}, {"買い", "読み"}},
      {{"车", "車"}, {kExpensive, kCheap, kBig, kSmall, kNew, kOld}, {"買い"}},
      {{"衣服", "服"}, {kExpensive, kCheap, kNew, kBig, kSmall}, {"買い"}},
      {{"电影", "映画"}, {kInteresting, kNew, kOld, kGood, kLong}, {"見"}},
      {{"蛋糕", "ケーキ"}, {kBig, kSmall, kDelicious}, {"作り", "食べ"}},
      {{"菜", "料理"}, {kDelicious, kGood}, {"作り"}},
      {{"小说", "小説"}, {kInteresting, kLong, kHard}, {"書き", "読み"}},
      {{"报告", "レポート"}, {kLong, kHard, kGood}, {"書き"}},
  };
  return n;
}

const Word kHardPlaces[] = {{"学校", "学校"},     {"家", "家"},         {"图书馆", "図書館"}, {"东京", "東京"},
                            {"北京", "北京"},     {"公园", "公園"},     {"咖啡店", "喫茶店"}, {"公司", "会社"},
                            {"大学", "大学"},     {"超市", "スーパー"}, {"餐厅", "レストラン"}, {"上海", "上海"}};
struct Time {
  Word word;
  bool past;
};
const Time kHardTimes[] = {{{"今天", "今日"}, false},      {{"明天", "明日"}, false},  {{"每天", "毎日"}, false},
                           {{"下个星期", "来週"}, false}, {{"晚上", "夜"}, false},    {{"昨天", "昨日"}, true},
                           {{"上个星期", "先週"}, true},  {{"去年", "去年"}, true}};

// Topics for adjective predicates and comparisons, each with what it may be.
const std::vector<Topic>& hard_topics() {
  static const std::vector<Topic> t = {
      {{"这本书", "この本"}, {kInteresting, kExpensive, kCheap, kNew, kOld, kHard, kEasy, kBig, kSmall, kLong}},
      {{"那本书", "あの本"}, {kInteresting, kExpensive, kCheap, kNew, kOld, kHard, kEasy, kBig, kSmall, kLong}},
      {{"这辆车", "この車"}, {kBig, kSmall, kExpensive, kCheap, kNew, kOld, kGood}},
      {{"那辆车", "あの車"}, {kBig, kSmall, kExpensive, kCheap, kNew, kOld, kGood}},
      {{"这部电影", "この映画"}, {kInteresting, kNew, kOld, kGood, kLong}},
      {{"那部电影", "あの映画"}, {kInteresting, kNew, kOld, kGood, kLong}},
      {{"这家餐厅", "このレストラン"}, {kBig, kSmall, kNew, kOld, kGood, kExpensive, kCheap, kDelicious, kFar}},
      {{"那家餐厅", "あのレストラン"}, {kBig, kSmall, kNew, kOld, kGood, kExpensive, kCheap, kDelicious, kFar}},
      {{"日语", "日本語"}, {kHard, kEasy, kInteresting}},
      {{"汉语", "中国語"}, {kHard, kEasy, kInteresting}},
      {{"英语", "英語"}, {kHard, kEasy, kInteresting}},
      {{"今天", "今日"}, {kCold, kHot}},
      {{"昨天", "昨日"}, {kCold, kHot}},
      {{"学校", "学校"}, {kBig, kSmall, kNew, kOld, kFar}},
      {{"公园", "公園"}, {kBig, kSmall, kNew, kOld, kFar}},
  };
  return t;
}

// Comparable pairs: topics (indices into hard_topics) that share adjectives.
const std::pair<int, int> kComparable[] = {{0, 1}, {1, 0}, {2, 3}, {3, 2}, {4, 5}, {5, 4}, {6, 7}, {7, 6},
                                           {8, 9}, {9, 8}, {8, 10}, {10, 9}, {11, 12}, {12, 11}, {13, 14}, {14, 13}};

struct Counter {
  Word word;
  const char* zh_classifier;
  const char* ja_counter;        // from ten on, and always for everything but 个
  const char* ja_counter_small;  // below ten (一つ .. 九つ for 个)
};
const Counter kHardCountables[] = {
    {{"苹果", "りんご"}, "个", "個", "つ"},     {{"鸡蛋", "卵"}, "个", "個", "つ"},
    {{"蛋糕", "ケーキ"}, "个", "個", "つ"},     {{"书", "本"}, "本", "冊", "冊"},
    {{"杂志", "雑誌"}, "本", "冊", "冊"},       {{"词典", "辞書"}, "本", "冊", "冊"},
    {{"车", "車"}, "辆", "台", "台"},           {{"自行车", "自転車"}, "辆", "台", "台"},
    {{"电脑", "パソコン"}, "台", "台", "台"},   {{"猫", "猫"}, "只", "匹", "匹"},
    {{"狗", "犬"}, "只", "匹", "匹"}};

// 1..99 in Chinese characters as counted (两 alone for 2) and in Japanese kanji.
std::pair<std::string, std::string> numerals(int n) {
  static const char* digits[] = {"", "一", "二", "三", "四", "五", "六", "七", "八", "九"};
  std::string ja;
  if (n >= 20) ja += digits[n / 10];
  if (n >= 10) ja += "十";
  ja += digits[n % 10];
  return {n == 2 ? std::string("两") : ja, ja};
}

// Names written alike in simplified Chinese and Japanese, so copying them is right.
const char* kSurnames[] = {"王", "李", "林", "高", "周", "何", "朱", "胡", "郭", "黄",
                           "徐", "金", "石", "宋", "田", "白", "方", "安", "江", "古"};
const char* kGivenNames[] = {"小明", "明", "芳", "静", "平", "秀英", "文", "正", "光", "春",
                             "雪", "月", "花", "友", "美", "英", "一", "和", "海", "山"};
}  // namespace

ZhJaGenerator::ZhJaGenerator(uint64_t seed, ZhJaTier tier) : state_(mix64(seed ^ 0x7a686a61)), tier_(tier) {}

uint64_t ZhJaGenerator::draw(uint64_t n) { return mix64(state_++) % n; }

template <class T, size_t N>
static const T& pick(const T (&arr)[N], uint64_t i) {
  return arr[i % N];
}

// The subject: a person, sometimes someone's relation (possessive).
std::pair<std::string, std::string> ZhJaGenerator::subject() {
  if (draw(4) == 0) {
    const Word& owner = pick(kPossessors, draw(100));
    const Word& rel = pick(kRelations, draw(100));
    return {std::string(owner.zh) + "的" + rel.zh, std::string(owner.ja) + "の" + rel.ja};
  }
  const Word& w = pick(kPronouns, draw(100));
  return {w.zh, w.ja};
}

SentencePair ZhJaGenerator::next(std::string* category) {
  std::string ignored;
  return tier_ == ZhJaTier::Hard ? hard(category ? *category : ignored) : easy(category ? *category : ignored);
}

SentencePair ZhJaGenerator::easy(std::string& category) {
  std::string zh, ja;
  const uint64_t kind = draw(100);
  const uint64_t mood = draw(3);  // 0 affirmative, 1 negative, 2 question
  if (kind < 25) {  // copula
    category = "copula";
    auto [szh, sja] = subject();
    const Word& pred = draw(2) ? pick(kNationalities, draw(100)) : pick(kOccupations, draw(100));
    if (mood == 0) zh = szh + "是" + pred.zh, ja = sja + "は" + pred.ja + "です";
    if (mood == 1) zh = szh + "不是" + pred.zh, ja = sja + "は" + pred.ja + "ではありません";
    if (mood == 2) zh = szh + "是" + pred.zh + "吗", ja = sja + "は" + pred.ja + "ですか";
  } else if (kind < 60) {  // transitive verb, SVO -> SOV
    category = "verb";
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
    category = "like";
    auto [szh, sja] = subject();
    const Word& o = pick(kLikes, draw(100));
    if (mood == 0) zh = szh + "喜欢" + o.zh, ja = sja + "は" + o.ja + "が好きです";
    if (mood == 1) zh = szh + "不喜欢" + o.zh, ja = sja + "は" + o.ja + "が好きではありません";
    if (mood == 2) zh = szh + "喜欢" + o.zh + "吗", ja = sja + "は" + o.ja + "が好きですか";
  } else if (kind < 90) {  // adjective predicate
    category = "adjective";
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
    category = "counting";
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

// An adjective predicate in one of three moods: 很 A / not A / A 吗.
static void adjective_predicate(const std::string& zh_topic, const std::string& ja_topic, const Adjective& a,
                                uint64_t mood, std::string& zh, std::string& ja) {
  if (mood == 0) zh = zh_topic + "很" + a.zh, ja = ja_topic + "は" + a.ja + "です";
  if (mood == 1) zh = zh_topic + a.zh_negative, ja = ja_topic + "は" + a.ja_negative + "ないです";
  if (mood == 2) zh = zh_topic + a.zh + "吗", ja = ja_topic + "は" + a.ja + "ですか";
}

SentencePair ZhJaGenerator::hard(std::string& category) {
  const uint64_t kind = draw(100);
  if (kind < 20) return easy(category);
  const uint64_t mood = draw(3);  // 0 affirmative, 1 negative, 2 question
  std::string zh, ja;
  // [time] S [time] 在 place V O: the time before the subject (T、S は) or
  // after it; the negation before 在 (我昨天没在图书馆看书); past times take 了.
  auto time_place_sentence = [&](const HardVerb& v, const std::string& object_zh, const std::string& object_ja) {
    auto [szh, sja] = subject();
    const Time& t = pick(kHardTimes, draw(100));
    const Word& p = pick(kHardPlaces, draw(100));
    const bool fronted = draw(2) == 0;
    static const char* kPast[] = {"ました", "ませんでした", "ましたか"};
    static const char* kPresent[] = {"ます", "ません", "ますか"};
    zh = (fronted ? t.word.zh + szh : szh + t.word.zh) + (mood == 1 ? (t.past ? "没" : "不") : "") + "在" + p.zh +
         v.zh + (t.past && mood != 1 ? "了" : "") + object_zh + (mood == 2 ? "吗" : "");
    ja = (fronted ? std::string(t.word.ja) + "、" + sja + "は" : sja + "は" + t.word.ja) + p.ja + "で" + object_ja +
         "を" + v.ja_stem + (t.past ? kPast : kPresent)[mood];
  };
  if (kind < 32) {  // a relative clause: [S V-ed] O is A
    category = "relative";
    const RelativeNoun& n = relative_nouns()[draw(relative_nouns().size())];
    const HardVerb* v = verb_with_stem(n.ja_stems[draw(n.ja_stems.size())]);
    auto [szh, sja] = subject();
    std::string tzh, tja;
    if (const uint64_t t = draw(4); t == 1) tzh = "昨天", tja = "昨日";
    else if (t == 2) tzh = "上个星期", tja = "先週";
    const Adjective& a = n.adjectives[draw(n.adjectives.size())];
    adjective_predicate(szh + tzh + v->zh + "的" + n.word.zh, sja + "が" + tja + v->ja_ta + n.word.ja, a, mood, zh, ja);
  } else if (kind < 44) {  // time and place, the time before or after the subject
    category = "time_place";
    const HardVerb& v = hard_verbs()[draw(hard_verbs().size())];
    const Word& o = v.objects[draw(v.objects.size())];
    time_place_sentence(v, o.zh, o.ja);
  } else if (kind < 54) {  // counted things, 1 to 99: 个 is つ below ten and 個 from ten
    category = "counter";
    auto [szh, sja] = subject();
    const Counter& c = pick(kHardCountables, draw(100));
    const int n = draw(2) ? 1 + (int)draw(9) : 10 + (int)draw(90);
    auto [nzh, nja] = numerals(n);
    const std::string counted_ja = std::string(c.word.ja) + "を" + nja + (n < 10 ? c.ja_counter_small : c.ja_counter);
    const bool bought = draw(2) == 0;
    zh = szh + (bought ? "买了" : "有") + nzh + c.zh_classifier + c.word.zh;
    ja = sja + "は" + counted_ja + (bought ? "買いました" : "持っています");
    if (mood == 2) zh += "吗", ja += "か";
  } else if (kind < 62) {  // comparison: X 比 Y A / X 没有 Y A
    category = "comparative";
    std::string xzh, xja, yzh, yja;
    Adjective a;
    if (draw(3) == 0) {  // two people
      const uint64_t i = draw(std::size(kPronouns)), j = (i + 1 + draw(std::size(kPronouns) - 1)) % std::size(kPronouns);
      xzh = kPronouns[i].zh, xja = kPronouns[i].ja, yzh = kPronouns[j].zh, yja = kPronouns[j].ja;
      a = pick(kPersonAdjectives, draw(100));
    } else {
      auto [i, j] = pick(kComparable, draw(100));
      const Topic &x = hard_topics()[i], &y = hard_topics()[j];
      xzh = x.word.zh, xja = x.word.ja, yzh = y.word.zh, yja = y.word.ja;
      a = x.adjectives[draw(x.adjectives.size())];
    }
    if (mood == 0) zh = xzh + "比" + yzh + a.zh, ja = xja + "は" + yja + "より" + a.ja + "です";
    if (mood == 1) zh = xzh + "没有" + yzh + a.zh, ja = xja + "は" + yja + "ほど" + a.ja_negative + "ないです";
    if (mood == 2) zh = xzh + "比" + yzh + a.zh + "吗", ja = xja + "は" + yja + "より" + a.ja + "ですか";
  } else if (kind < 72) {  // aspect: 过 (have done) and 在 (doing now)
    category = "aspect";
    auto [szh, sja] = subject();
    const HardVerb& v = hard_verbs()[draw(hard_verbs().size())];
    const Word& o = v.objects[draw(v.objects.size())];
    if (draw(2) == 0) {
      static const char* kEndings[] = {"ことがあります", "ことがありません", "ことがありますか"};
      zh = szh + (mood == 1 ? "没" : "") + v.zh + "过" + o.zh;
      ja = sja + "は" + o.ja + "を" + v.ja_ta + kEndings[mood];
    } else {
      static const char* kEndings[] = {"います", "いません", "いますか"};
      zh = szh + (mood == 1 ? "没在" : "在") + v.zh + o.zh;
      ja = sja + "は" + o.ja + "を" + v.ja_te + kEndings[mood];
    }
    if (mood == 2) zh += "吗";
  } else if (kind < 78) {  // every topic with every adjective it takes, in the three moods
    category = "contrast";
    const Topic& t = hard_topics()[draw(hard_topics().size())];
    adjective_predicate(t.word.zh, t.word.ja, t.adjectives[draw(t.adjectives.size())], mood, zh, ja);
  } else if (kind < 88) {  // names and figures the model must carry over
    category = "copy";
    const std::string name = std::string(pick(kSurnames, draw(100))) + pick(kGivenNames, draw(100));
    const std::string name_ja = name + "さん";
    const uint64_t frame = draw(3);
    if (frame == 0) {
      const Word& pred = draw(2) ? pick(kNationalities, draw(100)) : pick(kOccupations, draw(100));
      if (mood == 0) zh = name + "是" + pred.zh, ja = name_ja + "は" + pred.ja + "です";
      if (mood == 1) zh = name + "不是" + pred.zh, ja = name_ja + "は" + pred.ja + "ではありません";
      if (mood == 2) zh = name + "是" + pred.zh + "吗", ja = name_ja + "は" + pred.ja + "ですか";
    } else if (frame == 1) {
      const std::string age = std::to_string(5 + draw(86));
      zh = name + "今年" + age + "岁", ja = name_ja + "は今年" + age + "歳です";
      if (mood == 2) zh += "吗", ja += "か";
    } else {
      const Counter& c = pick(kHardCountables, draw(100));
      const uint64_t n = 2 + draw(998);
      zh = name + "有" + std::to_string(n) + c.zh_classifier + c.word.zh;
      ja = name_ja + "は" + c.word.ja + "を" + std::to_string(n) + (n < 10 ? c.ja_counter_small : c.ja_counter) +
           "持っています";
      if (mood == 2) zh += "吗", ja += "か";
    }
  } else {  // long: time, place, and an object with a relative clause of its own
    category = "long";
    const RelativeNoun& n = relative_nouns()[draw(relative_nouns().size())];
    const HardVerb* rel = verb_with_stem(n.ja_stems[draw(n.ja_stems.size())]);
    std::vector<const HardVerb*> takers;  // main verbs that take the noun
    for (const HardVerb& h : hard_verbs())
      for (const Word& o : h.objects)
        if (std::string(o.zh) == n.word.zh) takers.push_back(&h);
    const HardVerb& v = *takers[draw(takers.size())];
    std::string rzh, rja;  // whose it is: a person, or a name to copy
    if (draw(2) == 0) {
      rzh = std::string(pick(kSurnames, draw(100))) + pick(kGivenNames, draw(100)), rja = rzh + "さん";
    } else {
      std::tie(rzh, rja) = subject();
    }
    time_place_sentence(v, rzh + rel->zh + "的" + n.word.zh, rja + "が" + rel->ja_ta + n.word.ja);
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

namespace {

// The generator's pairs in order, skipping those whose source is in `exclude`
// and, when `distinct`, those already drawn.
std::vector<SentencePair> draw_zh_ja(int64_t count, uint64_t seed, const std::vector<SentencePair>& exclude,
                                     ZhJaTier tier, bool distinct, std::vector<std::string>* categories) {
  // The grammar makes a few million distinct sentences at most; the bound
  // also keeps the give-up count below (50 per pair) far from overflowing.
  constexpr int64_t kMaxPairs = 10000000;
  QKV_CHECK(count >= 0 && count <= kMaxPairs, "synth-zh-ja: --pairs ", count, ": expected 0 to ", kMaxPairs);
  std::set<std::string> seen;
  for (auto& p : exclude) seen.insert(p.first);
  ZhJaGenerator gen(seed, tier);
  if (categories) categories->clear();
  std::string category;
  std::vector<SentencePair> out;
  int64_t misses = 0;
  while ((int64_t)out.size() < count) {
    SentencePair p = gen.next(&category);
    const bool skip = distinct ? !seen.insert(p.first).second : seen.count(p.first) > 0;
    if (skip) {
      QKV_CHECK(++misses < 50 * count + 100000, "synth-zh-ja: the grammar cannot make ", count,
                distinct ? " distinct sentences" : " sentences outside the excluded ones", " (got ", out.size(), ")");
      continue;
    }
    out.push_back(std::move(p));
    if (categories) categories->push_back(category);
  }
  return out;
}

}  // namespace

std::vector<SentencePair> synth_zh_ja(int64_t count, uint64_t seed, const std::vector<SentencePair>& exclude,
                                      ZhJaTier tier, std::vector<std::string>* categories) {
  return draw_zh_ja(count, seed, exclude, tier, /*distinct=*/true, categories);
}

std::vector<SentencePair> sample_zh_ja(int64_t count, uint64_t seed, const std::vector<SentencePair>& exclude,
                                       ZhJaTier tier, std::vector<std::string>* categories) {
  return draw_zh_ja(count, seed, exclude, tier, /*distinct=*/false, categories);
}

}  // namespace qkv
