//! What buttons and shortcuts do: open, save, import and export graphs, delete, copy and
//! paste, lay out and fit the view, start runs. Each reports its outcome as a notice.

use crate::layout;
use crate::model;
use crate::route::Rect;
use crate::schema;
use crate::state::{EditorState, Target, Viewport};
use crate::web::{api, browser_run, files, server_run};
use leptos::prelude::*;
use sluice_engine::graph::GraphDoc;
use std::collections::BTreeSet;

/// Loads the operator palette from the server, or the engine's built-in list.
pub fn load_ops(state: EditorState) {
    leptos::task::spawn_local(async move {
        let ops = match api::get_json("/api/ops")
            .await
            .and_then(|v| schema::parse_ops(&v))
        {
            Ok(ops) => ops,
            Err(e) => {
                state.error(format!("{e}; using the built-in operator list"));
                schema::builtin_ops()
            }
        };
        state.ops.set(ops);
    });
}

/// Refreshes the list of graphs in the workspace.
pub fn refresh_graphs(state: EditorState) {
    leptos::task::spawn_local(async move {
        match api::get::<sluice_api::GraphList>("/api/graphs").await {
            Ok(list) => state.graphs.set(list.graphs),
            Err(e) => state.error(e),
        }
    });
}

/// Asks the server for its devices and keeps the calibrated rates of the devices its runs
/// use, so auto-partition places stages as the server would.
pub fn load_server_rates(state: EditorState) {
    leptos::task::spawn_local(async move {
        if let Ok(report) = api::get::<sluice_api::DevicesReport>("/api/devices").await {
            let rates = report.workers.iter().find_map(|w| w.rates);
            state.server_rates.set(rates);
        }
    });
}

/// Reads a graph file's text as a document the editor can hold (a file with problems
/// opens, and its problems show; one whose structure cannot be read is refused). Nodes
/// the file gives no position are placed by the automatic layout.
pub fn read_doc(text: &str, what: &str, ops: &[schema::OpInfo]) -> Result<GraphDoc, String> {
    let (doc, problems) = sluice_engine::graph::doc::decode_partial(text);
    match doc {
        Some(mut d) => {
            let ports = |id: &str| schema::port_counts(ops, &d, id, None);
            let placed = if d.layout.is_empty() {
                layout::auto_layout(&d, &ports)
            } else {
                let mut with_missing = d.clone();
                layout::place_missing(&mut with_missing, &ports);
                with_missing.layout
            };
            d.layout = placed;
            Ok(d)
        }
        None => Err(format!(
            "{what} is not a graph file: {}",
            problems
                .first()
                .map(|p| p.to_string())
                .unwrap_or_else(|| "unreadable".into())
        )),
    }
}

/// Asks before throwing away unsaved changes.
pub fn confirm_discard(state: EditorState) -> bool {
    !state.dirty()
        || web_sys::window()
            .and_then(|w| {
                w.confirm_with_message("The graph has unsaved changes. Discard them?")
                    .ok()
            })
            .unwrap_or(false)
}

/// Opens a graph of the workspace (asking first when there are unsaved changes).
pub fn open_graph(state: EditorState, name: String) {
    if confirm_discard(state) {
        open_graph_unchecked(state, name);
    }
}

/// Opens a graph of the workspace, replacing the document without asking.
pub fn open_graph_unchecked(state: EditorState, name: String) {
    leptos::task::spawn_local(async move {
        let reply = match api::request("GET", &format!("/api/graphs/{name}"), None).await {
            Ok(r) => r,
            Err(e) => return state.error(e),
        };
        if !reply.ok() {
            return state.error(format!("cannot open '{name}': {}", reply.error()));
        }
        let ops = state.ops.get_untracked();
        match read_doc(
            &String::from_utf8_lossy(&reply.body),
            &format!("'{name}'"),
            &ops,
        ) {
            Ok(mut doc) => {
                if doc.name.is_empty() {
                    doc.name = name.clone();
                }
                let saved = model::for_engine(&doc);
                let (weights, note) = match doc.params.file.clone() {
                    Some(file) => match stored_weights(&saved, &file).await {
                        Ok(w) => (Some(w), format!(" with its weights ({file})")),
                        Err(e) => {
                            state.error(format!(
                                "'{name}' opened, but runs in this browser use seeded weights: {e}"
                            ));
                            (None, String::new())
                        }
                    },
                    None => (None, String::new()),
                };
                state.load(doc, Some(saved), weights);
                open_view(state);
                if state
                    .notice
                    .with_untracked(|n| n.as_ref().is_none_or(|n| !n.error))
                {
                    state.info(format!("opened '{name}'{note}"));
                }
            }
            Err(e) => state.error(e),
        }
    });
}

