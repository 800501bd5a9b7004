//! Deterministic JSON: two-space indent, keys in model order, floats in shortest round-trip
//! scientific notation (`9.5367431640625e-6`, `0e0`), non-finite floats as the strings
//! `"inf"`, `"-inf"`, `"nan"`. The same report gives the same bytes on any machine.

use std::io;

use serde::{Deserialize, Serialize};
use serde_json::ser::{Formatter, PrettyFormatter};

/// Formats a float the way reports write it: shortest round-trip digits, scientific notation.
pub fn format_float(value: f64) -> String {
    if value.is_nan() {
        "\"nan\"".to_string()
    } else if value.is_infinite() {
        if value > 0.0 {
            "\"inf\"".to_string()
        } else {
            "\"-inf\"".to_string()
        }
    } else {
        format!("{value:e}")
    }
}

/// `serialize_with` for every float field of the report model: serde_json writes non-finite
/// floats as `null` before a formatter sees them, so they become the documented strings here.
pub fn float<S: serde::Serializer>(value: &f64, s: S) -> Result<S::Ok, S::Error> {
    if value.is_nan() {
        s.serialize_str("nan")
    } else if value.is_infinite() {
        s.serialize_str(if *value > 0.0 { "inf" } else { "-inf" })
    } else {
        s.serialize_f64(*value)
    }
}

/// `deserialize_with` for floats written by [`float`]: a number, or `"inf"`, `"-inf"`, `"nan"`.
pub fn float_from<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    #[derive(serde::Deserialize)]
    #[serde(untagged)]
    enum Written {
        Number(f64),
        Text(String),
    }
    match Written::deserialize(d)? {
        Written::Number(v) => Ok(v),
        Written::Text(t) => match t.as_str() {
            "inf" => Ok(f64::INFINITY),
            "-inf" => Ok(f64::NEG_INFINITY),
            "nan" => Ok(f64::NAN),
            other => Err(serde::de::Error::custom(format!("not a float: `{other}`"))),
        },
    }
}

/// `serialize_with` for optional floats: `null` when absent, else as [`float`].
pub fn float_opt<S: serde::Serializer>(value: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
    match value {
        Some(v) => float(v, s),
        None => s.serialize_none(),
    }
}

/// Renders any serialisable value (a report, or one `Stats`) as deterministic JSON, newline-terminated.
pub fn to_json_value<T: Serialize>(value: &T) -> String {
    let mut out = Vec::new();
    let mut ser =
        serde_json::Serializer::with_formatter(&mut out, ReportFormatter(PrettyFormatter::new()));
    value
        .serialize(&mut ser)
        .expect("report types always serialise");
    out.push(b'\n');
    String::from_utf8(out).expect("serde_json writes UTF-8")
}

/// Renders a report as deterministic JSON.
pub fn to_json(report: &crate::Report) -> String {
    to_json_value(report)
}

struct ReportFormatter(PrettyFormatter<'static>);

impl Formatter for ReportFormatter {
    fn write_f64<W: ?Sized + io::Write>(&mut self, w: &mut W, value: f64) -> io::Result<()> {
        w.write_all(format_float(value).as_bytes())
    }
    fn write_f32<W: ?Sized + io::Write>(&mut self, w: &mut W, value: f32) -> io::Result<()> {
        self.write_f64(w, f64::from(value))
    }
    fn begin_array<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.begin_array(w)
    }
    fn end_array<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.end_array(w)
    }
    fn begin_array_value<W: ?Sized + io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> io::Result<()> {
        self.0.begin_array_value(w, first)
    }
    fn end_array_value<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.end_array_value(w)
    }
    fn begin_object<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.begin_object(w)
    }
    fn end_object<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.end_object(w)
    }
    fn begin_object_key<W: ?Sized + io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> io::Result<()> {
        self.0.begin_object_key(w, first)
    }
    fn begin_object_value<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.begin_object_value(w)
    }
    fn end_object_value<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.end_object_value(w)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_are_shortest_scientific_and_non_finite_are_strings() {
        assert_eq!(format_float(9.5367431640625e-6), "9.5367431640625e-6");
        assert_eq!(format_float(0.0), "0e0");
        assert_eq!(format_float(1e-4), "1e-4");
        assert_eq!(format_float(-1234.5), "-1.2345e3");
        assert_eq!(format_float(f64::INFINITY), "\"inf\"");
        assert_eq!(format_float(f64::NAN), "\"nan\"");
    }
}
