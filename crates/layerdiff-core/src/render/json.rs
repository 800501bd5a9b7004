//! Deterministic JSON: two-space indent, keys in model order, floats in shortest round-trip
//! scientific notation (`9.5367431640625e-6`, `0e0`), non-finite floats as the strings
//! `"inf"`, `"-inf"`, `"nan"`. The same report gives the same bytes on any machine.

use std::io;

use serde::Serialize;

use crate::floats::format_float;
use serde_json::ser::{Formatter, PrettyFormatter};

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
