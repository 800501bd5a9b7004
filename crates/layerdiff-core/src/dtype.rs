use crate::{Error, Result};

mod decode;
mod from_f32;

pub(crate) use decode::decode;
#[cfg(target_arch = "x86_64")]
pub(crate) use decode::widen_f16;
pub(crate) use from_f32::f32_on_grid;

/// Element types layerdiff reads. Names follow numpy (`float32`, `bfloat16`, `bool`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// 64-bit float.
    F64,
    /// 32-bit float.
    F32,
    /// IEEE half precision.
    F16,
    /// bfloat16.
    BF16,
    /// Signed integers.
    I64,
    /// 32-bit signed.
    I32,
    /// 16-bit signed.
    I16,
    /// 8-bit signed.
    I8,
    /// Unsigned integers.
    U64,
    /// 32-bit unsigned.
    U32,
    /// 16-bit unsigned.
    U16,
    /// 8-bit unsigned.
    U8,
    /// One byte, 0 or 1.
    Bool,
}

impl DType {
    /// All dtypes, for lookups.
    pub const ALL: [DType; 13] = [
        DType::F64,
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::I64,
        DType::I32,
        DType::I16,
        DType::I8,
        DType::U64,
        DType::U32,
        DType::U16,
        DType::U8,
        DType::Bool,
    ];

