//! The operator palette: the graph input and every operator of `/api/ops`, grouped by
//! family, with a search box. Drag an entry onto the canvas to place it there; click it
//! (or press Enter on it) to place it in the middle of the view.

use super::actions::place_in_view;
use super::canvas::begin_palette_drag;
use crate::schema::{by_family, INPUT};
use crate::state::EditorState;
use leptos::prelude::*;

/// The palette.
#[component]
pub fn Palette(state: EditorState) -> impl IntoView {
    let query = RwSignal::new(String::new());
    let entry = move |op: String, doc: String| {
        let (o1, o2, label) = (op.clone(), op.clone(), op.clone());
        view! {
            <div class="palette-item" tabindex="0" data-op=op title=doc
                on:pointerdown=move |ev| begin_palette_drag(state, o1.clone(), &ev)
                on:keydown=move |ev| {
                    if ev.key() == "Enter" { place_in_view(state, &o2); }
                }>
                {label}
            </div>
        }
    };
    view! {
        <nav class="palette">
            <input id="palette-search" type="search" placeholder="Search operators"
                prop:value=move || query.get()
                on:input=move |ev| query.set(event_target_value(&ev)) />
            <div class="palette-list">
                {move || {
                    let q = query.get();
                    let graph_group = ("graph".contains(&q.to_lowercase()) || INPUT.contains(&q.to_lowercase()))
                        .then(|| view! {
                            <div class="family">
                                <div class="family-name">"graph"</div>
                                {entry(INPUT.to_string(), "A graph input: its name, shape and dtype are set in the property panel.".into())}
                            </div>
                        });
                    let families = state.ops.with(|ops| {
                        by_family(ops)
                            .into_iter()
                            .filter_map(|(family, list)| {
                                let items: Vec<_> = list
                                    .into_iter()
                                    .filter(|o| o.matches(&q))
                                    .map(|o| entry(o.name.clone(), o.doc.clone()))
                                    .collect();
                                (!items.is_empty()).then(|| view! {
                                    <div class="family">
                                        <div class="family-name">{family}</div>
                                        {items}
                                    </div>
                                })
                            })
                            .collect::<Vec<_>>()
                    });
                    view! { {graph_group} {families} }
                }}
            </div>
        </nav>
    }
}
