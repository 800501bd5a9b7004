//! Checking that given inputs fit what the model declares, before any runtime sees them.

use layerdiff_core::{DType, Tensor};
use layerdiff_onnx::{Dimension, GraphIndex};

use crate::{Error, Result};

/// Checks names, dtypes and fixed dimensions of `inputs` against the graph's declared inputs.
pub fn check_inputs(index: &GraphIndex, inputs: &[(String, Tensor)]) -> Result<()> {
    let given: Vec<&str> = inputs.iter().map(|(n, _)| n.as_str()).collect();
    for name in index.graph_inputs() {
        let Some((_, tensor)) = inputs.iter().find(|(n, _)| n == name) else {
            return Err(Error::Inputs(format!(
                "the model needs input `{name}`, but the inputs given are {given:?}"
            )));
        };
        let Some(declared) = index.value_type(name) else {
            continue;
        };
        if let Ok(dtype) = DType::from_onnx_code(declared.elem_type)
            && dtype != tensor.dtype
        {
            return Err(Error::Inputs(format!(
                "input `{name}`: the model expects {dtype}, got {} {:?}",
                tensor.dtype, tensor.shape
            )));
        }
        if let Some(dims) = &declared.dims {
            let fits = dims.len() == tensor.shape.len()
                && dims.iter().zip(&tensor.shape).all(|(d, &s)| match d {
                    Dimension::Fixed(f) => *f == s as i64,
                    Dimension::Symbolic(_) => true,
                });
            if !fits {
                let expected: Vec<String> = dims
                    .iter()
                    .map(|d| match d {
                        Dimension::Fixed(f) => f.to_string(),
                        Dimension::Symbolic(Some(p)) => p.clone(),
                        Dimension::Symbolic(None) => "?".to_string(),
                    })
                    .collect();
                return Err(Error::Inputs(format!(
                    "input `{name}`: the model expects shape [{}], got {:?}",
                    expected.join(", "),
                    tensor.shape
                )));
            }
        }
    }
    for name in &given {
        if !index.graph_inputs().iter().any(|i| i == name) {
            return Err(Error::Inputs(format!(
                "input `{name}` is not an input of the model (its inputs are {:?})",
                index.graph_inputs()
            )));
        }
    }
    Ok(())
}
