//! The editor's components: the page shell with its keyboard shortcuts ([`app`]), the
//! toolbar ([`toolbar`]), the operator palette ([`palette`]), the graph canvas
//! ([`canvas`]) with its find field ([`find`]), the property panel ([`properties`]), the run panel ([`run_panel`]), the
//! live charts ([`charts_view`]), the devices view ([`devices`]), the help overlay
//! ([`help`]) and saving to the workspace with its versions ([`saving`]). [`actions`]
//! holds what several of them trigger.

pub mod actions;
pub mod app;
pub mod canvas;
pub mod charts_view;
pub mod devices;
pub mod find;
pub mod help;
pub mod palette;
pub mod properties;
pub mod run_panel;
pub mod saving;
pub mod toolbar;

/// Client coordinates of the canvas element's top-left corner and its size.
pub fn canvas_rect() -> Option<[f64; 4]> {
    let el = web_sys::window()?.document()?.get_element_by_id("canvas")?;
    let r = el.get_bounding_client_rect();
    Some([r.left(), r.top(), r.width(), r.height()])
}

/// Whether keyboard focus is in a text field (shortcuts then leave keys alone).
pub fn typing_in_field(target: Option<web_sys::EventTarget>) -> bool {
    use wasm_bindgen::JsCast;
    target
        .and_then(|t| t.dyn_into::<web_sys::Element>().ok())
        .map(|e| {
            matches!(
                e.tag_name().to_lowercase().as_str(),
                "input" | "textarea" | "select"
            )
        })
        .unwrap_or(false)
}

/// `s` cut to `n` characters, with an ellipsis when cut.
pub fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        format!("{}…", s.chars().take(n).collect::<String>())
    }
}
