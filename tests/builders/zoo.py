"""Real architectures with seeded random weights, for the mapping matrix: transformers models
built from small configs (BERT, GPT-2, a Llama-style decoder), torchvision models and a timm
model. Each builder returns (model, example inputs) and its output is one tensor."""

import torch
from torch import nn


class LastHidden(nn.Module):
    """A transformers model called on token ids, returning its last hidden state (or logits)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids):
        out = self.model(input_ids=ids, use_cache=False) if self.uses_cache else self.model(ids)
        return out.logits if hasattr(out, "logits") else out.last_hidden_state

    @property
    def uses_cache(self) -> bool:
        return hasattr(self.model.config, "use_cache")


def _ids(vocab: int, tokens: int = 16):
    return (torch.randint(0, vocab, (1, tokens)),)


def bert():
    from transformers import BertConfig, BertModel

    config = BertConfig(
        vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=128, max_position_embeddings=64, attn_implementation="eager",
    )  # fmt: skip
    return LastHidden(BertModel(config)), _ids(512)


def gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=512, n_embd=64, n_layer=2, n_head=4, n_positions=64,
        attn_implementation="eager",
    )  # fmt: skip
    return LastHidden(GPT2LMHeadModel(config)), _ids(512)


def llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        attn_implementation="eager",
    )  # fmt: skip
    return LastHidden(LlamaForCausalLM(config)), _ids(512)


def _image(size: int = 224):
    return (torch.randn(1, 3, size, size),)


def resnet18():
    import torchvision

    return torchvision.models.resnet18(weights=None), _image()


def mobilenet_v3_small():
    import torchvision

    return torchvision.models.mobilenet_v3_small(weights=None), _image()


def vit_b_16():
    import torchvision

    return torchvision.models.vit_b_16(weights=None), _image()


def timm_convnext():
    import timm

    return timm.create_model("convnext_atto", pretrained=False), _image()


def timm_efficientnet():
    """BatchNormAct2d throughout: batch norms computed by the module that holds the activation."""
    import timm

    return timm.create_model("efficientnet_b0", pretrained=False), _image()


def tiny_convnext():
    """torchvision's ConvNeXt with two small stages (24 and 48 channels, one block each) at
    112×112, seed 0: its LayerNorms' gradients sum over 784 positions, which PyTorch's CPU
    kernels add up in bfloat16 and float16, and its blocks scale their branch by a
    `layer_scale` parameter of their own, set to 0.5 as training leaves it (torchvision starts
    it at 1e-6, which leaves every gradient inside the blocks near 1e-10)."""
    from torchvision.models.convnext import CNBlockConfig, ConvNeXt

    torch.manual_seed(0)
    stages = [CNBlockConfig(24, 48, 1), CNBlockConfig(48, None, 1)]
    model = ConvNeXt(stages, num_classes=10).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("layer_scale"):
                p.fill_(0.5)
    return model, (torch.randn(1, 3, 112, 112),)


def tiny_vit():
    """torchvision's VisionTransformer at 128×128 in 8×8 patches (257 tokens, the class
    token's first), 4 layers of width 64, seed 0, its head drawn as the zoo's ViT-B/16 draws
    it: the loss reads the class token alone, so its gradient is most of what a LayerNorm's
    bias gradient sums, and the other 256 positions' are each under half a bfloat16 step of
    it."""
    from torchvision.models.vision_transformer import VisionTransformer

    torch.manual_seed(0)
    model = VisionTransformer(128, 8, num_layers=4, num_heads=4, hidden_dim=64, mlp_dim=128)
    nn.init.normal_(model.heads.head.weight, std=0.02)
    return model.eval(), (torch.randn(1, 3, 128, 128),)


BUILDERS = {
    "bert": bert,
    "gpt2": gpt2,
    "llama": llama,
    "resnet18": resnet18,
    "mobilenet_v3_small": mobilenet_v3_small,
    "vit_b_16": vit_b_16,
    "convnext_atto (timm)": timm_convnext,
    "efficientnet_b0 (timm)": timm_efficientnet,
}


def resnet18_160():
    """torchvision's ResNet-18 with random weights (seed 0) on one 160×160 image."""
    import torchvision

    torch.manual_seed(0)
    return torchvision.models.resnet18(weights=None).eval(), _image(160)
