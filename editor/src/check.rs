//! The engine's view of the graph being edited, compiled into the page: the type of every
//! edge and every problem ([`analyse`]), which nodes couple the batch ([`coupling_notes`],
//! [`batch_line`]), whether a connection fits ([`connect`]) and the pipeline stage of every
//! node ([`stage_of_nodes`]), so the editor shows exactly what the CLI and server would say.

use crate::model;
use serde_json::{Map, Value};
use sluice_engine::exec::dataset;
use sluice_engine::exec::session::partition_for;
use sluice_engine::graph::{Analysis, Batch, GraphDoc};
use sluice_engine::ops::TensorType;
use sluice_engine::plan::cost::Rates;
use sluice_engine::plan::PlanOptions;
use std::collections::{BTreeMap, BTreeSet};

/// Checks the document and infers every type it can.
pub fn analyse(doc: &GraphDoc) -> Analysis {
    sluice_engine::graph::analyse(&model::to_json(doc))
}

/// One note per node that couples samples, as (node, text), in the engine's order. Notes,
/// not problems: the graph stays valid, but runs that cut it into micro-batches are refused.
pub fn coupling_notes(a: &Analysis) -> Vec<(String, String)> {
    a.couplings
        .iter()
        .map(|c| {
            let text = format!(
                "note: '{}' couples samples ({}): micro-batches, or datasets of another size than one batch, are refused",
                c.node, c.reason
            );
            (c.node.clone(), text)
        })
        .collect()
}

/// Where the batch lives in a node's (or graph input's) first output, in one line for its
/// property panel; `None` when the engine could not type it.
pub fn batch_line(a: &Analysis, id: &str) -> Option<String> {
    let line = match a.batch.get(id)?.first()? {
        Batch::None => "Batch: does not depend on the batch.".to_string(),
        Batch::Axis { axis } => {
            format!("Batch: axis {axis}; samples stay independent (micro-batching keeps the answer).")
        }
        Batch::Coupled { node, reason } if node == id => format!(
            "Batch: couples samples ({reason}). Runs with micro-batches, or datasets of another size than one batch, are refused."
        ),
        Batch::Coupled { node, reason } => {
            format!("Batch: samples were combined upstream by '{node}' ({reason}).")
        }
    };
    Some(line)
}

/// Connects output `from` to input `port` of `to`, or says why not: structural reasons
/// first (cycles, graph inputs), then the engine's own inference message when the
/// operator cannot take what would arrive at its inputs.
pub fn connect(doc: &GraphDoc, from: &str, to: &str, port: usize) -> Result<GraphDoc, String> {
    let mut next = doc.clone();
    model::connect(&mut next, from, to, port)?;
    let analysis = analyse(&next);
    match analysis.type_errors.get(to) {
        Some(message) => Err(format!(
            "'{to}' cannot take '{from}' at input {port}: {message}"
        )),
        None => Ok(next),
    }
}

/// The inferred type of output reference `reference` (`node` or `node:k`), if known.
pub fn type_of(a: &Analysis, reference: &str) -> Option<TensorType> {
    let (node, port) = model::parse_ref(reference);
    a.types.get(node)?.get(port).cloned()
}

/// Whether operator `op` with `attrs` could take `inputs` (`None`: not known yet): `false`
/// only when the engine's own inference refuses them, so nothing that might fit is hidden.
fn might_take(op: &str, attrs: &Map<String, Value>, inputs: Vec<Option<TensorType>>) -> bool {
    let Ok(parsed) = sluice_engine::ops::parse(op, attrs) else {
        return true;
    };
    match inputs.into_iter().collect::<Option<Vec<_>>>() {
        Some(all) => parsed.infer(&all).is_ok(),
        None => true,
    }
}

/// The input ports (node, port) of `inputs` (each node with its drawn input count) that a
/// wire from output `from` could connect to: not the node itself or anything it depends
/// on (a cycle), and not a port whose operator the engine's inference says cannot take
/// the wire's type with the node's other inputs as they are. What marks ports while a
/// wire is drawn; dropping it still runs the full check ([`connect`]).
pub fn compatible_inputs(
    doc: &GraphDoc,
    a: &Analysis,
    from: &str,
    inputs: impl Iterator<Item = (String, usize)>,
) -> BTreeSet<(String, usize)> {
    let (source, _) = model::parse_ref(from);
    let blocked = model::upstream(doc, source);
    let wire = type_of(a, from);
    let mut out = BTreeSet::new();
    for (id, count) in inputs {
        let Some(node) = model::node(doc, &id) else {
            continue;
        };
        if blocked.contains(&id) {
            continue;
        }
        for port in 0..count {
            let types = (0..count.max(node.inputs.len()))
                .map(|k| {
                    if k == port {
                        wire.clone()
                    } else {
                        node.inputs
                            .get(k)
                            .filter(|r| !r.is_empty())
                            .and_then(|r| type_of(a, r))
                    }
                })
                .collect();
            if might_take(&node.op, &node.attrs, types) {
                out.insert((id.clone(), port));
            }
        }
    }
    out
}

