//! Pipeline stages: choosing the split (from the cost model or measured pass times, with
//! the graph file's `stages` pins) and cutting a bound graph into one subgraph per stage.
//! A stage's inputs are the graph inputs it reads plus the activations earlier stages
//! produce for it; its outputs are the graph outputs it computes plus the activations
//! later stages read. Constants and weights read as values (`param`) are not
//! partitioned: every stage that reads one has its own copy, so none crosses a cut.

use super::cost::Rates;
use super::partition::{partition, Partition};
use super::{storage_for, PlanOptions};
use crate::error::RunError;
use crate::graph::{doc::InputDecl, Graph, GraphDoc, NodeKind};
use crate::ops::CostOperand;
use crate::shape;
use petgraph::stable_graph::NodeIndex;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap, HashSet};

/// One stage: its subgraph and how its inputs and outputs map to the run's values.
#[derive(Debug, Clone)]
pub struct StageSpec {
    /// Stage index.
    pub index: usize,
    /// The stage's subgraph (bound).
    pub graph: Graph,
    /// (input name in the subgraph, value key in the run): graph inputs keep their names;
    /// activations from earlier stages are keyed by their reference (`node`, `node:1`).
    pub inputs: Vec<(String, String)>,
    /// Value keys this stage produces for later stages or as graph outputs.
    pub outputs: Vec<String>,
    /// Keys among `inputs` that come from another stage.
    pub transferred_inputs: Vec<String>,
    /// Keys among `outputs` that only feed later stages.
    pub transferred_outputs: Vec<String>,
}

/// The split of a graph into stages.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StagePlanSummary {
    /// Node ids of each stage.
    pub nodes: Vec<Vec<String>>,
    /// The partition (costs per stage in seconds).
    pub partition: Partition,
}

fn key(graph: &Graph, node: NodeIndex, port: usize) -> String {
    let id = &graph.dag[node].id;
    if port == 0 {
        id.clone()
    } else {
        format!("{id}:{port}")
    }
}

/// Whether every stage reading the node computes it itself: a constant or a weight read
/// as a value (`param`), which reads nothing, depends on no sample and costs no compute.
/// The stage's device takes the constant from its plan and the weight from the run's
/// weights, as a one-stage run does.
fn is_replicated(graph: &Graph, ix: NodeIndex) -> bool {
    match &graph.dag[ix].kind {
        NodeKind::Op(op) => op.constant_value().is_some() || op.param_key().is_some(),
        NodeKind::Input => false,
    }
}

/// Bytes of a node output in the storage the options give its dtype (saturating: a
/// cost, never a size).
fn value_bytes(graph: &Graph, node: NodeIndex, port: usize, options: &PlanOptions) -> u64 {
    let Some(t) = graph.dag[node].outputs.get(port) else {
        return 0;
    };
    shape::concrete(&t.shape).map_or(0, |s| {
        let n = shape::numel(&s).unwrap_or(usize::MAX);
        storage_for(t.dtype, options).bytes(n)
    })
}

/// Operator nodes that take part in partitioning (constants and `param` reads go with
/// each of their consumers, so `stages` pins on them have no effect).
pub fn partition_nodes(graph: &Graph) -> Vec<NodeIndex> {
    graph
        .op_nodes()
        .map(|(ix, _, _)| ix)
        .filter(|&ix| !is_replicated(graph, ix))
        .collect()
}

/// Borrowed cost operands of (shape, element bytes) pairs.
pub(crate) fn cost_operands(v: &[(Vec<usize>, u64)]) -> Vec<CostOperand<'_>> {
    v.iter()
        .map(|(shape, element_bytes)| CostOperand {
            shape,
            element_bytes: *element_bytes,
        })
        .collect()
}

/// Predicted seconds of each partitioned node from the cost model at `rates`.
pub fn model_costs(graph: &Graph, rates: &Rates, options: &PlanOptions) -> Vec<f64> {
    partition_nodes(graph)
        .into_iter()
        .map(|ix| {
            let NodeKind::Op(op) = &graph.dag[ix].kind else {
                return 0.0;
            };
            let operand = |t: &crate::ops::TensorType| {
                (
                    shape::concrete(&t.shape).unwrap_or_default(),
                    storage_for(t.dtype, options).element_bytes(),
                )
            };
            let ins: Vec<(Vec<usize>, u64)> = graph.input_types(ix).iter().map(operand).collect();
            let outs: Vec<(Vec<usize>, u64)> = graph.dag[ix].outputs.iter().map(operand).collect();
            rates.seconds(&op.cost(&cost_operands(&ins), &cost_operands(&outs)))
        })
        .collect()
}

