//! Graphs: the document format ([`doc`]) parsed under a budget ([`json`]), the limits
//! documents, graphs and runs stay within ([`limits`]) and the cheap check of a
//! document against them ([`check`]), problems ([`problem`]), the
//! checked, typed petgraph graph built from a document ([`build`]), where the batch lives
//! in every value ([`batch`]) and the live view of a document being edited
//! ([`analysis`]).

pub mod analysis;
pub mod batch;
pub mod build;
pub mod check;
pub mod doc;
pub mod json;
pub mod limits;
pub mod problem;
#[cfg(test)]
pub(crate) mod testing;
pub mod training;

use crate::ops::{Op, ParamSpec, TensorType};
use petgraph::stable_graph::{NodeIndex, StableDiGraph};
use petgraph::Direction;
use std::collections::{BTreeSet, HashMap};

pub use analysis::{analyse, Analysis};
pub use batch::{Batch, BatchSemantics, Coupling};
pub use check::check_document;
pub use doc::{GraphDoc, FORMAT};
pub use limits::{Limit, Limits};
pub use problem::{Problem, Problems};
pub use training::TrainingDoc;

/// A node of the typed graph.
#[derive(Debug, Clone)]
pub struct Node {
    /// The node id (or graph input name).
    pub id: String,
    /// Graph input or operator.
    pub kind: NodeKind,
    /// Type of each output.
    pub outputs: Vec<TensorType>,
    /// Weights the operator declares.
    pub params: Vec<ParamSpec>,
    /// Where the batch lives in each output (parallel to `outputs`).
    pub batch: Vec<Batch>,
}

impl Node {
    /// The operator name (`input` for graph inputs).
    pub fn op_name(&self) -> String {
        match &self.kind {
            NodeKind::Input => "input".into(),
            NodeKind::Op(op) => op.name().into(),
        }
    }

    /// The key of one of its declared weights in a weights file: `node.param`, or for a
    /// `param` operator the key it names (several nodes may declare one key, all with one
    /// shape).
    pub fn param_key(&self, spec: &ParamSpec) -> String {
        match &self.kind {
            NodeKind::Op(op) => match op.param_key() {
                Some(key) => key.to_string(),
                None => format!("{}.{}", self.id, spec.name),
            },
            NodeKind::Input => format!("{}.{}", self.id, spec.name),
        }
    }
}

/// What a node is.
#[derive(Debug, Clone)]
pub enum NodeKind {
    /// A graph input.
    Input,
    /// An operator.
    Op(Op),
}

/// An edge: output `from_port` of the source feeds input `to_port` of the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Edge {
    /// Output index on the source.
    pub from_port: usize,
    /// Input index on the target.
    pub to_port: usize,
}

/// A graph output: a node output under a name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputRef {
    /// The reference as written (`"probs"`, `"split1:1"`).
    pub name: String,
    /// The node.
    pub node: NodeIndex,
    /// Its output index.
    pub port: usize,
}

/// A validated graph: every edge typed, nodes in topological order.
#[derive(Debug, Clone)]
pub struct Graph {
    /// The document it was built from.
    pub doc: GraphDoc,
    /// The dataflow graph.
    pub dag: StableDiGraph<Node, Edge>,
    /// All nodes (inputs included) in topological order.
    pub order: Vec<NodeIndex>,
    /// Graph inputs by name.
    pub inputs: Vec<(String, NodeIndex)>,
    /// Graph outputs.
    pub outputs: Vec<OutputRef>,
    /// The limits it was built within; binding it and cutting it into stages keep them.
    pub limits: Limits,
}

/// Parses, checks and types a graph file within the default [`Limits`]. Reports every
/// problem at once.
pub fn load_graph(text: &str) -> Result<Graph, Problems> {
    load_graph_with(text, &Limits::default())
}

/// Parses, checks and types a graph file within `limits`: the text is parsed under its
/// budget and the document checked against the limits ([`check_document`]) before it is
/// built. Reports every problem at once (at most [`Limits::max_problems`]).
pub fn load_graph_with(text: &str, limits: &Limits) -> Result<Graph, Problems> {
    let mut p = problem::Collector::new(limits.max_problems);
    let graph = doc::decode_text_into(text, limits, &mut p)
        .and_then(|doc| build::build_into(doc, limits, &mut p).0);
    match graph {
        Some(g) if p.is_empty() => Ok(g),
        _ => Err(Problems(p.finish())),
    }
}

impl Graph {
    /// Checks and types a document within the default [`Limits`].
    pub fn build(doc: GraphDoc) -> Result<Graph, Problems> {
        Graph::build_with(doc, &Limits::default())
    }

    /// Checks and types a document within `limits` ([`check_document`] first).
    pub fn build_with(doc: GraphDoc, limits: &Limits) -> Result<Graph, Problems> {
        build::build(doc, limits).map_err(Problems)
    }

    /// The same graph with every symbolic dimension bound (all shapes concrete), checked
    /// again within the graph's limits at its real sizes.
    pub fn bind(&self, bindings: &HashMap<String, usize>) -> Result<Graph, Problems> {
        let mut doc = self.doc.clone();
        let mut problems = Vec::new();
        for (name, decl) in doc.inputs.iter_mut() {
            match crate::shape::bind(&decl.shape, bindings) {
                Ok(s) => decl.shape = s,
                Err(e) => problems.push(Problem::at(format!("inputs.{name}.shape"), e)),
            }
        }
        if !problems.is_empty() {
            return Err(Problems(problems));
        }
        Graph::build_with(doc, &self.limits)
    }

    /// The symbolic dimension names of the graph inputs.
    pub fn symbols(&self) -> BTreeSet<String> {
        let mut s = BTreeSet::new();
        for decl in self.doc.inputs.values() {
            for d in &decl.shape {
                if let crate::shape::Dim::Sym(name) = d {
                    s.insert(name.clone());
                }
            }
        }
        s
    }

    /// The sources of a node's inputs, in input order: (node, output port).
    pub fn node_inputs(&self, ix: NodeIndex) -> Vec<(NodeIndex, usize)> {
        let mut v: Vec<(usize, NodeIndex, usize)> = self
            .dag
            .edges_directed(ix, Direction::Incoming)
            .map(|e| {
                use petgraph::visit::EdgeRef;
                (e.weight().to_port, e.source(), e.weight().from_port)
            })
            .collect();
        v.sort_by_key(|x| x.0);
        v.into_iter().map(|(_, n, p)| (n, p)).collect()
    }

    /// The types of a node's inputs.
    pub fn input_types(&self, ix: NodeIndex) -> Vec<TensorType> {
        self.node_inputs(ix)
            .into_iter()
            .map(|(n, p)| self.dag[n].outputs[p].clone())
            .collect()
    }

    /// The operator nodes in topological order.
    pub fn op_nodes(&self) -> impl Iterator<Item = (NodeIndex, &Node, &Op)> {
        self.order
            .iter()
            .filter_map(|&ix| match &self.dag[ix].kind {
                NodeKind::Op(op) => Some((ix, &self.dag[ix], op)),
                NodeKind::Input => None,
            })
    }

    /// The type of a graph input by name.
    pub fn input_type(&self, name: &str) -> Option<&TensorType> {
        self.inputs
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, ix)| &self.dag[*ix].outputs[0])
    }
}