/// Whether a new node of `op` with `inputs` ports (its attributes still unset) could take
/// a wire from `from` at its first input.
pub fn op_takes(a: &Analysis, from: &str, op: &str, inputs: usize) -> bool {
    let mut types = vec![None; inputs.max(1)];
    types[0] = type_of(a, from);
    might_take(op, &Map::new(), types)
}

/// How many weight values node `id` declares, from its attributes and the inferred types
/// of its inputs; `None` when they are not known yet (or the node declares none).
pub fn weight_count(doc: &GraphDoc, a: &Analysis, id: &str) -> Option<u64> {
    let node = model::node(doc, id)?;
    let op = sluice_engine::ops::parse(&node.op, &node.attrs).ok()?;
    let inputs: Vec<TensorType> = node
        .inputs
        .iter()
        .map(|r| type_of(a, r))
        .collect::<Option<_>>()?;
    let specs = op.params(&inputs).ok()?;
    let total = specs.iter().try_fold(0u64, |sum, p| {
        let size = p
            .shape
            .iter()
            .try_fold(1u64, |n, &d| n.checked_mul(u64::try_from(d).ok()?))?;
        sum.checked_add(size)
    })?;
    (total > 0).then_some(total)
}

/// Nodes and graph inputs whose outputs nothing reads and that are not graph outputs, in
/// the document's order: the engine runs a graph without them, so they are flagged
/// (notes, not problems) as work that does not count.
pub fn unused(doc: &GraphDoc) -> Vec<String> {
    let read: BTreeSet<&str> = doc
        .nodes
        .iter()
        .flat_map(|n| n.inputs.iter())
        .chain(doc.outputs.iter())
        .filter(|r| !r.is_empty())
        .map(|r| model::parse_ref(r).0)
        .collect();
    doc.inputs
        .keys()
        .chain(doc.nodes.iter().map(|n| &n.id))
        .filter(|id| !read.contains(id.as_str()))
        .cloned()
        .collect()
}

/// Stage settings of the run panel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StageSettings {
    /// Samples per batch.
    pub batch: usize,
    /// Micro-batches per batch.
    pub microbatches: usize,
    /// Pipeline stages.
    pub stages: usize,
}

