//! The repro of a framework module (a PyTorch target's headline, a `grad` report's headline
//! gradient): the words of its folder, `repro.py` and `README.md`, and what its run says. The
//! framework's adapter finds the module, its inputs and weights and saves them (it owns
//! PyTorch); the script, the README and the verdict are written here, as a piece of an ONNX
//! file's are ([`super::script`]), by the same protocol: the script's last line says
//! [`REPRODUCED`] or [`NOT_REPRODUCED`], and only that line is believed.

use std::path::Path;

use layerdiff_core::{Bound, Cause, Report, write_atomic};

use super::script::py_str;
use super::{NOT_REPRODUCED, REPRODUCED};
use crate::{Error, Result};

/// A side of a module repro, as the adapter spells and describes it.
#[derive(Debug, Clone)]
pub struct ModuleSide {
    /// As the command line spells it (`torch:bf16`).
    pub spelling: String,
    /// In words, for the README (`CPU, bfloat16, eager`).
    pub words: String,
    /// Its device (`cpu`, `cuda:0`).
    pub device: String,
    /// Its precision (`fp32`, `bf16`, `amp-fp16`…).
    pub precision: String,
    /// The torch.compile backend, where it compiles.
    pub compile: Option<String>,
}

impl ModuleSide {
    /// The side as the script's Python literal.
    fn literal(&self) -> String {
        format!(
            "{{\"device\": {}, \"precision\": {}, \"compile\": {}}}",
            py_str(&self.device),
            py_str(&self.precision),
            self.compile.as_deref().map_or("None".to_string(), py_str)
        )
    }
}

/// What a module repro is made of, as the adapter found it.
#[derive(Debug, Clone)]
pub struct ModuleRepro {
    /// The headline layer (a module call, or a gradient's name).
    pub layer: String,
    /// The module's path in the model (empty: the root).
    pub path: String,
    /// Where the headline sits in that module, in words (empty where it is the module's own
    /// output).
    pub where_: String,
    /// The Python module the module's class is defined in.
    pub class_module: String,
    /// The class's qualified name.
    pub class_name: String,
    /// The source that imports the class (and the model's builder) so that module.pt unpickles.
    pub imports: String,
    /// The folder of the user's code, put on sys.path (None: an installed package).
    pub code_dir: Option<String>,
    /// The module's positional arguments as Python source, each tensor a `T("name")` of
    /// inputs.safetensors.
    pub args: String,
    /// Its keyword arguments, the same way.
    pub kwargs: String,
    /// For a gradient: its backward alone, the gradient `of` (`input` or a parameter's name in
    /// the module) with the target's loss `scale`.
    pub gradient: Option<(String, f64)>,
    /// The side the module is measured against.
    pub reference: ModuleSide,
    /// The side whose difference the repro shows.
    pub target: ModuleSide,
    /// The command line that made the report.
    pub command: String,
}

/// What a repro.py run printed.
#[derive(Debug, Clone, Copy)]
pub struct Shown<'a> {
    /// Its standard output.
    pub stdout: &'a str,
    /// Its standard error.
    pub stderr: &'a str,
}

impl Shown<'_> {
    /// The script's verdict: `Some(true)` reproduced, `Some(false)` within the tolerance,
    /// `None` it did not run to its end (an exception exits 1 too: only its own last line
    /// says what it found).
    fn reproduced(&self) -> Option<bool> {
        match self.stdout.trim().lines().last() {
            Some(REPRODUCED) => Some(true),
            Some(NOT_REPRODUCED) => Some(false),
            _ => None,
        }
    }
}

/// The tolerance a repro is judged by, and the report's cause there with its detail, where it
/// gives one.
type Judged = (Bound, Option<(Cause, Option<String>)>);

