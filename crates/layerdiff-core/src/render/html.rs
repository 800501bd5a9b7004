//! HTML: one self-contained page (no network, no external file) opened by a double click: the
//! summary, the error chart, a sortable and filterable per-layer table with each layer's ONNX
//! node, and the causes with their details.

use std::fmt::Write;

use crate::{Layer, Report};

use super::chart::to_svg;
use super::html_escape as escape;
use super::text::verdict;

mod table;
use table::table;

/// Escapes text and sets its `backquoted` spans as code.
fn prose(text: &str) -> String {
    escape(text)
        .split('`')
        .enumerate()
        .map(|(i, part)| {
            if i % 2 == 1 {
                format!("<code>{part}</code>")
            } else {
                part.to_string()
            }
        })
        .collect()
}

const STYLE: &str = "body{font:14px/1.45 system-ui,sans-serif;margin:1.5em 2em;color:#222}\
h1{font-size:1.5em;margin:0 0 .3em}h2{font-size:1.15em;margin:1.6em 0 .4em}\
.verdict{font-size:1.1em;padding:.5em .8em;border-radius:4px;display:inline-block}\
.verdict.drift{background:#fde0dc}.verdict.clean{background:#e3f4e3}.verdict.inconclusive{background:#fff3cd}\
.verdict.precision{background:#e8eefb}\
.warning{background:#fff3cd;padding:.3em .6em;margin:.3em 0}\
dl{display:grid;grid-template-columns:max-content auto;gap:.15em 1em;margin:.6em 0}dt{color:#555}dd{margin:0}\
code{font-size:92%}svg{max-width:100%;height:auto}\
.controls{margin:.5em 0}.controls input{width:22em;padding:2px 4px}\
table{border-collapse:collapse;font-size:12.5px}\
th,td{border-bottom:1px solid #e2e2e2;padding:2px 7px;text-align:right;white-space:nowrap}\
th{position:sticky;top:0;background:#f4f4f4;cursor:pointer;user-select:none;text-align:center}\
th.asc:after{content:' \\25B2'}th.desc:after{content:' \\25BC'}\
td.t{text-align:left;font-family:ui-monospace,monospace}\
tr.exceeds td{background:#fdecea}tr.origin td{background:#f8c9c4;font-weight:bold}\
tr.unmapped td{color:#999}tr:target td{outline:2px solid #1565c0}\
.cause{font-weight:bold}";

/// Sorting (click a column head; again to reverse) and filtering (text over the name, type, ONNX
/// node and cause; a choice of rows). Numbers sort by their `data-v`; empty cells go last.
const SCRIPT: &str = r#"(function () {
  var table = document.getElementById('layers');
  var body = table.tBodies[0];
  var heads = table.tHead.rows[0].cells;
  function key(row, i) {
    var cell = row.cells[i];
    var v = cell.getAttribute('data-v');
    if (v === null) return cell.textContent.trim().toLowerCase();
    return v === '' ? null : Number(v);
  }
  Array.prototype.forEach.call(heads, function (th, i) {
    th.addEventListener('click', function () {
      var desc = th.classList.contains('asc');
      Array.prototype.forEach.call(heads, function (h) { h.classList.remove('asc', 'desc'); });
      th.classList.add(desc ? 'desc' : 'asc');
      var rows = Array.prototype.slice.call(body.rows);
      rows.sort(function (a, b) {
        var x = key(a, i), y = key(b, i);
        if (x === null || y === null) return (x === null) - (y === null);
        var c = x < y ? -1 : x > y ? 1 : 0;
        return desc ? -c : c;
      });
      rows.forEach(function (r) { body.appendChild(r); });
    });
  });
  var text = document.getElementById('filter');
  var which = document.getElementById('which');
  function filter() {
    var q = text.value.trim().toLowerCase();
    var w = which.value;
    var shown = 0;
    Array.prototype.forEach.call(body.rows, function (r) {
      var ok = (!q || r.getAttribute('data-search').indexOf(q) >= 0) &&
        (w === 'all' || r.classList.contains(w));
      r.hidden = !ok;
      if (ok) shown += 1;
    });
    document.getElementById('shown').textContent = shown + ' of ' + body.rows.length + ' layers';
  }
  text.addEventListener('input', filter);
  which.addEventListener('change', filter);
  filter();
})();"#;

