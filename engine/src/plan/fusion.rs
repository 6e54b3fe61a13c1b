//! Fusion over operator capabilities: chains (and trees) of pointwise operators become one
//! unit, a chain of epilogue members after an epilogue anchor (`matmul`, `linear`,
//! `conv2d` declare themselves anchors) becomes that anchor's epilogue, and a pointwise
//! group whose every tensor operand has its result's shape becomes the prologue of the
//! reduction that folds it (the reductions declare `prologue`). Scalar constants are
//! inlined. An intermediate value may be fused away only when its one consumer is in
//! the same group and it is not a graph output. Fusion asks each operator what it can do
//! ([`crate::ops::Capabilities`]); it never names operators. Fused units compute f32
//! expressions, so a node fuses only when its outputs are f32 (integer and bool work, such
//! as i32 arithmetic or a `where` over i32 values, runs as a kernel of its own).

use crate::dtype::DType;
use crate::graph::{Graph, NodeKind};
use crate::ops::{Capabilities, Op};
use petgraph::stable_graph::NodeIndex;
use std::collections::{HashMap, HashSet};

/// A unit of lowering: one node, or several fused into one kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unit {
    /// One operator node.
    Single(NodeIndex),
    /// Pointwise nodes computed in one pass; `nodes` in topological order, the last is
    /// the one whose output leaves the group.
    Pointwise(Vec<NodeIndex>),
    /// An epilogue anchor with pointwise nodes applied to its result in its kernel.
    Epilogue {
        /// The anchor.
        anchor: NodeIndex,
        /// The pointwise chain, in order; the last one's output leaves the unit.
        chain: Vec<NodeIndex>,
    },
    /// A reduction reading its input from pointwise nodes computed in its kernel.
    Prologue {
        /// The pointwise group in topological order; the last one is the reduction's input.
        chain: Vec<NodeIndex>,
        /// The reduction, whose output leaves the unit.
        reducer: NodeIndex,
    },
}

impl Unit {
    /// The node whose output(s) leave the unit.
    pub fn root(&self) -> NodeIndex {
        match self {
            Unit::Single(n) => *n,
            Unit::Pointwise(nodes) => nodes.last().copied().unwrap_or(NodeIndex::end()),
            Unit::Epilogue { anchor, chain } => *chain.last().unwrap_or(anchor),
            Unit::Prologue { reducer, .. } => *reducer,
        }
    }

    /// Every node of the unit.
    pub fn nodes(&self) -> Vec<NodeIndex> {
        match self {
            Unit::Single(n) => vec![*n],
            Unit::Pointwise(nodes) => nodes.clone(),
            Unit::Epilogue { anchor, chain } => std::iter::once(*anchor)
                .chain(chain.iter().copied())
                .collect(),
            Unit::Prologue { chain, reducer } => chain
                .iter()
                .copied()
                .chain(std::iter::once(*reducer))
                .collect(),
        }
    }
}

/// The scalar value of a node's output when it is a one-element constant.
pub fn scalar_constant(graph: &Graph, node: NodeIndex) -> Option<f32> {
    let value = op(graph, node)?.constant_value()?;
    match value.as_f32() {
        Some([v]) => Some(*v),
        _ => None,
    }
}

fn op(graph: &Graph, n: NodeIndex) -> Option<&Op> {
    match &graph.dag[n].kind {
        NodeKind::Op(op) => Some(op),
        NodeKind::Input => None,
    }
}

/// What a node can do in a fused unit: its operator's capabilities, none when an output
/// is not f32 (fused units compute f32 expressions).
fn capabilities(graph: &Graph, n: NodeIndex) -> Capabilities {
    let f32_out = graph.dag[n].outputs.iter().all(|t| t.dtype == DType::F32);
    let caps = op(graph, n).map(Op::capabilities).unwrap_or_default();
    if f32_out {
        caps
    } else {
        Capabilities {
            pointwise: false,
            epilogue_member: false,
            ..caps
        }
    }
}

fn pointwise(graph: &Graph, n: NodeIndex) -> bool {
    capabilities(graph, n).pointwise
}

/// Number of uses of each node output (edges plus graph outputs).
fn uses(graph: &Graph) -> HashMap<(NodeIndex, usize), usize> {
    let mut u = HashMap::new();
    for &ix in &graph.order {
        for src in graph.node_inputs(ix) {
            *u.entry(src).or_insert(0) += 1;
        }
    }
    for o in &graph.outputs {
        *u.entry((o.node, o.port)).or_insert(0) += 1;
    }
    u
}

