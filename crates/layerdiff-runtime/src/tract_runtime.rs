//! tract: an independent, pure-Rust ONNX runtime, so a model can be checked against a second
//! implementation of every kernel without any other install.

use layerdiff_core::{DType, Tensor};
use layerdiff_onnx::Model;
use tract_onnx::prelude::{
    DatumType, Framework, InferenceFact, InferenceModelExt, IntoRunnable, TValue, TVec,
    Tensor as TractTensor,
};

use crate::spec::py_str;
use crate::{Configured, Error, Result, Runtime, RuntimeKind};

inventory::submit!(RuntimeKind {
    name: "tract",
    listed: "`tract`",
    rank: 1,
    parse: |text| match text {
        "tract" => Ok(TractSpec.into()),
        _ => Err(format!(
            "unknown runtime `{text}` (expected `tract`, which takes no options)"
        )),
    },
    op_backends: || vec!["tract".to_string()],
    wheel: None,
});

/// tract, with its optimizer on (as deployed); values asked for stay outputs, so they exist.
#[derive(Debug, Clone, Default)]
pub struct TractRuntime;

impl crate::RuntimeSpec {
    /// tract.
    pub fn tract() -> Self {
        TractSpec.into()
    }
}

/// tract's spelling, `tract`: it takes no options.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TractSpec;

impl Configured for TractSpec {
    fn spelling(&self) -> String {
        "tract".to_string()
    }

    fn build_here(&self, _as_saved: bool) -> Result<Box<dyn Runtime + Send + Sync>> {
        Ok(Box::new(TractRuntime))
    }

    fn repro(&self, inputs: &[String]) -> (&'static str, String) {
        let order: Vec<String> = inputs.iter().map(|n| py_str(n)).collect();
        (
            "tract",
            format!(
                "    import tract\n\n    model = tract.onnx().load(str(HERE / \"model.onnx\")).into_model()\n    runnable = model.into_runnable()  # optimized, as layerdiff runs tract\n    order = [{}]  # the model's inputs, in the order tract takes them\n    outputs = runnable.run([inputs[name] for name in order])\n    return {{name: value.to_numpy() for name, value in zip(OUTPUTS, outputs)}}\n",
                order.join(", ")
            ),
        )
    }
}

fn datum(dtype: DType) -> Option<DatumType> {
    Some(match dtype {
        DType::F64 => DatumType::F64,
        DType::F32 => DatumType::F32,
        DType::F16 => DatumType::F16,
        DType::I64 => DatumType::I64,
        DType::I32 => DatumType::I32,
        DType::I16 => DatumType::I16,
        DType::I8 => DatumType::I8,
        DType::U64 => DatumType::U64,
        DType::U32 => DatumType::U32,
        DType::U16 => DatumType::U16,
        DType::U8 => DatumType::U8,
        DType::Bool => DatumType::Bool,
        DType::BF16 => return None,
    })
}

fn dtype_of(datum: DatumType) -> Option<DType> {
    DType::ALL
        .into_iter()
        .find(|d| self::datum(*d) == Some(datum))
}

/// Integers few enough to be a shape, axes or a range rather than data: at most this many.
const SHAPE_LIKE: usize = 16;

/// Whether `tensor` is a few integers (see [`SHAPE_LIKE`]).
fn shape_like(tensor: &Tensor) -> bool {
    matches!(tensor.dtype, DType::I64 | DType::I32) && tensor.view().numel() <= SHAPE_LIKE
}

fn tract_err(context: &str) -> impl Fn(tract_onnx::prelude::TractError) -> Error + '_ {
    move |e| said(format!("{context}: {e:#}"))
}

/// tract's error: the node it could not translate where it names one (`Translating node #2
/// "det" Unimplemented(Det) ToTypedTranslator`), else its words.
fn said(message: String) -> Error {
    let lacks = || {
        let after = message.split_once("Translating node #")?.1;
        let (_, quoted) = after.split_once('"')?;
        let (node, why) = quoted.split_once('"')?;
        let why = why.split_whitespace().next()?;
        Some((node.to_string(), why.to_string()))
    };
    match lacks() {
        Some((node, why)) if !node.is_empty() => Error::LacksNode { node, why, message },
        _ => Error::Failed(message),
    }
}

