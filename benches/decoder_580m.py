"""The Llama-style decoder past 2 GB that `make bench` measures (issue 30): a transformers config
with hidden 2048, 10 layers, grouped-query attention 16/4, vocabulary 32000, untied embeddings:
581M parameters, 2.33 GB in float32. Random weights; `layerdiff torch benches/decoder_580m.py:build`
seeds them."""

import torch


def build():
    import transformers
    from layerdiff.torch.models import Logits

    config = transformers.LlamaConfig(
        hidden_size=2048, intermediate_size=5632, num_hidden_layers=10, num_attention_heads=16,
        num_key_value_heads=4, vocab_size=32000, tie_word_embeddings=False,
        max_position_embeddings=256, attn_implementation="eager",
    )  # fmt: skip
    model = Logits(transformers.LlamaForCausalLM(config)).eval()
    return model, (torch.randint(0, 32000, (1, 64), generator=torch.Generator().manual_seed(0)),)