/// Chooses stages for a bound graph: `costs` per partitioned node (seconds), activations
/// crossing a cut priced at `rates`, the graph's `stages` pins respected.
pub fn choose(
    graph: &Graph,
    stages: usize,
    costs: &[f64],
    rates: &Rates,
    options: &PlanOptions,
) -> Result<Partition, RunError> {
    let nodes = partition_nodes(graph);
    let pos: HashMap<NodeIndex, usize> = nodes.iter().enumerate().map(|(i, &n)| (n, i)).collect();
    // cut[j]: seconds to move what is produced before position j and read at or after it.
    // Each value counts once per cut however many later nodes read it.
    let mut last_reader: HashMap<(NodeIndex, usize), usize> = HashMap::new();
    for (j, &n) in nodes.iter().enumerate() {
        for src in graph.node_inputs(n) {
            if pos.contains_key(&src.0) {
                let e = last_reader.entry(src).or_insert(j);
                *e = (*e).max(j);
            }
        }
    }
    let mut cut = vec![0.0; nodes.len() + 1];
    for (&(src, port), &last) in &last_reader {
        let first = pos[&src] + 1;
        let seconds = rates.transfer_seconds(value_bytes(graph, src, port, options));
        for c in cut.iter_mut().take(last + 1).skip(first) {
            *c += seconds;
        }
    }
    let pins: Vec<Option<usize>> = nodes
        .iter()
        .map(|&n| graph.doc.stages.get(&graph.dag[n].id).copied())
        .collect();
    partition(costs, &cut, stages, &pins).map_err(|message| RunError::Config {
        setting: "stages".into(),
        message,
    })
}

/// Cuts a bound graph into the stages of a partition (linear in the graph per stage:
/// every lookup goes through a map). A constant or `param` is a member of every stage
/// that reads it (and of the last stage when it is a graph output), never a value sent
/// from one stage to another.
pub fn split(graph: &Graph, part: &Partition) -> Result<Vec<StageSpec>, RunError> {
    let nodes = partition_nodes(graph);
    let stages = part.stage_costs.len();
    if part.stage_of.len() != nodes.len() || stages == 0 {
        return Err(RunError::Internal(
            "the partition does not match the graph".into(),
        ));
    }
    let stage_of: HashMap<NodeIndex, usize> = nodes
        .iter()
        .zip(&part.stage_of)
        .map(|(&n, &s)| (n, s))
        .collect();
    let graph_outputs: Vec<(NodeIndex, usize)> =
        graph.outputs.iter().map(|o| (o.node, o.port)).collect();
    let last = stages - 1;
    // The stages reading each value, and the stages computing each replicated node.
    let mut readers: HashMap<(NodeIndex, usize), Vec<usize>> = HashMap::new();
    let mut copies: HashMap<NodeIndex, HashSet<usize>> = HashMap::new();
    for &n in &nodes {
        let s = stage_of.get(&n).copied().unwrap_or(0);
        for src in graph.node_inputs(n) {
            readers.entry(src).or_default().push(s);
            if is_replicated(graph, src.0) {
                copies.entry(src.0).or_default().insert(s);
            }
        }
    }
    for &(ix, _) in &graph_outputs {
        if is_replicated(graph, ix) {
            copies.entry(ix).or_default().insert(last);
        }
    }
    let documents: HashMap<&str, &crate::graph::doc::NodeDoc> =
        graph.doc.nodes.iter().map(|n| (n.id.as_str(), n)).collect();
    let mut specs = Vec::new();
    for s in 0..stages {
        let mut doc = GraphDoc {
            format: graph.doc.format.clone(),
            name: format!("{} stage {s}", graph.doc.name),
            inputs: BTreeMap::new(),
            nodes: Vec::new(),
            outputs: Vec::new(),
            params: graph.doc.params.clone(),
            layout: BTreeMap::new(),
            stages: BTreeMap::new(),
            training: None,
        };
        let mut inputs = Vec::new();
        let mut transferred_inputs = Vec::new();
        let members: Vec<NodeIndex> = graph
            .order
            .iter()
            .copied()
            .filter(|ix| match stage_of.get(ix) {
                Some(&st) => st == s,
                None => copies.get(ix).is_some_and(|c| c.contains(&s)),
            })
            .collect();
        let member_set: HashSet<NodeIndex> = members.iter().copied().collect();
        let local = |ix: NodeIndex| member_set.contains(&ix);
        for &ix in &members {
            let node = &graph.dag[ix];
            let original = documents
                .get(node.id.as_str())
                .ok_or_else(|| RunError::Internal("node missing from its document".into()))?;
            let mut refs = Vec::new();
            for (src, port) in graph.node_inputs(ix) {
                if local(src) {
                    refs.push(key(graph, src, port));
                    continue;
                }
                let value_key = key(graph, src, port);
                let input_name = value_key.replace(':', "#");
                if !doc.inputs.contains_key(&input_name) {
                    let t = &graph.dag[src].outputs[port];
                    doc.inputs.insert(
                        input_name.clone(),
                        InputDecl {
                            shape: t.shape.clone(),
                            dtype: t.dtype,
                        },
                    );
                    inputs.push((input_name.clone(), value_key.clone()));
                    if !matches!(graph.dag[src].kind, NodeKind::Input) {
                        transferred_inputs.push(value_key);
                    }
                }
                refs.push(input_name);
            }
            let mut n = (*original).clone();
            n.inputs = refs;
            doc.nodes.push(n);
        }
        // Outputs: graph outputs computed here (a replicated one by the last stage only),
        // and values later stages read (never a replicated one: they have their copy).
        let mut outputs = Vec::new();
        let mut transferred_outputs = Vec::new();
        for &ix in &members {
            let replicated = is_replicated(graph, ix);
            for port in 0..graph.dag[ix].outputs.len() {
                let k = (ix, port);
                let later =
                    !replicated && readers.get(&k).is_some_and(|r| r.iter().any(|&st| st > s));
                let final_out = graph_outputs.contains(&k) && (!replicated || s == last);
                if later || final_out {
                    let name = key(graph, ix, port);
                    doc.outputs.push(name.clone());
                    if later && !final_out {
                        transferred_outputs.push(name.clone());
                    }
                    outputs.push(name);
                }
            }
        }
        let sub = Graph::build_with(doc, &graph.limits)
            .map_err(|p| RunError::Internal(format!("stage {s} subgraph: {p}")))?;
        specs.push(StageSpec {
            index: s,
            graph: sub,
            inputs,
            outputs,
            transferred_inputs,
            transferred_outputs,
        });
    }
    Ok(specs)
}

