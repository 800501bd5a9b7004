"""Models to compare: the built-in zoo (torchvision constructors and transformers models from
small configs, random weights from the seed), models other packages register, and a user's
builder (`path/to/file.py:build` or `package.module:build`)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from layerdiff import _layerdiff
from layerdiff._builders import builder_function
from layerdiff.torch._checkpoint import checked_folder, is_checkpoint, load_checkpoint


@dataclass(frozen=True)
class ZooModel:
    """A built-in model: a real architecture with random weights from the seed."""

    name: str
    family: str
    exercises: str
    construct: Callable[[], nn.Module]
    example: Callable[[torch.Generator], tuple]

    def __call__(self, seed: int):
        torch.manual_seed(seed)
        model = self.construct().eval()
        return model, self.example(torch.Generator().manual_seed(seed))

    def parameters(self) -> int:
        """How many parameters it has (counted without allocating them)."""
        with torch.device("meta"):
            return sum(p.numel() for p in self.construct().parameters())


def _image(generator: torch.Generator) -> tuple:
    return (torch.randn(1, 3, 224, 224, generator=generator),)


def _tokens(vocab: int, count: int = 32):
    def example(generator: torch.Generator) -> tuple:
        return (torch.randint(0, vocab, (1, count), generator=generator),)

    return example


class Logits(nn.Module):
    """A transformers model called on token ids (and decoder ids for an encoder-decoder),
    returning its logits or last hidden state: one tensor out."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, ids, decoder_ids=None):
        if decoder_ids is not None:
            out = self.model(input_ids=ids, decoder_input_ids=decoder_ids, use_cache=False)
        elif hasattr(self.model.config, "use_cache"):
            # With an explicit mask, transformers does not look for packed sequences in the
            # positions (`torch.diff`, which the legacy exporter cannot write).
            mask = torch.ones_like(ids)
            out = self.model(input_ids=ids, attention_mask=mask, use_cache=False)
        else:
            out = self.model(ids)
        return out.logits if hasattr(out, "logits") else out.last_hidden_state


def _torchvision(name: str) -> Callable[[], nn.Module]:
    def construct():
        import torchvision

        return getattr(torchvision.models, name)(weights=None)

    return construct


def _vit() -> nn.Module:
    """ViT-B/16 with a random head: torchvision starts the head at zero, which makes every
    output zero and any comparison of it trivially clean."""
    import torchvision

    model = torchvision.models.vit_b_16(weights=None)
    nn.init.normal_(model.heads.head.weight, std=0.02)
    return model


def _transformers(model_class: str, config_class: str, **config) -> Callable[[], nn.Module]:
    def construct():
        import transformers

        made = getattr(transformers, config_class)(attn_implementation="eager", **config)
        return Logits(getattr(transformers, model_class)(made))

    return construct


VOCAB = 1024


def _encoder_decoder(generator: torch.Generator) -> tuple:
    return (
        torch.randint(0, VOCAB, (1, 32), generator=generator),
        torch.randint(0, VOCAB, (1, 16), generator=generator),
    )


ZOO: dict[str, ZooModel] = {
    m.name: m
    for m in [
        ZooModel("resnet18", "torchvision", "convolutions, batch norm, residual adds",
                 _torchvision("resnet18"), _image),
        ZooModel("resnet50", "torchvision", "bottleneck blocks, 1x1 convolutions",
                 _torchvision("resnet50"), _image),
        ZooModel("mobilenet_v3_small", "torchvision",
                 "depthwise convolutions, hardswish, squeeze-excitation",
                 _torchvision("mobilenet_v3_small"), _image),
        ZooModel("efficientnet_b0", "torchvision", "MBConv blocks, SiLU, squeeze-excitation",
                 _torchvision("efficientnet_b0"), _image),
        ZooModel("convnext_tiny", "torchvision", "7x7 depthwise convolutions, layer norm, GELU",
                 _torchvision("convnext_tiny"), _image),
        ZooModel("vit_b_16", "torchvision", "patch embedding, attention, layer norm, GELU MLP",
                 _vit, _image),
        ZooModel("bert", "transformers", "encoder: embeddings, attention, layer norm, GELU",
                 _transformers("BertModel", "BertConfig", vocab_size=VOCAB, hidden_size=128,
                               num_hidden_layers=2, num_attention_heads=4,
                               intermediate_size=512, max_position_embeddings=128),
                 _tokens(VOCAB)),
        ZooModel("gpt2", "transformers", "decoder: causal attention, tanh GELU, tied head",
                 _transformers("GPT2LMHeadModel", "GPT2Config", vocab_size=VOCAB, n_embd=128,
                               n_layer=2, n_head=4, n_positions=128, bos_token_id=0,
                               eos_token_id=0),
                 _tokens(VOCAB)),
        ZooModel("llama", "transformers",
                 "decoder: RMSNorm, rotary embeddings, grouped-query attention, SwiGLU",
                 _transformers("LlamaForCausalLM", "LlamaConfig", vocab_size=VOCAB,
                               hidden_size=128, intermediate_size=344, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2,
                               max_position_embeddings=128),
                 _tokens(VOCAB)),
        ZooModel("t5", "transformers",
                 "encoder-decoder: relative position bias, cross-attention, RMS layer norm",
                 _transformers("T5ForConditionalGeneration", "T5Config", vocab_size=VOCAB,
                               d_model=128, d_kv=32, d_ff=256, num_layers=2,
                               num_decoder_layers=2, num_heads=4, decoder_start_token_id=0),
                 _encoder_decoder),
    ]
}  # fmt: skip

