//! Saving to the workspace: Save (asking before it replaces another graph), Save as,
//! Rename, Delete, and the Versions panel that restores what a save or a delete replaced
//! (the server keeps the last versions of every graph). An imported model's weights are
//! stored with it.

use super::actions::{open_graph_unchecked, refresh_graphs};
use crate::model;
use crate::state::EditorState;
use crate::web::api;
use leptos::prelude::*;
use sluice_api::VersionList;
use sluice_engine::graph::GraphDoc;

fn confirm(text: &str) -> bool {
    web_sys::window()
        .and_then(|w| w.confirm_with_message(text).ok())
        .unwrap_or(false)
}

fn prompt(text: &str, default: &str) -> Option<String> {
    web_sys::window()
        .and_then(|w| w.prompt_with_message_and_default(text, default).ok())
        .flatten()
        .map(|s| s.trim().to_string())
}

/// The name the document was opened or last saved under, if any.
fn stored_name(state: EditorState) -> Option<String> {
    state
        .saved
        .with_untracked(|s| s.as_ref().map(|d| d.name.clone()))
}

/// Whether saving under `name` may go ahead: it is the document's own name, no graph of
/// that name is in the workspace, or the user agreed to replace it.
fn may_replace(state: EditorState, name: &str) -> bool {
    let exists = state.graphs.with_untracked(|g| g.iter().any(|n| n == name));
    !exists
        || stored_name(state).as_deref() == Some(name)
        || confirm(&format!(
            "A graph named '{name}' is already in the workspace. Replace it?\n\n\
             Its current version is kept: Versions… restores it."
        ))
}

/// Saves the document under the name in the toolbar (Ctrl+S).
pub fn save(state: EditorState) {
    let name = state.doc.with_untracked(|d| d.name.clone());
    if !model::valid_id(&name) {
        return state.error(format!(
            "'{name}' cannot be saved: name the graph with 1-64 of A-Z a-z 0-9 _ - (the name field in the toolbar)"
        ));
    }
    if may_replace(state, &name) {
        store(state, None);
    }
}

/// Asks for a name (`question`, offering `offered`): one that is a graph name and may be
/// saved under ([`may_replace`]), or None (cancelled, or refused with the reason shown).
fn ask_name(state: EditorState, question: &str, offered: &str) -> Option<String> {
    let name = prompt(question, offered)?;
    if !model::valid_id(&name) {
        state.error(format!(
            "'{name}' is not a graph name: 1-64 of A-Z a-z 0-9 _ -"
        ));
        return None;
    }
    may_replace(state, &name).then_some(name)
}

/// Names the document `name` (an edit, so it can be undone) and stores it, then deletes
/// `then_delete`.
fn store_as(state: EditorState, name: String, then_delete: Option<String>) {
    state.edit(|d| {
        d.name = name;
        Ok(())
    });
    store(state, then_delete);
}

/// Saves the document under a name asked for.
pub fn save_as(state: EditorState) {
    let current = state.doc.with_untracked(|d| d.name.clone());
    if let Some(name) = ask_name(state, "Save the graph as:", &current) {
        store_as(state, name, None);
    }
}

/// Saves the document under a new name and deletes the graph it was stored as.
pub fn rename(state: EditorState) {
    let Some(old) = stored_name(state) else {
        return state.error("this graph is not in the workspace yet: Save it first");
    };
    match ask_name(state, &format!("Rename '{old}' to:"), &old) {
        Some(name) if name != old => store_as(state, name, Some(old)),
        _ => {}
    }
}

/// Deletes the document's graph from the workspace (kept among its versions); the
/// document stays open, unsaved.
pub fn delete(state: EditorState) {
    let Some(name) = stored_name(state) else {
        return state.error("this graph is not in the workspace");
    };
    if !confirm(&format!(
        "Delete '{name}' from the workspace?\n\nIt is kept among its versions: Versions… restores it."
    )) {
        return;
    }
    leptos::task::spawn_local(async move {
        match api::request("DELETE", &format!("/api/graphs/{name}"), None).await {
            Ok(r) if r.ok() => {
                state.saved.set(None);
                state.info(format!("deleted '{name}' (Versions… restores it)"));
                refresh_graphs(state);
            }
            Ok(r) => state.error(format!("deleting '{name}' failed: {}", r.error())),
            Err(e) => state.error(format!("deleting '{name}' failed: {e}")),
        }
    });
}

