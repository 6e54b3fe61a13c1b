//! Blocks of repeated structure, for collapsing on the canvas: nodes whose ids share a
//! block prefix — a model path's first two parts (`/layers/layers.0/conv1/Conv_output_0`
//! is in `/layers/layers.0`, as PyTorch exports name them) or the part before the first
//! `_` (`b12_fc1` is in `b12`). A collapsed block is drawn as one box whose ports are the
//! block's connections to the rest of the graph; the document is not changed. Pure data,
//! tested natively.

use crate::model::{self, output_ref};
use sluice_engine::graph::GraphDoc;
use std::collections::{BTreeMap, BTreeSet};

/// What a collapsed block's box id starts with (no graph id can: ids are identifiers or
/// model paths).
const BOX_MARK: char = '⊞';

/// The block node `id` belongs to, if its id names one.
pub fn block_of(id: &str) -> Option<&str> {
    if let Some(path) = id.strip_prefix('/') {
        let mut parts = path.splitn(3, '/');
        let (first, second, rest) = (parts.next()?, parts.next()?, parts.next()?);
        if first.is_empty() || second.is_empty() || rest.is_empty() {
            return None;
        }
        return Some(&id[..1 + first.len() + 1 + second.len()]);
    }
    let (block, rest) = id.split_once('_')?;
    (!block.is_empty() && !rest.is_empty()).then_some(block)
}

/// Every block of at least two nodes, with its nodes in the document's order.
pub fn blocks(doc: &GraphDoc) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for n in &doc.nodes {
        if let Some(block) = block_of(&n.id) {
            out.entry(block.to_string()).or_default().push(n.id.clone());
        }
    }
    out.retain(|_, members| members.len() >= 2);
    out
}

/// The id of a collapsed block's box.
pub fn box_id(block: &str) -> String {
    format!("{BOX_MARK}{block}")
}

/// The block a box id stands for, if it is one.
pub fn block_of_box(id: &str) -> Option<&str> {
    id.strip_prefix(BOX_MARK)
}

/// The canvas's view of the collapsed blocks.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Collapsed {
    /// Each node inside a collapsed block → its box's id.
    pub owner: BTreeMap<String, String>,
    /// Each box's nodes, in the document's order.
    pub members: BTreeMap<String, Vec<String>>,
    /// Each box's input ports: the references from outside the block its nodes read, in
    /// the order first read.
    pub inputs: BTreeMap<String, Vec<String>>,
    /// Each box's output ports: the block's outputs read outside it or by the graph's
    /// outputs, in the document's order.
    pub outputs: BTreeMap<String, Vec<String>>,
}

impl Collapsed {
    /// Where an edge from output reference `reference` starts: its node and port, or the
    /// box holding that node and the box's port.
    pub fn source(&self, reference: &str) -> (String, usize) {
        let (node, port) = model::parse_ref(reference);
        match self.owner.get(node) {
            Some(b) => {
                let k = self
                    .outputs
                    .get(b)
                    .and_then(|ports| ports.iter().position(|r| r == reference));
                (b.clone(), k.unwrap_or(0))
            }
            None => (node.to_string(), port),
        }
    }
}

