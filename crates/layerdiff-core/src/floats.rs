//! How a report writes a float: shortest round-trip digits in scientific notation
//! (`9.5367431640625e-6`, `0e0`), non-finite floats as the strings `"inf"`, `"-inf"`, `"nan"`.
//! The report model's types name these in their serde attributes; the JSON renderer writes
//! every other float through [`format_float`].

use serde::Deserialize;

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
