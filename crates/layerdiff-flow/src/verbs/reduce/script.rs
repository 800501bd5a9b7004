//! The repro folder's words: `repro.py`, which runs the piece on the target's runtime with
//! numpy and that runtime's own Python package alone, and `README.md`.

use layerdiff_core::{Layer, Report, Tensor};
use layerdiff_runtime::RuntimeSpec;

use super::Repro;

/// What the repro's files say.
pub(crate) struct Facts<'a> {
    pub report: &'a Report,
    /// The model the piece is cut from (the target's file, with `--vs`).
    pub source: &'a str,
    pub layer: &'a Layer,
    /// The reference in a word (`ort`, `pytorch`).
    pub reference: String,
    pub target: &'a RuntimeSpec,
    pub reference_detail: &'a str,
    pub target_detail: &'a str,
    pub command: &'a str,
    pub repro: &'a Repro,
    pub target_value: &'a Tensor,
    /// The piece's graph inputs, in the model's order (tract takes them by position).
    pub inputs: Vec<String>,
}

/// The safetensors reader every repro.py holds: numpy alone, each tensor with its dtype's
/// name (bfloat16, which numpy lacks, widened to float32 exactly).
pub const READER: &str = r#"DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4",
          "I16": "<i2", "I8": "i1", "U8": "u1", "BOOL": "?"}


def read(path):
    """The tensors of a safetensors file as {name: (numpy array, safetensors dtype)}."""
    data = Path(path).read_bytes()
    (size,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + size])
    body = data[8 + size :]
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        if info["dtype"] == "BF16":
            bits = np.frombuffer(body[start:end], dtype="<u2").astype(np.uint32) << 16
            array = bits.view(np.float32)
        else:
            array = np.frombuffer(body[start:end], dtype=DTYPES[info["dtype"]])
        tensors[name] = (array.reshape(info["shape"]).copy(), info["dtype"])
    return tensors
"#;

pub(super) use layerdiff_runtime::py_str;

