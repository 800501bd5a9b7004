use rayon::prelude::*;

use crate::{DType, Error, Result};

/// A borrowed tensor: dtype, shape and little-endian element bytes (C order).
///
/// Views are what the comparator reads; the Python binding builds them over numpy buffers
/// without copying.
#[derive(Debug, Clone, Copy)]
pub struct TensorView<'a> {
    /// Element type.
    pub dtype: DType,
    /// Dimensions, outermost first.
    pub shape: &'a [usize],
    /// `numel * dtype.size()` bytes.
    pub bytes: &'a [u8],
}

impl<'a> TensorView<'a> {
    /// Checks that `bytes` holds exactly `shape` elements of `dtype`; `name` is for the message.
    pub fn new(name: &str, dtype: DType, shape: &'a [usize], bytes: &'a [u8]) -> Result<Self> {
        // A hostile file's shape may multiply past any size: that holds no bytes either.
        let expected = shape
            .iter()
            .try_fold(dtype.size(), |n, &d| n.checked_mul(d))
            .unwrap_or(usize::MAX);
        if bytes.len() != expected {
            return Err(Error::BufferSize {
                name: name.to_string(),
                len: bytes.len(),
                shape: shape.to_vec(),
                dtype: dtype.name(),
                expected,
            });
        }
        Ok(Self {
            dtype,
            shape,
            bytes,
        })
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// An owned copy.
    pub fn to_tensor(&self) -> Tensor {
        Tensor {
            dtype: self.dtype,
            shape: self.shape.to_vec(),
            bytes: self.bytes.to_vec(),
        }
    }

    /// These values in `dtype` (floats rounded to nearest even, integers truncated and
    /// saturated), as a new tensor: converted in parallel runs, never widened whole.
    pub fn to_dtype(&self, dtype: DType) -> Tensor {
        /// Elements per parallel run.
        const RUN: usize = 1 << 14;
        if dtype == self.dtype {
            return self.to_tensor();
        }
        let mut bytes = vec![0u8; self.numel() * dtype.size()];
        bytes
            .par_chunks_mut(RUN * dtype.size())
            .zip(self.bytes.par_chunks(RUN * self.dtype.size()))
            .for_each(|(out, run)| convert(self.dtype, run, dtype, out));
        Tensor {
            dtype,
            shape: self.shape.to_vec(),
            bytes,
        }
    }

    /// These values rounded to `grid` (to nearest even) and held in float64: what
    /// `to_dtype(grid)` then `to_dtype(F64)` make, in one pass and one allocation.
    pub fn to_f64_on_grid(&self, grid: DType) -> Tensor {
        /// Elements per parallel run.
        const RUN: usize = 1 << 12;
        let len = self.numel() * 8;
        // Written once, run by run: zeroing it first cost as much as writing it.
        let mut bytes = Vec::with_capacity(len);
        bytes.spare_capacity_mut()[..len]
            .par_chunks_mut(RUN * 8)
            .zip(self.bytes.par_chunks(RUN * self.dtype.size()))
            .for_each_init(
                || (vec![0.0; RUN], Vec::new()),
                |(wide, encoded), (out, run)| {
                    let wide = &mut wide[..out.len() / 8];
                    let narrowed =
                        self.dtype == DType::F32 && crate::dtype::f32_on_grid(grid, run, wide);
                    if !narrowed {
                        crate::dtype::decode(self.dtype, run, wide);
                        if grid.narrower_than(self.dtype) {
                            grid.round_all(wide);
                        }
                    }
                    if cfg!(target_endian = "little") {
                        out.write_copy_of_slice(bytemuck::cast_slice(wide));
                    } else {
                        encoded.resize(out.len(), 0);
                        DType::F64.encode_f64_into(wide, encoded);
                        out.write_copy_of_slice(encoded);
                    }
                },
            );
        // SAFETY: the runs above wrote every one of the first `len` bytes.
        unsafe { bytes.set_len(len) };
        Tensor {
            dtype: DType::F64,
            shape: self.shape.to_vec(),
            bytes,
        }
    }

    /// Whether these values are `reference`'s cast to this view's dtype, bit for bit (to
    /// nearest even, as [`Self::to_dtype`] casts): the same number of elements, each exactly
    /// what the cast makes of the reference's. Checked in parallel runs, cast a run at a time.
    pub fn is_cast_of(&self, reference: TensorView<'_>) -> bool {
        /// Elements per parallel run.
        const RUN: usize = 1 << 12;
        if self.numel() != reference.numel() {
            return false;
        }
        if self.dtype == reference.dtype {
            return self.bytes == reference.bytes;
        }
        let size = self.dtype.size();
        self.bytes
            .par_chunks(RUN * size)
            .zip(reference.bytes.par_chunks(RUN * reference.dtype.size()))
            .map_init(Vec::new, |cast, (run, theirs)| {
                cast.resize(run.len(), 0);
                convert(reference.dtype, theirs, self.dtype, cast);
                cast.as_slice() == run
            })
            .all(|same| same)
    }

    /// The largest finite magnitude (0 for none), decoded in parallel runs.
    pub fn max_abs(&self) -> f64 {
        /// Elements decoded at once.
        const RUN: usize = 1 << 12;
        let size = self.dtype.size();
        self.bytes
            .par_chunks(RUN * size)
            .map(|run| {
                let mut decoded = vec![0.0; run.len() / size];
                self.dtype.decode_f64(run, &mut decoded);
                decoded
                    .iter()
                    .map(|v| v.abs())
                    .filter(|v| v.is_finite())
                    .fold(0.0, f64::max)
            })
            .reduce(|| 0.0, f64::max)
    }

    /// Elements `from..from + out.len()` widened to f64, by the comparator's vector decoding
    /// (what a pass over every element should use; [`Self::get_f64`] decodes one).
    pub fn decode_into(&self, from: usize, out: &mut [f64]) {
        let size = self.dtype.size();
        crate::dtype::decode(
            self.dtype,
            &self.bytes[from * size..(from + out.len()) * size],
            out,
        );
    }

    /// The element at flat index `i`, widened to f64.
    pub fn get_f64(&self, i: usize) -> f64 {
        let size = self.dtype.size();
        let mut out = [0.0];
        self.dtype
            .decode_f64(&self.bytes[i * size..(i + 1) * size], &mut out);
        out[0]
    }
}

/// Elements of `from` (`input`) converted to `to` (`out`, the same count): float32 to float16
/// in one rounding by the CPU's conversion instructions where it has them, every other pair
/// widened to f64 a few at a time (exact) and rounded once.
fn convert(from: DType, input: &[u8], to: DType, out: &mut [u8]) {
    if let (DType::F32, DType::F16) = (from, to)
        && let Ok(values) = bytemuck::try_cast_slice::<u8, f32>(input)
        && let Ok(halves) = bytemuck::try_cast_slice_mut::<u8, half::f16>(out)
    {
        use half::slice::HalfFloatSliceExt;
        halves.convert_from_f32_slice(values);
        return;
    }
    // widening to float64: decoded straight into the output
    #[cfg(target_endian = "little")]
    if to == DType::F64
        && let Ok(wide) = bytemuck::try_cast_slice_mut::<u8, f64>(out)
    {
        crate::dtype::decode(from, input, wide);
        return;
    }
    const AT_ONCE: usize = 256;
    let mut wide = [0.0f64; AT_ONCE];
    for (i, o) in input
        .chunks(AT_ONCE * from.size())
        .zip(out.chunks_mut(AT_ONCE * to.size()))
    {
        let wide = &mut wide[..i.len() / from.size()];
        crate::dtype::decode(from, i, wide);
        to.encode_f64_into(wide, o);
    }
}

/// An owned tensor.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    /// Element type.
    pub dtype: DType,
    /// Dimensions, outermost first.
    pub shape: Vec<usize>,
    /// Little-endian element bytes, C order.
    pub bytes: Vec<u8>,
}

