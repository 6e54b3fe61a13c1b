//! The canvas's search menu. Quick-add (double-click the empty canvas, drop a wire on
//! it, or press A) lists the operators (only those that can take the wire, when there is
//! one) and adds the one picked, connected to the wire or the selected node. Connect
//! (press C on a selected node) lists the inputs that can take its first output and
//! connects the one picked. Type to filter, ↑/↓ to move, Enter to pick, Escape to close.

use super::actions::{focus_node, place};
use crate::check;
use crate::model;
use crate::schema::INPUT;
use crate::state::{EditorState, Menu};
use leptos::prelude::*;
use std::collections::BTreeSet;

/// What an entry of the menu does when picked.
#[derive(Debug, Clone, PartialEq)]
enum Choice {
    /// Adds this operator (or a graph input).
    Add(String),
    /// Connects to this node's input port.
    Connect(String, usize),
}

/// One entry: what it does, its name and a line about it.
#[derive(Debug, Clone, PartialEq)]
struct Entry {
    choice: Choice,
    label: String,
    detail: String,
}

/// The entries of `menu` matching `query` (case-insensitive): an exact name first, then
/// names starting with it, then the rest, each in the palette's (or document's) order.
fn entries(state: EditorState, menu: &Menu, query: &str) -> Vec<Entry> {
    let q = query.trim().to_lowercase();
    let all = match menu {
        Menu::Add { from, .. } => add_entries(state, from.as_deref()),
        Menu::Connect { from, .. } => connect_entries(state, from),
    };
    let mut found: Vec<Entry> = all
        .into_iter()
        .filter(|e| q.is_empty() || e.label.to_lowercase().contains(&q))
        .collect();
    // The exact name first, then names that start with the query, then the rest.
    found.sort_by_key(|e| {
        let label = e.label.to_lowercase();
        (label != q, !label.starts_with(&q))
    });
    found
}

/// Operators that could take a wire from `from` at their first input (all, and the
/// graph input, when there is no wire).
fn add_entries(state: EditorState, from: Option<&str>) -> Vec<Entry> {
    let ops = state.ops.get_untracked();
    let mut out = Vec::new();
    if from.is_none() {
        out.push(Entry {
            choice: Choice::Add(INPUT.into()),
            label: INPUT.into(),
            detail: "a graph input".into(),
        });
    }
    state.analysis.with_untracked(|a| {
        for op in &ops {
            let fits = from.is_none_or(|f| check::op_takes(a, f, &op.name, op.initial_inputs()));
            if fits {
                out.push(Entry {
                    choice: Choice::Add(op.name.clone()),
                    label: op.name.clone(),
                    detail: op.doc.clone(),
                });
            }
        }
    });
    out
}

/// The inputs (node, port) that can take output `from`, named as their ports are.
fn connect_entries(state: EditorState, from: &str) -> Vec<Entry> {
    let ports = state.ports.get_untracked();
    state.analysis.with_untracked(|a| {
        state.doc.with_untracked(|d| {
            // The inputs' names as the canvas draws them.
            let names = |id: &str| ports.get(id).map(|p| p.0.as_slice()).unwrap_or_default();
            let counts = d.nodes.iter().map(|n| (n.id.clone(), names(&n.id).len()));
            check::compatible_inputs(d, a, from, counts)
                .into_iter()
                .map(|(id, port)| {
                    let name = names(&id).get(port).cloned().unwrap_or_default();
                    let op = model::node(d, &id)
                        .map(|n| n.op.clone())
                        .unwrap_or_default();
                    let now = model::node(d, &id)
                        .and_then(|n| n.inputs.get(port))
                        .filter(|r| !r.is_empty())
                        .map_or_else(String::new, |r| format!(", now reads '{r}'"));
                    Entry {
                        label: format!("{id} · {name}"),
                        detail: format!("input {port} of {op}{now}"),
                        choice: Choice::Connect(id, port),
                    }
                })
                .collect()
        })
    })
}

/// Carries out the picked entry and closes the menu.
fn pick(state: EditorState, menu: &Menu, choice: &Choice) {
    state.menu.set(None);
    match (menu, choice) {
        (Menu::Add { at, from, then, .. }, Choice::Add(op)) => {
            place(state, op, *at);
            let Some(new) = state.selection.get_untracked().into_iter().next() else {
                return;
            };
            let doc = state.doc.get_untracked();
            let mut next = Ok(doc.clone());
            if let Some(from) = from {
                next = next.and_then(|d| check::connect(&d, from, &new, 0));
            }
            if let Some((node, port)) = then {
                next = next.and_then(|d| check::connect(&d, &new, node, *port));
            }
            match next {
                Ok(next) => state.replace(doc, next),
                Err(e) => state.error(format!("added '{new}', but {e}")),
            }
            focus_node(&new);
        }
        (Menu::Connect { from, .. }, Choice::Connect(node, port)) => {
            let doc = state.doc.get_untracked();
            match check::connect(&doc, from, node, *port) {
                Ok(next) => {
                    state.replace(doc, next);
                    state.info(format!("connected '{from}' to input {port} of '{node}'"));
                }
                Err(e) => state.error(format!("connection refused: {e}")),
            }
            let (source, _) = model::parse_ref(from);
            focus_node(source);
        }
        _ => {}
    }
}

