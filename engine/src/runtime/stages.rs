//! Pipeline stages: choosing the split (from the cost model or measured pass times, with
//! the graph file's `stages` pins) and cutting a bound graph into one subgraph per stage.
//! A stage's inputs are the graph inputs it reads plus the activations earlier stages
//! produce for it; its outputs are the graph outputs it computes plus the activations
//! later stages read.

use super::partition::{partition, Partition};
use super::RunError;
use crate::graph::{doc::InputDecl, Graph, GraphDoc, NodeKind};
use crate::ops::Op;
use crate::shape;
use petgraph::stable_graph::NodeIndex;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};

/// Assumed device throughput for the cost model, FLOP/s (lavapipe on 2 cores measures
/// about 10^10 on matmul).
const FLOPS_PER_S: f64 = 1e10;
/// Assumed device memory bandwidth for the cost model, bytes/s.
const BYTES_PER_S: f64 = 1e10;
/// Assumed host round trip for activations between stages, bytes/s.
const TRANSFER_BYTES_PER_S: f64 = 2e9;

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
#[derive(Debug, Clone, Serialize)]
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

fn is_constant(graph: &Graph, ix: NodeIndex) -> bool {
    matches!(graph.dag[ix].kind, NodeKind::Op(Op::Constant(_)))
}

/// Operator nodes that take part in partitioning (constants go with their consumers).
pub fn partition_nodes(graph: &Graph) -> Vec<NodeIndex> {
    graph
        .op_nodes()
        .map(|(ix, _, _)| ix)
        .filter(|&ix| !is_constant(graph, ix))
        .collect()
}

/// Predicted seconds of each partitioned node from the cost model.
pub fn model_costs(graph: &Graph) -> Vec<f64> {
    partition_nodes(graph)
        .into_iter()
        .map(|ix| {
            let ins: Vec<Vec<usize>> = graph
                .input_types(ix)
                .iter()
                .map(|t| shape::concrete(&t.shape).unwrap_or_default())
                .collect();
            let outs: Vec<Vec<usize>> = graph.dag[ix]
                .outputs
                .iter()
                .map(|t| shape::concrete(&t.shape).unwrap_or_default())
                .collect();
            let NodeKind::Op(op) = &graph.dag[ix].kind else {
                return 0.0;
            };
            let c = op.cost(&ins, &outs);
            c.flops as f64 / FLOPS_PER_S + (c.bytes_read + c.bytes_written) as f64 / BYTES_PER_S
        })
        .collect()
}

/// Chooses stages for a bound graph: `costs` per partitioned node (seconds), the graph's
/// `stages` pins respected.
pub fn choose(graph: &Graph, stages: usize, costs: &[f64]) -> Result<Partition, RunError> {
    let nodes = partition_nodes(graph);
    let pos: HashMap<NodeIndex, usize> = nodes.iter().enumerate().map(|(i, &n)| (n, i)).collect();
    // cut[j]: bytes produced before position j and read at or after it.
    let mut cut = vec![0.0; nodes.len() + 1];
    for (j, &n) in nodes.iter().enumerate() {
        for (src, port) in graph.node_inputs(n) {
            if let Some(&i) = pos.get(&src) {
                let bytes = shape::concrete(&graph.dag[src].outputs[port].shape)
                    .map_or(0, |s| shape::numel(&s) * 4);
                for c in cut.iter_mut().take(j + 1).skip(i + 1) {
                    *c += bytes as f64 / TRANSFER_BYTES_PER_S;
                }
            }
        }
    }
    let pins: Vec<Option<usize>> = nodes
        .iter()
        .map(|&n| graph.doc.stages.get(&graph.dag[n].id).copied())
        .collect();
    partition(costs, &cut, stages, &pins).map_err(|message| RunError::Op {
        node: "stages".into(),
        message,
    })
}

/// Cuts a bound graph into the stages of a partition.
pub fn split(graph: &Graph, part: &Partition) -> Result<Vec<StageSpec>, RunError> {
    let nodes = partition_nodes(graph);
    let stages = part.stage_costs.len();
    let mut stage_of: HashMap<NodeIndex, usize> = nodes
        .iter()
        .zip(&part.stage_of)
        .map(|(&n, &s)| (n, s))
        .collect();
    // Stage that first reads each value (for constants) and last stage reading it.
    let mut readers: HashMap<(NodeIndex, usize), Vec<usize>> = HashMap::new();
    for &n in &nodes {
        for src in graph.node_inputs(n) {
            readers.entry(src).or_default().push(stage_of[&n]);
        }
    }
    let graph_outputs: Vec<(NodeIndex, usize)> =
        graph.outputs.iter().map(|o| (o.node, o.port)).collect();
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
        };
        let mut inputs = Vec::new();
        let mut transferred_inputs = Vec::new();
        let members: Vec<NodeIndex> = graph
            .order
            .iter()
            .copied()
            .filter(|ix| match stage_of.get(ix) {
                Some(&st) => st == s,
                None => {
                    is_constant(graph, *ix)
                        && readers_of_node(graph, *ix, &nodes, &stage_of).contains(&s)
                }
            })
            .collect();
        for &ix in &members {
            if is_constant(graph, ix) {
                stage_of.entry(ix).or_insert(s);
            }
        }
        let local = |ix: NodeIndex| members.contains(&ix);
        for &ix in &members {
            let node = &graph.dag[ix];
            let original = graph
                .doc
                .nodes
                .iter()
                .find(|n| n.id == node.id)
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
            let mut n = original.clone();
            n.inputs = refs;
            doc.nodes.push(n);
        }
        // Outputs: graph outputs computed here, and values read by later stages.
        let mut outputs = Vec::new();
        let mut transferred_outputs = Vec::new();
        for &ix in &members {
            if is_constant(graph, ix) && stage_of.get(&ix) != Some(&s) {
                continue;
            }
            for port in 0..graph.dag[ix].outputs.len() {
                let k = (ix, port);
                let later = readers.get(&k).is_some_and(|r| r.iter().any(|&st| st > s))
                    && !is_constant(graph, ix);
                let final_out = graph_outputs.contains(&k);
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
        let sub = Graph::build(doc)
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

fn readers_of_node(
    graph: &Graph,
    ix: NodeIndex,
    nodes: &[NodeIndex],
    stage_of: &HashMap<NodeIndex, usize>,
) -> Vec<usize> {
    nodes
        .iter()
        .filter(|&&n| graph.node_inputs(n).iter().any(|&(src, _)| src == ix))
        .filter_map(|n| stage_of.get(n).copied())
        .collect()
}

/// Node ids per stage, for printing.
pub fn summary(graph: &Graph, part: &Partition) -> StagePlanSummary {
    let nodes = partition_nodes(graph);
    let mut per: Vec<Vec<String>> = vec![Vec::new(); part.stage_costs.len()];
    for (n, &s) in nodes.iter().zip(&part.stage_of) {
        per[s].push(graph.dag[*n].id.clone());
    }
    StagePlanSummary {
        nodes: per,
        partition: part.clone(),
    }
}