impl ModuleRepro {
    /// The tolerance `report` judged the repro's layer by, and the layer's cause and its detail
    /// where it has one; for a module whose compiled form differs (no layer of the report), the
    /// tolerance its compile was judged by and its defect's.
    pub fn judged_in(&self, report: &Report) -> Result<Judged> {
        if let Some((module, bound)) = report.compiled_headline()
            && module == self.layer
        {
            let defect = &report.summary.defects[0];
            return Ok((bound, Some((defect.cause, Some(defect.detail.clone())))));
        }
        let layer = (report.layers.iter())
            .find(|l| l.name == self.layer)
            .ok_or_else(|| Error::Layers(format!("the report has no layer `{}`", self.layer)))?;
        Ok((
            layer.tolerance,
            layer.cause.map(|c| (c, layer.detail.clone())),
        ))
    }

    /// Writes `repro.py` into `folder`, judged by the tolerance `report` judged the layer by.
    pub fn write_script(&self, report: &Report, folder: &Path) -> Result<()> {
        let (bound, _) = self.judged_in(report)?;
        let gradient = match &self.gradient {
            Some((of, scale)) => format!("{{\"of\": {}, \"scale\": {scale:?}}}", py_str(of)),
            None => "None".to_string(),
        };
        let filled: [(&str, String); 18] = [
            ("$layer", self.layer.clone()),
            ("$path", self.path_or("(the whole model)")),
            ("$cls", format!("{}.{}", self.class_module, self.class_name)),
            ("$class_name", self.class_name.clone()),
            ("$target", self.target.spelling.clone()),
            ("$reference", self.reference.spelling.clone()),
            (
                "$code_dir",
                self.code_dir.as_deref().map_or("None".to_string(), py_str),
            ),
            ("$imports", self.imports.clone()),
            ("$reference_side", self.reference.literal()),
            ("$target_side", self.target.literal()),
            ("$atol", format!("{:e}", bound.atol)),
            ("$rtol", format!("{:e}", bound.rtol)),
            ("$args", self.args.clone()),
            ("$kwargs", self.kwargs.clone()),
            ("$reader", super::READER.to_string()),
            ("$gradient", gradient),
            ("$reproduced", py_str(REPRODUCED)),
            ("$not_reproduced", py_str(NOT_REPRODUCED)),
        ];
        written(&folder.join("repro.py"), &fill(SCRIPT, &filled))
    }

    fn path_or(&self, root: &str) -> String {
        if self.path.is_empty() {
            root.to_string()
        } else {
            self.path.clone()
        }
    }

    /// Writes `README.md` into `folder`, with what the script's run printed.
    pub fn write_readme(&self, report: &Report, shown: Shown<'_>, folder: &Path) -> Result<()> {
        let (_, cause) = self.judged_in(report)?;
        let cause = match cause {
            Some((cause, Some(detail))) => {
                format!("- **Cause** (the report's): `{cause}`: {detail}\n")
            }
            Some((cause, None)) => format!("- **Cause** (the report's): `{cause}`\n"),
            None => String::new(),
        };
        let out = match shown.stdout.trim() {
            "" => shown.stderr.trim(),
            said => said,
        };
        let verdict = match shown.reproduced() {
            Some(true) => "**Checked**",
            Some(false) => "**Not reproduced**",
            None => "**Fails to run**",
        };
        let (what, truth) = if self.gradient.is_some() {
            (
                "its backward alone, on the reference's inputs to it and for the gradient the reference's whole backward gave its output",
                "gradient of that backward alone",
            )
        } else {
            (
                "alone, on the reference's inputs to it",
                "output as the whole model computed it",
            )
        };
        let readme = format!(
            "# Repro: `{layer}` ({class}) on `{target}`\n\n\
             layerdiff cut this out of `{model}`: the module `{path}`, {what}.\n\n\
             - **What differs**: the module as the target computes it ({target_words}) and as the reference does ({reference_words}).\n\
             - {verdict} by running `python repro.py` before this folder was claimed:\n\n\
             ```\n{out}\n```\n\n\
             - **Against which truth**: the reference side, run here on the same inputs; `expected.safetensors` holds the reference's {truth}, which repro.py checks the reference reproduces. The tolerance is the one the report judged this layer by.\n\
             {cause}\
             - **Produced by**: `{command}`\n\n\
             ## Run it\n\n\
             ```\npip install torch numpy\npython repro.py    # exit code 1: the difference shows\n```\n\n\
             It imports the module's class from your code (`{class_module}.{class}`).\n\n\
             | file | what |\n|---|---|\n\
             | `module.pt` | the module's structure, without weights (unpickled with its class) |\n\
             | `state.safetensors` | its parameters and buffers |\n\
             | `inputs.safetensors` | the reference's inputs to it |\n\
             | `expected.safetensors` | the reference's output of it |\n\
             | `repro.py` | runs it on the reference side and the target side, prints the difference and the tolerance |\n",
            layer = self.layer,
            class = self.class_name,
            class_module = self.class_module,
            target = self.target.spelling,
            model = report.model,
            path = self.path_or("(root)"),
            target_words = self.target.words,
            reference_words = self.reference.words,
            command = self.command,
        );
        written(&folder.join("README.md"), &readme)
    }

