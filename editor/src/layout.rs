//! Where nodes are drawn: node geometry (input ports along the top edge, output ports
//! along the bottom) and the automatic layout, layered top to bottom as Netron draws
//! models. A node's layer is its longest path from the graph inputs (sources sit just
//! above their first consumer); an edge spanning several layers gets a placeholder in
//! each layer it crosses, so the ordering (barycentre sweeps) and the horizontal
//! placement (least squares under minimum gaps, solved exactly by pool-adjacent-violators)
//! leave it a free lane — the lane [`crate::route`] later draws it through.

use crate::model::{self, parse_ref};
use sluice_engine::graph::GraphDoc;
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// The narrowest a node is drawn, in canvas units.
pub const MIN_NODE_WIDTH: f64 = 176.0;
/// Horizontal room per port, so that neighbouring ports' labels stay apart.
const PORT_SPACING: f64 = 88.0;
/// Every node's height: input-port labels, title, operator, output-port labels.
pub const NODE_HEIGHT: f64 = 68.0;
/// Vertical space between layers: the channel edges and their labels run in.
const LAYER_GAP: f64 = 64.0;
/// Horizontal space between two nodes of a layer.
const NODE_GAP: f64 = 40.0;
/// Horizontal space an edge passing a layer keeps from a node beside it.
const LANE_GAP: f64 = 20.0;
/// Horizontal space between two edges passing the same layer.
const LANE_SPACING: f64 = 12.0;
/// Rank units per canvas unit of port offset in the ordering's keys (a port offset never
/// outweighs a whole rank).
const PORT_NUDGE: f64 = 0.004;
/// Where the first layer starts.
const ORIGIN: f64 = 40.0;

/// The zoom at which node titles (13 px) are drawn at least 11 px tall on screen.
pub const LEGIBLE_ZOOM: f64 = 0.85;
/// The smallest zoom (the whole of a large model in view).
pub const MIN_ZOOM: f64 = 0.05;
/// The largest zoom.
pub const MAX_ZOOM: f64 = 3.0;

/// A node's port counts: (inputs, outputs).
pub type Ports = (usize, usize);

/// A node's drawn width for its port counts (its height is [`NODE_HEIGHT`]).
pub fn node_width((inputs, outputs): Ports) -> f64 {
    MIN_NODE_WIDTH.max(PORT_SPACING * inputs.max(outputs) as f64)
}

/// The x offset of port `k` of `count` along a node `width` wide.
fn port_x(width: f64, k: usize, count: usize) -> f64 {
    width * (k as f64 + 0.5) / count.max(1) as f64
}

/// The canvas position of input port `k` of a node at `pos`.
pub fn input_port(pos: [f64; 2], ports: Ports, k: usize) -> [f64; 2] {
    [pos[0] + port_x(node_width(ports), k, ports.0), pos[1]]
}

/// The canvas position of output port `k` of a node at `pos`.
pub fn output_port(pos: [f64; 2], ports: Ports, k: usize) -> [f64; 2] {
    [
        pos[0] + port_x(node_width(ports), k, ports.1),
        pos[1] + NODE_HEIGHT,
    ]
}

/// The layer of every id: one more than the deepest node it reads (longest path), and a
/// node that reads nothing (a graph input, a constant) just above its first consumer.
/// Ids on a cycle keep the layer the relaxation reached.
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
    // Sources move down next to their first consumer (a mask read deep in the network
    // then does not trail a long edge from the top).
    let mut first_use: BTreeMap<&str, usize> = BTreeMap::new();
    for n in &doc.nodes {
        for r in n.inputs.iter().filter(|r| !r.is_empty()) {
            let l = layer.get(&n.id).copied().unwrap_or(0);
            first_use
                .entry(parse_ref(r).0)
                .and_modify(|f| *f = (*f).min(l))
                .or_insert(l);
        }
    }
    let sources: Vec<String> = model::ids(doc)
        .into_iter()
        .filter(|id| model::node(doc, id).is_none_or(|n| n.inputs.iter().all(String::is_empty)))
        .collect();
    for id in sources {
        if let Some(&f) = first_use.get(id.as_str()) {
            layer.insert(id, f.saturating_sub(1));
        }
    }
    layer
}

