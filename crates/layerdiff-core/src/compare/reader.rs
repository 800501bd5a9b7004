//! The dtypes the explicit kernels ([`super::avx2`], [`super::avx512`], and the baseline's
//! AVX-512 lanes) read straight from a tensor's bytes: what each ISA's loads need to know of
//! one, in one place.

use crate::DType;

/// A dtype an explicit kernel reads, eight elements at a time into f64 lanes.
pub(crate) trait Reader {
    /// Bytes per element.
    const SIZE: usize;
    /// Whether its values are narrower than f64: their squares never overflow f64, so a
    /// non-finite value shows as a non-finite sum of squares.
    const NARROW: bool = true;
    /// The dtype, for reading single elements.
    const DTYPE: DType;
}

pub(crate) struct F32;
pub(crate) struct F16;
pub(crate) struct BF16;
pub(crate) struct F64;

impl Reader for F32 {
    const SIZE: usize = 4;
    const DTYPE: DType = DType::F32;
}

impl Reader for F16 {
    const SIZE: usize = 2;
    const DTYPE: DType = DType::F16;
}

impl Reader for BF16 {
    const SIZE: usize = 2;
    const DTYPE: DType = DType::BF16;
}

impl Reader for F64 {
    const SIZE: usize = 8;
    const NARROW: bool = false;
    const DTYPE: DType = DType::F64;
}
