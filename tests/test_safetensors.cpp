// safetensors: round trips, files from Python, and every malformed case the
// reader must reject with its own clear message.
#include <dirent.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <filesystem>

#include "qkv/io.h"
#include "qkv/ops.h"
#include "tests/test_util.h"

namespace qkv {
namespace {

using testing::all_close;

// 8-byte length + header + data.
std::string file_bytes(const std::string& header, const std::string& data, int64_t header_len = -1) {
  uint64_t n = header_len < 0 ? header.size() : (uint64_t)header_len;
  std::string out(8, '\0');
  std::memcpy(out.data(), &n, 8);
  return out + header + data;
}

TEST(Safetensors, RoundTripEveryDType) {
  std::string dir = testing::temp_dir("test");
  Tensor f32 = Tensor::from_vector({0, 1, 2, 3, 4, 5}, {2, 3});
  std::vector<std::pair<std::string, Tensor>> tensors = {
      {"a.weight", f32.transpose(0, 1)},  // non-contiguous: written contiguous
      {"half", f32.to(DType::F16)},
      {"bf", f32.to(DType::BF16)},
      {"ids", Tensor::from_ints({-1, 1ll << 40}, {2})},
      {"i32", Tensor::from_ints({7, -7}, {2}).to(DType::I32)},
      {"int8", Tensor::from_ints({-128, 127}, {2}).to(DType::I8)},
      {"bytes", Tensor::from_ints({0, 255}, {2}).to(DType::U8)},
      {"empty", Tensor::zeros({0, 3})},
      {"scalar", Tensor::scalar(2.5f)},
  };
  save_safetensors(dir + "/m.safetensors", tensors, {{"format", "pt"}, {"note", "héllo"}});
  SafetensorsFile f = load_safetensors(dir + "/m.safetensors");
  ASSERT_EQ(f.tensors.size(), tensors.size());
  EXPECT_EQ(f.metadata.at("note"), "héllo");
  for (auto& [name, t] : tensors) {
    const Tensor* got = f.find(name);
    ASSERT_NE(got, nullptr) << name;
    EXPECT_EQ(got->dtype(), t.dtype()) << name;
    EXPECT_EQ(got->shape(), t.shape()) << name;
    EXPECT_TRUE(all_close(*got, t, 0, 0)) << name;
  }
  // Nothing but the file itself is left in the folder.
  DIR* d = opendir(dir.c_str());
  int entries = 0;
  while (dirent* e = readdir(d)) entries += e->d_name[0] != '.';
  closedir(d);
  EXPECT_EQ(entries, 1);
}

TEST(Safetensors, ReadsFilesWrittenByPython) {
  SafetensorsFile f = load_safetensors(testing::fixture("python_written_np.safetensors"));
  EXPECT_EQ(f.metadata.at("source"), "numpy");
  EXPECT_EQ(f.find("f32")->to_vector(), (std::vector<float>{0, 0.25, 0.5, 0.75, 1.0, 1.25}));
  EXPECT_EQ(f.find("f16")->to_vector(), (std::vector<float>{1.5, -2.25, 65504.0}));
  EXPECT_EQ(f.find("i64")->to_ints(), (std::vector<int64_t>{-3, 1ll << 40}));
  EXPECT_EQ(f.find("i32")->to_ints(), (std::vector<int64_t>{7, -8}));
  EXPECT_EQ(f.find("i8")->dtype(), DType::I8);
  EXPECT_EQ(f.find("i8")->to_ints(), (std::vector<int64_t>{-128, 127}));
  EXPECT_EQ(f.find("u8")->to_ints(), (std::vector<int64_t>{0, 255}));
  EXPECT_EQ(f.find("empty")->shape(), (Shape{0, 4}));
  SafetensorsFile b = load_safetensors(testing::fixture("python_written_bf16.safetensors"));
  EXPECT_EQ(b.find("bf16")->dtype(), DType::BF16);
  EXPECT_EQ(b.find("bf16")->to_vector(), (std::vector<float>{1.0, -0.5, 3.140625}));
}

// For scripts/make_fixtures.py --check-qkv-file: Python loads what qkv writes.
TEST(Safetensors, WritesFileForPythonCheck) {
  const char* out = std::getenv("QKV_INTEROP_OUT");
  std::string path = out ? out : testing::temp_dir("test") + "/qkv_written.safetensors";
  save_safetensors(path, std::vector<std::pair<std::string, Tensor>>{
                             {"weight", scale(Tensor::arange(6), 0.5f).reshape({2, 3})},
                             {"ids", Tensor::from_ints({1, 2, 3}, {3})}});
  EXPECT_EQ(load_safetensors(path).find("weight")->to_vector(), (std::vector<float>{0, 0.5, 1, 1.5, 2, 2.5}));
}

struct Malformed {
  std::string name;
  std::string bytes;
  std::string message;  // expected substring of the error
};

void PrintTo(const Malformed& c, std::ostream* os) { *os << c.name; }

std::vector<Malformed> malformed_cases() {
  const std::string f32x2 = R"({"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  const std::string eight(8, '\0');
  return {
      {"shorter_than_8_bytes", "abc", "file is 3 bytes, shorter than the 8-byte header length"},
      {"header_past_end", file_bytes("{}", "", 1000), "header length 1000 runs past the end of the file"},
      {"header_over_100mb", file_bytes("{}", "", 200000000), "header length 200000000 exceeds the limit"},
      {"header_not_utf8", file_bytes("{\"a\xff\":1}", ""), "header is not valid UTF-8"},
      {"header_not_json", file_bytes("{not json", ""), "header is not valid JSON"},
      {"header_not_object", file_bytes("[1,2]", ""), "header is not a JSON object"},
      // Refused before anything walks it (a copy recursed once a level; 60,000 ran out of stack).
      {"header_nested_too_deep", file_bytes(std::string(100000, '[') + std::string(100000, ']'), ""),
       "header nested deeper than 256 levels"},
      {"entry_not_object", file_bytes(R"({"w":5})", ""), "tensor 'w': entry is not an object"},
      {"missing_offsets", file_bytes(R"({"w":{"dtype":"F32","shape":[2]}})", eight), "data_offsets must be"},
      {"unknown_field", file_bytes(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}})", eight),
       "unknown field 'x'"},
      {"unknown_dtype", file_bytes(R"({"w":{"dtype":"F8_E4M3","shape":[2],"data_offsets":[0,2]}})", "ab"),
       "unsupported dtype 'F8_E4M3'"},
      {"negative_shape", file_bytes(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,0]}})", ""),
       "has a negative size"},
      {"overflowing_shape",
       file_bytes(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,0]}})", ""),
       "overflows"},
      {"offsets_overlap", file_bytes(R"({"a":)" + f32x2 + R"(,"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                                     std::string(12, '\0')),
       "overlaps the tensor before it"},
      {"offsets_gap", file_bytes(R"({"a":)" + f32x2 + R"(,"b":{"dtype":"F32","shape":[2],"data_offsets":[12,20]}})",
                                 std::string(20, '\0')),
       "gap of 4 bytes"},
      {"offsets_past_end", file_bytes(R"({"a":)" + f32x2 + "}", "abcd"), "run past the end of the data (4 bytes)"},
      {"offsets_disagree_with_shape", file_bytes(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", eight),
       "hold 8 bytes, shape [3] x F32 needs 12"},
      {"offsets_reversed", file_bytes(R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", eight),
       "end before they begin"},
      {"duplicate_names", file_bytes(R"({"a":)" + f32x2 + R"(,"a":)" + f32x2 + "}", eight), "'a' appears twice"},
      {"duplicate_field",
       file_bytes(R"({"a":{"dtype":"F32","shape":[2],"dtype":"F32","data_offsets":[0,8]}})", eight),
       "key 'dtype' appears twice"},
      {"trailing_bytes", file_bytes(R"({"a":)" + f32x2 + "}", std::string(12, '\0')), "4 trailing bytes"},
      {"metadata_not_strings", file_bytes(R"({"__metadata__":{"k":1}})", ""), "__metadata__ value for 'k'"},
      // No elements, but its strides would overflow int64.
      {"empty_but_huge", file_bytes(R"({"a":{"dtype":"F32","shape":[0,4611686018427387904,4],"data_offsets":[0,0]}})", ""),
       "overflows"},
  };
}

