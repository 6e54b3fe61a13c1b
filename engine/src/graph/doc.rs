//! The `sluice/graph@1` document: its serde types, and a decoder that checks the JSON
//! structure field by field and reports every problem at once (serde alone stops at the
//! first). The decoder stays within the [`Limits`]: it parses text under a budget and
//! does not decode lists (nodes, inputs, outputs, shapes, a node's inputs) longer than
//! their limits, reporting them instead.

use super::json;
use super::limits::{echo, Limit, Limits};
use super::problem::{Collector, Problem};
use crate::dtype::DType;
use crate::shape::Dim;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// The format tag every graph file carries.
pub const FORMAT: &str = "sluice/graph@1";

/// A graph document exactly as saved by the editor and read by the CLI and server.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GraphDoc {
    /// Always [`FORMAT`].
    pub format: String,
    /// A display name.
    #[serde(default)]
    pub name: String,
    /// Graph inputs by name.
    pub inputs: BTreeMap<String, InputDecl>,
    /// Operator nodes, in any order (they are sorted topologically).
    pub nodes: Vec<NodeDoc>,
    /// Output references (`"node"` or `"node:1"`).
    pub outputs: Vec<String>,
    /// Where weights come from.
    #[serde(default)]
    pub params: ParamsDoc,
    /// Editor positions of nodes (x, y).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub layout: BTreeMap<String, [f64; 2]>,
    /// Pipeline-stage pins of nodes.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub stages: BTreeMap<String, usize>,
    /// How to train the graph: its loss, metrics and optimiser defaults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub training: Option<super::training::TrainingDoc>,
}

/// A declared graph input.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InputDecl {
    /// Its shape; strings are symbolic dimensions.
    pub shape: Vec<Dim>,
    /// Its element type.
    #[serde(default = "default_dtype")]
    pub dtype: DType,
}

fn default_dtype() -> DType {
    DType::F32
}

/// One operator node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeDoc {
    /// Unique id, also the name of its (first) output.
    pub id: String,
    /// The operator name.
    pub op: String,
    /// Input references, in the operator's input order.
    #[serde(default)]
    pub inputs: Vec<String>,
    /// Attributes, checked against the operator's schema.
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub attrs: Map<String, Value>,
}

/// Where weights come from: a safetensors file, or seeded initialisation.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ParamsDoc {
    /// Seed for deterministic initialisation of weights not in `file`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// A safetensors file, relative to the graph file, with keys `node.param`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
}

/// Parses and structurally checks a graph file within the default [`Limits`]. Reports
/// every problem found.
pub fn decode(text: &str) -> Result<GraphDoc, Vec<Problem>> {
    strict(decode_partial(text))
}

/// Structurally checks a parsed JSON value as a graph document, within the default
/// [`Limits`].
pub fn decode_value(value: &Value) -> Result<GraphDoc, Vec<Problem>> {
    strict(decode_value_partial(value, &Limits::default()))
}

fn strict((doc, problems): (Option<GraphDoc>, Vec<Problem>)) -> Result<GraphDoc, Vec<Problem>> {
    match doc {
        Some(d) if problems.is_empty() => Ok(d),
        _ => Err(problems),
    }
}

/// Parses a graph file, returning the problems found and, when its structure is usable
/// despite them (an unknown field, a malformed node), the document, so that checking can
/// go on and report the graph's other problems in the same pass. Within the default
/// [`Limits`]; see [`decode_partial_with`].
pub fn decode_partial(text: &str) -> (Option<GraphDoc>, Vec<Problem>) {
    decode_partial_with(text, &Limits::default())
}

/// [`decode_partial`] within `limits`: the text is parsed under its budget, and a
/// document over the limits' counts (nodes, inputs, outputs) is not usable.
pub fn decode_partial_with(text: &str, limits: &Limits) -> (Option<GraphDoc>, Vec<Problem>) {
    let mut p = Collector::new(limits.max_problems);
    let doc = decode_text_into(text, limits, &mut p);
    (doc, p.finish())
}

