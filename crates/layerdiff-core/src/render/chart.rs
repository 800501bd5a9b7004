//! The error chart: each layer's accumulated and local error as a multiple of its own tolerance,
//! on a log scale, in execution order, with the tolerance line and the drift origin marked. One
//! standalone SVG, the same inside the HTML report and on its own for READMEs and issues.

use std::fmt::Write;

use crate::{DEFECT_MARGIN, Finding, Layer, Report, Stats};

use super::html_escape as escape;

const WIDTH: f64 = 960.0;
const HEIGHT: f64 = 340.0;
const LEFT: f64 = 64.0;
const RIGHT: f64 = 16.0;
const TOP: f64 = 34.0;
const BOTTOM: f64 = 46.0;
/// The space between the error panel and the precision panel under it (its legend sits there).
const GAP: f64 = 28.0;
/// The precision panel's height.
const OWN_HEIGHT: f64 = 150.0;
/// The lowest decade drawn: errors below it (and exact zeros) sit on the floor.
const FLOOR_DECADE: i32 = -6;

/// The error of a comparison as a multiple of the layer's tolerance (above 1: exceeding);
/// `None` where the comparison was not judged against a bound.
fn ratio(stats: Option<&Stats>) -> Option<f64> {
    stats?.tolerance_multiple()
}

/// The decades the y axis spans: from the smallest error drawn (at least [`FLOOR_DECADE`]) to
/// the largest (at least 10× the tolerance).
fn decades(layers: &[Layer]) -> (i32, i32) {
    let ratios: Vec<f64> = layers
        .iter()
        .flat_map(|l| [ratio(l.accumulated.as_ref()), ratio(l.local.as_ref())])
        .flatten()
        .filter(|r| r.is_finite() && *r > 0.0)
        .collect();
    let lo = ratios.iter().copied().fold(0.01, f64::min);
    let hi = ratios.iter().copied().fold(10.0, f64::max);
    (
        (lo.log10().floor() as i32).max(FLOOR_DECADE),
        (hi.log10().ceil() as i32).min(300),
    )
}

/// One plot of multiples on a log scale: its place on the page and the decades it spans.
struct Panel {
    top: f64,
    height: f64,
    lo: i32,
    hi: i32,
}

impl Panel {
    /// The panel's y for a multiple: infinite ones at the top, zeros on the floor.
    fn y(&self, r: f64) -> f64 {
        let v = if r.is_infinite() {
            self.hi as f64
        } else if r <= 0.0 {
            self.lo as f64
        } else {
            r.log10().clamp(self.lo as f64, self.hi as f64)
        };
        self.top + self.height * (self.hi as f64 - v) / (self.hi - self.lo) as f64
    }

    /// Decade grid lines and labels, the line a point must stay under drawn strong at `line`
    /// with its label, and the y axis's title.
    fn grid(&self, out: &mut String, line: f64, line_label: &str, title: &str) {
        for d in self.lo..=self.hi {
            let yy = self.y(10f64.powi(d));
            let _ = writeln!(
                out,
                "<line x1=\"{LEFT}\" x2=\"{:.1}\" y1=\"{yy:.1}\" y2=\"{yy:.1}\" stroke=\"#e4e4e4\"/>\
                 <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\" fill=\"#555\">{}</text>",
                WIDTH - RIGHT,
                LEFT - 6.0,
                yy + 4.0,
                decade_label(d, self.lo)
            );
        }
        let yy = self.y(line);
        let _ = writeln!(
            out,
            "<line x1=\"{LEFT}\" x2=\"{:.1}\" y1=\"{yy:.1}\" y2=\"{yy:.1}\" stroke=\"#c62828\" stroke-width=\"1.5\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\" fill=\"#c62828\">{line_label}</text>",
            WIDTH - RIGHT,
            WIDTH - RIGHT - 4.0,
            yy - 4.0
        );
        let _ = writeln!(
            out,
            "<text transform=\"translate(14 {:.1}) rotate(-90)\" text-anchor=\"middle\" fill=\"#333\">{title}</text>",
            self.top + self.height / 2.0
        );
    }
}

/// Each layer's own error as a multiple of what its precision explains (the same-precision
/// baseline); `None` where no baseline was measured.
fn own_multiple(l: &Layer) -> Option<f64> {
    l.baseline.as_ref().map(|b| b.multiple)
}

