//! Builds the typed petgraph graph from a document: limits first, then names, operators
//! and attributes, references, arity, cycles, shape and dtype inference (every inferred
//! type and every weight checked against the limits), outputs, editor hints. Every
//! problem is collected; nothing stops at the first. Linear in the document apart from
//! sorting: names are looked up in maps, never by scanning nodes.

use super::batch::{self, Batch};
use super::check::check_document;
use super::doc::GraphDoc;
use super::limits::{echo, Limit, Limits};
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
    let mut p = Collector::new(limits.max_problems);
    match build_into(doc, limits, &mut p) {
        (Some(g), _) if p.is_empty() => Ok(g),
        _ => Err(p.finish()),
    }
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

/// Checks and types a document as far as possible (the editor's live view) within
/// `limits`, adding its problems to `p` (after the decoder's, so one cap covers both): a
/// document over the limits ([`check_document`]) is refused before anything is built.
/// Returns the graph as far as it could be typed (absent only when the document is over
/// the limits or has a cycle; nodes that could not be typed have no output types) and
/// node id → the inference error of each node whose inputs' shapes or dtypes do not fit.
pub(crate) fn build_into(
    doc: GraphDoc,
    limits: &Limits,
    p: &mut Collector,
) -> (Option<Graph>, BTreeMap<String, String>) {
    let mut type_errors = BTreeMap::new();
    let over = check_document(&doc, limits);
    if !over.is_empty() {
        p.extend(over);
        return (None, type_errors);
    }
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
            return (None, type_errors);
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
    // Every weight key with the node that declared it first and its shape: a key declared
    // again (a `param` reading another node's weight) must have the same shape, and its
    // bytes count once.
    let mut keys: HashMap<String, (String, Vec<usize>)> = HashMap::new();
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
                            let key = match op.param_key() {
                                Some(k) => k.to_string(),
                                None => format!("{id}.{}", spec.name),
                            };
                            if let Some((first, shape)) = keys.get(&key) {
                                if *shape != spec.shape {
                                    p.push(Problem::node(
                                        &id,
                                        format!("nodes[{i}]"),
                                        format!(
                                            "weight '{}' is {:?} here but {shape:?} in '{first}': one key, one shape",
                                            echo(&key),
                                            spec.shape
                                        ),
                                    ));
                                }
                                continue;
                            }
                            keys.insert(key.clone(), (id.clone(), spec.shape.clone()));
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
    (Some(graph), type_errors)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::testing::{random_document, Mode};
    use crate::graph::{analyse, load_graph};
    use proptest::prelude::*;
    use serde_json::{json, Value};

    fn problems(doc: &Value) -> Vec<String> {
        match load_graph(&doc.to_string()) {
            Ok(_) => Vec::new(),
            Err(p) => p.0.iter().map(|p| p.to_string()).collect(),
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(400))]

        /// Decoding, building, analysing, binding and planning a random document (any
        /// operator, extreme attributes and shapes) never panics, and every plan the
        /// builder makes passes the check devices apply to plans from elsewhere.
        #[test]
        fn random_documents_are_refused_or_planned_never_panic(seed in any::<u64>()) {
            for mode in [Mode::Hostile, Mode::Tame] {
                let doc = random_document(seed, mode);
                let analysis = analyse(&doc);
                match load_graph(&doc.to_string()) {
                    Ok(g) => {
                        prop_assert!(analysis.problems.is_empty());
                        if let Ok(bound) = crate::exec::dataset::bind(&g, 3) {
                            if let Ok(plan) = crate::plan::Plan::new(&bound) {
                                prop_assert!(plan.validate().is_ok(), "{:?}", plan.validate());
                                let text = serde_json::to_string(&plan).unwrap_or_default();
                                let back: crate::plan::Plan = serde_json::from_str(&text)
                                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                                prop_assert!(back.validate().is_ok());
                            }
                        }
                    }
                    Err(p) => prop_assert!(!p.0.is_empty()),
                }
            }
        }
    }

    #[test]
    fn a_linear_of_two_to_the_33_features_is_refused_naming_node_and_limit() {
        let p = problems(&json!({
            "format": "sluice/graph@1",
            "inputs": { "x": { "shape": ["N", 4] } },
            "nodes": [{ "id": "fc", "op": "linear", "inputs": ["x"],
                        "attrs": { "out_features": 1u64 << 33 } }],
            "outputs": ["fc"]
        }));
        assert!(
            p.iter()
                .any(|m| m.contains("node 'fc'") && m.contains("out_features must be at most")),
            "{p:#?}"
        );
        // Within the attribute's range but over the tensor limit: the output is refused.
        let p = problems(&json!({
            "format": "sluice/graph@1",
            "inputs": { "x": { "shape": ["N", 4096] } },
            "nodes": [{ "id": "fc", "op": "linear", "inputs": ["x"],
                        "attrs": { "out_features": i32::MAX } }],
            "outputs": ["fc"]
        }));
        assert!(
            p.iter().any(|m| m.contains("node 'fc'")
                && m.contains("max_tensor_elements")
                && m.contains("--max-tensor-elements")),
            "{p:#?}"
        );
        // And a weight alone over it (its output is small).
        let p = problems(&json!({
            "format": "sluice/graph@1",
            "inputs": { "x": { "shape": ["N", 65536] } },
            "nodes": [{ "id": "fc", "op": "linear", "inputs": ["x"],
                        "attrs": { "out_features": 8192 } }],
            "outputs": ["fc"]
        }));
        assert!(
            p.iter()
                .any(|m| m.contains("weight 'fc.weight'") && m.contains("max_tensor_elements")),
            "{p:#?}"
        );
    }

    #[test]
    fn weights_together_over_the_memory_limits_are_refused() {
        let nodes: Vec<Value> = (0..40)
            .map(|i| {
                json!({ "id": format!("fc{i}"), "op": "linear", "inputs": ["x"],
                             "attrs": { "out_features": 4096 } })
            })
            .collect();
        let p = problems(&json!({
            "format": "sluice/graph@1",
            "inputs": { "x": { "shape": ["N", 4096] } },
            "nodes": nodes,
            "outputs": ["fc0"]
        }));
        assert!(p.iter().any(|m| m.contains("max_host_bytes")), "{p:#?}");
    }

    #[test]
    fn inferred_types_over_the_limits_are_refused_where_they_arise() {
        // Unsqueezing past the rank limit, and expanding past the element limit.
        let p = problems(&json!({
            "format": "sluice/graph@1",
            "inputs": { "x": { "shape": ["N", 4] } },
            "nodes": [
                { "id": "u", "op": "unsqueeze", "inputs": ["x"], "attrs": { "axes": [0, 1, 2, 3, 4, 5, 6] } },
                { "id": "e", "op": "expand", "inputs": ["x"], "attrs": { "shape": [65536, 65536, 1, 4] } },
                { "id": "after", "op": "relu", "inputs": ["u"] }
            ],
            "outputs": ["after", "e"]
        }));
        assert!(
            p.iter()
                .any(|m| m.contains("node 'u'") && m.contains("max_rank")),
            "{p:#?}"
        );
        assert!(
            p.iter()
                .any(|m| m.contains("node 'e'") && m.contains("max_tensor_elements")),
            "{p:#?}"
        );
        assert!(!p.iter().any(|m| m.contains("node 'after'")), "{p:#?}");
    }

    /// A ~288 KB document of huge ranks and lists (what grew the server to 7.7 GB) is
    /// refused by the cheap checks, with a bounded list of problems.
    #[test]
    fn a_validate_bomb_is_refused_cheaply() {
        let ones = vec![1; 30_000];
        let axes: Vec<i64> = (0..30_000).collect();
        let nodes: Vec<Value> = (0..3)
            .map(|i| {
                json!({ "id": format!("u{i}"), "op": "unsqueeze", "inputs": ["x"],
                             "attrs": { "axes": axes } })
            })
            .collect();
        let doc = json!({
            "format": "sluice/graph@1",
            "inputs": { "x": { "shape": ones } },
            "nodes": nodes,
            "outputs": (0..3000).map(|i| format!("u{i}")).collect::<Vec<_>>()
        });
        let text = doc.to_string();
        assert!(text.len() > 250_000, "{}", text.len());
        let started = std::time::Instant::now();
        let p = problems(&doc);
        let analysis = analyse(&doc);
        eprintln!(
            "validate bomb of {} bytes: {:?}",
            text.len(),
            started.elapsed()
        );
        assert!(!p.is_empty() && p.len() < 20, "{p:#?}");
        assert!(p.iter().any(|m| m.contains("max_rank")), "{p:#?}");
        assert!(p.iter().any(|m| m.contains("max_outputs")), "{p:#?}");
        assert!(analysis.types.is_empty());
    }

    /// Problems are capped however many a document has.
    #[test]
    fn problem_lists_are_capped() {
        let nodes: Vec<Value> = (0..5000)
            .map(|i| json!({ "id": format!("n{i}"), "op": "relu", "inputs": ["missing"] }))
            .collect();
        let doc =
            json!({ "format": "sluice/graph@1", "inputs": {}, "nodes": nodes, "outputs": ["n0"] });
        let p = problems(&doc);
        assert_eq!(p.len(), Limits::default().max_problems + 1);
        assert!(
            p.last()
                .is_some_and(|m| m.contains("more problems not listed")),
            "{:?}",
            p.last()
        );
    }

    /// A 10,000-node graph (an ~800 KB document) builds, analyses, binds, plans and
    /// partitions in time linear in its size (up to sorting and the partitioner's
    /// O(S·n²)). The figures are printed, never asserted.
    #[test]
    fn ten_thousand_nodes_build_and_analyse_in_linear_time() {
        let mut nodes = Vec::new();
        let mut prev = vec!["x".to_string(), "x".to_string()];
        for i in 0..10_000 {
            let id = format!("node_with_a_longish_name_{i:05}");
            let node = match i % 4 {
                0 => json!({ "id": id, "op": "add", "inputs": [prev[0], prev[1]] }),
                1 => json!({ "id": id, "op": "relu", "inputs": [prev[0]] }),
                2 => json!({ "id": id, "op": "mul", "inputs": [prev[0], prev[1]] }),
                _ => {
                    json!({ "id": id, "op": "linear", "inputs": [prev[0]], "attrs": { "out_features": 16 } })
                }
            };
            nodes.push(node);
            prev = vec![id, prev[0].clone()];
        }
        let outputs: Vec<String> = (0..256)
            .map(|i| format!("node_with_a_longish_name_{:05}", 9999 - i * 4))
            .collect();
        let doc = json!({
            "format": "sluice/graph@1",
            "inputs": { "x": { "shape": ["N", 16] } },
            "nodes": nodes,
            "outputs": outputs
        });
        let text = doc.to_string();
        let t = std::time::Instant::now();
        let g = load_graph(&text).unwrap();
        let built = t.elapsed();
        let t = std::time::Instant::now();
        let a = analyse(&doc);
        let analysed = t.elapsed();
        assert!(a.problems.is_empty());
        let t = std::time::Instant::now();
        let bound = crate::exec::dataset::bind(&g, 4).unwrap();
        let plan = crate::plan::Plan::new(&bound).unwrap();
        plan.validate().unwrap();
        let planned = t.elapsed();
        let t = std::time::Instant::now();
        let options = crate::plan::PlanOptions::default();
        let rates = crate::plan::cost::Rates::ASSUMED;
        let part = crate::exec::session::partition_for(&bound, 4, &rates, &options).unwrap();
        let specs = crate::plan::stages::split(&bound, &part).unwrap();
        let split = t.elapsed();
        assert_eq!(specs.len(), 4);
        eprintln!(
            "10,000 nodes, {} bytes: load {built:?}, analyse {analysed:?}, bind+plan {planned:?}, partition+split into 4 {split:?}",
            text.len()
        );
    }
}
