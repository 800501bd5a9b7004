//! Checking that given inputs fit what the model declares, before any runtime sees them.

use layerdiff_core::{DType, Tensor};
use layerdiff_onnx::{Dimension, GraphIndex};

use crate::{Error, Result};

/// `inputs` made fit for a graph that declares another float type for some of them (a float16
/// export of a float32 model): those cast to the declared type, each with a sentence saying so.
pub fn fit_inputs(
    index: &GraphIndex,
    inputs: &[(String, Tensor)],
) -> (Vec<(String, Tensor)>, Vec<String>) {
    let mut notes = Vec::new();
    let fitted = inputs
        .iter()
        .map(|(name, tensor)| {
            let declared = index
                .value_type(name)
                .and_then(|v| DType::from_onnx_code(v.elem_type).ok())
                .filter(|d| d.is_float() && tensor.dtype.is_float() && *d != tensor.dtype);
            let Some(dtype) = declared else {
                return (name.clone(), tensor.clone());
            };
            notes.push(format!(
                "input `{name}` is cast from {} to {dtype} for the target, whose file declares it so",
                tensor.dtype
            ));
            (name.clone(), tensor.clone().cast(dtype))
        })
        .collect();
    (fitted, notes)
}

/// A warning for each runtime input of the file that no node reads (and that is not an
/// output): the file's outputs do not depend on it, which for an export means the exporter made
/// it a constant (a value read with `.item()` or turned into a Python number is traced as the
/// example's) or the model ignores it too.
pub fn unread_inputs(index: &GraphIndex) -> Vec<String> {
    index
        .graph_inputs()
        .iter()
        .filter(|name| {
            index.consumers(name).next().is_none() && !index.graph_outputs().contains(name)
        })
        .map(|name| {
            format!(
                "the ONNX input `{name}` is read by no node, so the file's outputs do not depend on it: if the model's do, the export made it a constant (a value read with .item() or turned into a Python number is traced as the example's)"
            )
        })
        .collect()
}

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

/// How to make inputs for a model that declares them.
#[derive(Debug, Clone, Default)]
pub struct InputPlan {
    /// Seed of the generated values.
    pub seed: u64,
    /// Explicit shapes by input name (`--shape name=1,3,224,224`).
    pub shapes: Vec<(String, Vec<usize>)>,
    /// Size of a dynamic leading dimension (`--batch N`).
    pub batch: Option<usize>,
    /// Inclusive range of generated integers (`--int-range lo,hi`).
    pub int_range: (i64, i64),
}

/// Seeded inputs with the dtypes and shapes the graph declares. Dynamic dimensions come from
/// `plan.shapes`, or `plan.batch` for the first dimension, which is 1 where neither sets it
/// ([`defaulted_batch`] says so); any other is an error that says how to set it.
pub fn generate_inputs(index: &GraphIndex, plan: &InputPlan) -> Result<Vec<(String, Tensor)>> {
    for (name, _) in &plan.shapes {
        if !index.graph_inputs().contains(name) {
            return Err(Error::Inputs(format!(
                "--shape names `{name}`, which is not an input of the model (its inputs are {:?})",
                index.graph_inputs()
            )));
        }
    }
    if let Some(batch) = plan.batch {
        batch_applies(index, plan, batch)?;
    }
    let mut rng = layerdiff_core::SplitMix64::new(plan.seed);
    index
        .graph_inputs()
        .iter()
        .map(|name| {
            let declared = index.value_type(name).ok_or_else(|| {
                Error::Inputs(format!(
                    "input `{name}` declares no type; give the inputs with --inputs"
                ))
            })?;
            let dtype = DType::from_onnx_code(declared.elem_type).map_err(|_| {
                Error::Inputs(format!(
                    "input `{name}` has element type {} (unsupported)",
                    declared.elem_type
                ))
            })?;
            let shape = match plan.shapes.iter().find(|(n, _)| n == name) {
                Some((_, shape)) => shape.clone(),
                None => resolve_dims(name, declared.dims.as_deref().unwrap_or(&[]), plan.batch)?,
            };
            Ok((
                name.clone(),
                layerdiff_core::random_tensor(dtype, &shape, &mut rng, plan.int_range),
            ))
        })
        .collect()
}

