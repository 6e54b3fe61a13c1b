//! The editor's components: the page shell with its keyboard shortcuts ([`app`]), the
//! toolbar ([`toolbar`]), the operator palette ([`palette`]), the graph canvas
//! ([`canvas`]) with its find field ([`find`]), minimap ([`minimap`]) and search menu
//! for quick-add and keyboard connect ([`menu`]), the right-click menu
//! ([`context_menu`]), the property panel ([`properties`]), the run panel ([`run_panel`]), the
//! live charts ([`charts_view`]), the devices view ([`devices`]), the help overlay
//! ([`help`]), saving to the workspace with its versions ([`saving`]) and the canvas as
//! an SVG or PNG picture ([`picture`]). [`actions`] holds what several of them trigger.

pub mod actions;
pub mod app;
pub mod canvas;
pub mod charts_view;
pub mod context_menu;
pub mod devices;
pub mod find;
pub mod help;
pub mod menu;
pub mod minimap;
pub mod palette;
pub mod picture;
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

/// Canvas coordinates of a client point.
pub fn to_canvas(view: crate::state::Viewport, p: [f64; 2]) -> [f64; 2] {
    let r = canvas_rect().unwrap_or([0.0; 4]);
    [
        (p[0] - r[0] - view.tx) / view.k,
        (p[1] - r[1] - view.ty) / view.k,
    ]
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
