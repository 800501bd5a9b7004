//! ONNX Runtime's execution providers, the options a user passes them (`ort:cuda:use_tf32=0`),
//! and the options a provider really runs with, as ONNX Runtime resolves them: the ones that
//! change numbers (TF32, the cuDNN convolution search, the layout) go into the report.

use std::ffi::{CStr, CString, c_char};

use ort::ep::{ArbitrarilyConfigurableExecutionProvider, ExecutionProviderDispatch};

/// An ONNX Runtime execution provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Provider {
    /// The CPU execution provider (always present).
    #[default]
    Cpu,
    /// NVIDIA CUDA.
    Cuda,
    /// NVIDIA TensorRT.
    TensorRt,
    /// AMD ROCm.
    Rocm,
    /// Intel OpenVINO.
    OpenVino,
    /// Apple CoreML.
    CoreMl,
    /// DirectML (Windows).
    DirectMl,
}

/// Options handed to a provider, in ONNX Runtime's own names and spelling (`use_tf32` = `0`),
/// in the order given.
pub type ProviderOptions = Vec<(String, String)>;

/// The CUDA provider's options that change the numbers it computes, reported whatever their
/// value (the rest are reported only when set).
const CUDA_NUMERIC: [&str; 6] = [
    "device_id",
    "use_tf32",
    "cudnn_conv_algo_search",
    "prefer_nhwc",
    "fuse_conv_bias",
    "sdpa_kernel",
];

/// Float32 ops whose products the CUDA provider computes in TF32 when `use_tf32` is on
/// (cuBLAS for the matrix products, cuDNN for the convolutions).
pub const TF32_OPS: [&str; 8] = [
    "Conv",
    "ConvTranspose",
    "FusedConv",
    "MatMul",
    "FusedMatMul",
    "Gemm",
    "Attention",
    "MultiHeadAttention",
];

impl Provider {
    /// Every provider, for parsing.
    pub const ALL: [Provider; 7] = [
        Provider::Cpu,
        Provider::Cuda,
        Provider::TensorRt,
        Provider::Rocm,
        Provider::OpenVino,
        Provider::CoreMl,
        Provider::DirectMl,
    ];

    /// The spelling in runtime names (`ort:cuda`).
    pub fn spelling(self) -> &'static str {
        match self {
            Provider::Cpu => "cpu",
            Provider::Cuda => "cuda",
            Provider::TensorRt => "tensorrt",
            Provider::Rocm => "rocm",
            Provider::OpenVino => "openvino",
            Provider::CoreMl => "coreml",
            Provider::DirectMl => "directml",
        }
    }

    /// ONNX Runtime's name for it.
    pub fn ort_name(self) -> &'static str {
        match self {
            Provider::Cpu => "CPUExecutionProvider",
            Provider::Cuda => "CUDAExecutionProvider",
            Provider::TensorRt => "TensorrtExecutionProvider",
            Provider::Rocm => "ROCMExecutionProvider",
            Provider::OpenVino => "OpenVINOExecutionProvider",
            Provider::CoreMl => "CoreMLExecutionProvider",
            Provider::DirectMl => "DmlExecutionProvider",
        }
    }

    /// Which ONNX Runtime build has it, for the hint of a build that lacks it.
    pub fn build_hint(self) -> &'static str {
        match self {
            Provider::Cpu => "every build has it",
            Provider::Cuda | Provider::TensorRt => "the onnxruntime-gpu wheel has it",
            Provider::Rocm => "a ROCm build of ONNX Runtime has it",
            Provider::OpenVino => "the onnxruntime-openvino wheel has it",
            Provider::CoreMl => "the onnxruntime wheel for macOS has it",
            Provider::DirectMl => "the onnxruntime-directml wheel (Windows) has it",
        }
    }

    /// Whether options can be passed to it (`ort:cuda:use_tf32=0`).
    pub fn takes_options(self) -> bool {
        !matches!(self, Provider::Cpu | Provider::DirectMl)
    }

    /// Whether the loaded ONNX Runtime was built with this provider.
    pub(crate) fn is_built_in(self) -> bool {
        use ort::ep::{self, ExecutionProvider};
        match self {
            Provider::Cpu => Ok(true),
            Provider::Cuda => ep::CUDA::is_available(),
            Provider::TensorRt => ep::TensorRT::is_available(),
            Provider::Rocm => ep::ROCm::is_available(),
            Provider::OpenVino => ep::OpenVINO::is_available(),
            Provider::CoreMl => ep::CoreML::is_available(),
            Provider::DirectMl => ep::DirectML::is_available(),
        }
        .unwrap_or(false)
    }

    /// The provider with `options`, to register on a session (`None` for the CPU, which is
    /// always there).
    pub(crate) fn dispatch(
        self,
        options: &[(String, String)],
    ) -> Option<ExecutionProviderDispatch> {
        use ort::ep;
        fn with<E: ArbitrarilyConfigurableExecutionProvider>(
            ep: E,
            options: &[(String, String)],
        ) -> E {
            options
                .iter()
                .fold(ep, |ep, (k, v)| ep.with_arbitrary_config(k, v))
        }
        Some(match self {
            Provider::Cpu => return None,
            Provider::Cuda => with(ep::CUDA::default(), options).build(),
            Provider::TensorRt => with(ep::TensorRT::default(), options).build(),
            Provider::Rocm => with(ep::ROCm::default(), options).build(),
            Provider::OpenVino => with(ep::OpenVINO::default(), options).build(),
            Provider::CoreMl => with(ep::CoreML::default(), options).build(),
            Provider::DirectMl => ep::DirectML::default().build(),
        })
    }

    /// The options this provider runs with, given `options`: for CUDA, every option that
    /// changes its numbers, as ONNX Runtime resolves them (its defaults included; an unknown
    /// option or value is ONNX Runtime's error); elsewhere, the options given.
    pub(crate) fn resolve(self, options: &[(String, String)]) -> Result<ProviderOptions, String> {
        if self != Provider::Cuda {
            return Ok(options.to_vec());
        }
        let all = cuda_options_as_string(options)?;
        Ok(numeric_options(&all, &CUDA_NUMERIC, options))
    }
}

