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

namespace {

// A template's format: Template when qkv's Jinja runs it, else the layout its
// markers name; neither is an error saying both.
ChatTemplate chat_template_of(const std::string& text, nlohmann::ordered_json tokens) {
  ChatTemplate t;
  t.tokens = std::move(tokens);
  std::string why;
  try {
    t.jinja = std::make_shared<const jinja::Template>(text);
    t.format = ChatFormat::Template;
  } catch (const Error& e) {
    why = e.what();
  }
  ChatFormat family = ChatFormat::None;
  try {
    family = chat_format_of_template(text);
  } catch (const Error&) {
    if (!t.jinja)
      fail("the chat template is not run by qkv's Jinja (", why, ") and is none of the layouts qkv writes",
           " without it (chatml, llama3, llama2, mistral)");
  }
  if (!t.jinja) t.format = family;
  if (family == ChatFormat::ChatML || family == ChatFormat::Llama3) {
    t.end_of_turn = chat_end_of_turn(family);
  } else if (t.tokens.contains("eos_token")) {
    t.end_of_turn = t.tokens["eos_token"].get<std::string>();
  } else if (family != ChatFormat::None) {
    t.end_of_turn = chat_end_of_turn(family);
  }
  return t;
}

// tokenizer_config.json's special tokens as a template names them: a string,
// or an AddedToken object's "content".
nlohmann::ordered_json special_tokens(const nlohmann::json& config) {
  nlohmann::ordered_json tokens = nlohmann::ordered_json::object();
  for (const char* name : {"bos_token", "eos_token", "unk_token", "pad_token"}) {
    if (!config.is_object() || !config.contains(name)) continue;
    const nlohmann::json& v = config[name];
    if (v.is_string()) tokens[name] = v.get<std::string>();
    if (v.is_object() && v.contains("content") && v["content"].is_string())
      tokens[name] = v["content"].get<std::string>();
  }
  return tokens;
}

}  // namespace

ChatFormat chat_format_of_folder(const std::string& dir) { return chat_template_of_folder(dir).format; }

ChatTemplate chat_template_of_folder(const std::string& dir) {
  const std::string jinja = dir + "/chat_template.jinja", config = dir + "/tokenizer_config.json";
  nlohmann::json j;
  if (std::filesystem::is_regular_file(config)) {
    try {
      j = nlohmann::json::parse(read_file(config));
    } catch (const nlohmann::json::exception&) {
      fail(config, ": not valid JSON");
    }
  }
  try {
    if (std::filesystem::is_regular_file(jinja)) return chat_template_of(read_file(jinja), special_tokens(j));
  } catch (const Error& e) {
    fail(jinja, ": ", e.what());
  }
  if (!j.is_object() || !j.contains("chat_template") || j["chat_template"].is_null()) return {};
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
    return chat_template_of(text, special_tokens(j));
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
    case ChatFormat::Template: return "template";
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

std::string format_chat(const ChatTemplate& t, const std::vector<ChatMessage>& messages) {
  if (t.format != ChatFormat::Template) return format_chat(t.format, messages);
  QKV_CHECK(!messages.empty(), "messages: at least one message is needed");
  nlohmann::ordered_json context = t.tokens;
  context["messages"] = nlohmann::ordered_json::array();
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& role = messages[i].role;
    QKV_CHECK(role == "user" || role == "assistant" || role == "system", "messages[", i, "]: role '", role,
              "' is none of system, user, assistant");
    context["messages"].push_back({{"role", role}, {"content", messages[i].content}});
  }
  context["add_generation_prompt"] = true;
  std::string text;
  try {
    text = t.jinja->render(context);
  } catch (const Error& e) {
    fail("messages: the chat template says: ", e.what());
  }
  const std::string bos = t.tokens.value("bos_token", "");
  if (!bos.empty() && text.rfind(bos, 0) == 0) text.erase(0, bos.size());
  return text;
}

std::string format_chat(ChatFormat f, const std::vector<ChatMessage>& messages) {
  QKV_CHECK(f != ChatFormat::Template, "format_chat: a template needs its ChatTemplate");
  const std::string system = check_messages(messages);
  const bool has_system = messages[0].role == "system";
  std::string out;
  switch (f) {
    case ChatFormat::None: fail("the model's folder defines no chat format");
    case ChatFormat::Template: break;  // refused above
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