/// Whether `node`'s single consumer is `consumer` and it is not a graph output.
fn only_feeds(
    graph: &Graph,
    uses: &HashMap<(NodeIndex, usize), usize>,
    node: NodeIndex,
    consumer: NodeIndex,
) -> bool {
    uses.get(&(node, 0)) == Some(&1)
        && graph
            .node_inputs(consumer)
            .iter()
            .any(|&(n, p)| n == node && p == 0)
}

/// Whether a node can extend an epilogue whose running value is `value`: an epilogue
/// member reading only the running value, or the running value and a scalar constant (or,
/// for anchors that take rows, a 1-D tensor the length of a row).
fn epilogue_link(graph: &Graph, node: NodeIndex, value: NodeIndex, row: Option<usize>) -> bool {
    if !capabilities(graph, node).epilogue_member {
        return false;
    }
    let ins = graph.node_inputs(node);
    match ins.len() {
        1 => ins[0] == (value, 0),
        2 => {
            let Some(pos) = ins.iter().position(|&(n, p)| n == value && p == 0) else {
                return false;
            };
            let (other, port) = ins[1 - pos];
            if other == value {
                return false;
            }
            if scalar_constant(graph, other).is_some() {
                return true;
            }
            let t = &graph.dag[other].outputs[port];
            let out = &graph.dag[node].outputs[0];
            let value_t = &graph.dag[value].outputs[0];
            // The result keeps the anchor's shape and the operand is a row vector.
            row.is_some_and(|n| t.shape.len() == 1 && t.shape[0].known() == Some(n))
                && out.shape == value_t.shape
        }
        _ => false,
    }
}

/// Whether every tensor the pointwise group `members` reads from outside itself (scalar
/// constants are inlined) is f32 with the shape of `root`'s output, and there is one.
fn operands_match(graph: &Graph, members: &[NodeIndex], root: NodeIndex) -> bool {
    let result = &graph.dag[root].outputs[0];
    let mut tensors = 0;
    for &m in members {
        for (src, port) in graph.node_inputs(m) {
            if members.contains(&src) || scalar_constant(graph, src).is_some() {
                continue;
            }
            let t = &graph.dag[src].outputs[port];
            if t.dtype != DType::F32 || t.shape != result.shape {
                return false;
            }
            tensors += 1;
        }
    }
    tensors > 0
}

