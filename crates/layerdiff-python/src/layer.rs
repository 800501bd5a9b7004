//! A layer as PyTorch's capture lists it, typed on both sides of the boundary: Python builds it
//! while the model runs, the engine reads it as a `ListedLayer`.

use layerdiff_core::{DType, Fingerprint};
use layerdiff_flow::verbs::captured::ListedLayer;
use layerdiff_onnx::LayerCall;
use pyo3::prelude::*;

use crate::exceptions::to_py_err;

/// One call of a leaf module, or one functional call between modules (`op` set): what it
/// produced and where its inputs came from.
#[pyclass(module = "layerdiff._layerdiff", get_all, set_all)]
#[derive(Clone)]
pub(crate) struct CapturedLayer {
    /// The module path, `#2`, `#3`… for repeated calls; `owner:op` for a functional call.
    name: String,
    /// For a functional call, the module whose forward made it (`""`: the model's own).
    module: String,
    module_type: String,
    call_index: usize,
    /// It returned its input's values unchanged: Dropout at inference, a module that hands its
    /// input back untouched (torchvision's StochasticDepth), a call like `x * 1.0`.
    identity: bool,
    /// The layer whose output this call read as its first input.
    input_from: Option<usize>,
    shape: Vec<usize>,
    /// layerdiff's dtype name (`float32`).
    dtype: String,
    /// (element count, samples): pairs the layer by value where the ONNX file names no scope.
    fingerprint: Option<(usize, Vec<f64>)>,
    op: Option<String>,
    /// Every layer whose output this call read (its tensor arguments, one level into lists).
    inputs_from: Vec<usize>,
    /// No model input's values reach its output: it is computed from parameters, buffers,
    /// constants and shapes alone (relative positions, rotary tables), which exporters fold.
    constant: bool,
    /// Its output reaches some output of the model (BERT's pooler does not when only the
    /// hidden states are returned: exporters drop such work).
    feeds_output: bool,
}

#[pymethods]
impl CapturedLayer {
    #[new]
    #[pyo3(signature = (*, name, module, module_type, call_index, identity, input_from, shape, dtype, fingerprint=None, op=None, inputs_from=Vec::new(), constant=false, feeds_output=true))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        name: String,
        module: String,
        module_type: String,
        call_index: usize,
        identity: bool,
        input_from: Option<usize>,
        shape: Vec<usize>,
        dtype: String,
        fingerprint: Option<(usize, Vec<f64>)>,
        op: Option<String>,
        inputs_from: Vec<usize>,
        constant: bool,
        feeds_output: bool,
    ) -> PyResult<Self> {
        DType::from_name(&dtype).map_err(to_py_err)?;
        Ok(Self {
            name,
            module,
            module_type,
            call_index,
            identity,
            input_from,
            shape,
            dtype,
            fingerprint,
            op,
            inputs_from,
            constant,
            feeds_output,
        })
    }

    fn __repr__(&self) -> String {
        let op = self
            .op
            .as_deref()
            .map(|op| format!(", op={op:?}"))
            .unwrap_or_default();
        format!(
            "CapturedLayer(name={:?}, module_type={:?}{op}, shape={:?}, dtype={:?})",
            self.name, self.module_type, self.shape, self.dtype
        )
    }
}

impl CapturedLayer {
    /// The engine's view of it.
    pub(crate) fn listed(&self) -> PyResult<ListedLayer> {
        Ok(ListedLayer {
            call: LayerCall {
                name: self.name.clone(),
                module: self.module.clone(),
                call_index: self.call_index,
                identity: self.identity,
                constant: self.constant,
                feeds_output: self.feeds_output,
                input_from: self.input_from,
                shape: self.shape.clone(),
                dtype: DType::from_name(&self.dtype).map_err(to_py_err)?,
                fingerprint: self
                    .fingerprint
                    .clone()
                    .map(|(count, samples)| Fingerprint { count, samples }),
                op: self.op.clone(),
            },
            module_type: self.module_type.clone(),
        })
    }

    /// The layers whose outputs it read.
    pub(crate) fn fed_by(&self) -> Vec<usize> {
        self.inputs_from.clone()
    }
}
