"""Checkpoint folders as `save_pretrained` writes them: small transformers decoders (Llama with
grouped-query attention, Qwen2, GPT-2) from their configs, random weights from seed 0, stored in
bfloat16 as checkpoints ship. For tests/test_checkpoint.py, tests/test_decode.py and the
calibration corpus's decoder rows (scripts/calibrate_baseline.py)."""

from __future__ import annotations

from pathlib import Path

_SMALL = {"vocab_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4}
# a config class, a model class and the config
CHECKPOINTS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM",
              {**_SMALL, "hidden_size": 64, "intermediate_size": 160, "num_key_value_heads": 2,
               "max_position_embeddings": 64}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM",
              {**_SMALL, "hidden_size": 64, "intermediate_size": 160, "num_key_value_heads": 2,
               "max_position_embeddings": 64}),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel",
             {"vocab_size": 512, "n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 16,
              "bos_token_id": 0, "eos_token_id": 0}),
}  # fmt: skip
# A wider Llama, 6.5 MB of weights in float32: past a test's --max-memory of 4M (held one module
# at a time), with room for its largest segment's values (tests/test_streamed*.py).
WIDE = ("LlamaConfig", "LlamaForCausalLM",
        {**_SMALL, "hidden_size": 256, "intermediate_size": 640, "num_key_value_heads": 2,
         "max_position_embeddings": 64})  # fmt: skip


def save(name: str, folder: Path, stored: str = "bfloat16") -> Path:
    """Checkpoint `name` written into `folder` (seed 0, stored in bfloat16 unless `stored`
    names another dtype)."""
    import torch
    import transformers

    config_class, model_class, config = {**CHECKPOINTS, "wide": WIDE}[name]
    torch.manual_seed(0)
    model = getattr(transformers, model_class)(getattr(transformers, config_class)(**config))
    model.to(getattr(torch, stored)).save_pretrained(folder)
    return folder
