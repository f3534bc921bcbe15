// Chat formats (qkv/chat.h): recognizing a folder's template, and writing
// each format's layout.
#include "qkv/chat.h"

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string_view>

#include "qkv/error.h"
#include "qkv/io.h"
#include "qkv/utf8.h"
#include "src/core/json.h"

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
  t.source = text;
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
  if (t.jinja) {
    t.shows_tools = text.find("tools") != std::string::npos;
    t.tool_call_tags = text.find("<tool_call>") != std::string::npos;
  }
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
  if (std::filesystem::is_regular_file(config)) j = parse_json(read_file(config), config);
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

std::string format_chat(const ChatTemplate& t, const std::vector<ChatMessage>& messages,
                        const nlohmann::ordered_json& tools) {
  const bool has_tools = tools.is_array() && !tools.empty();
  if (t.format != ChatFormat::Template) {
    QKV_CHECK(!has_tools, "tools: the ", chat_format_name(t.format),
              " layout qkv writes has no place for tools (a folder template that shows them is needed)");
    for (size_t i = 0; i < messages.size(); ++i)
      QKV_CHECK(messages[i].tool_calls.is_null(), "messages[", i, "]: the ", chat_format_name(t.format),
                " layout qkv writes has no place for tool_calls");
    return format_chat(t.format, messages);
  }
  QKV_CHECK(!messages.empty(), "messages: at least one message is needed");
  QKV_CHECK(!has_tools || t.shows_tools, "tools: the model's chat template does not show tools");
  nlohmann::ordered_json context = t.tokens;
  context["messages"] = nlohmann::ordered_json::array();
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    QKV_CHECK(m.role == "user" || m.role == "assistant" || m.role == "system" || m.role == "tool", "messages[", i,
              "]: role '", m.role, "' is none of system, user, assistant, tool");
    nlohmann::ordered_json message = {{"role", m.role}, {"content", m.content}};
    if (!m.tool_calls.is_null()) message["tool_calls"] = m.tool_calls;
    if (!m.tool_call_id.empty()) message["tool_call_id"] = m.tool_call_id;
    context["messages"].push_back(std::move(message));
  }
  if (has_tools) context["tools"] = tools;
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

namespace {
constexpr std::string_view kCallOpen = "<tool_call>", kCallClose = "</tool_call>";

std::string trimmed(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t\r\n"), b = s.find_last_not_of(" \t\r\n");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}
}  // namespace

ChatReply parse_tool_calls(const std::string& text) {
  ChatReply reply;
  size_t at = 0;
  while (at < text.size()) {
    const size_t open = text.find(kCallOpen, at);
    const size_t close = open == std::string::npos ? open : text.find(kCallClose, open + kCallOpen.size());
    if (close == std::string::npos) {  // no block, or one the reply did not close
      reply.content += text.substr(at);
      break;
    }
    reply.content += text.substr(at, open - at);
    const std::string inside = text.substr(open + kCallOpen.size(), close - open - kCallOpen.size());
    // A call nested deeper than a request may be (kMaxRequestJsonDepth) stays text: parsing it would recurse.
    const nlohmann::ordered_json call =
        json_text_nested_deeper_than(inside, kMaxRequestJsonDepth)
            ? nlohmann::ordered_json()
            : nlohmann::ordered_json::parse(inside, nullptr, /*allow_exceptions=*/false);
    const bool named = call.is_object() && call.contains("name") && call["name"].is_string();
    const bool with_arguments = named && (!call.contains("arguments") || call["arguments"].is_object());
    if (with_arguments) {
      ToolCall c{call["name"].get<std::string>()};
      if (call.contains("arguments")) c.arguments = call["arguments"];
      reply.tool_calls.push_back(std::move(c));
    } else {
      reply.content += text.substr(open, close + kCallClose.size() - open);
    }
    at = close + kCallClose.size();
  }
  if (!reply.tool_calls.empty()) reply.content = trimmed(reply.content);
  return reply;
}

size_t text_before_tool_calls(const std::string& text) {
  const size_t open = text.find(kCallOpen);
  return open != std::string::npos ? open : text.size() - marker_begins_at_end(text, kCallOpen);
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
