// Chat formats (qkv/chat.h): recognizing a folder's template, and writing
// each format's layout.
#include "qkv/chat.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "qkv/error.h"
#include "qkv/io.h"

namespace qkv {

ChatFormat chat_format_of_template(const std::string& jinja) {
  auto has = [&](const char* marker) { return jinja.find(marker) != std::string::npos; };
  if (has("<|im_start|>")) return ChatFormat::ChatML;
  if (has("<|start_header_id|>") && has("<|eot_id|>")) return ChatFormat::Llama3;
  if (has("[INST]") && has("<<SYS>>")) return ChatFormat::Llama2;
  if (has("[INST]")) return ChatFormat::Mistral;
  fail("the chat template is none of the formats qkv writes (chatml, llama3, llama2, mistral)");
}

ChatFormat chat_format_of_folder(const std::string& dir) {
  const std::string jinja = dir + "/chat_template.jinja", config = dir + "/tokenizer_config.json";
  try {
    if (std::filesystem::is_regular_file(jinja)) return chat_format_of_template(read_file(jinja));
  } catch (const Error& e) {
    fail(jinja, ": ", e.what());
  }
  if (!std::filesystem::is_regular_file(config)) return ChatFormat::None;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_file(config));
  } catch (const nlohmann::json::exception&) {
    fail(config, ": not valid JSON");
  }
  if (!j.is_object() || !j.contains("chat_template") || j["chat_template"].is_null()) return ChatFormat::None;
  const nlohmann::json& t = j["chat_template"];
  std::string text;
  if (t.is_string()) {
    text = t.get<std::string>();
  } else if (t.is_array() && !t.empty()) {  // named templates: "default", else the first
    const nlohmann::json* pick = &t[0];
    for (const auto& e : t)
      if (e.is_object() && e.value("name", "") == "default") pick = &e;
    QKV_CHECK(pick->is_object() && pick->contains("template") && (*pick)["template"].is_string(), config,
              ": chat_template: a list entry without a \"template\" string");
    text = (*pick)["template"].get<std::string>();
  } else {
    fail(config, ": chat_template must be a string or a list of {\"name\", \"template\"}");
  }
  try {
    return chat_format_of_template(text);
  } catch (const Error& e) {
    fail(config, ": ", e.what());
  }
}

const char* chat_format_name(ChatFormat f) {
  switch (f) {
    case ChatFormat::None: return "none";
    case ChatFormat::ChatML: return "chatml";
    case ChatFormat::Llama3: return "llama3";
    case ChatFormat::Llama2: return "llama2";
    case ChatFormat::Mistral: return "mistral";
  }
  return "unknown";
}

const char* chat_end_of_turn(ChatFormat f) {
  switch (f) {
    case ChatFormat::ChatML: return "<|im_end|>";
    case ChatFormat::Llama3: return "<|eot_id|>";
    default: return "</s>";
  }
}

void copy_chat_template(const std::string& from_dir, const std::string& to_dir) {
  for (const char* name : {"chat_template.jinja", "tokenizer_config.json"}) {
    const std::string from = from_dir + "/" + name;
    if (std::filesystem::is_regular_file(from)) write_file_atomic(to_dir + "/" + name, read_file(from));
  }
}

namespace {

// Checks the order of `messages` (chat.h) and returns the system message's
// content ("" without one).
std::string check_messages(const std::vector<ChatMessage>& messages) {
  QKV_CHECK(!messages.empty(), "messages: at least one message is needed");
  std::string system;
  size_t first = 0;
  if (messages[0].role == "system") system = messages[0].content, first = 1;
  QKV_CHECK(first < messages.size(), "messages: a system message alone leaves nothing to answer");
  for (size_t i = first; i < messages.size(); ++i) {
    const std::string& role = messages[i].role;
    const std::string where = "messages[" + std::to_string(i) + "]";
    QKV_CHECK(role == "user" || role == "assistant" || role == "system", where, ": role '", role,
              "' is none of system, user, assistant");
    QKV_CHECK(role != "system", where, ": a system message may only come first");
    const char* expected = (i - first) % 2 == 0 ? "user" : "assistant";
    QKV_CHECK(role == expected, where, ": expected a message from the ", expected, " (user and assistant take turns)");
  }
  QKV_CHECK(messages.back().role == "user", "messages: the last message must be the user's");
  return system;
}

}  // namespace

std::string format_chat(ChatFormat f, const std::vector<ChatMessage>& messages) {
  const std::string system = check_messages(messages);
  const bool has_system = messages[0].role == "system";
  std::string out;
  switch (f) {
    case ChatFormat::None: fail("the model's folder defines no chat format");
    case ChatFormat::ChatML:
      for (const ChatMessage& m : messages) out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
      return out + "<|im_start|>assistant\n";
    case ChatFormat::Llama3:
      for (const ChatMessage& m : messages)
        out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n" + m.content + "<|eot_id|>";
      return out + "<|start_header_id|>assistant<|end_header_id|>\n\n";
    case ChatFormat::Llama2:
    case ChatFormat::Mistral: {
      const size_t first = has_system ? 1 : 0;
      for (size_t i = first; i < messages.size(); ++i) {
        const ChatMessage& m = messages[i];
        if (m.role == "assistant") {
          out += (f == ChatFormat::Llama2 ? " " : "") + m.content + (f == ChatFormat::Llama2 ? " </s>" : "</s>");
          continue;
        }
        if (i > first && f == ChatFormat::Llama2) out += "<s>";  // the first <s> is the tokenizer's prefix
        std::string user = m.content;
        if (i == first && has_system)
          user = f == ChatFormat::Llama2 ? "<<SYS>>\n" + system + "\n<</SYS>>\n\n" + user : system + "\n\n" + user;
        out += "[INST] " + user + " [/INST]";
      }
      return out;
    }
  }
  fail("unknown chat format");
}

}  // namespace qkv
