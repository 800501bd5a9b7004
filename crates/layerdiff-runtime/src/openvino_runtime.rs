//! OpenVINO: Intel's runtime, loaded from the `openvino` wheel's C library. It reads ONNX
//! files itself, runs them on its CPU plugin with its own kernels and fusions, and takes an
//! inference-precision hint (f32, f16, bf16) that the plugin resolves to what the machine can do.

use std::path::Path;
use std::sync::Mutex;

use layerdiff_core::{DType, Tensor};
use layerdiff_onnx::Model;
use openvino::{Core, DeviceType, ElementType, PropertyKey, RwPropertyKey, Shape};

use crate::{Error, ReducedMath, Result, Runtime};

mod loading;
mod spec;

pub use loading::OPENVINO_LIBRARY_ENV;
pub(crate) use loading::OPENVINO_WHEEL;
use loading::load;
pub use spec::OpenVinoSpec;

/// The inference precisions OpenVINO's CPU plugin takes as a hint.
pub const OPENVINO_PRECISIONS: [&str; 3] = ["f32", "f16", "bf16"];

/// The float32 ops OpenVINO's CPU plugin computes in its inference precision when that is f16 or
/// bf16 (it lowers every node that has a kernel in it; these are the ones models are made of).
const LOWERED_OPS: [&str; 25] = [
    "Conv",
    "ConvTranspose",
    "MatMul",
    "Gemm",
    "Add",
    "Sub",
    "Mul",
    "Div",
    "Relu",
    "Sigmoid",
    "Tanh",
    "Gelu",
    "Erf",
    "Softmax",
    "LayerNormalization",
    "BatchNormalization",
    "InstanceNormalization",
    "ReduceMean",
    "ReduceSum",
    "MaxPool",
    "AveragePool",
    "GlobalAveragePool",
    "Pow",
    "Sqrt",
    // its float32 Resize is a bfloat16 one's numbers here (the op matrix's bilinear cells)
    "Resize",
];

/// What the plugin does to float32 math at the precision it resolved (`None` at f32).
fn lowered(resolved: &str) -> Option<ReducedMath> {
    let grid = match resolved {
        "f16" => DType::F16,
        "bf16" => DType::BF16,
        _ => return None,
    };
    Some(ReducedMath {
        ops: &LOWERED_OPS,
        grid: Some(grid),
        how: format!(
            "OpenVINO's CPU plugin computes float32 in {resolved} here (its inference precision); \
             `openvino:precision=f32` runs it in full float32"
        ),
    })
}

/// OpenVINO's CPU plugin, at the precision it resolved from the hint asked for.
pub struct OpenVinoRuntime {
    /// `None` for a side described here whose library is loaded in its worker process only
    /// (`openvino:lib=PATH`): it runs nothing here.
    core: Option<Mutex<Core>>,
    /// The hint asked for (`None`: the plugin's default).
    asked: Option<String>,
    plugin: Plugin,
    /// Its inference threads where `LAYERDIFF_THREADS` set them (a worker inherits the
    /// variable); `None`: the plugin's default.
    threads: Option<usize>,
}

/// What the CPU plugin of the loaded library is on this machine: what a worker that loaded
/// another release tells the process that started it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Plugin {
    /// The precision the plugin resolved the hint to on this machine (`f32` where it has no
    /// f16 or bf16 arithmetic).
    resolved: String,
    /// The plugin's build (`2026.4.1-22982-…`).
    version: String,
    /// What the CPU plugin offers on this machine (`FP32 INT8 BIN`).
    capabilities: String,
}

