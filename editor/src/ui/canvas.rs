//! The graph canvas (SVG): nodes with named input ports along their top and output ports
//! along their bottom, edges routed around the nodes between their ends and labelled
//! with their inferred shape and dtype, invalid nodes marked with the engine's message,
//! stage colours and the GPU-time heat map. Pointer gestures: drag a node to move it (with
//! the rest of the selection), shift-click to add to the selection, shift-drag the
//! background for a box selection, drag the background or turn the wheel to scroll,
//! Ctrl+wheel (or pinch) to zoom, drag from an output port to an input port to connect,
//! click an edge to select it.

use crate::charts::{heat_colour, node_time, stage_colour};
use crate::check;
use crate::layout::{
    input_port, node_width, output_port, Ports, MAX_ZOOM, MIN_NODE_WIDTH, MIN_ZOOM, NODE_HEIGHT,
};
use crate::model::{self, output_ref, parse_ref};
use crate::route::{Labels, Rect, Router};
use crate::schema::{self, INPUT};
use crate::state::{Drag, EditorState, Viewport};
use leptos::prelude::*;
use std::collections::BTreeSet;

/// Pointer movement (pixels) below which a press is a click, not a drag.
const CLICK_SLOP: f64 = 4.0;

fn client(ev: &web_sys::MouseEvent) -> [f64; 2] {
    [f64::from(ev.client_x()), f64::from(ev.client_y())]
}

/// Canvas coordinates of a client point.
fn to_canvas(view: Viewport, p: [f64; 2]) -> [f64; 2] {
    let r = super::canvas_rect().unwrap_or([0.0; 4]);
    [
        (p[0] - r[0] - view.tx) / view.k,
        (p[1] - r[1] - view.ty) / view.k,
    ]
}

fn inside_canvas(p: [f64; 2]) -> bool {
    super::canvas_rect()
        .is_some_and(|r| p[0] >= r[0] && p[0] <= r[0] + r[2] && p[1] >= r[1] && p[1] <= r[1] + r[3])
}

/// Adds a node of `op` (or a graph input) with its top-left corner at `pos`, selected.
pub fn place(state: EditorState, op: &str, pos: [f64; 2]) {
    let pos = [pos[0].round(), pos[1].round()];
    let inputs = state.op_info(op).map_or(1, |o| o.initial_inputs());
    let mut id = String::new();
    state.edit(|d| {
        id = if op == INPUT {
            model::add_input(d, pos)
        } else {
            model::add_op(d, op, inputs, pos)
        };
        Ok(())
    });
    state.selection.set(BTreeSet::from([id]));
    state.selected_edge.set(None);
}

/// Adds a node in the middle of the view.
pub fn place_in_view(state: EditorState, op: &str) {
    let r = super::canvas_rect().unwrap_or([0.0, 0.0, 800.0, 600.0]);
    let view = state.view.get_untracked();
    let c = to_canvas(view, [r[0] + r[2] / 2.0, r[1] + r[3] / 2.0]);
    // Stagger so repeated clicks do not stack nodes exactly.
    let n = state.doc.with_untracked(|d| d.layout.len()) as f64;
    place(
        state,
        op,
        [
            c[0] - MIN_NODE_WIDTH / 2.0 + 12.0 * (n % 5.0),
            c[1] - 30.0 + 12.0 * (n % 5.0),
        ],
    );
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
                .map(|(id, _)| id)
                .collect();
            state.selection.update(|s| s.extend(hits));
        }
    }
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

