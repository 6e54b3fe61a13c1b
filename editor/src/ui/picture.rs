//! Pictures of the graph: the canvas as a standalone SVG file — every element's computed
//! style written into it (the page styles it through classes and theme variables), the
//! whole graph in its view box on the canvas colour, without pan, zoom or hit areas — and
//! as a PNG drawn from that SVG at twice its size, within a pixel budget.

use crate::state::EditorState;
use crate::web::api::js_error;
use crate::web::files;
use leptos::prelude::*;
use wasm_bindgen::JsCast;
use wasm_bindgen_futures::JsFuture;

const SVG_NS: &str = "http://www.w3.org/2000/svg";

/// Space left around the graph, in canvas units.
const MARGIN: f64 = 24.0;

/// The PNG's scale when the budget allows it.
const PNG_SCALE: f64 = 2.0;

/// Most pixels a PNG may have (16 M, 64 MiB of RGBA).
const MAX_PIXELS: f64 = 16_000_000.0;

/// Longest side of a PNG: browsers refuse larger canvases.
const MAX_SIDE: f64 = 16_384.0;

/// The computed style properties that draw the canvas's elements (all inherited in SVG
/// but `opacity`).
const STYLED: &[&str] = &[
    "fill",
    "fill-opacity",
    "stroke",
    "stroke-width",
    "stroke-dasharray",
    "stroke-opacity",
    "stroke-linecap",
    "stroke-linejoin",
    "opacity",
    "paint-order",
    "font-family",
    "font-size",
    "font-weight",
    "font-style",
    "text-anchor",
    "dominant-baseline",
    "visibility",
];

/// Parts that only serve the pointer or the current gesture.
const INTERACTIVE: &str = ".hit, .edge-hit, .wire, .box-select";

/// The view box (x, y, width, height) around a graph's bounding box, with the margin.
pub fn frame(bounds: [f64; 4]) -> [f64; 4] {
    [
        bounds[0] - MARGIN,
        bounds[1] - MARGIN,
        bounds[2].max(0.0) + 2.0 * MARGIN,
        bounds[3].max(0.0) + 2.0 * MARGIN,
    ]
}

/// The scale a `width` × `height` picture is drawn at as a PNG: [`PNG_SCALE`], or less
/// so that it stays within [`MAX_PIXELS`] and [`MAX_SIDE`]; whether it was reduced.
pub fn png_scale(width: f64, height: f64) -> (f64, bool) {
    let (w, h) = (width.max(1.0), height.max(1.0));
    let fit = (MAX_PIXELS / (w * h)).sqrt().min(MAX_SIDE / w.max(h));
    if fit < PNG_SCALE {
        (fit, true)
    } else {
        (PNG_SCALE, false)
    }
}

/// The file name for the graph's picture with `extension`.
fn file_name(state: EditorState, extension: &str) -> String {
    state
        .doc
        .with_untracked(|d| super::actions::download_name(&d.name, extension))
}

/// Downloads the canvas as `NAME.svg`.
pub fn export_svg(state: EditorState) {
    match standalone_svg() {
        Ok((text, _)) => {
            let name = file_name(state, "svg");
            if let Err(e) = files::download(&name, "image/svg+xml", text.as_bytes()) {
                state.error(format!("SVG export failed: {e}"));
            }
        }
        Err(e) => state.error(format!("SVG export failed: {e}")),
    }
}

/// Downloads the canvas as `NAME.png`.
pub fn export_png(state: EditorState) {
    let (text, size) = match standalone_svg() {
        Ok(svg) => svg,
        Err(e) => return state.error(format!("PNG export failed: {e}")),
    };
    let name = file_name(state, "png");
    leptos::task::spawn_local(async move {
        let (scale, reduced) = png_scale(size[0], size[1]);
        match render_png(&text, size, scale).await {
            Ok(bytes) => match files::download(&name, "image/png", &bytes) {
                Ok(()) if reduced => state.info(format!(
                    "the graph is large: {name} is drawn at {:.0}% of its size",
                    scale * 100.0
                )),
                Ok(()) => {}
                Err(e) => state.error(format!("PNG export failed: {e}")),
            },
            Err(e) => state.error(format!("PNG export failed: {e}")),
        }
    });
}

