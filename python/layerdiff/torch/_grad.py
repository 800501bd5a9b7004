"""`layerdiff grad`: a model's gradients on another device, precision or compiler, against the
model as given, in the order backward produces them: the gradient of every parameter, of every
floating-point input, and the gradient each module call's backward hands on to what fed it
(`fc:input`), compared, judged and explained by the same engine as the layers of `layerdiff
torch`.

Each of them also has its own error: every module call's backward is made again on its own
(`layerdiff.torch._backward`) in the target's precision on the reference's saved inputs and output
gradient, and exactly in float64 on the same values rounded to the target's dtype (its
same-precision baseline). So a backward that computes wrongly is told from one that only rounds,
and from one that merely carries an error from downstream.

Both sides differentiate the same loss of the same model instance on the same input bytes, in
eval mode (no dropout, batch norms on their running statistics: one function on both sides).
In float16 the loss is scaled as `torch.amp.GradScaler` does (from 2**16, halved while a
gradient is not finite, as its skipped steps would) and the gradients are unscaled in float32
before they are compared: what the optimizer would see.
"""

from __future__ import annotations

import torch

from layerdiff import _layerdiff
from layerdiff._layerdiff import CapturedLayer
from layerdiff.report import Report
from layerdiff.tensors import dtype_name, flat
from layerdiff.torch import _backward, _baseline
from layerdiff.torch._backward import Pass, input_layer
from layerdiff.torch._capture import _first_tensor, capture, module_readers
from layerdiff.torch._ddp import across_the_batch, ranked_layers, sharded_inputs
from layerdiff.torch._gradients import (
    both_sides,
    completed,
    float64_gradients,
    missing_as_zero,
    skipped_note,
    summed,
)
from layerdiff.torch._sides import _WORDS, TorchSide, cuda_math