/// [`decode_partial_with`] adding its problems to `p`.
pub(crate) fn decode_text_into(text: &str, limits: &Limits, p: &mut Collector) -> Option<GraphDoc> {
    match json::parse(text, limits) {
        Ok(value) => decode_into(&value, limits, p),
        Err(problem) => {
            p.push(problem);
            None
        }
    }
}

/// A list of `len` entries at `field` over a limit, as a problem.
fn too_long(limits: &Limits, limit: Limit, field: String, len: usize) -> Problem {
    let e = limits.error(
        limit,
        format!("'{field}'"),
        "entries",
        u64::try_from(len).ok(),
    );
    Problem::at(field, e.to_string())
}

/// [`decode_partial`] on a parsed value.
pub fn decode_value_partial(value: &Value, limits: &Limits) -> (Option<GraphDoc>, Vec<Problem>) {
    let mut p = Collector::new(limits.max_problems);
    let doc = decode_into(value, limits, &mut p);
    (doc, p.finish())
}

/// [`decode_value_partial`] adding its problems to `p` (so that building can add its own
/// under the same cap).
pub(crate) fn decode_into(value: &Value, limits: &Limits, p: &mut Collector) -> Option<GraphDoc> {
    let Some(obj) = value.as_object() else {
        p.push(Problem::at(
            "document",
            "a graph file must be a JSON object",
        ));
        return None;
    };
    unknown_fields(
        obj,
        &[
            "format", "name", "inputs", "nodes", "outputs", "params", "layout", "stages",
            "training",
        ],
        "",
        None,
        p,
    );
    let format = match obj.get("format") {
        Some(Value::String(s)) if s == FORMAT => s.clone(),
        Some(Value::String(s)) => {
            p.push(Problem::at(
                "format",
                format!("unknown format version '{s}' (this Sluice reads '{FORMAT}')"),
            ));
            s.clone()
        }
        Some(_) => {
            p.push(Problem::at(
                "format",
                format!("must be the string '{FORMAT}'"),
            ));
            String::new()
        }
        None => {
            p.push(Problem::at(
                "format",
                format!("missing (expected '{FORMAT}')"),
            ));
            String::new()
        }
    };
    let name = match obj.get("name") {
        None => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(_) => {
            p.push(Problem::at("name", "must be a string"));
            String::new()
        }
    };
    let mut usable = true;
    let mut count = |limit: Limit, key: &'static str, len: usize, p: &mut Collector| -> bool {
        let n = u64::try_from(len).ok();
        let fits = n.is_some_and(|n| n <= limits.get(limit));
        if !fits {
            let e = limits.error(limit, "the graph", key, n);
            p.push(Problem::at(key, e.to_string()));
            usable = false;
        }
        fits
    };
    let inputs = match obj.get("inputs") {
        Some(Value::Object(m)) if !count(Limit::MaxInputs, "inputs", m.len(), p) => BTreeMap::new(),
        v => decode_inputs(v, limits, p),
    };
    let nodes = match obj.get("nodes") {
        Some(Value::Array(items)) if !count(Limit::MaxNodes, "nodes", items.len(), p) => Vec::new(),
        v => decode_nodes(v, limits, p),
    };
    let outputs = match obj.get("outputs") {
        Some(Value::Array(items)) if !count(Limit::MaxOutputs, "outputs", items.len(), p) => {
            Vec::new()
        }
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .filter_map(|(i, v)| match v.as_str() {
                Some(s) => Some(s.to_string()),
                None => {
                    p.push(Problem::at(
                        format!("outputs[{i}]"),
                        "must be a string naming a node",
                    ));
                    None
                }
            })
            .collect(),
        Some(_) => {
            p.push(Problem::at(
                "outputs",
                "must be an array of node references",
            ));
            Vec::new()
        }
        None => {
            p.push(Problem::at(
                "outputs",
                "missing: a graph needs at least one output",
            ));
            Vec::new()
        }
    };
    let params = typed_field::<ParamsDoc>(obj, "params", p).unwrap_or_default();
    let layout = typed_field(obj, "layout", p).unwrap_or_default();
    let stages = typed_field(obj, "stages", p).unwrap_or_default();
    let training = obj
        .get("training")
        .and_then(|v| super::training::decode(v, p));
    // A document of another format version, or over the limits, is not checked further.
    let usable = usable && format == FORMAT;
    usable.then_some(GraphDoc {
        format,
        name,
        inputs,
        nodes,
        outputs,
        params,
        layout,
        stages,
        training,
    })
}

