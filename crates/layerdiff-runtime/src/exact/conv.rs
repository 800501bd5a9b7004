//! Conv in float64 (1-D and 2-D, any group, stride, dilation and padding): each slice of output
//! positions is laid out as columns of its input patches and multiplied by the weights in one
//! blocked matrix product (matrixmultiply's dgemm, which uses the CPU's vector units), the
//! slices split across the threads. tract's own float64 convolution is a scalar loop, dozens of
//! times slower: a CNN's baseline spent most of its run there.

use std::borrow::Cow;

use layerdiff_core::{DType, Tensor, TensorView};
use layerdiff_onnx::{NodeExt, NodeProto};
use rayon::prelude::*;

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
        let mut row = 0;
        for c in 0..per_group {
            let plane = &x[((n * self.channels) + g * per_group + c) * ih * iw..][..ih * iw];
            for ky in 0..kh {
                for kx in 0..kw {
                    let dst = &mut out[row * width..(row + 1) * width];
                    // output row by output row: the input row is found once per row, and the
                    // input column steps by the stride
                    let mut p = from;
                    while p < to {
                        let (oy, first) = (p / ow, p % ow);
                        let last = ow.min(first + to - p);
                        let span = &mut dst[p - from..p - from + last - first];
                        let y = (oy * self.strides[0] + ky * self.dilations[0])
                            .checked_sub(self.pads[0])
                            .filter(|&y| y < ih);
                        match y {
                            None => span.fill(0.0),
                            Some(y) => {
                                let line = &plane[y * iw..(y + 1) * iw];
                                let mut at = first * self.strides[1] + kx * self.dilations[1];
                                for d in span.iter_mut() {
                                    *d = at
                                        .checked_sub(self.pads[1])
                                        .and_then(|x| line.get(x))
                                        .copied()
                                        .unwrap_or(0.0);
                                    at += self.strides[1];
                                }
                            }
                        }
                        p += last - first;
                    }
                    row += 1;
                }
            }
        }
    }
}

