//! The graph canvas (SVG): nodes with named input ports along their top and output ports
//! along their bottom, edges routed around the nodes between their ends and labelled
//! with their inferred shape and dtype, invalid nodes marked with the engine's message,
//! stage colours and the GPU-time heat map. Pointer gestures: drag a node to move it (with
//! the rest of the selection), shift-click to add to the selection, shift-drag the
//! background for a box selection, drag the background or turn the wheel to scroll,
//! Ctrl+wheel (or pinch) to zoom, drag from an output port to an input port to connect,
//! click an edge to select it; drop a wire on the empty canvas (or double-click it) for
//! quick-add ([`super::menu`]). While a wire is drawn, the inputs that can take it are
//! marked. Keyboard: Tab moves between nodes (selecting them), arrows move the selection,
//! A adds, C connects, E edits the properties, Delete removes. A minimap in the corner
//! shows the whole graph and where the view is; click or drag it to move the view.

use super::actions::{place, place_in_view};
use super::to_canvas;
use crate::charts::{heat_colour, node_time, stage_colour};
use crate::check;
use crate::layout::{
    input_port, node_width, output_port, Ports, MAX_ZOOM, MIN_NODE_WIDTH, MIN_ZOOM, NODE_HEIGHT,
};
use crate::model::{self, output_ref, parse_ref};
use crate::route::{Labels, Rect, Router};
use crate::schema;
use crate::state::{ContextTarget, Drag, EditorState, Menu, Viewport};
use leptos::prelude::*;
use std::collections::BTreeSet;

/// Pointer movement (pixels) below which a press is a click, not a drag.
const CLICK_SLOP: f64 = 4.0;

fn client(ev: &web_sys::MouseEvent) -> [f64; 2] {
    [f64::from(ev.client_x()), f64::from(ev.client_y())]
}

fn inside_canvas(p: [f64; 2]) -> bool {
    super::canvas_rect()
        .is_some_and(|r| p[0] >= r[0] && p[0] <= r[0] + r[2] && p[1] >= r[1] && p[1] <= r[1] + r[3])
}

/// Starts dragging an operator out of the palette.
pub fn begin_palette_drag(state: EditorState, op: String, ev: &web_sys::PointerEvent) {
    if ev.button() != 0 {
        return;
    }
    ev.prevent_default();
    let p = client(ev);
    state.drag.set(Some(Drag::Palette {
        op,
        start: p,
        at: p,
    }));
}

fn on_move(state: EditorState, ev: web_sys::PointerEvent) {
    let Some(drag) = state.drag.get_untracked() else {
        return;
    };
    let p = client(&ev);
    let view = state.view.get_untracked();
    match drag {
        Drag::Palette { op, start, .. } => state.drag.set(Some(Drag::Palette { op, start, at: p })),
        Drag::Pan {
            start, view: v0, ..
        } => {
            let moved = (p[0] - start[0]).hypot(p[1] - start[1]) > CLICK_SLOP;
            state.view.set(Viewport {
                tx: v0.tx + p[0] - start[0],
                ty: v0.ty + p[1] - start[1],
                k: v0.k,
            });
            state.drag.set(Some(Drag::Pan {
                start,
                view: v0,
                moved,
            }));
        }
        Drag::Move { start, before } => {
            let c = to_canvas(view, p);
            let (dx, dy) = ((c[0] - start[0]).round(), (c[1] - start[1]).round());
            let selected = state.selection.get_untracked();
            let mut next = (*before).clone();
            model::move_by(&mut next, &selected, dx, dy);
            state.doc.set(next);
        }
        Drag::Wire { from, .. } => state.drag.set(Some(Drag::Wire {
            from,
            at: to_canvas(view, p),
        })),
        Drag::Select { start, .. } => state.drag.set(Some(Drag::Select {
            start,
            at: to_canvas(view, p),
        })),
    }
}

/// The input port under a client point: (node, port).
fn port_at(p: [f64; 2]) -> Option<(String, usize)> {
    let doc = web_sys::window()?.document()?;
    let el = doc.element_from_point(p[0] as f32, p[1] as f32)?;
    let port = el.closest("[data-in-port]").ok().flatten()?;
    let node = port.get_attribute("data-node")?;
    let k = port.get_attribute("data-in-port")?.parse().ok()?;
    Some((node, k))
}