/// The decades the precision panel spans: from the smallest multiple drawn (at least 1e-3) to
/// the largest (at least 10×, so the defect line sits inside).
fn own_decades(layers: &[Layer]) -> (i32, i32) {
    let multiples: Vec<f64> = layers
        .iter()
        .filter_map(own_multiple)
        .filter(|r| r.is_finite() && *r > 0.0)
        .collect();
    let lo = multiples.iter().copied().fold(0.1, f64::min);
    let hi = multiples.iter().copied().fold(10.0, f64::max);
    (
        (lo.log10().floor() as i32).max(-3),
        (hi.log10().ceil() as i32).min(300),
    )
}

/// A point's colour on the precision panel: red for a defect; amber beyond the line where the
/// report explains it otherwise (a kernel within the narrow-accumulating ideal, a quantization,
/// a file the runtime computes as written: its cause says which); green within.
fn own_fill(beyond: bool, finding: Option<Finding>) -> &'static str {
    match (beyond, finding) {
        (_, Some(Finding::Defect)) => "#c62828",
        (true, _) => "#f9a825",
        (false, _) => "#2e7d32",
    }
}

/// Renders the chart as a standalone SVG. With `links`, each point links to its row of the
/// HTML report's table (`#layer-N`). Where layers were held to the same-precision baseline, a
/// second panel under the first plots each one's own error as a multiple of what its precision
/// explains, with the defect line: a run of honest rounding sits under it however far its
/// errors pass the tolerance above.
pub fn to_svg(report: &Report, links: bool) -> String {
    let chart = Chart::of(&report.layers);
    let mut out = String::new();
    chart.frame(&mut out, report);
    chart.origin(&mut out, report);
    chart.accumulated_line(&mut out);
    chart.points(&mut out, links);
    chart.legend(&mut out);
    out.push_str("</svg>\n");
    out
}

/// The chart's geometry: its layers, the error panel, the own-error panel where layers were
/// held to a baseline, and where the plot ends.
struct Chart<'a> {
    layers: &'a [Layer],
    plot_w: f64,
    error: Panel,
    own: Option<Panel>,
    height: f64,
    bottom: f64,
}

impl<'a> Chart<'a> {
    fn of(layers: &'a [Layer]) -> Self {
        let (lo, hi) = decades(layers);
        let error = Panel {
            top: TOP,
            height: HEIGHT - TOP - BOTTOM,
            lo,
            hi,
        };
        let own = layers.iter().any(|l| own_multiple(l).is_some()).then(|| {
            let (lo, hi) = own_decades(layers);
            Panel {
                top: HEIGHT - BOTTOM + GAP,
                height: OWN_HEIGHT,
                lo,
                hi,
            }
        });
        let height = own.as_ref().map_or(HEIGHT, |p| p.top + p.height + BOTTOM);
        let bottom = own
            .as_ref()
            .map_or(error.top + error.height, |p| p.top + p.height);
        Self {
            layers,
            plot_w: WIDTH - LEFT - RIGHT,
            error,
            own,
            height,
            bottom,
        }
    }

    /// The x of layer `i`.
    fn x(&self, i: usize) -> f64 {
        LEFT + self.plot_w * (i as f64 + 0.5) / self.layers.len().max(1) as f64
    }

    /// The SVG's head, title, background, both panels' grids and the layer axis.
    fn frame(&self, out: &mut String, report: &Report) {
        let h = self.height;
        let _ = writeln!(
            out,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {WIDTH} {h}\" width=\"{WIDTH}\" height=\"{h}\" font-family=\"system-ui,sans-serif\" font-size=\"11\" role=\"img\" aria-label=\"error per layer against tolerance\">"
        );
        let _ = writeln!(
            out,
            "<title>{}: each layer's error as a multiple of its tolerance{}</title>",
            escape(&report.model),
            if self.own.is_some() {
                ", and its own error as a multiple of what its precision explains"
            } else {
                ""
            }
        );
        let _ = writeln!(
            out,
            "<rect x=\"0\" y=\"0\" width=\"{WIDTH}\" height=\"{h}\" fill=\"#fff\"/>"
        );
        self.error
            .grid(out, 1.0, "tolerance", "max error ÷ tolerance");
        if let Some(own) = &self.own {
            own.grid(
                out,
                DEFECT_MARGIN,
                &format!("defect above {DEFECT_MARGIN}×"),
                "own error ÷ precision's",
            );
        }
        let _ = writeln!(
            out,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" fill=\"#333\">layers in execution order ({} in all)</text>",
            LEFT + self.plot_w / 2.0,
            self.height - 8.0,
            self.layers.len()
        );
        for i in axis_ticks(self.layers.len()) {
            let _ = writeln!(
                out,
                "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" fill=\"#555\">{i}</text>",
                self.x(i),
                self.bottom + 16.0
            );
        }
    }