class MalformedSafetensors : public ::testing::TestWithParam<Malformed> {};

TEST_P(MalformedSafetensors, RejectedWithClearError) {
  const Malformed& c = GetParam();
  std::string path = testing::temp_dir("test") + "/" + c.name + ".safetensors";
  std::ofstream(path, std::ios::binary) << c.bytes;
  try {
    load_safetensors(path);
    FAIL() << "loaded a malformed file";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find(c.message), std::string::npos) << msg;
    EXPECT_NE(msg.find(path), std::string::npos) << "error does not name the file: " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "error is not one line: " << msg;
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, MalformedSafetensors, ::testing::ValuesIn(malformed_cases()),
                         [](const ::testing::TestParamInfo<Malformed>& info) { return info.param.name; });

TEST(Safetensors, MissingFileIsAClearError) {
  try {
    load_safetensors("/nonexistent/dir/model.safetensors");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/dir/model.safetensors: cannot open"), std::string::npos)
        << e.what();
  }
}

TEST(Safetensors, FailedSaveLeavesPreviousFileIntact) {
  std::string dir = testing::temp_dir("test"), path = dir + "/m.safetensors";
  Tensor a = Tensor::ones({3});
  save_safetensors(path, std::vector<std::pair<std::string, Tensor>>{{"a", a}});
  // A save that fails (a name given twice) must not touch the existing file.
  EXPECT_THROW(save_safetensors(path, std::vector<std::pair<std::string, Tensor>>{{"b", a}, {"b", a}}), Error);
  EXPECT_TRUE(load_safetensors(path).find("a") != nullptr);
  EXPECT_THROW(save_safetensors(dir + "/no/such/dir/m.safetensors", std::map<std::string, Tensor>{{"a", a}}), Error);
}

