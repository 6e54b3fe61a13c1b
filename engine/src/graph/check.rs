//! The cheap check of a raw document against the [`Limits`]: counts, ranks, names and
//! list lengths, linear in the document and done before any quadratic or large work
//! (building, analysing, planning).

use super::doc::GraphDoc;
use super::limits::{echo, Limit, Limits, Widen};
use super::problem::Problem;
use crate::error::LimitError;
use crate::ops::TensorType;
use serde_json::Value;

/// Longest output reference suffix beyond a name: `:` and a port number.
const PORT_SUFFIX: usize = 21;

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
                "the node's input list",
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
                "the node's attributes",
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