impl Tensor {
    /// A one-dimensional tensor of `values` in `dtype` (rounded to it).
    pub fn from_f64(dtype: DType, values: &[f64]) -> Tensor {
        let mut bytes = Vec::new();
        dtype.encode_f64(values, &mut bytes);
        Tensor::new("t", dtype, vec![values.len()], bytes).expect("sized to the values")
    }

    /// Checks the byte length against shape and dtype; `name` is for the message.
    pub fn new(name: &str, dtype: DType, shape: Vec<usize>, bytes: Vec<u8>) -> Result<Self> {
        TensorView::new(name, dtype, &shape, &bytes)?;
        Ok(Self {
            dtype,
            shape,
            bytes,
        })
    }

    /// A view of this tensor.
    pub fn view(&self) -> TensorView<'_> {
        TensorView {
            dtype: self.dtype,
            shape: &self.shape,
            bytes: &self.bytes,
        }
    }

    /// This tensor's values in another dtype (floats rounded to nearest). Used to feed one
    /// side's values to the other side's nodes, e.g. float32 activations to a float16 layer.
    pub fn cast(self, dtype: DType) -> Tensor {
        if dtype == self.dtype {
            return self;
        }
        self.view().to_dtype(dtype)
    }

    /// The same elements under another shape, when the element counts agree.
    pub fn reshaped(mut self, shape: &[usize]) -> Option<Tensor> {
        (shape.iter().product::<usize>() == self.shape.iter().product::<usize>()).then(|| {
            self.shape = shape.to_vec();
            self
        })
    }

    /// The tensor with its axes reordered: axis `k` of the result is axis `p[k]` of this one
    /// (`[0, 2, 3, 1]` turns NCHW into NHWC). `None` when `p` is not a permutation of its axes.
    pub fn permuted(&self, p: &[usize]) -> Option<Tensor> {
        let rank = self.shape.len();
        let mut seen = vec![false; rank];
        for &a in p {
            if a >= rank || std::mem::replace(&mut seen[a], true) {
                return None;
            }
        }
        if p.len() != rank {
            return None;
        }
        let size = self.dtype.size();
        let mut strides = vec![1usize; rank];
        for k in (0..rank.saturating_sub(1)).rev() {
            strides[k] = strides[k + 1] * self.shape[k + 1];
        }
        let shape: Vec<usize> = p.iter().map(|&a| self.shape[a]).collect();
        let from: Vec<usize> = p.iter().map(|&a| strides[a]).collect();
        let count: usize = shape.iter().product();
        let mut bytes = Vec::with_capacity(self.bytes.len());
        let mut index = vec![0usize; rank];
        for _ in 0..count {
            let at = index.iter().zip(&from).map(|(i, s)| i * s).sum::<usize>() * size;
            bytes.extend_from_slice(&self.bytes[at..at + size]);
            for k in (0..rank).rev() {
                index[k] += 1;
                if index[k] < shape[k] {
                    break;
                }
                index[k] = 0;
            }
        }
        Some(Tensor {
            dtype: self.dtype,
            shape,
            bytes,
        })
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_shape_that_multiplies_past_any_size_holds_nothing() {
        let err = TensorView::new("t", DType::F32, &[1 << 62, 4], &[]).unwrap_err();
        assert!(err.to_string().contains("do not hold shape"), "{err}");
        assert!(TensorView::new("t", DType::F32, &[0, 1 << 62], &[]).is_ok());
    }
    use super::*;

    #[test]
    fn permuting_nchw_to_nhwc_moves_each_element_and_back() {
        let values: Vec<f64> = (0..24).map(f64::from).collect();
        let t = Tensor::from_f64(DType::F32, &values)
            .reshaped(&[1, 2, 3, 4])
            .unwrap();
        let nhwc = t.permuted(&[0, 2, 3, 1]).unwrap();
        assert_eq!(nhwc.shape, vec![1, 3, 4, 2]);
        // NHWC [0, h, w, c] is NCHW [0, c, h, w]
        assert_eq!(nhwc.view().get_f64((4 + 2) * 2 + 1), 12.0 + 4.0 + 2.0);
        assert_eq!(nhwc.permuted(&[0, 3, 1, 2]).unwrap(), t);
        assert!(t.permuted(&[0, 1, 1, 2]).is_none());
        assert!(t.permuted(&[0, 1, 2]).is_none());
    }

    /// Float32 values that round differently by each path if any path rounds twice or
    /// flushes: ties, subnormals of float16, overflow, infinities and NaN, across runs.
    fn awkward() -> Vec<f32> {
        let mut rng = crate::SplitMix64::new(3);
        let mut v: Vec<f32> = (0..40_000).map(|_| rng.normal() as f32 * 10.0).collect();
        v.extend([
            1.0 + 2f32.powi(-11), // a tie between two float16 values: to even
            1.0 + 3.0 * 2f32.powi(-11),
            3e-6,
            -6e-8,
            1e-9,
            65519.0,
            65520.0,
            1e6,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            -0.0,
        ]);
        v
    }

    #[test]
    fn conversion_rounds_once_to_nearest_even_in_every_dtype() {
        let values = awkward();
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let t = Tensor::new("x", DType::F32, vec![values.len()], bytes).unwrap();
        let wide: Vec<f64> = values.iter().map(|&v| f64::from(v)).collect();
        for dtype in [DType::F16, DType::BF16, DType::F32, DType::F64, DType::I32] {
            let mut expected = Vec::new();
            dtype.encode_f64(&wide, &mut expected);
            let got = t.view().to_dtype(dtype);
            assert_eq!((got.dtype, &got.shape), (dtype, &t.shape));
            assert!(got.bytes == expected, "float32 to {dtype}");
            let back = got.view().to_dtype(DType::F32);
            let twice = t.clone().cast(dtype).cast(DType::F32);
            assert_eq!(back.bytes, twice.bytes, "{dtype} back to float32");
        }
        assert_eq!(
            t.clone().cast(DType::F32),
            t,
            "the same dtype is the tensor itself"
        );
    }

    #[test]
    fn a_cast_is_told_from_values_that_moved_by_one_step_anywhere() {
        let values = awkward();
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let t = Tensor::new("w", DType::F32, vec![values.len()], bytes).unwrap();
        for dtype in [DType::F16, DType::BF16, DType::F32, DType::F64] {
            let cast = t.view().to_dtype(dtype);
            assert!(cast.view().is_cast_of(t.view()), "float32 cast to {dtype}");
            // one element one step away, deep inside a later run, and the last one
            for at in [30_001, values.len() - 1] {
                let mut moved = cast.clone();
                let size = dtype.size();
                let byte = &mut moved.bytes[at * size];
                *byte ^= 1;
                assert!(!moved.view().is_cast_of(t.view()), "{dtype}, element {at}");
            }
            let fewer = Tensor::new("w", dtype, vec![1], cast.bytes[..dtype.size()].to_vec());
            assert!(!fewer.unwrap().view().is_cast_of(t.view()));
        }
    }

    #[test]
    fn rounding_to_a_grid_in_float64_is_converting_there_and_back() {
        let values = awkward();
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let t = Tensor::new("t", DType::F32, vec![values.len()], bytes).unwrap();
        for grid in [DType::F64, DType::F32, DType::F16, DType::BF16] {
            let expected = t.view().to_dtype(grid).cast(DType::F64);
            let got = t.view().to_f64_on_grid(grid);
            // NaN payloads aside, the same bits
            let same = got
                .bytes
                .chunks(8)
                .zip(expected.bytes.chunks(8))
                .all(|(a, b)| {
                    a == b
                        || (f64::from_le_bytes(a.try_into().unwrap()).is_nan()
                            && f64::from_le_bytes(b.try_into().unwrap()).is_nan())
                });
            assert!(same, "on the {grid} grid");
            assert_eq!((got.dtype, &got.shape), (DType::F64, &t.shape));
        }
    }
}