// save_safetensors writes the header and then each tensor straight into the
// file (never the whole file in memory): the bytes are serialize_safetensors'
// exactly, strided tensors included; and a write that fails part way (here a
// meta tensor, which has no values to write) leaves the file as it was and no
// temporary file beside it.
TEST(Safetensors, SavingStreamsTheSameBytesAndAFailureLeavesTheFile) {
  const std::string dir = testing::temp_dir("test"), path = dir + "/m.safetensors";
  Rng rng(3);
  const Tensor strided = Tensor::randn({4, 6}, rng).transpose(0, 1);
  const std::vector<std::pair<std::string, Tensor>> tensors = {
      {"w", strided}, {"b", Tensor::randn({5}, rng).to(DType::BF16)}, {"ids", Tensor::from_ints({1, 2, 3}, {3})}};
  save_safetensors(path, tensors, {{"format", "qkv"}});
  EXPECT_EQ(read_file(path), serialize_safetensors(tensors, {{"format", "qkv"}}));
  const std::string before = read_file(path);
  Tensor meta;
  {
    DefaultDeviceGuard on_meta(Device::Meta);
    meta = Tensor::empty({2});
  }
  EXPECT_THROW(save_safetensors(path, std::vector<std::pair<std::string, Tensor>>{{"a", Tensor::ones({2})}, {"m", meta}}),
               Error);
  EXPECT_EQ(read_file(path), before);
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) files += entry.is_regular_file();
  EXPECT_EQ(files, 1) << "a temporary file was left behind";
}

TEST(Safetensors, WrittenHeaderIsAligned) {
  std::string bytes = serialize_safetensors({{"x", Tensor::ones({3})}}, {});
  uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ((8 + n) % 8, 0u);
  EXPECT_EQ(bytes.size(), 8 + n + 12);
}

}  // namespace
}  // namespace qkv

#include <signal.h>
#include <sys/wait.h>

#include <thread>

