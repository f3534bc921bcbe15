// Chat formats: how a list of messages becomes the prompt a chat model was
// trained on. A Hugging Face folder states its format as a Jinja template
// (tokenizer_config.json's "chat_template", or chat_template.jinja). qkv runs
// the template with its own interpreter (qkv/jinja.h) as transformers'
// apply_chat_template does; a template that uses what the interpreter does
// not run, it recognizes by the markers it writes, as llama.cpp does, and
// writes that family's layout with its own code (docs/pretrained.md lists
// the layouts):
//
//   chatml   <|im_start|>ROLE\nCONTENT<|im_end|>\n ... <|im_start|>assistant\n
//            (Qwen2, Qwen3 and many others); a turn ends at <|im_end|>
//   llama3   <|start_header_id|>ROLE<|end_header_id|>\n\nCONTENT<|eot_id|> ...
//            <|start_header_id|>assistant<|end_header_id|>\n\n; ends at <|eot_id|>
//   llama2   [INST] <<SYS>>\nSYSTEM\n<</SYS>>\n\nUSER [/INST] ANSWER </s><s>[INST] ...
//   mistral  [INST] SYSTEM\n\nUSER [/INST] ANSWER</s>[INST] ... [/INST]
//
// The tokenizer's own prefix (<bos>, from its post-processor) goes before
// the text, as for any prompt; a later <s> in the text is the tokenizer's
// special token.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "qkv/jinja.h"

namespace qkv {

// Template: the folder's own Jinja template, run.
enum class ChatFormat { None, ChatML, Llama3, Llama2, Mistral, Template };

struct ChatMessage {
  std::string role;  // "system", "user", "assistant", or (a template's) "tool"
  std::string content;
  // For a template: an assistant's calls of tools, as OpenAI's tool_calls
  // with each function's arguments an object ([{"id", "type": "function",
  // "function": {"name", "arguments"}}]; null when it made none), and a
  // tool's answer's tool_call_id.
  nlohmann::ordered_json tool_calls;
  std::string tool_call_id;
};

// The format a Jinja chat template belongs to; an unrecognized template is
// an error saying which formats qkv writes.
ChatFormat chat_format_of_template(const std::string& jinja);
// A model folder's chat format.
struct ChatTemplate {
  ChatFormat format = ChatFormat::None;
  std::shared_ptr<const jinja::Template> jinja;  // Template
  std::string source;                            // the template's text, as the folder holds it
  // What the template may print besides the messages: tokenizer_config.json's
  // bos_token, eos_token, unk_token and pad_token (strings), where it has them.
  nlohmann::ordered_json tokens = nlohmann::ordered_json::object();
  // The text that ends an assistant's turn: the format's marker where the
  // template writes a known one (<|im_end|>, <|eot_id|>), else eos_token;
  // "" when there is neither.
  std::string end_of_turn;
  // Template: whether it reads `tools` (it can show a model the tools it may
  // call), and whether it asks for calls as <tool_call>JSON</tool_call>
  // (Qwen2.5's, Qwen3's and Hermes' form), which parse_tool_calls reads.
  bool shows_tools = false;
  bool tool_call_tags = false;
};

// The chat format of a model folder: its chat_template.jinja, else its
// tokenizer_config.json's "chat_template" (a string, or a list of {"name",
// "template"} of which "default" or the first counts); None when the folder
// has neither. A file that cannot be read or parsed, or a template that is
// neither run by qkv's Jinja nor one of the layouts above, is an error
// naming the file.
ChatTemplate chat_template_of_folder(const std::string& dir);
// The format alone.
ChatFormat chat_format_of_folder(const std::string& dir);
const char* chat_format_name(ChatFormat f);

// The prompt text of `messages`, ending where the assistant's answer
// begins. Messages: at most one system message, first; then user and
// assistant in turn, the last a user's. Anything else is an error naming
// the message (messages[i]).
std::string format_chat(ChatFormat f, const std::vector<ChatMessage>& messages);
// The prompt text of `messages` in a folder's format. For Template, the
// template renders {messages, add_generation_prompt: true} and the tokens;
// the messages need roles among system, user and assistant and the order is
// the template's to check (its raise_exception is the error); a bos_token the
// text starts with is left out, as the tokenizer's own prefix goes before
// any prompt (the text encodes as transformers encodes the rendered text
// when the template writes bos_token and the tokenizer's prefix is that
// token).
// `tools` (OpenAI's list of {"type": "function", "function": {"name",
// "description", "parameters"}}; null or empty: none) go to the template
// as transformers passes them (apply_chat_template's tools); for the
// layouts qkv writes itself, tools, tool messages and tool_calls are an
// error (they have no place for them).
std::string format_chat(const ChatTemplate& t, const std::vector<ChatMessage>& messages,
                        const nlohmann::ordered_json& tools = nullptr);

// A reply split into its text and the tools it calls, written as
// <tool_call>{"name": NAME, "arguments": {...}}</tool_call> (ChatTemplate::
// tool_call_tags). A block whose inside is not such an object, or that is
// not closed (the reply ran out), stays part of the text; with calls, the
// text is trimmed of the whitespace around them.
struct ToolCall {
  std::string name;
  nlohmann::ordered_json arguments = nlohmann::ordered_json::object();
};
struct ChatReply {
  std::string content;
  std::vector<ToolCall> tool_calls;
};
ChatReply parse_tool_calls(const std::string& text);
// Where a <tool_call> block begins in `text`, or, when none does, how much
// of the text can be shown while the rest may still become one (the longest
// tail that begins the marker is held back): the length of the text before.
size_t text_before_tool_calls(const std::string& text);
// The text that ends an assistant's turn in format f ("<|im_end|>",
// "<|eot_id|>", "</s>").
const char* chat_end_of_turn(ChatFormat f);

// Copies a folder's chat template files (chat_template.jinja,
// tokenizer_config.json), those it has, into another model folder, so that a
// folder converted or fine-tuned from it still chats.
void copy_chat_template(const std::string& from_dir, const std::string& to_dir);

}  // namespace qkv