    /// What the repro in `folder` shows, in one sentence, and whether it reproduces the
    /// difference.
    pub fn verdict(&self, shown: Shown<'_>, folder: &Path) -> (String, bool) {
        let folder = folder.display();
        let Some(reproduced) = shown.reproduced() else {
            let tail = match shown.stderr.trim() {
                "" => shown.stdout.trim(),
                said => said,
            };
            let last = tail.lines().last().unwrap_or("no output");
            return (
                format!("--repro: the repro in {folder} does not run: {last}"),
                false,
            );
        };
        // the script's line with its figures
        let found = shown
            .stdout
            .lines()
            .rfind(|l| l.starts_with('`'))
            .unwrap_or("");
        let (name, path) = (&self.layer, &self.path);
        if reproduced {
            (
                format!(
                    "repro of `{name}`: the module `{path}` ({}) alone{}, in {folder}, checked: {found} (python repro.py)",
                    self.class_name, self.where_
                ),
                true,
            )
        } else {
            (
                format!(
                    "--repro: no repro of `{name}`: its module `{path}` alone stays within the tolerance ({found}); the difference needs more of the model. Files in {folder}"
                ),
                false,
            )
        }
    }
}

/// Writes `text` at `path`, whole or not at all.
fn written(path: &Path, text: &str) -> Result<()> {
    write_atomic(path, text.as_bytes()).map_err(|source| Error::Write {
        path: path.to_path_buf(),
        source,
    })
}

/// `template` with each `$name` of `filled` replaced by its text, in one pass (a text filled in
/// is not read again); a `$` before another name is left as it is.
fn fill(template: &str, filled: &[(&str, String)]) -> String {
    let mut out = String::with_capacity(template.len() * 2);
    let mut rest = template;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let name_end = rest[at + 1..]
            .find(|c: char| !(c.is_ascii_lowercase() || c == '_'))
            .map_or(rest.len(), |n| at + 1 + n);
        let name = &rest[at..name_end];
        match filled.iter().find(|(n, _)| *n == name) {
            Some((_, text)) => out.push_str(text),
            None => out.push_str(name),
        }
        rest = &rest[name_end..];
    }
    out.push_str(rest);
    out
}

/// The repro.py of a module (`$name` is filled in).
const SCRIPT: &str = r#""""layerdiff repro: `$layer` ($cls) on $target against $reference.