def compare_gradients(
    model,
    inputs=None,
    *,
    target: str = "torch:bf16",
    reference: str = "torch",
    loss: str = "dot",
    tolerance: float | str = "dtype",
    local: bool = True,
    float64: bool = True,
    max_memory: int | str | None = None,
    name: str | None = None,
    seed: int | None = None,
    timings: bool | list = False,
    options: _layerdiff.Options | None = None,
    progress=None,
) -> Report:
    """Compare a model's gradients on the PyTorch side ``target`` (``"torch:bf16"``,
    ``"torch:cuda:amp-fp16"``, ``"torch:compile"``…) with those on ``reference`` (default: the
    model as given), for every parameter, floating-point input and module call's input, in
    backward order. ``model`` may be a transformers checkpoint folder, as for
    :func:`layerdiff.torch.compare_torch_onnx`.

    ``loss`` is ``"dot"`` (the output's dot product with a fixed random tensor from ``seed``,
    so every output element has its own gradient) or ``"sum"``. ``tolerance`` and ``float64``
    (the float64 gradients as the truth) as for :func:`layerdiff.torch.compare_torch`. With
    ``local`` each module call's backward is also run alone on the reference's values, so every
    gradient has its own error, held against its same-precision baseline (with ``float64``).
    ``report.drift_origin`` is the first module, in backward order, whose backward computes
    differently (or, with rounding only, where the rounding is born). ``max_memory`` bounds the
    values held at once; a checkpoint folder whose float32 weights pass it is refused before it
    is loaded (the gradients need the whole model).
    """
    from layerdiff.torch._running import model_name, model_notes, whole_model_and_inputs

    step = progress or (lambda message: None)
    if options is None:
        options = _layerdiff.Options(
            tolerance=tolerance, local=local, max_memory=max_memory, target=target,
            reference=reference, float64=float64,
        )  # fmt: skip
    model, inputs = whole_model_and_inputs(model, inputs, seed, options)
    loss = _layerdiff.choice("loss", loss)
    if options.torch_target is None:
        raise _layerdiff.UsageError("compare_gradients compares PyTorch sides (`torch:bf16`…)")
    ref_side = TorchSide.of(options.reference)
    tgt_side = TorchSide.of(options.torch_target, ranks=True)

    notes = model_notes(model)
    if tgt_side.ranks > 1:
        inputs, drawn = sharded_inputs(inputs, ref_side, tgt_side, seed or 0)
        notes += [drawn] if drawn else []
    with torch.no_grad():
        out = _first_tensor(model(*inputs))
    if out is None or not out.is_floating_point():
        raise _layerdiff.InputError("the model's output is not a floating-point tensor")
    generator = torch.Generator().manual_seed(seed or 0)
    cotangent = (
        torch.randn(out.shape, generator=generator) if loss == "dot" else torch.ones(out.shape)
    )
    listing = capture(model, inputs)
    whole = frozenset(listing.self_computing)
    if whole:
        listing = capture(model, inputs, whole=whole)

    with cuda_math(ref_side, tgt_side):
        ref, tgt, listing, whole, warnings = both_sides(
            model, inputs, (ref_side, tgt_side), cotangent, listing, whole, step
        )
        if not ref.order:
            raise _layerdiff.InputError("the model has no parameter or input that takes a gradient")
        truth, lost = None, None
        if options.float64:
            step("forward and backward in float64 (the truth)")
            try:
                truth = float64_gradients(model, inputs, cotangent, whole)
            except Exception as e:  # compared without it, and said so
                lost = f"no float64 truth: the float64 copy failed ({type(e).__name__}: {e})"
        warnings += missing_as_zero(ref, tgt)
        gradients = _Gradients(model, ref, tgt, truth, ref_side, tgt_side)
        if tgt_side.ranks == 1:  # a data-parallel side's own values are its ranks' (`_ddp`)
            step("each module's backward alone")
            gradients.own(local=options.local, exact=options.float64 and options.local)

    layers = gradients.layers(listing.layers)
    if tgt_side.ranks > 1:
        layers = ranked_layers(gradients, layers, local=options.local, exact=options.float64)
    given = [flat(f"input_{i}", t) for i, t in enumerate(inputs)]
    run = _layerdiff.CapturedRun(
        command="grad",
        model=name or model_name(model),
        inputs=given,
        layers=layers,
        options=options,
        seed=seed,
        reference_runtime="pytorch",
        reference_detail=f"{ref_side.describe()}; {_how(ref, loss)}",
        target_detail=f"{tgt_side.describe()}; {_how(tgt, loss)}",
        reduced_math=tgt_side.reduced_math(),
        lower_precision=_lower_precision(tgt_side, ref_side),
        timings=list(timings) if isinstance(timings, list) else ([] if timings else None),
    )
    step(f"comparing {len(layers)} gradients")
    for index, layer in enumerate(layers):
        gradients.hand(run, index, layer.name)
    needed = run.conclude()
    names = {i: layers[i].name for i in needed}
    native = run.finish(
        {i: [flat(k, ref.parameters[k])] for i, k in names.items() if k in ref.parameters},
        {i: [flat(k, tgt.parameters[k])] for i, k in names.items() if k in tgt.parameters},
    )
    report = Report(native, inputs=given)
    if tgt_side.ranks > 1:
        warnings += across_the_batch(report.data)
    report = report.warned(warnings)
    owners = {x.name: x.module for x in layers}
    report = report.advised_by_module(owners)
    report.notes += [*notes, *(n for n in (lost, skipped_note(tgt)) if n)]
    return report


