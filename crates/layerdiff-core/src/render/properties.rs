//! Every renderer on reports of any layer names and values (proptest): names with markup,
//! table and code characters, newlines and any Unicode; values with NaN and ±Inf. The JSON
//! reads back with every name as it was; no name reaches the HTML page or the chart unescaped;
//! a name never breaks the Markdown table it sits in.

use proptest::prelude::*;

use crate::{DType, Layer, LayerStatus, Report, TensorView, compare};

/// A name: mostly ordinary, sometimes hostile.
fn name() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z_.0-9/]{1,12}",
        prop::sample::select(vec![
            "<script>alert(1)</script>".to_string(),
            "a|b".to_string(),
            "tick`s".to_string(),
            "line\nbreak".to_string(),
            "\"quoted\" & 'single'".to_string(),
            "**bold** _it_ [link](x)".to_string(),
            "</svg><svg onload=x>".to_string(),
        ]),
        any::<String>().prop_filter("a name", |s| !s.is_empty()),
    ]
}

fn value() -> impl Strategy<Value = f32> {
    prop_oneof![
        8 => -10.0f32..10.0,
        1 => prop::sample::select(vec![f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 0.0, -0.0]),
    ]
}

fn report(layers: Vec<(String, Vec<(f32, f32)>)>, model: String) -> Report {
    let built: Vec<Layer> = layers
        .into_iter()
        .enumerate()
        .map(|(i, (name, pairs))| {
            let mut layer = Layer::new(i, name, vec![pairs.len()], "float32");
            layer.status = LayerStatus::Compared;
            let bytes = |f: fn(&(f32, f32)) -> f32| -> Vec<u8> {
                pairs.iter().map(f).flat_map(f32::to_le_bytes).collect()
            };
            let (r, t) = (bytes(|p| p.0), bytes(|p| p.1));
            let shape = [pairs.len()];
            layer.accumulated = compare(
                TensorView::new("r", DType::F32, &shape, &r).unwrap(),
                TensorView::new("t", DType::F32, &shape, &t).unwrap(),
            )
            .ok();
            layer.local = layer.accumulated.clone();
            layer
        })
        .collect();
    Report::of_layers(&model, built)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 120, ..ProptestConfig::default() })]

    #[test]
    fn every_renderer_takes_any_names_and_values(
        layers in prop::collection::vec(
            (name(), prop::collection::vec((value(), value()), 1..6)), 1..6),
        model in name(),
    ) {
        // The same report under plain names: its pages hold only the renderer's own markup,
        // and a hostile name may occur in a page no more often than it occurs there (a name
        // such as "<a" is also the start of the page's own links). Equal names stay equal, so
        // the summary points at the same layers, and each keeps its count of backquotes, which
        // the page's sentences take as the bounds of code (a name with one breaks its span).
        let mut plain_names = std::collections::HashMap::new();
        let mut plain_name = |name: &String| {
            let next = format!("n{}{}", plain_names.len(), "`".repeat(name.matches('`').count()));
            plain_names.entry(name.clone()).or_insert(next).clone()
        };
        let plain_layers: Vec<(String, Vec<(f32, f32)>)> =
            layers.iter().map(|(name, pairs)| (plain_name(name), pairs.clone())).collect();
        let plain = report(plain_layers, plain_name(&model));
        let report = report(layers, model);
        let names: Vec<&str> = report.layers.iter().map(|l| l.name.as_str()).collect();

        let json: serde_json::Value = serde_json::from_str(&super::to_json(&report)).unwrap();
        let read: Vec<&str> = json["layers"].as_array().unwrap().iter()
            .map(|l| l["name"].as_str().unwrap()).collect();
        prop_assert_eq!(&read, &names);
        prop_assert_eq!(json["model"].as_str(), Some(report.model.as_str()));

        let pages = |r: &Report| [super::to_html(r), super::to_svg(r, false)];
        for (page, own) in pages(&report).iter().zip(pages(&plain).iter()) {
            for name in names.iter().chain([&report.model.as_str()]) {
                // a tag in a name must reach the page as text, never as markup
                let tag = name.split('<').skip(1).any(|rest| {
                    rest.starts_with(|c: char| c.is_ascii_alphabetic() || c == '/')
                });
                if tag {
                    prop_assert!(
                        page.matches(name).count() <= own.matches(name).count(),
                        "unescaped {:?}", name
                    );
                }
            }
        }

        // each table's rows (runs of lines that start with `|`) have its header's cells
        let markdown = super::to_markdown(&report);
        let cells = |row: &str| row.replace("\\|", "").matches('|').count();
        let mut header: Option<&str> = None;
        for line in markdown.lines() {
            if !line.starts_with('|') {
                header = None;
                continue;
            }
            let first = *header.get_or_insert(line);
            prop_assert_eq!(cells(line), cells(first), "{}", line);
        }
        let _ = super::to_text(&report);
        let _ = super::to_node_data(&report);
    }
}
