//! Conv in float64 (1-D and 2-D, any group, stride, dilation and padding): each slice of output
//! positions is laid out as columns of its input patches and multiplied by the weights in one
//! blocked matrix product (matrixmultiply's dgemm, which uses the CPU's vector units), the
//! slices split across the threads. tract's own float64 convolution is a scalar loop, dozens of
//! times slower: a CNN's baseline spent most of its run there.

use layerdiff_core::{DType, Tensor, TensorView};
use layerdiff_onnx::{NodeExt, NodeProto};
use rayon::prelude::*;

use super::values;

/// Elements of one slice's patch columns (2 MiB of float64): small enough for the caches and
/// the threads to share the work, large enough for the matrix product to run at speed.
const COLUMNS: usize = 1 << 18;

/// The geometry of one Conv node over 2-D positions (a 1-D Conv is a 2-D one of height 1).
#[derive(Debug, Clone, PartialEq)]
struct Geometry {
    batch: usize,
    channels: usize,
    input: [usize; 2],
    maps: usize,
    kernel: [usize; 2],
    group: usize,
    strides: [usize; 2],
    dilations: [usize; 2],
    /// Padding before each spatial axis.
    pads: [usize; 2],
    output: [usize; 2],
}

impl Geometry {
    fn of(node: &NodeProto, x: &[usize], w: &[usize]) -> Result<Self, String> {
        let rank = x.len();
        if !(rank == 3 || rank == 4) || w.len() != rank {
            return Err(format!(
                "a Conv of input rank {rank} and weight rank {}",
                w.len()
            ));
        }
        let spatial = rank - 2;
        let ints = |name: &str, default: usize| -> Result<Vec<usize>, String> {
            let Some(attr) = node.attr(name) else {
                return Ok(vec![default; spatial]);
            };
            attr.ints
                .iter()
                .map(|&v| usize::try_from(v).map_err(|_| format!("a Conv with {name} {v}")))
                .collect()
        };
        let lift = |v: &[usize], fill: usize| -> [usize; 2] {
            if spatial == 1 {
                [fill, v[0]]
            } else {
                [v[0], v[1]]
            }
        };
        let group = node.attr("group").and_then(|a| a.i).unwrap_or(1);
        let group = usize::try_from(group)
            .ok()
            .filter(|&g| g > 0)
            .ok_or_else(|| format!("a Conv with group {group}"))?;
        let (strides, dilations) = (ints("strides", 1)?, ints("dilations", 1)?);
        let kernel = match node.attr("kernel_shape") {
            Some(_) => ints("kernel_shape", 1)?,
            None => w[2..].to_vec(),
        };
        let (input, w_spatial) = (&x[2..], &w[2..]);
        if [&strides, &dilations, &kernel]
            .iter()
            .any(|v| v.len() != spatial)
            || kernel != w_spatial
            || strides.contains(&0)
            || dilations.contains(&0)
        {
            return Err("a Conv whose attributes do not fit its weight".to_string());
        }
        let extent = |i: usize| (kernel[i] - 1) * dilations[i] + 1;
        let auto_pad = node
            .attr("auto_pad")
            .and_then(|a| a.s.as_deref())
            .map(String::from_utf8_lossy)
            .unwrap_or_default()
            .into_owned();
        let mut begin = vec![0; spatial];
        let mut end = vec![0; spatial];
        match auto_pad.as_str() {
            "" | "NOTSET" => {
                let pads = ints("pads", 0)?;
                if node.attr("pads").is_some() && pads.len() != 2 * spatial {
                    return Err("a Conv whose pads do not fit its rank".to_string());
                }
                if node.attr("pads").is_some() {
                    begin.copy_from_slice(&pads[..spatial]);
                    end.copy_from_slice(&pads[spatial..]);
                }
            }
            "VALID" => {}
            "SAME_UPPER" | "SAME_LOWER" => {
                for i in 0..spatial {
                    let out = input[i].div_ceil(strides[i]);
                    let total = ((out - 1) * strides[i] + extent(i)).saturating_sub(input[i]);
                    let small = total / 2;
                    (begin[i], end[i]) = if auto_pad == "SAME_UPPER" {
                        (small, total - small)
                    } else {
                        (total - small, small)
                    };
                }
            }
            other => return Err(format!("a Conv with auto_pad {other}")),
        }
        let mut output = vec![0; spatial];
        for i in 0..spatial {
            let padded = input[i] + begin[i] + end[i];
            if padded < extent(i) {
                return Err("a Conv whose kernel is larger than its padded input".to_string());
            }
            output[i] = (padded - extent(i)) / strides[i] + 1;
        }
        let (channels, maps) = (x[1], w[0]);
        if channels != w[1] * group || maps % group != 0 {
            return Err(format!(
                "a Conv of {channels} channels, group {group} and weight {w:?}"
            ));
        }
        Ok(Self {
            batch: x[0],
            channels,
            input: lift(input, 1),
            maps,
            kernel: lift(&kernel, 1),
            group,
            strides: lift(&strides, 1),
            dilations: lift(&dilations, 1),
            pads: lift(&begin, 0),
            output: lift(&output, 1),
        })
    }