fn typed_field<T: serde::de::DeserializeOwned>(
    obj: &Map<String, Value>,
    key: &str,
    p: &mut Collector,
) -> Option<T> {
    let v = obj.get(key)?;
    match T::deserialize(v) {
        Ok(t) => Some(t),
        Err(e) => {
            p.push(Problem::at(key, format!("invalid: {e}")));
            None
        }
    }
}

/// Unknown fields reported one by one, at most this many per object.
const UNKNOWN_LISTED: usize = 8;

fn unknown_fields(
    obj: &Map<String, Value>,
    known: &[&str],
    prefix: &str,
    node: Option<&str>,
    p: &mut Collector,
) {
    let unknown: Vec<&String> = obj
        .keys()
        .filter(|k| !known.contains(&k.as_str()))
        .collect();
    let at = |field: String, message: String| match node {
        Some(n) => Problem::node(n, field, message),
        None => Problem::at(field, message),
    };
    for key in unknown.iter().take(UNKNOWN_LISTED) {
        let key = echo(key);
        p.push(at(
            format!("{prefix}{key}"),
            format!("unknown field '{key}' (known: {})", known.join(", ")),
        ));
    }
    if unknown.len() > UNKNOWN_LISTED {
        p.push(at(
            prefix.trim_end_matches('.').to_string(),
            format!("{} more unknown fields", unknown.len() - UNKNOWN_LISTED),
        ));
    }
}

fn decode_inputs(
    v: Option<&Value>,
    limits: &Limits,
    p: &mut Collector,
) -> BTreeMap<String, InputDecl> {
    let mut out = BTreeMap::new();
    let Some(v) = v else {
        p.push(Problem::at(
            "inputs",
            "missing: declare the graph inputs (may be {})",
        ));
        return out;
    };
    let Some(map) = v.as_object() else {
        p.push(Problem::at(
            "inputs",
            "must be an object mapping names to {shape, dtype}",
        ));
        return out;
    };
    for (name, decl) in map {
        let field = format!("inputs.{name}");
        let Some(d) = decl.as_object() else {
            p.push(Problem::at(field, "must be an object {shape, dtype}"));
            continue;
        };
        unknown_fields(d, &["shape", "dtype"], &format!("{field}."), None, p);
        let shape = match d.get("shape") {
            Some(Value::Array(dims)) if dims.len() > limits.max_rank => {
                let e = limits.error(
                    Limit::MaxRank,
                    format!("input '{}'", echo(name)),
                    "axes",
                    u64::try_from(dims.len()).ok(),
                );
                p.push(Problem::at(format!("{field}.shape"), e.to_string()));
                Vec::new()
            }
            Some(Value::Array(dims)) => {
                let mut shape = Vec::new();
                for (i, dim) in dims.iter().enumerate() {
                    let known = dim.as_u64().map(usize::try_from);
                    match dim {
                        Value::Number(_) if known.as_ref().is_some_and(Result::is_ok) => {
                            shape.push(Dim::Known(known.and_then(Result::ok).unwrap_or(0)))
                        }
                        Value::Number(_) if known.is_some() => p.push(Problem::at(
                            format!("{field}.shape[{i}]"),
                            format!("dimension {dim} is too large for this machine"),
                        )),
                        Value::String(s) if is_symbol(s) => shape.push(Dim::Sym(s.clone())),
                        _ => p.push(Problem::at(
                            format!("{field}.shape[{i}]"),
                            format!(
                                "must be a non-negative integer or a symbol like \"N\", not {dim}"
                            ),
                        )),
                    }
                }
                shape
            }
            _ => {
                p.push(Problem::at(
                    format!("{field}.shape"),
                    "missing or not an array of dimensions",
                ));
                Vec::new()
            }
        };
        let dtype = match d.get("dtype") {
            None => DType::F32,
            Some(Value::String(s)) => DType::parse(s).unwrap_or_else(|| {
                p.push(Problem::at(
                    format!("{field}.dtype"),
                    format!("unknown dtype '{s}' (known: f32, i32, bool)"),
                ));
                DType::F32
            }),
            Some(_) => {
                p.push(Problem::at(
                    format!("{field}.dtype"),
                    "must be a string such as \"f32\"",
                ));
                DType::F32
            }
        };
        out.insert(name.clone(), InputDecl { shape, dtype });
    }
    out
}