/// `repro.py`.
pub(crate) fn repro_py(facts: &Facts) -> String {
    let (package, run_target) = facts.target.configured().repro(&facts.inputs);
    let bound = facts.layer.tolerance;
    format!(
        r#""""layerdiff repro: `{layer}` on {target}.

Runs model.onnx (the piece of `{model}` that computes `{layer}`) on the target with the
reference's values at its inputs (inputs.safetensors), and compares what it computes with the
reference's value (expected.safetensors) by what layerdiff judged the layer by: its
tolerance, or, where it found the layer beyond what its precision explains within that
tolerance, what an honest kernel may err by on these inputs (ALLOWED).
Needs numpy and {package}, nothing else. Exit code 1: the difference shows.
"""

import json
import struct
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
TARGET = {target_py}
ATOL, RTOL = {atol:e}, {rtol:e}  # within tolerance: |got - expected| <= ATOL + RTOL * |expected|
# (grid, largest, mean, margin): what an honest kernel in `grid` may err by here, by layerdiff's
# float64 computation of this piece; the difference shows beyond `margin` times it. None: the
# tolerance decides.
ALLOWED = {allowed}
OUTPUTS = [{layer_py}]
{reader}

def load(path):
    return {{name: array for name, (array, _) in read(path).items()}}


def run_target(inputs):
{run_target}

def differs(name, expected, got):
    """Prints how far `got` is from `expected`; True when the difference shows: some element
    beyond the tolerance, or (ALLOWED) beyond what an honest kernel explains."""
    expected, got = expected.astype(np.float64), got.astype(np.float64)
    if expected.shape != got.shape:
        print(f"`{{name}}` on {{TARGET}}: shape {{list(got.shape)}}, the reference's {{list(expected.shape)}}")
        if expected.size != got.size:
            return True  # the shape itself differs
        expected = expected.reshape(got.shape)  # element by element, as layerdiff compared them
    diff = np.abs(got - expected)
    beyond = ~(diff <= ATOL + RTOL * np.abs(expected))  # NaN is beyond
    print(f"`{{name}}` on {{TARGET}}: max |diff| {{np.nanmax(diff):.3e}} against the tolerance "
          f"{{ATOL:g}} + {{RTOL:g}}*|expected|: {{int(beyond.sum())}} of {{diff.size}} elements beyond it")
    shown = bool(beyond.any())
    if ALLOWED is not None:
        grid, largest, mean, margin = ALLOWED
        compared = diff[~(np.isnan(got) & np.isnan(expected))]  # both NaN agree
        if not np.isfinite(compared).all():
            multiple = np.inf
        else:
            multiple = max(compared.max() / largest, compared.mean() / mean)
        print(f"  {{multiple:.3g}}x what {{grid}} explains: an honest {{grid}} kernel may err by up to "
              f"{{largest:.3e}} (mean {{mean:.3e}}) here, the target errs by {{compared.max():.3e}} "
              f"(mean {{compared.mean():.3e}}); it shows beyond {{margin:g}}x")
        shown = bool(multiple > margin)
    if shown:
        worst = np.unravel_index(np.argmax(np.where(np.isnan(diff), np.inf, diff)), diff.shape)
        at = tuple(int(i) for i in worst)
        print(f"  worst at {{at}}: expected {{expected[worst]:.7g}}, got {{got[worst]:.7g}}")
    return shown


def main():
    inputs = load(HERE / "inputs.safetensors")
    expected = load(HERE / "expected.safetensors")
    got = run_target(inputs)
    shown = [differs(name, expected[name], got[name]) for name in OUTPUTS]
    print({reproduced} if any(shown) else {not_reproduced})
    return 1 if any(shown) else 0


if __name__ == "__main__":
    sys.exit(main())
"#,
        layer = facts.repro.layer,
        layer_py = py_str(&facts.repro.layer),
        reproduced = py_str(super::REPRODUCED),
        not_reproduced = py_str(super::NOT_REPRODUCED),
        target = facts.target.spelling(),
        target_py = py_str(&facts.target.spelling()),
        model = facts.source,
        reader = READER,
        atol = bound.atol,
        rtol = bound.rtol,
        allowed = match &facts.repro.measure {
            layerdiff_core::Measure::Allowance {
                grid,
                max,
                mean,
                margin,
            } => format!("({}, {max:e}, {mean:e}, {margin:e})", py_str(grid)),
            layerdiff_core::Measure::Tolerance(_) => "None".to_string(),
        },
    )
}

/// `README.md`.
pub(crate) fn readme(facts: &Facts) -> String {
    let (package, _) = facts.target.configured().repro(&facts.inputs);
    let repro = facts.repro;
    let layer = facts.layer;
    let op = layer
        .location
        .as_ref()
        .map(|l| format!(" ({})", l.op))
        .unwrap_or_default();
    let nodes: Vec<String> = repro.nodes.iter().map(|n| format!("`{n}`")).collect();
    let of = repro.measure.words();
    let found = if let Some(weight) = repro.weight.as_ref().filter(|_| !repro.reproduced) {
        format!(
            "**The defect is a weight of the file**, which the piece holds: {weight}. No run shows it: on the piece the target stays within {of} ({}), as the layer did in the run (`python repro.py` prints the difference and says it is within); the weight, read from the file against the model's, is the evidence.",
            layerdiff_core::render::times(repro.multiple)
        )
    } else if repro.reproduced {
        let weight = (repro.weight.as_ref())
            .map(|w| {
                format!(" **The defect is a weight of the file**, which the piece holds: {w}.")
            })
            .unwrap_or_default();
        format!(
            "**Checked** before this folder was written: on the piece, the target's value {}, {} {of}.{weight}",
            repro.difference(),
            layerdiff_core::render::times(repro.multiple)
        )
    } else {
        format!(
            "**Not reproduced**: on this piece, the largest tried, the target stays within {of} ({}): the difference needs more of the model than {} nodes.",
            layerdiff_core::render::times(repro.multiple),
            repro.nodes.len()
        )
    };
    let cause = match (&layer.cause, &layer.detail) {
        (Some(cause), Some(detail)) => format!("\n- **Cause** (the report's): `{cause}`: {detail}"),
        (Some(cause), None) => format!("\n- **Cause** (the report's): `{cause}`"),
        _ => String::new(),
    };
    let dtype = facts.target_value.dtype.name();
    let title = if layer.name == repro.layer {
        format!("`{}`", repro.layer)
    } else {
        format!("`{}`: `{}`", layer.name, repro.layer)
    };
    format!(
        "# Repro: {title}{op} on `{target}`\n\n\
         layerdiff cut this out of `{model}`: {n} node(s), {nodes}, that compute `{layer_name}` from the reference's values at their inputs.\n\n\
         - **What differs**: `{layer_name}`, {dtype} of shape {shape:?}, as the target computes it ({target_detail}) and as the reference does ({reference_detail}).\n\
         - {found}\n\
         - **Against which truth**: `expected.safetensors` holds the reference's value of `{layer_name}` (`{reference}`, the whole model run on the report's inputs); the tolerance is the one the report judged this layer by ({tolerance_how}).{cause}\n\
         - **Produced by**: `{command}`\n\n\
         ## Run it\n\n\
         ```\npip install numpy {package}\npython repro.py    # exit code 1: the difference shows\n```\n\n\
         | file | what |\n|---|---|\n\
         | `model.onnx` | the piece, its weights inside, opsets as in the original |\n\
         | `inputs.safetensors` | the reference's values at the piece's inputs |\n\
         | `expected.safetensors` | the reference's value of `{layer_name}` |\n\
         | `repro.py` | runs the piece on `{target}` and prints the difference and the tolerance |\n",
        layer_name = repro.layer,
        target = facts.target.spelling(),
        reference = facts.reference,
        model = facts.source,
        n = repro.nodes.len(),
        nodes = nodes.join(", "),
        target_detail = facts.target_detail,
        reference_detail = facts.reference_detail,
        tolerance_how = facts.report.tolerance.policy.replace('_', " "),
        shape = facts.target_value.shape,
        command = facts.command,
    )
}