impl Plugin {
    /// As a worker sends it.
    pub(crate) fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "resolved": self.resolved,
            "version": self.version,
            "capabilities": self.capabilities,
        })
    }

    /// Not known yet: its worker has not said (see [`crate::Isolated`]).
    pub(crate) fn unknown() -> Self {
        let unknown = || "unknown".to_string();
        Self {
            resolved: unknown(),
            version: unknown(),
            capabilities: unknown(),
        }
    }

    /// As a worker sent it; `None` where the answer is not one.
    pub(crate) fn from_json(value: &serde_json::Value) -> Option<Self> {
        let field = |key: &str| value[key].as_str().map(str::to_string);
        Some(Self {
            resolved: field("resolved")?,
            version: field("version")?,
            capabilities: field("capabilities")?,
        })
    }
}

fn ov_err(context: &str) -> impl Fn(openvino::InferenceError) -> Error + '_ {
    move |e| Error::Failed(format!("OpenVINO {context}: {}", clean(&e.to_string())))
}

/// OpenVINO's messages nest `Exception from src/…:NNN:` lines under the C API's kind
/// (`general error:`): the lines that say something are kept.
fn clean(message: &str) -> String {
    let lines: Vec<&str> = message
        .lines()
        .map(|l| l.trim().trim_start_matches("general error:").trim())
        .filter(|l| !l.is_empty() && !l.starts_with("Exception from "))
        .collect();
    if lines.is_empty() {
        message.trim().to_string()
    } else {
        lines.join(" ")
    }
}

impl OpenVinoRuntime {
    /// OpenVINO's CPU plugin with an inference-precision hint (`f32`, `f16`, `bf16`; `None`:
    /// the plugin's default). Fails when the library cannot be found or loaded, or the plugin
    /// refuses the hint.
    pub fn new(library: Option<&Path>, precision: Option<&str>) -> Result<Self> {
        load(library)?;
        let mut core =
            Core::new().map_err(|e| Error::Failed(format!("OpenVINO cannot start: {e}")))?;
        let cpu = DeviceType::CPU;
        if let Some(p) = precision {
            core.set_property(&cpu, &RwPropertyKey::HintInferencePrecision, p)
                .map_err(ov_err("refuses the precision hint"))?;
        }
        let threads = crate::thread_cap()?;
        if let Some(n) = threads {
            core.set_property(&cpu, &RwPropertyKey::InferenceNumThreads, &n.to_string())
                .map_err(ov_err("refuses the number of threads"))?;
        }
        let property = |core: &Core, key: PropertyKey| {
            core.get_property(&cpu, &key)
                .map_err(ov_err("cannot describe its CPU plugin"))
        };
        let resolved = property(
            &core,
            PropertyKey::Rw(RwPropertyKey::HintInferencePrecision),
        )?;
        let capabilities = property(&core, PropertyKey::DeviceCapabilities)?;
        let version = core
            .versions("CPU")
            .map_err(ov_err("cannot describe its CPU plugin"))?
            .into_iter()
            .next()
            .map(|(_, v)| v.build_number)
            .unwrap_or_default();
        Ok(Self {
            core: Some(Mutex::new(core)),
            asked: precision.map(str::to_string),
            plugin: Plugin {
                resolved,
                version,
                capabilities,
            },
            threads,
        })
    }

    /// The side as a worker that loaded its library described it: for what it is (its build,
    /// its precision); it runs nothing in this process.
    pub(crate) fn described(precision: Option<&str>, plugin: Plugin) -> Self {
        Self {
            core: None,
            asked: precision.map(str::to_string),
            plugin,
            threads: crate::thread_cap().ok().flatten(),
        }
    }
}

fn element(dtype: DType) -> ElementType {
    match dtype {
        DType::F64 => ElementType::F64,
        DType::F32 => ElementType::F32,
        DType::F16 => ElementType::F16,
        DType::BF16 => ElementType::Bf16,
        DType::I64 => ElementType::I64,
        DType::I32 => ElementType::I32,
        DType::I16 => ElementType::I16,
        DType::I8 => ElementType::I8,
        DType::U64 => ElementType::U64,
        DType::U32 => ElementType::U32,
        DType::U16 => ElementType::U16,
        DType::U8 => ElementType::U8,
        DType::Bool => ElementType::Boolean,
    }
}

