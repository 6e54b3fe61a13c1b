//! Builds the typed petgraph graph from a document: limits first, then names, operators
//! and attributes, references, arity, cycles, shape and dtype inference (every inferred
//! type and every weight checked against the limits), outputs, editor hints. Every
//! problem is collected; nothing stops at the first. Linear in the document apart from
//! sorting: names are looked up in maps, never by scanning nodes.

use super::batch::{self, Batch};
use super::doc::GraphDoc;
use super::limits::{check_document, echo, Limit, Limits};
use super::problem::Collector;
use super::{Edge, Graph, Node, NodeKind, OutputRef, Problem};
use crate::ops::{self, Op, ParamSpec};
use petgraph::algo::{tarjan_scc, toposort};
use petgraph::stable_graph::{NodeIndex, StableDiGraph};
use std::collections::{BTreeMap, HashMap};

/// "Did you mean" hints are looked for this many times at most (each scans every name).
const MAX_SUGGESTIONS: usize = 16;

/// Bytes of an f32 weight or constant element.
const F32_BYTES: u64 = 4;

/// A parsed input reference: name and output port.
fn parse_ref(r: &str) -> (&str, Option<usize>) {
    match r.rsplit_once(':') {
        Some((name, port)) => match port.parse::<usize>() {
            Ok(p) => (name, Some(p)),
            Err(_) => (r, None),
        },
        None => (r, None),
    }
}

/// Whether a name is usable as an id or input name (its length is a limit, checked
/// first by [`check_document`]).
fn valid_name(s: &str) -> bool {
    !s.is_empty() && !s.contains(':') && s.chars().all(|c| !c.is_control())
}

/// Closest known name, for "did you mean" hints.
fn suggest<'a>(name: &str, known: impl Iterator<Item = &'a String>) -> String {
    let lower = name.to_lowercase();
    known
        .filter(|k| {
            let k = k.to_lowercase();
            k.starts_with(&lower) || lower.starts_with(&k) || k.contains(&lower)
        })
        .map(|k| format!(" (did you mean '{k}'?)"))
        .next()
        .unwrap_or_default()
}

/// Checks and types a document within `limits`.
pub fn build(doc: GraphDoc, limits: &Limits) -> Result<Graph, Vec<Problem>> {
    let partial = build_partial(doc, limits);
    match partial.graph {
        Some(g) if partial.problems.is_empty() => Ok(g),
        _ => Err(partial.problems),
    }
}

/// What checking a document found, even when it has problems: the graph as far as it
/// could be typed (absent only when it is over the limits or has a cycle), every problem,
/// and the nodes whose shape/dtype inference failed.
pub struct Partial {
    /// The graph; nodes that could not be typed have no output types.
    pub graph: Option<Graph>,
    /// Every problem found.
    pub problems: Vec<Problem>,
    /// Node id → the inference error of that node (its inputs' shapes or dtypes do not fit).
    pub type_errors: BTreeMap<String, String>,
}

/// The size of one weight, checked: its elements against the limit.
fn weight_elements(limits: &Limits, key: &str, spec: &ParamSpec) -> Result<u64, String> {
    let n = spec
        .shape
        .iter()
        .try_fold(1u64, |a, &d| a.checked_mul(u64::try_from(d).ok()?));
    limits
        .check(
            Limit::MaxTensorElements,
            format!("weight '{key}' {:?}", spec.shape),
            "elements",
            n,
        )
        .map_err(|e| e.to_string())?;
    Ok(n.unwrap_or(0))
}