/// The weights file `file` of the workspace, read for the graph `doc` (every weight it
/// declares there, with its shape).
pub async fn stored_weights(
    doc: &GraphDoc,
    file: &str,
) -> Result<sluice_engine::weights::Weights, String> {
    let graph = sluice_engine::Graph::build_with(doc.clone(), &Default::default())
        .map_err(|p| format!("the graph does not check ({p})"))?;
    let reply = api::request("GET", &format!("/api/weights/{file}"), None).await?;
    if !reply.ok() {
        return Err(format!("cannot read {file}: {}", reply.error()));
    }
    sluice_engine::weights::load_safetensors(&graph, &reply.body)
        .map_err(|e| format!("in {file}: {e}"))
}

/// Starts a new, empty graph.
pub fn new_graph(state: EditorState) {
    if !confirm_discard(state) {
        return;
    }
    state.load(model::empty("untitled"), None, None);
    state.view.set(Viewport::default());
}

/// The name a download of graph `name` gets with `extension` (`graph.EXT` when the graph
/// has no name).
pub fn download_name(name: &str, extension: &str) -> String {
    let name = name.trim();
    let name = if name.is_empty() { "graph" } else { name };
    format!("{name}.{extension}")
}

/// Downloads the graph file.
pub fn export(state: EditorState) {
    let doc = model::for_engine(&state.doc.get_untracked());
    let text = serde_json::to_string_pretty(&doc).unwrap_or_default();
    if let Err(e) = files::download(
        &download_name(&doc.name, "json"),
        "application/json",
        text.as_bytes(),
    ) {
        state.error(format!("export failed: {e}"));
    }
}

/// Opens a graph file or an ONNX model picked from disk.
pub fn import(state: EditorState, input: web_sys::HtmlInputElement) {
    if !confirm_discard(state) {
        return;
    }
    leptos::task::spawn_local(async move {
        match files::read_picked(&input).await {
            Ok(Some((file, bytes))) => open_file(state, &file, &bytes),
            Ok(None) => {}
            Err(e) => state.error(e),
        }
        input.set_value("");
    });
}

/// Opens a graph file or an ONNX model dropped on the canvas.
pub fn import_dropped(state: EditorState, file: web_sys::File) {
    if !confirm_discard(state) {
        return;
    }
    leptos::task::spawn_local(async move {
        match files::read_file(&file).await {
            Ok(bytes) => open_file(state, &file.name(), &bytes),
            Err(e) => state.error(e),
        }
    });
}

/// A graph file's structure judged exactly as `sluice validate` judges it: a file whose
/// structure has any problem (a wrong type, an unknown field, a malformed node) is
/// refused with every problem the CLI reports, so nothing the file says is silently
/// dropped on import. A file that only fails the graph's checks (a shape mismatch, an
/// unknown operator) opens, and its problems show in the problem list.
fn structure_as_cli(text: &str) -> Result<(), String> {
    let limits = sluice_engine::graph::Limits::default();
    let (doc, problems) = sluice_engine::graph::doc::decode_partial_with(text, &limits);
    if doc.is_some() && problems.is_empty() {
        return Ok(());
    }
    match sluice_engine::load_graph_with(text, &limits) {
        Err(all) => Err(all.render()),
        Ok(_) => Err(sluice_engine::graph::Problems(problems).render()),
    }
}

