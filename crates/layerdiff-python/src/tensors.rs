//! Flat tensors from Python: `(name, dtype, shape, buffer)`, the buffer a contiguous uint8 numpy
//! view of the data (zero-copy; the Python side flattens torch and numpy arrays this way).

use layerdiff_core::{DType, Tensor, TensorView};
use numpy::PyReadonlyArray1;
use pyo3::prelude::*;

/// A tensor handed over from Python, borrowed for the call.
#[derive(FromPyObject)]
pub(crate) struct FlatTensor<'py>(String, String, Vec<usize>, PyReadonlyArray1<'py, u8>);

impl FlatTensor<'_> {
    pub fn name(&self) -> &str {
        &self.0
    }

    pub fn dtype(&self) -> PyResult<DType> {
        DType::from_name(&self.1).map_err(crate::exceptions::to_py_err)
    }

    pub fn view(&self) -> PyResult<TensorView<'_>> {
        let bytes = self.3.as_slice().map_err(|e| {
            crate::exceptions::InputError::new_err(format!(
                "tensor `{}`: buffer is not contiguous: {e}",
                self.0
            ))
        })?;
        TensorView::new(&self.0, self.dtype()?, &self.2, bytes)
            .map_err(crate::exceptions::to_py_err)
    }

    pub fn to_tensor(&self) -> PyResult<Tensor> {
        Ok(self.view()?.to_tensor())
    }
}
