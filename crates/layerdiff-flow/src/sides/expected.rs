//! `expected:PATH`: a side that computes nothing and serves values read from a file. PATH is a
//! safetensors or `.npz` file (keys are value names) or an ONNX test data folder (`test_data_set_0/` with
//! `input_N.pb` and `output_N.pb`; unnamed tensors take the graph's N-th input or output name).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use layerdiff_core::{DType, SideInfo, Summary, Tensor, TensorView, read_npz, read_safetensors};
use layerdiff_onnx::{GraphIndex, Model, read_test_data};

use crate::engine::evidence::{WeightCheck, model_counterpart, model_weight_check};
use crate::engine::memory::value_sizes;
use crate::engine::plan::{Part, PlanSide};
use crate::engine::side::{Member, Side, Values};
use crate::timings::Stopwatch;
use crate::{Error, Result};

/// Values of a model read from a file: the values of the model named there, nothing computed.
pub struct ExpectedSide {
    path: PathBuf,
    /// The model the values belong to, named in the report; its nodes and weights are the
    /// reference's when a cause is looked for.
    label: String,
    model: Model,
    stored: Vec<(String, Tensor)>,
    inputs: Option<Vec<(String, Tensor)>>,
    sizes: HashMap<String, u64>,
    values: Values,
}

impl ExpectedSide {
    /// Reads the values (and, from a test data folder, the inputs) for `model`, whose file is
    /// named `label` in the report.
    pub fn load(path: &Path, label: String, model: Model) -> Result<Self> {
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
            Ok(Self::new(
                path,
                label,
                model,
                values,
                Some(inputs).filter(|i| !i.is_empty()),
            ))
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
            Ok(Self::new(path, label, model, values, None))
        } else {
            Err(Error::Expected(format!(
                "`{}` does not exist",
                path.display()
            )))
        }
    }

    fn new(
        path: &Path,
        label: String,
        model: Model,
        stored: Vec<(String, Tensor)>,
        inputs: Option<Vec<(String, Tensor)>>,
    ) -> Self {
        Self {
            path: path.to_path_buf(),
            label,
            model,
            stored,
            inputs,
            sizes: HashMap::new(),
            values: Values::default(),
        }
    }

    /// The inputs stored beside the values (test data folders), if any.
    pub fn inputs(&self) -> Option<&[(String, Tensor)]> {
        self.inputs.as_deref()
    }

    /// Whether the file holds a value of this name (only those are compared).
    pub fn provides(&self, value: &str) -> bool {
        self.stored.iter().any(|(n, _)| n == value)
    }

    /// The names of the values the file holds.
    pub fn names(&self) -> Vec<String> {
        self.stored.iter().map(|(n, _)| n.clone()).collect()
    }

    /// Sets the inputs the run is given (the sizes of the values follow from them).
    pub fn given(mut self, inputs: &[(String, Tensor)]) -> Self {
        self.sizes = value_sizes(&GraphIndex::new(self.model.graph()), inputs);
        self.values = Values::new(inputs.to_vec());
        self
    }
}

impl Side for ExpectedSide {
    fn describe(&mut self, _summary: &mut Summary) -> SideInfo {
        SideInfo::new(
            "expected",
            format!("{} · values read from {}", self.label, self.path.display()),
        )
    }

    fn is_computed(&self) -> bool {
        false
    }
    fn plan_view(&self) -> PlanSide<'_> {
        PlanSide {
            graph: None,
            sizes: self.sizes.clone(),
            weights: 0,
            step_weights: Vec::new(),
        }
    }

    fn produce(&mut self, part: &Part, _: bool, _: &mut Stopwatch, _: &str) -> Result<()> {
        for name in &part.outputs {
            let (_, value) = self.stored.iter().find(|(n, _)| n == name).ok_or_else(|| {
                Error::Expected(format!("`{}` has no value `{name}`", self.path.display()))
            })?;
            self.values.insert(name.clone(), value.clone());
        }
        Ok(())
    }

    fn get(&self, value: &str) -> Option<&Tensor> {
        self.values.get(value)
    }

    fn dtype(&self, value: &str) -> Option<DType> {
        self.values.dtype(value)
    }

    fn free(&mut self, values: &[String]) {
        self.values.free(values);
    }

    fn counterpart(&self, member: &Member) -> Option<Member> {
        model_counterpart(&self.model, member)
    }

    fn weight_check(
        &self,
        _layer: usize,
        node: &str,
        position: usize,
        name: &str,
        weight: TensorView<'_>,
        half_step: Option<TensorView<'_>>,
    ) -> Option<WeightCheck> {
        model_weight_check(&self.model, node, position, name, weight, half_step)
    }
}
