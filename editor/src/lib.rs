//! Sluice's graph editor: a Leptos app, rendered in the browser and compiled to wasm32,
//! that designs model graphs, shows the shape and dtype of every edge live (the engine
//! itself runs in the page), runs graphs on the server or on this browser's WebGPU, and
//! charts where GPU time goes.
//!
//! Pure modules (tested natively): [`model`] (the document and its edits), [`history`]
//! (undo/redo), [`schema`] (operator schemas), [`layout`] (geometry, auto-layout),
//! [`route`] (edge routing and label placement), [`groups`] (blocks to collapse),
//! [`check`] (the engine's analysis, connection checks, stage placement), [`charts`]
//! (chart data from events). Browser-side: [`state`] (signals), [`web`] (HTTP,
//! WebSocket, storage, files, runs) and [`ui`] (components).

pub mod charts;
pub mod check;
pub mod groups;
pub mod history;
pub mod layout;
pub mod model;
pub mod route;
pub mod schema;
pub mod state;
pub mod ui;
pub mod web;

/// Starts the editor when the page loads the module.
#[wasm_bindgen::prelude::wasm_bindgen(start)]
pub fn start() {
    console_error_panic_hook::set_once();
    ui::app::mount();
}
