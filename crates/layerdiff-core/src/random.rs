//! Seeded input generation: the same seed gives the same bytes on every machine.
//!
//! splitmix64 drives everything; floats are standard normal (Box–Muller, computed in f64 and
//! rounded to the dtype), integers uniform in an inclusive range, bools fair coins.

use crate::{DType, Tensor};

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
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
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
/// (inclusive), bools fair.
pub fn random_tensor(
    dtype: DType,
    shape: &[usize],
    rng: &mut SplitMix64,
    int_range: (i64, i64),
) -> Tensor {
    let n: usize = shape.iter().product();
    let mut bytes = Vec::with_capacity(n * dtype.size());
    for _ in 0..n {
        match dtype {
            DType::F64 => bytes.extend(rng.normal().to_le_bytes()),
            DType::F32 => bytes.extend((rng.normal() as f32).to_le_bytes()),
            DType::F16 => bytes.extend(half::f16::from_f64(rng.normal()).to_le_bytes()),
            DType::BF16 => bytes.extend(half::bf16::from_f64(rng.normal()).to_le_bytes()),
            DType::Bool => bytes.push(u8::from(rng.next_u64() & 1 == 1)),
            int => {
                let v = rng.int_in(int_range.0, int_range.1);
                let le = v.to_le_bytes();
                bytes.extend_from_slice(&le[..int.size()]);
            }
        }
    }
    Tensor {
        dtype,
        shape: shape.to_vec(),
        bytes,
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
}
