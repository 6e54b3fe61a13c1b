//! Batch semantics: where the batch lives in every value of a graph, and which nodes
//! combine samples. A runtime cuts inputs into micro-batches (and datasets into batches)
//! along each input's batch axis and joins outputs along each output's; that only gives
//! the whole batch's answer when no output is [`Batch::Coupled`].
//!
//! Each operator declares its own rule next to its inference (`Op::batch`); this module
//! handles graph inputs, values that do not depend on the batch, and coupling that
//! propagates downstream from the node that caused it.

use super::Graph;
use crate::ops::{Op, TensorType};
use crate::shape::{show, Dim, Product};
use serde::{Deserialize, Serialize};

/// Where the batch lives in a value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Batch {
    /// Does not depend on the batch (weights, constants, values computed only from them).
    None,
    /// Samples stay independent along this axis: slicing the inputs' batch into pieces and
    /// computing each piece alone gives this value's pieces along this axis, concatenated
    /// in order (a piece may be a fixed multiple of the samples long, e.g. after [N,4]→[4N]).
    Axis {
        /// The batch axis.
        axis: usize,
    },
    /// Samples are combined; `node` is the first node (in topological order) on the path
    /// that combined them and `reason` says how, e.g.
    /// "reduce_sum over axis 0, the batch axis".
    Coupled {
        /// The node (or graph input) that combined samples.
        node: String,
        /// How it combined them.
        reason: String,
    },
}

impl Batch {
    /// The batch axis, when samples stay independent along one.
    pub fn axis(&self) -> Option<usize> {
        match self {
            Batch::Axis { axis } => Some(*axis),
            _ => None,
        }
    }

    /// The coupling, when samples are combined.
    pub fn coupling(&self) -> Option<Coupling> {
        match self {
            Batch::Coupled { node, reason } => Some(Coupling {
                node: node.clone(),
                reason: reason.clone(),
            }),
            _ => None,
        }
    }
}

/// A node that combines samples, and how.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Coupling {
    /// The node id (or graph input name).
    pub node: String,
    /// How it combines samples, e.g. "softmax along axis 0, the batch axis".
    pub reason: String,
}

/// The batch semantics of a graph: what a runtime needs to cut inputs and join outputs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchSemantics {
    /// Batch axis of each graph input, by name (None: not batched).
    pub inputs: Vec<(String, Option<usize>)>,
    /// Batch of each graph output, by output name, in output order.
    pub outputs: Vec<(String, Batch)>,
    /// Every node that couples samples itself (not merely downstream of one), in
    /// topological order.
    pub couplings: Vec<Coupling>,
}

impl BatchSemantics {
    /// The coupling that reaches a graph output first (what makes micro-batching change
    /// the answer), if any: of the couplings that some output carries, the one earliest in
    /// topological order.
    pub fn output_coupling(&self) -> Option<Coupling> {
        let reached: Vec<Coupling> = self
            .outputs
            .iter()
            .filter_map(|(_, b)| b.coupling())
            .collect();
        self.couplings
            .iter()
            .find(|c| reached.iter().any(|r| r.node == c.node))
            .cloned()
            .or_else(|| reached.into_iter().next())
    }

    /// Whether any input carries the batch (an input whose several symbolic dimensions
    /// make it coupled carries it too).
    pub fn batched(&self) -> bool {
        self.inputs.iter().any(|(_, a)| a.is_some()) || !self.couplings.is_empty()
    }
}

/// The batch of a graph input: its one symbolic dimension (with one symbol) is the batch
/// axis; no symbolic dimension means it does not depend on the batch; anything else
/// combines samples from the start.
pub(crate) fn of_input(name: &str, shape: &[Dim]) -> Batch {
    let mut symbolic = Vec::new();
    for (i, d) in shape.iter().enumerate() {
        let Some(p) = Product::of(std::slice::from_ref(d)) else {
            return Batch::Coupled {
                node: name.to_string(),
                reason: format!("dimension {d} of input '{name}' overflows"),
            };
        };
        if !p.syms.is_empty() {
            symbolic.push((i, p.syms.len()));
        }
    }
    match symbolic.as_slice() {
        [] => Batch::None,
        [(axis, 1)] => Batch::Axis { axis: *axis },
        [(axis, _)] => Batch::Coupled {
            node: name.to_string(),
            reason: format!(
                "input '{name}' {} multiplies several symbols in axis {axis}: its samples are not one block per sample",
                show(shape)
            ),
        },
        _ => Batch::Coupled {
            node: name.to_string(),
            reason: format!(
                "input '{name}' {} has {} symbolic dimensions: the batch must lie along one axis",
                show(shape),
                symbolic.len()
            ),
        },
    }
}