fn on_node_down(state: EditorState, id: &str, ev: web_sys::PointerEvent) {
    if ev.button() != 0 {
        return;
    }
    ev.stop_propagation();
    state.selected_edge.set(None);
    if ev.shift_key() {
        state.selection.update(|s| {
            if !s.remove(id) {
                s.insert(id.to_string());
            }
        });
        return;
    }
    if !state.selection.with_untracked(|s| s.contains(id)) {
        state.selection.set(BTreeSet::from([id.to_string()]));
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
fn placement(state: EditorState) -> std::collections::BTreeMap<String, Placed> {
    state.ops.with(|ops| {
        state.analysis.with(|a| {
            state.doc.with(|d| {
                d.layout
                    .iter()
                    .map(|(id, &pos)| {
                        let inferred = a.types.get(id).map(Vec::len);
                        let (inputs, outputs) = schema::port_names(ops, d, id, inferred);
                        (
                            id.clone(),
                            Placed {
                                pos,
                                inputs,
                                outputs,
                            },
                        )
                    })
                    .collect()
            })
        })
    })
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
struct NodeLook {
    id: String,
    pos: [f64; 2],
    subtitle: String,
    inputs: Vec<(String, bool)>,
    outputs: Vec<(String, bool)>,
    problem: Option<String>,
    fill: String,
    band: Option<&'static str>,
    pinned: bool,
}

fn looks(state: EditorState) -> Vec<NodeLook> {
    let heat = state.heat.get();
    let times = if heat {
        state.run.with(|r| node_time(&r.events))
    } else {
        Default::default()
    };
    let hottest = times.values().copied().max().unwrap_or(0).max(1) as f64;
    let stages = state.stages.get().ok();
    let multi_stage = state.settings.with(|s| s.stages > 1);
    let placed = placement(state);
    state.analysis.with(|a| {
        state.doc.with(|d| {
            let mut out = Vec::new();
            let connected = |id: &str, k: usize| {
                model::node(d, id).is_some_and(|n| n.inputs.get(k).is_some_and(|r| !r.is_empty()))
            };
            for (id, p) in &placed {
                let node = model::node(d, id);
                let inputs = p
                    .inputs
                    .iter()
                    .enumerate()
                    .map(|(k, name)| (name.clone(), connected(id, k)))
                    .collect();
                let outputs = p
                    .outputs
                    .iter()
                    .enumerate()
                    .map(|(k, name)| (name.clone(), d.outputs.contains(&output_ref(id, k))))
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
                        (n.op.clone(), fill, band, d.stages.contains_key(id))
                    }
                };
                out.push(NodeLook {
                    id: id.clone(),
                    pos: p.pos,
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
}

fn node_view(state: EditorState, look: NodeLook, selected: bool) -> impl IntoView {
    let NodeLook {
        id,
        pos,
        subtitle,
        inputs,
        outputs,
        problem,
        fill,
        band,
        pinned,
    } = look;
    let ports = (inputs.len(), outputs.len());
    let w = node_width(ports);
    let mut class = String::from("node");
    if selected {
        class.push_str(" selected");
    }
    if problem.is_some() {
        class.push_str(" invalid");
    }
    let id_down = id.clone();
    // Characters of a 10 px port label that fit in a port's share of the width.
    let label_chars = |count: usize| (w / count.max(1) as f64 / 6.0) as usize;
    let in_chars = label_chars(inputs.len());
    let ports_in = inputs
        .into_iter()
        .enumerate()
        .map(|(k, (name, connected))| {
            let p = input_port([0.0, 0.0], ports, k);
            let tip = format!("input {k} '{name}' of {id}");
            view! {
                <g class="port in" data-node=id.clone() data-in-port=k.to_string()>
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
        .map(|(k, (name, is_output))| {
            let p = output_port([0.0, 0.0], ports, k);
            let from = output_ref(&id, k);
            let tip = format!(
                "output {k} '{name}' of {id}{}",
                if is_output { " (a graph output)" } else { "" }
            );
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
    let text_chars = ((w - 34.0) / 6.6) as usize;
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
    let tip = match &problem {
        Some(m) => format!("{id} · {subtitle}\n{m}"),
        None => format!("{id} · {subtitle}"),
    };
    view! {
        <g class=class data-id=id.clone() data-problem=problem.unwrap_or_default()
            transform=format!("translate({},{})", pos[0], pos[1])>
            <title>{tip}</title>
            <rect class="body" width=w height=NODE_HEIGHT rx="6" style=format!("fill:{fill}")
                on:pointerdown=move |ev| on_node_down(state, &id_down, ev) />
            {band.map(|c| view! { <rect class="stage-band" width=w height="5" rx="2" fill=c /> })}
            <text class="title" x="10" y="34">{fit_title(&title, ((w - 34.0) / 7.6) as usize)}</text>
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
    key: (String, usize),
    from: String,
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
    state.analysis.with(|a| {
        state.doc.with(|d| {
            let mut out = Vec::new();
            for n in &d.nodes {
                for (k, r) in n.inputs.iter().enumerate() {
                    if r.is_empty() {
                        continue;
                    }
                    let (src, port) = parse_ref(r);
                    let (Some(sp), Some(dp)) = (placed.get(src), placed.get(&n.id)) else {
                        continue;
                    };
                    let from = output_port(sp.pos, sp.ports(), port);
                    let to = input_port(dp.pos, dp.ports(), k);
                    let path = router.route(from, index[src], to, index[n.id.as_str()]);
                    let label = a
                        .types
                        .get(src)
                        .and_then(|t| t.get(port))
                        .map_or_else(|| "?".to_string(), |t| t.to_string());
                    let label_at = labels.place(&label, to, k);
                    out.push(DrawnEdge {
                        key: (n.id.clone(), k),
                        from: src.to_string(),
                        name: format!("{r}>{}:{k}", n.id),
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

/// The edges' type labels, drawn above the nodes.
fn edge_labels(drawn: Memo<Vec<DrawnEdge>>) -> impl IntoView {
    drawn.with(|edges| {
        edges
            .iter()
            .map(|e| {
                view! {
                    <text class="edge-label" data-edge=e.name.clone() x=e.label_at[0] y=e.label_at[1]>{e.label.clone()}</text>
                }
            })
            .collect_view()
    })
}

/// The edges (their labels are drawn by [`edge_labels`]).
fn edges(state: EditorState, drawn: Memo<Vec<DrawnEdge>>) -> impl IntoView {
    let selected = state.selected_edge.get();
    drawn.with(|edges| {
        edges
            .iter()
            .map(|e| {
                let is_selected = selected.as_ref() == Some(&e.key);
                let key = e.key.clone();
                view! {
                    <g class="edge" class:selected=is_selected data-edge=e.name.clone()
                        data-from=e.from.clone() data-to=e.key.0.clone()
                        on:pointerdown=move |ev: web_sys::PointerEvent| {
                            ev.stop_propagation();
                            state.selection.set(BTreeSet::new());
                            state.selected_edge.set(Some(key.clone()));
                        }>
                        <path class="edge-hit" d=e.path.clone() />
                        <path class="edge-line" d=e.path.clone() />
                    </g>
                }
            })
            .collect_view()
    })
}

/// The canvas.
#[component]
pub fn Canvas(state: EditorState) -> impl IntoView {
    let _ = window_event_listener(leptos::ev::pointermove, move |ev| on_move(state, ev));
    let _ = window_event_listener(leptos::ev::pointerup, move |ev| on_up(state, ev));
    let drawn = Memo::new(move |_| drawn_edges(state));
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
        state.analysis.with(|a| {
            let n = a.problems.len();
            let notes = crate::check::coupling_notes(a);
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
                (0, k) => format!("graph valid · {k} batch note{}", if k == 1 { "" } else { "s" }),
                (n, _) => format!("{n} problem{}", if n == 1 { "" } else { "s" }),
            };
            let items = a
                .problems
                .iter()
                .take(50)
                .map(|p| {
                    let node = p.node.clone();
                    let text = p.to_string();
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
        })
    };
    view! {
        <div class="canvas-wrap"
            on:dragover=|ev: web_sys::DragEvent| ev.prevent_default()
            on:drop=move |ev| on_file_drop(state, ev)>
            <svg id="canvas" class="canvas"
                on:pointerdown=move |ev| on_background_down(state, ev)
                on:wheel=move |ev| on_wheel(state, ev)>
                <g transform=transform>
                    <g class="edges">{move || edges(state, drawn)}</g>
                    <g class="nodes">
                        {move || {
                            let selection = state.selection.get();
                            looks(state)
                                .into_iter()
                                .map(|l| {
                                    let sel = selection.contains(&l.id);
                                    node_view(state, l, sel)
                                })
                                .collect_view()
                        }}
                    </g>
                    <g class="edge-labels">{move || edge_labels(drawn)}</g>
                    {overlay}
                </g>
            </svg>
            {move || state.doc.with(|d| d.layout.is_empty()).then(|| view! {
                <div class="empty-hint">"Drag operators here from the palette — start with an input — or drop a graph file or an ONNX model."</div>
            })}
            {problems}
            <super::find::Find state=state />
            <div class="zoom">
                <button title="Zoom in (+)" on:click=move |_| state.view.update(|v| v.k = (v.k * 1.2).min(MAX_ZOOM))>"+"</button>
                <button title="Zoom out (−)" on:click=move |_| state.view.update(|v| v.k = (v.k / 1.2).max(MIN_ZOOM))>"−"</button>
                <span class="zoom-level">{move || format!("{:.0}%", state.view.get().k * 100.0)}</span>
            </div>
            {ghost}
        </div>
    }
}
