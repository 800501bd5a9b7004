//! `expected:PATH`: a side that computes nothing and serves values read from a file. PATH is a
//! safetensors or `.npz` file (keys are value names) or an ONNX test data folder (`test_data_set_0/` with
//! `input_N.pb` and `output_N.pb`; unnamed tensors take the graph's N-th input or output name).

use std::path::{Path, PathBuf};

use layerdiff_core::{Tensor, read_npz, read_safetensors};
use layerdiff_onnx::{GraphIndex, Model, read_test_data};

use crate::{Error, Result, Runtime};

/// Reference values read from a file.
#[derive(Debug, Clone)]
pub struct ExpectedValues {
    path: PathBuf,
    values: Vec<(String, Tensor)>,
    inputs: Option<Vec<(String, Tensor)>>,
}

impl ExpectedValues {
    /// Reads the values (and, from a test data folder, the inputs) for `model`.
    pub fn load(path: &Path, model: &Model) -> Result<Self> {
        let index = GraphIndex::new(model.graph());
        if path.is_dir() {
            let values = read_test_data(path, "output", index.graph_outputs())?;
            let inputs = read_test_data(path, "input", index.graph_inputs())?;
            if values.is_empty() {
                return Err(Error::Expected(format!(
                    "`{}` holds no output_N.pb files",
                    path.display()
                )));
            }
            Ok(Self {
                path: path.to_path_buf(),
                values,
                inputs: Some(inputs).filter(|i| !i.is_empty()),
            })
        } else if path.is_file() {
            let is_npz = path
                .extension()
                .is_some_and(|e| e.eq_ignore_ascii_case("npz"));
            let values = if is_npz {
                read_npz(path)
            } else {
                read_safetensors(path)
            }
            .map_err(|e| Error::Expected(e.to_string()))?;
            Ok(Self {
                path: path.to_path_buf(),
                values,
                inputs: None,
            })
        } else {
            Err(Error::Expected(format!(
                "`{}` does not exist",
                path.display()
            )))
        }
    }

    /// The inputs stored beside the values (test data folders), if any.
    pub fn inputs(&self) -> Option<&[(String, Tensor)]> {
        self.inputs.as_deref()
    }
}

impl Runtime for ExpectedValues {
    fn name(&self) -> &str {
        "expected"
    }

    fn detail(&self) -> String {
        format!("values read from {}", self.path.display())
    }

    fn computes(&self) -> bool {
        false
    }

    fn provides(&self, value: &str) -> bool {
        self.values.iter().any(|(n, _)| n == value)
    }

    fn run(
        &self,
        _model: &Model,
        _inputs: &[(String, Tensor)],
        outputs: &[String],
    ) -> Result<Vec<(String, Tensor)>> {
        outputs
            .iter()
            .map(|name| {
                self.values
                    .iter()
                    .find(|(n, _)| n == name)
                    .cloned()
                    .ok_or_else(|| {
                        Error::Expected(format!("`{}` has no value `{name}`", self.path.display()))
                    })
            })
            .collect()
    }
}
