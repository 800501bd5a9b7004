"""`layerdiff torch MODEL --decode-steps N`: a transformers decoder compared as it generates, the
prefill and then N single-token steps that read the key/value cache. Each point is one forward
pass of `DecodeStep` (token ids, attention mask, position ids and the cache in; the logits and
the cache grown by the new tokens out), compared layer by layer like any model, both sides fed
the same inputs: the reference's greedy tokens and the reference's cache. A fault only in the
cached path (a position offset, a mask of the wrong length, a rotary table shifted for past
tokens) is then born at step 1 at its layer, not blurred into the prefill; the cache entries
the attention layers write (their `cat`s) are layers too. The points make one axis report
(`layerdiff._layerdiff.AxisReport`, axis ``decode step``)."""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path

import torch
from torch import nn

from layerdiff import _layerdiff
from layerdiff.torch._checkpoint import Checkpoint, Holding

AXIS = "decode step"


class DecodeStep(Holding):
    """One forward pass of a transformers decoder with its cache: ``forward(input_ids,
    attention_mask, position_ids, past_key_values_0_key, past_key_values_0_value, …)`` (the cache
    given as each layer's keys and values, none at the prefill), returns ``(logits, *present)``,
    the cache with this pass's tokens appended: an ONNX file of it takes and gives what a
    deployed decoder's does. Made by `decode_step` (its signature names every layer's entries).
    """

    def _step(self, input_ids, attention_mask, position_ids, past):
        from transformers import DynamicCache

        cache = DynamicCache(config=self.model_.config)
        given = [t for t in past if t is not None]
        for layer, keys, values in zip(cache.layers, given[::2], given[1::2], strict=False):
            # The given cache as the layer holds it (no `cat` onto an empty one, which would
            # be a layer of its own here).
            layer.lazy_initialization(keys, values)
            layer.keys, layer.values = keys, values
        out = self.model_(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=cache,
            use_cache=True,
        )
        present = []
        for layer in out.past_key_values.layers:
            present += [layer.keys, layer.values]
        return (out.logits, *present)


def decode_step(model: nn.Module) -> DecodeStep:
    """`DecodeStep` of the transformers decoder `model`, its forward taking each layer's cache
    entries by name (an export names its inputs after them)."""
    layers = model.config.get_text_config().num_hidden_layers
    names = [f"past_key_values_{i}_{kv}" for i in range(layers) for kv in ("key", "value")]
    source = (
        "def forward(self, input_ids, attention_mask, position_ids, "
        + ", ".join(f"{n}=None" for n in names)
        + "):\n    return self._step(input_ids, attention_mask, position_ids, ("
        + "".join(f"{n}, " for n in names)
        + "))\n"
    )
    scope: dict = {}
    exec(source, scope)  # noqa: S102 (a signature of generated names, nothing of the user's)
    cls = type(f"DecodeStep{layers}", (DecodeStep,), {"forward": scope["forward"]})
    return cls(model)


def decoder_of(model) -> nn.Module:
    """The transformers decoder inside `model` (a checkpoint folder's, a built-in's, or one
    given as it is), or a `UsageError` saying what `--decode-steps` takes."""
    inner = getattr(model, "model_", None) or getattr(model, "model", None)
    for candidate in (inner, model):
        config = getattr(candidate, "config", None)
        if (
            isinstance(candidate, nn.Module)
            and config is not None
            and hasattr(config, "use_cache")
            and not getattr(config, "is_encoder_decoder", False)
            and hasattr(candidate, "generate")
        ):
            return candidate
    raise _layerdiff.UsageError(
        f"--decode-steps needs a transformers decoder with a key/value cache (a checkpoint "
        f"folder, the built-in gpt2 or llama, or a builder returning one); "
        f"`{type(model).__name__}` is not one"
    )


