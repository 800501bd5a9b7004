//! Whether a target's values lie on a lower-precision grid than the reference's: a cheap
//! sample that tells a narrower dtype computed inside a float32 layer; and which ops compute
//! on a quantization's grid.

use super::{DType, TensorView};
/// Elements [`precision_grid`] looks at: a float32 value off a 10-bit grid lands on it by
/// chance about once in 8192, so this many on it is no chance.
pub const GRID_SAMPLE: usize = 4096;
/// The sample is taken in evenly spaced runs of this many neighbours (a few cache lines each,
/// where single elements far apart would each cost a trip to memory).
pub(super) const GRID_RUN: usize = 64;

/// Whether the target's values lie on a lower-precision grid the reference's do not: every
/// finite target value of an even sample ([`GRID_SAMPLE`]) survives a round trip through
/// float16 (or bfloat16), while fewer than half of the reference's do. Names the grid.
pub fn precision_grid(reference: TensorView<'_>, target: TensorView<'_>) -> Option<&'static str> {
    let bits = target.dtype.mantissa_bits()?;
    // The coarser grid first: bfloat16 values within float16's range are float16 values too.
    let grids = [("bfloat16", 8, DType::BF16), ("float16", 11, DType::F16)];
    let n = target.numel().min(reference.numel());
    if n == 0 {
        return None;
    }
    // Where each run starts: spread over the whole tensor, or the whole of a small one.
    let runs = GRID_SAMPLE / GRID_RUN;
    let starts: Vec<usize> = if n <= GRID_SAMPLE {
        (0..n).step_by(GRID_RUN).collect()
    } else {
        (0..runs).map(|k| k * (n - GRID_RUN) / (runs - 1)).collect()
    };
    let sample = |view: &TensorView<'_>| {
        let size = view.dtype.size();
        let mut values = Vec::with_capacity(GRID_SAMPLE);
        let mut run = [0.0f64; GRID_RUN];
        for &start in &starts {
            let len = GRID_RUN.min(n - start);
            let bytes = &view.bytes[start * size..(start + len) * size];
            crate::dtype::decode(view.dtype, bytes, &mut run[..len]);
            values.extend_from_slice(&run[..len]);
        }
        values
    };
    let (t_values, r_values) = (sample(&target), sample(&reference));
    grids.into_iter().find_map(|(name, grid_bits, grid)| {
        if grid_bits >= bits {
            return None;
        }
        let on = |values: &[f64]| {
            values
                .iter()
                .filter(|v| v.is_finite() && **v != 0.0)
                .map(|&v| grid.round(v) == v)
                .fold((0usize, 0usize), |(on, all), hit| {
                    (on + usize::from(hit), all + 1)
                })
        };
        let (t_on, t_all) = on(&t_values);
        let (r_on, r_all) = on(&r_values);
        (t_all > 0 && t_on == t_all && 2 * r_on < r_all).then_some(name)
    })
}

/// Whether an ONNX op quantizes or computes on quantized values (`QuantizeLinear`,
/// `DequantizeLinear`, `QLinearConv`, `MatMulInteger`, ONNX Runtime's blockwise int4
/// `MatMulNBits`…): its rounding is the quantization's.
pub fn quantizing_op(op: &str) -> bool {
    matches!(
        op,
        "QuantizeLinear"
            | "DequantizeLinear"
            | "DynamicQuantizeLinear"
            | "MatMulInteger"
            | "ConvInteger"
            | "MatMulNBits"
            | "GatherBlockQuantized"
    ) || op.starts_with("QLinear")
}
