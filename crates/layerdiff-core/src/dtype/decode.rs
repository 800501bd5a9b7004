//! Tensors' little-endian bytes widened to f64: vectorized loops for the float types (AVX2
//! and F16C where the CPU has them), the dtype's own decoding for the rest and for bytes that
//! are not aligned.

use crate::DType;
#[cfg(target_arch = "x86_64")]
use crate::kernel::Kernel;

/// Widens little-endian elements to f64, with loops the compiler vectorizes for the float types.
#[inline(always)]
pub(crate) fn decode(dtype: DType, bytes: &[u8], out: &mut [f64]) {
    #[cfg(target_arch = "x86_64")]
    if Kernel::best() != Kernel::Portable {
        // SAFETY: the CPU has AVX2 and F16C (Kernel::available).
        return unsafe { decode_avx2(dtype, bytes, out) };
    }
    if !widen(dtype, bytes, out) {
        dtype.decode_f64(bytes, out);
    }
}

/// [`widen`] (or, for bytes that are not aligned, [`DType::decode_f64`]) compiled for AVX2, its
/// loops vectorized four or eight elements wide (float16 by F16C): decoding is most of what
/// reading a weight or a value costs.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
unsafe fn decode_avx2(dtype: DType, bytes: &[u8], out: &mut [f64]) {
    if dtype == DType::F16 && bytes.len() >= 2 * out.len() {
        widen_f16(bytes, out);
    } else if !widen(dtype, bytes, out) {
        // bytes a file holds need not be aligned
        dtype.decode_f64_inline(bytes, out);
    }
}

/// The floats a tensor's aligned bytes hold, widened in `out`; false where they are not aligned
/// or the dtype is another.
#[inline(always)]
fn widen(dtype: DType, bytes: &[u8], out: &mut [f64]) -> bool {
    #[cfg(target_endian = "little")]
    match dtype {
        DType::F64 => {
            if let Ok(values) = bytemuck::try_cast_slice::<u8, f64>(bytes) {
                out.copy_from_slice(&values[..out.len()]);
                return true;
            }
        }
        DType::F32 => {
            if let Ok(values) = bytemuck::try_cast_slice::<u8, f32>(bytes) {
                for (o, &v) in out.iter_mut().zip(values) {
                    *o = f64::from(v);
                }
                return true;
            }
        }
        DType::F16 => {
            if let Ok(values) = bytemuck::try_cast_slice::<u8, half::f16>(bytes) {
                use half::slice::HalfFloatSliceExt;
                values.convert_to_f64_slice(out);
                return true;
            }
        }
        DType::BF16 => {
            if let Ok(values) = bytemuck::try_cast_slice::<u8, u16>(bytes) {
                for (o, &v) in out.iter_mut().zip(values) {
                    *o = f64::from(f32::from_bits(u32::from(v) << 16));
                }
                return true;
            }
        }
        _ => {}
    }
    false
}

/// Float16 elements widened to f64 by F16C, eight at a time, in the caller's vector code (the
/// `half` crate's conversion is a call per eight elements).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
#[inline]
pub(crate) fn widen_f16(bytes: &[u8], out: &mut [f64]) {
    use std::arch::x86_64::{
        __m128i, _mm_loadu_si128, _mm256_castps256_ps128, _mm256_cvtph_ps, _mm256_cvtps_pd,
        _mm256_extractf128_ps, _mm256_storeu_pd,
    };
    let n = out.len().min(bytes.len() / 2);
    let full = n - n % 8;
    for k in (0..full).step_by(8) {
        // SAFETY: elements k..k + 8 lie within both slices (k + 8 <= full <= n); the loads and
        // stores are unaligned ones.
        unsafe {
            let halves = _mm_loadu_si128(bytes.as_ptr().add(2 * k).cast::<__m128i>());
            let singles = _mm256_cvtph_ps(halves);
            let low = _mm256_cvtps_pd(_mm256_castps256_ps128(singles));
            let high = _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(singles));
            _mm256_storeu_pd(out.as_mut_ptr().add(k), low);
            _mm256_storeu_pd(out.as_mut_ptr().add(k + 4), high);
        }
    }
    for k in full..n {
        out[k] = half::f16::from_le_bytes([bytes[2 * k], bytes[2 * k + 1]]).to_f64();
    }
}
