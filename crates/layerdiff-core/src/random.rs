//! Seeded input generation: the same seed gives the same bytes on every machine.
//!
//! splitmix64 drives everything; floats are standard normal (Box–Muller, computed in f64 and
//! rounded to the dtype), integers uniform in an inclusive range, bools fair coins.

use crate::{DType, Tensor};

/// What the generator's state moves by per draw.
const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// splitmix64: small, fast, and fully specified, so inputs never depend on a library version.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(GAMMA);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// The generator `draws` calls of [`Self::next_u64`] later, at once (its state counts
    /// them).
    pub fn skip(&mut self, draws: u64) {
        self.0 = self.0.wrapping_add(draws.wrapping_mul(GAMMA));
    }

    /// Uniform in (0, 1].
    fn unit(&mut self) -> f64 {
        ((self.next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64
    }

    /// Standard normal.
    pub fn normal(&mut self) -> f64 {
        let (u, v) = (self.unit(), self.unit());
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    }

    /// Uniform integer in `lo..=hi`.
    pub fn int_in(&mut self, lo: i64, hi: i64) -> i64 {
        let span = (hi - lo) as u64 + 1;
        lo + (self.next_u64() % span) as i64
    }
}

/// A tensor of random values: floats standard normal, integers uniform in `int_range`
/// (inclusive), bools fair. Made in parallel runs, each from the generator moved ahead to its
/// first element (every element takes a fixed number of draws): the same bytes as one element
/// after the other, and `rng` left where that would leave it.
pub fn random_tensor(
    dtype: DType,
    shape: &[usize],
    rng: &mut SplitMix64,
    int_range: (i64, i64),
) -> Tensor {
    use rayon::prelude::*;
    /// Elements per parallel run.
    const RUN: usize = 1 << 14;
    let n: usize = shape.iter().product();
    let size = dtype.size();
    let mut bytes = vec![0u8; n * size];
    bytes
        .par_chunks_mut(RUN * size)
        .enumerate()
        .for_each(|(run, out)| {
            let mut rng = rng.clone();
            rng.skip(draws(dtype) * (run * RUN) as u64);
            for element in out.chunks_exact_mut(size) {
                draw(dtype, &mut rng, int_range, element);
            }
        });
    rng.skip(draws(dtype) * n as u64);
    Tensor {
        dtype,
        shape: shape.to_vec(),
        bytes,
    }
}

/// How many draws one element of `dtype` takes.
fn draws(dtype: DType) -> u64 {
    match dtype {
        DType::F64 | DType::F32 | DType::F16 | DType::BF16 => 2,
        _ => 1,
    }
}

/// One random element of `dtype` into `out` (its bytes), from [`draws`] draws of `rng`.
fn draw(dtype: DType, rng: &mut SplitMix64, int_range: (i64, i64), out: &mut [u8]) {
    match dtype {
        DType::F64 => out.copy_from_slice(&rng.normal().to_le_bytes()),
        DType::F32 => out.copy_from_slice(&(rng.normal() as f32).to_le_bytes()),
        DType::F16 => out.copy_from_slice(&half::f16::from_f64(rng.normal()).to_le_bytes()),
        DType::BF16 => out.copy_from_slice(&half::bf16::from_f64(rng.normal()).to_le_bytes()),
        DType::Bool => out[0] = u8::from(rng.next_u64() & 1 == 1),
        _ => {
            let v = rng.int_in(int_range.0, int_range.1);
            out.copy_from_slice(&v.to_le_bytes()[..out.len()]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_bytes_and_ints_stay_in_range() {
        let a = random_tensor(DType::F32, &[3, 5], &mut SplitMix64::new(7), (0, 9));
        let b = random_tensor(DType::F32, &[3, 5], &mut SplitMix64::new(7), (0, 9));
        assert_eq!(a, b);
        let ids = random_tensor(DType::I64, &[1000], &mut SplitMix64::new(1), (3, 5));
        let values: Vec<i64> = ids
            .bytes
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert!(values.iter().all(|v| (3..=5).contains(v)));
        assert!((3..=5).all(|k| values.contains(&k)));
    }

    /// Made run by run in parallel, a tensor is what drawing one element after the other
    /// makes, and the generator goes on from the same place, for every dtype's number of
    /// draws and for sizes on and off a run's edge.
    #[test]
    fn parallel_runs_draw_what_one_element_after_the_other_draws() {
        for dtype in [
            DType::F32,
            DType::F16,
            DType::BF16,
            DType::F64,
            DType::I64,
            DType::Bool,
        ] {
            for n in [1, 16_383, 16_384, 50_001] {
                let mut rng = SplitMix64::new(11);
                let made = random_tensor(dtype, &[n], &mut rng, (-4, 9));
                let mut one_by_one = SplitMix64::new(11);
                let mut expected = vec![0u8; n * dtype.size()];
                for element in expected.chunks_exact_mut(dtype.size()) {
                    draw(dtype, &mut one_by_one, (-4, 9), element);
                }
                assert!(made.bytes == expected, "{dtype}, {n} elements");
                assert_eq!(rng.next_u64(), one_by_one.next_u64(), "{dtype}, {n}: then");
            }
        }
        // what it drew before its runs were parallel, pinned: float32 elements of seed 0
        let made = random_tensor(DType::F32, &[100_000], &mut SplitMix64::new(0), (0, 1));
        let bits = |k: usize| u32::from_le_bytes(made.bytes[4 * k..4 * k + 4].try_into().unwrap());
        assert_eq!(
            [bits(0), bits(1), bits(99_999)],
            [0xbee7_cfdd, 0x4029_a387, 0x3eb7_2b29]
        );
    }
}