/// The batch of each output of operator node `id`, from its inputs' batches: a coupled
/// input couples every output (keeping the origin that `first` ranks earliest), inputs
/// that do not depend on the batch give outputs that do not either, and otherwise the
/// operator's own rule decides (an `Err` makes this node the origin of a coupling).
pub(crate) fn of_node(
    op: &Op,
    id: &str,
    inputs: &[TensorType],
    batches: &[Batch],
    outputs: &[TensorType],
    first: impl Fn(&str) -> usize,
) -> Vec<Batch> {
    let origin = batches
        .iter()
        .filter_map(|b| match b {
            Batch::Coupled { node, .. } => Some((first(node), b)),
            _ => None,
        })
        .min_by_key(|(rank, _)| *rank)
        .map(|(_, b)| b.clone());
    if let Some(coupled) = origin {
        return vec![coupled; outputs.len()];
    }
    let axes: Vec<Option<usize>> = batches.iter().map(Batch::axis).collect();
    if axes.iter().all(Option::is_none) {
        return vec![Batch::None; outputs.len()];
    }
    match op.batch(inputs, &axes, outputs) {
        Ok(axes) => (0..outputs.len())
            .map(|k| match axes.get(k).copied().flatten() {
                Some(axis) => Batch::Axis { axis },
                None => Batch::None,
            })
            .collect(),
        Err(reason) => vec![
            Batch::Coupled {
                node: id.to_string(),
                reason,
            };
            outputs.len()
        ],
    }
}

/// Every node (graph inputs included) of a possibly partial graph whose own outputs are
/// coupled by itself, in topological order.
pub(crate) fn couplings(graph: &Graph) -> Vec<Coupling> {
    graph
        .order
        .iter()
        .filter_map(|&ix| {
            let n = &graph.dag[ix];
            n.batch
                .iter()
                .filter_map(Batch::coupling)
                .find(|c| c.node == n.id)
        })
        .collect()
}

impl Graph {
    /// The batch semantics of the graph: each input's batch axis, each output's batch and
    /// every node that couples samples.
    pub fn batch_semantics(&self) -> BatchSemantics {
        let inputs = self
            .inputs
            .iter()
            .map(|(name, ix)| {
                let axis = self.dag[*ix].batch.first().and_then(Batch::axis);
                (name.clone(), axis)
            })
            .collect();
        let outputs = self
            .outputs
            .iter()
            .map(|o| {
                let b = self.dag[o.node]
                    .batch
                    .get(o.port)
                    .cloned()
                    .unwrap_or(Batch::None);
                (o.name.clone(), b)
            })
            .collect();
        BatchSemantics {
            inputs,
            outputs,
            couplings: couplings(self),
        }
    }

