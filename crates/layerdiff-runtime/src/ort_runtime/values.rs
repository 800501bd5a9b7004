//! Tensors to ONNX Runtime's values and back, each dtype by its bytes.

use super::{
    DType, DynValue, Error, Result, SessionInputValue, Tensor, TensorElementType, TensorRef,
    ValueRef,
};
/// An input for ONNX Runtime: a view of the tensor's own bytes where they are aligned for their
/// element type (no copy: inputs of a segment can be large), else a copy.
pub(super) fn to_ort_input<'t>(name: &str, t: &'t Tensor) -> Result<SessionInputValue<'t>> {
    let shape: Vec<i64> = t.shape.iter().map(|&d| d as i64).collect();
    let err = |e: ort::Error| Error::Inputs(format!("input `{name}`: {e}"));
    macro_rules! view {
        ($ty:ty) => {
            if let Ok(data) = bytemuck::try_cast_slice::<u8, $ty>(&t.bytes) {
                return Ok(TensorRef::from_array_view((shape, data))
                    .map_err(err)?
                    .into_dyn()
                    .into());
            }
        };
    }
    match t.dtype {
        DType::F32 => view!(f32),
        DType::F64 => view!(f64),
        DType::F16 => view!(half::f16),
        DType::BF16 => view!(half::bf16),
        DType::I64 => view!(i64),
        DType::I32 => view!(i32),
        _ => {}
    }
    Ok(to_ort_value(name, t)?.into())
}

fn to_ort_value(name: &str, t: &Tensor) -> Result<DynValue> {
    let shape: Vec<i64> = t.shape.iter().map(|&d| d as i64).collect();
    let err = |e: ort::Error| Error::Inputs(format!("input `{name}`: {e}"));
    macro_rules! make {
        ($ty:ty) => {{
            let data: Vec<$ty> = bytemuck::pod_collect_to_vec(&t.bytes);
            ort::value::Tensor::from_array((shape, data))
                .map_err(err)?
                .into_dyn()
        }};
    }
    Ok(match t.dtype {
        DType::F32 => make!(f32),
        DType::F64 => make!(f64),
        DType::F16 => make!(half::f16),
        DType::BF16 => make!(half::bf16),
        DType::I64 => make!(i64),
        DType::I32 => make!(i32),
        DType::I16 => make!(i16),
        DType::I8 => make!(i8),
        DType::U64 => make!(u64),
        DType::U32 => make!(u32),
        DType::U16 => make!(u16),
        DType::U8 => make!(u8),
        DType::Bool => {
            let data: Vec<bool> = t.bytes.iter().map(|&b| b != 0).collect();
            ort::value::Tensor::from_array((shape, data))
                .map_err(err)?
                .into_dyn()
        }
    })
}

pub(super) fn from_ort_value(name: &str, value: &ValueRef<'_>) -> Result<Tensor> {
    let unsupported = |element: String| Error::UnsupportedOutput {
        name: name.to_string(),
        element,
    };
    let element = value
        .dtype()
        .tensor_type()
        .ok_or_else(|| unsupported(format!("{}", value.dtype())))?;
    let run_err = |e: ort::Error| Error::Run(format!("reading `{name}`: {e}"));
    macro_rules! take {
        ($ty:ty, $dtype:expr) => {{
            let (shape, data) = value.try_extract_tensor::<$ty>().map_err(run_err)?;
            let shape: Vec<usize> = shape.iter().map(|&d| d as usize).collect();
            Tensor::new(name, $dtype, shape, bytemuck::cast_slice(data).to_vec())
                .map_err(|e| Error::Run(e.to_string()))?
        }};
    }
    Ok(match element {
        TensorElementType::Float32 => take!(f32, DType::F32),
        TensorElementType::Float64 => take!(f64, DType::F64),
        TensorElementType::Float16 => take!(half::f16, DType::F16),
        TensorElementType::Bfloat16 => take!(half::bf16, DType::BF16),
        TensorElementType::Int64 => take!(i64, DType::I64),
        TensorElementType::Int32 => take!(i32, DType::I32),
        TensorElementType::Int16 => take!(i16, DType::I16),
        TensorElementType::Int8 => take!(i8, DType::I8),
        TensorElementType::Uint64 => take!(u64, DType::U64),
        TensorElementType::Uint32 => take!(u32, DType::U32),
        TensorElementType::Uint16 => take!(u16, DType::U16),
        TensorElementType::Uint8 => take!(u8, DType::U8),
        TensorElementType::Bool => {
            let (shape, data) = value.try_extract_tensor::<bool>().map_err(run_err)?;
            let shape: Vec<usize> = shape.iter().map(|&d| d as usize).collect();
            let bytes = data.iter().map(|&b| u8::from(b)).collect();
            Tensor::new(name, DType::Bool, shape, bytes).map_err(|e| Error::Run(e.to_string()))?
        }
        other => return Err(unsupported(format!("{other:?}"))),
    })
}
