"""A T5 (transformers, from a small config, random weights) whose second encoder block's
feed-forward has large weights, as trained T5 checkpoints do: in float16 its output passes
65504 and the residual stream carries it on, so keeping layers in float32 must keep the values
in float32 across the blocks that only route them (T5Block, T5Stack)."""

import torch
from transformers import T5Config, T5ForConditionalGeneration


class Logits(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.m = model

    def forward(self, ids, decoder_ids):
        return self.m(input_ids=ids, decoder_input_ids=decoder_ids, use_cache=False).logits


def build():
    torch.manual_seed(0)
    config = T5Config(vocab_size=256, d_model=64, d_kv=16, d_ff=128, num_layers=3, num_heads=4)
    model = T5ForConditionalGeneration(config).eval()
    with torch.no_grad():
        model.encoder.block[1].layer[1].DenseReluDense.wi.weight.mul_(400)
        model.encoder.block[1].layer[1].DenseReluDense.wo.weight.mul_(400)
    ids, decoder_ids = torch.randint(0, 256, (1, 12)), torch.randint(0, 256, (1, 6))
    return Logits(model), (ids, decoder_ids)