/// Whether a file is an ONNX model rather than a graph file: by its extension (`.onnx`
/// or `.json`, as the CLI tells them), else by its bytes not being JSON text (a graph
/// file is a JSON object).
fn is_onnx(file: &str, bytes: &[u8]) -> bool {
    let lower = file.to_ascii_lowercase();
    if lower.ends_with(".onnx") {
        return true;
    }
    if lower.ends_with(".json") {
        return false;
    }
    match std::str::from_utf8(bytes) {
        Ok(text) => !text.trim_start().starts_with('{'),
        Err(_) => true,
    }
}

/// Loads a file's contents as the document: an ONNX model through the engine's importer
/// (its weights kept with the graph, the graph laid out), or a graph file.
fn open_file(state: EditorState, file: &str, bytes: &[u8]) {
    if !is_onnx(file, bytes) {
        let text = String::from_utf8_lossy(bytes);
        if let Err(problems) = structure_as_cli(&text) {
            return state.error(format!("cannot import '{file}': {problems}"));
        }
        let ops = state.ops.get_untracked();
        return match read_doc(&text, &format!("'{file}'"), &ops) {
            Ok(mut doc) => {
                if doc.name.is_empty() {
                    doc.name = file.trim_end_matches(".json").to_string();
                }
                state.load(doc, None, None);
                open_view(state);
                state.info(format!(
                    "imported '{file}' (not saved to the workspace yet)"
                ));
            }
            Err(e) => state.error(e),
        };
    }
    let limits = sluice_engine::graph::Limits::default();
    match sluice_engine::onnx::import(bytes, &sluice_engine::onnx::NoExternalData, &limits) {
        Ok(imported) => {
            let mut doc = imported.doc;
            doc.name = model_name(file);
            doc.layout = laid_out(&doc, &state.ops.get_untracked());
            let nodes = doc.nodes.len();
            state.load(doc, None, Some(imported.weights));
            open_view(state);
            state.info(format!(
                "imported {file}: opset {}, {} ONNX nodes → {nodes} nodes ({} folded at import)",
                imported.opset, imported.onnx_nodes, imported.folded
            ));
        }
        Err(e) => state.error(format!("cannot import {file}: {e}")),
    }
}

/// An imported model's graph name, as `sluice import` names it: its file's stem (with
/// what a name cannot hold replaced by `_`).
fn model_name(file: &str) -> String {
    let stem = file.rsplit_once('.').map_or(file, |(stem, _)| stem);
    let name: String = stem
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect();
    if name.is_empty() {
        "model".into()
    } else {
        name
    }
}

/// Builds the current graph and downloads it as an ONNX model with the weights a
/// browser run would use (the imported ones where they still fit, else seeded).
pub fn export_onnx(state: EditorState) {
    let doc = model::for_engine(&state.doc.get_untracked());
    let file = download_name(&doc.name, "onnx");
    let graph = match sluice_engine::graph::Graph::build(doc) {
        Ok(g) => g,
        Err(p) => {
            return state.error(format!(
                "cannot export '{file}': the graph has problems:\n{}",
                p.render()
            ))
        }
    };
    let weights = state.weights_for(&graph);
    match sluice_engine::onnx::export(&graph, &weights) {
        Ok(bytes) => match files::download(&file, "application/octet-stream", &bytes) {
            Ok(()) => state.info(format!("exported {file} ({} bytes)", bytes.len())),
            Err(e) => state.error(format!("export failed: {e}")),
        },
        Err(e) => state.error(format!("'{file}': {e}")),
    }
}

/// Deletes the selected nodes, or else the selected edge.
pub fn delete_selection(state: EditorState) {
    let selected = state.selection.get_untracked();
    if !selected.is_empty() {
        state.edit(|d| {
            model::remove(d, &selected);
            Ok(())
        });
        state.selection.set(BTreeSet::new());
    } else if let Some((node, port)) = state.selected_edge.get_untracked() {
        state.edit(|d| {
            model::disconnect(d, &node, port);
            Ok(())
        });
        state.selected_edge.set(None);
    }
}