    fn positions(&self) -> usize {
        self.output[0] * self.output[1]
    }

    /// Rows of one group's patch columns: its input channels times the kernel's taps.
    fn patch(&self) -> usize {
        self.channels / self.group * self.kernel[0] * self.kernel[1]
    }

    /// Lays out output positions `from..to` of image `n`, group `g`, as columns: row
    /// (channel, tap), column position; taps in the padding are zero.
    fn columns(&self, x: &[f64], n: usize, g: usize, from: usize, to: usize, out: &mut [f64]) {
        let width = to - from;
        let per_group = self.channels / self.group;
        let [ih, iw] = self.input;
        let [kh, kw] = self.kernel;
        let ow = self.output[1];
        let stride = self.strides[1];
        let mut row = 0;
        for c in 0..per_group {
            let plane = &x[((n * self.channels) + g * per_group + c) * ih * iw..][..ih * iw];
            for ky in 0..kh {
                for kx in 0..kw {
                    let dst = &mut out[row * width..(row + 1) * width];
                    // output row by output row: the input row is found once per row, and the
                    // output columns whose input column lies inside it are copied at once
                    let shift = (kx * self.dilations[1]) as isize - self.pads[1] as isize;
                    let (inside_from, inside_to) = inside(shift, stride, iw);
                    let mut p = from;
                    while p < to {
                        let (oy, first) = (p / ow, p % ow);
                        let last = ow.min(first + to - p);
                        let span = &mut dst[p - from..p - from + last - first];
                        let y = (oy * self.strides[0] + ky * self.dilations[0])
                            .checked_sub(self.pads[0])
                            .filter(|&y| y < ih);
                        let (lo, hi) =
                            (inside_from.clamp(first, last), inside_to.clamp(first, last));
                        match y {
                            Some(y) if lo < hi => {
                                let line = &plane[y * iw..(y + 1) * iw];
                                span[..lo - first].fill(0.0);
                                span[hi - first..].fill(0.0);
                                // the input column of output column `ox` is ox × stride + shift
                                let at = (lo * stride).wrapping_add_signed(shift);
                                let copied = &mut span[lo - first..hi - first];
                                if stride == 1 {
                                    copied.copy_from_slice(&line[at..at + copied.len()]);
                                } else {
                                    for (d, s) in
                                        copied.iter_mut().zip(line[at..].iter().step_by(stride))
                                    {
                                        *d = *s;
                                    }
                                }
                            }
                            _ => span.fill(0.0),
                        }
                        p += last - first;
                    }
                    row += 1;
                }
            }
        }
    }

    /// Whether each output position's columns are the input itself (a 1×1 kernel, stride 1,
    /// no padding): then nothing is laid out.
    fn reads_input_as_is(&self) -> bool {
        self.kernel == [1, 1]
            && self.strides == [1, 1]
            && self.pads == [0, 0]
            && self.output == self.input
    }
}

/// The output columns `lo..hi` whose input column `ox × stride + shift` lies in `0..width`.
fn inside(shift: isize, stride: usize, width: usize) -> (usize, usize) {
    // the least ox with ox × stride + shift ≥ 0, and the least with it ≥ width
    let least = |bound: isize| ((bound - shift).max(0) as usize).div_ceil(stride);
    (least(0), least(width as isize))
}

/// The output buffer, written by the threads at once, each its own rows and columns.
#[derive(Clone, Copy)]
struct Shared(*mut f64);

// SAFETY: the tasks of one convolution write disjoint parts of the buffer (see `conv`).
unsafe impl Send for Shared {}
unsafe impl Sync for Shared {}