fn dtype_of(element: ElementType) -> Option<DType> {
    DType::ALL
        .into_iter()
        .find(|d| self::element(*d) == element)
}

impl Runtime for OpenVinoRuntime {
    fn name(&self) -> &str {
        "openvino"
    }

    fn detail(&self) -> String {
        let asked = match &self.asked {
            Some(p) if *p != self.plugin.resolved => format!(
                " ({p} asked: this CPU's plugin offers {}, so it computes in {})",
                self.plugin.capabilities, self.plugin.resolved
            ),
            _ => String::new(),
        };
        format!(
            "OpenVINO {} CPU plugin, inference precision {}{asked}{}; values asked for stay outputs, so they exist",
            self.plugin.version,
            self.plugin.resolved,
            crate::threads::threads_words(self.threads)
        )
    }

    fn options(&self) -> Vec<(String, String)> {
        vec![(
            "INFERENCE_PRECISION_HINT".to_string(),
            self.plugin.resolved.clone(),
        )]
    }

    fn reduced_math(&self) -> Option<ReducedMath> {
        lowered(&self.plugin.resolved)
    }

    fn compiles_graph(&self) -> bool {
        true
    }

    fn facts(&self) -> Option<serde_json::Value> {
        Some(self.plugin.to_json())
    }

    fn run(
        &self,
        model: &Model,
        inputs: &[(String, Tensor)],
        outputs: &[String],
    ) -> Result<Vec<(String, Tensor)>> {
        let Some(core) = &self.core else {
            return Err(Error::Worker(
                "an OpenVINO side on another library runs in its worker process only".to_string(),
            ));
        };
        let mut core = core.lock().map_err(|_| {
            Error::Failed("OpenVINO is unusable after an earlier failure".to_string())
        })?;
        let bytes = model.to_bytes();
        // A model with external data is read from a file in a folder of its own, that data
        // linked beside it; the folder is kept until the run ends (OpenVINO may map the data).
        let folder = (!model.external_data_files().is_empty())
            .then(tempfile::tempdir)
            .transpose()
            .map_err(|e| Error::Failed(format!("OpenVINO {e}")))?;
        let read = match &folder {
            None => core.read_model_from_buffer(&bytes, None),
            Some(folder) => {
                let file = folder.path().join("model.onnx");
                std::fs::write(&file, &bytes).map_err(|e| {
                    Error::Failed(format!("OpenVINO cannot write the model for reading: {e}"))
                })?;
                link_external_data(model, folder.path())?;
                core.read_model_from_file(&file.to_string_lossy(), "")
            }
        }
        .map_err(ov_err("cannot read the model"))?;
        let mut compiled = core
            .compile_model(&read, DeviceType::CPU)
            .map_err(ov_err("cannot compile the model"))?;
        drop(core);
        let mut request = compiled
            .create_infer_request()
            .map_err(ov_err("cannot run the model"))?;
        for i in 0..read
            .get_inputs_len()
            .map_err(ov_err("cannot read the model"))?
        {
            let port = read
                .get_input_by_index(i)
                .map_err(ov_err("cannot read the model"))?;
            let name = port.get_name().map_err(ov_err("cannot read the model"))?;
            let (_, tensor) = inputs.iter().find(|(n, _)| *n == name).ok_or_else(|| {
                let given: Vec<&str> = inputs.iter().map(|(n, _)| n.as_str()).collect();
                Error::Inputs(format!(
                    "the model needs input `{name}`, but only {given:?} were given"
                ))
            })?;
            let value = if tensor.shape.is_empty() {
                // OpenVINO's C API makes no shape of rank 0: a scalar input is written into the
                // tensor the request holds for it.
                request
                    .get_tensor(&name)
                    .map_err(ov_err(&format!("refuses scalar input `{name}`")))?
            } else {
                let dims: Vec<i64> = tensor.shape.iter().map(|&d| d as i64).collect();
                let shape = Shape::new(&dims).map_err(ov_err("cannot take an input"))?;
                openvino::Tensor::new(element(tensor.dtype), &shape)
                    .map_err(ov_err("cannot take an input"))?
            };
            let mut value = value;
            if !tensor.bytes.is_empty() {
                let data = value
                    .get_raw_data_mut()
                    .map_err(ov_err("cannot take an input"))?;
                if data.len() != tensor.bytes.len() {
                    return Err(Error::Inputs(format!(
                        "OpenVINO holds input `{name}` in {} bytes; the value given has {}",
                        data.len(),
                        tensor.bytes.len()
                    )));
                }
                data.copy_from_slice(&tensor.bytes);
            }
            if !tensor.shape.is_empty() {
                request
                    .set_tensor(&name, &value)
                    .map_err(ov_err(&format!("refuses input `{name}`")))?;
            }
        }
        request.infer().map_err(|e| {
            Error::Failed(format!(
                "OpenVINO failed to run the model: {}",
                clean(&e.to_string())
            ))
        })?;
        (outputs.iter())
            .map(|name| Ok((name.clone(), handed_back(&mut request, name)?)))
            .collect()
    }
}