/// Copies the selection into the system clipboard as graph JSON (from a `copy` or `cut`
/// event, whose data it fills), and keeps it for Paste too. `false` when nothing is
/// selected: the browser then copies as it would anyway.
pub fn copy(state: EditorState, data: Option<web_sys::DataTransfer>, cut: bool) -> bool {
    let selected = state.selection.get_untracked();
    if selected.is_empty() {
        return false;
    }
    let clip = state.doc.with_untracked(|d| model::copy(d, &selected));
    let text = serde_json::to_string_pretty(&clip).unwrap_or_default();
    let in_system = data.is_some_and(|d| d.set_data("text/plain", &text).is_ok());
    state.clip.set_value(Some(clip));
    let count = selected.len();
    let nodes = if count == 1 { "node" } else { "nodes" };
    if cut {
        delete_selection(state);
    }
    let verb = if cut { "cut" } else { "copied" };
    let place = if in_system {
        "to the clipboard as graph JSON"
    } else {
        "(this tab only: the browser gave no clipboard)"
    };
    state.info(format!("{verb} {count} {nodes} {place}"));
    true
}

/// Pastes a selection: the clipboard's graph JSON when it holds one (copied in this tab,
/// another tab or written by hand), else the last copy in this tab. The pasted nodes land
/// where they were copied from, moved right past any node they would cover, and are
/// selected and brought into view.
pub fn paste(state: EditorState, clipboard_text: Option<String>) {
    let from_clipboard = clipboard_text
        .filter(|t| !t.trim().is_empty())
        .map(|t| model::clip_from_text(&t));
    let clip = match from_clipboard {
        Some(Ok(clip)) => clip,
        Some(Err(why)) => {
            return state.info(format!(
                "the clipboard holds no Sluice nodes to paste: {why}"
            ))
        }
        None => match state.clip.get_value() {
            Some(clip) => clip,
            None => return state.info("nothing copied yet"),
        },
    };
    paste_clip(state, &clip);
}

/// Pastes `clip` where it was copied from, moved right past any node it would cover,
/// selected and brought into view.
pub fn paste_clip(state: EditorState, clip: &GraphDoc) {
    let ops = state.ops.get_untracked();
    let offset = state.doc.with_untracked(|d| free_offset(d, clip, &ops));
    let mut pasted = BTreeSet::new();
    state.edit(|d| {
        pasted = model::paste(d, clip, offset);
        Ok(())
    });
    state.info(format!(
        "pasted {} node{}",
        pasted.len(),
        if pasted.len() == 1 { "" } else { "s" }
    ));
    if let Some(first) = pasted.iter().next() {
        if !super::find::in_view(state, first) {
            super::find::jump_to(state, first);
        }
    }
    state.selection.set(pasted);
}

/// How far to move a pasted clip so that it covers no node of `doc`: not at all when its
/// place is free, else right by its own width (and a gap) as many times as it takes.
fn free_offset(doc: &GraphDoc, clip: &GraphDoc, ops: &[schema::OpInfo]) -> [f64; 2] {
    let rects = |d: &GraphDoc| -> Vec<Rect> {
        d.layout
            .iter()
            .map(|(id, p)| {
                let w = layout::node_width(schema::port_counts(ops, d, id, None));
                [p[0], p[1], w, layout::NODE_HEIGHT]
            })
            .collect()
    };
    let (taken, moving) = (rects(doc), rects(clip));
    let Some(b) = layout::bounds(clip, &|id| schema::port_counts(ops, clip, id, None)) else {
        return [0.0, 0.0];
    };
    let gap = 40.0;
    let overlaps = |a: &Rect, b: &Rect| {
        a[0] < b[0] + b[2] + gap
            && b[0] < a[0] + a[2] + gap
            && a[1] < b[1] + b[3] + gap
            && b[1] < a[1] + a[3] + gap
    };
    (0..200)
        .map(|i| [f64::from(i) * (b[2] + gap), 0.0])
        .find(|o| {
            moving.iter().all(|m| {
                let shifted = [m[0] + o[0], m[1] + o[1], m[2], m[3]];
                taken.iter().all(|t| !overlaps(&shifted, t))
            })
        })
        .unwrap_or([0.0, 0.0])
}

