//! Files the user takes away or brings: downloads made from bytes in the page, and the
//! bytes of a file picked in an `<input type="file">` or dropped on the canvas.

use super::api::js_error;
use wasm_bindgen::JsCast;
use wasm_bindgen_futures::JsFuture;

/// Offers `bytes` as a download named `name`.
pub fn download(name: &str, mime: &str, bytes: &[u8]) -> Result<(), String> {
    let parts = js_sys::Array::new();
    parts.push(&js_sys::Uint8Array::from(bytes));
    let options = web_sys::BlobPropertyBag::new();
    options.set_type(mime);
    let blob = web_sys::Blob::new_with_u8_array_sequence_and_options(&parts, &options)
        .map_err(|e| js_error(&e))?;
    let url = web_sys::Url::create_object_url_with_blob(&blob).map_err(|e| js_error(&e))?;
    let result = click_link(&url, name);
    let _ = web_sys::Url::revoke_object_url(&url);
    result
}

/// Follows a link to a server file (its `Content-Disposition` names the download).
pub fn download_url(url: &str) -> Result<(), String> {
    click_link(url, "")
}

/// Clicks a download link to `href` (saved as `name`; empty: as the server names it).
fn click_link(href: &str, name: &str) -> Result<(), String> {
    let document = web_sys::window()
        .and_then(|w| w.document())
        .ok_or("no document")?;
    let a: web_sys::HtmlAnchorElement = document
        .create_element("a")
        .map_err(|e| js_error(&e))?
        .dyn_into()
        .map_err(|_| "cannot make a link")?;
    a.set_href(href);
    a.set_download(name);
    a.click();
    Ok(())
}

/// The name and bytes of the first file chosen in a file input.
pub async fn read_picked(
    input: &web_sys::HtmlInputElement,
) -> Result<Option<(String, Vec<u8>)>, String> {
    let Some(file) = input.files().and_then(|f| f.get(0)) else {
        return Ok(None);
    };
    Ok(Some((file.name(), read_file(&file).await?)))
}

/// The bytes of a file the user gave the page (picked or dropped).
pub async fn read_file(file: &web_sys::File) -> Result<Vec<u8>, String> {
    let buffer = JsFuture::from(file.array_buffer())
        .await
        .map_err(|e| format!("cannot read {}: {}", file.name(), js_error(&e)))?;
    Ok(js_sys::Uint8Array::new(&buffer).to_vec())
}
