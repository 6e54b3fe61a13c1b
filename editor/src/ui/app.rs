//! The page: toolbar on top, palette on the left, the canvas, the side panel (properties,
//! run, devices) on the right and the live charts below. Startup restores an unsaved
//! draft (or opens the last graph), the draft is kept after every edit, leaving the page
//! with unsaved changes asks first, and the keyboard shortcuts live here.

use super::actions;
use super::canvas::Canvas;
use super::charts_view::Charts;
use super::devices::Devices;
use super::help::Help;
use super::palette::Palette;
use super::properties::Properties;
use super::run_panel::RunPanel;
use super::toolbar::Toolbar;
use crate::model;
use crate::state::{EditorState, Panel};
use crate::web::{browser_run, storage};
use leptos::prelude::*;
use std::collections::BTreeSet;
use wasm_bindgen::JsCast;

/// Restores the draft of the last visit when it holds unsaved work; otherwise opens the
/// graph it had open, or the first example.
fn restore(state: EditorState) {
    match storage::load_draft() {
        Some(draft) => {
            let name = draft.doc.name.clone();
            let file = draft.doc.params.file.clone();
            // The file's weights are the saved graph's (an edit may have reshaped some).
            let owner = model::for_engine(draft.saved.as_ref().unwrap_or(&draft.doc));
            state.load(draft.doc, draft.saved, None);
            // The weights the draft does not keep: a stored model's are read again, an
            // unsaved imported model's are gone, which the run panel says.
            match file {
                Some(file) if draft.weights_not_kept => {
                    leptos::task::spawn_local(async move {
                        match actions::stored_weights(&owner, &file).await {
                            Ok(w) => state.weights.set_value(Some(w)),
                            Err(_) => state.weights_lost.set(true),
                        }
                    });
                }
                _ => state.weights_lost.set(draft.weights_not_kept),
            }
            if state.dirty() {
                state.info(format!(
                    "restored your unsaved changes to '{name}' from the last visit"
                ));
            }
            // Let the canvas get its size before fitting.
            request_animation_frame(move || actions::open_view(state));
        }
        None => {
            state.load(model::empty("untitled"), None, None);
        }
    }
}

/// A `copy` or `cut` event outside text fields: the selection goes to the clipboard.
fn on_clipboard(state: EditorState, ev: web_sys::ClipboardEvent, cut: bool) {
    if super::typing_in_field(ev.target()) {
        return;
    }
    if actions::copy(state, ev.clipboard_data(), cut) {
        ev.prevent_default();
    }
}

/// Moves the selected nodes by `step` in the arrow's direction (one undoable edit), and
/// keeps keyboard focus on the node that had it. `false` when nothing is selected.
fn move_selection(state: EditorState, arrow: &str, step: f64) -> bool {
    let selected = state.selection.get_untracked();
    if selected.is_empty() {
        return false;
    }
    let (dx, dy) = match arrow {
        "ArrowLeft" => (-step, 0.0),
        "ArrowRight" => (step, 0.0),
        "ArrowUp" => (0.0, -step),
        _ => (0.0, step),
    };
    let focused = document()
        .active_element()
        .and_then(|e| e.get_attribute("data-id"))
        .filter(|id| selected.contains(id));
    state.edit(|d| {
        model::move_by(d, &selected, dx, dy);
        Ok(())
    });
    if let Some(id) = focused {
        super::actions::focus_node(&id);
    }
    true
}

fn on_key(state: EditorState, ev: web_sys::KeyboardEvent) {
    let ctrl = ev.ctrl_key() || ev.meta_key();
    let key = ev.key();
    if key == "Escape" && super::typing_in_field(ev.target()) {
        // Leave the field for the canvas: back to the node being edited, if one is.
        let only = state
            .selection
            .with_untracked(|s| (s.len() == 1).then(|| s.iter().next().cloned()).flatten());
        if let Some(el) = ev
            .target()
            .and_then(|t| wasm_bindgen::JsCast::dyn_into::<web_sys::HtmlElement>(t).ok())
        {
            let _ = el.blur();
        }
        if let Some(id) = only {
            super::actions::focus_node(&id);
        }
        return;
    }
    if key == "Escape" {
        state.menu.set(None);
        state.context.set(None);
        state.help.set(false);
        state.versions.set(None);
        state.selection.set(BTreeSet::new());
        state.selected_edge.set(None);
        return;
    }
    if ctrl && key.eq_ignore_ascii_case("s") {
        ev.prevent_default();
        return super::saving::save(state);
    }
    if ctrl && key.eq_ignore_ascii_case("f") {
        ev.prevent_default();
        if let Some(field) = web_sys::window()
            .and_then(|w| w.document())
            .and_then(|d| d.get_element_by_id("find"))
            .and_then(|e| wasm_bindgen::JsCast::dyn_into::<web_sys::HtmlInputElement>(e).ok())
        {
            let _ = field.focus();
            field.select();
        }
        return;
    }
    if super::typing_in_field(ev.target()) {
        return;
    }
    let handled = match (ctrl, ev.shift_key(), key.as_str()) {
        (true, true, "z" | "Z") | (true, _, "y" | "Y") => {
            state.redo();
            true
        }
        (true, false, "z" | "Z") => {
            state.undo();
            true
        }
        (true, _, "a" | "A") => {
            state.selection.set(state.doc.with_untracked(model::ids));
            true
        }
        (true, _, "Enter") => {
            actions::run(state);
            true
        }
        (false, _, "a" | "A") => {
            super::menu::open_add(state);
            true
        }
        (false, _, "c" | "C") => {
            super::menu::open_connect(state);
            true
        }
        (false, _, "e" | "E") => actions::edit_properties(state),
        (false, _, "b" | "B") => {
            actions::toggle_blocks(state);
            true
        }
        (false, shift, "ArrowLeft" | "ArrowRight" | "ArrowUp" | "ArrowDown") => {
            move_selection(state, key.as_str(), if shift { 100.0 } else { 20.0 })
        }
        (false, _, "Delete" | "Backspace") => {
            actions::delete_selection(state);
            true
        }
        (false, _, "l" | "L") => {
            actions::auto_layout(state);
            true
        }
        (false, _, "f" | "F") => {
            actions::fit(state);
            true
        }
        (false, _, "h" | "H") => {
            state.heat.update(|h| *h = !*h);
            true
        }
        (false, _, "?") => {
            state.help.update(|h| *h = !*h);
            true
        }
        (false, _, "+" | "=") => {
            state
                .view
                .update(|v| v.k = (v.k * 1.2).min(crate::layout::MAX_ZOOM));
            true
        }
        (false, _, "-") => {
            state
                .view
                .update(|v| v.k = (v.k / 1.2).max(crate::layout::MIN_ZOOM));
            true
        }
        _ => false,
    };
    if handled {
        ev.prevent_default();
    }
}

