//! The weights a quantized graph stores in another form than the model's, dequantized to be
//! checked against the reference's: a DequantizeLinear's, the integers of ONNX Runtime's dynamic
//! quantization (MatMulInteger, ConvInteger) and its blockwise MatMulNBits; each with half its
//! scale step per element, what rounding to the grid moves a weight by.

use layerdiff_core::{DType, Tensor, TensorView};
use layerdiff_onnx::{NodeExt, NodeProto};

use super::Stored;
use crate::engine::evidence::{dequantize, integer_product_weight};

impl Stored<'_> {
    /// A stored weight a DequantizeLinear scales back, dequantized (float64), and half its
    /// scale step per element; `None` when it is no stored integer weight, or is quantized in
    /// blocks.
    pub(super) fn dequantized(&self, node: &NodeProto) -> Option<(Tensor, Tensor)> {
        let read = |position: usize| {
            let name = node.input.get(position).filter(|n| !n.is_empty())?;
            self.model.initializer(name)?.ok()
        };
        if node.attr_i64("block_size").is_ok_and(|b| b != 0) {
            return None;
        }
        let axis = node.attr_i64("axis").unwrap_or(1);
        dequantize(&node.input[0], &read(0)?, &read(1)?, read(2).as_ref(), axis)
    }

    /// The stored integer weight of an integer matrix product (MatMulInteger's `B`,
    /// ConvInteger's `w`, as ONNX Runtime's dynamic quantization writes them), dequantized with
    /// its zero point and the scale the product's result is multiplied by, and half that scale
    /// step per element: `None` where the weight is not stored, or its scale is not found.
    ///
    /// The scale is found the way the quantizer wires it: the product is cast to float and
    /// multiplied by a scale, itself the input's (dynamic) scale times the weight's stored one.
    pub(super) fn integer_weight(&self, node: &NodeProto) -> Option<(Tensor, Tensor)> {
        integer_product_weight(self.model, self.index, node)
    }
}

impl Stored<'_> {
    /// The weight of ONNX Runtime's `MatMulNBits` (`B`: `bits`-bit integers packed low bits
    /// first, `[N, blocks, block_size · bits / 8]`; a scale per block of `block_size` along K;
    /// zero points packed alike, else the middle of the range), dequantized to the `[K, N]`
    /// matrix a MatMul reads (float64), with half its block's scale step per element. `None`
    /// where it is not stored, or packed otherwise.
    pub(super) fn block_weight(&self, node: &NodeProto) -> Option<(Tensor, Tensor)> {
        let read = |position: usize| {
            let name = node.input.get(position).filter(|n| !n.is_empty())?;
            self.model.initializer(name)?.ok()
        };
        let attr = |name: &str| {
            node.attr_i64(name)
                .ok()
                .and_then(|v| usize::try_from(v).ok())
        };
        let (k, n, block) = (attr("K")?, attr("N")?, attr("block_size")?);
        let bits = attr("bits").unwrap_or(4);
        if !matches!(bits, 2 | 4 | 8) || block == 0 {
            return None;
        }
        let packed = read(1).filter(|t| t.dtype == DType::U8)?;
        let scales = read(2)?;
        let zeros = read(3);
        let blocks = k.div_ceil(block);
        let blob = block * bits / 8;
        let (packed, scales) = (packed.view(), scales.view());
        if packed.numel() != n * blocks * blob || scales.numel() != n * blocks {
            return None;
        }
        let per_byte = 8 / bits;
        let mask = (1u32 << bits) - 1;
        let middle = f64::from(1u32 << (bits - 1));
        // the `i`-th value of a packed row of `bits`-bit integers
        let unpack = |bytes: &TensorView<'_>, start: usize, i: usize| {
            let byte = bytes.get_f64(start + i / per_byte) as u32;
            f64::from((byte >> ((i % per_byte) * bits)) & mask)
        };
        let zero = |column: usize, b: usize| match &zeros {
            Some(z) if z.dtype == DType::U8 => {
                let per_row = blocks.div_ceil(per_byte);
                unpack(&z.view(), column * per_row, b)
            }
            Some(z) if z.dtype.is_float() => z.view().get_f64(column * blocks + b),
            _ => middle,
        };
        let (mut values, mut halves) = (vec![0.0; k * n], vec![0.0; k * n]);
        for column in 0..n {
            for b in 0..blocks {
                let scale = scales.get_f64(column * blocks + b);
                let z = zero(column, b);
                let start = (column * blocks + b) * blob;
                for i in 0..block.min(k - b * block) {
                    let row = b * block + i;
                    let q = unpack(&packed, start, i);
                    values[row * n + column] = (q - z) * scale;
                    // a value at either end of the range may be one clipped there (a
                    // symmetric quantizer scales the block's largest magnitude to 2^(bits-1),
                    // one past the largest value it stores): a whole step
                    let edge = q == 0.0 || q == f64::from(mask);
                    halves[row * n + column] = scale.abs() * if edge { 1.0 } else { 0.5 };
                }
            }
        }
        let shaped = |values: &[f64]| {
            let flat = Tensor::from_f64(DType::F64, values);
            Tensor::new(node.input[1].as_str(), DType::F64, vec![k, n], flat.bytes).ok()
        };
        Some((shaped(&values)?, shaped(&halves)?))
    }
}