/// One thing placed in a layer: a node or an edge passing through.
struct Item {
    layer: usize,
    width: f64,
    node: bool,
    /// (item above, x offset of the link at that item's centre, at this item's centre).
    above: Vec<(usize, f64, f64)>,
    /// (item below, x offset at this item's centre, at that item's centre).
    below: Vec<(usize, f64, f64)>,
}

/// Positions (top-left corners) for every node and graph input of `doc`; `ports` gives
/// each id's port counts.
pub fn auto_layout(doc: &GraphDoc, ports: &dyn Fn(&str) -> Ports) -> BTreeMap<String, [f64; 2]> {
    let ids = model::ids(doc);
    let layer = layers(doc);
    let index: HashMap<&str, usize> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| (id.as_str(), i))
        .collect();
    let mut items: Vec<Item> = ids
        .iter()
        .map(|id| Item {
            layer: layer.get(id).copied().unwrap_or(0),
            width: node_width(ports(id)),
            node: true,
            above: Vec::new(),
            below: Vec::new(),
        })
        .collect();
    for n in &doc.nodes {
        let Some(&to) = index.get(n.id.as_str()) else {
            continue;
        };
        let to_ports = ports(&n.id);
        for (k, r) in n.inputs.iter().enumerate().filter(|(_, r)| !r.is_empty()) {
            let (src, port) = parse_ref(r);
            let Some(&from) = index.get(src) else {
                continue;
            };
            let (l0, l1) = (items[from].layer, items[to].layer);
            if l1 <= l0 {
                continue; // on a cycle: drawn, but not laid out by
            }
            let from_ports = ports(src);
            let out_dx = port_x(items[from].width, port, from_ports.1) - items[from].width / 2.0;
            let in_dx = port_x(items[to].width, k, to_ports.0) - items[to].width / 2.0;
            // A chain of lane placeholders through every layer strictly between.
            let mut prev = (from, out_dx);
            for l in l0 + 1..l1 {
                items.push(Item {
                    layer: l,
                    width: 0.0,
                    node: false,
                    above: Vec::new(),
                    below: Vec::new(),
                });
                let lane = items.len() - 1;
                link(&mut items, prev, (lane, 0.0));
                prev = (lane, 0.0);
            }
            link(&mut items, prev, (to, in_dx));
        }
    }
    let depth = items.iter().map(|i| i.layer).max().unwrap_or(0);
    let mut rows: Vec<Vec<usize>> = vec![Vec::new(); depth + 1];
    for (i, item) in items.iter().enumerate() {
        rows[item.layer].push(i);
    }
    order_rows(&items, &mut rows);
    let x = place_rows(&items, &rows);
    let left = rows
        .iter()
        .flatten()
        .map(|&i| x[i] - items[i].width / 2.0)
        .fold(f64::INFINITY, f64::min);
    let mut out = BTreeMap::new();
    for (i, id) in ids.iter().enumerate() {
        let item = &items[i];
        out.insert(
            id.clone(),
            [
                (ORIGIN + x[i] - item.width / 2.0 - left).round(),
                ORIGIN + (NODE_HEIGHT + LAYER_GAP) * item.layer as f64,
            ],
        );
    }
    out
}

/// Records an edge between two items: `(item, x offset from its centre)` each.
fn link(items: &mut [Item], (a, da): (usize, f64), (b, db): (usize, f64)) {
    items[a].below.push((b, da, db));
    items[b].above.push((a, da, db));
}

