//! A custom-op library for ONNX Runtime, as a vendor ships one: it registers `Sigmoid` in the
//! domain `layerdiff.test` (float32 in, float32 out). A node's string attribute `fault` makes
//! its kernel fail the way native code fails: `abort` calls `abort()` (SIGABRT), `segfault`
//! writes through a null pointer (SIGSEGV); `off_on=VERSION` computes the sigmoid 1% too large
//! when the ONNX Runtime that loaded the library is release VERSION (a kernel that changed
//! between two releases, planted); without it the kernel computes the sigmoid.
//!
//! This is what the tests of isolated sides load (`ort:custom_ops=…/libfaulty_ops.so`): a
//! runtime that dies on one node, in native code, where no error can be caught.

#![allow(unsafe_code, non_snake_case)]

use std::ffi::{CStr, c_char, c_int, c_void};
use std::ptr;

use ort_sys::{
    ONNXTensorElementDataType, OrtApi, OrtApiBase, OrtCustomOp,
    OrtCustomOpInputOutputCharacteristic, OrtKernelContext, OrtKernelInfo, OrtMemType,
    OrtSessionOptions, OrtStatus, OrtStatusPtr, OrtValue,
};

const DOMAIN: &CStr = c"layerdiff.test";
const NAME: &CStr = c"Sigmoid";

#[derive(Clone, Copy, PartialEq, Eq)]
enum Fault {
    None,
    Abort,
    Segfault,
    /// 1% off: the release that loaded the library is the one named.
    Off,
}

/// The release of the ONNX Runtime that registered the library (`1.30.0`).
static RELEASE: std::sync::OnceLock<String> = std::sync::OnceLock::new();

struct Kernel {
    api: *const OrtApi,
    fault: Fault,
}

/// Fails a call of the C API loudly: a library that cannot talk to its runtime is a broken test.
unsafe fn check(api: &OrtApi, status: OrtStatusPtr) {
    if !status.0.is_null() {
        let message = unsafe { CStr::from_ptr((api.GetErrorMessage)(status.0)) };
        eprintln!("faulty_ops: {}", message.to_string_lossy());
        unsafe { (api.ReleaseStatus)(status.0) };
        std::process::abort();
    }
}

unsafe extern "system" fn create_kernel(
    _op: *const OrtCustomOp,
    api: *const OrtApi,
    info: *const OrtKernelInfo,
) -> *mut c_void {
    let a = unsafe { &*api };
    let mut size = 0usize;
    let status = unsafe {
        (a.KernelInfoGetAttribute_string)(info, c"fault".as_ptr(), ptr::null_mut(), &mut size)
    };
    let fault = if status.0.is_null() {
        let mut text = vec![0 as c_char; size];
        unsafe {
            check(
                a,
                (a.KernelInfoGetAttribute_string)(
                    info,
                    c"fault".as_ptr(),
                    text.as_mut_ptr(),
                    &mut size,
                ),
            );
        }
        match unsafe { CStr::from_ptr(text.as_ptr()) }.to_bytes() {
            b"abort" => Fault::Abort,
            b"segfault" => Fault::Segfault,
            other => match other.strip_prefix(b"off_on=") {
                Some(release) if Some(release) == RELEASE.get().map(|r| r.as_bytes()) => Fault::Off,
                _ => Fault::None,
            },
        }
    } else {
        unsafe { (a.ReleaseStatus)(status.0) };
        Fault::None
    };
    Box::into_raw(Box::new(Kernel { api, fault })).cast()
}

unsafe extern "system" fn compute(kernel: *mut c_void, context: *mut OrtKernelContext) {
    let kernel = unsafe { &*(kernel as *const Kernel) };
    match kernel.fault {
        Fault::Abort => std::process::abort(),
        Fault::Segfault => unsafe { ptr::write_volatile(ptr::null_mut::<u32>(), 1) },
        Fault::None | Fault::Off => {}
    }
    let scale = if kernel.fault == Fault::Off {
        1.01
    } else {
        1.0
    };
    let a = unsafe { &*kernel.api };
    unsafe {
        let mut input: *const OrtValue = ptr::null();
        check(a, (a.KernelContext_GetInput)(context, 0, &mut input));
        let mut info = ptr::null_mut();
        check(a, (a.GetTensorTypeAndShape)(input, &mut info));
        let mut rank = 0usize;
        check(a, (a.GetDimensionsCount)(info, &mut rank));
        let mut dims = vec![0i64; rank];
        check(a, (a.GetDimensions)(info, dims.as_mut_ptr(), rank));
        let mut count = 0usize;
        check(a, (a.GetTensorShapeElementCount)(info, &mut count));
        (a.ReleaseTensorTypeAndShapeInfo)(info);
        let mut output = ptr::null_mut();
        check(
            a,
            (a.KernelContext_GetOutput)(context, 0, dims.as_ptr(), rank, &mut output),
        );
        let (mut x, mut y) = (ptr::null_mut(), ptr::null_mut());
        check(a, (a.GetTensorMutableData)(input as *mut OrtValue, &mut x));
        check(a, (a.GetTensorMutableData)(output, &mut y));
        let x = std::slice::from_raw_parts(x as *const f32, count);
        let y = std::slice::from_raw_parts_mut(y as *mut f32, count);
        for (y, &x) in y.iter_mut().zip(x) {
            *y = scale / (1.0 + (-x).exp());
        }
    }
}