    /// The drift origin, where it is known.
    fn origin(&self, out: &mut String, report: &Report) {
        let b = self.bottom;
        if let Some(origin) = report
            .summary
            .drift_origin
            .as_ref()
            .and_then(|o| self.layers.iter().find(|l| &l.name == o))
        {
            let xx = self.x(origin.index);
            let anchor = if xx > LEFT + self.plot_w * 0.7 {
                "end"
            } else {
                "start"
            };
            let _ = writeln!(
                out,
                "<line class=\"origin\" x1=\"{xx:.1}\" x2=\"{xx:.1}\" y1=\"{TOP}\" y2=\"{b:.1}\" stroke=\"#c62828\" stroke-dasharray=\"4 3\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"{anchor}\" fill=\"#c62828\" font-weight=\"bold\">drift born at {}</text>",
                if anchor == "end" { xx - 4.0 } else { xx + 4.0 },
                TOP - 8.0,
                escape(&origin.name)
            );
        }
    }

    /// Accumulated error: a line through the compared layers, broken where a layer has none.
    fn accumulated_line(&self, out: &mut String) {
        let mut path = String::new();
        let mut pen_down = false;
        for l in self.layers {
            match ratio(l.accumulated.as_ref()) {
                Some(r) => {
                    let _ = write!(
                        path,
                        "{}{:.1} {:.1} ",
                        if pen_down { "L" } else { "M" },
                        self.x(l.index),
                        self.error.y(r)
                    );
                    pen_down = true;
                }
                None => pen_down = false,
            }
        }
        let _ = writeln!(
            out,
            "<path d=\"{}\" fill=\"none\" stroke=\"#1565c0\" stroke-width=\"1.2\"/>",
            path.trim_end()
        );
    }

    /// Each layer's points: accumulated, local, and its own error's multiple.
    fn points(&self, out: &mut String, links: bool) {
        for l in self.layers {
            let acc = ratio(l.accumulated.as_ref());
            let local = ratio(l.local.as_ref());
            if acc.is_none() && local.is_none() {
                continue;
            }
            let tip = escape(&tooltip(l, acc, local));
            if links {
                let _ = write!(out, "<a href=\"#layer-{}\">", l.index);
            }
            let _ = write!(out, "<g class=\"point\"><title>{tip}</title>");
            if let Some(r) = acc {
                let fill = if l.exceeds_tol { "#c62828" } else { "#1565c0" };
                let _ = write!(
                    out,
                    "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"{fill}\"/>",
                    self.x(l.index),
                    self.error.y(r)
                );
            }
            if let Some(r) = local {
                let (cx, cy) = (self.x(l.index), self.error.y(r));
                let fill = if l.local_exceeds {
                    "#c62828"
                } else {
                    "#ef6c00"
                };
                let _ = write!(
                    out,
                    "<path d=\"M{:.1} {:.1}l3.5 3.5l-3.5 3.5l-3.5 -3.5z\" fill=\"{fill}\" fill-opacity=\"0.8\"/>",
                    cx,
                    cy - 3.5
                );
            }
            if let (Some(panel), Some(r)) = (&self.own, own_multiple(l)) {
                let beyond = l.baseline.as_ref().is_some_and(|b| b.beyond());
                let fill = own_fill(beyond, l.finding);
                let _ = write!(
                    out,
                    "<rect class=\"own\" x=\"{:.1}\" y=\"{:.1}\" width=\"6\" height=\"6\" fill=\"{fill}\"/>",
                    self.x(l.index) - 3.0,
                    panel.y(r) - 3.0
                );
            }
            out.push_str("</g>");
            if links {
                out.push_str("</a>");
            }
            out.push('\n');
        }
    }

