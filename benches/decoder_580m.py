"""The Llama-style decoder past 2 GB that `make bench` measures (issue 30): a transformers config
with hidden 2048, 10 layers, grouped-query attention 16/4, vocabulary 32000, untied embeddings:
581M parameters, 2.33 GB in float32. Random weights; `layerdiff torch benches/decoder_580m.py:build`
seeds them. It imports nothing of layerdiff's: the predecessor builds it in an environment of
its own."""

import torch
from torch import nn


class Logits(nn.Module):
    """The decoder called on token ids, returning its logits (one tensor out), as layerdiff's
    own wrapper of a transformers model does."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, ids):
        mask = torch.ones_like(ids)
        return self.model(input_ids=ids, attention_mask=mask, use_cache=False).logits


def build():
    import transformers

    config = transformers.LlamaConfig(
        hidden_size=2048, intermediate_size=5632, num_hidden_layers=10, num_attention_heads=16,
        num_key_value_heads=4, vocab_size=32000, tie_word_embeddings=False,
        max_position_embeddings=256, attn_implementation="eager",
    )  # fmt: skip
    model = Logits(transformers.LlamaForCausalLM(config)).eval()
    return model, (torch.randint(0, 32000, (1, 64), generator=torch.Generator().manual_seed(0)),)