/// Groups the graph's operator nodes into units, in an order that respects dependencies.
pub fn units(graph: &Graph, fuse: bool) -> Vec<Unit> {
    let ops: Vec<NodeIndex> = graph.op_nodes().map(|(ix, _, _)| ix).collect();
    if !fuse {
        return ops.into_iter().map(Unit::Single).collect();
    }
    let uses = uses(graph);
    let consumers = |n: NodeIndex| -> Vec<NodeIndex> {
        graph
            .dag
            .neighbors_directed(n, petgraph::Direction::Outgoing)
            .collect::<HashSet<_>>()
            .into_iter()
            .collect()
    };
    let mut taken: HashSet<NodeIndex> = HashSet::new();
    let mut epilogues: HashMap<NodeIndex, Vec<NodeIndex>> = HashMap::new();
    // Epilogues first: anchors in topological order, chains extended greedily.
    for &a in &ops {
        let Some(anchor) = capabilities(graph, a).anchor else {
            continue;
        };
        let row = if anchor.row_operands {
            graph.dag[a].outputs[0].shape.last().and_then(|d| d.known())
        } else {
            None
        };
        let mut chain = Vec::new();
        let mut value = a;
        loop {
            let next = consumers(value);
            if next.len() != 1
                || !only_feeds(graph, &uses, value, next[0])
                || !epilogue_link(graph, next[0], value, row)
            {
                break;
            }
            chain.push(next[0]);
            taken.insert(next[0]);
            value = next[0];
        }
        if !chain.is_empty() {
            taken.insert(a);
            epilogues.insert(a, chain);
        }
    }
    // Pointwise groups: a node is absorbed into its one consumer when both are pointwise.
    let mut absorbed_into: HashMap<NodeIndex, NodeIndex> = HashMap::new();
    for &n in &ops {
        if taken.contains(&n) || !pointwise(graph, n) {
            continue;
        }
        let next = consumers(n);
        if next.len() == 1
            && !taken.contains(&next[0])
            && pointwise(graph, next[0])
            && only_feeds(graph, &uses, n, next[0])
        {
            absorbed_into.insert(n, next[0]);
        }
    }
    let root_of = |mut n: NodeIndex| {
        while let Some(&c) = absorbed_into.get(&n) {
            n = c;
        }
        n
    };
    let mut groups: HashMap<NodeIndex, Vec<NodeIndex>> = HashMap::new();
    for &n in &ops {
        if !taken.contains(&n) && pointwise(graph, n) {
            groups.entry(root_of(n)).or_default().push(n);
        }
    }
    // Prologues: a reduction takes the pointwise group computing its input when the group
    // feeds only it and every tensor the group reads is f32 of the group's result shape
    // (the kernel reads element i of each where it would read element i of its input).
    let mut prologues: HashMap<NodeIndex, NodeIndex> = HashMap::new();
    for &r in &ops {
        if !capabilities(graph, r).prologue {
            continue;
        }
        let ins = graph.node_inputs(r);
        let [(p, 0)] = ins.as_slice() else {
            continue;
        };
        let Some(members) = groups.get(p) else {
            continue;
        };
        if only_feeds(graph, &uses, *p, r) && operands_match(graph, members, *p) {
            prologues.insert(r, *p);
        }
    }
    let prologue_groups: HashSet<NodeIndex> = prologues.values().copied().collect();
    // Emit units when their root comes up in topological order: by then every input of
    // every member has been computed.
    let epilogue_roots: HashMap<NodeIndex, NodeIndex> = epilogues
        .iter()
        .map(|(&a, c)| (*c.last().unwrap_or(&a), a))
        .collect();
    let mut out = Vec::new();
    for &n in &ops {
        if let Some(&anchor) = epilogue_roots.get(&n) {
            out.push(Unit::Epilogue {
                anchor,
                chain: epilogues[&anchor].clone(),
            });
        } else if taken.contains(&n) || prologue_groups.contains(&n) {
            continue;
        } else if let Some(&group) = prologues.get(&n) {
            out.push(Unit::Prologue {
                chain: groups[&group].clone(),
                reducer: n,
            });
        } else if let Some(members) = groups.get(&n) {
            if members.len() == 1 {
                out.push(Unit::Single(n));
            } else {
                out.push(Unit::Pointwise(members.clone()));
            }
        } else if !absorbed_into.contains_key(&n) {
            out.push(Unit::Single(n));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{units, Unit};

    #[test]
    fn integer_and_bool_work_stays_out_of_fused_units() {
        // a, b i32: add → abs → where over i32 values stay single kernels; the f32 chain
        // leaky_relu → neg → mul fuses.
        let g = crate::load_graph(
            r#"{
              "format": "sluice/graph@1",
              "inputs": {
                "a": { "shape": [3], "dtype": "i32" },
                "b": { "shape": [3], "dtype": "i32" },
                "c": { "shape": [3], "dtype": "bool" },
                "x": { "shape": [3] }
              },
              "nodes": [
                { "id": "s", "op": "add", "inputs": ["a", "b"] },
                { "id": "t", "op": "abs", "inputs": ["s"] },
                { "id": "w", "op": "where", "inputs": ["c", "t", "b"] },
                { "id": "l", "op": "leaky_relu", "inputs": ["x"] },
                { "id": "n", "op": "neg", "inputs": ["l"] },
                { "id": "m", "op": "mul", "inputs": ["n", "x"] }
              ],
              "outputs": ["w", "m"]
            }"#,
        )
        .unwrap();
        let name = |n: petgraph::stable_graph::NodeIndex| g.dag[n].id.clone();
        let mut singles = Vec::new();
        let mut fused: Vec<Vec<String>> = Vec::new();
        for u in units(&g, true) {
            match u {
                Unit::Single(n) => singles.push(name(n)),
                Unit::Pointwise(nodes) => fused.push(nodes.into_iter().map(name).collect()),
                Unit::Epilogue { .. } | Unit::Prologue { .. } => panic!("no anchors here"),
            }
        }
        singles.sort();
        assert_eq!(singles, ["s", "t", "w"]);
        assert_eq!(fused, vec![vec!["l", "n", "m"]]);
    }
}