def _prompt(inputs: tuple, limit: int | None, steps: int) -> tuple[tuple, str | None]:
    """Token ids, mask and position ids from the prompt the model was given (its ids at least),
    cut where the prompt and the steps would pass the model's last position (``limit``), and
    what was cut, in words."""
    ids = inputs[0]
    if not isinstance(ids, torch.Tensor) or ids.dtype not in (torch.int64, torch.int32):
        raise _layerdiff.UsageError(
            "--decode-steps needs token ids as the model's first input, got "
            f"{getattr(ids, 'dtype', type(ids).__name__)}"
        )
    ids = ids.long()
    if ids.dim() != 2 or ids.shape[0] != 1:
        raise _layerdiff.UsageError(
            f"--decode-steps decodes one sequence: the token ids have shape {list(ids.shape)}, "
            "not [1, tokens]"
        )
    cut = None
    if limit is not None and ids.shape[1] + steps > limit:
        if limit - steps < 1:
            raise _layerdiff.UsageError(
                f"--decode-steps {steps}: the model has {limit} positions, too few for a prompt "
                f"and {steps} steps"
            )
        cut = (
            f"the prompt cut from {ids.shape[1]} to {limit - steps} tokens: the model's "
            f"{limit} positions end there"
        )
        ids = ids[:, : limit - steps]
    mask = torch.ones_like(ids)
    positions = torch.arange(ids.shape[1]).unsqueeze(0)
    return (ids, mask, positions), cut


def points(step: DecodeStep, prompt: tuple, steps: int) -> list[tuple[str, tuple]]:
    """The inputs of each point, from the reference's own run (float32, eager, greedy): the
    prefill on the prompt (`_prompt`, with an empty cache, as a deployed decoder's file is
    run), then each step on the token the reference chose and its cache."""
    ids, mask, positions = prompt
    with torch.no_grad():
        out = step(ids, mask, positions)
    empty = tuple(t[:, :, :0].clone() for t in out[1:])
    at = [("prefill", (ids, mask, positions, *empty))]
    for k in range(1, steps + 1):
        token = out[0][:, -1].argmax(-1, keepdim=True)
        length = at[-1][1][1].shape[1] + token.shape[1]
        given = (
            token,
            torch.ones(1, length, dtype=torch.long),
            torch.tensor([[length - 1]]),
            *(t.detach().clone() for t in out[1:]),
        )
        at.append((str(k), given))
        if k < steps:
            with torch.no_grad():
                out = step(*given)
    return at


def compare_decoding(
    model, inputs=None, *, steps: int = 4, onnx=None, exporter: str = "dynamo", workdir=None,
    seed: int = 0, name=None, options=None, progress=None, target: str = "ort",
    tolerance: float | str = "dtype", cache: bool = True, at_point=None,
):  # fmt: skip
    """A transformers decoder (`model`: a checkpoint folder, a built-in decoder, or one given
    as it is, with its prompt ``inputs``: token ids first) compared at the prefill and at
    ``steps`` single-token steps reading the cache: the axis report, each point's `(label,
    Report)`, and notes on the run. ``target`` and ``tolerance`` as for
    :func:`layerdiff.torch.compare_torch_onnx` (``options``, already parsed, replaces them);
    ``onnx``: the decoder's file with its cache as inputs and outputs, in `DecodeStep`'s order
    (token ids, mask, position ids, then each layer's keys and values), run at every point (the
    prefill with an empty cache); else the decoder is exported so, once. ``at_point``: called
    as ``at_point(label, step, inputs, report)`` after each point's comparison, while the file it
    ran exists (a repro is cut from it); True stops the decoding there."""
    from layerdiff.torch import compare_torch, compare_torch_onnx
    from layerdiff.torch._running import model_and_inputs, model_notes

    if steps < 1:
        raise _layerdiff.UsageError(f"--decode-steps takes a number of steps from 1, got {steps}")
    model, inputs = model_and_inputs(model, inputs, seed)
    notes = model_notes(model, decoding=True)
    if isinstance(model, Checkpoint):  # its note without "its cache off": decoding turns it on
        notes[0] = model.loaded
    decoder = decoder_of(model).eval()
    step = decode_step(decoder).eval()
    if options is None:
        options = _layerdiff.Options(tolerance=tolerance, target=target)
    say = progress or (lambda message: None)
    limit = getattr(decoder.config.get_text_config(), "max_position_embeddings", None)
    prompt, cut = _prompt(inputs, limit if isinstance(limit, int) else None, steps)
    notes += [cut] if cut else []
    say(f"decoding {steps} step(s) on the reference to make each step's inputs")
    at = points(step, prompt, steps)
    notes.append(
        f"decoded {steps} step(s) after a {at[0][1][0].shape[1]}-token prefill, both sides fed "
        "the reference's greedy tokens and its key/value cache at every step"
    )
    with contextlib.ExitStack() as stack:
        folder = (
            Path(workdir) if workdir else Path(stack.enter_context(tempfile.TemporaryDirectory()))
        )
        folder.mkdir(parents=True, exist_ok=True)
        files = [None] * len(at)
        if onnx is not None:
            _check_file(onnx, at[0][1])
        if options.torch_target is None:
            files = [onnx] * len(at) if onnx is not None else None
            if files is None:
                # a folder of the user's gets its own file
                export = {"exporter": exporter, "cache": cache, "copy": workdir is not None}
                files = _exported(step, at, folder, notes, say, **export)
        # A given file that computes a layer differently is set beside the decoder's own
        # export, made as a decoder's file is (its lengths dynamic) and once for every step:
        # one made for a step's shapes numbers its constants otherwise.
        fresh: list = []

        def beside(k: int):
            def made():
                if not fresh:
                    say("exporting the decoder, to name what differs in the file")
                    where = Path(stack.enter_context(tempfile.TemporaryDirectory()))
                    export = {"exporter": exporter, "cache": cache, "copy": False}
                    fresh.extend(_exported(step, at, where, notes, say, **export))
                return fresh[k]

            # a file this run exported is the decoder's export itself
            return made if onnx is not None else files[k]

        reports = []
        for k, ((label, given), file) in enumerate(zip(at, files, strict=True)):
            say(f"{AXIS} {label}")
            common = {"options": options, "seed": seed, "name": name, "progress": progress}
            if options.torch_target is not None:
                report = compare_torch(step, given, **common)
            else:
                report = compare_torch_onnx(
                    step, given, onnx=file, workdir=folder / slug(label), beside=beside(k),
                    **common,
                )  # fmt: skip
            reports.append((label, report))
            if at_point is not None and at_point(label, step, given, report):
                break
    native = _layerdiff.AxisReport(
        AXIS, [label for label, _ in reports], [r._native for _, r in reports]
    )
    return native, reports, notes