class _Gradients:
    """The gradients of every layer on each side, and each layer's own (local) gradient and its
    exact one, from the module calls' backwards made alone."""

    def __init__(self, model, ref: Pass, tgt: Pass, truth: Pass | None, ref_side, tgt_side):
        self.ref, self.tgt, self.truth = ref, tgt, truth
        self.ref_side, self.tgt_side = ref_side, tgt_side
        self.reference_modules = dict(ref.model.named_modules())
        self.target_modules = dict(tgt.model.named_modules())
        # the model's own, whose weights the exact backward rounds to the target's dtype (not
        # a reference's that holds them rounded itself: a bfloat16 reference of float16)
        self.model_modules = dict(model.named_modules())
        # the reference's values as the target holds them
        self.as_target = tgt_side.converter_from(ref_side)
        self.truth_modules = dict(truth.model.named_modules()) if truth is not None else {}
        # each parameter's key by (module path, attribute), as the reference names it
        keys = {id(p): n for n, p in model.named_parameters()}
        self.key = {
            (path, attribute): keys[id(p)]
            for path, module in model.named_modules()
            for attribute, p in module.named_parameters(recurse=False)
        }
        self.owner = {k: path for (path, _), k in self.key.items()}
        self.types = {path: type(m).__name__ for path, m in model.named_modules()}
        self.values: dict[str, tuple] = {}  # layer → (reference, target, float64)
        self.local: dict[str, torch.Tensor | str] = {}
        self.exact: dict[str, torch.Tensor] = {}
        self.grid: dict[str, torch.dtype] = {}
        # a parameter's gradient: its terms per element, their root sum of squares, and the
        # terms themselves where handed over
        self.terms: dict[str, tuple[int, torch.Tensor, torch.Tensor | None]] = {}

    def own(self, *, local: bool, exact: bool) -> None:
        """Each call's input gradient on both sides (and in float64), and, with `local`, every
        layer's own gradient (the target's backward of each call on the reference's values)
        and, with `exact`, its exact one (see `_backward.exact_vjp`)."""
        ref, tgt, truth = self.ref, self.tgt, self.truth
        # parameter or input → [local parts, exact parts, grid, reference parts, terms parts]
        sums: dict[str, list] = {}
        for name, call in ref.calls.items():
            if call.grad_output is None:
                continue  # its output does not reach the loss: no gradient passes through it
            theirs = tgt.calls.get(name)
            mine = self._vjp(ref, call, self.reference_modules, self.ref_side)
            layer = input_layer(name)
            if mine.input is not None and theirs is not None and theirs.grad_output is not None:
                other = self._vjp(tgt, theirs, self.target_modules, self.tgt_side)
                wide = None
                if truth is not None and name in truth.calls:
                    wide = self._vjp(truth, truth.calls[name], self.truth_modules, None).input
                self.values[layer] = (mine.input, other.input, wide)
            if not local or call.grad_output is None:
                continue
            try:
                own = self._vjp(
                    ref, call, self.target_modules, self.tgt_side, tgt.scale, self.as_target
                )
            except Exception as e:  # the target's own failure is that layer's finding
                self.local[layer] = f"the target's backward of `{name}` failed alone: {e}"
                continue
            precise = None
            if exact:
                precise = _backward.exact_vjp(
                    self.model_modules[call.module], call, call.grad_output,
                    held=self.as_target, dtype=own.dtype,
                    scale=tgt.scale,
                )  # fmt: skip
            # (layer, its own part, its exact part, the reference's part), aligned by position
            for (key, g), (_, x), (_, r) in zip(
                self._parts(call, own),
                self._parts(call, precise) if precise is not None else self._nones(call),
                self._parts(call, mine),
                strict=True,
            ):
                if g is None and r is not None:
                    # the target's module does not use what the reference's does: its own
                    # gradient there is zero
                    g = torch.zeros_like(r, dtype=own.dtype)
                if g is None:
                    continue
                entry = sums.setdefault(key, [[], [], own.dtype, []])
                entry[0].append(g)
                if x is not None:
                    entry[1].append(x)
                if r is not None:
                    entry[3].append(r)
            if precise is not None:
                for n, key in self._parameter_names(call):
                    if n in precise.terms and key in sums:
                        sums[key].append(precise.terms[n])
        if local:
            for call in ref.owner_calls:
                self._own_code(call, sums, exact=exact)
        for key, (local_parts, exact_parts, grid, reference_parts, *terms) in sums.items():
            if terms and len(terms) == len(local_parts):
                # a parameter several calls use: their terms together (in no one order)
                count = sum(k for k, *_ in terms)
                each = terms[0][2] if len(terms) == 1 else None
                self.terms[key] = (count, sum(r**2 for _, r, _ in terms).sqrt(), each)
            held = local_parts[0].dtype
            # what reaches this gradient through computation outside module calls (a residual
            # add between them), as the reference computes it: no call's own error
            rest = 0.0
            if len(reference_parts) == len(local_parts) and key in self.ref.grads:
                covered = sum(p.double() for p in reference_parts)
                rest = self.ref.grads[key].double() - covered.to(self.ref.grads[key].device)
            self.local[key] = completed(local_parts, rest, held)
            if exact_parts and len(exact_parts) == len(local_parts):
                # gradients from several calls: each one's ideal gradient, rounded as the
                # target holds it, added up (the accumulation's rounding is the baseline's)
                if len(exact_parts) > 1:
                    exact_parts = [_baseline.rounded(x.to(held), None) for x in exact_parts]
                self.exact[key] = summed(exact_parts) + (
                    rest.cpu() if isinstance(rest, torch.Tensor) else rest
                )
                # the grid is the narrower of what the backward computes in and what the
                # target holds the gradient in (an autocast region's gradient, held in bfloat16,
                # of a module that computes nothing itself: a Dropout in eval)
                known = key in self.values or key in self.tgt.grads
                theirs = self._value(key)[1] if known else None
                kept = theirs.dtype if isinstance(theirs, torch.Tensor) else held
                self.grid[key] = _baseline.narrower(grid, _baseline.narrower(held, kept))

    def _own_code(self, call, sums: dict, *, exact: bool) -> None:
        """The gradients of the parameters a module's own code uses (`_backward.OwnerCall`),
        added to `sums` as `own` adds a module call's: its own code re-run alone on the target,
        on the reference, and exactly."""
        if call.grad_output is None:
            return
        keys = {n: self.key[(call.module, n)] for n, _ in
                self.reference_modules[call.module].named_parameters(recurse=False)
                if (call.module, n) in self.key}  # fmt: skip
        tgt, module = self.tgt, call.module
        try:
            own = _backward.owner_vjp(
                self.target_modules[module], call, call.grad_output, self.as_target,
                self.tgt_side.running, tgt.scale,
            )  # fmt: skip
            mine = _backward.owner_vjp(
                self.reference_modules[module], call, call.grad_output, self.ref_side.convert,
                self.ref_side.running, self.ref.scale,
            )  # fmt: skip
        except Exception as e:  # the target's own failure is that parameter's finding
            for key in keys.values():
                self.local.setdefault(
                    key, f"the target's backward of `{module}`'s own code failed alone: {e}"
                )
            return
        precise = None
        if exact:
            precise = _backward.exact_vjp(
                self.model_modules[module], call, call.grad_output,
                held=self.as_target, dtype=own.dtype, scale=tgt.scale,
            )  # fmt: skip
        for n, key in keys.items():
            g, r = own.parameters.get(n), mine.parameters.get(n)
            if g is None:
                continue
            entry = sums.setdefault(key, [[], [], own.dtype, []])
            entry[0].append(g)
            if precise is not None and n in precise.parameters:
                entry[1].append(precise.parameters[n])
            if r is not None:
                entry[3].append(r)
            if precise is not None and n in precise.terms:
                entry.append(precise.terms[n])

    def _parts(self, call, found) -> list[tuple]:
        """The gradients one call's backward gives: (layer, gradient) for its input, its
        parameters and each model input it reads (a model input read twice, twice)."""
        parts = [(input_layer(call.name), found.input)]
        parts += [(key, found.parameters.get(n)) for n, key in self._parameter_names(call)]
        parts += [(f"inputs[{i}]", found.inputs.get(k)) for k, i in call.reads.items()]
        return parts

    def _nones(self, call) -> list[tuple]:
        return [(key, None) for key, _ in self._parts(call, _backward.Vjp(None, {}, {}, None))]

    def _parameter_names(self, call) -> list[tuple[str, str]]:
        """The parameters a call's backward gives (its module's, its submodules' included, as a
        MultiheadAttention uses its `out_proj`'s): (name within the module, layer)."""
        module = self.reference_modules[call.module]
        found = []
        for n, p in module.named_parameters():
            if not p.requires_grad:
                continue
            # a parameter shared under another name (T5's `encoder.embed_tokens.weight` is
            # `shared.weight`) is the layer of its first name
            sub, _, attribute = n.rpartition(".")
            path = ".".join(x for x in (call.module, sub) if x)
            if (path, attribute) in self.key:
                found.append((n, self.key[(path, attribute)]))
        return found

    def _vjp(self, side: Pass, call, modules, torch_side, scale=None, prepare=None):
        """`call` made again alone with `modules[call.module]`, as `torch_side` runs it (None:
        as given, the float64 truth), its values converted by `prepare` where given (another
        side's values, as this one holds them)."""
        if prepare is None:
            prepare = torch_side.convert if torch_side is not None else (lambda t: t)
        running = torch_side.running if torch_side is not None else _backward._nothing
        return _backward.vjp(
            modules[call.module], call, call.grad_output, prepare, running,
            side.scale if scale is None else scale,
        )  # fmt: skip

    def layers(self, listed) -> list[CapturedLayer]:
        """The report's layers in backward order, each with the layers its error comes in
        through (the input gradients of the calls that read its call's output)."""
        # a call whose first input is a model input only it reads hands on that input's
        # gradient (`inputs[0]`): one layer, not two
        readers_of: dict[int, list[str]] = {}
        for name, call in self.ref.calls.items():
            for i in set(call.reads.values()):
                readers_of.setdefault(i, []).append(name)
        same = {
            input_layer(name)
            for name, call in self.ref.calls.items()
            if 0 in call.reads and readers_of[call.reads[0]] == [name]
        }
        order = [
            k for k in self.ref.order
            if (k in self.ref.grads or k in self.values) and k not in same
        ]  # fmt: skip
        index = {k: i for i, k in enumerate(order)}
        readers = module_readers(listed)
        calls_of: dict[str, list[str]] = {}
        for name, call in self.ref.calls.items():
            calls_of.setdefault(call.module, []).append(name)
        out = []
        for key in order:
            if key.endswith(":input"):
                call = key[: -len(":input")]
                module = self.ref.calls[call].module
                calls, module_type = [call], f"{self.types.get(module, '')} (input gradient)"
            elif key in self.owner:
                module = self.owner[key]
                calls = calls_of.get(module, [])
                module_type = f"{self.types.get(module, '')}.{key.rsplit('.', 1)[-1]}"
            else:
                module, calls, module_type = "", [], "input"
                readers_of_input = [
                    n for n, c in self.ref.calls.items() if int(key[7:-1]) in c.reads.values()
                ]
                calls = readers_of_input
            fed = sorted(
                {index[input_layer(r)] for c in calls for r in readers.get(c, [])
                 if input_layer(r) in index and index[input_layer(r)] < index[key]}
            )  # fmt: skip
            if key.startswith("inputs["):
                fed = sorted(
                    {index[input_layer(c)] for c in calls if input_layer(c) in index}
                    | {index[input_layer(r)] for c in calls if input_layer(c) not in index
                       for r in readers.get(c, []) if input_layer(r) in index}
                )  # fmt: skip
            value = self._value(key)[0]
            out.append(
                CapturedLayer(
                    name=key,
                    module=module,
                    module_type=module_type,
                    call_index=0,
                    identity=False,
                    input_from=None,
                    inputs_from=fed,
                    shape=list(value.shape),
                    dtype=dtype_name(key, value),
                )
            )
        return out

    def _value(self, key: str) -> tuple:
        """(reference, target, float64) of a layer."""
        if key in self.values:
            return self.values[key]
        wide = self.truth.grads.get(key) if self.truth is not None else None
        return self.ref.grads[key], self.tgt.grads[key], wide

    def hand(self, run, index: int, key: str) -> None:
        """Hands layer `key` over to the run."""
        reference, target, wide = self._value(key)
        local = self.local.get(key)
        exact = self.exact.get(key)
        grid = self.grid.get(key)
        terms = self.terms.get(key) if exact is not None else None
        run.add(
            index,
            flat(key, reference),
            float64=None if wide is None else flat(key, wide),
            target=flat(key, target),
            local=flat(key, local.to(target.dtype)) if isinstance(local, torch.Tensor) else None,
            local_error=local if isinstance(local, str) else (
                None if local is not None else _no_own_error(key)
            ),
            baseline=None if exact is None else flat(key, exact),
            baseline_grid=None if grid is None else dtype_name(key, torch.empty(0, dtype=grid)),
            reduction=None if terms is None else (terms[0], flat(key, terms[1])),
            reduction_terms=None if terms is None or terms[2] is None else flat(key, terms[2]),
        )  # fmt: skip


def _no_own_error(key: str) -> str:
    """Why a gradient has no backward of its own to re-run."""
    if key.startswith("inputs["):
        return "the input is not read directly by a module call, whose backward could be re-run"
    return (
        "its module computes it outside any module call whose backward could be re-run alone "
        "(a parameter a parent module uses itself)"
    )


def _how(found: Pass, loss: str) -> str:
    """The gradients' loss and scaling in words."""
    what = "the output's dot product with a fixed random tensor" if loss == "dot" else "sum"
    scaled = f", scaled by {found.scale:g} and unscaled in float32" if found.scale != 1 else ""
    return f"gradients of {what}{scaled}"


def _lower_precision(side: TorchSide, reference: TorchSide) -> str | None:
    """How the side's gradients carry a lower precision than float32, in words (a data-parallel
    side's, against itself in one process: its all-reduce's)."""
    if side.precision == "fp32":
        return None
    if side.ranks > 1 and side.precision == reference.precision:
        return (
            f"the ranks hold their gradients in {_WORDS[side.precision]} and the all-reduce "
            "adds them up in it, where one process computes the whole batch's at once"
        )
    return f"the target runs its forward and backward passes in {_WORDS[side.precision]}"
