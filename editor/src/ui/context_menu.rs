//! The context menu (right-click): what can be done to a node, an edge or the empty
//! canvas at that point, each entry with its keyboard shortcut where it has one.

use super::{actions, menu};
use crate::layout::MIN_NODE_WIDTH;
use crate::model::{self, output_ref};
use crate::state::{ContextTarget, EditorState, Menu};
use leptos::prelude::*;
use std::collections::BTreeSet;

/// One entry: its label, its shortcut (shown on the right) and what it does.
type Entry = (String, &'static str, Box<dyn Fn()>);

/// Opens the context menu for `target` at the pointer.
pub fn open(state: EditorState, target: ContextTarget, ev: &web_sys::MouseEvent) {
    ev.prevent_default();
    ev.stop_propagation();
    state.menu.set(None);
    let screen = [f64::from(ev.client_x()), f64::from(ev.client_y())];
    state.context.set(Some((target, screen)));
}

fn select_only(state: EditorState, id: &str) {
    state.selection.set(BTreeSet::from([id.to_string()]));
    state.selected_edge.set(None);
}

fn block_entries(state: EditorState, block: String) -> Vec<Entry> {
    let members = state
        .blocks
        .with_untracked(|b| b.get(&block).cloned().unwrap_or_default());
    vec![
        (
            format!("Open block {block}"),
            "double-click",
            Box::new(move || {
                state.collapsed.update(|c| {
                    c.remove(&block);
                })
            }),
        ),
        (
            format!("Select its {} nodes", members.len()),
            "",
            Box::new(move || state.selection.set(members.iter().cloned().collect())),
        ),
    ]
}

fn node_entries(state: EditorState, id: String) -> Vec<Entry> {
    if let Some(block) = crate::groups::block_of_box(&id) {
        return block_entries(state, block.to_string());
    }
    let is_input = state.unplaced.with_untracked(|d| model::is_input(d, &id));
    let reference = output_ref(&id, 0);
    let is_output = state
        .unplaced
        .with_untracked(|d| d.outputs.contains(&reference));
    let (a, c, e, dup, out, del) = (
        id.clone(),
        id.clone(),
        id.clone(),
        id.clone(),
        reference,
        id.clone(),
    );
    let mut entries: Vec<Entry> = vec![
        (
            "Add a node after it…".into(),
            "A",
            Box::new(move || {
                select_only(state, &a);
                menu::open_add(state);
            }),
        ),
        (
            "Connect its output to…".into(),
            "C",
            Box::new(move || {
                select_only(state, &c);
                menu::open_connect(state);
            }),
        ),
    ];
    if !is_input {
        entries.push((
            "Edit properties".into(),
            "E",
            Box::new(move || {
                select_only(state, &e);
                actions::edit_properties(state);
            }),
        ));
    }
    entries.push((
        "Duplicate".into(),
        "",
        Box::new(move || {
            let clip = state
                .doc
                .with_untracked(|d| model::copy(d, &BTreeSet::from([dup.clone()])));
            actions::paste_clip(state, &clip);
        }),
    ));
    entries.push((
        if is_output {
            "Stop being a graph output".into()
        } else {
            "Make a graph output".into()
        },
        "",
        Box::new(move || {
            state.edit(|d| {
                model::set_output(d, &out, !is_output);
                Ok(())
            })
        }),
    ));
    let block = crate::groups::block_of(&id)
        .map(str::to_string)
        .filter(|b| state.blocks.with_untracked(|all| all.contains_key(b)));
    if let Some(block) = block {
        entries.push((
            format!("Collapse block {block}"),
            "",
            Box::new(move || {
                state.collapsed.update(|c| {
                    c.insert(block.clone());
                })
            }),
        ));
    }
    entries.push((
        "Delete".into(),
        "Del",
        Box::new(move || {
            select_only(state, &del);
            actions::delete_selection(state);
        }),
    ));
    entries
}

fn edge_entries(state: EditorState, node: String, port: usize, screen: [f64; 2]) -> Vec<Entry> {
    let source = state.unplaced.with_untracked(|d| {
        model::node(d, &node)
            .and_then(|n| n.inputs.get(port).cloned())
            .filter(|r| !r.is_empty())
    });
    let Some(source) = source else {
        return Vec::new();
    };
    let (insert_node, delete_node) = (node.clone(), node);
    vec![
        (
            "Insert a node here…".into(),
            "",
            Box::new(move || {
                let r = super::canvas_rect().unwrap_or([0.0; 4]);
                let v = state.view.get_untracked();
                let at = [
                    ((screen[0] - r[0] - v.tx) / v.k - MIN_NODE_WIDTH / 2.0).round(),
                    ((screen[1] - r[1] - v.ty) / v.k - 30.0).round(),
                ];
                state.menu.set(Some(Menu::Add {
                    at,
                    screen,
                    from: Some(source.clone()),
                    then: Some((insert_node.clone(), port)),
                }));
            }),
        ),
        (
            "Delete the connection".into(),
            "Del",
            Box::new(move || {
                state.edit(|d| {
                    model::disconnect(d, &delete_node, port);
                    Ok(())
                })
            }),
        ),
    ]
}

fn canvas_entries(state: EditorState, at: [f64; 2], screen: [f64; 2]) -> Vec<Entry> {
    let mut entries: Vec<Entry> = vec![
        (
            "Add a node here…".into(),
            "double-click",
            Box::new(move || {
                state.menu.set(Some(Menu::Add {
                    at: [
                        (at[0] - MIN_NODE_WIDTH / 2.0).round(),
                        (at[1] - 30.0).round(),
                    ],
                    screen,
                    from: None,
                    then: None,
                }))
            }),
        ),
        (
            "Paste".into(),
            "Ctrl+V",
            Box::new(move || actions::paste(state, None)),
        ),
        (
            "Select all".into(),
            "Ctrl+A",
            Box::new(move || state.selection.set(state.doc.with_untracked(model::ids))),
        ),
        (
            "Lay out".into(),
            "L",
            Box::new(move || actions::auto_layout(state)),
        ),
        ("Fit".into(), "F", Box::new(move || actions::fit(state))),
    ];
    let blocks = state.blocks.with_untracked(|b| b.len());
    if blocks > 0 {
        let all_collapsed = state.collapsed.with_untracked(|c| c.len() == blocks);
        entries.push((
            if all_collapsed {
                "Open all blocks".into()
            } else {
                format!("Collapse all {blocks} blocks")
            },
            "B",
            Box::new(move || actions::toggle_blocks(state)),
        ));
    }
    entries
}

/// The context menu, while one is open.
#[component]
pub fn ContextMenu(state: EditorState) -> impl IntoView {
    move || {
        let (target, screen) = state.context.get()?;
        let entries = match target {
            ContextTarget::Node(id) => node_entries(state, id),
            ContextTarget::Edge(node, port) => edge_entries(state, node, port, screen),
            ContextTarget::Canvas(at) => canvas_entries(state, at, screen),
        };
        let items = entries
            .into_iter()
            .map(|(label, key, action)| {
                view! {
                    <li role="menuitem" tabindex="-1" class="context-item"
                        on:click=move |_| {
                            state.context.set(None);
                            action();
                        }>
                        <span>{label}</span>
                        <kbd>{key}</kbd>
                    </li>
                }
            })
            .collect_view();
        Some(view! {
            <ul class="context-menu" role="menu"
                style=format!("left:{:.0}px;top:{:.0}px", screen[0], screen[1])
                on:pointerdown=|ev| ev.stop_propagation()
                on:contextmenu=|ev| ev.prevent_default()>
                {items}
            </ul>
        })
    }
}
