//! Find (Ctrl+F): a field over the canvas that finds nodes and graph inputs by id or
//! operator (case-insensitive substring); Enter jumps to the next match (Shift+Enter to
//! the previous), selecting it and scrolling it to the middle of the view at a zoom where
//! its text is legible.

use crate::layout::{LEGIBLE_ZOOM, NODE_HEIGHT};
use crate::state::{EditorState, Viewport};
use leptos::prelude::*;
use std::collections::BTreeSet;

/// The ids matching `query`, in the document's order (inputs, then nodes).
fn matches(state: EditorState, query: &str) -> Vec<String> {
    let q = query.trim().to_lowercase();
    if q.is_empty() {
        return Vec::new();
    }
    state.doc.with_untracked(|d| {
        d.inputs
            .keys()
            .filter(|id| id.to_lowercase().contains(&q))
            .cloned()
            .chain(
                d.nodes
                    .iter()
                    .filter(|n| {
                        n.id.to_lowercase().contains(&q) || n.op.to_lowercase().contains(&q)
                    })
                    .map(|n| n.id.clone()),
            )
            .collect()
    })
}

/// Selects `id` and scrolls it to the middle of the canvas (opening its block first
/// when that is collapsed).
pub fn jump_to(state: EditorState, id: &str) {
    if let Some(block) = crate::groups::block_of(id) {
        if state.collapsed.with_untracked(|c| c.contains(block)) {
            let block = block.to_string();
            state.collapsed.update(|c| {
                c.remove(&block);
            });
        }
    }
    let Some(pos) = state.doc.with_untracked(|d| d.layout.get(id).copied()) else {
        return;
    };
    let r = super::canvas_rect().unwrap_or([0.0, 0.0, 800.0, 600.0]);
    let k = state.view.with_untracked(|v| v.k).max(LEGIBLE_ZOOM);
    let (cx, cy) = (
        pos[0] + state.drawn_width(id) / 2.0,
        pos[1] + NODE_HEIGHT / 2.0,
    );
    state.view.set(Viewport {
        k,
        tx: r[2] / 2.0 - cx * k,
        ty: r[3] / 2.0 - cy * k,
    });
    state.selection.set(BTreeSet::from([id.to_string()]));
    state.selected_edge.set(None);
}

/// Whether node `id` lies wholly inside the visible canvas.
pub fn in_view(state: EditorState, id: &str) -> bool {
    let Some(pos) = state.doc.with_untracked(|d| d.layout.get(id).copied()) else {
        return false;
    };
    let r = super::canvas_rect().unwrap_or([0.0, 0.0, 800.0, 600.0]);
    let v = state.view.get_untracked();
    let width = state.drawn_width(id);
    let (x, y) = (pos[0] * v.k + v.tx, pos[1] * v.k + v.ty);
    x >= 0.0 && y >= 0.0 && x + width * v.k <= r[2] && y + NODE_HEIGHT * v.k <= r[3]
}

/// The find field.
#[component]
pub fn Find(state: EditorState) -> impl IntoView {
    let query = RwSignal::new(String::new());
    // Which match Enter went to last (wraps around).
    let at = RwSignal::new(None::<usize>);
    let count = move || {
        let q = query.get();
        state.doc.track();
        let n = matches(state, &q).len();
        match (q.trim().is_empty(), n, at.get()) {
            (true, _, _) => String::new(),
            (false, 0, _) => "no match".to_string(),
            (false, n, Some(i)) if i < n => format!("{} of {n}", i + 1),
            (false, n, _) => format!("{n} match{}", if n == 1 { "" } else { "es" }),
        }
    };
    let on_key = move |ev: web_sys::KeyboardEvent| match ev.key().as_str() {
        "Enter" => {
            ev.prevent_default();
            let found = matches(state, &query.get_untracked());
            if found.is_empty() {
                return;
            }
            let n = found.len();
            let next = match (at.get_untracked(), ev.shift_key()) {
                (None, false) => 0,
                (None, true) => n - 1,
                (Some(i), false) => (i + 1) % n,
                (Some(i), true) => (i + n - 1) % n,
            };
            at.set(Some(next));
            jump_to(state, &found[next]);
        }
        "Escape" => {
            if let Some(el) = ev
                .target()
                .and_then(|t| wasm_bindgen::JsCast::dyn_into::<web_sys::HtmlElement>(t).ok())
            {
                let _ = el.blur();
            }
        }
        _ => {}
    };
    view! {
        <div class="find" role="search">
            <input id="find" type="search" placeholder="Find node (Ctrl+F)" aria-label="Find a node by id or operator"
                spellcheck="false"
                prop:value=move || query.get()
                on:input=move |ev| { query.set(event_target_value(&ev)); at.set(None); }
                on:keydown=on_key />
            <span class="find-count" aria-live="polite">{count}</span>
        </div>
    }
}