unsafe extern "system" fn destroy(kernel: *mut c_void) {
    drop(unsafe { Box::from_raw(kernel as *mut Kernel) });
}

unsafe extern "system" fn name(_op: *const OrtCustomOp) -> *const c_char {
    NAME.as_ptr()
}

unsafe extern "system" fn provider(_op: *const OrtCustomOp) -> *const c_char {
    ptr::null() // the CPU
}

unsafe extern "system" fn float(
    _op: *const OrtCustomOp,
    _index: usize,
) -> ONNXTensorElementDataType {
    ONNXTensorElementDataType::ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT
}

unsafe extern "system" fn one(_op: *const OrtCustomOp) -> usize {
    1
}

unsafe extern "system" fn required(
    _op: *const OrtCustomOp,
    _index: usize,
) -> OrtCustomOpInputOutputCharacteristic {
    OrtCustomOpInputOutputCharacteristic::INPUT_OUTPUT_REQUIRED
}

unsafe extern "system" fn default_memory(_op: *const OrtCustomOp, _index: usize) -> OrtMemType {
    OrtMemType::OrtMemTypeDefault
}

unsafe extern "system" fn arity(_op: *const OrtCustomOp) -> c_int {
    1
}

unsafe extern "system" fn homogeneous(_op: *const OrtCustomOp) -> c_int {
    1
}

/// The op, in the layout of ONNX Runtime's C API version 14: the fields a later version added
/// are left empty, and ONNX Runtime reads only those of the version given.
static OP: OrtCustomOp = OrtCustomOp {
    version: 14,
    CreateKernel: Some(create_kernel),
    GetName: Some(name),
    GetExecutionProviderType: Some(provider),
    GetInputType: Some(float),
    GetInputTypeCount: Some(one),
    GetOutputType: Some(float),
    GetOutputTypeCount: Some(one),
    KernelCompute: Some(compute),
    KernelDestroy: Some(destroy),
    GetInputCharacteristic: Some(required),
    GetOutputCharacteristic: Some(required),
    GetInputMemoryType: Some(default_memory),
    GetVariadicInputMinArity: Some(arity),
    GetVariadicInputHomogeneity: Some(homogeneous),
    GetVariadicOutputMinArity: Some(arity),
    GetVariadicOutputHomogeneity: Some(homogeneous),
    CreateKernelV2: None,
    KernelComputeV2: None,
    InferOutputShapeFn: None,
    GetStartVersion: None,
    GetEndVersion: None,
    GetMayInplace: None,
    ReleaseMayInplace: None,
    GetAliasMap: None,
    ReleaseAliasMap: None,
};

/// ONNX Runtime's entry point for a custom-op library (`RegisterCustomOpsLibrary`).
///
/// # Safety
/// Called by ONNX Runtime with its session options and API base.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn RegisterCustomOps(
    options: *mut OrtSessionOptions,
    base: *const OrtApiBase,
) -> *mut OrtStatus {
    // The oldest version with every function the kernel calls: the library loads in older
    // releases too (a later version's struct only appends to it).
    let api = unsafe { ((*base).GetApi)(14) };
    let release = unsafe { CStr::from_ptr(((*base).GetVersionString)()) };
    let _ = RELEASE.set(release.to_string_lossy().into_owned());
    if api.is_null() {
        return ptr::null_mut();
    }
    let a = unsafe { &*api };
    // the domain stays alive as long as the sessions that use it: it is never released
    let mut domain = ptr::null_mut();
    let status = unsafe { (a.CreateCustomOpDomain)(DOMAIN.as_ptr(), &mut domain) };
    if !status.0.is_null() {
        return status.0;
    }
    let status = unsafe { (a.CustomOpDomain_Add)(domain, &OP) };
    if !status.0.is_null() {
        return status.0;
    }
    unsafe { (a.AddCustomOpDomain)(options, domain) }.0
}
