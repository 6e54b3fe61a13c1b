//! The graph being edited, and every edit on it. The editor's model is the engine's own
//! [`GraphDoc`] (so what is saved is exactly what the CLI reads), with positions in
//! `layout` and one convention of the editor's: an empty input reference (`""`) is an
//! input port not connected yet. [`for_engine`] turns the model into the document that is
//! checked, saved and run. Pure data: no DOM, tested natively.

use serde_json::{Map, Value};
use sluice_engine::graph::doc::{InputDecl, NodeDoc, ParamsDoc};
use sluice_engine::graph::{GraphDoc, FORMAT};
use sluice_engine::shape::Dim;
use sluice_engine::DType;
use std::collections::{BTreeMap, BTreeSet};

/// A node output: `"fc1"` (output 0) or `"split1:1"`, as graph files write it.
pub fn output_ref(node: &str, port: usize) -> String {
    if port == 0 {
        node.to_string()
    } else {
        format!("{node}:{port}")
    }
}

/// Splits a reference into node and output port (`"split1:1"` → `("split1", 1)`).
pub fn parse_ref(r: &str) -> (&str, usize) {
    match r.rsplit_once(':') {
        Some((node, port)) => match port.parse() {
            Ok(p) => (node, p),
            Err(_) => (r, 0),
        },
        None => (r, 0),
    }
}

/// A new, empty graph.
pub fn empty(name: &str) -> GraphDoc {
    GraphDoc {
        format: FORMAT.to_string(),
        name: name.to_string(),
        inputs: BTreeMap::new(),
        nodes: Vec::new(),
        outputs: Vec::new(),
        params: ParamsDoc {
            seed: Some(0),
            file: None,
        },
        layout: BTreeMap::new(),
        stages: BTreeMap::new(),
        training: None,
    }
}

/// The document as the engine reads it: each node's inputs end before its first
/// unconnected port (the engine then reports the missing inputs by name).
pub fn for_engine(doc: &GraphDoc) -> GraphDoc {
    let mut d = doc.clone();
    for n in &mut d.nodes {
        if let Some(hole) = n.inputs.iter().position(String::is_empty) {
            n.inputs.truncate(hole);
        }
    }
    d
}

/// The document as JSON for the engine, the server and files.
pub fn to_json(doc: &GraphDoc) -> Value {
    serde_json::to_value(for_engine(doc)).unwrap_or(Value::Null)
}

/// Every id in the graph: input names and node ids.
pub fn ids(doc: &GraphDoc) -> BTreeSet<String> {
    doc.inputs
        .keys()
        .cloned()
        .chain(doc.nodes.iter().map(|n| n.id.clone()))
        .collect()
}

/// Whether `id` names a graph input.
pub fn is_input(doc: &GraphDoc, id: &str) -> bool {
    doc.inputs.contains_key(id)
}

/// The node with this id.
pub fn node<'a>(doc: &'a GraphDoc, id: &str) -> Option<&'a NodeDoc> {
    doc.nodes.iter().find(|n| n.id == id)
}

fn node_mut<'a>(doc: &'a mut GraphDoc, id: &str) -> Option<&'a mut NodeDoc> {
    doc.nodes.iter_mut().find(|n| n.id == id)
}

/// A fresh id: `base` followed by the smallest number not taken (`linear1`, `linear2`).
pub fn fresh_id(doc: &GraphDoc, base: &str) -> String {
    let taken = ids(doc);
    (1..)
        .map(|k| format!("{base}{k}"))
        .find(|id| !taken.contains(id))
        .unwrap_or_else(|| base.to_string())
}

/// Whether `id` may name a node: what the workspace accepts for names, so ids stay
/// readable in files and URLs (`A-Z a-z 0-9 _ -`, at most 64).
pub fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// Adds a graph input with a default declaration at `pos`; returns its name.
pub fn add_input(doc: &mut GraphDoc, pos: [f64; 2]) -> String {
    let name = if ids(doc).contains("x") {
        fresh_id(doc, "x")
    } else {
        "x".to_string()
    };
    doc.inputs.insert(
        name.clone(),
        InputDecl {
            shape: vec![Dim::Sym("N".into()), Dim::Known(16)],
            dtype: DType::F32,
        },
    );
    doc.layout.insert(name.clone(), pos);
    name
}

