//! Attribute schemas and a reader that checks a node's attributes against them, collecting
//! every problem (unknown attribute, wrong type, missing required value).

use serde::Serialize;
use serde_json::{Map, Value};

/// The type of an attribute value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AttrKind {
    /// An integer.
    Int,
    /// A number.
    Float,
    /// `true` or `false`.
    Bool,
    /// A list of integers.
    Ints,
    /// A list of this many integers, one per spatial axis of a 2-D window (`pads`: one
    /// per side); a single integer stands for the same value in every entry
    /// (`kernel_size: 3` is `[3, 3]`).
    PerAxis(usize),
    /// A list of numbers.
    Floats,
    /// One of a fixed set of strings.
    Choice(&'static [&'static str]),
    /// Any string (a weight's key).
    Text,
}

/// One attribute of an operator: name, type, default and documentation.
#[derive(Debug, Clone, Serialize)]
pub struct AttrSpec {
    /// Attribute name as written in graph files.
    pub name: &'static str,
    /// Value type.
    pub kind: AttrKind,
    /// The default as JSON text, or `None` when the attribute is required.
    pub default: Option<&'static str>,
    /// One line of documentation for the editor's property panel.
    pub doc: &'static str,
}

/// Shorthand for a required attribute.
pub const fn required(name: &'static str, kind: AttrKind, doc: &'static str) -> AttrSpec {
    AttrSpec {
        name,
        kind,
        default: None,
        doc,
    }
}

/// Shorthand for an optional attribute with a default (JSON text; `"null"` = absent).
pub const fn optional(
    name: &'static str,
    kind: AttrKind,
    default: &'static str,
    doc: &'static str,
) -> AttrSpec {
    AttrSpec {
        name,
        kind,
        default: Some(default),
        doc,
    }
}

/// A [`AttrKind::PerAxis`] value of `len` entries as its list: a single integer repeated
/// `len` times, a list of integers as written (its length is the operator's to check);
/// `None` for anything else. The one reading of the shorthand, shared by the reader and
/// the ONNX exporter.
pub fn per_axis_list(value: &Value, len: usize) -> Option<Vec<i64>> {
    match value {
        Value::Array(items) => items.iter().map(Value::as_i64).collect(),
        v => v.as_i64().map(|i| vec![i; len]),
    }
}

/// Largest size an attribute may give (a dimension, a channel or feature count): 2^31 − 1,
/// which `usize` holds on every target (wasm32 included) and WGSL's `i32` too. The
/// graph's limits refine it when the graph is built.
pub const MAX_SIZE: i64 = i32::MAX as i64;

/// Reads attributes of one node, recording problems as (attribute, message) pairs.
pub struct AttrReader<'a> {
    attrs: &'a Map<String, Value>,
    schema: &'static [AttrSpec],
    /// Problems found so far: (attribute name, message).
    pub problems: Vec<(String, String)>,
}

impl<'a> AttrReader<'a> {
    /// Starts reading; unknown attributes are reported at once.
    pub fn new(attrs: &'a Map<String, Value>, schema: &'static [AttrSpec]) -> Self {
        let mut problems = Vec::new();
        for key in attrs.keys() {
            if !schema.iter().any(|s| s.name == key) {
                let known: Vec<&str> = schema.iter().map(|s| s.name).collect();
                problems.push((
                    key.clone(),
                    if known.is_empty() {
                        format!("unknown attribute '{key}' (this operator takes none)")
                    } else {
                        format!("unknown attribute '{key}' (known: {})", known.join(", "))
                    },
                ));
            }
        }
        AttrReader {
            attrs,
            schema,
            problems,
        }
    }

    fn value(&mut self, name: &str) -> Option<Value> {
        if let Some(v) = self.attrs.get(name).filter(|v| !v.is_null()) {
            return Some(v.clone());
        }
        let spec = self.schema.iter().find(|s| s.name == name)?;
        match spec.default {
            Some(text) => serde_json::from_str::<Value>(text)
                .ok()
                .filter(|v| !v.is_null()),
            None => {
                self.problems.push((
                    name.to_string(),
                    format!("required attribute '{name}' is missing"),
                ));
                None
            }
        }
    }

    fn bad(&mut self, name: &str, expected: &str, got: &Value) {
        self.problems.push((
            name.to_string(),
            format!("attribute '{name}' must be {expected}, not {got}"),
        ));
    }

    /// An optional integer (absent when the schema default is `null`).
    pub fn opt_int(&mut self, name: &str) -> Option<i64> {
        let v = self.value(name)?;
        match v.as_i64() {
            Some(i) => Some(i),
            None => {
                self.bad(name, "an integer", &v);
                None
            }
        }
    }