impl Runtime for TractRuntime {
    fn name(&self) -> &str {
        "tract"
    }

    fn detail(&self) -> String {
        "tract 0.23.9 (pure Rust), optimized".to_string()
    }

    fn run(
        &self,
        model: &Model,
        inputs: &[(String, Tensor)],
        outputs: &[String],
    ) -> Result<Vec<(String, Tensor)>> {
        let onnx = tract_onnx::onnx();
        let bytes = model.to_bytes();
        let proto = onnx
            .proto_model_for_read(&mut &bytes[..])
            .map_err(tract_err("tract cannot read the model"))?;
        let dir = model.base_dir().and_then(|d| d.to_str());
        let parsed = onnx
            .parse(&proto, dir)
            .map_err(tract_err("tract cannot load the model"))?;
        let mut graph = parsed.model;
        let mut feed: TVec<TValue> = TVec::new();
        let input_outlets = graph.input_outlets().map_err(tract_err("tract"))?.to_vec();
        for (ix, outlet) in input_outlets.iter().enumerate() {
            let name = graph.node(outlet.node).name.clone();
            let (_, tensor) = inputs.iter().find(|(n, _)| *n == name).ok_or_else(|| {
                Error::Inputs(format!(
                    "the model needs input `{name}`, which was not given"
                ))
            })?;
            let dt = datum(tensor.dtype).ok_or_else(|| Error::Unsupported {
                runtime: "tract",
                what: format!("input `{name}` of dtype {}", tensor.dtype),
            })?;
            // SAFETY: the bytes hold `shape` elements of `dt` (checked when the Tensor was built).
            let t = unsafe { TractTensor::from_raw_dt(dt, &tensor.shape, &tensor.bytes) }
                .map_err(tract_err("tract"))?;
            // A few integers are a shape, an axis or a range a node reads (a piece of a model
            // fed a Reshape's shape that its graph computed): tract prepares a model only where
            // it knows them, so they are given as the values they are, not as any value.
            let fact = if shape_like(tensor) {
                InferenceFact::from(t.clone())
            } else {
                InferenceFact::dt_shape(dt, tensor.shape.clone())
            };
            graph.set_input_fact(ix, fact).map_err(tract_err("tract"))?;
            feed.push(t.into());
        }
        graph
            .select_outputs_by_name(outputs)
            .map_err(tract_err("tract cannot expose the values"))?;
        let plan = graph
            .into_optimized()
            .and_then(|m| m.into_runnable())
            .map_err(tract_err("tract cannot prepare the model"))?;
        let results = plan
            .run(feed)
            .map_err(|e| Error::Failed(format!("tract failed to run the model: {e:#}")))?;
        outputs
            .iter()
            .zip(results)
            .map(|(name, value)| {
                // Shape-like outputs come back as symbolic integers; concrete ones are int64.
                let t: std::borrow::Cow<'_, TractTensor> = if value.datum_type() == DatumType::TDim
                {
                    value.cast_to_dt(DatumType::I64).map_err(|e| {
                        Error::Failed(format!("tract cannot hand back `{name}`: {e:#}"))
                    })?
                } else {
                    std::borrow::Cow::Borrowed(&*value)
                };
                let dtype = dtype_of(t.datum_type()).ok_or_else(|| Error::UnsupportedOutput {
                    name: name.clone(),
                    element: format!("{:?}", t.datum_type()),
                })?;
                let tensor = Tensor::new(name, dtype, t.shape().to_vec(), t.as_bytes().to_vec())
                    .map_err(|e| Error::Failed(format!("tract: {e}")))?;
                Ok((name.clone(), tensor))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_untranslated_node_is_named_and_any_other_error_kept_in_tracts_words() {
        let text = "tract cannot load the model: Translating node #2 \"det\" Unimplemented(Det) ToTypedTranslator";
        match super::said(text.to_string()) {
            crate::Error::LacksNode { node, why, message } => {
                assert_eq!((node.as_str(), why.as_str()), ("det", "Unimplemented(Det)"));
                assert_eq!(message, text);
            }
            other => panic!("{other:?}"),
        }
        let other = super::said("tract cannot read the model: bad proto".to_string());
        assert!(matches!(other, crate::Error::Failed(_)), "{other:?}");
    }
}