impl Shared {
    fn at(self, offset: usize) -> *mut f64 {
        self.0.wrapping_add(offset)
    }
}

thread_local! {
    /// Each thread's patch columns, kept across tasks and convolutions: a fresh buffer per task
    /// was zeroed (and faulted in) only to be overwritten.
    static SCRATCH: std::cell::RefCell<Vec<f64>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Conv `node` on `x` with weight `w` and bias `b`, all float64; `Err` says what it does not
/// compute (another runtime then does).
pub(super) fn conv(
    node: &NodeProto,
    x: TensorView<'_>,
    w: TensorView<'_>,
    b: Option<TensorView<'_>>,
) -> Result<Tensor, String> {
    if [Some(&x), Some(&w), b.as_ref()]
        .into_iter()
        .flatten()
        .any(|t| t.dtype != DType::F64)
    {
        return Err("a Conv that is not float64".to_string());
    }
    let geo = Geometry::of(node, x.shape, w.shape)?;
    if b.as_ref().is_some_and(|b| b.numel() != geo.maps) {
        return Err("a Conv whose bias does not fit its weight".to_string());
    }
    let (xs, ws) = (values(&x), values(&w));
    let bias = b.as_ref().map(values);
    let (positions, patch) = (geo.positions(), geo.patch());
    let maps_per_group = geo.maps / geo.group;
    let slice = (COLUMNS / patch.max(1)).max(64).min(positions.max(1));
    // Few slices (a late layer of a CNN: many maps, few positions) split their maps too, so
    // every thread has work.
    let per_image = geo.batch * geo.group * positions.div_ceil(slice);
    let parts = (4 * rayon::current_num_threads()).div_ceil(per_image.max(1));
    let block = maps_per_group
        .div_ceil(parts.max(1))
        .max(16)
        .min(maps_per_group.max(1));
    let tasks: Vec<(usize, usize, usize, usize)> = (0..geo.batch)
        .flat_map(|n| (0..geo.group).map(move |g| (n, g)))
        .flat_map(|(n, g)| (0..positions).step_by(slice).map(move |p| (n, g, p)))
        .flat_map(|(n, g, p)| {
            (0..maps_per_group)
                .step_by(block)
                .map(move |m| (n, g, p, m))
        })
        .collect();
    let as_is = geo.reads_input_as_is();
    let per_group = geo.channels / geo.group;
    let mut shape = vec![geo.batch, geo.maps];
    shape.extend(&geo.output[2 - (x.shape.len() - 2)..]);
    super::float64(shape, |y| {
        let shared = Shared(y.as_mut_ptr());
        tasks.par_iter().for_each(|&(n, g, from, first)| {
            let (to, maps) = (
                (from + slice).min(positions),
                block.min(maps_per_group - first),
            );
            let width = to - from;
            let weights = &ws[(g * maps_per_group + first) * patch..][..maps * patch];
            let map = g * maps_per_group + first;
            // rows `map..map + maps` of image `n`, columns `from..to`: this task's alone
            let out = shared.at((n * geo.maps + map) * positions + from);
            SCRATCH.with_borrow_mut(|scratch| {
                let (columns, stride) = if as_is {
                    let at = (n * geo.channels + g * per_group) * positions + from;
                    (xs[at..].as_ptr(), positions)
                } else {
                    if scratch.len() < patch * width {
                        scratch.resize(patch * width, 0.0);
                    }
                    geo.columns(&xs, n, g, from, to, &mut scratch[..patch * width]);
                    (scratch.as_ptr(), width)
                };
                // SAFETY: `weights` is maps × patch and `columns` patch × width, row-major with the
                // strides given (the input's planes read as is lie `positions` apart); `out` is
                // maps rows of `positions`, of which this task writes columns `from..to`.
                unsafe {
                    matrixmultiply::dgemm(
                        maps,
                        patch,
                        width,
                        1.0,
                        weights.as_ptr(),
                        patch as isize,
                        1,
                        columns,
                        stride as isize,
                        1,
                        0.0,
                        out,
                        positions as isize,
                        1,
                    );
                }
            });
            if let Some(bias) = &bias {
                for m in 0..maps {
                    // SAFETY: row `m` of this task's part, as above
                    let row =
                        unsafe { std::slice::from_raw_parts_mut(out.add(m * positions), width) };
                    for v in row {
                        *v += bias[map + m];
                    }
                }
            }
        });
    })
    .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests;
