// Chat formats: how a list of messages becomes the prompt a chat model was
// trained on. A Hugging Face folder states its format as a Jinja template
// (tokenizer_config.json's "chat_template", or chat_template.jinja); qkv does
// not run Jinja. It recognizes the template's family by the markers the
// template writes, as llama.cpp does, and writes that family's layout with
// its own code (docs/pretrained.md lists the layouts):
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

#include <string>
#include <vector>

namespace qkv {

enum class ChatFormat { None, ChatML, Llama3, Llama2, Mistral };

struct ChatMessage {
  std::string role;  // "system", "user" or "assistant"
  std::string content;
};

// The format a Jinja chat template belongs to; an unrecognized template is
// an error saying which formats qkv writes.
ChatFormat chat_format_of_template(const std::string& jinja);
// The chat format of a model folder: its chat_template.jinja, else its
// tokenizer_config.json's "chat_template" (a string, or a list of {"name",
// "template"} of which "default" or the first counts); None when the folder
// has neither. A file that cannot be read or parsed is an error naming it.
ChatFormat chat_format_of_folder(const std::string& dir);
const char* chat_format_name(ChatFormat f);

// The prompt text of `messages`, ending where the assistant's answer
// begins. Messages: at most one system message, first; then user and
// assistant in turn, the last a user's. Anything else is an error naming
// the message (messages[i]).
std::string format_chat(ChatFormat f, const std::vector<ChatMessage>& messages);
// The text that ends an assistant's turn in format f ("<|im_end|>",
// "<|eot_id|>", "</s>").
const char* chat_end_of_turn(ChatFormat f);

// Copies a folder's chat template files (chat_template.jinja,
// tokenizer_config.json), those it has, into another model folder, so that a
// folder converted or fine-tuned from it still chats.
void copy_chat_template(const std::string& from_dir, const std::string& to_dir);

}  // namespace qkv
