//! Renderers: pure functions of a [`crate::Report`], one file per format.

mod alike;
mod chart;
mod html;
mod json;
mod markdown;
mod node_data;
#[cfg(test)]
mod properties;
mod text;

pub use chart::to_svg;
pub use html::to_html;
pub use json::{to_json, to_json_value};
pub use markdown::to_markdown;
pub use node_data::to_node_data;
pub(crate) use text::share_words;
pub use text::to_text;

/// Whether the target's layers are values of an ONNX file: the tables then name them so, and
/// a layer without one lacks "an ONNX counterpart".
/// `, 3 the target could not run` where the target lacks or crashed on nodes; else nothing.
pub(crate) fn not_run(summary: &crate::Summary) -> String {
    match summary.layers_not_run {
        0 => String::new(),
        n => format!(", {n} the target could not run"),
    }
}

pub(crate) fn onnx_located(report: &crate::Report) -> bool {
    report
        .layers
        .iter()
        .any(|l| l.location.as_ref().is_some_and(|loc| loc.kind == "onnx"))
}

/// Escapes text for HTML element content and double-quoted attributes (the HTML report, its
/// chart, and the other verbs' pages).
pub fn html_escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A multiple of a bound in words (`1.04×`, `25.3×`, `3.40e42×`): two decimals below 10, where
/// "1.0×" would hide which side of the bound it is on, one up to 10 000, then as a power of ten.
pub fn times(multiple: f64) -> String {
    if !multiple.is_finite() || multiple.abs() >= 1e4 {
        format!("{multiple:.2e}×")
    } else if multiple.abs() < 10.0 {
        format!("{multiple:.2}×")
    } else {
        format!("{multiple:.1}×")
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_multiple_reads_on_its_side_of_the_bound_and_short_when_huge() {
        assert_eq!(super::times(1.04), "1.04×");
        assert_eq!(super::times(0.996), "1.00×");
        assert_eq!(super::times(25.31), "25.3×");
        assert_eq!(super::times(3.4015e42), "3.40e42×");
    }
}
