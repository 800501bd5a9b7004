//! The search's last step: the node it narrowed to, compared alone as a per-layer run compares
//! a layer; or, where the whole graph is within its precision, the graph's outputs.

use std::path::Path;

use layerdiff_onnx::{Model, extract_nodes};

use super::super::{OnnxOptions, Outcome, compare_on};
use super::{Counted, Search};
use crate::{Error, Result};

impl Search<'_> {
    /// Node `n` alone, compared as a per-layer run compares a layer: the reference's node and
    /// the target's, each in a file of its own, fed with the reference's values.
    pub(super) fn node_alone(
        &mut self,
        options: &OnnxOptions,
        n: usize,
        folder: &Path,
        target: &Counted,
    ) -> Result<Outcome> {
        let node = &self.index.nodes()[n];
        let outputs: Vec<String> = node
            .outputs
            .iter()
            .filter(|v| !v.is_empty() && self.has(v))
            .cloned()
            .collect();
        let needed = self.needs(&[n], &outputs, &|_| true);
        self.values.hold(needed)?;
        let (mine, feeds) = self.piece(&[n], &outputs)?;
        let theirs = outputs
            .first()
            .and_then(|v| self.reference_index.producer(v))
            .map(|p| p.index)
            .ok_or_else(|| {
                Error::Usage(format!(
                    "the reference's file has no node that computes `{}`, the target's node the search narrowed to",
                    self.name(n)
                ))
            })?;
        // each piece named as its file, in a folder of its own
        let write = |side: &str, file: &Path, model: &Model| -> Result<std::path::PathBuf> {
            let path = folder.join(side);
            std::fs::create_dir_all(&path).map_err(|source| Error::Write {
                path: path.clone(),
                source,
            })?;
            let path = path.join(file.file_name().unwrap_or(side.as_ref()));
            std::fs::write(&path, model.to_bytes()).map_err(|source| Error::Write {
                path: path.clone(),
                source,
            })?;
            Ok(path)
        };
        let reference_file = options.model.clone();
        let reference_piece = extract_nodes(self.reference_model, &[theirs], &outputs, &feeds)?;
        let inputs_path = folder.join("inputs.safetensors");
        layerdiff_core::write_safetensors(&inputs_path, &feeds, Default::default())?;
        let piece = OnnxOptions {
            model: write("reference", &reference_file, &reference_piece)?,
            vs: options
                .vs
                .as_ref()
                .map(|file| write("target", file, &mine))
                .transpose()?,
            inputs: Some(inputs_path),
            opaque: false,
            bisect: false,
            repro: None,
            ..options.clone()
        };
        compare_on(&piece, Some(Box::new(target.share())), false)
    }

    /// The graph's outputs compared as a per-layer run compares a layer, the target running
    /// its graph as the file holds it (only its outputs asked for): the run's report where the
    /// whole graph is within its precision.
    pub(super) fn outputs_compared(
        &self,
        options: &OnnxOptions,
        target: &Counted,
    ) -> Result<Outcome> {
        let checked = OnnxOptions {
            opaque: false,
            ..options.clone()
        };
        super::super::Comparison::new(&checked, &[], false)
            .outputs_only()
            .run(Some(Box::new(target.share())))
    }
}
