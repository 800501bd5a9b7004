"""A transformers checkpoint folder (the config.json and weights `save_pretrained` writes) as a
model to compare: loaded from local files only with the head its config names, its inputs made
from the config, what export needs set, and all of it said in the report's notes."""

from __future__ import annotations

import contextlib
import copy
import inspect
from pathlib import Path

import torch
from torch import nn

from layerdiff import _layerdiff

# Tokens in the prompt a checkpoint runs on (fewer where its positions end sooner).
TOKENS = 32


def is_checkpoint(spec) -> bool:
    """Whether `spec` names a folder (a checkpoint, or a mistake `load_checkpoint` names)."""
    return isinstance(spec, (str, Path)) and Path(spec).is_dir()


def checked_folder(folder) -> Path:
    """`folder` as a path, or a `UsageError` where it holds no config.json."""
    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise _layerdiff.UsageError(
            f"`{folder}` is a folder without a config.json: a checkpoint folder holds the "
            "config.json and weights that transformers' save_pretrained writes"
        )
    return folder


class Holding(nn.Module):
    """A transformers model held, not registered, its own modules this one's under their names
    (`lm_head`, `model.layers.0.mlp`): layers, exported scopes and weights read as the
    checkpoint's do, whatever this module adds around the model's call."""

    def __init__(self, model: nn.Module):
        super().__init__()
        for name, child in model.named_children():
            self.add_module(name, child)
        object.__setattr__(self, "model_", model)

    def train(self, mode: bool = True):
        self.model_.training = mode
        return super().train(mode)


class Keywords(Holding):
    """A model called with its inputs by name (`model(input_ids=…, attention_mask=…)`), taking
    them in order: what layerdiff runs and exports; its layers are the model's own."""

    def __init__(self, model: nn.Module, names: list[str]):
        super().__init__(model)
        self.names = names
        self.config = getattr(model, "config", None)  # a transformers model's, for its notes

    def forward(self, *inputs):
        return self.model_(**dict(zip(self.names, inputs, strict=True)))


class Checkpoint(Holding):
    """A transformers model called on token ids and their attention mask (and the decoder's ids
    for an encoder-decoder), without its cache: one tensor out, the logits (or the last hidden
    state of a model without a head). ``how`` says how it was loaded and ``prompt`` what it runs
    on, in words: ``loaded`` joins them, and ``said`` adds that its cache is off."""

    def __init__(self, model: nn.Module, how: str, prompt: str):
        super().__init__(model)
        self.how, self.prompt = how, prompt

    @property
    def loaded(self) -> str:
        return f"{self.how}; {self.prompt}"

    @property
    def said(self) -> str:
        if not hasattr(self.model_.config, "use_cache"):
            return self.loaded
        return f"{self.how}, its cache off (use_cache=False); {self.prompt}"

    def _call(self, **inputs):
        if getattr(self.model_.config, "use_cache", None) is not None:
            inputs["use_cache"] = False
        out = self.model_(**inputs)
        return out.logits if getattr(out, "logits", None) is not None else out.last_hidden_state

    def forward(self, input_ids, attention_mask, decoder_input_ids=None):
        if decoder_input_ids is None:
            return self._call(input_ids=input_ids, attention_mask=attention_mask)
        return self._call(
            input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids
        )


class DecoderCheckpoint(Checkpoint):
    """A checkpoint whose model takes position ids: given explicitly, as a deployed decoder's
    ONNX file takes them."""

    def forward(self, input_ids, attention_mask, position_ids):
        return self._call(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids
        )


@contextlib.contextmanager
def _quiet(transformers):
    """transformers' progress bars and warnings off while a checkpoint loads (its findings
    about the files reach the user as errors, or not at all)."""
    logging = transformers.utils.logging
    verbosity = logging.get_verbosity()
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        logging.set_verbosity(verbosity)
        logging.enable_progress_bar()


def _model_class(transformers, config):
    """The class the config names (`architectures`, as `save_pretrained` writes it), else a
    causal language model where the config is one, else the bare model."""
    for name in getattr(config, "architectures", None) or []:
        found = getattr(transformers, name, None)
        if found is not None:
            return found
    auto = transformers.AutoModelForCausalLM
    return auto if type(config) in auto._model_mapping else transformers.AutoModel


def _stored_dtype(config) -> torch.dtype | None:
    stored = getattr(config, "dtype", None)
    if isinstance(stored, str):
        stored = getattr(torch, stored, None)
    return stored if isinstance(stored, torch.dtype) else None


