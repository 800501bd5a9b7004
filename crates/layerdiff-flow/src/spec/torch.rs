//! How a PyTorch side runs, spelled like the runtimes:
//! `torch[:DEVICE][:PRECISION][:compile][:ddp=N]`. `torch` is the model as given (CPU, float32,
//! eager); `torch:cuda:bf16`, `torch:tf32`, `torch:cpu:amp-bf16`, `torch:compile=inductor`,
//! `torch:ddp=2` (DistributedDataParallel over 2 processes, a gradients side). Parsed here,
//! once; PyTorch itself runs in the Python package, which reads the parsed fields.

use std::fmt;

/// The precision a PyTorch side computes in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Precision {
    /// float32, with TF32 turned off on CUDA (matmul and cuDNN).
    #[default]
    Fp32,
    /// float32 tensors, with TF32 allowed for CUDA matmuls and convolutions (10-bit mantissa
    /// products).
    Tf32,
    /// The model and its floating-point inputs cast to float16.
    Fp16,
    /// The model and its floating-point inputs cast to bfloat16.
    Bf16,
    /// float32 model under `torch.autocast` to float16 (matmul and conv in float16).
    AmpFp16,
    /// float32 model under `torch.autocast` to bfloat16.
    AmpBf16,
}

impl Precision {
    const ALL: [Self; 6] = [
        Self::Fp32,
        Self::Tf32,
        Self::Fp16,
        Self::Bf16,
        Self::AmpFp16,
        Self::AmpBf16,
    ];

    /// The spelling (`bf16`, `amp-fp16`).
    pub fn spelling(self) -> &'static str {
        match self {
            Self::Fp32 => "fp32",
            Self::Tf32 => "tf32",
            Self::Fp16 => "fp16",
            Self::Bf16 => "bf16",
            Self::AmpFp16 => "amp-fp16",
            Self::AmpBf16 => "amp-bf16",
        }
    }

    /// The lower float dtype the side computes its layers in, where there is one (float16 for
    /// `fp16` and `amp-fp16`, bfloat16 for `bf16` and `amp-bf16`): the precision whose
    /// keep-in-float32 advice a run checks by keeping modules in float32, and whose small
    /// gradients a loss scale keeps (float16). TF32 keeps float32 tensors: none.
    pub fn lower(self) -> Option<layerdiff_core::DType> {
        use layerdiff_core::DType;
        match self {
            Self::Fp16 | Self::AmpFp16 => Some(DType::F16),
            Self::Bf16 | Self::AmpBf16 => Some(DType::BF16),
            Self::Fp32 | Self::Tf32 => None,
        }
    }

    fn parse(token: &str) -> Option<Self> {
        let alias = match token {
            "float32" => "fp32",
            "float16" | "half" => "fp16",
            "bfloat16" => "bf16",
            "amp-float16" => "amp-fp16",
            "amp-bfloat16" => "amp-bf16",
            other => other,
        };
        Self::ALL.into_iter().find(|p| p.spelling() == alias)
    }
}

/// A PyTorch side: the model on a device, in a precision, eager or compiled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TorchSpec {
    /// What `torch.device` is given (`cpu`, `cuda`, `cuda:1`, `mps`).
    pub device: String,
    /// The precision it computes in.
    pub precision: Precision,
    /// `torch.compile`'s backend when compiled (`inductor`), `None` when eager.
    pub compile: Option<String>,
    /// The processes DistributedDataParallel trains it in, each on its shard of the batch (1:
    /// one process, no DDP). Only gradients differ: `layerdiff grad`'s target.
    pub ranks: u32,
}

impl Default for TorchSpec {
    fn default() -> Self {
        Self {
            device: "cpu".to_string(),
            precision: Precision::Fp32,
            compile: None,
            ranks: 1,
        }
    }
}

impl TorchSpec {
    /// Whether `text` names a PyTorch side (it starts with `torch`).
    pub fn names_torch(text: &str) -> bool {
        text == "torch" || text.starts_with("torch:")
    }

