//! JSON text parsed under a budget: the document's size is checked before parsing, and
//! the values are counted while the tree is built, so a document cannot make the parser
//! allocate more than a bounded multiple of [`Limits::max_json_values`] (serde_json's own
//! nesting limit of 128 bounds the depth).

use super::limits::{Limit, Limits};
use super::problem::Problem;
use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};
use std::cell::Cell;
use std::fmt;

/// Values the budget still allows.
struct Budget<'a> {
    left: &'a Cell<usize>,
    max: usize,
}

impl Budget<'_> {
    fn take<E: serde::de::Error>(&self) -> Result<(), E> {
        match self.left.get().checked_sub(1) {
            Some(n) => {
                self.left.set(n);
                Ok(())
            }
            None => Err(E::custom(format!(
                "the document holds more than {} JSON values, over the limit (max_json_values; raise it with {})",
                self.max,
                Limit::MaxJsonValues.flag()
            ))),
        }
    }

    fn again(&self) -> Budget<'_> {
        Budget {
            left: self.left,
            max: self.max,
        }
    }
}

impl<'de> DeserializeSeed<'de> for Budget<'_> {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Budget<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<Value, E> {
        self.take()?;
        Ok(Value::Bool(v))
    }

    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Value, E> {
        self.take()?;
        Ok(Value::Number(v.into()))
    }

    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Value, E> {
        self.take()?;
        Ok(Value::Number(v.into()))
    }

    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Value, E> {
        self.take()?;
        Ok(Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Value, E> {
        self.take()?;
        Ok(Value::String(v.to_string()))
    }

    fn visit_string<E: serde::de::Error>(self, v: String) -> Result<Value, E> {
        self.take()?;
        Ok(Value::String(v))
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<Value, E> {
        self.take()?;
        Ok(Value::Null)
    }

    fn visit_none<E: serde::de::Error>(self) -> Result<Value, E> {
        self.visit_unit()
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        self.take()?;
        let mut items = Vec::new();
        while let Some(v) = seq.next_element_seed(self.again())? {
            items.push(v);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        self.take()?;
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            let v = map.next_value_seed(self.again())?;
            out.insert(key, v);
        }
        Ok(Value::Object(out))
    }
}

/// Why a JSON text was not parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JsonError {
    /// It holds more values than allowed (the message names the limit and its flag).
    #[error("document too large: {0}")]
    TooLarge(String),
    /// It is not JSON: where it breaks, and why.
    #[error("malformed JSON at line {line}, column {column}: {message}")]
    Malformed {
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// serde_json's sentence.
        message: String,
    },
}

/// Parses JSON text into a tree of at most `max_values` values, counted while the tree is
/// built (so a text of a million numbers is refused before a million values exist); the
/// server parses request bodies with it, [`parse`] graph documents.
pub fn parse_values(text: &str, max_values: usize) -> Result<Value, JsonError> {
    let left = Cell::new(max_values);
    let mut de = serde_json::Deserializer::from_str(text);
    let parsed = Budget {
        left: &left,
        max: max_values,
    }
    .deserialize(&mut de)
    .and_then(|v| de.end().map(|()| v));
    parsed.map_err(|e| {
        if e.is_data() && left.get() == 0 {
            JsonError::TooLarge(e.to_string())
        } else {
            JsonError::Malformed {
                line: e.line(),
                column: e.column(),
                message: e.to_string(),
            }
        }
    })
}

/// Parses a graph file's text into JSON, refusing a text over
/// [`Limits::max_document_bytes`] before parsing and a tree of more than
/// [`Limits::max_json_values`] values while parsing. A malformed text is a problem at
/// its line and column.
pub fn parse(text: &str, limits: &Limits) -> Result<Value, Problem> {
    if text.len() > limits.max_document_bytes {
        return Err(Problem::at(
            "document",
            limits
                .error(
                    Limit::MaxDocumentBytes,
                    "the document",
                    "bytes",
                    u64::try_from(text.len()).ok(),
                )
                .to_string(),
        ));
    }
    parse_values(text, limits.max_json_values).map_err(|e| match e {
        JsonError::TooLarge(_) => Problem::at("document", e.to_string()),
        JsonError::Malformed {
            line,
            column,
            ref message,
        } => Problem::at(
            format!("line {line}, column {column}"),
            format!("malformed JSON: {message}"),
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_like_serde_json_and_counts_values() {
        let text = r#"{"a": [1, -2, 3.5, "x", null, true, {"b": []}]}"#;
        let limits = Limits::default();
        let v = parse(text, &limits).unwrap();
        assert_eq!(v, serde_json::from_str::<Value>(text).unwrap());
        // 1 object + 1 array + 7 items + 1 inner array = 10 values.
        let tight = Limits {
            max_json_values: 10,
            ..Limits::default()
        };
        assert!(parse(text, &tight).is_ok());
        let tighter = Limits {
            max_json_values: 9,
            ..Limits::default()
        };
        let e = parse(text, &tighter).unwrap_err();
        assert!(e.message.contains("max_json_values"), "{e}");
        assert!(e.message.contains("document too large"), "{e}");
    }

    #[test]
    fn refuses_long_texts_and_reports_malformed_ones_where_they_break() {
        let small = Limits {
            max_document_bytes: 4,
            ..Limits::default()
        };
        let e = parse("[1, 2, 3]", &small).unwrap_err();
        assert!(e.message.contains("max_document_bytes"), "{e}");
        let e = parse("{\n  \"a\": [,]}", &Limits::default()).unwrap_err();
        assert!(e.message.starts_with("malformed JSON"), "{e}");
        assert_eq!(e.field, "line 2, column 9");
        assert!(parse("[1] 2", &Limits::default()).is_err());
        let deep = "[".repeat(200) + &"]".repeat(200);
        assert!(
            parse(&deep, &Limits::default()).is_err(),
            "depth is bounded"
        );
    }
}