namespace qkv {
namespace {

// Found by the trainer-state fuzzer: bytes that are not UTF-8 in a name or in
// metadata made the writer throw the JSON library's exception ("internal error").
TEST(Safetensors, WritingNamesOrMetadataThatAreNotUtf8IsAnError) {
  const Tensor t = Tensor::full({1}, 1.0f);
  EXPECT_NE(testing::error_of([&] { serialize_safetensors({{"w", t}}, {{"history", "[\xff"}}); }).find("not valid UTF-8"),
            std::string::npos);
  EXPECT_NE(testing::error_of([&] { serialize_safetensors({{"w\xfe", t}}, {}); }).find("not valid UTF-8"),
            std::string::npos);
}

// 100k tensors written and read back, names and order intact. Reading took
// 305 s (Zen 3) when the header parse was quadratic in the tensor count; it is
// linear now, well under a second here.
TEST(Safetensors, ManyTensorsRoundTrip) {
  // (Names built by appending: GCC 12 warns falsely on "t" + std::to_string(i).)
  auto name = [](int i) { return std::string("t").append(std::to_string(i)); };
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (int i = 0; i < 100000; ++i) tensors.emplace_back(name(i), Tensor::full({1}, (float)i));
  SafetensorsFile f = parse_safetensors(serialize_safetensors(tensors, {{"k", "v"}}), "many");
  ASSERT_EQ(f.tensors.size(), tensors.size());
  std::map<std::string, float> got;
  for (auto& [name, t] : f.tensors) got[name] = t.to_vector()[0];
  ASSERT_EQ(got.size(), tensors.size());
  for (int i = 0; i < 100000; i += 997) EXPECT_EQ(got[name(i)], (float)i);
  EXPECT_EQ(f.metadata.at("k"), "v");
}

// A save killed before its rename leaves "<file>.tmp-<host>-<pid>-XXXXXX";
// the next save of that file removes it, and only it: not one whose writer
// still runs, nor one written on another host.
TEST(WriteFileAtomic, RemovesTemporariesOfDeadWritersOnly) {
  const std::string dir = testing::temp_dir("stale");
  char host[256] = {};
  ASSERT_EQ(gethostname(host, sizeof host - 1), 0);
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) _exit(0);
  waitpid(child, nullptr, 0);  // a process id that no longer runs
  const std::string base = dir + "/model.safetensors.tmp-";
  const std::string dead = base + host + "-" + std::to_string(child) + "-a1b2c3";
  const std::string alive = base + host + "-" + std::to_string(getppid()) + "-d4e5f6";
  const std::string elsewhere = base + "another-host-" + std::to_string(child) + "-g7h8i9";
  const std::string other_file = dir + "/config.json.tmp-" + host + "-" + std::to_string(child) + "-j0k1l2";
  for (const std::string& p : {dead, alive, elsewhere, other_file}) write_file_atomic(p, "partial");
  write_file_atomic(dir + "/model.safetensors", "whole");
  EXPECT_FALSE(std::filesystem::exists(dead));
  EXPECT_TRUE(std::filesystem::exists(alive));
  EXPECT_TRUE(std::filesystem::exists(elsewhere));
  EXPECT_TRUE(std::filesystem::exists(other_file));
  EXPECT_EQ(read_file(dir + "/model.safetensors"), "whole");
}

// A process killed while saving (again and again) leaves a file that loads,
// whole: either the previous checkpoint or the new one, never a mix.
TEST(Safetensors, KillDuringSaveLeavesALoadableCheckpoint) {
  std::string path = testing::temp_dir("test") + "/ckpt.safetensors";
  save_safetensors(path, std::vector<std::pair<std::string, Tensor>>{{"w", Tensor::full({1 << 20}, -1.0f)}});
  for (int round = 0; round < 5; ++round) {
    pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      for (int k = 0;; ++k) {
        save_safetensors(path, std::vector<std::pair<std::string, Tensor>>{
                                   {"w", Tensor::full({1 << 20}, (float)k)}, {"step", Tensor::from_ints({k}, {1})}});
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20 + 15 * round));
    kill(child, SIGKILL);
    int status = 0;
    waitpid(child, &status, 0);
    SafetensorsFile f = load_safetensors(path);
    std::vector<float> w = f.find("w")->to_vector();
    for (float v : w) ASSERT_EQ(v, w[0]) << "a mix of two saves";
    if (const Tensor* step = f.find("step")) {
      EXPECT_EQ(step->to_ints()[0], (int64_t)w[0]);
    }
  }
}

}  // namespace
}  // namespace qkv
