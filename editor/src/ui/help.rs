//! The help overlay: every keyboard shortcut and pointer gesture (press ? to open it).

use crate::state::EditorState;
use leptos::prelude::*;

const SHORTCUTS: &[(&str, &str)] = &[
    (
        "drag from the palette",
        "place an operator (or click it / press Enter on it)",
    ),
    (
        "drag an output port to an input port",
        "connect (a misfit is refused with the reason)",
    ),
    (
        "click / shift-click a node",
        "select / add to the selection",
    ),
    (
        "drop a wire on the empty canvas, or double-click it",
        "quick-add: a search over the operators that can take the wire, connected on pick",
    ),
    (
        "while drawing a wire",
        "the inputs that can take it are marked green, the others dimmed",
    ),
    ("shift-drag on the background", "box selection"),
    (
        "right-click a node, an edge or the canvas",
        "what can be done there (insert a node into an edge, duplicate, make an output…)",
    ),
    ("click or drag the minimap", "move the view there"),
    (
        "Tab / Shift+Tab",
        "move between nodes (selecting them); Enter selects, Space adds to the selection",
    ),
    ("arrows (Shift: further)", "move the selected nodes"),
    (
        "A",
        "add a node (below the selected one, connected from it)",
    ),
    (
        "C",
        "connect the selected node's output to an input that can take it",
    ),
    (
        "E",
        "edit the selected node's properties (Esc returns to the node)",
    ),
    (
        "B",
        "collapse every block of repeated structure into a box (again: open them); double-click a box to open it",
    ),
    ("drag the background, or the wheel", "scroll"),
    ("Ctrl+wheel (or pinch), + and −", "zoom"),
    ("Delete or Backspace", "delete the selected nodes or edge"),
    ("Ctrl+Z", "undo"),
    ("Ctrl+Shift+Z or Ctrl+Y", "redo"),
    (
        "Ctrl+C / Ctrl+X / Ctrl+V",
        "copy / cut / paste through the system clipboard, as graph JSON (works between tabs)",
    ),
    ("Ctrl+A", "select everything"),
    (
        "Ctrl+F",
        "find a node by id or operator (Enter: next, Shift+Enter: previous)",
    ),
    (
        "Ctrl+S",
        "save to the workspace (asks before replacing another graph)",
    ),
    ("Ctrl+Enter", "run"),
    ("L", "lay the graph out top to bottom"),
    ("F", "fit the graph in view"),
    ("H", "heat map of GPU time per node"),
    ("?", "this help"),
    ("Esc", "close, clear the selection"),
];

/// The overlay.
#[component]
pub fn Help(state: EditorState) -> impl IntoView {
    move || {
        state.help.get().then(|| {
            view! {
                <div class="overlay" id="help" on:click=move |_| state.help.set(false)>
                    <div class="help" on:click=|ev| ev.stop_propagation()>
                        <h2>"Keyboard and mouse"</h2>
                        <table>
                            {SHORTCUTS.iter().map(|(k, v)| view! { <tr><th>{*k}</th><td>{*v}</td></tr> }).collect_view()}
                        </table>
                        <button on:click=move |_| state.help.set(false)>"Close"</button>
                    </div>
                </div>
            }
        })
    }
}