/// Adds an operator node with no attributes set (required ones are then reported by the
/// engine) and `inputs` unconnected ports; returns its id.
pub fn add_op(doc: &mut GraphDoc, op: &str, inputs: usize, pos: [f64; 2]) -> String {
    let id = fresh_id(doc, op);
    doc.nodes.push(NodeDoc {
        id: id.clone(),
        op: op.to_string(),
        inputs: vec![String::new(); inputs],
        attrs: Map::new(),
    });
    doc.layout.insert(id.clone(), pos);
    id
}

/// The nodes (and inputs) whose outputs `id` reads, directly.
fn sources(doc: &GraphDoc, id: &str) -> Vec<String> {
    node(doc, id)
        .map(|n| {
            n.inputs
                .iter()
                .filter(|r| !r.is_empty())
                .map(|r| parse_ref(r).0.to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// `id` and every node and input it depends on: the nodes an output of `id` may not
/// feed, as that would close a cycle.
pub fn upstream(doc: &GraphDoc, id: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut stack = vec![id.to_string()];
    while let Some(next) = stack.pop() {
        if seen.insert(next.clone()) {
            stack.extend(sources(doc, &next));
        }
    }
    seen
}

/// Whether `to` can be reached from `from` by following edges downstream.
fn reaches(doc: &GraphDoc, from: &str, to: &str) -> bool {
    // Walk upstream from `to` looking for `from`.
    let mut stack = vec![to.to_string()];
    let mut seen = BTreeSet::new();
    while let Some(id) = stack.pop() {
        if id == from {
            return true;
        }
        if seen.insert(id.clone()) {
            stack.extend(sources(doc, &id));
        }
    }
    false
}

/// Connects output `from` (a reference) to input `port` of node `to`. Refuses, with the
/// reason, connections that cannot make sense whatever the shapes: into a graph input,
/// onto the node itself, or closing a cycle. Shapes and dtypes are the engine's to check
/// (see `check::connect`).
pub fn connect(doc: &mut GraphDoc, from: &str, to: &str, port: usize) -> Result<(), String> {
    let (src, _) = parse_ref(from);
    if is_input(doc, to) {
        return Err(format!("'{to}' is a graph input: it has no input ports"));
    }
    if !ids(doc).contains(src) {
        return Err(format!("'{src}' is not in the graph"));
    }
    if src == to {
        return Err(format!("'{to}' cannot read its own output"));
    }
    if reaches(doc, to, src) {
        return Err(format!(
            "connecting '{src}' to '{to}' would make a cycle: '{src}' already depends on '{to}'"
        ));
    }
    let n = node_mut(doc, to).ok_or_else(|| format!("no node '{to}'"))?;
    if n.inputs.len() <= port {
        n.inputs.resize(port + 1, String::new());
    }
    n.inputs[port] = from.to_string();
    Ok(())
}

/// Disconnects input `port` of `to`; trailing unconnected ports of variadic operators are
/// dropped by the caller's port count, so they are kept here as holes.
pub fn disconnect(doc: &mut GraphDoc, to: &str, port: usize) {
    if let Some(n) = node_mut(doc, to) {
        if let Some(r) = n.inputs.get_mut(port) {
            r.clear();
        }
    }
}

/// Removes nodes and inputs; ports that read them become unconnected, graph outputs that
/// name them are dropped, and so are their positions and stage pins.
pub fn remove(doc: &mut GraphDoc, remove: &BTreeSet<String>) {
    doc.nodes.retain(|n| !remove.contains(&n.id));
    doc.inputs.retain(|name, _| !remove.contains(name));
    for n in &mut doc.nodes {
        for r in &mut n.inputs {
            if !r.is_empty() && remove.contains(parse_ref(r).0) {
                r.clear();
            }
        }
    }
    doc.outputs.retain(|r| !remove.contains(parse_ref(r).0));
    doc.layout.retain(|id, _| !remove.contains(id));
    doc.stages.retain(|id, _| !remove.contains(id));
}

/// Renames a node or input everywhere it is referenced.
pub fn rename(doc: &mut GraphDoc, old: &str, new: &str) -> Result<(), String> {
    if old == new {
        return Ok(());
    }
    if !valid_id(new) {
        return Err(format!(
            "'{new}' is not a valid id: use 1-64 of A-Z a-z 0-9 _ -"
        ));
    }
    if ids(doc).contains(new) {
        return Err(format!("'{new}' is already taken"));
    }
    if let Some(decl) = doc.inputs.remove(old) {
        doc.inputs.insert(new.to_string(), decl);
    } else if let Some(n) = node_mut(doc, old) {
        n.id = new.to_string();
    } else {
        return Err(format!("no node '{old}'"));
    }
    let fix = |r: &mut String| {
        let (node, port) = parse_ref(r);
        if node == old {
            *r = output_ref(new, port);
        }
    };
    for n in &mut doc.nodes {
        n.inputs.iter_mut().for_each(fix);
    }
    doc.outputs.iter_mut().for_each(fix);
    if let Some(p) = doc.layout.remove(old) {
        doc.layout.insert(new.to_string(), p);
    }
    if let Some(s) = doc.stages.remove(old) {
        doc.stages.insert(new.to_string(), s);
    }
    Ok(())
}

/// Sets (`Some`) or clears (`None`: back to the default) an attribute.
pub fn set_attr(doc: &mut GraphDoc, id: &str, name: &str, value: Option<Value>) {
    if let Some(n) = node_mut(doc, id) {
        match value {
            Some(v) => {
                n.attrs.insert(name.to_string(), v);
            }
            None => {
                n.attrs.remove(name);
            }
        }
    }
}

/// Parses a shape as typed in the property panel: `N, 784` → `["N", 784]`.
pub fn parse_shape(text: &str) -> Result<Vec<Dim>, String> {
    let text = text.trim().trim_start_matches('[').trim_end_matches(']');
    if text.trim().is_empty() {
        return Ok(Vec::new());
    }
    text.split(',')
        .map(|part| {
            let part = part.trim().trim_matches('"');
            if let Ok(n) = part.parse::<usize>() {
                Ok(Dim::Known(n))
            } else if sluice_engine::graph::doc::is_symbol(part) {
                Ok(Dim::Sym(part.to_string()))
            } else {
                Err(format!(
                    "'{part}' is neither a size nor a symbol such as N (shape '{text}')"
                ))
            }
        })
        .collect()
}

/// Shows a shape the way [`parse_shape`] reads it.
pub fn show_shape(shape: &[Dim]) -> String {
    let parts: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    parts.join(", ")
}

/// Changes a graph input's declaration.
pub fn set_input_decl(doc: &mut GraphDoc, name: &str, shape: Vec<Dim>, dtype: DType) {
    if let Some(decl) = doc.inputs.get_mut(name) {
        decl.shape = shape;
        decl.dtype = dtype;
    }
}

/// Makes a node output a graph output, or stops it being one.
pub fn set_output(doc: &mut GraphDoc, reference: &str, on: bool) {
    let present = doc.outputs.iter().any(|o| o == reference);
    if on && !present {
        doc.outputs.push(reference.to_string());
    } else if !on {
        doc.outputs.retain(|o| o != reference);
    }
}

/// Pins a node to a pipeline stage, or unpins it.
pub fn set_stage(doc: &mut GraphDoc, id: &str, stage: Option<usize>) {
    match stage {
        Some(s) => {
            doc.stages.insert(id.to_string(), s);
        }
        None => {
            doc.stages.remove(id);
        }
    }
}

/// Moves nodes by (dx, dy).
pub fn move_by(doc: &mut GraphDoc, nodes: &BTreeSet<String>, dx: f64, dy: f64) {
    for id in nodes {
        if let Some(p) = doc.layout.get_mut(id) {
            p[0] += dx;
            p[1] += dy;
        }
    }
}

/// Copies the selected nodes and inputs as a graph document of their own (what the
/// system clipboard carries, as the graph file's JSON): their declarations, positions and
/// connections, among themselves and to nodes outside the copy; its outputs are the copied
/// nodes nothing else in the copy reads, so the fragment is a graph file too.
pub fn copy(doc: &GraphDoc, selected: &BTreeSet<String>) -> GraphDoc {
    let mut clip = empty(&format!("{} (selection)", doc.name));
    clip.params.seed = doc.params.seed;
    clip.inputs = doc
        .inputs
        .iter()
        .filter(|(k, _)| selected.contains(*k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    clip.nodes = doc
        .nodes
        .iter()
        .filter(|n| selected.contains(&n.id))
        .cloned()
        .collect();
    clip.layout = doc
        .layout
        .iter()
        .filter(|(k, _)| selected.contains(*k))
        .map(|(k, v)| (k.clone(), *v))
        .collect();
    let read: BTreeSet<&str> = clip
        .nodes
        .iter()
        .flat_map(|n| n.inputs.iter())
        .filter(|r| !r.is_empty())
        .map(|r| parse_ref(r).0)
        .collect();
    clip.outputs = clip
        .nodes
        .iter()
        .filter(|n| !read.contains(n.id.as_str()))
        .map(|n| n.id.clone())
        .collect();
    clip
}

/// Reads a copied selection back from the clipboard's text: a graph document whose
/// structure decodes without problems (references to nodes it does not hold are fine:
/// they reconnect when the graph pasted into has those nodes). Errors say why the text is
/// not a selection.
pub fn clip_from_text(text: &str) -> Result<GraphDoc, String> {
    let (doc, problems) = sluice_engine::graph::doc::decode_partial(text);
    match (doc, problems.first()) {
        (Some(d), None) if !(d.nodes.is_empty() && d.inputs.is_empty()) => Ok(d),
        (Some(_), None) => Err("it holds no nodes".into()),
        (_, Some(p)) => Err(p.to_string()),
        (None, None) => Err("it is not a graph document".into()),
    }
}

/// Pastes a copied selection shifted by `offset` under fresh ids. References inside the
/// clip follow the renaming; references to nodes outside it stay connected when those
/// nodes still exist. Returns the new ids.
pub fn paste(doc: &mut GraphDoc, clip: &GraphDoc, offset: [f64; 2]) -> BTreeSet<String> {
    let mut renamed: BTreeMap<String, String> = BTreeMap::new();
    for (name, decl) in &clip.inputs {
        let id = fresh_id(doc, name.trim_end_matches(|c: char| c.is_ascii_digit()));
        doc.inputs.insert(id.clone(), decl.clone());
        renamed.insert(name.clone(), id);
    }
    for n in &clip.nodes {
        let id = fresh_id(doc, &n.op);
        // Reserve the id before the next fresh_id call.
        doc.nodes.push(NodeDoc {
            id: id.clone(),
            ..n.clone()
        });
        renamed.insert(n.id.clone(), id);
    }
    let existing = ids(doc);
    let first_new = doc.nodes.len() - clip.nodes.len();
    for n in &mut doc.nodes[first_new..] {
        for r in &mut n.inputs {
            if r.is_empty() {
                continue;
            }
            let (src, port) = parse_ref(r);
            *r = match renamed.get(src) {
                Some(new) => output_ref(new, port),
                None if existing.contains(src) => r.clone(),
                None => String::new(),
            };
        }
    }
    for (old, new) in &renamed {
        let p = clip.layout.get(old).copied().unwrap_or([40.0, 40.0]);
        doc.layout
            .insert(new.clone(), [p[0] + offset[0], p[1] + offset[1]]);
    }
    renamed.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mlp() -> GraphDoc {
        let mut d = empty("t");
        let x = add_input(&mut d, [0.0, 0.0]);
        let fc = add_op(&mut d, "linear", 1, [200.0, 0.0]);
        let act = add_op(&mut d, "relu", 1, [400.0, 0.0]);
        connect(&mut d, &x, &fc, 0).unwrap();
        connect(&mut d, &fc, &act, 0).unwrap();
        set_output(&mut d, &act, true);
        d
    }

    #[test]
    fn ids_are_fresh_and_refs_follow_renames() {
        let mut d = mlp();
        assert_eq!(node(&d, "linear1").unwrap().inputs, vec!["x"]);
        rename(&mut d, "linear1", "fc1").unwrap();
        assert_eq!(node(&d, "relu1").unwrap().inputs, vec!["fc1"]);
        assert!(d.layout.contains_key("fc1") && !d.layout.contains_key("linear1"));
        rename(&mut d, "relu1", "out").unwrap();
        assert_eq!(d.outputs, vec!["out"]);
        assert!(rename(&mut d, "out", "fc1").unwrap_err().contains("taken"));
        assert!(rename(&mut d, "out", "a b").unwrap_err().contains("valid"));
        rename(&mut d, "x", "image").unwrap();
        assert_eq!(node(&d, "fc1").unwrap().inputs, vec!["image"]);
    }

    #[test]
    fn cycles_self_loops_and_inputs_as_targets_are_refused() {
        let mut d = mlp();
        let e = connect(&mut d, "relu1", "linear1", 0).unwrap_err();
        assert!(e.contains("cycle"), "{e}");
        assert!(connect(&mut d, "relu1", "relu1", 0)
            .unwrap_err()
            .contains("own"));
        assert!(connect(&mut d, "relu1", "x", 0)
            .unwrap_err()
            .contains("graph input"));
        assert_eq!(node(&d, "linear1").unwrap().inputs, vec!["x"]);
    }

    #[test]
    fn holes_are_cut_for_the_engine_and_removal_leaves_holes() {
        let mut d = mlp();
        let add = add_op(&mut d, "add", 2, [0.0, 0.0]);
        connect(&mut d, "relu1", &add, 1).unwrap();
        assert_eq!(node(&d, &add).unwrap().inputs, vec!["", "relu1"]);
        assert!(node(&for_engine(&d), &add).unwrap().inputs.is_empty());
        remove(&mut d, &BTreeSet::from(["linear1".to_string()]));
        assert_eq!(node(&d, "relu1").unwrap().inputs, vec![""]);
        assert!(!d.layout.contains_key("linear1"));
    }

    #[test]
    fn paste_renames_and_keeps_outside_connections() {
        let mut d = mlp();
        let clip = copy(&d, &BTreeSet::from(["relu1".to_string()]));
        let new = paste(&mut d, &clip, [30.0, 30.0]);
        assert_eq!(new, BTreeSet::from(["relu2".to_string()]));
        assert_eq!(node(&d, "relu2").unwrap().inputs, vec!["linear1"]);
        assert_eq!(d.layout["relu2"], [430.0, 30.0]);
        let both = copy(
            &d,
            &BTreeSet::from(["linear1".to_string(), "relu1".to_string()]),
        );
        paste(&mut d, &both, [0.0, 100.0]);
        assert_eq!(node(&d, "relu3").unwrap().inputs, vec!["linear2"]);
        assert_eq!(node(&d, "linear2").unwrap().inputs, vec!["x"]);
    }

    #[test]
    fn a_copy_travels_as_graph_json_and_pastes_into_another_graph() {
        let d = mlp();
        let clip = copy(&d, &BTreeSet::from(["linear1".into(), "relu1".into()]));
        assert_eq!(clip.outputs, vec!["relu1"], "the copy's sink is its output");
        let text = serde_json::to_string(&clip).unwrap();
        let back = clip_from_text(&text).unwrap();
        assert_eq!(back, clip);
        // Another graph without 'x': the dangling reference is left unconnected.
        let mut other = empty("other");
        let new = paste(&mut other, &back, [0.0, 0.0]);
        assert_eq!(new.len(), 2);
        assert_eq!(node(&other, "linear1").unwrap().inputs, vec![""]);
        assert_eq!(node(&other, "relu1").unwrap().inputs, vec!["linear1"]);
        assert!(clip_from_text("hello").is_err());
        assert!(clip_from_text(r#"{"inputs":[1,2,3],"nodes":"abc"}"#).is_err());
    }

    #[test]
    fn shapes_parse_as_typed() {
        assert_eq!(
            parse_shape("N, 784").unwrap(),
            vec![Dim::Sym("N".into()), Dim::Known(784)]
        );
        assert_eq!(parse_shape("[2,3]").unwrap().len(), 2);
        assert!(parse_shape("N, -3").is_err());
        assert_eq!(show_shape(&parse_shape("N,784").unwrap()), "N, 784");
    }
}