/// Orders every row to cut crossings: alternate sweeps down (by the mean position of what
/// an item reads) and up (of what reads it), each a stable sort.
fn order_rows(items: &[Item], rows: &mut [Vec<usize>]) {
    let mut rank = vec![0.0; items.len()];
    let set_ranks = |row: &[usize], rank: &mut Vec<f64>| {
        for (r, &i) in row.iter().enumerate() {
            rank[i] = r as f64;
        }
    };
    for row in rows.iter() {
        set_ranks(row, &mut rank);
    }
    for sweep in 0..8 {
        let down = sweep % 2 == 0;
        let order: Vec<usize> = if down {
            (1..rows.len()).collect()
        } else {
            (0..rows.len().saturating_sub(1)).rev().collect()
        };
        for l in order {
            let key = |i: usize| -> f64 {
                let links = if down {
                    &items[i].above
                } else {
                    &items[i].below
                };
                // The port a link meets at the neighbour nudges the key, so that what
                // feeds a node's left port sits left of what feeds its right port.
                let at_neighbour = |&(j, a, b): &(usize, f64, f64)| {
                    rank[j] + PORT_NUDGE * if down { a } else { b }
                };
                if links.is_empty() {
                    rank[i]
                } else {
                    links.iter().map(at_neighbour).sum::<f64>() / links.len() as f64
                }
            };
            let mut keyed: Vec<(f64, usize)> = rows[l].iter().map(|&i| (key(i), i)).collect();
            keyed.sort_by(|a, b| a.0.total_cmp(&b.0));
            rows[l] = keyed.into_iter().map(|(_, i)| i).collect();
            set_ranks(&rows[l], &mut rank);
        }
    }
}

/// The x centre of every item: each row packed, then alternate sweeps moving every item
/// as close as the gaps allow to the mean of where its links above (or below) want it.
fn place_rows(items: &[Item], rows: &[Vec<usize>]) -> Vec<f64> {
    let mut x = vec![0.0; items.len()];
    for row in rows {
        let seps = separations(items, row);
        let mut at = 0.0;
        for (r, &i) in row.iter().enumerate() {
            at += seps[r];
            x[i] = at;
        }
    }
    for sweep in 0..12 {
        let down = sweep % 2 == 0;
        let order: Vec<usize> = if down {
            (0..rows.len()).collect()
        } else {
            (0..rows.len()).rev().collect()
        };
        for l in order {
            let row = &rows[l];
            let want: Vec<f64> = row
                .iter()
                .map(|&i| {
                    let item = &items[i];
                    let wants: Vec<f64> = if down {
                        item.above
                            .iter()
                            .map(|&(j, dj, di)| x[j] + dj - di)
                            .collect()
                    } else {
                        item.below
                            .iter()
                            .map(|&(j, di, dj)| x[j] + dj - di)
                            .collect()
                    };
                    if wants.is_empty() {
                        x[i]
                    } else {
                        wants.iter().sum::<f64>() / wants.len() as f64
                    }
                })
                .collect();
            let weights: Vec<f64> = row
                .iter()
                .map(|&i| if items[i].node { 1.0 } else { 0.5 })
                .collect();
            for (&i, v) in row
                .iter()
                .zip(closest_spaced(&want, &weights, &separations(items, row)))
            {
                x[i] = v;
            }
        }
    }
    x
}

/// The least centre-to-centre distance from each item of a row to the one before it
/// (the first's is 0).
fn separations(items: &[Item], row: &[usize]) -> Vec<f64> {
    let mut seps = vec![0.0; row.len()];
    for r in 1..row.len() {
        let (a, b) = (&items[row[r - 1]], &items[row[r]]);
        let gap = match (a.node, b.node) {
            (true, true) => NODE_GAP,
            (false, false) => LANE_SPACING,
            _ => LANE_GAP,
        };
        seps[r] = a.width / 2.0 + gap + b.width / 2.0;
    }
    seps
}