fn on_up(state: EditorState, ev: web_sys::PointerEvent) {
    let Some(drag) = state.drag.get_untracked() else {
        return;
    };
    state.drag.set(None);
    let p = client(&ev);
    let view = state.view.get_untracked();
    match drag {
        Drag::Palette { op, start, .. } => {
            let moved = (p[0] - start[0]).hypot(p[1] - start[1]) > CLICK_SLOP;
            if !moved {
                place_in_view(state, &op);
            } else if inside_canvas(p) {
                let c = to_canvas(view, p);
                place(state, &op, [c[0] - MIN_NODE_WIDTH / 2.0, c[1] - 16.0]);
            }
        }
        Drag::Pan { moved, .. } => {
            if !moved {
                state.selection.set(BTreeSet::new());
                state.selected_edge.set(None);
            }
        }
        Drag::Move { before, .. } => {
            let now = state.doc.get_untracked();
            if now != *before {
                state.history.update_value(|h| h.record(*before));
            }
        }
        Drag::Wire { from, .. } => {
            if let Some((node, port)) = port_at(p) {
                let doc = state.doc.get_untracked();
                match check::connect(&doc, &from, &node, port) {
                    Ok(next) => state.replace(doc, next),
                    Err(e) => state.error(format!("connection refused: {e}")),
                }
            } else if inside_canvas(p) && !over_node(p) {
                // Dropped on the empty canvas: add a node reading the wire, there.
                let c = to_canvas(view, p);
                state.menu.set(Some(Menu::Add {
                    at: [(c[0] - MIN_NODE_WIDTH / 2.0).round(), c[1].round()],
                    screen: p,
                    from: Some(from),
                    then: None,
                }));
            }
        }
        Drag::Select { start, at } => {
            let (x0, x1) = (start[0].min(at[0]), start[0].max(at[0]));
            let (y0, y1) = (start[1].min(at[1]), start[1].max(at[1]));
            // A node is selected when the box contains all of it.
            let hits: BTreeSet<String> = untrack(|| placement(state))
                .into_iter()
                .filter(|(_, p)| {
                    let r = p.rect();
                    r[0] >= x0 && r[0] + r[2] <= x1 && r[1] >= y0 && r[1] + r[3] <= y1
                })
                .flat_map(|(id, _)| selectable(state, &id))
                .collect();
            state.selection.update(|s| s.extend(hits));
        }
    }
}

/// Whether a client point is over a node (or a port of one).
fn over_node(p: [f64; 2]) -> bool {
    web_sys::window()
        .and_then(|w| w.document())
        .and_then(|d| d.element_from_point(p[0] as f32, p[1] as f32))
        .and_then(|el| el.closest("g.node").ok().flatten())
        .is_some()
}

/// A file dropped on the canvas: opened as a graph file or an ONNX model (the first file,
/// when several are dropped).
fn on_file_drop(state: EditorState, ev: web_sys::DragEvent) {
    let Some(file) = ev
        .data_transfer()
        .and_then(|d| d.files())
        .and_then(|f| f.get(0))
    else {
        return;
    };
    ev.prevent_default();
    super::actions::import_dropped(state, file);
}

/// The wheel scrolls the canvas; with Ctrl (or a touchpad pinch, which browsers report
/// as Ctrl+wheel) it zooms at the pointer.
fn on_wheel(state: EditorState, ev: web_sys::WheelEvent) {
    ev.prevent_default();
    if !(ev.ctrl_key() || ev.meta_key()) {
        let (dx, dy) = if ev.shift_key() && ev.delta_x() == 0.0 {
            (ev.delta_y(), 0.0)
        } else {
            (ev.delta_x(), ev.delta_y())
        };
        return state.view.update(|v| {
            v.tx -= dx;
            v.ty -= dy;
        });
    }
    let r = super::canvas_rect().unwrap_or([0.0; 4]);
    let (px, py) = (
        f64::from(ev.client_x()) - r[0],
        f64::from(ev.client_y()) - r[1],
    );
    state.view.update(|v| {
        let k = (v.k * (-ev.delta_y() * 0.0015).exp()).clamp(MIN_ZOOM, MAX_ZOOM);
        v.tx = px - (px - v.tx) * k / v.k;
        v.ty = py - (py - v.ty) * k / v.k;
        v.k = k;
    });
}

fn on_background_down(state: EditorState, ev: web_sys::PointerEvent) {
    state.menu.set(None);
    if ev.button() != 0 {
        return;
    }
    let p = client(&ev);
    if ev.shift_key() {
        let c = to_canvas(state.view.get_untracked(), p);
        state.drag.set(Some(Drag::Select { start: c, at: c }));
    } else {
        state.drag.set(Some(Drag::Pan {
            start: p,
            view: state.view.get_untracked(),
            moved: false,
        }));
    }
}

/// A double-click on the empty canvas opens quick-add there.
fn on_background_double_click(state: EditorState, ev: web_sys::MouseEvent) {
    let p = client(&ev);
    if over_node(p) {
        return;
    }
    let c = to_canvas(state.view.get_untracked(), p);
    state.menu.set(Some(Menu::Add {
        at: [(c[0] - MIN_NODE_WIDTH / 2.0).round(), (c[1] - 30.0).round()],
        screen: p,
        from: None,
        then: None,
    }));
}

/// What selecting drawn node `id` selects: the node, or a collapsed block's nodes.
fn selectable(state: EditorState, id: &str) -> BTreeSet<String> {
    state
        .collapsed_view
        .with_untracked(|v| match v.members.get(id) {
            Some(members) => members.iter().cloned().collect(),
            None => BTreeSet::from([id.to_string()]),
        })
}

/// Adds drawn node `id` to the selection, or takes it out when it is all in already.
fn toggle_selected(state: EditorState, id: &str) {
    let ids = selectable(state, id);
    state.selection.update(|s| {
        if ids.iter().all(|i| s.contains(i)) {
            s.retain(|i| !ids.contains(i));
        } else {
            s.extend(ids);
        }
    });
}

/// Keys on a focused node: Enter selects it alone, Space adds it to the selection or
/// takes it out.
fn on_node_key(state: EditorState, id: &str, ev: web_sys::KeyboardEvent) {
    match ev.key().as_str() {
        "Enter" => state.selection.set(selectable(state, id)),
        " " => toggle_selected(state, id),
        _ => return,
    }
    state.selected_edge.set(None);
    ev.prevent_default();
    ev.stop_propagation();
}

