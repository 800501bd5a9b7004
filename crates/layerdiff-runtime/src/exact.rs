//! layerdiff's own float64 kernels, where neither ONNX Runtime nor tract computes an op in
//! float64 (Erf and Gelu, in every GELU), or tract does it too slowly for every layer of a model
//! (Conv, see [`conv`]), or a session of ONNX Runtime costs more than the op (Relu, Identity,
//! and Add of two values of one shape: a CNN has dozens, each exact in float64 whichever
//! computes it).
//! They run single-node models, as [`crate::PerNode`] hands them, and refuse anything else at
//! once, so they go first.

use std::borrow::Cow;

use layerdiff_core::{DType, Tensor, TensorView};
use layerdiff_onnx::{Model, NodeProto, Stored};
use rayon::prelude::*;

use crate::{Error, Result, Runtime};

mod conv;

/// The ops these kernels compute.
const OPS: [&str; 6] = ["Add", "Conv", "Erf", "Gelu", "Identity", "Relu"];

/// GELU as ONNX defines it: exact (with erf), or its tanh approximation.
fn gelu(x: f64, tanh: bool) -> f64 {
    if tanh {
        let k = (2.0 / std::f64::consts::PI).sqrt();
        0.5 * x * (1.0 + (k * (x + 0.044715 * x * x * x)).tanh())
    } else {
        0.5 * x * (1.0 + libm::erf(x / std::f64::consts::SQRT_2))
    }
}

/// layerdiff's float64 kernels (see the module docs).
pub struct ExactKernels;

fn unsupported(what: String) -> Error {
    Error::Unsupported {
        runtime: "layerdiff's float64 evaluation",
        what,
    }
}

/// A float64 tensor's values, borrowed where its bytes are aligned for them.
fn values<'a>(t: &TensorView<'a>) -> Cow<'a, [f64]> {
    match bytemuck::try_cast_slice(t.bytes) {
        Ok(values) if cfg!(target_endian = "little") => Cow::Borrowed(values),
        _ => Cow::Owned(
            t.bytes
                .chunks_exact(8)
                .map(|b| f64::from_le_bytes(b.try_into().expect("8 bytes")))
                .collect(),
        ),
    }
}

/// A float64 tensor of `shape` whose values `fill` writes (every one of them), in the tensor's
/// own bytes where they are aligned for float64 (no copy: a CNN's values are megabytes each),
/// else in a buffer of its own, copied once.
fn float64(shape: Vec<usize>, fill: impl FnOnce(&mut [f64])) -> Result<Tensor> {
    let numel = shape.iter().product::<usize>();
    let mut bytes = vec![0u8; numel * 8];
    match bytemuck::try_cast_slice_mut::<u8, f64>(&mut bytes) {
        Ok(values) if cfg!(target_endian = "little") => fill(values),
        _ => {
            let mut values = vec![0.0; numel];
            fill(&mut values);
            bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        }
    }
    Tensor::new("y", DType::F64, shape, bytes)
        .map_err(|e| Error::Failed(format!("layerdiff's float64 kernels: {e}")))
}

/// Elements each thread takes at once in the elementwise kernels.
const RUN: usize = 1 << 14;

/// Erf, Gelu or Relu, elementwise on the float64 `x`.
fn elementwise(node: &NodeProto, x: TensorView<'_>) -> Result<Tensor> {
    let tanh = node
        .attribute
        .iter()
        .any(|a| a.name() == "approximate" && a.s.as_deref() == Some(b"tanh".as_slice()));
    let f = match node.op_type() {
        "Erf" => libm::erf,
        // as ONNX Runtime's: a NaN stays NaN, -0 stays -0
        "Relu" => |x: f64| if x < 0.0 { 0.0 } else { x },
        "Gelu" if tanh => |x| gelu(x, true),
        _ => |x| gelu(x, false),
    };
    if x.dtype != DType::F64 {
        return Err(unsupported(format!("{} on {}", node.op_type(), x.dtype)));
    }
    let (shape, x) = (x.shape.to_vec(), values(&x));
    float64(shape, |y| {
        y.par_chunks_mut(RUN)
            .zip(x.par_chunks(RUN))
            .for_each(|(y, x)| y.iter_mut().zip(x).for_each(|(y, &x)| *y = f(x)));
    })
}

