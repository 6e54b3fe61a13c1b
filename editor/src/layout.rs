//! Where things are drawn: node geometry and port positions, and the layered automatic
//! layout (left to right: a node's layer is its longest path from the graph inputs; within
//! a layer nodes are ordered by the mean position of what they read, to cut crossings).

use crate::model::{self, parse_ref};
use sluice_engine::graph::GraphDoc;
use std::collections::{BTreeMap, BTreeSet};

/// Node width in canvas units.
pub const NODE_WIDTH: f64 = 168.0;
/// Height of the title rows.
const HEADER: f64 = 38.0;
/// Height of one port row.
pub const PORT_ROW: f64 = 18.0;
/// Horizontal distance between layers.
const LAYER_GAP: f64 = 240.0;
/// Vertical distance between nodes of a layer.
const ROW_GAP: f64 = 36.0;

/// A node's height for its number of input and output ports.
pub fn node_height(inputs: usize, outputs: usize) -> f64 {
    HEADER + PORT_ROW * inputs.max(outputs).max(1) as f64 + 8.0
}

/// The canvas position of input port `k` of a node at `pos`.
pub fn input_port(pos: [f64; 2], k: usize) -> [f64; 2] {
    [pos[0], pos[1] + HEADER + PORT_ROW * (k as f64 + 0.5)]
}

/// The canvas position of output port `k` of a node at `pos`.
pub fn output_port(pos: [f64; 2], k: usize) -> [f64; 2] {
    [
        pos[0] + NODE_WIDTH,
        pos[1] + HEADER + PORT_ROW * (k as f64 + 0.5),
    ]
}

/// The layer of every id: 0 for graph inputs and nodes reading nothing, else one more
/// than the deepest node it reads. Ids on a cycle keep layer 0.
fn layers(doc: &GraphDoc) -> BTreeMap<String, usize> {
    let mut layer: BTreeMap<String, usize> =
        model::ids(doc).into_iter().map(|id| (id, 0)).collect();
    // Longest path by relaxation; at most |V| rounds, so cycles cannot loop forever.
    for _ in 0..layer.len() {
        let mut changed = false;
        for n in &doc.nodes {
            let deepest = n
                .inputs
                .iter()
                .filter(|r| !r.is_empty())
                .filter_map(|r| layer.get(parse_ref(r).0).copied())
                .max();
            if let Some(d) = deepest {
                let want = d + 1;
                if layer.get(&n.id).copied().unwrap_or(0) < want && want < layer.len() {
                    layer.insert(n.id.clone(), want);
                    changed = true;
                }
            }
        }
        if !changed {
            break;
        }
    }
    layer
}

/// Positions for every node and input: layered left to right.
pub fn auto_layout(
    doc: &GraphDoc,
    port_rows: &dyn Fn(&str) -> usize,
) -> BTreeMap<String, [f64; 2]> {
    let layer = layers(doc);
    let depth = layer.values().copied().max().unwrap_or(0);
    let mut columns: Vec<Vec<String>> = vec![Vec::new(); depth + 1];
    // Start from document order: inputs first, then nodes as listed.
    for id in doc
        .inputs
        .keys()
        .cloned()
        .chain(doc.nodes.iter().map(|n| n.id.clone()))
    {
        if let Some(&l) = layer.get(&id) {
            columns[l].push(id);
        }
    }
    let mut rank: BTreeMap<String, f64> = BTreeMap::new();
    for col in &columns {
        for (i, id) in col.iter().enumerate() {
            rank.insert(id.clone(), i as f64);
        }
    }
    // Barycentre sweeps: order each layer by the mean rank of its sources.
    for _ in 0..4 {
        for col in columns.iter_mut().skip(1) {
            let key = |id: &String| -> f64 {
                let srcs: Vec<f64> = model::node(doc, id)
                    .map(|n| {
                        n.inputs
                            .iter()
                            .filter(|r| !r.is_empty())
                            .filter_map(|r| rank.get(parse_ref(r).0).copied())
                            .collect()
                    })
                    .unwrap_or_default();
                if srcs.is_empty() {
                    rank.get(id).copied().unwrap_or(0.0)
                } else {
                    srcs.iter().sum::<f64>() / srcs.len() as f64
                }
            };
            let mut keyed: Vec<(f64, String)> =
                col.iter().map(|id| (key(id), id.clone())).collect();
            keyed.sort_by(|a, b| a.0.total_cmp(&b.0));
            *col = keyed.into_iter().map(|(_, id)| id).collect();
            for (i, id) in col.iter().enumerate() {
                rank.insert(id.clone(), i as f64);
            }
        }
    }
    let heights: Vec<f64> = columns
        .iter()
        .map(|col| {
            col.iter()
                .map(|id| node_height(port_rows(id), 1) + ROW_GAP)
                .sum::<f64>()
        })
        .collect();
    let tallest = heights.iter().copied().fold(0.0, f64::max);
    let mut out = BTreeMap::new();
    for (l, col) in columns.iter().enumerate() {
        let mut y = 40.0 + (tallest - heights[l]) / 2.0;
        for id in col {
            out.insert(id.clone(), [40.0 + LAYER_GAP * l as f64, y.round()]);
            y += node_height(port_rows(id), 1) + ROW_GAP;
        }
    }
    out
}

