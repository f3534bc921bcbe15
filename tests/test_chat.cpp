// Chat formats (qkv/chat.h): a folder's template run by qkv's Jinja (the
// prompt transformers renders), a template's family recognized by its
// markers where the interpreter cannot run it, each format's layout written
// exactly, and the errors for a message order no format can write.
#include <filesystem>

#include <algorithm>

#include "qkv/chat.h"
#include "qkv/utf8.h"
#include "qkv/checkpoint.h"
#include "qkv/io.h"
#include "tests/test_util.h"

namespace qkv {
namespace {

const std::vector<ChatMessage> kTalk = {{"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello."},
                                        {"user", "我是中国人"}};

TEST(Chat, TemplatesAreKnownByTheirMarkers) {
  EXPECT_EQ(chat_format_of_template("{% for m in messages %}<|im_start|>{{ m.role }}\n{% endfor %}"), ChatFormat::ChatML);
  EXPECT_EQ(chat_format_of_template("{{ bos_token }}<|start_header_id|>{{ role }}<|end_header_id|>{{ c }}<|eot_id|>"),
            ChatFormat::Llama3);
  EXPECT_EQ(chat_format_of_template("[INST] <<SYS>>\n{{ s }}\n<</SYS>>\n\n{{ u }} [/INST]"), ChatFormat::Llama2);
  EXPECT_EQ(chat_format_of_template("{{ bos_token }}[INST] {{ u }} [/INST]"), ChatFormat::Mistral);
  EXPECT_EQ(testing::error_of([] { chat_format_of_template("<start_of_turn>user"); }),
            "the chat template is none of the formats qkv writes (chatml, llama3, llama2, mistral)");
}

TEST(Chat, EachFormatWritesItsLayout) {
  EXPECT_EQ(format_chat(ChatFormat::ChatML, kTalk),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello."
            "<|im_end|>\n<|im_start|>user\n我是中国人<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(format_chat(ChatFormat::Llama3, kTalk),
            "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|><|start_header_id|>user<|end_header_id|>"
            "\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|><|start_header_id|>user"
            "<|end_header_id|>\n\n我是中国人<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(format_chat(ChatFormat::Llama2, kTalk),
            "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST] Hello. </s><s>[INST] 我是中国人 [/INST]");
  EXPECT_EQ(format_chat(ChatFormat::Mistral, kTalk), "[INST] Be brief.\n\nHi [/INST]Hello.</s>[INST] 我是中国人 [/INST]");
  EXPECT_EQ(format_chat(ChatFormat::Mistral, {{"user", "Hi"}}), "[INST] Hi [/INST]");
  EXPECT_STREQ(chat_end_of_turn(ChatFormat::ChatML), "<|im_end|>");
  EXPECT_STREQ(chat_end_of_turn(ChatFormat::Llama3), "<|eot_id|>");
}

TEST(Chat, MessagesInAnOrderNoFormatWritesAreErrors) {
  auto error = [](std::vector<ChatMessage> m) {
    return testing::error_of([&] { format_chat(ChatFormat::ChatML, m); });
  };
  EXPECT_EQ(error({}), "messages: at least one message is needed");
  EXPECT_EQ(error({{"system", "s"}}), "messages: a system message alone leaves nothing to answer");
  EXPECT_EQ(error({{"user", "a"}, {"bot", "b"}}), "messages[1]: role 'bot' is none of system, user, assistant");
  EXPECT_EQ(error({{"user", "a"}, {"system", "b"}}), "messages[1]: a system message may only come first");
  EXPECT_EQ(error({{"user", "a"}, {"user", "b"}}),
            "messages[1]: expected a message from the assistant (user and assistant take turns)");
  EXPECT_EQ(error({{"user", "a"}, {"assistant", "b"}}), "messages: the last message must be the user's");
  EXPECT_EQ(testing::error_of([] { format_chat(ChatFormat::None, {{"user", "a"}}); }),
            "the model's folder defines no chat format");
}

// The markers are the tokenizer's special tokens: in the qwen2 fixture's
// tokenizer.json (Hugging Face's byte-level BPE with <|im_start|> and
// <|im_end|> added), the ChatML text of a conversation encodes each marker
// as its one id, which is what the server stops at.
TEST(Chat, ChatMLMarkersAreTheTokenizersSpecialTokens) {
  const ModelFolder m = load_model_folder(std::string(QKV_FIXTURES_DIR) + "/hf/qwen2");
  const std::vector<int64_t> start = m.tokenizer->encode("<|im_start|>"), end = m.tokenizer->encode("<|im_end|>");
  ASSERT_EQ(start.size(), 1u);
  ASSERT_EQ(end.size(), 1u);
  const std::vector<int64_t> ids = m.tokenizer->encode(format_chat(ChatFormat::ChatML, kTalk));
  EXPECT_EQ(std::count(ids.begin(), ids.end(), start[0]), 5);  // four messages and the answer's
  EXPECT_EQ(std::count(ids.begin(), ids.end(), end[0]), 4);
  EXPECT_EQ(m.tokenizer->decode(ids).find("<|im_start|>"), std::string::npos);  // specials are skipped in text
}

TEST(Chat, AFolderSaysItsFormatInEitherFile) {
  const std::string dir = testing::temp_dir("chat");
  EXPECT_EQ(chat_format_of_folder(dir), ChatFormat::None);
  write_file_atomic(dir + "/tokenizer_config.json", R"({"chat_template": null})");
  EXPECT_EQ(chat_format_of_folder(dir), ChatFormat::None);
  write_file_atomic(
      dir + "/tokenizer_config.json",
      R"({"chat_template": [{"name": "tool_use", "template": "[INST]"}, {"name": "default", "template": "<|im_start|>{{ messages[0].content }}"}]})");
  ChatTemplate t = chat_template_of_folder(dir);
  EXPECT_EQ(t.format, ChatFormat::Template);
  EXPECT_EQ(format_chat(t, {{"user", "hi"}}), "<|im_start|>hi");
  EXPECT_EQ(t.end_of_turn, "<|im_end|>");  // its markers say ChatML
  write_file_atomic(dir + "/tokenizer_config.json", R"({"chat_template": 3})");
  EXPECT_EQ(testing::error_of([&] { chat_format_of_folder(dir); }),
            dir + "/tokenizer_config.json: chat_template must be a string or a list of {\"name\", \"template\"}");
  // A broken tokenizer_config.json is one error naming it (parse_json's checks).
  const std::string config = dir + "/tokenizer_config.json";
  write_file_atomic(config, "{\"chat_template\": ");
  EXPECT_EQ(testing::error_of([&] { chat_format_of_folder(dir); }).rfind(config + ": not valid JSON (", 0), 0u);
  write_file_atomic(config, "{\"chat_template\": \"\xff\"}");
  EXPECT_EQ(testing::error_of([&] { chat_format_of_folder(dir); }),
            config + ": not valid UTF-8 (a bad byte at line 1, column 20)");
  write_file_atomic(config, "{\"x\": " + std::string(300, '[') + std::string(300, ']') + "}");
  EXPECT_EQ(testing::error_of([&] { chat_format_of_folder(dir); }), config + ": JSON nested deeper than 256 levels");
  write_file_atomic(config, R"({"chat_template": 3})");
  // The file wins; a template the interpreter does not run is known by its markers.
  write_file_atomic(dir + "/chat_template.jinja", "{% include 'x' %}<|start_header_id|>x<|eot_id|>");
  EXPECT_EQ(chat_format_of_folder(dir), ChatFormat::Llama3);
  const std::string copy = testing::temp_dir("chat");  // what qkv convert and train --init carry over
  copy_chat_template(dir, copy);
  EXPECT_EQ(chat_format_of_folder(copy), ChatFormat::Llama3);
  EXPECT_TRUE(std::filesystem::is_regular_file(copy + "/tokenizer_config.json"));
  write_file_atomic(dir + "/chat_template.jinja", "<start_of_turn>{% include 'x' %}");
  EXPECT_EQ(testing::error_of([&] { chat_format_of_folder(dir); }),
            dir +
                "/chat_template.jinja: the chat template is not run by qkv's Jinja (line 1: '{% include %}' is not "
                "supported (qkv runs the chat-template subset of Jinja)) and is none of the layouts qkv writes "
                "without it (chatml, llama3, llama2, mistral)");
}

// The qwen2 fixture's tokenizer_config.json holds a chat template (a default
// system message and tools in the shape of Qwen2.5's): its text and token
// ids are those of transformers' apply_chat_template
// (tests/fixtures/hf/qwen2.chat.expected.json), the third conversation with
// tools, an assistant's tool_calls and a tool's answer; a turn ends at
// <|im_end|>. The layouts qkv writes itself refuse tools.
TEST(Chat, AHuggingFaceFolderChatsAsApplyChatTemplate) {
  const std::string dir = std::string(QKV_FIXTURES_DIR) + "/hf/qwen2";
  const ModelFolder m = load_model_folder(dir);
  const ChatTemplate t = chat_template_of_folder(dir);
  ASSERT_EQ(t.format, ChatFormat::Template);
  EXPECT_EQ(t.end_of_turn, "<|im_end|>");
  EXPECT_TRUE(t.shows_tools);
  EXPECT_TRUE(t.tool_call_tags);
  const auto expected =
      nlohmann::ordered_json::parse(read_file(std::string(QKV_FIXTURES_DIR) + "/hf/qwen2.chat.expected.json"));
  ASSERT_EQ(expected.size(), 3u);
  for (const auto& e : expected) {
    std::vector<ChatMessage> messages;
    for (const auto& msg : e["messages"]) {
      ChatMessage message{msg["role"], msg["content"]};
      if (msg.contains("tool_calls")) message.tool_calls = msg["tool_calls"];
      if (msg.contains("tool_call_id")) message.tool_call_id = msg["tool_call_id"];
      messages.push_back(message);
    }
    const std::string text = format_chat(t, messages, e["tools"]);
    EXPECT_EQ(text, e["text"].get<std::string>());
    EXPECT_EQ(m.tokenizer->encode_prompt(text), e["ids"].get<std::vector<int64_t>>());
  }
  ChatTemplate chatml;
  chatml.format = ChatFormat::ChatML;
  EXPECT_EQ(testing::error_of([&] {
              format_chat(chatml, {{"user", "hi"}}, expected[2]["tools"]);
            }),
            "tools: the chatml layout qkv writes has no place for tools (a folder template that shows them is needed)");
}

// A reply's <tool_call> blocks become calls; what is not a call stays text.
TEST(Chat, ToolCallsAreReadFromTheirTags) {
  ChatReply r = parse_tool_calls(
      "Let me see.\n<tool_call>\n{\"name\": \"translate\", \"arguments\": {\"text\": \"我\", \"to\": \"ja\"}}\n"
      "</tool_call>\n<tool_call>{\"name\": \"now\"}</tool_call>\n");
  EXPECT_EQ(r.content, "Let me see.");
  ASSERT_EQ(r.tool_calls.size(), 2u);
  EXPECT_EQ(r.tool_calls[0].name, "translate");
  EXPECT_EQ(r.tool_calls[0].arguments.dump(), R"({"text":"我","to":"ja"})");
  EXPECT_EQ(r.tool_calls[1].name, "now");
  EXPECT_EQ(r.tool_calls[1].arguments, nlohmann::ordered_json::object());
  for (const std::string text :
       {"no call here ", "a <tool_call>{\"name\": 3}</tool_call> b",
        "<tool_call>{\"name\": \"f\", \"arguments\": \"x\"}</tool_call>", "cut <tool_call>{\"name\": \"f\""}) {
    r = parse_tool_calls(text);
    EXPECT_TRUE(r.tool_calls.empty()) << text;
    EXPECT_EQ(r.content, text);
  }
  // What a stream may show: all before a block, and no tail that may begin one.
  EXPECT_EQ(text_before_tool_calls("abc <tool_call>{}"), 4u);
  EXPECT_EQ(text_before_tool_calls("abc <tool_c"), 4u);
  EXPECT_EQ(text_before_tool_calls("abc <"), 4u);
  EXPECT_EQ(text_before_tool_calls("abc <b"), 6u);
  EXPECT_EQ(text_before_tool_calls(""), 0u);
  // The helper under it (and under stop sequences and ends of turn): a tail
  // that begins the marker, never the whole marker, nothing for an empty one.
  EXPECT_EQ(marker_begins_at_end("ab<|im", "<|im_end|>"), 4u);
  EXPECT_EQ(marker_begins_at_end("ab<|im_end|>", "<|im_end|>"), 0u);
  EXPECT_EQ(marker_begins_at_end("<", "<|im_end|>"), 1u);
  EXPECT_EQ(marker_begins_at_end("abc", ""), 0u);
  // A call nested deeper than a request may be stays text (its copies would
  // recurse once a level: 60,000 ran a copy out of stack); 99 levels are a call.
  const auto nested_call = [](int levels) {
    std::string args;
    for (int i = 0; i < levels; ++i) args += "{\"a\": ";
    args += "1" + std::string(levels, '}');
    return "<tool_call>{\"name\": \"f\", \"arguments\": " + args + "}</tool_call>";
  };
  EXPECT_EQ(parse_tool_calls(nested_call(99)).tool_calls.size(), 1u);
  for (int levels : {100, 100000}) {
    r = parse_tool_calls(nested_call(levels));
    EXPECT_TRUE(r.tool_calls.empty()) << levels;
    EXPECT_EQ(r.content, nested_call(levels)) << levels;
  }
}

// A folder whose template is none of the four layouts (the "renamed" and
// "inst" templates of tests/fixtures/jinja/cases.json) chats as transformers
// renders it: the same text, less the bos_token the tokenizer puts first
// itself; its end of turn is the eos_token; the template's own checks are the
// errors; roles it could not know are refused before it runs.
TEST(Chat, AFolderTemplateRendersAsTransformersRendersIt) {
  const auto fixture = nlohmann::ordered_json::parse(read_file(std::string(QKV_FIXTURES_DIR) + "/jinja/cases.json"));
  const std::string dir = testing::temp_dir("chat");
  int checked = 0;
  for (const auto& c : fixture["cases"]) {
    const std::string name = c["template"].get<std::string>();
    if (name != "renamed" && name != "inst") continue;
    nlohmann::ordered_json config = {{"chat_template", fixture["templates"][name]}};
    for (const char* token : {"bos_token", "eos_token"})
      if (c["context"].contains(token)) config[token] = {{"content", c["context"][token]}, {"lstrip", false}};
    write_file_atomic(dir + "/tokenizer_config.json", config.dump());
    const ChatTemplate t = chat_template_of_folder(dir);
    ASSERT_EQ(t.format, ChatFormat::Template) << name;
    std::vector<ChatMessage> messages;
    for (const auto& m : c["context"]["messages"]) messages.push_back({m["role"], m["content"]});
    const std::string bos = c["context"]["bos_token"].get<std::string>();
    if (c.contains("error")) {
      EXPECT_EQ(testing::error_of([&] { format_chat(t, messages); }),
                "messages: the chat template says: " + c["error"].get<std::string>());
    } else {
      const std::string want = c["expected"].get<std::string>();
      ASSERT_EQ(want.rfind(bos, 0), 0u) << name;
      EXPECT_EQ(format_chat(t, messages), want.substr(bos.size())) << name;
    }
    EXPECT_EQ(t.end_of_turn, name == "inst" ? "</s>" : "");
    EXPECT_EQ(testing::error_of([&] {
                format_chat(t, {{"bot", "a"}});
              }),
              "messages[0]: role 'bot' is none of system, user, assistant, tool");
    ++checked;
  }
  EXPECT_EQ(checked, 4);
}

}  // namespace
}  // namespace qkv
