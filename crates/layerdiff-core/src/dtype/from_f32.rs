//! Float32 values rounded to float16's or bfloat16's grid and widened to float64 in one pass:
//! what decoding them and then [`DType::round_all`] make, bit for bit, without the pass that
//! rounds one value at a time on its exponent (the float64 truth rounds every float32 value it
//! is fed to the target's narrow grid this way).

use super::DType;

/// `bytes` (little-endian float32, `out.len()` of them) on `grid`'s values, in float64;
/// `false` (and `out` untouched) for a grid other than float16 and bfloat16.
pub(crate) fn f32_on_grid(grid: DType, bytes: &[u8], out: &mut [f64]) -> bool {
    debug_assert_eq!(bytes.len(), 4 * out.len());
    match grid {
        DType::BF16 => {
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("avx2") {
                // SAFETY: the CPU has AVX2.
                unsafe { bf16_avx2(bytes, out) };
                return true;
            }
            bf16(bytes, out);
            true
        }
        DType::F16 => {
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("f16c")
            {
                // SAFETY: the CPU has AVX2 and F16C.
                unsafe { f16_f16c(bytes, out) };
                return true;
            }
            false
        }
        _ => false,
    }
}

/// To nearest even on bfloat16's grid (float32's upper half): on the bits, which round a
/// finite value past the largest to infinity as the grid's rounding does; NaN kept as it is.
#[inline(always)]
fn bf16(bytes: &[u8], out: &mut [f64]) {
    for (o, c) in out.iter_mut().zip(bytes.chunks_exact(4)) {
        let bits = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        let rounded = bits.wrapping_add(0x7fff + ((bits >> 16) & 1)) & 0xffff_0000;
        let nan = (bits & 0x7fff_ffff) > 0x7f80_0000;
        *o = f64::from(f32::from_bits(if nan { bits } else { rounded }));
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn bf16_avx2(bytes: &[u8], out: &mut [f64]) {
    bf16(bytes, out);
}

/// To nearest even on float16's grid by the CPU's conversion (F16C), which rounds as the grid
/// does, subnormals and overflow to infinity included; NaN kept as it is.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
fn f16_f16c(bytes: &[u8], out: &mut [f64]) {
    use std::arch::x86_64::*;
    let whole = out.len() / 8 * 8;
    for k in (0..whole).step_by(8) {
        // SAFETY: `k + 8 <= out.len()`, and `bytes` holds 4 bytes per element of `out`.
        unsafe {
            let v = _mm256_loadu_ps(bytes.as_ptr().add(4 * k).cast());
            let on_grid = _mm256_cvtph_ps(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v));
            let nan = _mm256_cmp_ps::<_CMP_UNORD_Q>(v, v);
            let r = _mm256_blendv_ps(on_grid, v, nan);
            let p = out.as_mut_ptr().add(k);
            _mm256_storeu_pd(p, _mm256_cvtps_pd(_mm256_castps256_ps128(r)));
            _mm256_storeu_pd(p.add(4), _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(r)));
        }
    }
    let tail = &mut out[whole..];
    DType::F32.decode_f64(&bytes[4 * whole..], tail);
    DType::F16.round_all(tail);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SplitMix64;

    /// The fast path against decoding and rounding value by value, on float32 bit patterns of
    /// every kind: random ones, and those near each grid's ties, overflow, subnormals and NaN.
    #[test]
    fn every_float32_lands_where_rounding_puts_it() {
        let mut rng = SplitMix64::new(7);
        let mut bits: Vec<u32> = (0..400_000).map(|_| rng.next_u64() as u32).collect();
        for edge in [
            0u32,
            0x8000_0000,
            0x7f80_0000,
            0xff80_0000,
            0x7fc0_0001,
            0xffff_ffff,
            0x7f7f_ffff,
            0x7f7f_8000,
            0x477f_f000,
            0x477f_efff,
            0x477f_f001,
            0x3380_0000,
            0x3300_0000,
            0x0000_0001,
            0x0080_0000,
            0x3f80_8000,
            0x3f81_8000,
            0x3f80_1000,
            0x3f80_3000,
        ] {
            for d in 0..3u32 {
                bits.extend([edge.wrapping_add(d), edge.wrapping_sub(d)]);
            }
        }
        // near float16's ties: the 13 dropped bits at one half, around it
        bits.extend((0..20_000u32).map(|i| (rng.next_u64() as u32 & !0x1fff) | 0x1000 ^ (i & 1)));
        let bytes: Vec<u8> = bits.iter().flat_map(|b| b.to_le_bytes()).collect();
        for grid in [DType::F16, DType::BF16] {
            let mut expected = vec![0.0; bits.len()];
            DType::F32.decode_f64(&bytes, &mut expected);
            grid.round_all(&mut expected);
            let mut got = vec![0.0; bits.len()];
            // every length's tail too
            for len in [bits.len(), 13, 7] {
                let (b, g) = (&bytes[..4 * len], &mut got[..len]);
                if !f32_on_grid(grid, b, g) {
                    return; // a CPU without F16C: nothing to check for float16
                }
                for (k, (e, g)) in expected.iter().zip(g.iter()).enumerate() {
                    assert!(
                        e.to_bits() == g.to_bits(),
                        "{grid}: {:#010x} gave {g:e}, rounding gives {e:e} (element {k})",
                        bits[k]
                    );
                }
            }
        }
    }
}