/// Gives every id without a position one: to the right of what it reads, or in a free
/// row at the left.
pub fn place_missing(doc: &mut GraphDoc) {
    let missing: BTreeSet<String> = model::ids(doc)
        .into_iter()
        .filter(|id| !doc.layout.contains_key(id))
        .collect();
    if missing.is_empty() {
        return;
    }
    let auto = auto_layout(doc, &|_| 1);
    for id in missing {
        if let Some(p) = auto.get(&id) {
            doc.layout.insert(id, *p);
        }
    }
}

/// The smallest rectangle (x, y, width, height) holding every node, if any.
pub fn bounds(doc: &GraphDoc) -> Option<[f64; 4]> {
    let mut it = doc.layout.values();
    let first = it.next()?;
    let (mut x0, mut y0, mut x1, mut y1) = (first[0], first[1], first[0], first[1]);
    for p in doc.layout.values() {
        x0 = x0.min(p[0]);
        y0 = y0.min(p[1]);
        x1 = x1.max(p[0]);
        y1 = y1.max(p[1]);
    }
    Some([x0, y0, x1 - x0 + NODE_WIDTH, y1 - y0 + node_height(2, 1)])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layers_run_left_to_right_and_branches_share_a_layer() {
        let mut d = model::empty("t");
        let x = model::add_input(&mut d, [0.0, 0.0]);
        let a = model::add_op(&mut d, "relu", 1, [0.0, 0.0]);
        let b = model::add_op(&mut d, "sigmoid", 1, [0.0, 0.0]);
        let c = model::add_op(&mut d, "add", 2, [0.0, 0.0]);
        model::connect(&mut d, &x, &a, 0).unwrap();
        model::connect(&mut d, &x, &b, 0).unwrap();
        model::connect(&mut d, &a, &c, 0).unwrap();
        model::connect(&mut d, &b, &c, 1).unwrap();
        let pos = auto_layout(&d, &|_| 1);
        assert!(pos[&x][0] < pos[&a][0]);
        assert_eq!(pos[&a][0], pos[&b][0]);
        assert!(pos[&a][1] != pos[&b][1]);
        assert!(pos[&c][0] > pos[&a][0]);
        // Nodes of one layer do not overlap.
        assert!((pos[&a][1] - pos[&b][1]).abs() >= node_height(1, 1));
    }

    #[test]
    fn cycles_and_missing_positions_do_not_break_layout() {
        let mut d = model::empty("t");
        let a = model::add_op(&mut d, "relu", 1, [0.0, 0.0]);
        let b = model::add_op(&mut d, "relu", 1, [0.0, 0.0]);
        // A cycle written by hand in a file (the editor refuses to make one).
        d.nodes[0].inputs = vec![b.clone()];
        d.nodes[1].inputs = vec![a.clone()];
        d.layout.clear();
        place_missing(&mut d);
        assert_eq!(d.layout.len(), 2);
        assert!(bounds(&d).is_some());
    }
}