/// The editor.
#[component]
pub fn App() -> impl IntoView {
    let state = EditorState::new(model::empty("untitled"));
    restore(state);
    actions::load_ops(state);
    actions::load_server_rates(state);
    actions::refresh_graphs(state);
    browser_run::probe(state);

    // Keep a draft after every edit.
    // Not on every frame of a drag: once, when the nodes are dropped.
    let moving =
        Memo::new(move |_| matches!(state.drag.get(), Some(crate::state::Drag::Move { .. })));
    Effect::new(move |_| {
        if moving.get() {
            return;
        }
        let doc = state.doc.get();
        let saved = state.saved.get();
        let weights_not_kept =
            state.weights_lost.get() || state.weights.with_value(Option::is_some);
        if !storage::save_draft(&storage::Draft {
            doc,
            saved,
            weights_not_kept,
        }) {
            state.error("the browser refused to keep a draft of your changes (storage full or disabled): save to the workspace");
        }
    });
    // Ask before leaving with unsaved changes.
    let _ = window_event_listener(leptos::ev::beforeunload, move |ev| {
        if state.dirty() {
            ev.prevent_default();
            ev.set_return_value("The graph has unsaved changes.");
        }
    });
    let _ = window_event_listener(leptos::ev::keydown, move |ev| on_key(state, ev));
    // Copy, cut and paste go through the system clipboard (graph JSON), so a selection
    // moves between tabs and to text editors; fields keep the browser's own.
    let _ = window_event_listener(leptos::ev::copy, move |ev| on_clipboard(state, ev, false));
    let _ = window_event_listener(leptos::ev::cut, move |ev| on_clipboard(state, ev, true));
    let _ = window_event_listener(leptos::ev::paste, move |ev| {
        if super::typing_in_field(ev.target()) {
            return;
        }
        ev.prevent_default();
        let text = ev
            .clipboard_data()
            .and_then(|d| d.get_data("text/plain").ok());
        actions::paste(state, text);
    });
    // Tell tests and the load-time figure when the page is ready to use.
    Effect::new(move |_| {
        if !state.ops.with(Vec::is_empty) {
            if let Some(body) = document().body() {
                let ms = window().performance().map_or(0.0, |p| p.now());
                let _ = body.set_attribute("data-ready-ms", &format!("{ms:.0}"));
            }
        }
    });

    let tab = move |p: Panel, label: &'static str| {
        view! {
            <button class="tab" class:active=move || state.panel.get() == p
                data-tab=label on:click=move |_| state.panel.set(p)>{label}</button>
        }
    };
    view! {
        <div class="app">
            <Toolbar state=state />
            <main class="main" class:no-palette=move || !state.palette_open.get()
                class:no-side=move || !state.side_open.get()>
                <Palette state=state />
                <div class="centre">
                    <Canvas state=state />
                    <Charts state=state />
                </div>
                <aside class="side" aria-label="Properties, run and devices">
                    <div class="tabs">
                        {tab(Panel::Properties, "Properties")}
                        {tab(Panel::Run, "Run")}
                        {tab(Panel::Devices, "Devices")}
                    </div>
                    <div class="side-body">
                        {move || match state.panel.get() {
                            Panel::Properties => view! { <Properties state=state /> }.into_any(),
                            Panel::Run => view! { <RunPanel state=state /> }.into_any(),
                            Panel::Devices => view! { <Devices state=state /> }.into_any(),
                        }}
                    </div>
                </aside>
            </main>
            {move || state.notice.get().map(|n| {
                let class = if n.error { "notice error" } else { "notice" };
                view! {
                    <div class=class role="status" data-serial=n.serial.to_string()>
                        <span class="notice-text">{n.text}</span>
                        <button class="notice-close" on:click=move |_| state.notice.set(None)>"×"</button>
                    </div>
                }
            })}
            <Help state=state />
            <super::saving::Versions state=state />
        </div>
    }
}

/// Mounts the editor on the page's body.
pub fn mount() {
    leptos::mount::mount_to_body(App);
    // The page shows "loading" until the app replaces it.
    if let Some(el) = document().get_element_by_id("loading") {
        if let Ok(el) = el.dyn_into::<web_sys::HtmlElement>() {
            el.remove();
        }
    }
}