def _check_file(path, given: tuple) -> None:
    """A `UsageError` where the file given is no decoder with its cache as inputs."""
    import onnx

    try:
        graph = onnx.load(str(path), load_external_data=False).graph
    except Exception:
        return  # the comparison says what is wrong with the file itself
    initializers = {i.name for i in graph.initializer}
    names = [i.name for i in graph.input if i.name not in initializers]
    if len(names) != len(given):
        layers = (len(given) - 3) // 2
        raise _layerdiff.UsageError(
            f"--decode-steps: `{path}` takes {len(names)} input(s) ({', '.join(names[:4])}"
            f"{', …' if len(names) > 4 else ''}); decoding runs a file that takes the token ids, "
            f"the attention mask, the position ids and each of the {layers} layers' cached keys "
            f"and values ({len(given)} inputs, in that order), as the decoder's export with "
            "--decode-steps writes it (--out DIR keeps it as model.onnx)"
        )


def _exported(step, at, folder: Path, notes: list, say, **export) -> list:
    """Each point's ONNX file: one for all, its token count and cache length dynamic, as a
    deployed decoder's is (exported from two tokens after a three-token cache, lengths that
    cannot be taken for constants); each point's own where the model will not export so.
    The example is the first step's whatever the number of steps (the export cache keys on its
    values), so another run of the same decoder with more or fewer steps reuses the file.
    ``export``: `export_onnx`'s ``exporter``, ``cache`` and ``copy``."""
    from layerdiff.torch import export_onnx

    first = next((given for _, given in at[1:] if given[3].shape[2] >= 3), at[-1][1])
    example = (
        first[0].repeat(1, 2),
        torch.ones(1, 5, dtype=torch.long),
        torch.tensor([[3, 4]]),
        *(t[:, :, :3].clone() for t in first[3:]),
    )
    dynamic = [[1], [1], [1], *([[2]] * (len(first) - 3))]
    try:
        path = export_onnx(
            step,
            example,
            folder / "model.onnx",
            dynamic=dynamic,
            step=lambda said: say(f"{said}, the token count and the cache length dynamic"),
            **export,
        )
        return [path] * len(at)
    except _layerdiff.ModelError as e:
        notes.append(
            f"the decoder does not export with its lengths dynamic ({str(e).splitlines()[0]}): "
            "exported at each point instead"
        )
    files = []
    for label, given in at:
        say(f"exporting to ONNX ({export['exporter']}): {AXIS} {label}")
        name = folder / f"{slug(label)}.onnx"
        files.append(export_onnx(step, given, name, **export))
    return files


def slug(label: str) -> str:
    """A point's folder name (`prefill`, `step-1`)."""
    return label if label == "prefill" else f"step-{label}"