/// The view with the blocks in `collapsed` (of `blocks`) drawn as boxes.
pub fn collapse(
    doc: &GraphDoc,
    blocks: &BTreeMap<String, Vec<String>>,
    collapsed: &BTreeSet<String>,
) -> Collapsed {
    let mut view = Collapsed::default();
    for block in collapsed {
        let Some(members) = blocks.get(block) else {
            continue;
        };
        let id = box_id(block);
        for m in members {
            view.owner.insert(m.clone(), id.clone());
        }
        view.members.insert(id, members.clone());
    }
    let inside = |reference: &str, b: &str| {
        view.owner
            .get(model::parse_ref(reference).0)
            .map(String::as_str)
            == Some(b)
    };
    let mut inputs: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut read_outside: BTreeSet<&str> = doc.outputs.iter().map(String::as_str).collect();
    for n in &doc.nodes {
        let owner = view.owner.get(&n.id);
        for r in n.inputs.iter().filter(|r| !r.is_empty()) {
            match owner {
                Some(b) if !inside(r, b) => {
                    let ports = inputs.entry(b.clone()).or_default();
                    if !ports.contains(r) {
                        ports.push(r.clone());
                    }
                }
                Some(_) => {}
                None => {
                    read_outside.insert(r);
                }
            }
        }
        // A block's output read by another block counts as read outside.
        if let Some(b) = owner {
            for r in n.inputs.iter().filter(|r| !r.is_empty() && !inside(r, b)) {
                read_outside.insert(r);
            }
        }
    }
    let mut outputs: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (b, members) in &view.members {
        let ports = outputs.entry(b.clone()).or_default();
        for m in members {
            let count = doc
                .outputs
                .iter()
                .chain(doc.nodes.iter().flat_map(|n| n.inputs.iter()))
                .filter_map(|r| {
                    let (node, port) = model::parse_ref(r);
                    (node == m).then_some(port)
                })
                .max()
                .map_or(1, |p| p + 1);
            for k in 0..count {
                let r = output_ref(m, k);
                if read_outside.contains(r.as_str()) && !ports.contains(&r) {
                    ports.push(r);
                }
            }
        }
        inputs.entry(b.clone()).or_default();
    }
    view.inputs = inputs;
    view.outputs = outputs;
    view
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_come_from_model_paths_and_prefixes() {
        assert_eq!(
            block_of("/layers/layers.0/conv1/Conv_output_0"),
            Some("/layers/layers.0")
        );
        assert_eq!(
            block_of("/layers/layers.0/Add_output_0"),
            Some("/layers/layers.0")
        );
        assert_eq!(
            block_of("/fc/Gemm_output_0"),
            None,
            "too short to be in a block"
        );
        assert_eq!(block_of("b12_fc1"), Some("b12"));
        assert_eq!(block_of("fc1"), None);
        assert_eq!(block_of("_x"), None);
    }

    /// x → [b0: fc1 → act → add(act, x)] → [b1: fc1 → add(fc1, b0_add)] → head.
    fn two_blocks() -> GraphDoc {
        let text = r#"{"format": "sluice/graph@1",
            "inputs": {"x": {"shape": ["N", 4]}},
            "nodes": [
              {"id": "b0_fc1", "op": "linear", "inputs": ["x"], "attrs": {"out_features": 4}},
              {"id": "b0_act", "op": "relu", "inputs": ["b0_fc1"]},
              {"id": "b0_add", "op": "add", "inputs": ["b0_act", "x"]},
              {"id": "b1_fc1", "op": "linear", "inputs": ["b0_add"], "attrs": {"out_features": 4}},
              {"id": "b1_add", "op": "add", "inputs": ["b1_fc1", "b0_add"]},
              {"id": "head", "op": "relu", "inputs": ["b1_add"]}
            ],
            "outputs": ["head", "b0_act"]}"#;
        sluice_engine::graph::doc::decode(text).unwrap()
    }

    #[test]
    fn a_collapsed_block_has_the_ports_of_its_connections_outside() {
        let d = two_blocks();
        let all = blocks(&d);
        assert_eq!(all.keys().collect::<Vec<_>>(), ["b0", "b1"]);
        let view = collapse(&d, &all, &BTreeSet::from(["b0".to_string()]));
        let b0 = box_id("b0");
        assert_eq!(view.owner["b0_act"], b0);
        assert!(!view.owner.contains_key("b1_fc1"));
        // x is read twice inside, one port; the add is read by b1, the relu is a graph output.
        assert_eq!(view.inputs[&b0], ["x"]);
        assert_eq!(view.outputs[&b0], ["b0_act", "b0_add"]);
        assert_eq!(view.source("b0_add"), (b0.clone(), 1));
        assert_eq!(view.source("b1_fc1"), ("b1_fc1".to_string(), 0));
        // Both collapsed: b1 reads b0's output once, however many of its nodes read it.
        let both = collapse(&d, &all, &all.keys().cloned().collect());
        assert_eq!(both.inputs[&box_id("b1")], ["b0_add"]);
        assert_eq!(both.outputs[&box_id("b1")], ["b1_add"]);
        assert_eq!(block_of_box(&b0), Some("b0"));
    }
}
