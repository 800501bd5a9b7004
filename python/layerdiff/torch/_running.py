"""What every PyTorch flow shares: the example inputs as a tuple, the model put in eval mode,
the model's own failures told as bad input, the phases timed, the progress line, and the
parameters a cause checks (with a BatchNorm folded into the Conv before it, as exporters write
them)."""

from __future__ import annotations

import time
from pathlib import Path

import torch
from torch import nn

from layerdiff import _layerdiff
from layerdiff.tensors import flat
from layerdiff.torch._capture import CapturedLayer
from layerdiff.torch._streamed import weight


def as_input_tuple(inputs) -> tuple:
    if isinstance(inputs, torch.Tensor):
        return (inputs,)
    if isinstance(inputs, (tuple, list)) and all(isinstance(t, torch.Tensor) for t in inputs):
        return tuple(inputs)
    raise _layerdiff.InputError(
        f"example inputs must be a tensor or a tuple of tensors, got {type(inputs).__name__}"
    )


def by_position(model, inputs):
    """A model given its inputs by name (a dict of tensors, as a tokenizer returns them) as one
    taking them in that order (`Keywords`), with the tensors as a tuple; other inputs as they
    are."""
    if not (isinstance(inputs, dict) and inputs):
        return model, inputs
    if not all(isinstance(k, str) and isinstance(t, torch.Tensor) for k, t in inputs.items()):
        raise _layerdiff.InputError(
            "example inputs given by name must map names to tensors, got "
            + ", ".join(f"{k!r}: {type(t).__name__}" for k, t in inputs.items())
        )
    from layerdiff.torch._checkpoint import Keywords

    return Keywords(model, list(inputs)), tuple(inputs.values())


class Whole(nn.Module):
    """A model that is one module without children (a bare `nn.Linear`), registered inside
    this one under its class's name: the layers are the leaf modules a model calls, and such a
    model is then one, `Linear` (its parameters `Linear.weight`…), exported in its scope."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.add_module(type(model).__name__, model)
        object.__setattr__(self, "model_", model)

    def forward(self, *args, **kwargs):
        return self.model_(*args, **kwargs)


def model_name(model) -> str:
    """The model's name in a report given none: its class's (the held model's, inside a
    holder such as `Keywords`)."""
    return type(getattr(model, "model_", model)).__name__


def model_and_inputs(model, inputs, seed: int | None, streams=None) -> tuple[nn.Module, tuple]:
    """The model and its inputs as a tuple; a checkpoint folder given as the model is loaded
    (`layerdiff.torch.load_checkpoint`), with inputs made from its config unless given, and
    held one module at a time where ``streams`` (`Options.streams_weights`) says so of its
    size."""
    from layerdiff.torch._checkpoint import is_checkpoint, load_checkpoint

    if is_checkpoint(model):
        model, made = load_checkpoint(model, seed or 0, streams=streams)
        inputs = made if inputs is None else inputs
    elif isinstance(model, (str, Path)):
        raise _layerdiff.UsageError(
            f"`{model}` is not a folder: a model is an nn.Module, or a transformers checkpoint "
            "folder's path"
        )
    model, inputs = by_position(model, inputs)
    if isinstance(model, nn.Module) and next(model.children(), None) is None:
        model = Whole(model)
    return model, as_input_tuple(inputs)


#: What `grad` holds at once, and what holds a checkpoint one module at a time instead.
GRAD_HOLDS = "`layerdiff grad` holds the whole model, its gradients and their float64 truth at once"
GRAD_INSTEAD = "compare its forward pass with `layerdiff torch FOLDER --target …`"


def whole_only(options, model, holds: str, instead: str | None):
    """For a flow that holds the whole model (`holds`, in words), the ``streams`` of
    `model_and_inputs`: a checkpoint whose weights `options`' budget would have held one module
    at a time is refused before it is loaded, with what to do (`instead`: a way that holds it
    one module at a time)."""

    def streams(size: int) -> bool:
        if options.streams_weights(size):
            other = f", or {instead}, which holds it one module at a time" if instead else ""
            raise _layerdiff.UsageError(
                f"{holds}, and the weights of `{model}` alone take {_layerdiff.bytes_text(size)} "
                "in float32, more than the memory budget allows at once: give a --max-memory "
                f"they fit in several times over{other}"
            )
        return False

    return streams


def whole_model_and_inputs(model, inputs, seed: int | None, options):
    """`model_and_inputs` for `grad`, which holds the whole model: a checkpoint folder past
    `options`' budget is refused before it is loaded (`whole_only`)."""
    streams = whole_only(options, model, GRAD_HOLDS, GRAD_INSTEAD)
    return model_and_inputs(model, inputs, seed, streams=streams)


def model_notes(model, *, decoding: bool = False) -> list[str]:
    """What a report says of how the model was taken: a checkpoint's loading, the cache of a
    transformers model turned off (`cache_off`; not when `decoding`, which uses it), and the
    eval mode it was put in (`to_eval`)."""
    said = getattr(model, "said", None)
    cache = None if decoding else cache_off(model)
    return [n for n in (said if isinstance(said, str) else None, cache, to_eval(model)) if n]