/// The canvas as a standalone SVG document, with its size (width, height).
fn standalone_svg() -> Result<(String, [f64; 2]), String> {
    let window = web_sys::window().ok_or("no window")?;
    let document = window.document().ok_or("no document")?;
    let canvas = document
        .get_element_by_id("canvas")
        .ok_or("the canvas is not on the page")?;
    let view = frame(graph_bounds(&canvas)?.ok_or("the graph is empty")?);
    let copy: web_sys::Element = canvas
        .clone_node_with_deep(true)
        .map_err(|e| js_error(&e))?
        .dyn_into()
        .map_err(|_| "cannot copy the canvas")?;
    // The copy has the same elements in the same order: give each the original's style.
    let originals = canvas.query_selector_all("*").map_err(|e| js_error(&e))?;
    let copies = copy.query_selector_all("*").map_err(|e| js_error(&e))?;
    for i in 0..originals.length().min(copies.length()) {
        let (Some(original), Some(copied)) = (
            originals
                .item(i)
                .and_then(|n| n.dyn_into::<web_sys::Element>().ok()),
            copies
                .item(i)
                .and_then(|n| n.dyn_into::<web_sys::Element>().ok()),
        ) else {
            continue;
        };
        let parent = original
            .parent_element()
            .filter(|p| *p != canvas)
            .map(|p| window.get_computed_style(&p))
            .transpose()
            .map_err(|e| js_error(&e))?
            .flatten();
        let style = inline_style(&window, &original, parent.as_ref())?;
        copied
            .set_attribute("style", &style)
            .map_err(|e| js_error(&e))?;
    }
    let interactive = copy
        .query_selector_all(INTERACTIVE)
        .map_err(|e| js_error(&e))?;
    for i in 0..interactive.length() {
        if let Some(e) = interactive
            .item(i)
            .and_then(|n| n.dyn_into::<web_sys::Element>().ok())
        {
            e.remove();
        }
    }
    // The top group carries the pan and zoom.
    if let Some(top) = copy
        .query_selector(":scope > g")
        .map_err(|e| js_error(&e))?
    {
        top.remove_attribute("transform")
            .map_err(|e| js_error(&e))?;
    }
    for attr in ["id", "class", "style", "role", "aria-label"] {
        copy.remove_attribute(attr).map_err(|e| js_error(&e))?;
    }
    let [x, y, w, h] = view;
    let set = |e: &web_sys::Element, name: &str, value: &str| {
        e.set_attribute(name, value).map_err(|e| js_error(&e))
    };
    set(&copy, "viewBox", &format!("{x} {y} {w} {h}"))?;
    set(&copy, "width", &w.to_string())?;
    set(&copy, "height", &h.to_string())?;
    let background = document
        .create_element_ns(Some(SVG_NS), "rect")
        .map_err(|e| js_error(&e))?;
    for (name, value) in [("x", x), ("y", y), ("width", w), ("height", h)] {
        set(&background, name, &value.to_string())?;
    }
    let colour = window
        .get_computed_style(&canvas)
        .map_err(|e| js_error(&e))?
        .map(|s| s.get_property_value("background-color"))
        .transpose()
        .map_err(|e| js_error(&e))?
        .unwrap_or_default();
    set(
        &background,
        "fill",
        if colour.is_empty() {
            "#ffffff"
        } else {
            &colour
        },
    )?;
    copy.prepend_with_node_1(&background)
        .map_err(|e| js_error(&e))?;
    let text = web_sys::XmlSerializer::new()
        .map_err(|e| js_error(&e))?
        .serialize_to_string(&copy)
        .map_err(|e| js_error(&e))?;
    Ok((
        format!("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n{text}\n"),
        [w, h],
    ))
}

/// The bounding box of everything drawn in graph coordinates (nodes, edges, labels);
/// `None` when nothing is.
fn graph_bounds(canvas: &web_sys::Element) -> Result<Option<[f64; 4]>, String> {
    let groups = canvas
        .query_selector_all(
            ":scope > g > g.nodes, :scope > g > g.edges, :scope > g > g.edge-labels",
        )
        .map_err(|e| js_error(&e))?;
    let mut rect: Option<[f64; 4]> = None;
    for i in 0..groups.length() {
        let Some(g) = groups
            .item(i)
            .and_then(|n| n.dyn_into::<web_sys::SvgGraphicsElement>().ok())
        else {
            continue;
        };
        if g.child_element_count() == 0 {
            continue;
        }
        let b = g.get_b_box().map_err(|e| js_error(&e))?;
        let (x0, y0) = (f64::from(b.x()), f64::from(b.y()));
        let (x1, y1) = (x0 + f64::from(b.width()), y0 + f64::from(b.height()));
        rect = Some(match rect {
            None => [x0, y0, x1, y1],
            Some(r) => [r[0].min(x0), r[1].min(y0), r[2].max(x1), r[3].max(y1)],
        });
    }
    Ok(rect.map(|r| [r[0], r[1], r[2] - r[0], r[3] - r[1]]))
}

