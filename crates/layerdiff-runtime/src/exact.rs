//! layerdiff's own float64 kernels, for the elementwise ops neither ONNX Runtime nor tract
//! computes in float64 (Erf and Gelu, in every GELU). They run single-node models, as
//! [`crate::PerNode`] hands them, and refuse anything else.

use layerdiff_core::{DType, Tensor};
use layerdiff_onnx::Model;

use crate::{Error, Result, Runtime};

/// The ops these kernels compute, elementwise on one float64 input.
const OPS: [&str; 2] = ["Erf", "Gelu"];

/// GELU as ONNX defines it: exact (with erf), or its tanh approximation.
fn gelu(x: f64, tanh: bool) -> f64 {
    if tanh {
        let k = (2.0 / std::f64::consts::PI).sqrt();
        0.5 * x * (1.0 + (k * (x + 0.044715 * x * x * x)).tanh())
    } else {
        0.5 * x * (1.0 + libm::erf(x / std::f64::consts::SQRT_2))
    }
}

/// Elementwise float64 kernels (see the module docs).
pub struct ExactElementwise;

impl Runtime for ExactElementwise {
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
        let unsupported = |what: String| Error::Unsupported {
            runtime: "layerdiff's float64 kernels",
            what,
        };
        let [node] = model.graph().node.as_slice() else {
            return Err(unsupported("a graph of more than one node".into()));
        };
        let tanh = node
            .attribute
            .iter()
            .any(|a| a.name() == "approximate" && a.s.as_deref() == Some(b"tanh".as_slice()));
        let f = match node.op_type() {
            "Erf" => libm::erf,
            "Gelu" if tanh => |x| gelu(x, true),
            "Gelu" => |x| gelu(x, false),
            other => return Err(unsupported(other.to_string())),
        };
        let (Some(input), Some(output)) = (node.input.first(), node.output.first()) else {
            return Err(unsupported(format!("{} without an input", node.op_type())));
        };
        let Some((_, x)) = inputs.iter().find(|(n, _)| n == input) else {
            return Err(Error::Inputs(format!("`{input}` was not given")));
        };
        if x.dtype != DType::F64 {
            return Err(unsupported(format!("{} on {}", node.op_type(), x.dtype)));
        }
        let bytes: Vec<u8> = x
            .bytes
            .chunks_exact(8)
            .flat_map(|b| f(f64::from_le_bytes(b.try_into().expect("8 bytes"))).to_le_bytes())
            .collect();
        let y = Tensor::new(output, DType::F64, x.shape.clone(), bytes)
            .map_err(|e| Error::Run(e.to_string()))?;
        Ok(outputs
            .iter()
            .filter(|o| *o == output)
            .map(|o| (o.clone(), y.clone()))
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
        let out = ExactElementwise
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
        let err = ExactElementwise
            .run(&single("Sin", None), &[], &["y".into()])
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "layerdiff's float64 kernels does not support Sin"
        );
    }
}
