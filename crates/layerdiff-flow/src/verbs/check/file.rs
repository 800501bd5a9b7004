//! The file `layerdiff check --onnx FILE` is given, read against the model's own export: the
//! outputs say whether the file's differences reach them beyond the bound or beyond rounding;
//! a weight, folded constant or attribute that differs is a defect of the file whatever the
//! outputs show (a constant off by 2e-5 of itself moves no output past either), as the
//! per-layer run (`layerdiff torch --onnx FILE`) reports it. One decision, whichever door.

use std::path::Path;

use layerdiff_onnx::Model;
use serde::Serialize;

use crate::Result;

/// One difference between the file and the model's own export.
#[derive(Debug, Clone, Serialize)]
pub struct FileDiffers {
    /// The value of the file that reads it.
    pub layer: String,
    /// `weight_mismatch` or `file_differs`.
    pub cause: String,
    /// What differs, in words.
    pub detail: String,
    /// What to do about it.
    pub fix: String,
}

/// The file read against the model's own export.
#[derive(Debug, Clone)]
pub struct AgainstExport {
    /// What differs (see [`against_export`]).
    pub differences: Vec<FileDiffers>,
    /// Whether the file is the export's graph: the same nodes (name and op, in order) and
    /// the same weights by name. With no difference, it is then the model's own computation,
    /// and whatever its outputs show is the runtime's.
    pub same_graph: bool,
}

/// What differs between `file` and `export` (the model exported afresh by the same exporter):
/// weights of the same name beyond their rounding to the file's dtype, attributes of the same
/// node. A file another exporter wrote shares few names with the export, and is judged by its
/// outputs alone there.
pub fn against_export(export: &Path, file: &Path) -> Result<AgainstExport> {
    let (export, file) = (Model::load(export)?, Model::load(file)?);
    let (a, b) = (export.graph(), file.graph());
    let nodes = |g: &layerdiff_onnx::GraphProto| {
        (g.node.iter())
            .map(|n| (n.name().to_string(), n.op_type().to_string()))
            .collect::<Vec<_>>()
    };
    let weights = |g: &layerdiff_onnx::GraphProto| {
        let mut names: Vec<String> = (g.initializer.iter())
            .map(|t| t.name().to_string())
            .collect();
        names.sort_unstable();
        names
    };
    let same_graph = nodes(a) == nodes(b) && weights(a) == weights(b);
    let differences = crate::engine::evidence::file_differences(&export, &file)
        .into_iter()
        .map(|d| FileDiffers {
            layer: d.layer,
            cause: d.cause.to_string(),
            detail: d.detail,
            fix: d.fix,
        })
        .collect();
    Ok(AgainstExport {
        differences,
        same_graph,
    })
}

/// The differences in the check's words, one line each with its fix.
pub(super) fn to_text(differences: &[FileDiffers]) -> String {
    if differences.is_empty() {
        return String::new();
    }
    let mut out = format!(
        "  the file differs from the model's own export in {} place(s), a defect whatever the outputs show:\n",
        differences.len()
    );
    for d in differences {
        out.push_str(&format!(
            "    `{}` {}: {}\n      fix: {}\n",
            d.layer, d.cause, d.detail, d.fix
        ));
    }
    out
}