/// An element's computed drawing properties as a `style` attribute, leaving out what it
/// inherits unchanged from `parent` (`None`: the top group, which writes everything).
fn inline_style(
    window: &web_sys::Window,
    e: &web_sys::Element,
    parent: Option<&web_sys::CssStyleDeclaration>,
) -> Result<String, String> {
    let Some(computed) = window.get_computed_style(e).map_err(|e| js_error(&e))? else {
        return Ok(String::new());
    };
    let mut style = String::new();
    for name in STYLED {
        let value = computed
            .get_property_value(name)
            .map_err(|e| js_error(&e))?;
        let inherited = match (parent, *name) {
            // Opacity is not inherited: only a value other than its initial one counts.
            (_, "opacity") => value == "1",
            (Some(p), _) => p.get_property_value(name).is_ok_and(|v| v == value),
            (None, _) => false,
        };
        if !value.is_empty() && !inherited {
            style.push_str(&format!("{name}:{value};"));
        }
    }
    Ok(style)
}

/// `svg` (of `size`) drawn at `scale` on an offscreen canvas, as PNG bytes.
async fn render_png(svg: &str, size: [f64; 2], scale: f64) -> Result<Vec<u8>, String> {
    let parts = js_sys::Array::new();
    parts.push(&wasm_bindgen::JsValue::from_str(svg));
    let options = web_sys::BlobPropertyBag::new();
    options.set_type("image/svg+xml");
    let blob = web_sys::Blob::new_with_str_sequence_and_options(&parts, &options)
        .map_err(|e| js_error(&e))?;
    let url = web_sys::Url::create_object_url_with_blob(&blob).map_err(|e| js_error(&e))?;
    let result = draw(&url, size, scale).await;
    let _ = web_sys::Url::revoke_object_url(&url);
    result
}

/// The image at `url` drawn at `scale` and encoded as PNG.
async fn draw(url: &str, size: [f64; 2], scale: f64) -> Result<Vec<u8>, String> {
    let image = web_sys::HtmlImageElement::new().map_err(|e| js_error(&e))?;
    image.set_src(url);
    JsFuture::from(image.decode())
        .await
        .map_err(|e| format!("the browser cannot draw the SVG: {}", js_error(&e)))?;
    let document = web_sys::window()
        .and_then(|w| w.document())
        .ok_or("no document")?;
    let canvas: web_sys::HtmlCanvasElement = document
        .create_element("canvas")
        .map_err(|e| js_error(&e))?
        .dyn_into()
        .map_err(|_| "cannot make a canvas")?;
    let (w, h) = (
        (size[0] * scale).round().max(1.0),
        (size[1] * scale).round().max(1.0),
    );
    canvas.set_width(w as u32);
    canvas.set_height(h as u32);
    let context: web_sys::CanvasRenderingContext2d = canvas
        .get_context("2d")
        .map_err(|e| js_error(&e))?
        .ok_or("the browser gives no 2-D canvas")?
        .dyn_into()
        .map_err(|_| "the browser gives no 2-D canvas")?;
    context
        .draw_image_with_html_image_element_and_dw_and_dh(&image, 0.0, 0.0, w, h)
        .map_err(|e| js_error(&e))?;
    let mut failed = None;
    let blob = js_sys::Promise::new(&mut |resolve, _reject| {
        if let Err(e) = canvas.to_blob_with_type(&resolve, "image/png") {
            failed = Some(js_error(&e));
        }
    });
    if let Some(e) = failed {
        return Err(format!("the browser cannot encode the PNG: {e}"));
    }
    let blob = JsFuture::from(blob).await.map_err(|e| js_error(&e))?;
    let blob: web_sys::Blob = blob
        .dyn_into()
        .map_err(|_| "the browser could not encode the PNG (too large?)")?;
    let buffer = JsFuture::from(blob.array_buffer())
        .await
        .map_err(|e| js_error(&e))?;
    Ok(js_sys::Uint8Array::new(&buffer).to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_frame_holds_the_graph_with_a_margin() {
        assert_eq!(
            frame([10.0, -5.0, 100.0, 50.0]),
            [-14.0, -29.0, 148.0, 98.0]
        );
    }

    #[test]
    fn pngs_are_twice_the_size_within_the_budget() {
        assert_eq!(png_scale(800.0, 600.0), (2.0, false));
        // 4000 × 4000 at 2× is 64 M pixels: scaled to 1×.
        let (s, reduced) = png_scale(4000.0, 4000.0);
        assert!(reduced && (s - 1.0).abs() < 1e-9);
        // A tall chain: the longest side stays drawable.
        let (s, reduced) = png_scale(200.0, 20_000.0);
        assert!(reduced && 20_000.0 * s <= MAX_SIDE);
        let (s, _) = png_scale(0.0, 0.0);
        assert!(s.is_finite());
    }
}