/// Node ids per stage, for printing.
pub fn summary(graph: &Graph, part: &Partition) -> StagePlanSummary {
    let nodes = partition_nodes(graph);
    let mut per: Vec<Vec<String>> = vec![Vec::new(); part.stage_costs.len()];
    for (n, &s) in nodes.iter().zip(&part.stage_of) {
        if let Some(stage) = per.get_mut(s) {
            stage.push(graph.dag[*n].id.clone());
        }
    }
    StagePlanSummary {
        nodes: per,
        partition: part.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A chain whose last layer holds almost all the compute, and whose smallest
    /// activation (8 features) sits two layers before it.
    fn chain() -> Graph {
        let doc = crate::graph::doc::decode_value(&json!({
            "format": "sluice/graph@1",
            "inputs": { "x": { "shape": [32, 64] } },
            "nodes": [
                { "id": "wide", "op": "linear", "inputs": ["x"], "attrs": { "out_features": 4096 } },
                { "id": "act", "op": "relu", "inputs": ["wide"] },
                { "id": "narrow", "op": "linear", "inputs": ["act"], "attrs": { "out_features": 8 } },
                { "id": "widen", "op": "linear", "inputs": ["narrow"], "attrs": { "out_features": 4096 } },
                { "id": "heavy", "op": "linear", "inputs": ["widen"], "attrs": { "out_features": 4096 } }
            ],
            "outputs": ["heavy"]
        }))
        .unwrap();
        Graph::build(doc).unwrap()
    }

    fn cut(rates: &Rates) -> Vec<Vec<String>> {
        let g = chain();
        let options = PlanOptions::default();
        let costs = model_costs(&g, rates, &options);
        let part = choose(&g, 2, &costs, rates, &options).unwrap();
        summary(&g, &part).nodes
    }

    #[test]
    fn the_cut_follows_the_measured_rates() {
        // Fast compute, slow link: moving activations dominates, so the cut goes where
        // the activation is smallest (after 'narrow', 8 features per sample).
        let slow_link = Rates {
            flops_per_s: 1e13,
            bytes_per_s: 1e13,
            transfer_bytes_per_s: 1e6,
            pass_overhead_s: 0.0,
        };
        // Slow compute, fast link: balancing compute dominates, so the heavy last layer
        // gets a stage of its own, even though a 4096-wide activation crosses the cut.
        let slow_compute = Rates {
            flops_per_s: 1e8,
            bytes_per_s: 1e10,
            transfer_bytes_per_s: 1e12,
            pass_overhead_s: 0.0,
        };
        let a = cut(&slow_link);
        let b = cut(&slow_compute);
        assert_eq!(a[1], vec!["widen", "heavy"], "slow link: {a:?}");
        assert_eq!(b[1], vec!["heavy"], "slow compute: {b:?}");
        assert_ne!(a, b);
    }

    #[test]
    fn a_value_read_by_several_later_nodes_crosses_a_cut_once() {
        let doc = crate::graph::doc::decode_value(&json!({
            "format": "sluice/graph@1",
            "inputs": { "x": { "shape": [4, 16] } },
            "nodes": [
                { "id": "a", "op": "relu", "inputs": ["x"] },
                { "id": "b", "op": "tanh", "inputs": ["a"] },
                { "id": "c", "op": "add", "inputs": ["a", "b"] },
                { "id": "d", "op": "mul", "inputs": ["a", "c"] }
            ],
            "outputs": ["d"]
        }))
        .unwrap();
        let g = Graph::build(doc).unwrap();
        let rates = Rates {
            flops_per_s: 1e30,
            bytes_per_s: 1e30,
            transfer_bytes_per_s: 1.0,
            pass_overhead_s: 0.0,
        };
        let options = PlanOptions::default();
        let costs = vec![0.0; 4];
        let part = choose(&g, 2, &costs, &rates, &options).unwrap();
        // A cut right after 'a' moves only 'a' (64 floats, 256 bytes), though three later
        // nodes read it; later cuts move two values. Counting 'a' once per reader would
        // make that cut the dearest instead of the cheapest.
        let bytes = (4 * 16 * 4) as f64;
        assert_eq!(part.stage_of, vec![0, 1, 1, 1], "{part:?}");
        assert!((part.bottleneck - bytes).abs() < 1e-9, "{part:?}");
    }

    #[test]
    fn constants_and_weights_are_copied_into_each_stage_reading_them() {
        let doc = crate::graph::doc::decode_value(&json!({
            "format": "sluice/graph@1",
            "inputs": { "x": { "shape": [4, 3] } },
            "nodes": [
                { "id": "c", "op": "constant", "attrs": { "value": [1.0, 2.0, 3.0] } },
                { "id": "k", "op": "constant", "attrs": { "value": [7.0] } },
                { "id": "w", "op": "param", "attrs": { "key": "w", "shape": [3, 3] } },
                { "id": "a", "op": "add", "inputs": ["x", "c"] },
                { "id": "p", "op": "matmul", "inputs": ["a", "w"] },
                { "id": "m", "op": "mul", "inputs": ["p", "c"] },
                { "id": "q", "op": "matmul", "inputs": ["m", "w"] },
                { "id": "s", "op": "add", "inputs": ["q", "x"] }
            ],
            "outputs": ["s", "k"],
            "stages": { "a": 0, "p": 0, "m": 1, "q": 2, "s": 2 }
        }))
        .unwrap();
        let g = Graph::build(doc).unwrap();
        let options = PlanOptions::default();
        let rates = Rates::ASSUMED;
        let costs = model_costs(&g, &rates, &options);
        let part = choose(&g, 3, &costs, &rates, &options).unwrap();
        let specs = split(&g, &part).unwrap();
        let ids = |s: &StageSpec| -> Vec<String> {
            let mut ids: Vec<String> = s.graph.doc.nodes.iter().map(|n| n.id.clone()).collect();
            ids.sort();
            ids
        };
        assert_eq!(ids(&specs[0]), ["a", "c", "p", "w"]);
        assert_eq!(ids(&specs[1]), ["c", "m"]);
        assert_eq!(ids(&specs[2]), ["k", "q", "s", "w"]);
        for spec in &specs {
            for shared in ["c", "w", "k"] {
                assert!(
                    !spec.transferred_inputs.iter().any(|k| k == shared)
                        && !spec.outputs.iter().any(|k| k == shared && spec.index < 2),
                    "stage {}: {spec:?}",
                    spec.index
                );
            }
        }
        // The graph input goes to both stages reading it, from the run's data.
        assert!(specs[0].inputs.contains(&("x".into(), "x".into())));
        assert!(specs[2].inputs.contains(&("x".into(), "x".into())));
        assert_eq!(specs[2].transferred_inputs, ["m"]);
        assert_eq!(specs[2].outputs, ["k", "s"]);
    }
}
