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
        let expected = shape.iter().product::<usize>() * dtype.size();
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

    /// The element at flat index `i`, widened to f64.
    pub fn get_f64(&self, i: usize) -> f64 {
        let size = self.dtype.size();
        let mut out = [0.0];
        self.dtype
            .decode_f64(&self.bytes[i * size..(i + 1) * size], &mut out);
        out[0]
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
        let n = self.shape.iter().product::<usize>();
        let mut values = vec![0.0; n];
        self.dtype.decode_f64(&self.bytes, &mut values);
        let mut bytes = Vec::new();
        dtype.encode_f64(&values, &mut bytes);
        Tensor {
            dtype,
            shape: self.shape.clone(),
            bytes,
        }
    }

    /// The same elements under another shape, when the element counts agree.
    pub fn reshaped(mut self, shape: &[usize]) -> Option<Tensor> {
        (shape.iter().product::<usize>() == self.shape.iter().product::<usize>()).then(|| {
            self.shape = shape.to_vec();
            self
        })
    }
}
