"""A tiny random LlamaForCausalLM built from a config: for tests and examples that must not download."""
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