    /// The batch of each output of a node (empty when it could not be typed).
    pub fn batch_of(&self, id: &str) -> &[Batch] {
        self.order
            .iter()
            .map(|&ix| &self.dag[ix])
            .find(|n| n.id == id)
            .map_or(&[], |n| n.batch.as_slice())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::{analyse, load_graph};
    use serde_json::{json, Value};
    use std::collections::HashMap;

    fn graph(inputs: Value, nodes: Value, outputs: Value) -> Graph {
        let doc = json!({
            "format": "sluice/graph@1", "inputs": inputs, "nodes": nodes, "outputs": outputs
        });
        load_graph(&doc.to_string()).unwrap_or_else(|p| panic!("{p:?}"))
    }

    fn axis(axis: usize) -> Batch {
        Batch::Axis { axis }
    }

    fn origin(b: &Batch) -> &str {
        match b {
            Batch::Coupled { node, .. } => node,
            other => panic!("expected a coupled value, got {other:?}"),
        }
    }

    #[test]
    fn the_example_graphs_keep_samples_independent() {
        for text in [
            include_str!("../../../assets/graphs/mlp.json"),
            include_str!("../../../assets/graphs/cnn.json"),
            include_str!("../../../assets/graphs/transformer_block.json"),
        ] {
            let g = load_graph(text).unwrap();
            let s = g.batch_semantics();
            assert!(s.batched());
            assert_eq!(s.couplings, vec![]);
            assert_eq!(s.output_coupling(), None);
            assert!(s.inputs.iter().all(|(_, a)| *a == Some(0)), "{s:?}");
            assert!(s.outputs.iter().all(|(_, b)| *b == axis(0)), "{s:?}");
        }
    }

    #[test]
    fn inputs_take_their_one_symbolic_axis() {
        let g = graph(
            json!({
                "x": { "shape": [4, "N"] },
                "w": { "shape": [4, 4] },
                "pair": { "shape": ["N", "M"] }
            }),
            json!([{ "id": "y", "op": "relu", "inputs": ["x"] }]),
            json!(["y", "w", "pair"]),
        );
        let s = g.batch_semantics();
        let by_name: HashMap<&str, Option<usize>> =
            s.inputs.iter().map(|(n, a)| (n.as_str(), *a)).collect();
        assert_eq!(by_name["x"], Some(1));
        assert_eq!(by_name["w"], None);
        assert_eq!(by_name["pair"], None);
        assert_eq!(g.batch_of("w"), &[Batch::None]);
        assert_eq!(g.batch_of("y"), &[axis(1)]);
        assert_eq!(s.couplings.len(), 1);
        assert_eq!(s.couplings[0].node, "pair");
        assert!(s.couplings[0].reason.contains("2 symbolic dimensions"));
        assert_eq!(origin(&s.outputs[2].1), "pair");
        assert!(s.batched());
        // Dimensions the document format rejects still get an answer here.
        let dims = |d: &[&str]| -> Vec<Dim> { d.iter().map(|s| Dim::Sym(s.to_string())).collect() };
        assert_eq!(of_input("r", &dims(&["N*4"])), axis(0));
        assert_eq!(origin(&of_input("q", &dims(&["N*M"]))), "q");
    }

    #[test]
    fn a_reduction_over_samples_couples_its_output() {
        let g = graph(
            json!({ "x": { "shape": ["N", 4] } }),
            json!([{ "id": "sum", "op": "reduce_sum", "inputs": ["x"], "attrs": { "axes": [0] } }]),
            json!(["sum"]),
        );
        let s = g.batch_semantics();
        let c = Coupling {
            node: "sum".into(),
            reason: "reduce_sum over axis 0, the batch axis".into(),
        };
        assert_eq!(s.couplings, vec![c.clone()]);
        assert_eq!(s.output_coupling(), Some(c));
        assert_eq!(s.inputs, vec![("x".to_string(), Some(0))]);
    }

    #[test]
    fn coupling_propagates_downstream_naming_its_origin() {
        let g = graph(
            json!({ "x": { "shape": ["N", 4] } }),
            json!([
                { "id": "mix", "op": "softmax", "inputs": ["x"], "attrs": { "axis": 0 } },
                { "id": "act", "op": "relu", "inputs": ["mix"] },
                { "id": "fc", "op": "linear", "inputs": ["act"], "attrs": { "out_features": 2 } },
                { "id": "again", "op": "reduce_sum", "inputs": ["fc"], "attrs": { "axes": [0] } }
            ]),
            json!(["fc", "again"]),
        );
        for id in ["mix", "act", "fc", "again"] {
            assert_eq!(origin(&g.batch_of(id)[0]), "mix", "{id}");
        }
        let s = g.batch_semantics();
        assert_eq!(s.couplings.len(), 1, "{:?}", s.couplings);
        let c = s.output_coupling().unwrap();
        assert_eq!(c.node, "mix");
        assert_eq!(c.reason, "softmax along axis 0, the batch axis");
    }

    #[test]
    fn independent_branches_keep_their_own_batch() {
        let g = graph(
            json!({ "x": { "shape": ["N", 4] } }),
            json!([
                { "id": "scale", "op": "constant", "attrs": { "value": [1, 2, 3, 4] } },
                { "id": "bias", "op": "exp", "inputs": ["scale"] },
                { "id": "scaled", "op": "mul", "inputs": ["x", "scale"] },
                { "id": "t", "op": "transpose", "inputs": ["scaled"] },
                { "id": "cols", "op": "reduce_mean", "inputs": ["t"], "attrs": { "axes": [0], "keepdims": false } },
                { "id": "sum", "op": "reduce_sum", "inputs": ["x"], "attrs": { "axes": [0] } }
            ]),
            json!(["bias", "t", "cols", "sum"]),
        );
        let s = g.batch_semantics();
        let outs: Vec<&Batch> = s.outputs.iter().map(|(_, b)| b).collect();
        assert_eq!(outs[0], &Batch::None);
        assert_eq!(outs[1], &axis(1));
        assert_eq!(outs[2], &axis(0));
        assert_eq!(origin(outs[3]), "sum");
        assert_eq!(g.batch_of("scale"), &[Batch::None]);
        assert_eq!(g.batch_of("scaled"), &[axis(0)]);
        assert_eq!(s.couplings.len(), 1);
    }

    #[test]
    fn two_couplings_meeting_keep_the_earlier_origin() {
        let g = graph(
            json!({ "x": { "shape": ["N", 4] } }),
            json!([
                { "id": "a", "op": "softmax", "inputs": ["x"], "attrs": { "axis": 0 } },
                { "id": "b", "op": "reduce_mean", "inputs": ["x"], "attrs": { "axes": [0] } },
                { "id": "both", "op": "add", "inputs": ["a", "b"] }
            ]),
            json!(["both"]),
        );
        let pos = |id: &str| g.order.iter().position(|&ix| g.dag[ix].id == id).unwrap();
        let first = if pos("a") < pos("b") { "a" } else { "b" };
        assert_eq!(origin(&g.batch_of("both")[0]), first);
        let s = g.batch_semantics();
        assert_eq!(s.couplings.len(), 2);
        assert_eq!(s.couplings[0].node, first);
        assert_eq!(s.output_coupling().unwrap().node, first);
    }

    #[test]
    fn a_transposed_batch_flattened_couples_at_the_reshape() {
        let g = graph(
            json!({ "x": { "shape": ["N", 4] } }),
            json!([
                { "id": "t", "op": "transpose", "inputs": ["x"] },
                { "id": "flat", "op": "reshape", "inputs": ["t"], "attrs": { "shape": [-1] } },
                { "id": "ok", "op": "reshape", "inputs": ["x"], "attrs": { "shape": [-1] } }
            ]),
            json!(["flat", "ok"]),
        );
        assert_eq!(g.batch_of("t"), &[axis(1)]);
        assert_eq!(g.batch_of("ok"), &[axis(0)]);
        let c = g.batch_semantics().output_coupling().unwrap();
        assert_eq!(c.node, "flat");
        assert!(c.reason.contains("moves samples apart"), "{c:?}");
    }

    #[test]
    fn batched_indices_and_split_outputs() {
        let g = graph(
            json!({ "ids": { "shape": ["N", 3], "dtype": "i32" }, "x": { "shape": ["N", 4] } }),
            json!([
                { "id": "table", "op": "constant", "attrs": { "value": [1, 2, 3, 4, 5, 6], "shape": [3, 2] } },
                { "id": "emb", "op": "gather", "inputs": ["table", "ids"] },
                { "id": "halves", "op": "split", "inputs": ["x"], "attrs": { "axis": 1, "num_outputs": 2 } },
                { "id": "t", "op": "transpose", "inputs": ["halves:0"] },
                { "id": "pairs", "op": "matmul", "inputs": ["t", "halves:1"] }
            ]),
            json!(["emb", "halves:1", "pairs"]),
        );
        let s = g.batch_semantics();
        assert_eq!(s.outputs[0].1, axis(0));
        assert_eq!(s.outputs[1].1, axis(0));
        assert_eq!(g.batch_of("halves"), &[axis(0), axis(0)]);
        // [2,N]·[N,2] sums over samples.
        let c = s.output_coupling().unwrap();
        assert_eq!(c.node, "pairs");
        assert!(c.reason.contains("contracts axis 1 of a"), "{c:?}");
    }

    #[test]
    fn bound_graphs_are_not_batched() {
        let g = graph(
            json!({ "x": { "shape": ["N", 4] } }),
            json!([{ "id": "sum", "op": "reduce_sum", "inputs": ["x"], "attrs": { "axes": [0] } }]),
            json!(["sum"]),
        );
        let bound = g.bind(&HashMap::from([("N".to_string(), 3)])).unwrap();
        let s = bound.batch_semantics();
        assert!(!s.batched());
        assert_eq!(s.outputs, vec![("sum".to_string(), Batch::None)]);
        assert_eq!(s.output_coupling(), None);
    }

    #[test]
    fn partial_analyses_report_couplings_and_batches() {
        let a = analyse(&json!({
            "format": "sluice/graph@1",
            "inputs": { "x": { "shape": ["N", 4] } },
            "nodes": [
                { "id": "mix", "op": "softmax", "inputs": ["x"], "attrs": { "axis": 0 } },
                { "id": "bad", "op": "add", "inputs": ["mix", "missing"] },
                { "id": "fine", "op": "relu", "inputs": ["x"] }
            ],
            "outputs": ["bad"]
        }));
        assert!(!a.problems.is_empty());
        assert_eq!(a.couplings.len(), 1);
        assert_eq!(a.couplings[0].node, "mix");
        assert_eq!(a.batch["x"], vec![axis(0)]);
        assert_eq!(a.batch["fine"], vec![axis(0)]);
        assert!(!a.batch.contains_key("bad"));
    }

    #[test]
    fn batches_serialise_with_a_kind_tag() {
        let values = [
            (Batch::None, json!({ "kind": "none" })),
            (axis(2), json!({ "kind": "axis", "axis": 2 })),
            (
                Batch::Coupled {
                    node: "s".into(),
                    reason: "r".into(),
                },
                json!({ "kind": "coupled", "node": "s", "reason": "r" }),
            ),
        ];
        for (b, v) in values {
            assert_eq!(serde_json::to_value(&b).unwrap(), v);
            assert_eq!(serde_json::from_value::<Batch>(v).unwrap(), b);
        }
    }

    #[test]
    fn every_rule_answers_every_placement_of_the_batch() {
        for text in [
            include_str!("../../../assets/graphs/mlp.json"),
            include_str!("../../../assets/graphs/cnn.json"),
            include_str!("../../../assets/graphs/transformer_block.json"),
        ] {
            let g = load_graph(text).unwrap();
            for (ix, node, op) in g.op_nodes() {
                let inputs = g.input_types(ix);
                // Every input unbatched or batched on any of its axes.
                let mut placements: Vec<Vec<Option<usize>>> = vec![vec![]];
                for t in &inputs {
                    let choices: Vec<Option<usize>> = std::iter::once(None)
                        .chain((0..t.shape.len()).map(Some))
                        .collect();
                    placements = placements
                        .iter()
                        .flat_map(|p| {
                            choices.iter().map(move |c| {
                                let mut q = p.clone();
                                q.push(*c);
                                q
                            })
                        })
                        .collect();
                }
                for axes in placements {
                    if let Ok(out) = op.batch(&inputs, &axes, &node.outputs) {
                        assert_eq!(out.len(), node.outputs.len(), "{}", node.id);
                        for (a, t) in out.iter().zip(&node.outputs) {
                            assert!(a.is_none_or(|a| a < t.shape.len()), "{}", node.id);
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn malformed_rule_calls_are_errors_not_panics() {
        let op = crate::ops::parse("relu", &Default::default()).unwrap();
        let t = crate::ops::TensorType::f32(vec![Dim::Sym("N".into())]);
        let ts = std::slice::from_ref(&t);
        assert!(op.batch(ts, &[Some(3)], ts).is_err());
        assert!(op.batch(ts, &[], ts).is_err());
        assert_eq!(op.batch(ts, &[None], ts), Ok(vec![None]));
        let matmul = crate::ops::parse("matmul", &Default::default()).unwrap();
        assert!(matmul.batch(ts, &[Some(0)], ts).is_err());
        assert!(matmul.batch(&[], &[], &[]).is_err());
    }
}
