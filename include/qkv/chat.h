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
  std::string role;  // "system", "user" or "assistant"
  std::string content;
};

// The format a Jinja chat template belongs to; an unrecognized template is
// an error saying which formats qkv writes.
ChatFormat chat_format_of_template(const std::string& jinja);
// A model folder's chat format.
struct ChatTemplate {
  ChatFormat format = ChatFormat::None;
  std::shared_ptr<const jinja::Template> jinja;  // Template
  // What the template may print besides the messages: tokenizer_config.json's
  // bos_token, eos_token, unk_token and pad_token (strings), where it has them.
  nlohmann::ordered_json tokens = nlohmann::ordered_json::object();
  // The text that ends an assistant's turn: the format's marker where the
  // template writes a known one (<|im_end|>, <|eot_id|>), else eos_token;
  // "" when there is neither.
  std::string end_of_turn;
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
std::string format_chat(const ChatTemplate& t, const std::vector<ChatMessage>& messages);
// The text that ends an assistant's turn in format f ("<|im_end|>",
// "<|eot_id|>", "</s>").
const char* chat_end_of_turn(ChatFormat f);

// Copies a folder's chat template files (chat_template.jinja,
// tokenizer_config.json), those it has, into another model folder, so that a
// folder converted or fine-tuned from it still chats.
void copy_chat_template(const std::string& from_dir, const std::string& to_dir);

}  // namespace qkv