/// Shows the selected node's properties and puts the cursor in its first attribute's field.
pub fn edit_properties(state: EditorState) -> bool {
    if state.selection.with_untracked(BTreeSet::is_empty) {
        return false;
    }
    state.panel.set(crate::state::Panel::Properties);
    state.side_open.set(true);
    set_timeout(
        || {
            // Its first attribute, else its first field (the id).
            let field = [".side [data-attr]", ".side input, .side select"]
                .iter()
                .find_map(|q| leptos::prelude::document().query_selector(q).ok().flatten())
                .and_then(|e| wasm_bindgen::JsCast::dyn_into::<web_sys::HtmlElement>(e).ok());
            if let Some(field) = field {
                let _ = field.focus();
            }
        },
        std::time::Duration::ZERO,
    );
    true
}

/// Adds a node of `op` (or a graph input) with its top-left corner at `pos`, selected.
pub fn place(state: EditorState, op: &str, pos: [f64; 2]) {
    let pos = [pos[0].round(), pos[1].round()];
    let inputs = state.op_info(op).map_or(1, |o| o.initial_inputs());
    let mut id = String::new();
    state.edit(|d| {
        id = if op == schema::INPUT {
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
    let c = super::to_canvas(view, [r[0] + r[2] / 2.0, r[1] + r[3] / 2.0]);
    // Stagger so repeated clicks do not stack nodes exactly.
    let n = state.doc.with_untracked(|d| d.layout.len()) as f64;
    place(
        state,
        op,
        [
            c[0] - layout::MIN_NODE_WIDTH / 2.0 + 12.0 * (n % 5.0),
            c[1] - 30.0 + 12.0 * (n % 5.0),
        ],
    );
}

/// Moves keyboard focus to node `id`'s drawing (after the canvas has redrawn it).
pub fn focus_node(id: &str) {
    use wasm_bindgen::JsCast;
    let id = id.to_string();
    set_timeout(
        move || {
            let Some(doc) = web_sys::window().and_then(|w| w.document()) else {
                return;
            };
            let Ok(nodes) = doc.query_selector_all("g.node") else {
                return;
            };
            for k in 0..nodes.length() {
                let el = nodes
                    .item(k)
                    .and_then(|n| n.dyn_into::<web_sys::SvgElement>().ok());
                if let Some(el) = el.filter(|e| e.get_attribute("data-id").as_deref() == Some(&id))
                {
                    let _ = el.focus();
                    return;
                }
            }
        },
        std::time::Duration::ZERO,
    );
}

/// Collapses every block of the graph ([`crate::groups`]) into a box, or, when all are
/// collapsed already, opens them all.
pub fn toggle_blocks(state: EditorState) {
    let all: BTreeSet<String> = state.blocks.with_untracked(|b| b.keys().cloned().collect());
    if all.is_empty() {
        return state.info("this graph has no blocks to collapse (nodes named like 'b1_fc' or '/layer1/layer1.0/…')");
    }
    if state.collapsed.with_untracked(|c| *c == all) {
        state.collapsed.set(BTreeSet::new());
    } else {
        let n = all.len();
        state.collapsed.set(all);
        state.info(format!(
            "collapsed {n} block{}: double-click one to open it, B to open all",
            if n == 1 { "" } else { "s" }
        ));
    }
}

/// Lays the graph out in layers, top to bottom, and shows its top legibly.
pub fn auto_layout(state: EditorState) {
    let ops = state.ops.get_untracked();
    state.edit(|d| {
        d.layout = laid_out(d, &ops);
        Ok(())
    });
    open_view(state);
}

/// The automatic layout of `doc` with its nodes' ports as drawn.
fn laid_out(
    doc: &GraphDoc,
    ops: &[schema::OpInfo],
) -> std::collections::BTreeMap<String, [f64; 2]> {
    layout::auto_layout(doc, &|id| schema::port_counts(ops, doc, id, None))
}

/// The rectangle (x, y, width, height) holding every node, if any.
fn graph_bounds(state: EditorState) -> Option<[f64; 4]> {
    state.ops.with_untracked(|ops| {
        state.doc.with_untracked(|d| {
            let inferred = |id: &str| {
                state
                    .analysis
                    .with_untracked(|a| a.types.get(id).map(Vec::len))
            };
            layout::bounds(d, &|id| schema::port_counts(ops, d, id, inferred(id)))
        })
    })
}

/// Zooms and pans so that the whole graph is in view, however small that makes it.
pub fn fit(state: EditorState) {
    let Some(rect) = super::canvas_rect() else {
        return;
    };
    let Some(b) = graph_bounds(state) else {
        return state.view.set(Viewport::default());
    };
    let margin = 40.0;
    let k = ((rect[2] - 2.0 * margin) / b[2])
        .min((rect[3] - 2.0 * margin) / b[3])
        .clamp(layout::MIN_ZOOM, 1.25);
    state.view.set(Viewport {
        k,
        tx: (rect[2] - b[2] * k) / 2.0 - b[0] * k,
        ty: (rect[3] - b[3] * k) / 2.0 - b[1] * k,
    });
}

/// The view a graph opens in: all of it when it fits at a zoom where text is legible,
/// else its top at [`layout::LEGIBLE_ZOOM`] (scroll for the rest), centred across when it
/// is narrower than the canvas, from its left edge when wider.
pub fn open_view(state: EditorState) {
    let Some(rect) = super::canvas_rect() else {
        return;
    };
    let Some(b) = graph_bounds(state) else {
        return state.view.set(Viewport::default());
    };
    let margin = 40.0;
    let fits = ((rect[2] - 2.0 * margin) / b[2]).min((rect[3] - 2.0 * margin) / b[3]);
    if fits >= layout::LEGIBLE_ZOOM {
        return fit(state);
    }
    let k = layout::LEGIBLE_ZOOM;
    let tx = if b[2] * k <= rect[2] - 2.0 * margin {
        (rect[2] - b[2] * k) / 2.0 - b[0] * k
    } else {
        margin - b[0] * k
    };
    state.view.set(Viewport {
        k,
        tx,
        ty: margin - b[1] * k,
    });
}

/// Starts a run where the run panel says.
pub fn run(state: EditorState) {
    if state.run.with_untracked(|r| r.is_active()) {
        return state.info("a run is already going");
    }
    match state.settings.with_untracked(|s| s.target) {
        Target::Server => server_run::start(state),
        Target::Browser => browser_run::start(state),
    }
}

#[cfg(test)]
mod tests {
    use super::{is_onnx, model_name};

    #[test]
    fn onnx_models_are_told_from_graph_files_by_extension_or_bytes() {
        assert!(is_onnx("model.ONNX", b"{}"));
        assert!(is_onnx("model.bin", &[0x08, 0x08, 0x12, 0x00]));
        assert!(is_onnx("model", &[0xff, 0xfe]));
        assert!(!is_onnx(
            "graph.json",
            b"  {\"format\": \"sluice/graph@1\"}"
        ));
        assert!(!is_onnx("graph", b"\n{}"));
        assert!(
            !is_onnx("list.json", b"[1, 2]"),
            "a .json file is a graph file, as for the CLI"
        );
    }

    #[test]
    fn imported_models_are_named_after_their_file() {
        assert_eq!(model_name("model.onnx"), "model");
        assert_eq!(model_name("my model.v2.onnx"), "my_model_v2");
        assert_eq!(model_name(".onnx"), "model");
        assert_eq!(model_name(&format!("{}.onnx", "a".repeat(80))).len(), 64);
    }
}