/// Opens quick-add for the keyboard: below the selected node and connected from its first
/// output when one node is selected, else in the middle of the view.
pub fn open_add(state: EditorState) {
    let selected = state.selection.get_untracked();
    let r = super::canvas_rect().unwrap_or([0.0, 0.0, 800.0, 600.0]);
    let v = state.view.get_untracked();
    let one = (selected.len() == 1)
        .then(|| selected.iter().next().cloned())
        .flatten();
    let placed = one.as_ref().and_then(|id| {
        state
            .doc
            .with_untracked(|d| d.layout.get(id).copied())
            .map(|p| (id.clone(), p))
    });
    let menu = match placed {
        Some((id, p)) => {
            let at = [p[0], p[1] + crate::layout::NODE_HEIGHT + 60.0];
            Menu::Add {
                at,
                screen: [r[0] + at[0] * v.k + v.tx, r[1] + at[1] * v.k + v.ty],
                from: Some(model::output_ref(&id, 0)),
                then: None,
            }
        }
        None => Menu::Add {
            at: [
                (r[2] / 2.0 - v.tx) / v.k - crate::layout::MIN_NODE_WIDTH / 2.0,
                (r[3] / 2.0 - v.ty) / v.k - 30.0,
            ],
            screen: [r[0] + r[2] / 2.0 - 120.0, r[1] + r[3] / 2.0 - 40.0],
            from: None,
            then: None,
        },
    };
    state.menu.set(Some(menu));
}

/// Opens connect for the keyboard, from the selected node's first output.
pub fn open_connect(state: EditorState) {
    let selected: BTreeSet<String> = state.selection.get_untracked();
    if selected.len() != 1 {
        return state.info("select one node to connect from (Tab to it, or click it)");
    }
    let id = selected.into_iter().next().unwrap_or_default();
    let r = super::canvas_rect().unwrap_or([0.0, 0.0, 800.0, 600.0]);
    let v = state.view.get_untracked();
    let p = state
        .doc
        .with_untracked(|d| d.layout.get(&id).copied())
        .unwrap_or([0.0, 0.0]);
    let y = p[1] + crate::layout::NODE_HEIGHT + 10.0;
    state.menu.set(Some(Menu::Connect {
        from: model::output_ref(&id, 0),
        screen: [r[0] + p[0] * v.k + v.tx, r[1] + y * v.k + v.ty],
    }));
}

/// The menu, while one is open.
#[component]
pub fn SearchMenu(state: EditorState) -> impl IntoView {
    move || {
        let menu = state.menu.get()?;
        let query = RwSignal::new(String::new());
        let highlighted = RwSignal::new(0usize);
        let field = NodeRef::<leptos::html::Input>::new();
        Effect::new(move |_| {
            if let Some(el) = field.get() {
                let _ = el.focus();
            }
        });
        let (title, placeholder, screen) = match &menu {
            Menu::Add {
                from: Some(f),
                screen,
                ..
            } => (
                format!("Add a node reading '{f}'"),
                "Operator that takes this wire…",
                *screen,
            ),
            Menu::Add { screen, .. } => ("Add a node".to_string(), "Operator or input…", *screen),
            Menu::Connect { from, screen } => (
                format!("Connect '{from}' to…"),
                "Node or input name…",
                *screen,
            ),
        };
        let menu_for_list = menu.clone();
        let listed = Memo::new(move |_| entries(state, &menu_for_list, &query.get()));
        let menu_for_keys = menu.clone();
        let on_key = move |ev: web_sys::KeyboardEvent| {
            let count = listed.with_untracked(Vec::len);
            match ev.key().as_str() {
                "ArrowDown" if count > 0 => highlighted.update(|h| *h = (*h + 1) % count),
                "ArrowUp" if count > 0 => highlighted.update(|h| *h = (*h + count - 1) % count),
                "Enter" => {
                    let chosen =
                        listed.with_untracked(|l| l.get(highlighted.get_untracked()).cloned());
                    match chosen {
                        Some(e) => pick(state, &menu_for_keys, &e.choice),
                        None => state.info("nothing matches"),
                    }
                }
                "Escape" => state.menu.set(None),
                _ => return,
            }
            ev.prevent_default();
            ev.stop_propagation();
        };
        let menu_for_clicks = menu.clone();
        let items = move || {
            let menu = menu_for_clicks.clone();
            listed.with(|l| {
                l.iter()
                    .enumerate()
                    .map(|(k, e)| {
                        let choice = e.choice.clone();
                        let menu = menu.clone();
                        view! {
                            <li role="option" class="menu-item"
                                aria-selected=move || (highlighted.get() == k).to_string()
                                class:highlighted=move || highlighted.get() == k
                                on:pointerdown=move |ev| { ev.prevent_default(); pick(state, &menu, &choice); }>
                                <span class="menu-label">{e.label.clone()}</span>
                                <span class="menu-detail">{e.detail.clone()}</span>
                            </li>
                        }
                    })
                    .collect_view()
            })
        };
        let count = move || {
            let n = listed.with(Vec::len);
            format!("{n} match{}", if n == 1 { "" } else { "es" })
        };
        let label = title.clone();
        Some(view! {
            <div class="search-menu" role="dialog" aria-label=label
                style=format!("left:{:.0}px;top:{:.0}px", screen[0], screen[1])
                on:pointerdown=|ev| ev.stop_propagation()>
                <div class="menu-title">{title}</div>
                <input class="menu-search" type="search" node_ref=field placeholder=placeholder
                    aria-label=placeholder role="combobox" aria-expanded="true"
                    prop:value=move || query.get()
                    on:input=move |ev| { query.set(event_target_value(&ev)); highlighted.set(0); }
                    on:keydown=on_key
                    on:blur=move |_| state.menu.set(None) />
                <span class="menu-count" aria-live="polite">{count}</span>
                <ul role="listbox" class="menu-list">{items}</ul>
            </div>
        })
    }
}