/// From ONNX Runtime's `key=value;key=value` listing, the keys in `numeric` and those the
/// user set, in the listing's order.
fn numeric_options(listing: &str, numeric: &[&str], given: &[(String, String)]) -> ProviderOptions {
    listing
        .split(';')
        .filter_map(|pair| pair.split_once('='))
        .filter(|(k, _)| numeric.contains(k) || given.iter().any(|(g, _)| g == k))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// ONNX Runtime's own listing of a CUDA provider's options after `options` are applied.
fn cuda_options_as_string(options: &[(String, String)]) -> Result<String, String> {
    let api = ort::api();
    let status = |s: ort::sys::OrtStatusPtr| -> Result<(), String> {
        if s.0.is_null() {
            return Ok(());
        }
        // SAFETY: a non-null status from ONNX Runtime holds a message until released.
        let message = unsafe { CStr::from_ptr((api.GetErrorMessage)(s.0)) }
            .to_string_lossy()
            .into_owned();
        unsafe { (api.ReleaseStatus)(s.0) };
        Err(message)
    };
    let keys: Vec<CString> = options
        .iter()
        .map(|(k, _)| CString::new(k.as_str()).map_err(|_| format!("option `{k}` holds a NUL")))
        .collect::<Result<_, _>>()?;
    let values: Vec<CString> = options
        .iter()
        .map(|(k, v)| CString::new(v.as_str()).map_err(|_| format!("option `{k}` holds a NUL")))
        .collect::<Result<_, _>>()?;
    let key_ptrs: Vec<*const c_char> = keys.iter().map(|k| k.as_ptr()).collect();
    let value_ptrs: Vec<*const c_char> = values.iter().map(|v| v.as_ptr()).collect();
    let mut cuda = std::ptr::null_mut();
    // SAFETY: each pointer handed to ONNX Runtime lives until the call returns; the options
    // struct is released on every path after it was created, the listing freed by its
    // allocator.
    unsafe {
        status((api.CreateCUDAProviderOptions)(&mut cuda))?;
        let listing = (|| {
            status((api.UpdateCUDAProviderOptions)(
                cuda,
                key_ptrs.as_ptr(),
                value_ptrs.as_ptr(),
                key_ptrs.len(),
            ))?;
            let mut allocator = std::ptr::null_mut();
            status((api.GetAllocatorWithDefaultOptions)(&mut allocator))?;
            let mut text: *mut c_char = std::ptr::null_mut();
            status((api.GetCUDAProviderOptionsAsString)(
                cuda, allocator, &mut text,
            ))?;
            let listing = CStr::from_ptr(text).to_string_lossy().into_owned();
            status((api.AllocatorFree)(allocator, text.cast()))?;
            Ok(listing)
        })();
        (api.ReleaseCUDAProviderOptions)(cuda);
        listing
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_numeric_options_and_the_given_ones_are_kept_in_the_listings_order() {
        let listing = "device_id=0;has_user_compute_stream=0;gpu_mem_limit=18446744073709551615;\
                       cudnn_conv_algo_search=EXHAUSTIVE;do_copy_in_default_stream=1;use_tf32=1;\
                       enable_cuda_graph=0;prefer_nhwc=0";
        let given = vec![("enable_cuda_graph".to_string(), "0".to_string())];
        let kept: Vec<String> = numeric_options(listing, &CUDA_NUMERIC, &given)
            .into_iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        assert_eq!(
            kept,
            [
                "device_id=0",
                "cudnn_conv_algo_search=EXHAUSTIVE",
                "use_tf32=1",
                "enable_cuda_graph=0",
                "prefer_nhwc=0"
            ]
        );
    }
}