/// The value `name` as the finished `request` holds it.
fn handed_back(request: &mut openvino::InferRequest, name: &str) -> Result<Tensor> {
    let value = request
        .get_tensor(name)
        .map_err(ov_err(&format!("returned no value named `{name}`")))?;
    let context = format!("cannot read value `{name}`");
    let et = value.get_element_type().map_err(ov_err(&context))?;
    let dtype = dtype_of(et).ok_or_else(|| Error::UnsupportedOutput {
        name: name.to_string(),
        element: format!("{et:?}"),
    })?;
    // The C API makes no shape of rank 0, so a scalar's shape cannot be read: a value of one
    // element whose shape cannot be read is a scalar.
    let dims: Vec<usize> = match value.get_shape() {
        Ok(shape) => shape.get_dimensions().iter().map(|&d| d as usize).collect(),
        Err(_) if value.get_size().map_err(ov_err(&context))? == 1 => Vec::new(),
        Err(e) => return Err(ov_err(&context)(e)),
    };
    let bytes = if value.get_byte_size().map_err(ov_err(&context))? == 0 {
        Vec::new()
    } else {
        value.get_raw_data().map_err(ov_err(&context))?.to_vec()
    };
    Tensor::new(name, dtype, dims, bytes).map_err(|e| Error::Failed(format!("OpenVINO: {e}")))
}

/// Places each external data file of `model` in `folder`, where the copy of it is read:
/// hard-linked (OpenVINO refuses data a symbolic link resolves outside that folder), or copied
/// where the two folders are on different file systems.
fn link_external_data(model: &Model, folder: &Path) -> Result<()> {
    let source = model.base_dir().unwrap_or(Path::new("."));
    for location in model.external_data_files() {
        let failed =
            |e: std::io::Error| Error::Failed(format!("OpenVINO external data `{location}`: {e}"));
        let link = folder.join(&location);
        let target = source.join(&location);
        if let Some(parent) = link.parent() {
            std::fs::create_dir_all(parent).map_err(failed)?;
        }
        if std::fs::hard_link(&target, &link).is_err() {
            std::fs::copy(&target, &link).map_err(failed)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lower_inference_precision_is_reduced_math_and_f32_is_not() {
        assert!(lowered("f32").is_none());
        for p in ["bf16", "f16"] {
            let reduced = lowered(p).unwrap();
            assert!(reduced.ops.contains(&"MatMul") && reduced.ops.contains(&"Conv"));
            assert!(
                reduced.how.contains(&format!("computes float32 in {p}")),
                "{}",
                reduced.how
            );
        }
    }
}
