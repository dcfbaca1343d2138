"""Tiny random causal LMs built from a config, one per family with a layout (`hf.layouts`): for tests and
examples that must not download."""
from __future__ import annotations

from .source import freeze, require


def tiny_llama(seed: int = 0, vocab_size: int = 96, hidden_size: int = 64, num_hidden_layers: int = 4,
               num_attention_heads: int = 4, num_key_value_heads: int = 2, intermediate_size: int = 128,
               max_position_embeddings: int = 128, tie_word_embeddings: bool = True):
    """A LlamaForCausalLM with random weights (seeded), frozen, in eval mode, float32."""
    torch = require("torch")
    transformers = require("transformers")
    config = transformers.LlamaConfig(vocab_size=vocab_size, hidden_size=hidden_size,
                                      num_hidden_layers=num_hidden_layers, num_attention_heads=num_attention_heads,
                                      num_key_value_heads=num_key_value_heads, intermediate_size=intermediate_size,
                                      max_position_embeddings=max_position_embeddings,
                                      tie_word_embeddings=tie_word_embeddings)
    torch.manual_seed(seed)
    return freeze(transformers.LlamaForCausalLM(config))


class RandomWindows:
    """A stand-in for `BBCTokens.document_windows` over random tokens of a tiny vocabulary: two topics of three
    documents each, per_doc windows a document (per_topic and part are accepted and ignored)."""

    def __init__(self, vocab_size: int = 96):
        self.vocab_size = vocab_size

    def document_windows(self, length: int, part: str, per_doc: int, per_topic: int | None, seed: int):
        torch = require("torch")
        tokens = torch.randint(0, self.vocab_size, (6 * per_doc, length), generator=torch.Generator().manual_seed(seed))
        docs = torch.arange(6).repeat_interleave(per_doc)
        return tokens, docs // 3, docs


def tiny_qwen2(seed: int = 0, vocab_size: int = 96, hidden_size: int = 64, num_hidden_layers: int = 4,
               num_attention_heads: int = 4, num_key_value_heads: int = 2, intermediate_size: int = 128,
               max_position_embeddings: int = 128):
    """A Qwen2ForCausalLM with random weights (seeded), frozen, in eval mode, float32 (biases on q, k, v)."""
    torch = require("torch")
    transformers = require("transformers")
    config = transformers.Qwen2Config(vocab_size=vocab_size, hidden_size=hidden_size,
                                      num_hidden_layers=num_hidden_layers, num_attention_heads=num_attention_heads,
                                      num_key_value_heads=num_key_value_heads, intermediate_size=intermediate_size,
                                      max_position_embeddings=max_position_embeddings, tie_word_embeddings=True)
    torch.manual_seed(seed)
    return freeze(transformers.Qwen2ForCausalLM(config))


def tiny_gpt2(seed: int = 0, vocab_size: int = 96, n_embd: int = 64, n_layer: int = 4, n_head: int = 4,
              n_positions: int = 128):
    """A GPT2LMHeadModel with random weights (seeded), frozen, in eval mode, float32: its maps are transformers
    Conv1D, which store W as (in, out)."""
    torch = require("torch")
    transformers = require("transformers")
    config = transformers.GPT2Config(vocab_size=vocab_size, n_embd=n_embd, n_layer=n_layer, n_head=n_head,
                                     n_positions=n_positions, bos_token_id=vocab_size - 1,
                                     eos_token_id=vocab_size - 1)
    torch.manual_seed(seed)
    return freeze(transformers.GPT2LMHeadModel(config))