def load_checkpoint(
    folder, seed: int = 0, *, tokens: int | None = None, streams=None
) -> tuple[nn.Module, tuple]:
    """`(model, inputs)` of the checkpoint in `folder`: the model in float32, whatever dtype
    its weights are stored in (a lower-precision side runs it as shipped), attention computed
    eagerly so its matmuls and softmax are layers of their own, its cache off; the inputs
    ``tokens`` token ids (`TOKENS`, fewer where its positions end sooner) drawn from the seed over
    its vocabulary, an attention mask of ones,
    and the position ids (or the decoder's ids) where the model takes them. ``streams(bytes)``
    says whether weights taking that many bytes in float32 are held one module at a time, read
    from the files as the forward pass reaches each (`layerdiff.torch._streamed`)."""
    folder = checked_folder(folder)
    try:
        import transformers
    except ImportError as e:
        raise _layerdiff.UsageError(
            f"`{folder}` is a checkpoint folder, which needs transformers "
            "(pip install transformers)"
        ) from e
    with _quiet(transformers):
        try:
            config = transformers.AutoConfig.from_pretrained(folder, local_files_only=True)
        except (OSError, ValueError, KeyError) as e:
            raise _layerdiff.UsageError(
                f"transformers {transformers.__version__} cannot read `{folder}/config.json`: {e}"
            ) from e
        model_class = _model_class(transformers, config)
        try:
            weights = _streamed_weights(folder, streams, config)
            if weights is not None:
                model = _built_on_meta(model_class, config)
            else:
                model = model_class.from_pretrained(
                    folder, local_files_only=True, dtype=torch.float32, attn_implementation="eager"
                )
        except (OSError, ValueError, RuntimeError) as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise _layerdiff.UsageError(
                f"transformers cannot load the weights in `{folder}`: {first}"
            ) from e
    model.eval()
    tokens = tokens or checkpoint_tokens(config)
    loaded = (
        _loaded(folder, model, config, weights),
        f"run on {tokens} token ids drawn from the seed",
    )
    ids, mask, extra = _inputs(model, config, seed, tokens)
    takes_positions = "position_ids" in inspect.signature(model.forward).parameters
    if config.is_encoder_decoder:
        made, inputs = Checkpoint(model, *loaded), (ids, mask, extra)
    elif takes_positions:
        made, inputs = DecoderCheckpoint(model, *loaded), (ids, mask, extra)
    else:
        made, inputs = Checkpoint(model, *loaded), (ids, mask)
    if weights is not None:
        from layerdiff.torch._streamed import stream

        stream(made, weights)
    return made, inputs


def _streamed_weights(folder: Path, streams, config):
    """The checkpoint's `Weights` where its model is held one module at a time (`streams`
    says so of their size in float32), else None. Weights in pickled files
    (`pytorch_model.bin`) are loaded whole, as transformers can, where they fit; past the
    budget a `UsageError` says what to do (only safetensors can be read a tensor at a time)."""
    if streams is None:
        return None
    from layerdiff.torch._streamed import Weights

    try:
        weights = Weights(folder)
    except _layerdiff.UsageError:
        pickled = sorted(folder.glob("pytorch_model*.bin"))
        stored = _stored_dtype(config) or torch.float32
        size = sum(f.stat().st_size for f in pickled) * 4 // stored.itemsize
        if pickled and streams(size):
            raise _layerdiff.UsageError(
                f"`{folder}` stores its weights in {pickled[0].name}"
                f"{f' and {len(pickled) - 1} more' if len(pickled) > 1 else ''} (about "
                f"{_layerdiff.bytes_text(size)} in float32, more than the memory budget allows "
                "at once), which can only be loaded whole: save it as safetensors where it fits "
                "(`AutoModelForCausalLM.from_pretrained(FOLDER).save_pretrained(NEW, "
                "safe_serialization=True)`, or the model class its config names) and give that "
                "folder, whose weights are read one module at a time; or give a --max-memory "
                "they fit in"
            ) from None
        return None
    return weights if streams(weights.float32_bytes()) else None


def _built_on_meta(model_class, config) -> nn.Module:
    """The model of `config` with its parameters on the meta device (no memory, no weights
    read), in float32 as `from_pretrained` is asked for (the config's stored dtype would make
    them, and the dtype the model's code reads off them, bfloat16), attention computed
    eagerly."""
    from layerdiff.torch._streamed import parameters_on_meta

    made = {"attn_implementation": "eager", "dtype": torch.float32}
    config = copy.deepcopy(config)  # the dtype is set on it: the stored one is still said
    with parameters_on_meta():
        if hasattr(model_class, "from_config"):  # an Auto class
            return model_class.from_config(config, **made)
        return model_class._from_config(config, **made)


def _inputs(model, config, seed: int, tokens: int):
    """Token ids, a mask of ones, and the position ids or (encoder-decoder) the decoder's ids."""
    generator = torch.Generator().manual_seed(seed)
    vocab = config.get_text_config().vocab_size
    ids = torch.randint(0, vocab, (1, tokens), generator=generator)
    mask = torch.ones_like(ids)
    if config.is_encoder_decoder:
        extra = torch.randint(0, vocab, (1, max(tokens // 2, 1)), generator=generator)
    else:
        extra = torch.arange(tokens).unsqueeze(0)
    return ids, mask, extra


def _loaded(folder: Path, model: nn.Module, config, weights=None) -> str:
    stored = _stored_dtype(config)
    kept = (
        f"its weights stored in {str(stored).removeprefix('torch.')}, loaded in float32"
        if stored not in (None, torch.float32)
        else "in float32"
    )
    if weights is not None:
        size = _layerdiff.bytes_text(weights.float32_bytes())
        kept = (
            f"{kept} one module at a time as the forward pass reaches it ({size} in float32: "
            "more than the memory budget allows at once)"
        )
    return (
        f"checkpoint `{folder}`: {type(model).__name__} from local files, {kept}, attention "
        "computed eagerly"
    )


def checkpoint_tokens(config) -> int:
    """The prompt length a checkpoint runs on: `TOKENS`, or fewer where its positions end."""
    limit = getattr(config.get_text_config(), "max_position_embeddings", None)
    return min(TOKENS, limit) if isinstance(limit, int) and limit > 0 else TOKENS