/// Whether a string is a valid symbolic dimension name.
pub fn is_symbol(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn decode_nodes(v: Option<&Value>, limits: &Limits, p: &mut Collector) -> Vec<NodeDoc> {
    let Some(v) = v else {
        p.push(Problem::at("nodes", "missing: a graph needs a node list"));
        return Vec::new();
    };
    let Some(items) = v.as_array() else {
        p.push(Problem::at("nodes", "must be an array of nodes"));
        return Vec::new();
    };
    let mut nodes = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let field = format!("nodes[{i}]");
        let Some(obj) = item.as_object() else {
            p.push(Problem::at(
                field,
                "must be an object {id, op, inputs, attrs}",
            ));
            continue;
        };
        let id = obj.get("id").and_then(Value::as_str).map(str::to_string);
        let node_name = id.clone();
        let node_ref = node_name.as_deref();
        let push = |p: &mut Collector, f: String, m: String| {
            p.push(match node_ref {
                Some(n) => Problem::node(n, f, m),
                None => Problem::at(f, m),
            })
        };
        unknown_fields(
            obj,
            &["id", "op", "inputs", "attrs"],
            &format!("{field}."),
            node_ref,
            p,
        );
        if id.is_none() {
            push(p, format!("{field}.id"), "missing or not a string".into());
        }
        let op = match obj.get("op").and_then(Value::as_str) {
            Some(s) => s.to_string(),
            None => {
                push(
                    p,
                    format!("{field}.op"),
                    "missing or not a string naming an operator".into(),
                );
                String::new()
            }
        };
        let inputs = match obj.get("inputs") {
            None => Vec::new(),
            Some(Value::Array(refs)) if refs.len() > limits.max_list_len => {
                let problem = too_long(
                    limits,
                    Limit::MaxListLen,
                    format!("{field}.inputs"),
                    refs.len(),
                );
                push(p, problem.field, problem.message);
                Vec::new()
            }
            Some(Value::Array(refs)) => refs
                .iter()
                .enumerate()
                .filter_map(|(k, r)| match r.as_str() {
                    Some(s) => Some(s.to_string()),
                    None => {
                        push(
                            p,
                            format!("{field}.inputs[{k}]"),
                            "must be a string reference".into(),
                        );
                        None
                    }
                })
                .collect(),
            Some(_) => {
                push(
                    p,
                    format!("{field}.inputs"),
                    "must be an array of references".into(),
                );
                Vec::new()
            }
        };
        let attrs = match obj.get("attrs") {
            None => Map::new(),
            Some(Value::Object(m)) => m.clone(),
            Some(_) => {
                push(p, format!("{field}.attrs"), "must be an object".into());
                Map::new()
            }
        };
        nodes.push(NodeDoc {
            id: id.unwrap_or_default(),
            op,
            inputs,
            attrs,
        });
    }
    nodes
}