    fn legend(&self, out: &mut String) {
        let lx = LEFT + 8.0;
        let _ = writeln!(
            out,
            "<g><circle cx=\"{lx}\" cy=\"12\" r=\"3\" fill=\"#1565c0\"/><text x=\"{:.1}\" y=\"16\">accumulated (both sides from the inputs)</text>\
         <path d=\"M{:.1} 8.5l3.5 3.5l-3.5 3.5l-3.5 -3.5z\" fill=\"#ef6c00\"/><text x=\"{:.1}\" y=\"16\">local (the layer alone, on the reference's inputs)</text>\
         <circle cx=\"{:.1}\" cy=\"12\" r=\"3\" fill=\"#c62828\"/><text x=\"{:.1}\" y=\"16\">exceeding</text></g>",
            lx + 8.0,
            lx + 248.0,
            lx + 256.0,
            lx + 548.0,
            lx + 556.0
        );
        if let Some(panel) = &self.own {
            let ly = panel.top - 12.0;
            let _ = writeln!(
                out,
                "<g><rect x=\"{:.1}\" y=\"{:.1}\" width=\"6\" height=\"6\" fill=\"#2e7d32\"/><text x=\"{:.1}\" y=\"{:.1}\">own error ÷ what an ideal implementation in the target's precision errs by (its rounding)</text>\
             <rect x=\"{:.1}\" y=\"{:.1}\" width=\"6\" height=\"6\" fill=\"#c62828\"/><text x=\"{:.1}\" y=\"{:.1}\">a defect</text>\
             <rect x=\"{:.1}\" y=\"{:.1}\" width=\"6\" height=\"6\" fill=\"#f9a825\"/><text x=\"{:.1}\" y=\"{:.1}\">beyond, explained otherwise</text></g>",
                lx - 3.0,
                ly - 7.0,
                lx + 8.0,
                ly,
                lx + 557.0,
                ly - 7.0,
                lx + 568.0,
                ly,
                lx + 627.0,
                ly - 7.0,
                lx + 638.0,
                ly
            );
        }
    }
}

/// A decade's label; the floor reads `≤` (zeros and smaller errors sit there).
fn decade_label(d: i32, lo: i32) -> String {
    let value = match d {
        0 => "1×".to_string(),
        1 => "10×".to_string(),
        _ => format!("1e{d}"),
    };
    if d == lo {
        format!("≤{value}")
    } else {
        value
    }
}

/// At most about ten evenly spaced layer indices for the x axis.
fn axis_ticks(n: usize) -> Vec<usize> {
    if n == 0 {
        return Vec::new();
    }
    let raw = (n as f64 / 10.0).max(1.0);
    let magnitude = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * magnitude)
        .find(|s| *s >= raw)
        .unwrap_or(raw) as usize;
    (0..n).step_by(step.max(1)).collect()
}

/// A point's tooltip: the layer and its figures.
fn tooltip(l: &Layer, acc: Option<f64>, local: Option<f64>) -> String {
    let mut text = format!("#{} {}", l.index, l.name);
    if let Some(kind) = &l.module_type {
        let _ = write!(text, " ({kind})");
    }
    if let (Some(r), Some(st)) = (acc, &l.accumulated) {
        let _ = write!(
            text,
            "\naccumulated: max abs diff {:.3e}, {r:.3}× tolerance",
            st.max_abs_diff
        );
    }
    if let (Some(r), Some(st)) = (local, &l.local) {
        let _ = write!(
            text,
            "\nlocal: max abs diff {:.3e}, {r:.3}× tolerance",
            st.max_abs_diff
        );
    }
    if let Some(cause) = &l.cause {
        let _ = write!(text, "\ncause: {cause}");
    }
    if let Some(b) = &l.baseline {
        let _ = write!(
            text,
            "\nown error: {:.2}× what {} explains",
            b.multiple, b.grid
        );
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_defect_is_red_on_the_precision_panel() {
        assert_eq!(own_fill(true, Some(Finding::Defect)), "#c62828");
        // narrow accumulation or a quantization: beyond the line, not a defect
        assert_eq!(own_fill(true, Some(Finding::Precision)), "#f9a825");
        assert_eq!(own_fill(false, Some(Finding::Precision)), "#2e7d32");
        assert_eq!(own_fill(false, None), "#2e7d32");
    }

    #[test]
    fn ticks_are_round_and_bounded() {
        assert_eq!(axis_ticks(0), Vec::<usize>::new());
        assert_eq!(axis_ticks(5), vec![0, 1, 2, 3, 4]);
        assert_eq!(axis_ticks(68), (0..68).step_by(10).collect::<Vec<_>>());
        assert_eq!(axis_ticks(250), vec![0, 50, 100, 150, 200]);
    }
}