/// Focus reaching a node from the keyboard (Tab) selects it, as a click would.
fn on_node_focus(state: EditorState, id: &str, ev: web_sys::FocusEvent) {
    use wasm_bindgen::JsCast;
    let from_keyboard = ev
        .target()
        .and_then(|t| t.dyn_into::<web_sys::Element>().ok())
        .is_some_and(|e| e.matches(":focus-visible").unwrap_or(false));
    let ids = selectable(state, id);
    let alone = state.selection.with_untracked(|s| *s == ids);
    if from_keyboard && !alone {
        state.selection.set(ids);
        state.selected_edge.set(None);
    }
}

fn on_node_down(state: EditorState, id: &str, ev: web_sys::PointerEvent) {
    if ev.button() != 0 {
        return;
    }
    ev.stop_propagation();
    state.selected_edge.set(None);
    if ev.shift_key() {
        return toggle_selected(state, id);
    }
    let ids = selectable(state, id);
    if !state
        .selection
        .with_untracked(|s| ids.iter().all(|i| s.contains(i)))
    {
        state.selection.set(ids);
    }
    let c = to_canvas(state.view.get_untracked(), client(&ev));
    state.drag.set(Some(Drag::Move {
        start: c,
        before: Box::new(state.doc.get_untracked()),
    }));
}

fn on_port_down(state: EditorState, from: String, ev: web_sys::PointerEvent) {
    if ev.button() != 0 {
        return;
    }
    ev.stop_propagation();
    let c = to_canvas(state.view.get_untracked(), client(&ev));
    state.drag.set(Some(Drag::Wire { from, at: c }));
}

/// The wire being drawn from an output port to the pointer: down out of the port, into
/// the pointer from above.
fn wire_curve(a: [f64; 2], b: [f64; 2]) -> String {
    let dy = ((b[1] - a[1]).abs() / 2.0).max(40.0);
    format!(
        "M{:.1},{:.1} C{:.1},{:.1} {:.1},{:.1} {:.1},{:.1}",
        a[0],
        a[1],
        a[0],
        a[1] + dy,
        b[0],
        b[1] - dy,
        b[0],
        b[1]
    )
}

/// Where a node (or graph input) is drawn and its ports' names.
struct Placed {
    pos: [f64; 2],
    inputs: Vec<String>,
    outputs: Vec<String>,
}

impl Placed {
    fn ports(&self) -> Ports {
        (self.inputs.len(), self.outputs.len())
    }

    fn rect(&self) -> Rect {
        [
            self.pos[0],
            self.pos[1],
            node_width(self.ports()),
            NODE_HEIGHT,
        ]
    }
}

/// Every positioned node and graph input with its ports, as drawn.
/// Collapsed blocks are drawn as one box each, at their nodes' top-left corner.
fn placement(state: EditorState) -> std::collections::BTreeMap<String, Placed> {
    state.collapsed_view.with(|view| {
        state.ports.with(|ports| {
            state.doc.with(|d| {
                let mut placed: std::collections::BTreeMap<String, Placed> = d
                    .layout
                    .iter()
                    .filter(|(id, _)| !view.owner.contains_key(*id))
                    .filter_map(|(id, &pos)| {
                        let (inputs, outputs) = ports.get(id)?.clone();
                        Some((
                            id.clone(),
                            Placed {
                                pos,
                                inputs,
                                outputs,
                            },
                        ))
                    })
                    .collect();
                for (b, members) in &view.members {
                    if let Some(pos) = corner(d, members) {
                        let inputs = view.inputs.get(b).cloned().unwrap_or_default();
                        let outputs = view.outputs.get(b).cloned().unwrap_or_default();
                        placed.insert(
                            b.clone(),
                            Placed {
                                pos,
                                inputs,
                                outputs,
                            },
                        );
                    }
                }
                placed
            })
        })
    })
}

/// The top-left corner of `members`' positions (where their collapsed box goes).
fn corner(doc: &sluice_engine::graph::GraphDoc, members: &[String]) -> Option<[f64; 2]> {
    members
        .iter()
        .filter_map(|m| doc.layout.get(m))
        .fold(None, |c: Option<[f64; 2]>, p| {
            Some(c.map_or(*p, |c| [c[0].min(p[0]), c[1].min(p[1])]))
        })
}

/// The attributes a node sets, as `name value` (lists as `3×3`), for its subtitle: what
/// tells two nodes of one operator apart at a glance.
fn key_attributes(node: &sluice_engine::graph::doc::NodeDoc) -> Vec<String> {
    node.attrs
        .iter()
        .map(|(name, value)| {
            let shown = match value.as_array() {
                Some(list) if list.iter().all(serde_json::Value::is_number) => list
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("×"),
                _ => schema::show_value(value),
            };
            format!("{name} {shown}")
        })
        .collect()
}

/// A count in a few characters: 812, 12.3k, 4.5M, 1.2G.
fn count_text(n: u64) -> String {
    let n_f = n as f64;
    match n {
        0..=999 => n.to_string(),
        1_000..=999_999 => format!("{:.1}k", n_f / 1e3),
        1_000_000..=999_999_999 => format!("{:.1}M", n_f / 1e6),
        _ => format!("{:.1}G", n_f / 1e9),
    }
}

/// A node's title cut to `chars` characters when longer, keeping its end (an imported
/// model's ids are paths, `/layer1/layer1.0/conv1/Conv`, whose end says most).
fn fit_title(text: &str, chars: usize) -> String {
    let count = text.chars().count();
    if count <= chars {
        text.to_string()
    } else {
        let keep = chars.max(2) - 1;
        format!("…{}", text.chars().skip(count - keep).collect::<String>())
    }
}