/// The positions closest to `want` (weighted least squares) that keep each at least
/// `seps[r]` after the one before: with `y_r = x_r - Σ seps[..=r]` the constraint is
/// `y` non-decreasing, an isotonic regression solved by pool-adjacent-violators.
fn closest_spaced(want: &[f64], weights: &[f64], seps: &[f64]) -> Vec<f64> {
    let mut offset = Vec::with_capacity(want.len());
    let mut total = 0.0;
    for s in seps {
        total += s;
        offset.push(total);
    }
    // Blocks of pooled values: (weighted sum, weight, count).
    let mut blocks: Vec<(f64, f64, usize)> = Vec::new();
    for r in 0..want.len() {
        blocks.push(((want[r] - offset[r]) * weights[r], weights[r], 1));
        while blocks.len() > 1 {
            let (s1, w1, c1) = blocks[blocks.len() - 1];
            let (s0, w0, c0) = blocks[blocks.len() - 2];
            if s0 / w0 <= s1 / w1 {
                break;
            }
            blocks.pop();
            let last = blocks.len() - 1;
            blocks[last] = (s0 + s1, w0 + w1, c0 + c1);
        }
    }
    let mut out = Vec::with_capacity(want.len());
    for (s, w, c) in blocks {
        for _ in 0..c {
            out.push(s / w + offset[out.len()]);
        }
    }
    out
}

/// Gives every id without a position one from the automatic layout of the whole graph.
pub fn place_missing(doc: &mut GraphDoc, ports: &dyn Fn(&str) -> Ports) {
    let missing: BTreeSet<String> = model::ids(doc)
        .into_iter()
        .filter(|id| !doc.layout.contains_key(id))
        .collect();
    if missing.is_empty() {
        return;
    }
    let auto = auto_layout(doc, ports);
    for id in missing {
        if let Some(p) = auto.get(&id) {
            doc.layout.insert(id, *p);
        }
    }
}