/// `--batch N` where some input left to it has a dynamic first dimension, or each has `N`
/// fixed there already; else an error that says so (the file runs its fixed size only, and a
/// run at another would pass for one at `N`).
fn batch_applies(index: &GraphIndex, plan: &InputPlan, batch: usize) -> Result<()> {
    let mut fixed = Vec::new();
    for name in index.graph_inputs() {
        if plan.shapes.iter().any(|(n, _)| n == name) {
            continue;
        }
        let dims = index.value_type(name).and_then(|t| t.dims.as_deref());
        match dims.and_then(|d| d.first()) {
            Some(Dimension::Fixed(v)) if *v >= 0 => fixed.push((name, *v)),
            _ => return Ok(()),
        }
    }
    if fixed.iter().all(|(_, v)| usize::try_from(*v) == Ok(batch)) {
        return Ok(());
    }
    let shown: Vec<String> = fixed.iter().map(|(n, v)| format!("`{n}` ({v})")).collect();
    Err(Error::Inputs(format!(
        "--batch {batch}: no input of the model has a dynamic first dimension, it is fixed in {}: the file runs that size only; export it with a dynamic batch dimension to run {batch}",
        shown.join(", ")
    )))
}

/// What the report says of the inputs whose dynamic first (batch) dimension was made 1, where
/// neither `--batch` nor `--shape` set it.
pub fn defaulted_batch(index: &GraphIndex, plan: &InputPlan) -> Option<String> {
    if plan.batch.is_some() {
        return None;
    }
    let defaulted: Vec<String> = index
        .graph_inputs()
        .iter()
        .filter(|name| !plan.shapes.iter().any(|(n, _)| n == *name))
        .filter_map(|name| {
            let dims = index.value_type(name)?.dims.as_deref()?;
            let first = dims.first().filter(|_| dims.len() > 1)?;
            match first {
                Dimension::Fixed(v) if *v >= 0 => None,
                Dimension::Symbolic(Some(p)) => Some(format!("`{name}` (`{p}`)")),
                _ => Some(format!("`{name}`")),
            }
        })
        .collect();
    (!defaulted.is_empty()).then(|| {
        format!(
            "the dynamic batch dimension of {} was set to 1 (give --batch N or --shape NAME=… for another size)",
            defaulted.join(", ")
        )
    })
}

fn resolve_dims(name: &str, dims: &[Dimension], batch: Option<usize>) -> Result<Vec<usize>> {
    dims.iter()
        .enumerate()
        .map(|(i, d)| match (d, batch) {
            (Dimension::Fixed(v), _) if *v >= 0 => Ok(*v as usize),
            (_, Some(b)) if i == 0 => Ok(b),
            // a dynamic batch dimension: one example, as Polygraphy and ONNX Runtime's tools take
            (_, None) if i == 0 && dims.len() > 1 => Ok(1),
            (d, _) => {
                let what = match d {
                    Dimension::Symbolic(Some(p)) => format!("`{p}`"),
                    _ => "an unnamed size".to_string(),
                };
                let batch = if i == 0 { " or --batch N" } else { "" };
                Err(Error::Inputs(format!(
                    "input `{name}` has a dynamic dimension {i} ({what}): set it with --shape {name}=…{batch}"
                )))
            }
        })
        .collect()
}

/// Reads inputs from a file: an ONNX test data folder (`input_N.pb`), an `.npz` archive, or a
/// safetensors file. Unnamed `.pb` tensors take the graph's input names in order.
pub fn read_inputs(path: &std::path::Path, index: &GraphIndex) -> Result<Vec<(String, Tensor)>> {
    if path.is_dir() {
        let inputs = layerdiff_onnx::read_test_data(path, "input", index.graph_inputs())?;
        if inputs.is_empty() {
            return Err(Error::Inputs(format!(
                "`{}` holds no input_N.pb files",
                path.display()
            )));
        }
        return Ok(inputs);
    }
    if path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("npz"))
    {
        return Ok(layerdiff_core::read_npz(path)?);
    }
    Ok(layerdiff_core::read_safetensors(path)?)
}