/// Checks and types a document as far as possible (the editor's live view), within
/// `limits`: a document over them ([`check_document`]) is refused before anything is
/// built.
pub fn build_partial(doc: GraphDoc, limits: &Limits) -> Partial {
    let mut type_errors = BTreeMap::new();
    let over = check_document(&doc, limits);
    if !over.is_empty() {
        return Partial {
            graph: None,
            problems: over,
            type_errors,
        };
    }
    let mut p = Collector::new(limits.max_problems);
    let mut suggestions = 0;
    let mut suggest_once = |name: &str, known: &HashMap<String, NodeIndex>| {
        suggestions += 1;
        if suggestions > MAX_SUGGESTIONS {
            return String::new();
        }
        suggest(name, known.keys())
    };
    let mut dag: StableDiGraph<Node, Edge> = StableDiGraph::new();
    let mut by_name: HashMap<String, NodeIndex> = HashMap::new();
    let mut inputs = Vec::new();
    for (name, decl) in &doc.inputs {
        if !valid_name(name) {
            p.push(Problem::at(
                format!("inputs.{name}"),
                "input names must be non-empty, without ':' or control characters",
            ));
        }
        let ix = dag.add_node(Node {
            id: name.clone(),
            kind: NodeKind::Input,
            outputs: vec![ops::TensorType {
                shape: decl.shape.clone(),
                dtype: decl.dtype,
            }],
            params: Vec::new(),
            batch: vec![batch::of_input(name, &decl.shape)],
        });
        by_name.insert(name.clone(), ix);
        inputs.push((name.clone(), ix));
    }
    // Operators and attributes.
    let mut op_nodes: Vec<(usize, NodeIndex, Option<Op>)> = Vec::new();
    for (i, n) in doc.nodes.iter().enumerate() {
        if !valid_name(&n.id) {
            p.push(Problem::at(
                format!("nodes[{i}].id"),
                format!(
                    "'{}' is not a valid id: non-empty, without ':' or control characters",
                    n.id
                ),
            ));
        }
        if by_name.contains_key(&n.id) {
            p.push(Problem::node(
                &n.id,
                format!("nodes[{i}].id"),
                format!(
                    "duplicate id '{}' (ids and input names must be unique)",
                    n.id
                ),
            ));
            continue;
        }
        let op = match ops::parse(&n.op, &n.attrs) {
            Ok(op) => Some(op),
            Err(errs) => {
                for (field, message) in errs {
                    let f = if field == "op" {
                        format!("nodes[{i}].op")
                    } else {
                        format!("nodes[{i}].attrs.{field}")
                    };
                    p.push(Problem::node(&n.id, f, message));
                }
                None
            }
        };
        let ix = dag.add_node(Node {
            id: n.id.clone(),
            kind: NodeKind::Input,
            outputs: Vec::new(),
            params: Vec::new(),
            batch: Vec::new(),
        });
        by_name.insert(n.id.clone(), ix);
        op_nodes.push((i, ix, op));
    }
    // References and arity.
    let mut arity_ok: HashMap<NodeIndex, bool> = HashMap::new();
    for (i, ix, op) in &op_nodes {
        let n = &doc.nodes[*i];
        let mut ok = true;
        for (k, r) in n.inputs.iter().enumerate() {
            let (name, port) = parse_ref(r);
            match by_name.get(name) {
                Some(&src) => {
                    dag.add_edge(
                        src,
                        *ix,
                        Edge {
                            from_port: port.unwrap_or(0),
                            to_port: k,
                        },
                    );
                }
                None => {
                    ok = false;
                    p.push(Problem::node(
                        &n.id,
                        format!("nodes[{i}].inputs[{k}]"),
                        format!(
                            "'{r}' is neither a graph input nor a node{}",
                            suggest_once(name, &by_name)
                        ),
                    ));
                }
            }
        }
        if let Some(op) = op {
            if let Err(e) = op.check_arity(n.inputs.len()) {
                ok = false;
                p.push(Problem::node(&n.id, format!("nodes[{i}].inputs"), e));
            }
        }
        arity_ok.insert(*ix, ok && op.is_some());
    }
    // Cycles.
    let order = match toposort(&dag, None) {
        Ok(order) => order,
        Err(_) => {
            for scc in tarjan_scc(&dag) {
                let self_loop = scc.len() == 1 && dag.contains_edge(scc[0], scc[0]);
                if scc.len() > 1 || self_loop {
                    let mut names: Vec<String> = scc.iter().map(|&ix| dag[ix].id.clone()).collect();
                    names.sort();
                    for name in &names {
                        p.push(Problem::node(
                            name,
                            "inputs",
                            format!("is part of a cycle: {}", names.join(" → ")),
                        ));
                    }
                }
            }
            return Partial {
                graph: None,
                problems: p.finish(),
                type_errors,
            };
        }
    };
    // Inference (types, then where the batch lives) in topological order.
    let position: HashMap<String, usize> = order
        .iter()
        .enumerate()
        .map(|(k, &ix)| (dag[ix].id.clone(), k))
        .collect();
    let ops_by_ix: HashMap<NodeIndex, (usize, Option<Op>)> = op_nodes
        .into_iter()
        .map(|(i, ix, op)| (ix, (i, op)))
        .collect();
    let mut graph = Graph {
        doc,
        dag,
        order: order.clone(),
        inputs,
        outputs: Vec::new(),
        limits: limits.clone(),
    };
    // Bytes of every weight and constant, checked against the limits at the end.
    let mut weight_bytes: Option<u64> = Some(0);
    for &ix in &order {
        let Some((i, op)) = ops_by_ix.get(&ix) else {
            continue;
        };
        let Some(op) = op else {
            continue;
        };
        graph.dag[ix].kind = NodeKind::Op(op.clone());
        if !arity_ok.get(&ix).copied().unwrap_or(false) {
            continue;
        }
        let id = graph.dag[ix].id.clone();
        let sources = graph.node_inputs(ix);
        let mut types = Vec::new();
        let mut batches = Vec::new();
        let mut ready = true;
        for (k, (src, port)) in sources.iter().enumerate() {
            let src_node = &graph.dag[*src];
            match src_node.outputs.get(*port) {
                Some(t) => {
                    types.push(t.clone());
                    batches.push(src_node.batch.get(*port).cloned().unwrap_or(Batch::None));
                }
                None => {
                    ready = false;
                    // Sources without types failed already; report only bad ports of typed sources.
                    if !src_node.outputs.is_empty() {
                        p.push(Problem::node(
                            &id,
                            format!("nodes[{i}].inputs[{k}]"),
                            format!(
                                "'{}' has {} output(s); port {port} does not exist",
                                src_node.id,
                                src_node.outputs.len()
                            ),
                        ));
                    }
                }
            }
        }
        if !ready {
            continue;
        }
        match op.infer(&types) {
            Ok(outs) => {
                let oversized: Vec<String> = outs
                    .iter()
                    .enumerate()
                    .filter_map(|(k, t)| {
                        let subject = format!("output {k} of '{id}', {t}");
                        limits.check_type(&subject, t).err().map(|e| e.to_string())
                    })
                    .collect();
                if !oversized.is_empty() {
                    for message in oversized {
                        p.push(Problem::node(&id, format!("nodes[{i}]"), message));
                    }
                    continue;
                }
                if let Some(c) = op.constant_value() {
                    let n = u64::try_from(c.len()).ok();
                    weight_bytes = weight_bytes
                        .zip(n)
                        .and_then(|(a, n)| a.checked_add(n.checked_mul(F32_BYTES)?));
                }
                match op.params(&types) {
                    Ok(params) => {
                        for spec in &params {
                            let key = format!("{id}.{}", spec.name);
                            match weight_elements(limits, &key, spec) {
                                Ok(n) => {
                                    weight_bytes = weight_bytes
                                        .and_then(|a| a.checked_add(n.checked_mul(F32_BYTES)?));
                                }
                                Err(e) => {
                                    p.push(Problem::node(&id, format!("nodes[{i}].attrs"), e))
                                }
                            }
                        }
                        graph.dag[ix].params = params;
                    }
                    Err(e) => p.push(Problem::node(&id, format!("nodes[{i}].inputs"), e)),
                }
                graph.dag[ix].batch = batch::of_node(op, &id, &types, &batches, &outs, |n| {
                    position.get(n).copied().unwrap_or(usize::MAX)
                });
                graph.dag[ix].outputs = outs;
            }
            Err(e) => {
                let shown: Vec<String> = types.iter().map(|t| t.to_string()).collect();
                let message = format!("{e} (inputs: {})", shown.join(", "));
                type_errors.insert(id.clone(), message.clone());
                p.push(Problem::node(&id, format!("nodes[{i}].inputs"), message));
            }
        }
    }
    for limit in [Limit::MaxHostBytes, Limit::MaxDeviceBytes] {
        if let Err(e) = limits.check(
            limit,
            "the graph's weights and constants",
            "bytes",
            weight_bytes,
        ) {
            p.push(Problem::at("nodes", e.to_string()));
        }
    }
    // Outputs.
    if graph.doc.outputs.is_empty() {
        p.push(Problem::at("outputs", "a graph needs at least one output"));
    }
    for (k, r) in graph.doc.outputs.iter().enumerate() {
        let (name, port) = parse_ref(r);
        match by_name.get(name).copied() {
            Some(ix) => {
                let port = port.unwrap_or(0);
                let node = &graph.dag[ix];
                if !node.outputs.is_empty() && port >= node.outputs.len() {
                    p.push(Problem::at(
                        format!("outputs[{k}]"),
                        format!("'{name}' has no output {port}"),
                    ));
                }
                graph.outputs.push(OutputRef {
                    name: r.clone(),
                    node: ix,
                    port,
                });
            }
            None => p.push(Problem::at(
                format!("outputs[{k}]"),
                format!(
                    "output '{r}' names nothing: no node or input is called '{name}'{}",
                    suggest_once(name, &by_name)
                ),
            )),
        }
    }
    for key in graph.doc.layout.keys() {
        if !by_name.contains_key(key) {
            p.push(Problem::at(
                format!("layout.{key}"),
                format!("layout names '{}', which is not a node", echo(key)),
            ));
        }
    }
    for (key, stage) in &graph.doc.stages {
        if !by_name.contains_key(key) {
            p.push(Problem::at(
                format!("stages.{key}"),
                format!("stages pins '{key}', which is not a node"),
            ));
        } else if *stage > 1024 {
            p.push(Problem::at(
                format!("stages.{key}"),
                format!("stage {stage} is out of range (0..1024)"),
            ));
        }
    }
    Partial {
        graph: Some(graph),
        problems: p.finish(),
        type_errors,
    }
}