/// Renders a report as one self-contained HTML page.
pub fn to_html(report: &Report) -> String {
    let s = &report.summary;
    let mut out = String::new();
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">\n<title>{}layerdiff: {}</title>\n<style>{STYLE}</style></head><body>\n",
        super::text::incomplete_mark(report),
        escape(&report.model)
    );
    let _ = writeln!(
        out,
        "<h1>{}layerdiff: <code>{}</code></h1>",
        super::text::incomplete_mark(report),
        escape(&report.model)
    );
    let class = match s.verdict {
        crate::Verdict::Defect | crate::Verdict::Undecided => "drift",
        crate::Verdict::Precision => "precision",
        crate::Verdict::Inconclusive => "inconclusive",
        crate::Verdict::NoDrift => "clean",
    };
    let _ = writeln!(
        out,
        "<p class=\"verdict {class}\" id=\"verdict\">{}</p>",
        prose(&verdict(report))
    );
    if let Some(incomplete) = &s.incomplete {
        let _ = writeln!(
            out,
            "<p class=\"warning\" id=\"incomplete\"><strong>Incomplete:</strong> {}</p>",
            prose(incomplete)
        );
    }
    for warning in &s.warnings {
        let _ = writeln!(out, "<p class=\"warning\">Warning: {}</p>", prose(warning));
    }
    out.push_str(&facts(report));
    let _ = writeln!(out, "<h2>Error per layer</h2>\n<figure id=\"chart\">");
    out.push_str(&to_svg(report, true));
    let _ = writeln!(
        out,
        "<figcaption>Each layer's largest error divided by its tolerance (above the red line: exceeding), in execution order; click a point for its row.</figcaption></figure>"
    );
    out.push_str(&defects(report));
    out.push_str(&causes(report));
    out.push_str(&keep(report));
    out.push_str(&bisected(report));
    out.push_str(&across_modules(report));
    out.push_str(&opaque(report));
    out.push_str(&table(report));
    let _ = writeln!(out, "<script>{SCRIPT}</script>\n</body></html>");
    out
}

/// The sides, truth, machine, tolerance, inputs and counts.
fn facts(report: &Report) -> String {
    let s = &report.summary;
    let mut rows: Vec<(&str, String)> = Vec::new();
    let side = |info: &crate::SideInfo| format!("{} ({})", info.runtime, info.detail);
    rows.push(("reference", side(&report.reference)));
    rows.push(("target", side(&report.target)));
    if let Some(placement) = report.target.placement_text() {
        rows.push(("target placement", placement));
    }
    if let Some(graph) = &report.target_graph {
        rows.push(("target graph", graph.describe()));
    }
    if let Some(truth) = &report.truth {
        rows.push(("float64 truth", side(truth)));
    }
    rows.push(("tolerance", report.tolerance.describe()));
    rows.push((
        "error measured",
        if report.mode == "local" {
            "accumulated and local (each layer re-run on the reference's inputs)".to_string()
        } else {
            "accumulated only".to_string()
        },
    ));
    rows.push((
        "layers",
        format!(
            "{} in all, {} compared, {} without a counterpart{}; {} exceeding accumulated, {} locally",
            s.layers_total,
            s.layers_compared,
            s.layers_unmapped,
            super::not_run(s),
            s.layers_exceeding,
            s.layers_exceeding_locally
        ),
    ));
    if let Some(ranked) = s.own_error_text() {
        rows.push(("most error of their own", ranked));
    }
    if let Some(inputs) = report.inputs_words() {
        rows.push(("inputs", inputs));
    }
    rows.push(("machine", report.machine.describe()));
    let mut out = String::from("<dl>\n");
    for (name, value) in rows {
        let _ = writeln!(out, "<dt>{name}</dt><dd>{}</dd>", prose(&value));
    }
    out.push_str("</dl>\n");
    out
}

/// The defects, most severe first, each with what fixes it; then the precision drift in one line.
fn defects(report: &Report) -> String {
    let s = &report.summary;
    let mut out = String::new();
    if !s.defects.is_empty() {
        out.push_str("<h2>Defects</h2>\n<ol id=\"defects\">\n");
        for d in &s.defects {
            let index = report.layers.iter().position(|l| l.name == d.layer);
            let _ = writeln!(
                out,
                "<li><a href=\"#layer-{}\"><code>{}</code></a>: <span class=\"cause\">{}</span>: {}<br><b>Fix:</b> {}</li>",
                index.unwrap_or_default(),
                escape(&d.layer),
                escape(d.cause.name()),
                prose(&d.detail),
                prose(&d.fix)
            );
        }
        out.push_str("</ol>\n");
    }
    if !s.narrow_accumulation.is_empty() {
        out.push_str("<h2>Narrow accumulation</h2>\n<ol id=\"narrow\">\n");
        for k in &s.narrow_accumulation {
            let index = report.layers.iter().position(|l| l.name == k.layer);
            let _ = writeln!(
                out,
                "<li><a href=\"#layer-{}\"><code>{}</code></a>: {}<br><b>Fix:</b> {}</li>",
                index.unwrap_or_default(),
                escape(&k.layer),
                prose(&super::text::narrow_words(k)),
                prose(&k.fix)
            );
        }
        out.push_str("</ol>\n");
    }
    if !s.approximations.is_empty() {
        out.push_str("<h2>Approximations</h2>\n<ol id=\"approximations\">\n");
        for a in &s.approximations {
            let index = report.layers.iter().position(|l| l.name == a.layer);
            let _ = writeln!(
                out,
                "<li><a href=\"#layer-{}\"><code>{}</code></a>: {}<br><b>Fix:</b> {}</li>",
                index.unwrap_or_default(),
                escape(&a.layer),
                prose(&super::text::approximation_words(a)),
                prose(&a.fix)
            );
        }
        out.push_str("</ol>\n");
    }
    if let Some(p) = &s.precision {
        let _ = writeln!(
            out,
            "<p id=\"precision\"><b>Precision:</b> {}.</p>",
            prose(&super::text::precision_words(p, s.layers_compared))
        );
    }
    out
}

