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
pub use json::{float, float_from, float_opt, format_float, to_json, to_json_value};
pub use markdown::to_markdown;
pub use node_data::to_node_data;
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