/// Add of two float64 values of one shape (one that broadcasts is ONNX Runtime's).
fn add(a: TensorView<'_>, b: TensorView<'_>) -> Result<Tensor> {
    if a.dtype != DType::F64 || b.dtype != DType::F64 || a.shape != b.shape {
        return Err(unsupported(format!(
            "an Add of {} {:?} and {} {:?}",
            a.dtype, a.shape, b.dtype, b.shape
        )));
    }
    let (x, z) = (values(&a), values(&b));
    float64(a.shape.to_vec(), |y| {
        y.par_chunks_mut(RUN)
            .zip(x.par_chunks(RUN).zip(z.par_chunks(RUN)))
            .for_each(|(y, (x, z))| {
                for ((y, &x), &z) in y.iter_mut().zip(x).zip(z) {
                    *y = x + z;
                }
            });
    })
}

impl Runtime for ExactKernels {
    fn name(&self) -> &str {
        "layerdiff"
    }

    fn detail(&self) -> String {
        format!("layerdiff's own float64 {}", OPS.join(", "))
    }

    fn run(
        &self,
        model: &Model,
        inputs: &[(String, Tensor)],
        outputs: &[String],
    ) -> Result<Vec<(String, Tensor)>> {
        let [node] = model.graph().node.as_slice() else {
            return Err(unsupported("a graph of more than one node".into()));
        };
        if !OPS.contains(&node.op_type()) {
            return Err(unsupported(node.op_type().to_string()));
        }
        let Some(output) = node.output.first() else {
            return Err(unsupported(format!("{} without an output", node.op_type())));
        };
        // an input given, else an initializer of the model (a weight), borrowed
        let operand = |i: usize| -> Result<Option<Stored<'_>>> {
            let Some(name) = node.input.get(i).filter(|n| !n.is_empty()) else {
                return Ok(None);
            };
            if let Some((_, t)) = inputs.iter().find(|(n, _)| n == name) {
                return Ok(Some(Stored {
                    dtype: t.dtype,
                    shape: t.shape.clone(),
                    bytes: Cow::Borrowed(&t.bytes),
                }));
            }
            match model.stored(name) {
                Some(t) => t.map(Some).map_err(|e| {
                    Error::Failed(format!(
                        "layerdiff's float64 kernels cannot read `{name}`: {e}"
                    ))
                }),
                None => Err(Error::Inputs(format!("`{name}` was not given"))),
            }
        };
        let Some(x) = operand(0)? else {
            return Err(unsupported(format!("{} without an input", node.op_type())));
        };
        let y = match node.op_type() {
            // a weight shared under another name (the legacy exporter's): the value itself
            "Identity" => Tensor::new("y", x.dtype, x.shape.clone(), x.bytes.into_owned())
                .map_err(|e| Error::Failed(format!("layerdiff's float64 kernels: {e}")))?,
            "Conv" => {
                let w = operand(1)?.ok_or_else(|| unsupported("a Conv without a weight".into()))?;
                let b = operand(2)?;
                conv::conv(node, x.view(), w.view(), b.as_ref().map(Stored::view))
                    .map_err(unsupported)?
            }
            "Add" => {
                let b = operand(1)?.ok_or_else(|| unsupported("an Add of one value".into()))?;
                add(x.view(), b.view())?
            }
            _ => elementwise(node, x.view())?,
        };
        // the one output, handed back once however often it is asked for
        let mut y = Some(y);
        Ok(outputs
            .iter()
            .filter(|o| *o == output)
            .filter_map(|o| y.take().map(|y| (o.clone(), y)))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use layerdiff_onnx::{GraphProto, ModelProto, NodeProto, tensor_value_info};

    use super::*;

    fn single(op: &str, approximate: Option<&str>) -> Model {
        let node = NodeProto {
            op_type: Some(op.into()),
            input: vec!["x".into()],
            output: vec!["y".into()],
            attribute: approximate
                .map(|a| layerdiff_onnx::AttributeProto {
                    name: Some("approximate".into()),
                    r#type: Some(3),
                    s: Some(a.as_bytes().to_vec()),
                    ..Default::default()
                })
                .into_iter()
                .collect(),
            ..Default::default()
        };
        let proto = ModelProto {
            graph: Some(GraphProto {
                node: vec![node],
                input: vec![tensor_value_info("x", 11, &[3])],
                output: vec![tensor_value_info("y", 11, &[3])],
                ..Default::default()
            }),
            ..Default::default()
        };
        Model::from_proto(proto, None)
    }

    fn run(op: &str, approximate: Option<&str>) -> Vec<f64> {
        let x = [-1.0f64, 0.5, 2.0];
        let bytes = x.iter().flat_map(|v| v.to_le_bytes()).collect();
        let input = Tensor::new("x", DType::F64, vec![3], bytes).unwrap();
        let out = ExactKernels
            .run(
                &single(op, approximate),
                &[("x".into(), input)],
                &["y".into()],
            )
            .unwrap();
        out[0]
            .1
            .bytes
            .chunks_exact(8)
            .map(|b| f64::from_le_bytes(b.try_into().unwrap()))
            .collect()
    }

    #[test]
    fn erf_and_both_gelus_in_float64() {
        let close = |a: &[f64], b: &[f64]| a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-15);
        let erf = run("Erf", None);
        assert!(
            close(
                &erf,
                &[-0.8427007929497149, 0.5204998778130465, 0.9953222650189527]
            ),
            "{erf:?}"
        );
        let gelu = run("Gelu", None);
        assert!(
            close(
                &gelu,
                &[
                    -0.15865525393145707,
                    0.34573123063700656,
                    1.9544997361036416
                ]
            ),
            "{gelu:?}"
        );
        let tanh = run("Gelu", Some("tanh"));
        assert!((tanh[2] - 1.9545976940871754).abs() < 1e-12, "{tanh:?}");
        let err = ExactKernels
            .run(&single("Sin", None), &[], &["y".into()])
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "layerdiff's float64 evaluation does not support Sin"
        );
    }

    #[test]
    fn relu_as_onnx_runtime_computes_it_and_add_of_one_shape() {
        let relu = run("Relu", None);
        assert_eq!(relu, [0.0, 0.5, 2.0]);
        let x = |values: &[f64]| {
            let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
            Tensor::new("x", DType::F64, vec![values.len()], bytes).unwrap()
        };
        let signs = relu_of(&x(&[-0.0, f64::NAN, -3.0]));
        assert!(signs[0] == 0.0 && signs[0].is_sign_negative(), "{signs:?}");
        assert!(signs[1].is_nan() && signs[2] == 0.0, "{signs:?}");
        let sum = add(x(&[1.0, 2.0]).view(), x(&[0.25, -2.0]).view()).unwrap();
        assert_eq!(values(&sum.view()).as_ref(), [1.25, 0.0]);
        let err = add(x(&[1.0, 2.0]).view(), x(&[1.0]).view()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "layerdiff's float64 evaluation does not support an Add of float64 [2] and float64 [1]"
        );
    }

    fn relu_of(x: &Tensor) -> Vec<f64> {
        let node = NodeProto {
            op_type: Some("Relu".into()),
            ..Default::default()
        };
        values(&elementwise(&node, x.view()).unwrap().view()).into_owned()
    }

    #[test]
    fn identity_hands_its_value_back_in_its_own_dtype() {
        assert_eq!(run("Identity", None), [-1.0, 0.5, 2.0]);
        let shape = Tensor::new(
            "x",
            DType::I64,
            vec![2],
            [3i64, 4].map(i64::to_le_bytes).concat(),
        )
        .unwrap();
        let out = ExactKernels
            .run(
                &single("Identity", None),
                &[("x".into(), shape.clone())],
                &["y".into()],
            )
            .unwrap();
        assert_eq!(out[0].1, shape, "an int64 value as it came");
    }

    #[test]
    fn a_node_without_an_input_is_refused_not_a_panic() {
        let mut model = single("Erf", None);
        model.graph_mut().node[0].input = vec![String::new()];
        let err = ExactKernels.run(&model, &[], &["y".into()]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "layerdiff's float64 evaluation does not support Erf without an input"
        );
    }
}
