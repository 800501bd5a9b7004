"""A stock transformers decoder (Llama, from a config) left with its default `use_cache=True`:
it returns its key/value cache, which the dynamo exporter cannot trace. `build` hands the decoder
over as it is (layerdiff turns its cache off); `wrapped` hides it in a module of one's own that
returns its whole output, cache and all."""

import torch
from transformers import LlamaConfig, LlamaModel


def build():
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    model = LlamaModel(config).eval()
    return model, (torch.randint(0, 128, (1, 8)),)


class _Whole(torch.nn.Module):
    def __init__(self, decoder):
        super().__init__()
        self.decoder = decoder

    def forward(self, ids):
        return self.decoder(ids)  # the whole output: the last hidden state and the cache


def wrapped():
    model, inputs = build()
    return _Whole(model).eval(), inputs


def by_name():
    """The decoder with its inputs by name, as a tokenizer returns them."""
    model, (ids,) = build()
    return model, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