# The name the built-in models had before the zoo grew.
BUILTIN_MODELS = ZOO


#: The entry-point group other packages register their models under.
PLUGIN_GROUP = "layerdiff.models"


def _plugins() -> dict[str, Callable]:
    """Models other packages register under the `PLUGIN_GROUP` entry-point group: each entry
    point's name is the model's, its object a function returning (model, inputs)."""
    from importlib.metadata import entry_points

    return {e.name: e for e in entry_points(group=PLUGIN_GROUP)}


def zoo_command(command, progress) -> int:
    """`layerdiff zoo` as the command line runs it: the list printed."""
    sys.stdout.write(zoo_text())
    return 0


def zoo_text() -> str:
    """`layerdiff zoo`: the built-in models, their size and what each exercises."""
    rows = [(m.name, f"{m.parameters() / 1e6:.1f}M", m.family, m.exercises) for m in ZOO.values()]
    rows += [(name, "", "plugin", e.value) for name, e in _plugins().items()]
    width = max(len(r[0]) for r in rows)
    lines = [f"{'model':<{width}}  {'params':>7}  {'from':<12}  exercises"]
    lines += [f"{n:<{width}}  {p:>7}  {f:<12}  {x}" for n, p, f, x in rows]
    lines.append(
        "\nAny of them: `layerdiff torch NAME`; your own: `layerdiff torch path/file.py:build`, "
        f"or register one under the `{PLUGIN_GROUP}` entry-point group of a package installed "
        f'beside layerdiff (pyproject.toml: [project.entry-points."{PLUGIN_GROUP}"] '
        'NAME = "module:build").'
    )
    from layerdiff._keras_zoo import KERAS_MODELS

    width = max(map(len, KERAS_MODELS))
    lines.append(f"\n{'Keras model':<{width}}  exercises")
    lines += [f"{name:<{width}}  {what}" for name, what in KERAS_MODELS.items()]
    lines.append(
        "\nAny of them: `layerdiff keras NAME` (needs `pip install 'layerdiff[tf]'`), against "
        "its PyTorch twin: `--torch twin`."
    )
    return "\n".join(lines) + "\n"


def _what_the_file_is(spec: str) -> str | None:
    """Where `spec` names a file this verb does not take, what it is and the command that
    takes it."""
    suffix = Path(spec).suffix.lower()
    if suffix == ".onnx":
        return (
            f"`{spec}` is an ONNX file, and this command takes a PyTorch model: compare the file "
            f"across runtimes with `layerdiff onnx {spec}`, or a PyTorch model against it with "
            f"`layerdiff torch MODEL --onnx {spec}`"
        )
    if suffix in (".pt", ".pth", ".bin", ".ckpt", ".pkl"):
        return (
            f"`{spec}` is a saved PyTorch file, and a model needs its code to be built: write a "
            "`build()` in a .py file that loads it (`torch.load`, or your class with "
            "`load_state_dict`) and returns the model and example inputs, and give "
            "`FILE.py:build`"
        )
    if suffix == ".py":
        return (
            f"`{spec}` names no function: give the one that builds the model and its example "
            f"inputs, `{spec}:build`"
        )
    if suffix in (".keras", ".h5"):
        return f"`{spec}` is a Keras model: compare it with `layerdiff keras {spec}`"
    return None


def load_builder(spec: str, streams=None):
    """`resnet18`, `path/to/file.py:build`, `package.module:build` or a transformers checkpoint
    folder (`path/to/folder`, see `load_checkpoint`, which takes ``streams``) → a function of
    the seed."""
    if spec in ZOO:
        return ZOO[spec]
    if is_checkpoint(spec):
        checked_folder(spec)  # before anything is built or said
        return lambda seed: load_checkpoint(spec, seed, streams=streams)
    plugins = _plugins()
    if spec in plugins:
        spec = plugins[spec].value
    if ":" not in spec:
        known = ", ".join(ZOO)
        raise _layerdiff.UsageError(
            _what_the_file_is(spec)
            or f"unknown model `{spec}`: expected a built-in name ({known}), "
            "`path/to/file.py:function`, `package.module:function` or a checkpoint folder"
        )
    func = builder_function(spec)

    def build(seed: int):
        torch.manual_seed(seed)
        try:
            built = func()
        except Exception as e:
            raise _layerdiff.UsageError(f"`{spec}` raised {type(e).__name__}: {e}") from e
        if not (isinstance(built, tuple) and len(built) == 2 and isinstance(built[0], nn.Module)):
            raise _layerdiff.UsageError(
                f"`{spec}` must return (model, example_inputs), got {type(built).__name__}"
            )
        from layerdiff.torch._running import by_position

        return by_position(*built)

    return build
