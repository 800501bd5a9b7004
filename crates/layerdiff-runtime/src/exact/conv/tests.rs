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
                                let xv = x
                                    [((n * g.channels + ci) * ih + yy as usize) * iw + xx as usize];
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

fn check(x_shape: &[usize], w_shape: &[usize], attributes: Vec<layerdiff_onnx::AttributeProto>) {
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
    // a 1×1 kernel read from the input as is, in groups and a batch; and one that is not
    check(&[2, 4, 5, 6], &[6, 2, 1, 1], vec![int("group", 2)]);
    check(&[1, 3, 9, 8], &[2, 3, 1, 1], vec![ints("strides", &[2, 2])]);
    // padding wider than a dilated kernel's reach: whole rows and columns in it
    check(
        &[1, 2, 6, 7],
        &[3, 2, 2, 3],
        vec![
            ints("strides", &[3, 2]),
            ints("dilations", &[2, 3]),
            ints("pads", &[4, 5, 3, 6]),
        ],
    );
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