/// The layers with a cause, each with its details; those that only inherited their error
/// folded away under one line.
fn causes(report: &Report) -> String {
    let (inherited, own): (Vec<&Layer>, Vec<&Layer>) = report
        .layers
        .iter()
        .filter(|l| l.cause.is_some())
        .partition(|l| l.cause == Some(crate::Cause::Inherited));
    if inherited.is_empty() && own.is_empty() {
        return String::new();
    }
    let mut out = String::from("<h2>Causes</h2>\n<ul id=\"causes\">\n");
    for group in super::alike::causes(own) {
        out.push_str(&cause_item(&group));
    }
    out.push_str("</ul>\n");
    if !inherited.is_empty() {
        let _ = writeln!(
            out,
            "<details><summary>{} exceeding layer(s) only inherited their error from upstream</summary><ul>",
            inherited.len()
        );
        for group in super::alike::causes(inherited) {
            out.push_str(&cause_item(&group));
        }
        out.push_str("</ul></details>\n");
    }
    out
}

/// A cause said once for the first layer of `group`, the others it applies to linked after it.
fn cause_item(group: &[&Layer]) -> String {
    let l = group[0];
    let permutation = l
        .permutation
        .as_ref()
        .map(|p| format!(" {p:?}"))
        .unwrap_or_default();
    let others: Vec<String> = group[1..].iter().map(|o| o.name.clone()).collect();
    let tail = if others.is_empty() {
        String::new()
    } else {
        let link = |name: &str| {
            let index = group.iter().find(|o| o.name == name).map_or(0, |o| o.index);
            format!(
                "<a href=\"#layer-{index}\"><code>{}</code></a>",
                escape(name)
            )
        };
        format!(
            "<br><span class=\"alike\">{}</span>",
            super::alike::others_words(&others, link)
        )
    };
    format!(
        "<li><a href=\"#layer-{}\"><code>{}</code></a>: <span class=\"cause\">{}</span>{}: {}{tail}</li>\n",
        l.index,
        escape(&l.name),
        escape(l.cause.map_or("", crate::Cause::name)),
        escape(&permutation),
        prose(l.detail.as_deref().unwrap_or_default())
    )
}

/// The keep-in-float32 advice and its check.
fn keep(report: &Report) -> String {
    let Some(keep) = &report.keep_float32 else {
        return String::new();
    };
    let mut out = format!(
        "<h2>Keep in float32</h2>\n<p>{}:</p>\n<ol id=\"keep\">\n",
        escape(&keep.heading())
    );
    for k in &keep.layers {
        let index = report.layers.iter().position(|l| l.name == k.layer);
        let name = match index {
            Some(i) => format!(
                "<a href=\"#layer-{i}\"><code>{}</code></a>",
                escape(&k.layer)
            ),
            None => format!("<code>{}</code>", escape(&k.layer)),
        };
        let nodes = if k.nodes.is_empty() {
            String::new()
        } else {
            format!(" (ONNX nodes: {})", escape(&k.nodes.join(", ")))
        };
        let _ = writeln!(out, "<li>{name}: {}{nodes}</li>", prose(&k.why));
    }
    out.push_str("</ol>\n");
    if let Some(check) = &keep.check {
        let _ = writeln!(
            out,
            "<p id=\"advice-check\"><b>Checked</b> by re-running with them kept: {}.</p>",
            prose(&check.verdict)
        );
    }
    out
}

/// How an opaque target was searched, when it was.
fn opaque(report: &Report) -> String {
    report.opaque.as_ref().map_or_else(String::new, |o| {
        format!(
            "<h2>How the opaque target was searched</h2>\n<p id=\"opaque\">{}.</p>\n",
            prose(&o.sentence())
        )
    })
}

/// What turns the difference on, when it was bisected.
fn bisected(report: &Report) -> String {
    report.bisection.as_ref().map_or_else(String::new, |b| {
        format!(
            "<h2>What turns it on</h2>\n<p id=\"bisection\">Bisected by halves, each candidate set run, the answer checked by a run of its own: {}.</p>\n",
            prose(&b.sentence())
        )
    })
}

/// The whole model compiled at once, and the module the search narrowed its difference to.
fn across_modules(report: &Report) -> String {
    report.compiled_whole.as_ref().map_or_else(String::new, |w| {
        format!(
            "<h2>Across modules</h2>\n<p id=\"compiled-whole\">The layers above were compiled one leaf at a time; {}.</p>\n",
            prose(&w.sentence())
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_from_models_cannot_inject_markup() {
        assert_eq!(
            escape("<script>\"a\" & b</script>"),
            "&lt;script&gt;&quot;a&quot; &amp; b&lt;/script&gt;"
        );
        assert_eq!(
            prose("born at `conv<1>` here"),
            "born at <code>conv&lt;1&gt;</code> here"
        );
    }
}
