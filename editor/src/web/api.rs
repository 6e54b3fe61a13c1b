//! Calls to the server's JSON API. A token (for servers bound beyond loopback) comes from
//! the page's `?token=` and is kept for the session; every error becomes a sentence that
//! names the request and what the server said.

use serde_json::Value;
use wasm_bindgen::{JsCast, JsValue};
use wasm_bindgen_futures::JsFuture;
use web_sys::{Headers, Request, RequestInit, Response};

const TOKEN_KEY: &str = "sluice.token";

/// The bearer token, if the page was opened with one.
pub fn token() -> Option<String> {
    let window = web_sys::window()?;
    let storage = window.session_storage().ok().flatten();
    let search = window.location().search().unwrap_or_default();
    let from_url = search
        .trim_start_matches('?')
        .split('&')
        .find_map(|kv| kv.strip_prefix("token="))
        .map(|t| {
            js_sys::decode_uri_component(t)
                .map(String::from)
                .unwrap_or_default()
        })
        .filter(|t| !t.is_empty());
    if let (Some(t), Some(s)) = (&from_url, &storage) {
        let _ = s.set_item(TOKEN_KEY, t);
    }
    from_url.or_else(|| storage.and_then(|s| s.get_item(TOKEN_KEY).ok().flatten()))
}

/// A readable sentence from a JavaScript error.
pub fn js_error(e: &JsValue) -> String {
    e.dyn_ref::<js_sys::Error>()
        .map(|e| String::from(e.message()))
        .or_else(|| e.as_string())
        .unwrap_or_else(|| format!("{e:?}"))
}

/// A response: status and body bytes.
pub struct Reply {
    /// HTTP status.
    pub status: u16,
    /// Body.
    pub body: Vec<u8>,
}

impl Reply {
    /// The body as JSON (`Null` when it is not JSON).
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }

    /// Whether the status is 2xx.
    pub fn ok(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// The server's error body, when it sent one.
    pub fn error_body(&self) -> Option<sluice_api::ErrorBody> {
        serde_json::from_slice(&self.body).ok()
    }

    /// The server's error sentence, or the status.
    pub fn error(&self) -> String {
        match self.error_body() {
            Some(e) => e.error,
            None => format!("the server answered {}", self.status),
        }
    }
}

/// A request body: JSON text, or bytes of a media type.
pub enum Payload<'a> {
    /// `application/json`.
    Json(&'a str),
    /// Bytes sent as `media`.
    Bytes(&'a [u8], &'a str),
}

/// Sends a request; `body` is JSON text.
pub async fn request(method: &str, path: &str, body: Option<&str>) -> Result<Reply, String> {
    send(method, path, body.map(Payload::Json)).await
}

/// Sends a request with any payload.
pub async fn send(method: &str, path: &str, body: Option<Payload<'_>>) -> Result<Reply, String> {
    let what = format!("{method} {path}");
    let window = web_sys::window().ok_or("no window")?;
    let init = RequestInit::new();
    init.set_method(method);
    let headers = Headers::new().map_err(|e| js_error(&e))?;
    if let Some(t) = token() {
        headers
            .set("Authorization", &format!("Bearer {t}"))
            .map_err(|e| js_error(&e))?;
    }
    match body {
        Some(Payload::Json(b)) => {
            headers
                .set("Content-Type", "application/json")
                .map_err(|e| js_error(&e))?;
            init.set_body(&JsValue::from_str(b));
        }
        Some(Payload::Bytes(b, media)) => {
            headers
                .set("Content-Type", media)
                .map_err(|e| js_error(&e))?;
            init.set_body(&js_sys::Uint8Array::from(b).into());
        }
        None => {}
    }
    init.set_headers(&headers);
    let req = Request::new_with_str_and_init(path, &init).map_err(|e| js_error(&e))?;
    let resp: Response = JsFuture::from(window.fetch_with_request(&req))
        .await
        .map_err(|e| format!("{what}: the server cannot be reached ({})", js_error(&e)))?
        .dyn_into()
        .map_err(|_| format!("{what}: not an HTTP response"))?;
    let buf = JsFuture::from(resp.array_buffer().map_err(|e| js_error(&e))?)
        .await
        .map_err(|e| format!("{what}: reading the answer failed ({})", js_error(&e)))?;
    Ok(Reply {
        status: resp.status(),
        body: js_sys::Uint8Array::new(&buf).to_vec(),
    })
}

/// GETs a typed answer, failing with the server's message on a non-2xx status or a body
/// of another shape.
pub async fn get<T: serde::de::DeserializeOwned>(path: &str) -> Result<T, String> {
    let r = request("GET", path, None).await?;
    if !r.ok() {
        return Err(format!("GET {path}: {}", r.error()));
    }
    serde_json::from_slice(&r.body).map_err(|e| format!("GET {path}: unexpected answer ({e})"))
}

/// GETs JSON, failing with the server's message on a non-2xx status.
pub async fn get_json(path: &str) -> Result<Value, String> {
    let r = request("GET", path, None).await?;
    if r.ok() {
        Ok(r.json())
    } else {
        Err(format!("GET {path}: {}", r.error()))
    }
}

/// The WebSocket URL of a server path (same host; the token as a query parameter, since
/// browsers cannot set headers on WebSockets).
pub fn ws_url(path: &str) -> Result<String, String> {
    let loc = web_sys::window().ok_or("no window")?.location();
    let scheme = if loc.protocol().unwrap_or_default() == "https:" {
        "wss"
    } else {
        "ws"
    };
    let host = loc.host().map_err(|e| js_error(&e))?;
    Ok(format!("{scheme}://{host}{}", with_token(path)))
}

/// A server path with the token as a query parameter, for what the browser fetches by
/// itself (WebSockets, download links), where no header can be set.
pub fn with_token(path: &str) -> String {
    match token() {
        Some(t) => format!(
            "{path}?token={}",
            String::from(js_sys::encode_uri_component(&t))
        ),
        None => path.to_string(),
    }
}
