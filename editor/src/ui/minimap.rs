//! The minimap: the whole graph drawn small in a corner of the canvas, with the part the
//! view shows outlined. Click it to centre the view there; drag on it to move the view.

use crate::layout::NODE_HEIGHT;
use crate::state::{EditorState, Viewport};
use leptos::prelude::*;

/// The minimap's drawing area, in pixels.
const WIDTH: f64 = 180.0;
const HEIGHT: f64 = 120.0;
/// Graph units around the nodes, so the outline of the view stays visible at the edges.
const MARGIN: f64 = 40.0;

/// Where the graph lies (x, y, width, height, padded) and one path of every node's rectangle.
fn sketch(state: EditorState) -> Option<([f64; 4], String)> {
    state.ports.track();
    state.doc.with(|d| {
        let mut bounds: Option<[f64; 4]> = None;
        let mut path = String::new();
        for (id, p) in &d.layout {
            let w = state.drawn_width(id);
            path.push_str(&format!(
                "M{:.0},{:.0}h{w:.0}v{NODE_HEIGHT:.0}h{:.0}Z",
                p[0], p[1], -w
            ));
            let (x1, y1) = (p[0] + w, p[1] + NODE_HEIGHT);
            bounds = Some(match bounds {
                None => [p[0], p[1], x1, y1],
                Some(b) => [b[0].min(p[0]), b[1].min(p[1]), b[2].max(x1), b[3].max(y1)],
            });
        }
        bounds.map(|b| {
            (
                [
                    b[0] - MARGIN,
                    b[1] - MARGIN,
                    b[2] - b[0] + 2.0 * MARGIN,
                    b[3] - b[1] + 2.0 * MARGIN,
                ],
                path,
            )
        })
    })
}

/// Graph units per minimap pixel for `bounds`, and the offset centring the graph.
fn scale(bounds: [f64; 4]) -> (f64, [f64; 2]) {
    let s = (bounds[2] / WIDTH)
        .max(bounds[3] / HEIGHT)
        .max(f64::MIN_POSITIVE);
    let offset = [
        (WIDTH - bounds[2] / s) / 2.0,
        (HEIGHT - bounds[3] / s) / 2.0,
    ];
    (s, offset)
}

/// `at` moved so that a view `span` wide centred on it stays over `from..from + length`
/// (the middle of that range when the view is wider).
fn keep_over(at: f64, span: f64, from: f64, length: f64) -> f64 {
    if length <= span {
        from + length / 2.0
    } else {
        at.clamp(from + span / 2.0, from + length - span / 2.0)
    }
}

/// Centres the view on the graph point under minimap pixel (x, y), kept over the graph
/// (a click at the minimap's end shows the graph's end filling the view).
fn centre_at(state: EditorState, bounds: [f64; 4], x: f64, y: f64) {
    let (s, o) = scale(bounds);
    let r = super::canvas_rect().unwrap_or([0.0, 0.0, 800.0, 600.0]);
    let k = state.view.with_untracked(|v| v.k);
    let gx = keep_over(bounds[0] + (x - o[0]) * s, r[2] / k, bounds[0], bounds[2]);
    let gy = keep_over(bounds[1] + (y - o[1]) * s, r[3] / k, bounds[1], bounds[3]);
    state.view.update(|v| {
        *v = Viewport {
            k: v.k,
            tx: r[2] / 2.0 - gx * v.k,
            ty: r[3] / 2.0 - gy * v.k,
        }
    });
}

/// The minimap (absent while the graph is empty).
#[component]
pub fn Minimap(state: EditorState) -> impl IntoView {
    let drawn = Memo::new(move |_| sketch(state));
    let dragging = RwSignal::new(false);
    let at = move |ev: &web_sys::PointerEvent| {
        let Some(bounds) = drawn.with_untracked(|d| d.as_ref().map(|d| d.0)) else {
            return;
        };
        let Some(el) = ev
            .current_target()
            .and_then(|t| wasm_bindgen::JsCast::dyn_into::<web_sys::Element>(t).ok())
        else {
            return;
        };
        let r = el.get_bounding_client_rect();
        centre_at(
            state,
            bounds,
            f64::from(ev.client_x()) - r.left(),
            f64::from(ev.client_y()) - r.top(),
        );
    };
    move || {
        let (bounds, path) = drawn.get()?;
        let (s, o) = scale(bounds);
        let transform = format!(
            "translate({:.2},{:.2}) scale({:.5}) translate({:.1},{:.1})",
            o[0],
            o[1],
            1.0 / s,
            -bounds[0],
            -bounds[1]
        );
        let view_rect = move || {
            let v = state.view.get();
            let r = super::canvas_rect().unwrap_or([0.0, 0.0, 800.0, 600.0]);
            (-v.tx / v.k, -v.ty / v.k, r[2] / v.k, r[3] / v.k)
        };
        Some(view! {
            <svg class="minimap" width=WIDTH height=HEIGHT role="img"
                aria-label="Minimap of the whole graph: click or drag to move the view"
                on:pointerdown=move |ev| {
                    ev.stop_propagation();
                    ev.prevent_default();
                    dragging.set(true);
                    if let Some(el) = ev.current_target()
                        .and_then(|t| wasm_bindgen::JsCast::dyn_into::<web_sys::Element>(t).ok())
                    {
                        let _ = el.set_pointer_capture(ev.pointer_id());
                    }
                    at(&ev);
                }
                on:pointermove=move |ev| if dragging.get_untracked() { at(&ev) }
                on:pointerup=move |_| dragging.set(false)
                on:pointercancel=move |_| dragging.set(false)>
                <title>"Minimap: click or drag to move the view"</title>
                <g transform=transform>
                    <path class="minimap-nodes" d=path />
                    <rect class="minimap-view"
                        x=move || view_rect().0 y=move || view_rect().1
                        width=move || view_rect().2 height=move || view_rect().3 />
                </g>
            </svg>
        })
    }
}