/// The smallest rectangle (x, y, width, height) holding every node, if any.
pub fn bounds(doc: &GraphDoc, ports: &dyn Fn(&str) -> Ports) -> Option<[f64; 4]> {
    let mut rect: Option<[f64; 4]> = None;
    for (id, p) in &doc.layout {
        let (x1, y1) = (p[0] + node_width(ports(id)), p[1] + NODE_HEIGHT);
        rect = Some(match rect {
            None => [p[0], p[1], x1, y1],
            Some(r) => [r[0].min(p[0]), r[1].min(p[1]), r[2].max(x1), r[3].max(y1)],
        });
    }
    rect.map(|r| [r[0], r[1], r[2] - r[0], r[3] - r[1]])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one_port(_: &str) -> Ports {
        (1, 1)
    }

    #[test]
    fn layers_run_top_to_bottom_and_branches_share_a_layer() {
        let mut d = model::empty("t");
        let x = model::add_input(&mut d, [0.0, 0.0]);
        let a = model::add_op(&mut d, "relu", 1, [0.0, 0.0]);
        let b = model::add_op(&mut d, "sigmoid", 1, [0.0, 0.0]);
        let c = model::add_op(&mut d, "add", 2, [0.0, 0.0]);
        model::connect(&mut d, &x, &a, 0).unwrap();
        model::connect(&mut d, &x, &b, 0).unwrap();
        model::connect(&mut d, &a, &c, 0).unwrap();
        model::connect(&mut d, &b, &c, 1).unwrap();
        let pos = auto_layout(&d, &|id: &str| if id == c { (2, 1) } else { (1, 1) });
        assert!(pos[&x][1] < pos[&a][1]);
        assert_eq!(pos[&a][1], pos[&b][1]);
        assert!(pos[&c][1] > pos[&a][1]);
        // Nodes of one layer do not overlap, and keep a gap.
        assert!((pos[&a][0] - pos[&b][0]).abs() >= MIN_NODE_WIDTH + NODE_GAP - 0.5);
        // The join sits between its two branches.
        let centre = |id: &String, w: f64| pos[id][0] + w / 2.0;
        let join = centre(&c, node_width((2, 1)));
        let (ca, cb) = (centre(&a, MIN_NODE_WIDTH), centre(&b, MIN_NODE_WIDTH));
        assert!(join > ca.min(cb) && join < ca.max(cb), "{pos:?}");
    }

    #[test]
    fn a_skip_connection_keeps_a_lane_beside_the_chain() {
        // x → a → b → c → add(c, x): the skip edge passes a, b and c's layers.
        let mut d = model::empty("t");
        let x = model::add_input(&mut d, [0.0, 0.0]);
        let mut prev = x.clone();
        let mut chain = Vec::new();
        for _ in 0..3 {
            let n = model::add_op(&mut d, "relu", 1, [0.0, 0.0]);
            model::connect(&mut d, &prev, &n, 0).unwrap();
            chain.push(n.clone());
            prev = n;
        }
        let add = model::add_op(&mut d, "add", 2, [0.0, 0.0]);
        model::connect(&mut d, &prev, &add, 0).unwrap();
        model::connect(&mut d, &x, &add, 1).unwrap();
        let ports = |id: &str| if id == add { (2, 1) } else { (1, 1) };
        let pos = auto_layout(&d, &ports);
        // The chain runs straight down.
        let xs: BTreeSet<i64> = chain.iter().map(|n| pos[n][0] as i64).collect();
        assert_eq!(xs.len(), 1, "{pos:?}");
        // The skip edge, routed over this layout, misses every node of the chain: its
        // lane in each layer is at least the clearance away from the chain.
        let ids = model::ids(&d);
        let rects: Vec<[f64; 4]> = ids
            .iter()
            .map(|id| [pos[id][0], pos[id][1], node_width(ports(id)), NODE_HEIGHT])
            .collect();
        let at = |id: &String| ids.iter().position(|i| i == id).unwrap();
        let mut router = crate::route::Router::new(&rects);
        let path = router.route(
            output_port(pos[&x], ports(&x), 0),
            at(&x),
            input_port(pos[&add], ports(&add), 1),
            at(&add),
        );
        // Every L segment of the path is vertical; each lies outside the chain's nodes.
        for seg in path.split(" L").skip(1) {
            let lane: f64 = seg.split(',').next().unwrap().parse().unwrap();
            for n in &chain {
                assert!(
                    lane < pos[n][0] || lane > pos[n][0] + MIN_NODE_WIDTH,
                    "{path} crosses {n} at {pos:?}"
                );
            }
        }
    }

    #[test]
    fn closest_spaced_is_exact_where_the_gaps_allow_and_pools_where_they_do_not() {
        assert_eq!(
            closest_spaced(&[0.0, 100.0], &[1.0, 1.0], &[0.0, 50.0]),
            vec![0.0, 100.0]
        );
        // Both want 10 but must be 40 apart: they split the difference.
        assert_eq!(
            closest_spaced(&[10.0, 10.0], &[1.0, 1.0], &[0.0, 40.0]),
            vec![-10.0, 30.0]
        );
        // Order is kept even when the wishes are reversed.
        let x = closest_spaced(&[100.0, 0.0, 50.0], &[1.0; 3], &[0.0, 10.0, 10.0]);
        assert!(
            x[0] + 10.0 <= x[1] + 1e-9 && x[1] + 10.0 <= x[2] + 1e-9,
            "{x:?}"
        );
    }

    #[test]
    fn sources_sit_just_above_their_first_consumer() {
        let mut d = model::empty("t");
        let x = model::add_input(&mut d, [0.0, 0.0]);
        let a = model::add_op(&mut d, "relu", 1, [0.0, 0.0]);
        let b = model::add_op(&mut d, "relu", 1, [0.0, 0.0]);
        let m = model::add_input(&mut d, [0.0, 0.0]);
        let c = model::add_op(&mut d, "mul", 2, [0.0, 0.0]);
        model::connect(&mut d, &x, &a, 0).unwrap();
        model::connect(&mut d, &a, &b, 0).unwrap();
        model::connect(&mut d, &b, &c, 0).unwrap();
        model::connect(&mut d, &m, &c, 1).unwrap();
        let l = layers(&d);
        assert_eq!(l[&m] + 1, l[&c]);
        assert_eq!(l[&x], 0);
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
        place_missing(&mut d, &one_port);
        assert_eq!(d.layout.len(), 2);
        assert!(bounds(&d, &one_port).is_some());
    }
}