def cache_off(model) -> str | None:
    """A transformers model with its key/value cache on (`use_cache=True`, the default) has it
    turned off, as a checkpoint folder's is, and says so: one forward pass is compared, and the
    cache it would return (a `DynamicCache`) is no tensor an exporter can trace or a comparison
    can pair. The cached path is what `--decode-steps` compares."""
    config = getattr(model, "config", None)
    if getattr(config, "use_cache", None) is not True:
        return None
    config.use_cache = False
    return (
        f"the {model_name(model)}'s key/value cache is turned off (use_cache=False), as for a "
        "checkpoint folder: one forward pass is compared; `layerdiff torch MODEL --decode-steps "
        "N` compares the cached path"
    )


def to_eval(model) -> str | None:
    """Puts the model in eval mode, as it is exported and deployed; says so when a module that
    computes differently in training was in training mode (dropout would make each run differ,
    batch norm would use the batch's statistics)."""
    from torch.nn.modules.batchnorm import _BatchNorm
    from torch.nn.modules.dropout import _DropoutNd

    training = [
        name
        for name, m in model.named_modules()
        if m.training
        and isinstance(m, (_DropoutNd, _BatchNorm))
        and (not isinstance(m, _DropoutNd) or m.p > 0)
    ]
    model.eval()
    if not training:
        return None
    return (
        f"the model was in training mode ({', '.join(training[:3])}"
        f"{'…' if len(training) > 3 else ''}): compared in eval mode (dropout off, batch norm "
        "on its running statistics), as it is exported; call model.eval() to silence this"
    )


def timed_phases(timings) -> tuple[list, object]:
    """The phases measured so far (``timings`` as the API takes it) and ``lap(phase, by)``,
    which adds the time since the last lap under `phase`."""
    phases = list(timings) if isinstance(timings, list) else []
    clock = [time.perf_counter()]

    def lap(phase: str, by: str = "pytorch") -> None:
        now = time.perf_counter()
        phases.append((phase, by, now - clock[0]))
        clock[0] = now

    return phases, lap


def run_model(inputs: tuple, call):
    """`call()`, with a failure of the model itself reported as bad input (our own errors, e.g.
    from the ONNX side while layers stream in, pass through)."""
    try:
        return call()
    except _layerdiff.LayerdiffError:
        raise
    except Exception as e:
        shapes = ", ".join(f"{tuple(t.shape)} {t.dtype}" for t in inputs)
        raise _layerdiff.InputError(
            f"the model failed on its inputs ({shapes}): {type(e).__name__}: {e}"
        ) from e


def progress_line(progress, total: int):
    """The line of layers done over `total` layers (the engine's), when the command prints its
    progress; else None."""
    quiet = progress is None or getattr(progress, "quiet", True)
    return _layerdiff.Ticker.over(total, quiet)


def finished(run, listed: list[CapturedLayer], model: nn.Module, target: nn.Module | None = None):
    """The report of `run` (concluded): each layer whose cause needs weights is handed its
    parameters (and the target's, where `target` is a PyTorch side) one group at a time, which
    the run drops after, so a model held one module at a time is never read whole."""
    for group in run.evidence_groups():
        # the reference's are copied by the run before the target's are read
        run.layer_evidence(layer_parameters(model, listed, group), gather=target is None)
        if target is not None:
            run.layer_evidence({}, layer_parameters(target, listed, group, folded=False))
    return run.finish({})


_CONV = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d)
_BATCH_NORM = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)


def layer_parameters(
    model: nn.Module, listed: list[CapturedLayer], needed: list[int], *, folded: bool = True
) -> dict:
    """The parameters and buffers of the layers in `needed` (by index), as flat tensors by
    qualified name, for the weight check. With ``folded``, a BatchNorm fed by a Conv also lists
    the Conv's weight and bias folded with it, under the Conv's names: that is the form
    exporters write when they fuse the two."""
    modules = dict(model.named_modules())
    out: dict[int, list] = {}
    for index in needed:
        layer = listed[index]
        module = modules.get(layer.module)
        if module is None:
            continue

        def held(m: nn.Module, name: str):
            """`m`'s parameter or buffer `name` (None where it has none), a streamed model's
            read from its files."""
            t = getattr(m, name, None)
            return None if t is None else weight(m, name, t).detach()

        own = [
            (f"{layer.module}.{n}", held(module, n))
            for n, t in [
                *module.named_parameters(recurse=False),
                *module.named_buffers(recurse=False),
            ]
            if t is not None and t.is_floating_point()
        ]
        feeder = listed[layer.input_from] if layer.input_from is not None else None
        conv = modules.get(feeder.module) if feeder is not None else None
        if (
            folded
            and isinstance(module, _BATCH_NORM)
            and isinstance(conv, _CONV)
            and module.track_running_stats
        ):
            scale = module.running_var.add(module.eps).rsqrt()
            if module.weight is not None:
                scale = scale * held(module, "weight")
            shift = -module.running_mean * scale
            if module.bias is not None:
                shift = shift + held(module, "bias")
            conv_weight, conv_bias = held(conv, "weight"), held(conv, "bias")
            shape = (-1,) + (1,) * (conv_weight.dim() - 1)
            own.append((f"{feeder.module}.weight", conv_weight * scale.reshape(shape)))
            bias = shift if conv_bias is None else conv_bias * scale + shift
            own.append((f"{feeder.module}.bias", bias))
            own += [
                (f"{feeder.module}.{n}", held(conv, n))
                for n, _ in conv.named_parameters(recurse=False)
            ]
        out[index] = [flat(n, t) for n, t in own]
    return out