    /// An integer (0 when missing or wrong; the problem is recorded).
    pub fn int(&mut self, name: &str) -> i64 {
        self.opt_int(name).unwrap_or(0)
    }

    /// A size in `min..=`[`MAX_SIZE`] (`min` when missing or out of range; the problem is
    /// recorded).
    pub fn size(&mut self, name: &str, min: i64) -> usize {
        let fallback = usize::try_from(min.max(1)).unwrap_or(1);
        let Some(v) = self.opt_int(name) else {
            return fallback;
        };
        if v < min {
            self.reject(name, format!("{name} must be at least {min}, got {v}"));
        } else if v > MAX_SIZE {
            self.reject(name, format!("{name} must be at most {MAX_SIZE}, got {v}"));
        } else if let Ok(n) = usize::try_from(v) {
            return n;
        }
        fallback
    }

    /// A float.
    pub fn float(&mut self, name: &str) -> f32 {
        self.opt_float(name).unwrap_or(0.0)
    }

    /// An optional float.
    pub fn opt_float(&mut self, name: &str) -> Option<f32> {
        let v = self.value(name)?;
        match v.as_f64().map(|f| f as f32) {
            Some(f) if f.is_finite() => Some(f),
            _ => {
                self.bad(name, "a number within f32's range", &v);
                None
            }
        }
    }

    /// A boolean.
    pub fn bool(&mut self, name: &str) -> bool {
        let Some(v) = self.value(name) else {
            return false;
        };
        match v.as_bool() {
            Some(b) => b,
            None => {
                self.bad(name, "true or false", &v);
                false
            }
        }
    }

    /// An optional list of integers.
    pub fn opt_ints(&mut self, name: &str) -> Option<Vec<i64>> {
        let v = self.value(name)?;
        match v
            .as_array()
            .and_then(|a| a.iter().map(Value::as_i64).collect())
        {
            Some(list) => Some(list),
            None => {
                self.bad(name, "a list of integers", &v);
                None
            }
        }
    }

    /// A list of integers (empty when missing or wrong).
    pub fn ints(&mut self, name: &str) -> Vec<i64> {
        self.opt_ints(name).unwrap_or_default()
    }

    /// An optional per-axis list ([`AttrKind::PerAxis`]): a single integer spread over
    /// the schema's entries, or a list of integers.
    pub fn opt_per_axis(&mut self, name: &str) -> Option<Vec<i64>> {
        let v = self.value(name)?;
        let list = match self.schema.iter().find(|s| s.name == name).map(|s| s.kind) {
            Some(AttrKind::PerAxis(len)) => per_axis_list(&v, len),
            _ => v
                .as_array()
                .and_then(|a| a.iter().map(Value::as_i64).collect()),
        };
        match list {
            Some(list) => Some(list),
            None => {
                self.bad(name, "an integer or a list of integers", &v);
                None
            }
        }
    }

    /// A per-axis list (empty when missing or wrong).
    pub fn per_axis(&mut self, name: &str) -> Vec<i64> {
        self.opt_per_axis(name).unwrap_or_default()
    }

    /// A list of numbers.
    pub fn floats(&mut self, name: &str) -> Vec<f32> {
        let Some(v) = self.value(name) else {
            return Vec::new();
        };
        let finite = |x: &Value| x.as_f64().map(|f| f as f32).filter(|f| f.is_finite());
        match v.as_array().and_then(|a| a.iter().map(finite).collect()) {
            Some(list) => list,
            None => {
                self.bad(name, "a list of numbers within f32's range", &v);
                Vec::new()
            }
        }
    }

    /// One of the schema's choices.
    pub fn choice(&mut self, name: &str) -> String {
        let Some(v) = self.value(name) else {
            return String::new();
        };
        let choices = match self.schema.iter().find(|s| s.name == name).map(|s| s.kind) {
            Some(AttrKind::Choice(c)) => c,
            _ => &[][..],
        };
        match v.as_str() {
            Some(s) if choices.contains(&s) => s.to_string(),
            _ => {
                let expected = format!("one of {}", choices.join(", "));
                self.bad(name, &expected, &v);
                String::new()
            }
        }
    }

    /// A string (empty when missing or wrong; the problem is recorded).
    pub fn text(&mut self, name: &str) -> String {
        let Some(v) = self.value(name) else {
            return String::new();
        };
        match v.as_str() {
            Some(s) => s.to_string(),
            None => {
                self.bad(name, "a string", &v);
                String::new()
            }
        }
    }

    /// Records a problem with an attribute's value found by the operator itself.
    pub fn reject(&mut self, name: &str, message: impl Into<String>) {
        self.problems.push((name.to_string(), message.into()));
    }
}
