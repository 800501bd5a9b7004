"""A Llama-shaped decoder (transformers, from a config, random weights from seed 0) on a
left-padded batch, as a decoder is fed for batched generation: the first sequence's first four
tokens are padding, so under the causal mask their queries see no key at all. Each side masks
with its own dtype's extreme (float32's -3.4e38, float16's -65504); such a row's softmax is
uniform on every side, never NaN. Fed to a float16 or bfloat16 re-run, float32's extreme is no
value the narrower dtype holds: read as -Inf there, the row's softmax was NaN, an "overflow" of
a clean model (the calibration corpus's padded rows, tests/test_torch_sides.py)."""

from __future__ import annotations

import torch


def build():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=512, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        attn_implementation="eager", use_cache=False,
    )  # fmt: skip
    model = LlamaForCausalLM(config).eval()
    ids = torch.randint(0, 512, (2, 16), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[0, :4] = 0
    return model, {"input_ids": ids, "attention_mask": mask}
