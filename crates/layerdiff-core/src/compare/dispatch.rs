//! One block's statistics by the best kernel the CPU has (AVX-512, AVX2, or the portable
//! path); what a kernel does not take (a dtype it does not read, a value that is not finite)
//! goes to the next one, so the choice never changes the bits.

#[cfg(target_arch = "x86_64")]
use super::block::Outcome;
use super::block::{exact_block, finite_block};
use super::{BLOCK, Judging, Partial};
#[cfg(target_arch = "x86_64")]
use super::{avx2, avx512};
use crate::dtype::decode;
#[cfg(target_arch = "x86_64")]
use crate::dtype::widen_f16;
use crate::kernel::Kernel;
use crate::{DType, TensorView};

/// The largest `|t - r|` over elements `from..from + len` and the largest `|r|`, by the AVX-512
/// or AVX2 kernel where the CPU has it and reads both dtypes and `len` is a multiple of eight;
/// `None` otherwise (the caller decodes).
pub(crate) fn largest_difference(
    reference: TensorView<'_>,
    target: TensorView<'_>,
    from: usize,
    len: usize,
) -> Option<(f64, f64)> {
    #[cfg(target_arch = "x86_64")]
    {
        let best = Kernel::best();
        if best != Kernel::Portable && from + len <= reference.numel().min(target.numel()) {
            let (r, t) = (
                (reference.dtype, reference.bytes),
                (target.dtype, target.bytes),
            );
            // SAFETY: the CPU has the kernel's features (Kernel::available); both views hold
            // `from + len` elements, checked above.
            return unsafe {
                if best == Kernel::Avx512 {
                    avx512::largest_difference(r, t, from, len)
                } else {
                    avx2::largest_difference(r, t, from, len)
                }
            };
        }
    }
    let _ = (reference, target, from, len);
    None
}

/// One block's statistics, by the best kernel the CPU has.
pub(super) fn block_stats(
    reference: TensorView<'_>,
    target: TensorView<'_>,
    block: usize,
    judging: Judging<'_>,
) -> Partial {
    block_stats_on(Kernel::best(), reference, target, block, judging)
}

/// One block's statistics by `kernel`, which the CPU must have ([`Kernel::available`]); what
/// a kernel does not take (AVX-512: a dtype it does not read) goes to the next one.
pub(super) fn block_stats_on(
    kernel: Kernel,
    reference: TensorView<'_>,
    target: TensorView<'_>,
    block: usize,
    mut judging: Judging<'_>,
) -> Partial {
    #[cfg(target_arch = "x86_64")]
    {
        if kernel == Kernel::Avx512 {
            let start = block * BLOCK;
            let len = BLOCK.min(reference.numel() - start);
            let judge = judging.as_mut().map(|(j, h)| (*j, &mut **h));
            // SAFETY: the CPU has the features (Kernel::available); views hold `numel` elements.
            let outcome = unsafe {
                avx512::finite_block(
                    (reference.dtype, reference.bytes),
                    (target.dtype, target.bytes),
                    start,
                    len,
                    judge,
                )
            };
            match outcome {
                Outcome::Done(p) => return p,
                Outcome::NotFinite => return exact_block(reference, target, block, judging),
                Outcome::Unsupported => {}
            }
        }
        // What the AVX-512 kernel does not take, and every block of a CPU without it.
        if kernel != Kernel::Portable {
            let start = block * BLOCK;
            let len = BLOCK.min(reference.numel() - start);
            let judge = judging.as_mut().map(|(j, h)| (*j, &mut **h));
            // SAFETY: the CPU has AVX2 and F16C (Kernel::available); views hold `numel`
            // elements.
            let outcome = unsafe {
                avx2::finite_block(
                    (reference.dtype, reference.bytes),
                    (target.dtype, target.bytes),
                    start,
                    len,
                    judge,
                )
            };
            return match outcome {
                Outcome::Done(p) => p,
                Outcome::NotFinite => exact_block(reference, target, block, judging),
                // SAFETY: the CPU has AVX2 and F16C (Kernel::available).
                Outcome::Unsupported => unsafe {
                    block_stats_avx2(reference, target, block, judging)
                },
            };
        }
    }
    let _ = kernel;
    block_stats_generic(reference, target, block, judging, decode)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
fn block_stats_avx2(
    reference: TensorView<'_>,
    target: TensorView<'_>,
    block: usize,
    judging: Judging<'_>,
) -> Partial {
    block_stats_generic(reference, target, block, judging, |dtype, bytes, out| {
        if dtype == DType::F16 {
            widen_f16(bytes, out);
        } else {
            decode(dtype, bytes, out);
        }
    })
}

/// One block's statistics, its elements widened by `widen(dtype, bytes, out)`.
#[inline(always)]
fn block_stats_generic(
    reference: TensorView<'_>,
    target: TensorView<'_>,
    block: usize,
    mut judging: Judging<'_>,
    widen: impl Fn(DType, &[u8], &mut [f64]),
) -> Partial {
    let start = block * BLOCK;
    let len = BLOCK.min(reference.numel() - start);
    let (rs, ts) = (reference.dtype.size(), target.dtype.size());
    fn span<'a>(v: &TensorView<'a>, size: usize, from: usize, to: usize) -> &'a [u8] {
        &v.bytes[from * size..to * size]
    }
    let judge = judging.as_mut().map(|(j, h)| (*j, &mut **h));
    finite_block(len, start, judge, |from, to, r, t| {
        let (from, to) = (start + from, start + to);
        widen(reference.dtype, span(&reference, rs, from, to), r);
        widen(target.dtype, span(&target, ts, from, to), t);
    })
    .unwrap_or_else(|| exact_block(reference, target, block, judging))
}