/// The stage of every operator node as a run with these settings would place it: the
/// graph's pins, the rest by the engine's partitioner on its cost model at `rates` (the
/// server's calibrated rates when it reported them). `Err` says why no split exists (the
/// graph has problems, a pin is out of range, too few nodes).
pub fn stage_of_nodes(
    doc: &GraphDoc,
    settings: StageSettings,
    rates: &Rates,
) -> Result<BTreeMap<String, usize>, String> {
    if settings.stages <= 1 {
        return Ok(doc.nodes.iter().map(|n| (n.id.clone(), 0)).collect());
    }
    let graph = sluice_engine::graph::Graph::build(model::for_engine(doc))
        .map_err(|p| format!("the graph has {} problem(s) to fix first", p.0.len()))?;
    if settings.microbatches == 0 || !settings.batch.is_multiple_of(settings.microbatches) {
        return Err(format!(
            "batch {} does not split into {} micro-batches",
            settings.batch, settings.microbatches
        ));
    }
    let bound =
        dataset::bind(&graph, settings.batch / settings.microbatches).map_err(|e| e.to_string())?;
    let part = partition_for(&bound, settings.stages, rates, &PlanOptions::default())
        .map_err(|e| e.to_string())?;
    let summary = sluice_engine::plan::stages::summary(&bound, &part);
    let mut out = BTreeMap::new();
    for (s, nodes) in summary.nodes.iter().enumerate() {
        for id in nodes {
            out.insert(id.clone(), s);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn mlp() -> GraphDoc {
        let text = include_str!("../../assets/graphs/mlp.json");
        sluice_engine::graph::doc::decode(text).unwrap()
    }

    #[test]
    fn a_misfit_connection_is_refused_with_the_engine_message() {
        let mut d = model::empty("t");
        let x = model::add_input(&mut d, [0.0, 0.0]);
        let fc = model::add_op(&mut d, "linear", 1, [0.0, 0.0]);
        model::set_attr(&mut d, &fc, "out_features", Some(json!(10)));
        let d = connect(&d, &x, &fc, 0).unwrap();
        let mut d2 = d.clone();
        let add = model::add_op(&mut d2, "add", 2, [0.0, 0.0]);
        let d2 = connect(&d2, &x, &add, 0).unwrap();
        let e = connect(&d2, &fc, &add, 1).unwrap_err();
        assert!(e.contains("[N, 16]") && e.contains("[N, 10]"), "{e}");
        // A fitting one is taken, and the edge gets its type.
        let a = analyse(&connect(&d2, &x, &add, 1).unwrap());
        assert_eq!(a.types[&add][0].to_string(), "f32 [N, 16]");
    }

    #[test]
    fn a_wire_is_offered_the_ports_and_operators_that_can_take_it() {
        let d = mlp();
        let a = analyse(&d);
        let ports = d.nodes.iter().map(|n| (n.id.clone(), n.inputs.len()));
        let fits = compatible_inputs(&d, &a, "act1", ports);
        // Downstream inputs fit; the node itself and what it depends on would be a cycle.
        assert!(fits.contains(&("fc2".to_string(), 0)), "{fits:?}");
        assert!(fits.contains(&("probs".to_string(), 0)), "{fits:?}");
        assert!(!fits.contains(&("act1".to_string(), 0)));
        assert!(!fits.contains(&("fc1".to_string(), 0)));
        // An add whose other input is [N, 784] cannot take act1's [N, 512] beside it
        // (port 1), but can in that input's place (port 0).
        let mut d2 = d.clone();
        let add = model::add_op(&mut d2, "add", 2, [0.0, 0.0]);
        model::connect(&mut d2, "x", &add, 0).unwrap();
        let a2 = analyse(&d2);
        let fits = compatible_inputs(&d2, &a2, "act1", [(add.clone(), 2)].into_iter());
        assert_eq!(fits, BTreeSet::from([(add.clone(), 0)]));
        let fits = compatible_inputs(&d2, &a2, "x", [(add.clone(), 2)].into_iter());
        assert_eq!(fits.len(), 2);
        // New operators: a rank-2 wire fits relu, not a pooling over [N, C, H, W].
        assert!(op_takes(&a, "x", "relu", 1));
        assert!(!op_takes(&a, "x", "global_avg_pool", 1));
        assert!(
            op_takes(&a, "x", "matmul", 2),
            "its other input is not known yet"
        );
    }

    #[test]
    fn weights_are_counted_and_unread_nodes_flagged() {
        let mut d = mlp();
        let a = analyse(&d);
        // fc1: 784 × 512 weights and 512 biases.
        assert_eq!(weight_count(&d, &a, "fc1"), Some(784 * 512 + 512));
        assert_eq!(weight_count(&d, &a, "act1"), None);
        assert_eq!(unused(&d), Vec::<String>::new());
        let extra = model::add_op(&mut d, "relu", 1, [0.0, 0.0]);
        model::connect(&mut d, "fc2", &extra, 0).unwrap();
        assert_eq!(unused(&d), vec![extra]);
    }

    #[test]
    fn couplings_become_notes_and_property_lines() {
        let doc: GraphDoc = sluice_engine::graph::doc::decode(
            &json!({
                "format": "sluice/graph@1",
                "inputs": { "x": { "shape": ["N", 4] } },
                "nodes": [
                    { "id": "w", "op": "constant", "attrs": { "value": [1, 2, 3, 4] } },
                    { "id": "mix", "op": "softmax", "inputs": ["x"], "attrs": { "axis": 0 } },
                    { "id": "after", "op": "mul", "inputs": ["mix", "w"] }
                ],
                "outputs": ["after"]
            })
            .to_string(),
        )
        .unwrap();
        let a = analyse(&doc);
        assert!(a.problems.is_empty(), "{:?}", a.problems);
        let notes = coupling_notes(&a);
        assert_eq!(notes.len(), 1);
        assert_eq!(notes[0].0, "mix");
        assert!(notes[0].1.contains("softmax along axis 0, the batch axis"));
        assert!(batch_line(&a, "x").unwrap().contains("axis 0"));
        assert!(batch_line(&a, "w").unwrap().contains("does not depend"));
        assert!(batch_line(&a, "mix").unwrap().contains("couples samples"));
        assert!(batch_line(&a, "after")
            .unwrap()
            .contains("upstream by 'mix'"));
        assert_eq!(batch_line(&a, "nothing"), None);
        assert!(coupling_notes(&analyse(&mlp())).is_empty());
    }

    #[test]
    fn stages_come_from_pins_and_the_partitioner() {
        let doc = mlp();
        let settings = StageSettings {
            batch: 8,
            microbatches: 4,
            stages: 2,
        };
        let stages = stage_of_nodes(&doc, settings, &Rates::ASSUMED).unwrap();
        assert_eq!(stages.len(), doc.nodes.len());
        assert_eq!(stages[&doc.nodes[0].id], 0);
        assert_eq!(stages[&doc.nodes.last().unwrap().id], 1);
        // Pinning fc2 to stage 0 moves the cut after it.
        let mut pinned = doc.clone();
        model::set_stage(&mut pinned, "fc2", Some(0));
        let s = stage_of_nodes(&pinned, settings, &Rates::ASSUMED).unwrap();
        assert_eq!((s["fc1"], s["fc2"], s["probs"]), (0, 0, 1));
        let three = StageSettings {
            microbatches: 3,
            ..settings
        };
        assert!(stage_of_nodes(&doc, three, &Rates::ASSUMED)
            .unwrap_err()
            .contains("split"));
    }
}