/// Stores the document (its weights first, when an imported model's came with it), then
/// deletes the graph `then_delete` (a rename's old name).
fn store(state: EditorState, then_delete: Option<String>) {
    let mut doc = model::for_engine(&state.doc.get_untracked());
    let name = doc.name.clone();
    // Weights that came with the document (an imported model's) are stored first, as
    // NAME.safetensors, and the graph names them: the server runs it with them.
    let weights = match weights_file_bytes(state, &doc) {
        Ok(w) => w,
        Err(e) => return state.error(format!("saving '{name}' failed: {e}")),
    };
    let file = format!("{name}.safetensors");
    if weights.is_some() {
        doc.params.file = Some(file.clone());
    }
    let text = serde_json::to_string_pretty(&doc).unwrap_or_default();
    leptos::task::spawn_local(async move {
        if let Some(bytes) = &weights {
            let body = api::Payload::Bytes(bytes, "application/octet-stream");
            match api::send("PUT", &format!("/api/weights/{file}"), Some(body)).await {
                Ok(r) if r.ok() => {}
                Ok(r) => {
                    return state.error(format!(
                        "saving the weights of '{name}' failed: {}",
                        r.error()
                    ))
                }
                Err(e) => {
                    return state.error(format!("saving the weights of '{name}' failed: {e}"))
                }
            }
        }
        // The server stores only a graph that checks (422 naming its problems otherwise).
        match api::request("PUT", &format!("/api/graphs/{name}"), Some(&text)).await {
            Ok(r) if r.ok() => {}
            Ok(r) => return state.error(format!("saving '{name}' failed: {}", r.error())),
            Err(e) => return state.error(format!("saving '{name}' failed: {e}")),
        }
        if weights.is_some() {
            // Not an edit: the stored graph names its weights file.
            let named = doc.params.file.clone();
            state.doc.update(|d| d.params.file = named);
        }
        state.saved.set(Some(doc));
        let with = if weights.is_some() {
            format!(" with its weights ({file})")
        } else {
            String::new()
        };
        let mut renamed = String::new();
        if let Some(old) = then_delete {
            match api::request("DELETE", &format!("/api/graphs/{old}"), None).await {
                Ok(r) if r.ok() => renamed = format!(" (renamed from '{old}')"),
                Ok(r) => state.error(format!("'{old}' was not deleted: {}", r.error())),
                Err(e) => state.error(format!("'{old}' was not deleted: {e}")),
            }
        }
        if state
            .notice
            .with_untracked(|n| n.as_ref().is_none_or(|n| !n.error))
        {
            state.info(format!("saved '{name}'{with}{renamed}"));
        }
        refresh_graphs(state);
    });
}

/// The safetensors bytes of the weights that came with the document, as the graph uses
/// them (its own where they still fit, seeded where an edit reshaped one); all of them
/// as they came when the graph does not check yet. None when none came with it.
fn weights_file_bytes(state: EditorState, doc: &GraphDoc) -> Result<Option<Vec<u8>>, String> {
    if state.weights.with_value(Option::is_none) {
        return Ok(None);
    }
    let weights = match sluice_engine::Graph::build_with(doc.clone(), &Default::default()) {
        Ok(graph) => state.weights_for(&graph),
        Err(_) => state.weights.with_value(|w| w.clone().unwrap_or_default()),
    };
    sluice_engine::train::checkpoint::encode_weights(&weights)
        .map(Some)
        .map_err(|e| format!("cannot write its weights: {e}"))
}

/// Opens the Versions panel for the graph named in the toolbar.
pub fn show_versions(state: EditorState) {
    let name = state.doc.with_untracked(|d| d.name.clone());
    if !model::valid_id(&name) {
        return state.error(format!("'{name}' is not a graph name"));
    }
    leptos::task::spawn_local(async move {
        match api::get::<VersionList>(&format!("/api/graphs/{name}/versions")).await {
            Ok(list) => state.versions.set(Some((name, list.versions))),
            Err(e) => state.error(e),
        }
    });
}

/// Makes `version` of `name` the stored graph again and opens it.
fn restore(state: EditorState, name: String, version: String) {
    leptos::task::spawn_local(async move {
        let path = format!("/api/graphs/{name}/versions/{version}/restore");
        match api::request("POST", &path, None).await {
            Ok(r) if r.ok() => {
                state.versions.set(None);
                open_graph_unchecked(state, name);
            }
            Ok(r) => state.error(format!("restoring '{name}' failed: {}", r.error())),
            Err(e) => state.error(format!("restoring '{name}' failed: {e}")),
        }
    });
}

/// A version id (milliseconds since the epoch) as a UTC date and time.
fn when(version: &str) -> String {
    let Ok(ms) = version.parse::<f64>() else {
        return version.to_string();
    };
    let date = js_sys::Date::new(&wasm_bindgen::JsValue::from_f64(ms));
    let iso = String::from(date.to_iso_string());
    iso.get(..19).map_or(iso.clone(), |s| s.replace('T', " ")) + " UTC"
}

/// The Versions panel: the kept versions of one graph, newest first, each restorable.
#[component]
pub fn Versions(state: EditorState) -> impl IntoView {
    move || {
        state.versions.get().map(|(name, versions)| {
            let close = move |_| state.versions.set(None);
            let empty = versions.is_empty();
            let rows = versions
                .into_iter()
                .map(|v| {
                    let (n, id) = (name.clone(), v.version.clone());
                    view! {
                        <tr>
                            <td>{when(&v.version)}</td>
                            <td>{format!("{:.1} kB", v.bytes as f64 / 1000.0)}</td>
                            <td><button class="restore" data-version=v.version.clone()
                                on:click=move |_| {
                                    if super::actions::confirm_discard(state) {
                                        restore(state, n.clone(), id.clone());
                                    }
                                }>"Restore"</button></td>
                        </tr>
                    }
                })
                .collect_view();
            view! {
                <div class="overlay" id="versions" role="dialog" aria-label="Versions" on:click=close>
                    <div class="help" on:click=|ev| ev.stop_propagation()>
                        <h2>{format!("Versions of '{name}'")}</h2>
                        <p class="doc">"Each save or delete that replaced this graph kept what it replaced (the last 10). Restoring one keeps the current graph as a version in turn."</p>
                        {if empty {
                            view! { <p class="hint">"No earlier versions: nothing has replaced it yet."</p> }.into_any()
                        } else {
                            view! { <table class="versions">{rows}</table> }.into_any()
                        }}
                        <button on:click=close>"Close"</button>
                    </div>
                </div>
            }
        })
    }
}
