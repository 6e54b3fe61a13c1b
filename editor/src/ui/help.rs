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
    ("shift-drag on the background", "box selection"),
    ("drag the background, or the wheel", "scroll"),
    ("Ctrl+wheel (or pinch), + and −", "zoom"),
    ("Delete or Backspace", "delete the selected nodes or edge"),
    ("Ctrl+Z", "undo"),
    ("Ctrl+Shift+Z or Ctrl+Y", "redo"),
    ("Ctrl+C / Ctrl+X / Ctrl+V", "copy / cut / paste"),
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