Runs the model's module `$path` alone: its class from your code, its structure from module.pt
and its weights from state.safetensors, on the reference's inputs to it (inputs.safetensors),
on the reference side and on the target side, and prints how far the target is from the
reference by the tolerance layerdiff judged the layer by. Needs torch, numpy and your code.
Exit code 1: the difference shows.
"""

import contextlib
import copy
import json
import struct
import sys
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
CODE = $code_dir  # the folder of your code, when it is not an installed package
if CODE is not None:
    sys.path.insert(0, CODE)
$imports

REFERENCE = $reference_side
TARGET = $target_side
ATOL, RTOL = $atol, $rtol  # within tolerance: |target - reference| <= ATOL + RTOL * |reference|
CAST = {"fp16": torch.float16, "bf16": torch.bfloat16}
AUTOCAST = {"amp-fp16": torch.float16, "amp-bf16": torch.bfloat16}
$reader

def load(path):
    """The tensors of a safetensors file, handed to torch in their own dtype."""
    tensors = {}
    for name, (array, dtype) in read(path).items():
        tensor = torch.from_numpy(array)
        tensors[name] = tensor.to(torch.bfloat16) if dtype == "BF16" else tensor
    return tensors


INPUTS = load(HERE / "inputs.safetensors")


def T(name):
    return INPUTS[name]


ARGS = $args
KWARGS = $kwargs
# None: the module's output is compared. Else its backward alone, for the output gradient the
# whole model's backward gave it (inputs.safetensors' grad_output): the gradient of its first
# floating-point input ("input") or of a parameter, with the target's loss scale.
GRADIENT = $gradient


def build():
    """The module: its structure unpickled with its class, then its weights."""
    module = torch.load(HERE / "module.pt", weights_only=False).to_empty(device="cpu")
    assert isinstance(module, $class_name), type(module)
    with torch.no_grad():
        for name, tensor in load(HERE / "state.safetensors").items():
            owner, _, leaf = name.rpartition(".")
            getattr(module.get_submodule(owner), leaf).copy_(tensor)
    return module.eval()


def first_tensor(out):
    if isinstance(out, torch.Tensor):
        return out
    values = out.values() if isinstance(out, dict) else out
    if not isinstance(values, (list, tuple, type({}.values()))):
        return None
    return next((t for t in map(first_tensor, values) if t is not None), None)


def run(side, module):
    """The module's output as `side` computes it (its device, precision, compiler); with
    GRADIENT, the gradient its backward alone gives for the saved output gradient."""
    module = copy.deepcopy(module).to(side["device"])
    dtype = CAST.get(side["precision"])
    if dtype is not None:
        module = module.to(dtype)
    if side["compile"]:
        module.forward = torch.compile(module.forward, backend=side["compile"], dynamic=False)
    wrt = []

    def convert(t):
        if not isinstance(t, torch.Tensor):
            return t
        wanted = dtype if dtype is not None and t.is_floating_point() else t.dtype
        t = t.to(device=side["device"], dtype=wanted).detach().clone()
        if GRADIENT is not None and t.is_floating_point():
            wrt.append(t.requires_grad_(True))
            return t.clone()  # a module may work in place on its input
        return t

    args = torch.utils._pytree.tree_map(convert, ARGS)
    kwargs = torch.utils._pytree.tree_map(convert, KWARGS)
    tf32 = side["precision"] == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = tf32
    amp = AUTOCAST.get(side["precision"])
    device = torch.device(side["device"]).type
    autocast = torch.autocast(device, dtype=amp) if amp else contextlib.nullcontext()
    with torch.set_grad_enabled(GRADIENT is not None), autocast:
        out = first_tensor(module(*args, **kwargs))
    if GRADIENT is None:
        return out.detach().cpu()
    scale = GRADIENT["scale"] if side is TARGET else 1.0
    out.backward((T("grad_output").to(out.device) * scale).to(out.dtype))
    of = GRADIENT["of"]
    grad = wrt[0].grad if of == "input" else module.get_parameter(of).grad
    return (grad.detach().float() / scale).cpu()


def differs(what, reference, got):
    """Prints how far `got` is from `reference`; True when an element is beyond the tolerance."""
    reference, got = reference.double(), got.double()
    diff = (got - reference).abs()
    beyond = ~(diff <= ATOL + RTOL * reference.abs())  # NaN is beyond
    print(f"`$layer` {what}: max |diff| {diff.nan_to_num(float('inf')).max().item():.3e} against "
          f"the tolerance {ATOL:g} + {RTOL:g}*|reference|: {int(beyond.sum())} of "
          f"{diff.numel()} elements beyond it")
    return bool(beyond.any())


def main():
    module = build()
    reference = run(REFERENCE, module)
    same = (reference.double() - load(HERE / "expected.safetensors")["output"].double()).abs()
    print(f"the reference side here against layerdiff's run of the whole model: max |diff| "
          f"{same.max().item():.3e}")
    shown = differs("on $target against $reference", reference, run(TARGET, module))
    print($reproduced if shown else $not_reproduced)
    return 1 if shown else 0


if __name__ == "__main__":
    sys.exit(main())
"#;
