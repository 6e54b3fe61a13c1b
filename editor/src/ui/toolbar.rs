//! The toolbar: the graph's name, new, open from the workspace, save (and the Graph menu:
//! save as, rename, delete, versions, the canvas as an SVG or PNG picture), import (a graph file or an ONNX model) and export the file or an ONNX model, undo and redo, layout,
//! fit, heat map, showing or hiding the palette and the side panel, help; an unsaved-changes
//! marker.

use super::{actions, picture, saving};
use crate::state::EditorState;
use leptos::prelude::*;
use wasm_bindgen::JsCast;

/// The toolbar.
#[component]
pub fn Toolbar(state: EditorState) -> impl IntoView {
    let file_input = NodeRef::<leptos::html::Input>::new();
    // Worked out on every change (moves included); the page only when it flips.
    let dirty = Memo::new(move |_| state.dirty());
    let on_name = move |ev: leptos::ev::Event| {
        let name = event_target_value(&ev).trim().to_string();
        state.edit(|d| {
            d.name = name;
            Ok(())
        });
    };
    let on_open = move |ev: leptos::ev::Event| {
        let name = event_target_value(&ev);
        if let Some(select) = ev
            .target()
            .and_then(|t| t.dyn_into::<web_sys::HtmlSelectElement>().ok())
        {
            select.set_value("");
        }
        if !name.is_empty() {
            actions::open_graph(state, name);
        }
    };
    view! {
        <header class="toolbar">
            <h1 class="brand">"Sluice"</h1>
            <label class="name-field">
                "Graph "
                <input id="graph-name" type="text" spellcheck="false"
                    prop:value=move || state.unplaced.with(|d| d.name.clone())
                    on:change=on_name />
            </label>
            <span class="dirty" title="unsaved changes" data-dirty=move || dirty.get().to_string()>
                {move || match (dirty.get(), state.saved.with(Option::is_some)) {
                    (true, _) => "● unsaved",
                    (false, true) => "saved",
                    (false, false) => "new",
                }}
            </span>
            <button on:click=move |_| actions::new_graph(state) title="New graph">"New"</button>
            <select id="open-graph" title="Open a graph of the workspace" aria-label="Open a graph of the workspace"
                on:focus=move |_| actions::refresh_graphs(state) on:change=on_open>
                <option value="">"Open…"</option>
                {move || state.graphs.get().into_iter().map(|g| {
                    view! { <option value=g.clone()>{g.clone()}</option> }
                }).collect_view()}
            </select>
            <button id="save" on:click=move |_| saving::save(state) title="Save to the workspace (Ctrl+S); asks before replacing another graph">"Save"</button>
            <details class="menu" id="graph-menu">
                <summary title="Save as, rename, delete, earlier versions">"Graph ▾"</summary>
                <div class="menu-items" on:click=|ev| {
                    // A pick closes the menu.
                    if let Some(menu) = ev.current_target()
                        .and_then(|t| t.dyn_into::<web_sys::Element>().ok())
                        .and_then(|e| e.parent_element()) {
                        let _ = menu.remove_attribute("open");
                    }
                }>
                    <button id="save-as" on:click=move |_| saving::save_as(state)>"Save as…"</button>
                    <button id="rename" on:click=move |_| saving::rename(state)>"Rename…"</button>
                    <button id="delete-graph" on:click=move |_| saving::delete(state)>"Delete"</button>
                    <button id="versions-button" on:click=move |_| saving::show_versions(state)>"Versions…"</button>
                    <button id="export-svg" on:click=move |_| picture::export_svg(state)
                        title="Download the whole graph as an SVG picture">"Picture (SVG)"</button>
                    <button id="export-png" on:click=move |_| picture::export_png(state)
                        title="Download the whole graph as a PNG picture">"Picture (PNG)"</button>
                </div>
            </details>
            <button on:click=move |_| {
                if let Some(input) = file_input.get() { input.click(); }
            } title="Open a graph file or an ONNX model from disk (or drop one on the canvas)">"Import"</button>
            <input id="import-file" type="file" accept=".json,application/json,.onnx" class="hidden" node_ref=file_input
                on:change=move |_| {
                    if let Some(input) = file_input.get() { actions::import(state, input); }
                } />
            <button id="export" on:click=move |_| actions::export(state) title="Download the graph file">"Export"</button>
            <button id="export-onnx" on:click=move |_| actions::export_onnx(state)
                title="Download the graph with its weights as an ONNX model">"Export ONNX"</button>
            <span class="sep"></span>
            <button id="undo" on:click=move |_| state.undo() title="Undo (Ctrl+Z)"
                disabled=move || { state.doc.track(); !state.history.with_value(|h| h.can_undo()) }>"Undo"</button>
            <button id="redo" on:click=move |_| state.redo() title="Redo (Ctrl+Shift+Z)"
                disabled=move || { state.doc.track(); !state.history.with_value(|h| h.can_redo()) }>"Redo"</button>
            <span class="sep"></span>
            <button id="layout" on:click=move |_| actions::auto_layout(state) title="Lay out top to bottom (L)">"Layout"</button>
            <button on:click=move |_| actions::fit(state) title="Fit the graph in view (F)">"Fit"</button>
            <label class="toggle" title="Paint GPU time per node on the graph (H)">
                <input id="heat" type="checkbox" prop:checked=move || state.heat.get()
                    on:change=move |ev| state.heat.set(event_target_checked(&ev)) />
                " Heat map"
            </label>
            <span class="grow"></span>
            <button id="toggle-palette" title="Show or hide the operator palette"
                aria-pressed=move || state.palette_open.get().to_string()
                aria-label="Palette" on:click=move |_| state.palette_open.update(|o| *o = !*o)>"◧"</button>
            <button id="toggle-side" title="Show or hide the side panel (properties, run, devices)"
                aria-pressed=move || state.side_open.get().to_string()
                aria-label="Side panel" on:click=move |_| state.side_open.update(|o| *o = !*o)>"◨"</button>
            <button id="help-button" on:click=move |_| state.help.update(|h| *h = !*h) title="Keyboard shortcuts (?)">"?"</button>
        </header>
    }
}