    /// Parses `torch[:DEVICE[:INDEX]][:PRECISION][:compile[=BACKEND]][:ddp=N]`, parts in any
    /// order.
    pub fn parse(text: &str) -> Result<Self, String> {
        let unknown = |why: String| {
            format!(
                "`{text}`: {why} (expected `torch[:DEVICE][:PRECISION][:compile[=BACKEND]][:ddp=N]`: \
                 DEVICE as torch.device takes it (cpu, cuda, cuda:1, mps), PRECISION one of \
                 fp32, tf32, fp16, bf16, amp-fp16, amp-bf16, N the data-parallel processes)"
            )
        };
        let mut parts = text.split(':').peekable();
        if parts.next() != Some("torch") {
            return Err(unknown("not a PyTorch side".to_string()));
        }
        let (mut device, mut precision, mut compile) = (None::<String>, None, None);
        let mut ranks = None;
        while let Some(part) = parts.next() {
            if part == "ddp" {
                return Err(unknown(
                    "`ddp` needs its processes: `ddp=N` (2 to 1024)".to_string(),
                ));
            } else if let Some(count) = part.strip_prefix("ddp=") {
                let n = count.parse::<u32>().ok().filter(|n| (2..=1024).contains(n));
                match n {
                    Some(n) if ranks.is_none() => ranks = Some(n),
                    _ => {
                        return Err(unknown(format!(
                            "`{part}`: DistributedDataParallel takes 2 to 1024 processes, once"
                        )));
                    }
                }
            } else if part == "compile" || part.starts_with("compile=") {
                let backend = part.strip_prefix("compile=").unwrap_or("inductor");
                if backend.is_empty() || compile.is_some() {
                    return Err(unknown(format!(
                        "`{part}` given twice or without a backend"
                    )));
                }
                compile = Some(backend.to_string());
            } else if let Some(p) = Precision::parse(part) {
                if precision.replace(p).is_some() {
                    return Err(unknown("two precisions".to_string()));
                }
            } else if !part.is_empty()
                && part
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c == '_' || c.is_ascii_digit())
                && part.starts_with(|c: char| c.is_ascii_lowercase())
            {
                if device.is_some() {
                    return Err(unknown(format!(
                        "`{part}` is neither a precision nor `compile`"
                    )));
                }
                let mut name = part.to_string();
                if let Some(index) = parts.next_if(|p| p.chars().all(|c| c.is_ascii_digit())) {
                    name = format!("{name}:{index}");
                }
                device = Some(name);
            } else {
                return Err(unknown(format!("`{part}` is not understood")));
            }
        }
        Ok(Self {
            device: device.unwrap_or_else(|| "cpu".to_string()),
            precision: precision.unwrap_or_default(),
            compile,
            ranks: ranks.unwrap_or(1),
        })
    }

    /// The spelling that parses back to this spec, defaults left out (`torch`, `torch:bf16`).
    pub fn spelling(&self) -> String {
        let mut s = "torch".to_string();
        if self.device != "cpu" {
            s = format!("{s}:{}", self.device);
        }
        if self.precision != Precision::Fp32 {
            s = format!("{s}:{}", self.precision.spelling());
        }
        match self.compile.as_deref() {
            Some("inductor") => s.push_str(":compile"),
            Some(backend) => s = format!("{s}:compile={backend}"),
            None => {}
        }
        if self.ranks > 1 {
            s = format!("{s}:ddp={}", self.ranks);
        }
        s
    }

    /// Whether it is the model as given: CPU, float32, eager.
    pub fn is_plain(&self) -> bool {
        *self == Self::default()
    }
}

impl fmt::Display for TorchSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.spelling())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spellings_parse_back() {
        for text in [
            "torch",
            "torch:cuda",
            "torch:cuda:1:bf16",
            "torch:tf32",
            "torch:amp-fp16",
            "torch:compile",
            "torch:mps:fp16:compile=aot_eager",
            "torch:ddp=2",
            "torch:cuda:bf16:ddp=4",
        ] {
            let spec = TorchSpec::parse(text).unwrap();
            assert_eq!(spec.spelling(), text);
        }
        let spec = TorchSpec::parse("torch:bfloat16:cuda:0").unwrap();
        assert_eq!(
            (spec.device.as_str(), spec.precision),
            ("cuda:0", Precision::Bf16)
        );
        assert!(TorchSpec::parse("torch").unwrap().is_plain());
    }

    #[test]
    fn bad_spellings_say_what_is_wrong() {
        let err = TorchSpec::parse("torch:bf16:fp16").unwrap_err();
        assert!(err.contains("two precisions"), "{err}");
        let err = TorchSpec::parse("torch:cuda:cpu").unwrap_err();
        assert!(err.contains("`cpu` is neither"), "{err}");
        let err = TorchSpec::parse("torch:fp8!").unwrap_err();
        assert!(err.contains("`fp8!` is not understood"), "{err}");
        let err = TorchSpec::parse("torch:ddp").unwrap_err();
        assert!(err.contains("`ddp` needs its processes: `ddp=N`"), "{err}");
        for text in ["torch:ddp=1", "torch:ddp=x", "torch:ddp=2:ddp=2"] {
            let err = TorchSpec::parse(text).unwrap_err();
            assert!(err.contains("takes 2 to 1024 processes"), "{err}");
        }
    }
}

/// A lower precision a `torch` run computes its target in: the ONNX file converted to it (an
/// ONNX runtime target), or PyTorch cast to it (a PyTorch target).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LowerPrecision {
    /// float16.
    Fp16,
    /// bfloat16 (a PyTorch target).
    Bf16,
    /// int8, quantized with ONNX Runtime's static QDQ quantizer (an ONNX runtime target).
    Int8,
}

impl LowerPrecision {
    /// Parses `fp16`, `bf16` or `int8`.
    pub fn parse(text: &str) -> std::result::Result<Self, String> {
        match text {
            "fp16" => Ok(Self::Fp16),
            "bf16" => Ok(Self::Bf16),
            "int8" => Ok(Self::Int8),
            other => Err(format!(
                "unknown dtype `{other}` (expected fp16, bf16 or int8)"
            )),
        }
    }

    /// How it is spelled (`fp16`).
    pub fn spelling(self) -> &'static str {
        match self {
            Self::Fp16 => "fp16",
            Self::Bf16 => "bf16",
            Self::Int8 => "int8",
        }
    }

    /// Its name as a dtype (`float16`, `bfloat16`, `int8`).
    pub fn dtype_name(self) -> &'static str {
        match self {
            Self::Fp16 => "float16",
            Self::Bf16 => "bfloat16",
            Self::Int8 => "int8",
        }
    }
}
