//! The live view of a document being edited: the type of every output that can be
//! inferred, where the batch lives in it, which nodes couple samples and every problem,
//! even while the graph does not validate yet. The editor
//! calls this on each edit, so what it shows is exactly what the CLI would report.

use super::batch::{self, Batch, Coupling};
use super::build::build_into;
use super::doc::decode_into;
use super::limits::Limits;
use super::problem::{Collector, Problem};
use crate::ops::TensorType;
use serde::Serialize;
use serde_json::Value;
use std::collections::BTreeMap;

/// What checking a (possibly unfinished) document found.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Analysis {
    /// Output types of every graph input and node that could be typed, by id.
    pub types: BTreeMap<String, Vec<TensorType>>,
    /// Every problem, as `sluice validate` reports them.
    pub problems: Vec<Problem>,
    /// Node id → why its inputs' shapes or dtypes do not fit the operator.
    pub type_errors: BTreeMap<String, String>,
    /// Where the batch lives in each output of every graph input and node that could be
    /// typed, by id (parallel to `types`).
    pub batch: BTreeMap<String, Vec<Batch>>,
    /// Every node that combines samples itself, in topological order (notes, not
    /// problems: such a graph is valid but cannot be micro-batched).
    pub couplings: Vec<Coupling>,
}

impl Analysis {
    /// The problems that belong to a node.
    pub fn problems_of<'a>(&'a self, node: &'a str) -> impl Iterator<Item = &'a Problem> + 'a {
        self.problems
            .iter()
            .filter(move |p| p.node.as_deref() == Some(node))
    }
}

/// Checks a document given as JSON and infers every type it can, within the default
/// [`Limits`]: a document over them gets its problems and no types, before any large or
/// quadratic work.
pub fn analyse(value: &Value) -> Analysis {
    let limits = Limits::default();
    let mut p = Collector::new(limits.max_problems);
    let Some(doc) = decode_into(value, &limits, &mut p) else {
        return Analysis {
            problems: p.finish(),
            ..Analysis::default()
        };
    };
    let (graph, type_errors) = build_into(doc, &limits, &mut p);
    let problems = p.finish();
    let (types, batch, couplings) = match &graph {
        Some(g) => {
            let typed = || g.dag.node_weights().filter(|n| !n.outputs.is_empty());
            (
                typed().map(|n| (n.id.clone(), n.outputs.clone())).collect(),
                typed().map(|n| (n.id.clone(), n.batch.clone())).collect(),
                batch::couplings(g),
            )
        }
        None => Default::default(),
    };
    Analysis {
        types,
        problems,
        type_errors,
        batch,
        couplings,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn each_cause_is_said_once() {
        // conv2d reads kernel_size in two places, and a missing one then fails its length
        // check too: one problem, the cause, per attribute.
        let a = analyse(&json!({
            "format": "sluice/graph@1",
            "inputs": { "x": { "shape": ["N", 1, 8, 8] } },
            "nodes": [{ "id": "c", "op": "conv2d", "inputs": ["x"] }],
            "outputs": ["c"]
        }));
        let texts: Vec<String> = a.problems.iter().map(ToString::to_string).collect();
        assert_eq!(
            texts,
            [
                "node 'c', nodes[0].attrs.kernel_size: required attribute 'kernel_size' is missing",
                "node 'c', nodes[0].attrs.out_channels: required attribute 'out_channels' is missing",
            ]
        );
    }

    #[test]
    fn types_what_it_can_and_names_the_node_that_does_not_fit() {
        let a = analyse(&json!({
            "format": "sluice/graph@1",
            "inputs": { "x": { "shape": ["N", 784] }, "y": { "shape": ["N", 10] } },
            "nodes": [
                { "id": "fc", "op": "linear", "inputs": ["x"], "attrs": { "out_features": 32 } },
                { "id": "bad", "op": "add", "inputs": ["fc", "y"] },
                { "id": "after", "op": "relu", "inputs": ["bad"] }
            ],
            "outputs": ["after"]
        }));
        assert!(!a.problems.is_empty());
        assert_eq!(a.types["fc"][0].to_string(), "f32 [N, 32]");
        assert!(!a.types.contains_key("bad"));
        assert!(
            a.type_errors["bad"].contains("[N, 32]"),
            "{:?}",
            a.type_errors
        );
        assert_eq!(a.problems_of("bad").count(), 1);
        assert_eq!(a.problems_of("after").count(), 0);
    }

    #[test]
    fn malformed_documents_give_problems_not_panics() {
        let a = analyse(&json!([1, 2]));
        assert!(a.types.is_empty());
        assert_eq!(a.problems.len(), 1);
        let a = analyse(
            &json!({ "format": "sluice/graph@1", "inputs": {}, "nodes": [
            { "id": "a", "op": "relu", "inputs": ["b"] },
            { "id": "b", "op": "relu", "inputs": ["a"] }
        ], "outputs": ["a"] }),
        );
        assert!(a.problems.iter().any(|p| p.message.contains("cycle")));
    }
}