    /// The numpy-style name.
    pub fn name(self) -> &'static str {
        match self {
            DType::F64 => "float64",
            DType::F32 => "float32",
            DType::F16 => "float16",
            DType::BF16 => "bfloat16",
            DType::I64 => "int64",
            DType::I32 => "int32",
            DType::I16 => "int16",
            DType::I8 => "int8",
            DType::U64 => "uint64",
            DType::U32 => "uint32",
            DType::U16 => "uint16",
            DType::U8 => "uint8",
            DType::Bool => "bool",
        }
    }

    /// Parses a numpy-style name.
    pub fn from_name(name: &str) -> Result<Self> {
        Self::ALL
            .into_iter()
            .find(|d| d.name() == name)
            .ok_or_else(|| Error::UnsupportedDType(name.to_string()))
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F64 | DType::I64 | DType::U64 => 8,
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F16 | DType::BF16 | DType::I16 | DType::U16 => 2,
            DType::I8 | DType::U8 | DType::Bool => 1,
        }
    }

    /// Whether this is a floating-point type.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F64 | DType::F32 | DType::F16 | DType::BF16)
    }

    /// The ONNX `TensorProto.DataType` code.
    pub fn onnx_code(self) -> i32 {
        match self {
            DType::F32 => 1,
            DType::U8 => 2,
            DType::I8 => 3,
            DType::U16 => 4,
            DType::I16 => 5,
            DType::I32 => 6,
            DType::I64 => 7,
            DType::Bool => 9,
            DType::F16 => 10,
            DType::F64 => 11,
            DType::U32 => 12,
            DType::U64 => 13,
            DType::BF16 => 16,
        }
    }

    /// The dtype of an ONNX `TensorProto.DataType` code.
    pub fn from_onnx_code(code: i32) -> Result<Self> {
        Self::ALL
            .into_iter()
            .find(|d| d.onnx_code() == code)
            .ok_or_else(|| Error::UnsupportedDType(format!("onnx element type {code}")))
    }

    /// Encodes f64 values as little-endian elements of this dtype (rounded to nearest for
    /// floats, truncated and saturated for integers), appending to `out`.
    pub(crate) fn encode_f64(self, values: &[f64], out: &mut Vec<u8>) {
        let start = out.len();
        out.resize(start + values.len() * self.size(), 0);
        self.encode_f64_into(values, &mut out[start..]);
    }

    /// [`DType::encode_f64`] into `out`, which holds exactly `values.len()` elements.
    pub(crate) fn encode_f64_into(self, values: &[f64], out: &mut [u8]) {
        macro_rules! encode {
            ($n:literal, $conv:expr) => {
                for (c, &v) in out.chunks_exact_mut($n).zip(values) {
                    c.copy_from_slice(&$conv(v));
                }
            };
        }
        match self {
            DType::F64 => encode!(8, |v: f64| v.to_le_bytes()),
            DType::F32 => encode!(4, |v: f64| (v as f32).to_le_bytes()),
            // rounded here: the `half` crate's own rounding from f64 reads its top 32 bits only
            DType::F16 => encode!(2, |v: f64| half::f16::from_f64(self.round(v)).to_le_bytes()),
            DType::BF16 => encode!(2, |v: f64| half::bf16::from_f64(self.round(v))
                .to_le_bytes()),
            DType::I64 => encode!(8, |v: f64| (v as i64).to_le_bytes()),
            DType::I32 => encode!(4, |v: f64| (v as i32).to_le_bytes()),
            DType::I16 => encode!(2, |v: f64| (v as i16).to_le_bytes()),
            DType::I8 => encode!(1, |v: f64| (v as i8).to_le_bytes()),
            DType::U64 => encode!(8, |v: f64| (v as u64).to_le_bytes()),
            DType::U32 => encode!(4, |v: f64| (v as u32).to_le_bytes()),
            DType::U16 => encode!(2, |v: f64| (v as u16).to_le_bytes()),
            DType::U8 => encode!(1, |v: f64| [v as u8]),
            DType::Bool => encode!(1, |v: f64| [u8::from(v != 0.0)]),
        }
    }

    /// Whether both are floats and this one holds fewer significand bits (float16 is narrower
    /// than float32): the test behind precision loss and the dtype-aware tolerance.
    pub fn narrower_than(self, other: DType) -> bool {
        matches!((self.mantissa_bits(), other.mantissa_bits()), (Some(a), Some(b)) if a < b)
    }

    /// Significand bits of a float type (53, 24, 11, 8); `None` for integers and bool. The
    /// smaller of two sides' precisions decides the tolerance and names a precision loss.
    pub fn mantissa_bits(self) -> Option<u32> {
        match self {
            DType::F64 => Some(53),
            DType::F32 => Some(24),
            DType::F16 => Some(11),
            DType::BF16 => Some(8),
            _ => None,
        }
    }

    /// The largest finite value of a float type (65504 for float16); `None` for integers and
    /// bool.
    pub fn max_finite(self) -> Option<f64> {
        match self {
            DType::F64 => Some(f64::MAX),
            DType::F32 => Some(f64::from(f32::MAX)),
            DType::F16 => Some(half::f16::MAX.to_f64()),
            DType::BF16 => Some(half::bf16::MAX.to_f64()),
            _ => None,
        }
    }

    /// `value` rounded to the nearest value of this float type (to nearest even; beyond the
    /// largest finite, an infinity), widened back; integers and bool: unchanged.
    #[inline]
    pub fn round(self, value: f64) -> f64 {
        match self {
            DType::F32 => f64::from(value as f32),
            DType::F16 => round_to_grid(value, 10, -14, 65504.0),
            DType::BF16 => round_to_grid(value, 7, -126, BF16_MAX),
            _ => value,
        }
    }

    /// [`DType::round`] of every value, in place: the loop runs on vectors (AVX2 where the CPU
    /// has it), where rounding one value at a time costs a branch per value.
    pub fn round_all(self, values: &mut [f64]) {
        #[inline(always)]
        fn each(values: &mut [f64], mantissa: i64, min_exponent: i64, max_finite: f64) {
            for v in values.iter_mut() {
                let rounded = finite_to_grid(*v, mantissa, min_exponent, max_finite);
                *v = if v.is_finite() { rounded } else { *v };
            }
        }
        #[inline(always)]
        fn all(dtype: DType, values: &mut [f64]) {
            match dtype {
                DType::F32 => values.iter_mut().for_each(|v| *v = f64::from(*v as f32)),
                DType::F16 => each(values, 10, -14, 65504.0),
                DType::BF16 => each(values, 7, -126, BF16_MAX),
                _ => {}
            }
        }
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = "avx2")]
        fn all_avx2(dtype: DType, values: &mut [f64]) {
            all(dtype, values);
        }
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2.
            return unsafe { all_avx2(self, values) };
        }
        all(self, values);
    }

    /// One step of this float type's grid at `magnitude` (its unit in the last place there):
    /// the smallest subnormal step below the normal range. 1 for integers and bool.
    pub fn step(self, magnitude: f64) -> f64 {
        let (mantissa, min_exponent) = match self {
            DType::F64 => (52, -1022),
            DType::F32 => (23, -126),
            DType::F16 => (10, -14),
            DType::BF16 => (7, -126),
            _ => return 1.0,
        };
        let exponent = if magnitude > 0.0 && magnitude.is_finite() {
            ((magnitude.to_bits() >> 52) & 0x7ff) as i32 - 1023
        } else {
            min_exponent
        };
        pow2(exponent.max(min_exponent) - mantissa)
    }

    /// Decodes little-endian elements of this dtype into `out` as f64 (`out.len()` elements).
    pub(crate) fn decode_f64(self, bytes: &[u8], out: &mut [f64]) {
        self.decode_f64_inline(bytes, out);
    }

    /// [`DType::decode_f64`], compiled into its caller (a caller built for AVX2 gets its loops
    /// vectorized for it).
    #[inline(always)]
    pub(crate) fn decode_f64_inline(self, bytes: &[u8], out: &mut [f64]) {
        macro_rules! decode {
            ($n:literal, $conv:expr) => {
                for (o, c) in out.iter_mut().zip(bytes.chunks_exact($n)) {
                    let c: [u8; $n] = c.try_into().expect("chunks_exact");
                    *o = $conv(c);
                }
            };
        }
        match self {
            DType::F64 => decode!(8, f64::from_le_bytes),
            DType::F32 => decode!(4, |c| f64::from(f32::from_le_bytes(c))),
            DType::F16 => decode!(2, |c| half::f16::from_le_bytes(c).to_f64()),
            DType::BF16 => decode!(2, |c| half::bf16::from_le_bytes(c).to_f64()),
            DType::I64 => decode!(8, |c| i64::from_le_bytes(c) as f64),
            DType::I32 => decode!(4, |c| f64::from(i32::from_le_bytes(c))),
            DType::I16 => decode!(2, |c| f64::from(i16::from_le_bytes(c))),
            DType::I8 => decode!(1, |c| f64::from(i8::from_le_bytes(c))),
            DType::U64 => decode!(8, |c| u64::from_le_bytes(c) as f64),
            DType::U32 => decode!(4, |c| f64::from(u32::from_le_bytes(c))),
            DType::U16 => decode!(2, |c| f64::from(u16::from_le_bytes(c))),
            DType::U8 => decode!(1, |c: [u8; 1]| f64::from(c[0])),
            DType::Bool => decode!(1, |c: [u8; 1]| f64::from(u8::from(c[0] != 0))),
        }
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// bfloat16's largest finite value, (2 − 2^-7)·2^127.
pub(crate) const BF16_MAX: f64 = 3.389_531_389_251_535_5e38;

/// `value` rounded to nearest even on the grid of a binary float type with `mantissa` stored
/// bits, normal exponents from `min_exponent` and largest finite value `max_finite` (an
/// infinity beyond it), widened back: branch-free arithmetic on f64, where the conversion of
/// the `half` crate is a call and a dozen branches (a layer's baseline rounds every element).
/// Scaling by powers of two is exact, and adding 1.5·2^52 rounds to an integer, to even.
#[inline(always)]
fn round_to_grid(value: f64, mantissa: i64, min_exponent: i64, max_finite: f64) -> f64 {
    if !value.is_finite() {
        return value;
    }
    finite_to_grid(value, mantissa, min_exponent, max_finite)
}

/// 1.5·2^52: added to a value below 2^51 and taken away again, it rounds it to an integer (to
/// nearest even): how [`finite_to_grid`] and the vector kernels that round to a grid round.
pub(crate) const INTEGER: f64 = 6_755_399_441_055_744.0;

/// [`round_to_grid`] of a finite value: no branch, for loops that run on vectors.
#[inline(always)]
pub(crate) fn finite_to_grid(value: f64, mantissa: i64, min_exponent: i64, max_finite: f64) -> f64 {
    let exponent = (((value.to_bits() >> 52) & 0x7ff) as i64 - 1023).max(min_exponent);
    let step = f64::from_bits(((exponent - mantissa + 1023) as u64) << 52);
    let per_step = f64::from_bits(((mantissa - exponent + 1023) as u64) << 52);
    // the sign copied back: a value rounding to zero keeps it (-0.0)
    let rounded = (((value * per_step + INTEGER) - INTEGER) * step).copysign(value);
    if rounded.abs() > max_finite {
        f64::INFINITY.copysign(value)
    } else {
        rounded
    }
}

/// 2^`e`, exactly, for every `e` an f64 holds (-1074 to 1023).
#[inline]
pub fn pow2(e: i32) -> f64 {
    if e >= -1022 {
        f64::from_bits(((1023 + e) as u64) << 52)
    } else {
        f64::from_bits(1u64 << (e + 1074))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Correct rounding by another road: to float32 rounding to odd (truncated, its last bit set
    /// where inexact), then to the narrow type by the `half` crate's float32 conversion. With
    /// float32's 13 or 16 bits to spare, the odd bit keeps a value off a tie that was not one.
    /// (The crate's own conversion from f64 reads the top 32 bits only: it rounds 9.25390625 +
    /// 2^-49 down to 9.25, where float16's nearest is 9.2578125.)
    fn by_half(dtype: DType, v: f64) -> f64 {
        let mut single = v as f32;
        if f64::from(single) != v && !v.is_nan() {
            if f64::from(single).abs() > v.abs() {
                single = f32::from_bits(single.to_bits() - 1); // toward zero
            }
            single = f32::from_bits(single.to_bits() | 1);
        }
        match dtype {
            DType::F16 => half::f16::from_f32(single).to_f64(),
            _ => half::bf16::from_f32(single).to_f64(),
        }
    }

    #[test]
    fn rounding_to_a_narrow_grid_is_correct_bit_for_bit() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for dtype in [DType::F16, DType::BF16] {
            let bits = dtype.mantissa_bits().unwrap() as i32 - 1;
            let mut values = vec![
                0.0,
                -0.0,
                1e-30,
                -1e-30,
                65504.0,
                65519.99,
                65520.0,
                -65520.0,
                1e300,
                -1e300,
                f64::MAX,
                f64::MIN_POSITIVE,
                5e-324,
                BF16_MAX,
                3.4e38,
                f64::INFINITY,
                f64::NEG_INFINITY,
            ];
            for _ in 0..200_000 {
                // any bit pattern, and values near the grid's range
                values.push(f64::from_bits(next()));
                let e = (next() % 80) as i32 - 40;
                values.push(f64::from_bits(next() >> 12 | 0x3ff0_0000_0000_0000) * pow2(e));
                // exact ties: a grid value plus half a step, and its neighbours
                let grid = dtype.round(f64::from_bits(next() >> 12 | 0x3ff0_0000_0000_0000));
                let tie = grid + pow2(-bits - 1) * pow2(e.clamp(-20, 15));
                let tie = tie * pow2(e.clamp(-20, 15)) / pow2(e.clamp(-20, 15));
                values.extend([
                    tie,
                    f64::from_bits(tie.to_bits() + 1),
                    f64::from_bits(tie.to_bits() - 1),
                ]);
                values.push(grid * pow2(e) + pow2(e - bits - 1));
                // subnormals of the grid
                values.push(
                    (next() % 4096) as f64 * pow2(-26) * if next() % 2 == 0 { 1.0 } else { -1.0 },
                );
            }
            let mut all = values.clone();
            dtype.round_all(&mut all);
            for (&v, &a) in values.iter().zip(&all) {
                assert!(
                    a.to_bits() == dtype.round(v).to_bits() || (a.is_nan() && v.is_nan()),
                    "{dtype} round_all of {v:e}: {a:e}"
                );
            }
            for &v in &values {
                if v.is_nan() {
                    assert!(dtype.round(v).is_nan());
                    continue;
                }
                let (ours, theirs) = (dtype.round(v), by_half(dtype, v));
                assert!(
                    ours.to_bits() == theirs.to_bits(),
                    "{dtype} rounding of {v:e} ({:#x}): {ours:e}, half gives {theirs:e}",
                    v.to_bits()
                );
            }
        }
    }
}
