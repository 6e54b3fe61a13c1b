//! The bounds on documents, graphs and runs, as data: every limit with its default and
//! the flag that sets it ([`Limits`]), the check of a tensor type against them, and the
//! cheap check of a raw document ([`check_document`]) that runs before any quadratic or
//! large work (building, analysing, planning). The CLI, the server, workers and the
//! editor all take their limits from here (re-exported by `crate::limits`).

use super::doc::GraphDoc;
use super::problem::Problem;
use crate::error::LimitError;
use crate::ops::TensorType;
use crate::shape::{Dim, Product};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Widening to `u64` for the limits' values (sizes and counts).
trait Widen {
    fn widen(self) -> u64;
}

impl Widen for usize {
    fn widen(self) -> u64 {
        // usize is at most 64 bits wide on every target the engine builds for.
        u64::try_from(self).unwrap_or(u64::MAX)
    }
}

impl Widen for u64 {
    fn widen(self) -> u64 {
        self
    }
}

macro_rules! limits {
    ($( $(#[doc = $doc:literal])* $field:ident: $ty:ty = $default:expr, $variant:ident, $flag:literal; )*) => {
        /// Every bound a document, a graph or a run must stay within, each with its
        /// default. Serialised with every field optional (missing fields take their
        /// defaults), so configuration can name only what it changes.
        #[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
        #[serde(default, deny_unknown_fields)]
        pub struct Limits {
            $( $(#[doc = $doc])* pub $field: $ty, )*
        }

        impl Default for Limits {
            fn default() -> Self {
                Limits { $( $field: $default, )* }
            }
        }

        /// One of the limits, naming its field of [`Limits`] and its flag.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Limit {
            $( $(#[doc = $doc])* $variant, )*
        }

        impl Limit {
            /// Every limit, in the order of the fields of [`Limits`].
            pub const ALL: &'static [Limit] = &[$(Limit::$variant),*];

            /// Its field of [`Limits`] (`max_nodes`).
            pub fn name(self) -> &'static str {
                match self { $( Limit::$variant => stringify!($field), )* }
            }

            /// The flag of `sluice` that sets it (`--max-nodes`).
            pub fn flag(self) -> &'static str {
                match self { $( Limit::$variant => $flag, )* }
            }
        }

        impl Limits {
            /// The value of one limit.
            pub fn get(&self, limit: Limit) -> u64 {
                match limit { $( Limit::$variant => self.$field.widen(), )* }
            }
        }
    };
}

limits! {
    /// Largest graph document, in bytes of JSON text (16 MiB: a 10,000-node graph with
    /// a constant of 2^20 elements fits).
    max_document_bytes: usize = 16 << 20, MaxDocumentBytes, "--max-document-bytes";
    /// Most JSON values (numbers, strings, lists, objects, ...) in one document (2^21).
    max_json_values: usize = 1 << 21, MaxJsonValues, "--max-json-values";
    /// Most nodes in a graph (10,000).
    max_nodes: usize = 10_000, MaxNodes, "--max-nodes";
    /// Most graph inputs (256).
    max_inputs: usize = 256, MaxInputs, "--max-inputs";
    /// Most graph outputs (256).
    max_outputs: usize = 256, MaxOutputs, "--max-outputs";
    /// Most axes of any tensor (8).
    max_rank: usize = 8, MaxRank, "--max-rank";
    /// Longest name, in bytes: node ids, input names, symbols and symbolic dimensions,
    /// operator and attribute names, the graph's name (128).
    max_name_len: usize = 128, MaxNameLen, "--max-name-len";
    /// Longest list: list attributes (except a constant's values) and a node's inputs
    /// (1,024).
    max_list_len: usize = 1024, MaxListLen, "--max-list-len";
    /// Most elements of any one tensor: inputs, weights, constants, every value a node
    /// computes, with the batch bound (2^28, 1 GiB of f32).
    max_tensor_elements: u64 = 1 << 28, MaxTensorElements, "--max-tensor-elements";
    /// Most elements of a constant written in a graph file (2^20).
    max_constant_elements: u64 = 1 << 20, MaxConstantElements, "--max-constant-elements";
    /// Most bytes a run may allocate on one device: its weights, inputs and activations
    /// (2 GiB).
    max_device_bytes: u64 = 2 << 30, MaxDeviceBytes, "--max-device-bytes";
    /// Most bytes a run may allocate on the host: weights, the dataset's inputs and
    /// outputs, and the values of the micro-batches in flight (2 GiB).
    max_host_bytes: u64 = 2 << 30, MaxHostBytes, "--max-host-bytes";
    /// Largest batch a run may ask for (65,536).
    max_batch: usize = MAX_BATCH, MaxBatch, "--max-batch";
    /// Most micro-batches per batch (1,024).
    max_microbatches: usize = MAX_MICROBATCHES, MaxMicrobatches, "--max-microbatches";
    /// Most pipeline stages (16).
    max_stages: usize = MAX_STAGES, MaxStages, "--max-stages";
    /// Most prefetch slots (16).
    max_prefetch: usize = MAX_PREFETCH, MaxPrefetch, "--max-prefetch";
    /// Most problems listed for one document; the rest are counted (1,000).
    max_problems: usize = 1000, MaxProblems, "--max-problems";
}

/// Default largest batch a run may ask for.
pub const MAX_BATCH: usize = 65_536;
/// Default most micro-batches per batch.
pub const MAX_MICROBATCHES: usize = 1024;
/// Default most pipeline stages.
pub const MAX_STAGES: usize = 16;
/// Default most prefetch slots.
pub const MAX_PREFETCH: usize = 16;

/// Longest output reference suffix beyond a name: `:` and a port number.
const PORT_SUFFIX: usize = 21;

/// At most this many characters of an over-long string are echoed in a problem.
const ECHO: usize = 40;

/// A string for a message, cut to its first [`ECHO`] characters.
pub(crate) fn echo(s: &str) -> String {
    match s.char_indices().nth(ECHO) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

impl Limits {
    /// The error for `value` (`None`: uncountable) of `unit` against one limit.
    pub fn error(
        &self,
        limit: Limit,
        subject: impl Into<String>,
        unit: &'static str,
        value: Option<u64>,
    ) -> LimitError {
        LimitError {
            subject: subject.into(),
            unit,
            value,
            limit: self.get(limit),
            name: limit.name(),
            flag: limit.flag(),
        }
    }

    /// Checks `value` (`None`: counting it overflowed) against one limit.
    pub fn check(
        &self,
        limit: Limit,
        subject: impl Into<String>,
        unit: &'static str,
        value: Option<u64>,
    ) -> Result<(), LimitError> {
        match value {
            Some(v) if v <= self.get(limit) => Ok(()),
            _ => Err(self.error(limit, subject, unit, value)),
        }
    }

    /// Checks a (possibly symbolic) tensor type: its rank, each dimension, the length of
    /// each symbolic dimension's text, and its elements with every symbol counted as 1
    /// (the fixed part; bound graphs are checked with their real sizes).
    pub fn check_type(&self, subject: &str, t: &TensorType) -> Result<(), LimitError> {
        self.check(
            Limit::MaxRank,
            format!("{subject} ({} axes)", t.shape.len()),
            "axes",
            Some(t.shape.len().widen()),
        )?;
        for d in &t.shape {
            match d {
                Dim::Known(n) => self.check(
                    Limit::MaxTensorElements,
                    format!("{subject}'s dimension {n}"),
                    "elements",
                    Some(n.widen()),
                )?,
                Dim::Sym(s) => self.check(
                    Limit::MaxNameLen,
                    format!("{subject}'s symbolic dimension '{}'", echo(s)),
                    "bytes",
                    Some(s.len().widen()),
                )?,
            }
        }
        let elements = Product::of(&t.shape).map(|p| p.coeff.widen());
        self.check(Limit::MaxTensorElements, subject, "elements", elements)
    }
}

/// The document checks, collecting problems.
struct Checker<'a> {
    limits: &'a Limits,
    problems: Vec<Problem>,
}

impl Checker<'_> {
    fn over(&mut self, node: Option<&str>, field: String, e: LimitError) {
        let message = e.to_string();
        self.problems.push(match node {
            Some(n) => Problem::node(n, field, message),
            None => Problem::at(field, message),
        });
    }

    fn count(&mut self, limit: Limit, field: &str, subject: &str, unit: &'static str, n: usize) {
        if let Err(e) = self.limits.check(limit, subject, unit, Some(n.widen())) {
            self.over(None, field.to_string(), e);
        }
    }

    /// Checks a name's length; true when it is short enough to be echoed whole.
    fn name(&mut self, node: Option<&str>, field: String, what: &str, s: &str) -> bool {
        let max = self.limits.max_name_len;
        if s.len() <= max {
            return true;
        }
        let e = self.limits.error(
            Limit::MaxNameLen,
            format!("{what} '{}'", echo(s)),
            "bytes",
            Some(s.len().widen()),
        );
        self.over(node, field, e);
        false
    }

    /// Checks the lengths of one attribute's value.
    fn attr(&mut self, node: Option<&str>, field: String, constant_values: bool, v: &Value) {
        let (limit, unit, len) = match v {
            Value::Array(items) if constant_values => {
                (Limit::MaxConstantElements, "elements", items.len())
            }
            Value::Array(items) => (Limit::MaxListLen, "entries", items.len()),
            Value::String(s) => (Limit::MaxNameLen, "bytes", s.len()),
            _ => return,
        };
        if let Err(e) = self
            .limits
            .check(limit, field.clone(), unit, Some(len.widen()))
        {
            self.over(node, field, e);
        }
    }
}

/// Checks a document's counts, ranks, names and list lengths against the limits without
/// building anything: cheap (linear in the document) and done first by
/// [`crate::graph::load_graph`], [`crate::graph::analyse`] and `Graph::build`, so that a
/// huge document is refused before any large or quadratic work. At most
/// [`Limits::max_problems`] problems are returned.
pub fn check_document(doc: &GraphDoc, limits: &Limits) -> Vec<Problem> {
    let mut c = Checker {
        limits,
        problems: Vec::new(),
    };
    c.count(
        Limit::MaxNodes,
        "nodes",
        "the graph",
        "nodes",
        doc.nodes.len(),
    );
    c.count(
        Limit::MaxInputs,
        "inputs",
        "the graph",
        "inputs",
        doc.inputs.len(),
    );
    c.count(
        Limit::MaxOutputs,
        "outputs",
        "the graph",
        "outputs",
        doc.outputs.len(),
    );
    c.name(None, "name".into(), "the graph's name", &doc.name);
    for (name, decl) in &doc.inputs {
        if !c.name(None, "inputs".into(), "input name", name) {
            continue;
        }
        let t = TensorType {
            shape: decl.shape.clone(),
            dtype: decl.dtype,
        };
        if let Err(e) = limits.check_type(&format!("input '{name}'"), &t) {
            c.over(None, format!("inputs.{name}.shape"), e);
        }
    }
    for (i, n) in doc.nodes.iter().take(limits.max_nodes).enumerate() {
        let node = c
            .name(None, format!("nodes[{i}].id"), "node id", &n.id)
            .then_some(n.id.as_str());
        c.name(node, format!("nodes[{i}].op"), "operator name", &n.op);
        if n.inputs.len() > limits.max_list_len {
            let e = limits.error(
                Limit::MaxListLen,
                format!("node input list ({} references)", n.inputs.len()),
                "entries",
                Some(n.inputs.len().widen()),
            );
            c.over(node, format!("nodes[{i}].inputs"), e);
        } else {
            for (k, r) in n.inputs.iter().enumerate() {
                if r.len() > limits.max_name_len + PORT_SUFFIX {
                    c.name(node, format!("nodes[{i}].inputs[{k}]"), "reference", r);
                }
            }
        }
        if n.attrs.len() > limits.max_list_len {
            let e = limits.error(
                Limit::MaxListLen,
                format!("node attributes ({})", n.attrs.len()),
                "entries",
                Some(n.attrs.len().widen()),
            );
            c.over(node, format!("nodes[{i}].attrs"), e);
            continue;
        }
        for (key, v) in &n.attrs {
            let field = format!("nodes[{i}].attrs");
            if c.name(node, field.clone(), "attribute name", key) {
                let constant_values = n.op == "constant" && key == "value";
                c.attr(node, format!("{field}.{key}"), constant_values, v);
            }
        }
    }
    for (k, r) in doc.outputs.iter().take(limits.max_outputs).enumerate() {
        if r.len() > limits.max_name_len + PORT_SUFFIX {
            c.name(None, format!("outputs[{k}]"), "output reference", r);
        }
    }
    let entries = limits.max_nodes.saturating_add(limits.max_inputs);
    for (field, keys) in [
        ("layout", doc.layout.keys().collect::<Vec<_>>()),
        ("stages", doc.stages.keys().collect()),
    ] {
        if keys.len() > entries {
            c.count(Limit::MaxNodes, field, field, "entries", keys.len());
            continue;
        }
        for key in keys {
            c.name(None, field.to_string(), "name", key);
        }
    }
    c.problems.truncate(limits.max_problems);
    c.problems
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn doc(v: Value) -> GraphDoc {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn every_limit_has_its_own_field_and_flag() {
        let limits = Limits::default();
        let mut flags = std::collections::BTreeSet::new();
        for &l in Limit::ALL {
            assert_eq!(l.flag(), format!("--{}", l.name().replace('_', "-")));
            assert!(flags.insert(l.flag()));
            assert!(limits.get(l) > 0, "{}", l.name());
        }
        let partial: Limits = serde_json::from_value(json!({ "max_nodes": 5 })).unwrap();
        assert_eq!(partial.max_nodes, 5);
        assert_eq!(partial.max_rank, Limits::default().max_rank);
        assert!(serde_json::from_value::<Limits>(json!({ "max_nodez": 5 })).is_err());
    }

    #[test]
    fn documents_over_the_limits_are_refused_cheaply_naming_limit_and_flag() {
        let doc = doc(json!({
            "format": "sluice/graph@1",
            "inputs": { "x": { "shape": ["N", 1, 1, 1, 1, 1, 1, 1, 1] } },
            "nodes": [
                { "id": "u", "op": "unsqueeze", "inputs": ["x"], "attrs": { "axes": (0..2000).collect::<Vec<i64>>() } },
                { "id": "k", "op": "constant", "attrs": { "value": vec![0.0; 2000] } }
            ],
            "outputs": ["u"]
        }));
        let problems = check_document(&doc, &Limits::default());
        let text: Vec<String> = problems.iter().map(|p| p.to_string()).collect();
        assert_eq!(problems.len(), 2, "{text:#?}");
        assert!(
            text[0].contains("9 axes") && text[0].contains("--max-rank"),
            "{text:#?}"
        );
        assert!(
            text[1].contains("node 'u'") && text[1].contains("max_list_len"),
            "{text:#?}"
        );
        // A constant's values are bounded by their own limit.
        let small = Limits {
            max_constant_elements: 10,
            ..Limits::default()
        };
        let problems = check_document(&doc, &small);
        assert!(problems
            .iter()
            .any(|p| p.message.contains("max_constant_elements")));
    }

    #[test]
    fn long_names_are_not_echoed_whole() {
        let long = "n".repeat(10_000);
        let mut inputs = serde_json::Map::new();
        inputs.insert(long.clone(), json!({ "shape": [1] }));
        let doc = doc(json!({
            "format": "sluice/graph@1",
            "inputs": inputs,
            "nodes": [{ "id": long.clone(), "op": "relu", "inputs": [long.clone()] }],
            "outputs": [long.clone()]
        }));
        let problems = check_document(&doc, &Limits::default());
        assert!(problems.len() >= 3);
        for p in &problems {
            assert!(p.to_string().len() < 400, "{p}");
        }
    }
}
