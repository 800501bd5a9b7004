//! Quantized weights as the numbers they stand for: stored integers dequantized with their
//! scale and zero point, and half a scale step per element (what rounding to the grid moves a
//! weight by), for the weight checks of both sides.

use layerdiff_core::{DType, Tensor};
use layerdiff_onnx::{GraphIndex, Model, NodeExt, NodeProto};

/// The integer codes `model` stores as `name`, dequantized (float64) with the scale and zero
/// point of a node that reads them (a DequantizeLinear; a QLinearConv's or QLinearMatMul's
/// weight), with half the scale step per element: what the reference's dequantized weight is
/// checked against where the target's graph reads the codes themselves (ONNX Runtime's
/// optimizer fuses QDQ into QLinearConv). `None` where no reader gives their scale.
pub(crate) fn dequantized_codes(model: &Model, name: &str) -> Option<(Tensor, Tensor)> {
    let stored = model
        .initializer(name)?
        .ok()
        .filter(|t| !t.dtype.is_float())?;
    let read = |node: &NodeProto, position: usize| {
        let input = node.input.get(position).filter(|n| !n.is_empty())?;
        model.initializer(input)?.ok()
    };
    model.graph().node.iter().find_map(|node| {
        let (at, axis) = match node.op_type() {
            "DequantizeLinear" if node.attr_i64("block_size").is_ok_and(|b| b != 0) => None,
            "DequantizeLinear" => Some((0, node.attr_i64("axis").unwrap_or(1))),
            // per output channel: a convolution's filters, a matrix's columns
            "QLinearConv" => Some((3, 0)),
            "QLinearMatMul" => Some((3, stored.shape.len() as i64 - 1)),
            // its scale is found past the product (ONNX Runtime's dynamic quantization)
            "ConvInteger" | "MatMulInteger"
                if node.input.get(1).map(String::as_str) == Some(name) =>
            {
                let index = GraphIndex::new(model.graph());
                return integer_product_weight(model, &index, node);
            }
            _ => None,
        }?;
        if node.input.get(at).map(String::as_str) != Some(name) {
            return None;
        }
        dequantize(
            name,
            &stored,
            &read(node, at + 1)?,
            read(node, at + 2).as_ref(),
            axis,
        )
    })
}

/// The stored integer weight of an integer matrix product (MatMulInteger's `B`,
/// ConvInteger's `w`, as ONNX Runtime's dynamic quantization writes them), dequantized with
/// its zero point and the scale the product's result is multiplied by, and half that scale
/// step per element: `None` where the weight is not stored, or its scale is not found.
///
/// The scale is found the way the quantizer wires it: the product is cast to float and
/// multiplied by a scale, itself the input's (dynamic) scale times the weight's stored one.
pub(crate) fn integer_product_weight(
    model: &Model,
    index: &GraphIndex,
    node: &NodeProto,
) -> Option<(Tensor, Tensor)> {
    let read = |name: &str| model.initializer(name)?.ok();
    let (weight, zero) = (node.input.get(1)?, node.input.get(3));
    let stored = read(weight).filter(|t| !t.dtype.is_float())?;
    let zero = zero.filter(|z| !z.is_empty()).and_then(|z| read(z));
    let mut value = node.output.first()?.clone();
    // through the casts to the multiplication by the scales
    let scales = loop {
        let next = index.consumers(&value).next()?;
        match next.op_type.as_str() {
            "Cast" => value = next.outputs.first()?.clone(),
            "Mul" => break next.inputs.iter().find(|n| **n != value)?.clone(),
            _ => return None,
        }
    };
    let scale = match read(&scales) {
        Some(stored_scale) => stored_scale,
        None => {
            let product = index.producer(&scales).filter(|p| p.op_type == "Mul")?;
            product.inputs.iter().find_map(|n| read(n))?
        }
    };
    // per output channel: a matrix's columns, a convolution's filters
    let axis = if node.op_type() == "ConvInteger" {
        0
    } else {
        1
    };
    dequantize(weight, &stored, &scale, zero.as_ref(), axis)
}

/// `stored` integers dequantized as `(q − zero) · scale` (float64), with half the scale step
/// per element: per tensor, or per channel along `axis` where the scale has one per channel.
/// `None` where the scale fits neither.
pub(crate) fn dequantize(
    name: &str,
    stored: &Tensor,
    scale: &Tensor,
    zero: Option<&Tensor>,
    axis: i64,
) -> Option<(Tensor, Tensor)> {
    let shape = stored.shape.clone();
    let rank = shape.len() as i64;
    let axis = if axis < 0 { axis + rank } else { axis };
    let channels = scale.view().numel();
    let per_axis = channels > 1;
    if per_axis && (axis < 0 || axis >= rank || shape[axis as usize] != channels) {
        return None;
    }
    // the index along `axis` of element `i`
    let inner: usize = if per_axis {
        shape[axis as usize + 1..].iter().product()
    } else {
        1
    };
    let channel = |i: usize| {
        if per_axis { (i / inner) % channels } else { 0 }
    };
    let (stored, scale) = (stored.view(), scale.view());
    let n = stored.numel();
    let (mut values, mut halves) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for i in 0..n {
        let c = channel(i);
        let s = scale.get_f64(c);
        let z = zero.map_or(0.0, |z| z.view().get_f64(c.min(z.view().numel() - 1)));
        values.push((stored.get_f64(i) - z) * s);
        halves.push(s.abs() / 2.0);
    }
    let shaped = |values: &[f64]| {
        let flat = Tensor::from_f64(DType::F64, values);
        Tensor::new(name, DType::F64, shape.clone(), flat.bytes).ok()
    };
    Some((shaped(&values)?, shaped(&halves)?))
}