/// A float64 tensor's values, borrowed where its bytes are aligned for them.
fn values<'a>(t: &TensorView<'a>) -> Cow<'a, [f64]> {
    match bytemuck::try_cast_slice(t.bytes) {
        Ok(values) if cfg!(target_endian = "little") => Cow::Borrowed(values),
        _ => Cow::Owned(
            t.bytes
                .chunks_exact(8)
                .map(|b| f64::from_le_bytes(b.try_into().expect("8 bytes")))
                .collect(),
        ),
    }
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
    let computed: Vec<Vec<f64>> = tasks
        .par_iter()
        .map(|&(n, g, from, first)| {
            let (to, maps) = (
                (from + slice).min(positions),
                block.min(maps_per_group - first),
            );
            let width = to - from;
            let mut columns = vec![0.0; patch * width];
            geo.columns(&xs, n, g, from, to, &mut columns);
            let mut out = vec![0.0; maps * width];
            let weights = &ws[(g * maps_per_group + first) * patch..][..maps * patch];
            // SAFETY: `weights` is maps × patch, `columns` patch × width and `out` maps × width,
            // all row-major and as long as those strides say.
            unsafe {
                matrixmultiply::dgemm(
                    maps,
                    patch,
                    width,
                    1.0,
                    weights.as_ptr(),
                    patch as isize,
                    1,
                    columns.as_ptr(),
                    width as isize,
                    1,
                    0.0,
                    out.as_mut_ptr(),
                    width as isize,
                    1,
                );
            }
            out
        })
        .collect();
    let mut y = vec![0.0; geo.batch * geo.maps * positions];
    for (&(n, g, from, first), out) in tasks.iter().zip(&computed) {
        let width = (from + slice).min(positions) - from;
        for (m, row) in out.chunks_exact(width.max(1)).enumerate() {
            let map = g * maps_per_group + first + m;
            let add = bias.as_ref().map_or(0.0, |b| b[map]);
            let at = (n * geo.maps + map) * positions + from;
            for (dst, v) in y[at..at + width].iter_mut().zip(row) {
                *dst = v + add;
            }
        }
    }
    let mut shape = vec![geo.batch, geo.maps];
    shape.extend(&geo.output[2 - (x.shape.len() - 2)..]);
    let bytes = y.iter().flat_map(|v| v.to_le_bytes()).collect();
    Tensor::new("conv", DType::F64, shape, bytes).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tensor(shape: &[usize], values: &[f64]) -> Tensor {
        let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        Tensor::new("t", DType::F64, shape.to_vec(), bytes).unwrap()
    }

    fn int(name: &str, v: i64) -> layerdiff_onnx::AttributeProto {
        layerdiff_onnx::AttributeProto {
            name: Some(name.into()),
            r#type: Some(2),
            i: Some(v),
            ..Default::default()
        }
    }

    fn ints(name: &str, v: &[i64]) -> layerdiff_onnx::AttributeProto {
        layerdiff_onnx::AttributeProto {
            name: Some(name.into()),
            r#type: Some(7),
            ints: v.to_vec(),
            ..Default::default()
        }
    }

    /// The definition, one output element at a time.
    fn direct(g: &Geometry, x: &[f64], w: &[f64], b: &[f64]) -> Vec<f64> {
        let per_group = g.channels / g.group;
        let maps_per_group = g.maps / g.group;
        let [ih, iw] = g.input;
        let [kh, kw] = g.kernel;
        let mut y = Vec::new();
        for n in 0..g.batch {
            for m in 0..g.maps {
                let grp = m / maps_per_group;
                for oy in 0..g.output[0] {
                    for ox in 0..g.output[1] {
                        let mut s = b[m];
                        for c in 0..per_group {
                            for ky in 0..kh {
                                for kx in 0..kw {
                                    let yy = (oy * g.strides[0] + ky * g.dilations[0]) as i64
                                        - g.pads[0] as i64;
                                    let xx = (ox * g.strides[1] + kx * g.dilations[1]) as i64
                                        - g.pads[1] as i64;
                                    if yy < 0 || xx < 0 || yy >= ih as i64 || xx >= iw as i64 {
                                        continue;
                                    }
                                    let ci = grp * per_group + c;
                                    let xv = x[((n * g.channels + ci) * ih + yy as usize) * iw
                                        + xx as usize];
                                    let wv = w[((m * per_group + c) * kh + ky) * kw + kx];
                                    s += xv * wv;
                                }
                            }
                        }
                        y.push(s);
                    }
                }
            }
        }
        y
    }

    fn check(
        x_shape: &[usize],
        w_shape: &[usize],
        attributes: Vec<layerdiff_onnx::AttributeProto>,
    ) {
        let count = |s: &[usize]| s.iter().product::<usize>();
        let xs: Vec<f64> = (0..count(x_shape))
            .map(|i| ((i * 37 % 101) as f64 - 50.0) / 7.0)
            .collect();
        let ws: Vec<f64> = (0..count(w_shape))
            .map(|i| ((i * 53 % 89) as f64 - 44.0) / 11.0)
            .collect();
        let bs: Vec<f64> = (0..w_shape[0]).map(|i| i as f64 * 0.25 - 1.0).collect();
        let node = NodeProto {
            op_type: Some("Conv".into()),
            attribute: attributes,
            ..Default::default()
        };
        let (x, w, b) = (
            tensor(x_shape, &xs),
            tensor(w_shape, &ws),
            tensor(&[w_shape[0]], &bs),
        );
        let y = conv(&node, x.view(), w.view(), Some(b.view())).unwrap();
        let geo = Geometry::of(&node, x_shape, w_shape).unwrap();
        let expected = direct(&geo, &xs, &ws, &bs);
        let got = values(&y.view());
        assert_eq!(got.len(), expected.len());
        for (a, e) in got.iter().zip(&expected) {
            assert!((a - e).abs() <= 1e-12 * e.abs().max(1.0), "{a} against {e}");
        }
    }

    #[test]
    fn a_convolution_matches_its_definition_in_every_geometry() {
        // stride 2 with padding (ResNet's stem), dilation, groups (depthwise), 1-D, a 1×1 kernel
        check(
            &[2, 3, 11, 9],
            &[4, 3, 3, 3],
            vec![ints("strides", &[2, 2]), ints("pads", &[1, 1, 1, 1])],
        );
        check(
            &[1, 4, 8, 8],
            &[6, 2, 3, 3],
            vec![int("group", 2), ints("dilations", &[2, 1])],
        );
        check(
            &[1, 5, 7, 7],
            &[5, 1, 3, 3],
            vec![int("group", 5), ints("pads", &[0, 1, 2, 1])],
        );
        check(
            &[2, 3, 20],
            &[2, 3, 4],
            vec![ints("strides", &[3]), ints("pads", &[2, 1])],
        );
        check(&[1, 2, 130, 140], &[3, 2, 1, 1], vec![]);
        // many maps on few positions (a CNN's last stage): the maps split across the threads
        check(
            &[1, 8, 3, 3],
            &[40, 8, 3, 3],
            vec![ints("pads", &[1, 1, 1, 1])],
        );
    }

    #[test]
    fn same_padding_puts_the_odd_pixel_where_onnx_says() {
        for mode in ["SAME_UPPER", "SAME_LOWER"] {
            let node = NodeProto {
                op_type: Some("Conv".into()),
                attribute: vec![
                    ints("strides", &[2, 2]),
                    layerdiff_onnx::AttributeProto {
                        name: Some("auto_pad".into()),
                        r#type: Some(3),
                        s: Some(mode.as_bytes().to_vec()),
                        ..Default::default()
                    },
                ],
                ..Default::default()
            };
            let geo = Geometry::of(&node, &[1, 1, 6, 6], &[1, 1, 4, 4]).unwrap();
            assert_eq!(geo.output, [3, 3]);
            // (3 − 1) × 2 + 4 − 6 = 2 pixels of padding on each axis: one before, one after
            assert_eq!(geo.pads, [1, 1]);
            // 3 pixels: the odd one after the input for SAME_UPPER, before it for SAME_LOWER
            let odd = Geometry::of(&node, &[1, 1, 5, 5], &[1, 1, 4, 4]).unwrap();
            assert_eq!(
                odd.pads,
                if mode == "SAME_UPPER" { [1, 1] } else { [2, 2] },
                "{mode}"
            );
        }
    }

    #[test]
    fn what_it_does_not_compute_is_refused_with_the_reason() {
        let node = NodeProto {
            op_type: Some("Conv".into()),
            ..Default::default()
        };
        let x = tensor(&[1, 1, 2, 2, 2], &[0.0; 8]);
        let w = tensor(&[1, 1, 1, 1, 1], &[1.0]);
        assert_eq!(
            conv(&node, x.view(), w.view(), None).unwrap_err(),
            "a Conv of input rank 5 and weight rank 5"
        );
        let x32 = Tensor::new("x", DType::F32, vec![1, 1, 1, 1], vec![0; 4]).unwrap();
        assert_eq!(
            conv(&node, x32.view(), w.view(), None).unwrap_err(),
            "a Conv that is not float64"
        );
    }
}