/// `text` cut to `chars` characters (an ellipsis included) when longer.
fn fit_text(text: &str, chars: usize) -> String {
    if text.chars().count() <= chars {
        text.to_string()
    } else {
        super::truncate(text, chars.max(2) - 1)
    }
}

/// What one node looks like, worked out from the document and the analysis.
#[derive(Debug, Clone)]
struct NodeLook {
    id: String,
    subtitle: String,
    /// Input ports: name, connected, tooltip.
    inputs: Vec<(String, bool, String)>,
    /// Output ports: name, a graph output, tooltip.
    outputs: Vec<(String, bool, String)>,
    /// Nothing reads it and it is not a graph output.
    unused: bool,
    /// How many weight values it declares, when known.
    weights: Option<u64>,
    problem: Option<String>,
    fill: String,
    band: Option<&'static str>,
    pinned: bool,
}

impl NodeLook {
    /// Everything the node's drawing depends on but its position and selection (which
    /// update in place): the canvas redraws a node only when its key changes.
    fn key(&self) -> String {
        format!("{self:?}")
    }
}

/// How a collapsed block's box looks: its nodes' count, weights and problems, and ports
/// for its connections outside.
fn block_look(
    d: &sluice_engine::graph::GraphDoc,
    a: &sluice_engine::graph::Analysis,
    view: &crate::groups::Collapsed,
    id: &str,
    members: &[String],
    typed: &dyn Fn(&str) -> String,
) -> NodeLook {
    let block = crate::groups::block_of_box(id).unwrap_or(id);
    let inputs = view
        .inputs
        .get(id)
        .map(|refs| {
            refs.iter()
                .map(|r| {
                    (
                        r.clone(),
                        true,
                        format!("into block {block}: {} from '{r}'", typed(r)),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    let outputs = view
        .outputs
        .get(id)
        .map(|refs| {
            refs.iter()
                .map(|r| {
                    let is_output = d.outputs.contains(r);
                    (
                        r.clone(),
                        is_output,
                        format!("out of block {block}: '{r}', {}", typed(r)),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    let problems: usize = members.iter().map(|m| a.problems_of(m).count()).sum();
    let weights: u64 = members
        .iter()
        .filter_map(|m| check::weight_count(d, a, m))
        .sum();
    NodeLook {
        id: id.to_string(),
        subtitle: format!("block · {} nodes", members.len()),
        inputs,
        outputs,
        unused: false,
        weights: (weights > 0).then_some(weights),
        problem: (problems > 0).then(|| {
            format!(
                "{problems} problem{} inside",
                if problems == 1 { "" } else { "s" }
            )
        }),
        fill: "var(--node-input)".into(),
        band: None,
        pinned: false,
    }
}

/// How every node placed on the canvas (ids in `placed`) looks, but where it is.
fn looks(state: EditorState, placed: &[String]) -> Vec<NodeLook> {
    let heat = state.heat.get();
    let times = if heat {
        state.run.with(|r| node_time(&r.events))
    } else {
        Default::default()
    };
    let hottest = times.values().copied().max().unwrap_or(0).max(1) as f64;
    let stages = state.stages.get().ok();
    let multi_stage = state.settings.with(|s| s.stages > 1);
    state.analysis.with(|a| {
        state.ports.with(|ports| {
            state.unplaced.with(|d| {
                let mut out = Vec::new();
                let unused: BTreeSet<String> = check::unused(d).into_iter().collect();
                // Who reads each output, for the output ports' tooltips.
                let mut readers: std::collections::BTreeMap<&str, Vec<&str>> = Default::default();
                for n in &d.nodes {
                    for r in n.inputs.iter().filter(|r| !r.is_empty()) {
                        readers.entry(r.as_str()).or_default().push(&n.id);
                    }
                }
                let typed = |reference: &str| {
                    check::type_of(a, reference)
                        .map_or_else(|| "type not inferred yet".to_string(), |t| t.to_string())
                };
                let view = state.collapsed_view.get();
                for id in placed {
                    if let Some(members) = view.members.get(id) {
                        out.push(block_look(d, a, &view, id, members, &typed));
                        continue;
                    }
                    let Some((port_inputs, port_outputs)) = ports.get(id) else {
                        continue;
                    };
                    let node = model::node(d, id);
                    let inputs = port_inputs
                        .iter()
                        .enumerate()
                        .map(|(k, name)| {
                            let source =
                                node.and_then(|n| n.inputs.get(k)).filter(|r| !r.is_empty());
                            let tip = match source {
                                Some(r) => {
                                    format!("input {k} '{name}' of {id}: {} from '{r}'", typed(r))
                                }
                                None => format!("input {k} '{name}' of {id}: not connected"),
                            };
                            (name.clone(), source.is_some(), tip)
                        })
                        .collect();
                    let outputs = port_outputs
                        .iter()
                        .enumerate()
                        .map(|(k, name)| {
                            let reference = output_ref(id, k);
                            let is_output = d.outputs.contains(&reference);
                            let read_by = readers.get(reference.as_str()).map_or_else(
                                || "read by nothing".to_string(),
                                |r| format!("read by {}", r.join(", ")),
                            );
                            let tip = format!(
                                "output {k} '{name}' of {id}: {}, {read_by}{}",
                                typed(&reference),
                                if is_output { "; a graph output" } else { "" }
                            );
                            (name.clone(), is_output, tip)
                        })
                        .collect();
                    let problem = a.problems_of(id).map(|p| p.message.clone()).next();
                    let (subtitle, fill, band, pinned) = match node {
                        None => (
                            d.inputs.get(id).map_or_else(String::new, |decl| {
                                format!(
                                    "input · {} [{}]",
                                    decl.dtype,
                                    model::show_shape(&decl.shape)
                                )
                            }),
                            "var(--node-input)".to_string(),
                            None,
                            false,
                        ),
                        Some(n) => {
                            let fill = match times.get(id) {
                                Some(&t) if heat => heat_colour(t as f64 / hottest),
                                _ if heat => "var(--node-idle)".into(),
                                _ => "var(--node)".into(),
                            };
                            let band = if multi_stage {
                                stages
                                    .as_ref()
                                    .and_then(|s| s.get(id))
                                    .map(|&s| stage_colour(s))
                            } else {
                                None
                            };
                            let subtitle = [n.op.clone()]
                                .into_iter()
                                .chain(key_attributes(n))
                                .collect::<Vec<_>>()
                                .join(" · ");
                            (subtitle, fill, band, d.stages.contains_key(id))
                        }
                    };
                    out.push(NodeLook {
                        weights: check::weight_count(d, a, id),
                        unused: unused.contains(id),
                        id: id.clone(),
                        subtitle,
                        inputs,
                        outputs,
                        problem,
                        fill,
                        band,
                        pinned,
                    });
                }
                out
            })
        })
    })
}

/// The inputs that can take the wire being drawn (None: no wire), by (node, port).
type Wiring = Memo<Option<BTreeSet<(String, usize)>>>;

fn node_view(state: EditorState, look: NodeLook, wiring: Wiring) -> impl IntoView {
    let NodeLook {
        id,
        subtitle,
        inputs,
        outputs,
        problem,
        fill,
        band,
        pinned,
        unused,
        weights,
    } = look;
    let ports = (inputs.len(), outputs.len());
    let w = node_width(ports);
    let is_block = crate::groups::block_of_box(&id).is_some();
    let mut class = String::from(if is_block { "node block" } else { "node" });
    if problem.is_some() {
        class.push_str(" invalid");
    }
    if unused {
        class.push_str(" unused");
    }
    let id_down = id.clone();
    // Characters of a 10 px port label that fit in a port's share of the width.
    let label_chars = |count: usize| (w / count.max(1) as f64 / 6.0) as usize;
    let in_chars = label_chars(inputs.len());
    let ports_in = inputs
        .into_iter()
        .enumerate()
        .map(|(k, (name, connected, tip))| {
            let p = input_port([0.0, 0.0], ports, k);
            let key = (id.clone(), k);
            let fits = move || wiring.with(|w| w.as_ref().map(|w| w.contains(&key)));
            let fits2 = fits.clone();
            view! {
                <g class="port in" data-node=id.clone() data-in-port=(!is_block).then(|| k.to_string())
                    class:compatible=move || fits() == Some(true)
                    class:incompatible=move || fits2() == Some(false)>
                    <title>{tip}</title>
                    <circle class="hit" cx=p[0] cy=p[1] r="10" />
                    <circle class="dot" class:connected=connected cx=p[0] cy=p[1] r="5" />
                    <text class="port-label" x=p[0] y=p[1] + 16.0 text-anchor="middle">{fit_text(&name, in_chars)}</text>
                </g>
            }
        })
        .collect_view();
    let out_chars = label_chars(outputs.len());
    let ports_out = outputs
        .into_iter()
        .enumerate()
        .map(|(k, (name, is_output, tip))| {
            let p = output_port([0.0, 0.0], ports, k);
            // A collapsed block's outputs are its nodes' own (the port's name).
            let from = if is_block { name.clone() } else { output_ref(&id, k) };
            let label = if is_output { format!("{name} ⇒") } else { name };
            view! {
                <g class="port out" data-node=id.clone() data-out-port=k.to_string()
                    on:pointerdown=move |ev| on_port_down(state, from.clone(), ev)>
                    <title>{tip}</title>
                    <circle class="hit" cx=p[0] cy=p[1] r="10" />
                    <circle class="dot" class:graph-output=is_output cx=p[0] cy=p[1] r="5" />
                    <text class="port-label" x=p[0] y=p[1] - 7.0 text-anchor="middle">{fit_text(&label, out_chars)}</text>
                </g>
            }
        })
        .collect_view();
    // An 11 px line across the node but its margins (the badge sits on the title line).
    let text_chars = ((w - 20.0) / 6.2) as usize;
    let second_line = match &problem {
        Some(m) => {
            view! { <text class="problem-text" x="10" y="48">{fit_text(m, text_chars)}</text> }
                .into_any()
        }
        None => {
            view! { <text class="subtitle" x="10" y="48">{fit_text(&subtitle, text_chars)}</text> }
                .into_any()
        }
    };
    let badge = problem.is_some().then(|| {
        view! {
            <g class="badge">
                <circle cx=w - 14.0 cy="30" r="8" />
                <text x=w - 14.0 y="34" text-anchor="middle">"!"</text>
            </g>
        }
    });
    let title = format!("{id}{}", if pinned { " 📌" } else { "" });
    // The weight count, right-aligned on the title's line (where a problem's badge goes
    // otherwise): the title gives up the room it takes.
    let count = weights.filter(|_| problem.is_none()).map(count_text);
    let title_chars =
        ((w - 34.0) / 7.6) as usize - count.as_ref().map_or(0, |c| (c.chars().count() + 1).min(8));
    let weight_text = count
        .map(|c| view! { <text class="weights" x=w - 10.0 y="34" text-anchor="end">{c}</text> });
    let weighs = weights.map_or_else(String::new, |n| format!(" · {n} weight values"));
    let tip = match &problem {
        Some(m) => format!("{id} · {subtitle}{weighs}\n{m}"),
        None => format!("{id} · {subtitle}{weighs}"),
    };
    let aria = match &problem {
        Some(m) => format!("{id}, {subtitle}, problem: {m}"),
        None => format!("{id}, {subtitle}"),
    };
    let id_open = id.clone();
    let (id_key, id_focus, id_sel, id_pressed, id_pos, id_menu) = (
        id.clone(),
        id.clone(),
        id.clone(),
        id.clone(),
        id.clone(),
        id.clone(),
    );
    let transform = move || {
        state.doc.with(|d| {
            let at = match state
                .collapsed_view
                .with(|v| v.members.get(&id_pos).cloned())
            {
                Some(members) => corner(d, &members),
                None => d.layout.get(&id_pos).copied(),
            };
            at.map(|p| format!("translate({},{})", p[0], p[1]))
        })
    };
    view! {
        <g class=class data-id=id.clone() data-problem=problem.unwrap_or_default()
            class:selected=move || {
                let ids = selectable(state, &id_sel);
                state.selection.with(|s| ids.iter().all(|i| s.contains(i)))
            }
            tabindex="0" role="group" aria-roledescription="node"
            aria-label=move || {
                let ids = selectable(state, &id_pressed);
                let selected = state.selection.with(|s| ids.iter().all(|i| s.contains(i)));
                format!("{aria}{}", if selected { ", selected" } else { "" })
            }
            on:keydown=move |ev| on_node_key(state, &id_key, ev)
            on:focus=move |ev| on_node_focus(state, &id_focus, ev)
            on:contextmenu=move |ev| super::context_menu::open(state, ContextTarget::Node(id_menu.clone()), &ev)
            on:dblclick=move |ev: web_sys::MouseEvent| {
                // A double-click on a collapsed block opens it.
                if let Some(block) = crate::groups::block_of_box(&id_open) {
                    ev.stop_propagation();
                    state.collapsed.update(|c| { c.remove(block); });
                }
            }
            transform=transform>
            <title>{tip}</title>
            <rect class="body" width=w height=NODE_HEIGHT rx="6" style=format!("fill:{fill}")
                on:pointerdown=move |ev| on_node_down(state, &id_down, ev) />
            {band.map(|c| view! { <rect class="stage-band" width=w height="5" rx="2" fill=c /> })}
            <text class="title" x="10" y="34">{fit_title(&title, title_chars)}</text>
            {weight_text}
            {second_line}
            {ports_in}
            {ports_out}
            {badge}
        </g>
    }
}

/// One edge as drawn: its routed path and its type label's place.
#[derive(Clone, PartialEq)]
struct DrawnEdge {
    /// The input it feeds: (node, port) in the document.
    key: (String, usize),
    /// The drawn node (or collapsed block) it leaves and enters.
    from: String,
    to: String,
    name: String,
    path: String,
    label: String,
    label_at: [f64; 2],
}

/// Every edge of the document, routed around the nodes, with the type the engine inferred
/// for it and where that label goes.
fn drawn_edges(state: EditorState) -> Vec<DrawnEdge> {
    let placed = placement(state);
    let index: std::collections::BTreeMap<&str, usize> = placed
        .keys()
        .enumerate()
        .map(|(i, id)| (id.as_str(), i))
        .collect();
    let rects: Vec<Rect> = placed.values().map(Placed::rect).collect();
    let mut router = Router::new(&rects);
    let mut labels = Labels::new(&rects);
    let view = state.collapsed_view.get();
    state.analysis.with(|a| {
        state.doc.with(|d| {
            let mut out = Vec::new();
            // An input of a collapsed block that several of its nodes read is one edge.
            let mut drawn_inputs = BTreeSet::new();
            for n in &d.nodes {
                for (k, r) in n.inputs.iter().enumerate() {
                    if r.is_empty() {
                        continue;
                    }
                    let (src, port) = parse_ref(r);
                    let (source, out_port) = view.source(r);
                    let (target, in_port) = match view.owner.get(&n.id) {
                        Some(b) if view.owner.get(src) == Some(b) => continue,
                        Some(b) => {
                            let ports = view.inputs.get(b);
                            let k = ports.and_then(|p| p.iter().position(|x| x == r));
                            (b.clone(), k.unwrap_or(0))
                        }
                        None => (n.id.clone(), k),
                    };
                    if !drawn_inputs.insert((target.clone(), in_port)) {
                        continue;
                    }
                    let (Some(sp), Some(dp)) = (placed.get(&source), placed.get(&target)) else {
                        continue;
                    };
                    let from = output_port(sp.pos, sp.ports(), out_port);
                    let to = input_port(dp.pos, dp.ports(), in_port);
                    let path =
                        router.route(from, index[source.as_str()], to, index[target.as_str()]);
                    let label = a
                        .types
                        .get(src)
                        .and_then(|t| t.get(port))
                        .map_or_else(|| "?".to_string(), |t| t.to_string());
                    let label_at = labels.place(&label, to, in_port);
                    out.push(DrawnEdge {
                        key: (n.id.clone(), k),
                        name: format!("{r}>{target}:{in_port}"),
                        from: source,
                        to: target,
                        path,
                        label,
                        label_at,
                    });
                }
            }
            out
        })
    })
}

/// `previous` with the edges of the selected (moving) nodes redrawn as plain curves between
/// their ports and their labels beside their targets; the other edges stay as routed.
fn follow_moved(state: EditorState, previous: &[DrawnEdge]) -> Vec<DrawnEdge> {
    let placed = placement(state);
    let moved = state.selection.get_untracked();
    state.doc.with(|d| {
        previous
            .iter()
            .map(|e| {
                let (to, k) = (&e.key.0, e.key.1);
                if !moved.contains(to) && !moved.contains(&e.from) {
                    return e.clone();
                }
                let reference = model::node(d, to)
                    .and_then(|n| n.inputs.get(k).cloned())
                    .unwrap_or_default();
                let (src, port) = parse_ref(&reference);
                let (Some(sp), Some(dp)) = (placed.get(src), placed.get(to)) else {
                    return e.clone();
                };
                let a = output_port(sp.pos, sp.ports(), port);
                let b = input_port(dp.pos, dp.ports(), k);
                DrawnEdge {
                    path: wire_curve(a, b),
                    label_at: [b[0] + 6.0, b[1] - 8.0],
                    ..e.clone()
                }
            })
            .collect()
    })
}

/// The edges' type labels, drawn above the nodes (each redrawn only when it changes).
fn edge_labels(drawn: Memo<Vec<DrawnEdge>>) -> impl IntoView {
    view! {
        <For each=move || drawn.get()
            key=|e| format!("{}|{}|{:.1},{:.1}", e.name, e.label, e.label_at[0], e.label_at[1])
            children=|e| view! {
                <text class="edge-label" data-edge=e.name x=e.label_at[0] y=e.label_at[1]>{e.label}</text>
            } />
    }
}

/// The edges (their labels are drawn by [`edge_labels`]); each redrawn only when its
/// path or selection changes.
fn edges(state: EditorState, drawn: Memo<Vec<DrawnEdge>>) -> impl IntoView {
    let each = move || {
        let selected = state.selected_edge.get();
        drawn.with(|edges| {
            edges
                .iter()
                .map(|e| (selected.as_ref() == Some(&e.key), e.clone()))
                .collect::<Vec<_>>()
        })
    };
    view! {
        <For each=each key=|(sel, e)| format!("{sel}|{}|{}", e.name, e.path)
            children=move |(is_selected, e)| {
                let key = e.key.clone();
                let menu_key = e.key.clone();
                view! {
                    <g class="edge" class:selected=is_selected data-edge=e.name.clone()
                        data-from=e.from.clone() data-to=e.to.clone()
                        on:pointerdown=move |ev: web_sys::PointerEvent| {
                            ev.stop_propagation();
                            state.selection.set(BTreeSet::new());
                            state.selected_edge.set(Some(key.clone()));
                        }
                        on:contextmenu=move |ev| {
                            let (node, port) = menu_key.clone();
                            super::context_menu::open(state, ContextTarget::Edge(node, port), &ev)
                        }>
                        <path class="edge-hit" d=e.path.clone() />
                        <path class="edge-line" d=e.path.clone() />
                    </g>
                }
            } />
    }
}

/// The canvas.
#[component]
pub fn Canvas(state: EditorState) -> impl IntoView {
    let _ = window_event_listener(leptos::ev::pointermove, move |ev| on_move(state, ev));
    let _ = window_event_listener(leptos::ev::pointerup, move |ev| on_up(state, ev));
    // A press anywhere but on the context menu closes it.
    let _ = window_event_listener(leptos::ev::pointerdown, move |_| {
        if state.context.with_untracked(Option::is_some) {
            state.context.set(None);
        }
    });
    // While nodes are dragged, only their own edges follow (as plain curves); everything
    // is routed again when they are dropped.
    let moving = Memo::new(move |_| matches!(state.drag.get(), Some(Drag::Move { .. })));
    // Which nodes have a place: unchanged while nodes move, so their looks are not redone.
    let positioned = Memo::new(move |_| {
        state.collapsed_view.with(|view| {
            state.doc.with(|d| {
                d.layout
                    .keys()
                    .filter(|id| !view.owner.contains_key(*id))
                    .chain(view.members.keys())
                    .cloned()
                    .collect::<Vec<_>>()
            })
        })
    });
    let drawn = Memo::new(move |previous: Option<&Vec<DrawnEdge>>| match previous {
        Some(previous) if moving.get() => follow_moved(state, previous),
        _ => {
            let _ = moving.get();
            drawn_edges(state)
        }
    });
    // The wire's source only: the marks are worked out once per wire, not per movement.
    let wire_from = Memo::new(move |_| match state.drag.get() {
        Some(Drag::Wire { from, .. }) => Some(from),
        _ => None,
    });
    let wiring: Wiring = Memo::new(move |_| {
        let from = wire_from.get()?;
        let placed = untrack(|| placement(state));
        let inputs = placed.iter().map(|(id, p)| (id.clone(), p.inputs.len()));
        Some(untrack(|| {
            state.analysis.with(|a| {
                state
                    .doc
                    .with(|d| check::compatible_inputs(d, a, &from, inputs))
            })
        }))
    });
    let transform = move || {
        let v = state.view.get();
        format!("translate({:.1},{:.1}) scale({:.4})", v.tx, v.ty, v.k)
    };
    let overlay = move || match state.drag.get() {
        Some(Drag::Wire { from, at }) => {
            let (src, port) = parse_ref(&from);
            let start = placement(state)
                .get(src)
                .map(|p| output_port(p.pos, p.ports(), port));
            start.map(|s| view! { <path class="wire" d=wire_curve(s, at) /> }.into_any())
        }
        Some(Drag::Select { start, at }) => Some(
            view! {
                <rect class="box-select" x=start[0].min(at[0]) y=start[1].min(at[1])
                    width=(at[0] - start[0]).abs() height=(at[1] - start[1]).abs() />
            }
            .into_any(),
        ),
        _ => None,
    };
    let ghost = move || match state.drag.get() {
        Some(Drag::Palette { op, start, at })
            if (at[0] - start[0]).hypot(at[1] - start[1]) > CLICK_SLOP =>
        {
            Some(view! {
                <div class="ghost" style=format!("left:{}px;top:{}px", at[0] + 6.0, at[1] + 6.0)>{op}</div>
            })
        }
        _ => None,
    };
    let problems = move || {
        // An empty canvas has nothing wrong with it yet: the hint says where to start.
        if state
            .unplaced
            .with(|d| d.nodes.is_empty() && d.inputs.is_empty())
        {
            return None;
        }
        let unused = state.unplaced.with(check::unused);
        Some(state.analysis.with(|a| {
            let n = a.problems.len();
            let mut notes = crate::check::coupling_notes(a);
            notes.extend(unused.into_iter().map(|id| {
                let text = format!("note: '{id}' is unused: nothing reads it and it is not a graph output (mark it as one, or delete it)");
                (id, text)
            }));
            let noted = notes.len();
            let notes = notes
                .into_iter()
                .map(|(node, text)| {
                    view! {
                        <li class="note" on:click=move |_| {
                            state.selection.set(BTreeSet::from([node.clone()]));
                            state.panel.set(crate::state::Panel::Properties);
                        }>{text}</li>
                    }
                })
                .collect_view();
            let summary = match (n, noted) {
                (0, 0) => "graph valid".to_string(),
                (0, k) => format!("graph valid · {k} note{}", if k == 1 { "" } else { "s" }),
                (n, _) => format!("{n} problem{}", if n == 1 { "" } else { "s" }),
            };
            let items = a
                .problems
                .iter()
                .take(50)
                .map(|p| {
                    let node = p.node.clone();
                    // By node and attribute, as the canvas names them; the JSON path only
                    // for what belongs to no node.
                    let text = match &p.node {
                        Some(id) => format!("{id}: {}", p.message),
                        None => p.to_string(),
                    };
                    view! {
                        <li on:click=move |_| {
                            if let Some(id) = &node {
                                state.selection.set(BTreeSet::from([id.clone()]));
                                state.panel.set(crate::state::Panel::Properties);
                            }
                        }>{text}</li>
                    }
                })
                .collect_view();
            view! {
                <details class="problems" class:none=n == 0>
                    <summary data-count=n.to_string() data-notes=noted.to_string()>{summary}</summary>
                    <ul>{items}{notes}</ul>
                </details>
            }
        }))
    };
    view! {
        <div class="canvas-wrap"
            on:dragover=|ev: web_sys::DragEvent| ev.prevent_default()
            on:drop=move |ev| on_file_drop(state, ev)>
            <svg id="canvas" class="canvas" role="group"
                aria-label="Graph canvas: Tab moves between nodes, arrows move them, A adds a node, C connects, E edits, Delete removes"
                class:wiring=move || wire_from.with(Option::is_some)
                on:pointerdown=move |ev| on_background_down(state, ev)
                on:dblclick=move |ev| on_background_double_click(state, ev)
                on:contextmenu=move |ev: web_sys::MouseEvent| {
                    let at = to_canvas(state.view.get_untracked(), client(&ev));
                    super::context_menu::open(state, ContextTarget::Canvas(at), &ev)
                }
                on:wheel=move |ev| on_wheel(state, ev)>
                <g transform=transform>
                    <g class="edges">{edges(state, drawn)}</g>
                    <g class="nodes">
                        <For each=move || positioned.with(|ids| looks(state, ids)) key=NodeLook::key
                            children=move |l| node_view(state, l, wiring) />
                    </g>
                    <g class="edge-labels">{edge_labels(drawn)}</g>
                    {overlay}
                </g>
            </svg>
            {move || state.doc.with(|d| d.layout.is_empty()).then(|| view! {
                <div class="empty-hint">"Drag operators here from the palette — start with an input — or drop a graph file or an ONNX model."</div>
            })}
            {problems}
            <super::find::Find state=state />
            <super::minimap::Minimap state=state />
            <super::menu::SearchMenu state=state />
            <super::context_menu::ContextMenu state=state />
            <div class="zoom">
                <button title="Zoom in (+)" on:click=move |_| state.view.update(|v| v.k = (v.k * 1.2).min(MAX_ZOOM))>"+"</button>
                <button title="Zoom out (−)" on:click=move |_| state.view.update(|v| v.k = (v.k / 1.2).max(MIN_ZOOM))>"−"</button>
                <span class="zoom-level">{move || format!("{:.0}%", state.view.get().k * 100.0)}</span>
            </div>
            {ghost}
        </div>
    }
}
