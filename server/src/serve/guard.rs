//! Who may ask what, checked in middleware before any handler: a request's `Host` must be
//! one of the server's names (against DNS rebinding) and an `Origin` header, when sent,
//! the server's own (against cross-site requests and WebSocket hijacking) — on every
//! route; the token (compared in constant time) on every route except the editor bundle's
//! files; and a POST or PUT body must be `application/json` (a cross-site form cannot send
//! it without a preflight).

use super::error::AppError;
use anyhow::{bail, Result};
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

/// Longest part of a refused header echoed in an error.
const ECHO: usize = 100;

/// A name the server answers to: a host name or IP address, and a port (None: any).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Name {
    host: String,
    port: Option<u16>,
}

/// What the guards check against: the server's names (for `Host`) and its token.
#[derive(Debug, Clone)]
pub struct Gate {
    names: Vec<Name>,
    token: Option<String>,
    /// Bound to every address: any IP literal with this port is the server (an IP
    /// literal cannot be rebound to another server, unlike a DNS name).
    any_ip: Option<u16>,
    /// The port a `Host` without one means (80, or 443 with TLS).
    default_port: u16,
}

/// Splits a `Host` value (or an `--allowed-host` name) into a lowercase host and port;
/// None when it is not of that form.
fn split_host(value: &str) -> Option<Name> {
    let value = value.trim().to_ascii_lowercase();
    let (host, port) = if let Some(rest) = value.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        host.parse::<std::net::Ipv6Addr>().ok()?;
        match after {
            "" => (host.to_string(), None),
            p => (host.to_string(), Some(p.strip_prefix(':')?.parse().ok()?)),
        }
    } else {
        match value.rsplit_once(':') {
            Some((h, p)) => (h.to_string(), Some(p.parse().ok()?)),
            None => (value.clone(), None),
        }
    };
    let plain = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ':');
    if host.is_empty() || !host.chars().all(plain) {
        return None;
    }
    Some(Name { host, port })
}

/// This machine's host name, as `gethostname` gives it.
#[cfg(unix)]
fn host_name() -> Option<String> {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; the name is NUL-terminated within it
    // when the call succeeds (the last byte stays 0 if the name was cut).
    let ok = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len() - 1) } == 0;
    let end = buf.iter().position(|&b| b == 0)?;
    ok.then(|| String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase())
        .filter(|n| !n.is_empty())
}

#[cfg(not(unix))]
fn host_name() -> Option<String> {
    std::env::var("COMPUTERNAME")
        .ok()
        .map(|n| n.to_ascii_lowercase())
}

impl Gate {
    /// The names of a server bound to `bound`: for a loopback address `127.0.0.1`,
    /// `localhost` and `[::1]` with its port; for a wildcard address (`0.0.0.0`, `::`),
    /// any IP literal, `localhost` and the machine's host name with its port (a cluster's
    /// nodes reach each other by it); otherwise the bound address. Names given with
    /// `--allowed-host` are added: with a port, that port only; without, any.
    /// `token`: the bearer token every guarded route needs, if any.
    pub fn new(
        bound: SocketAddr,
        tls: bool,
        allowed: &[String],
        token: Option<String>,
    ) -> Result<Gate> {
        let port = bound.port();
        let at = |host: &str| Name {
            host: host.to_string(),
            port: Some(port),
        };
        let mut names = Vec::new();
        let mut any_ip = None;
        let ip = bound.ip();
        if ip.is_loopback() {
            names.extend([at("127.0.0.1"), at("localhost"), at("::1")]);
        } else if ip.is_unspecified() {
            any_ip = Some(port);
            names.push(at("localhost"));
            names.extend(host_name().map(|n| at(&n)));
        } else {
            names.push(at(&ip.to_string()));
        }
        for a in allowed {
            match split_host(a) {
                Some(name) => names.push(name),
                None => bail!("--allowed-host '{a}' is not a host name, or a host name and port"),
            }
        }
        Ok(Gate {
            names,
            token,
            any_ip,
            default_port: if tls { 443 } else { 80 },
        })
    }

    /// Whether a `Host` value names this server.
    pub fn allows(&self, host: &str) -> bool {
        let Some(asked) = split_host(host) else {
            return false;
        };
        let port = asked.port.unwrap_or(self.default_port);
        if self.any_ip == Some(port) && asked.host.parse::<IpAddr>().is_ok() {
            return true;
        }
        self.names
            .iter()
            .any(|n| n.host == asked.host && n.port.is_none_or(|p| p == port))
    }
}

fn echo(s: &str) -> String {
    match s.char_indices().nth(ECHO) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

/// Whether an `Origin` is the server's own for a request to `host`.
fn same_origin(origin: &str, host: &str) -> bool {
    ["http://", "https://"].iter().any(|scheme| {
        origin.len() == scheme.len() + host.len()
            && origin[..scheme.len()].eq_ignore_ascii_case(scheme)
            && origin
                .get(scheme.len()..)
                .is_some_and(|h| h.eq_ignore_ascii_case(host))
    })
}

/// Checks `Host` and `Origin`: 400 without a `Host`, 403 for a name that is not the
/// server's or an origin that is not its own.
pub async fn check_host_and_origin(
    State(gate): State<Arc<Gate>>,
    req: Request,
    next: Next,
) -> Response {
    let headers = req.headers();
    let Some(host) = headers.get(header::HOST).and_then(|h| h.to_str().ok()) else {
        return AppError::bad("a Host header is required").into_response();
    };
    if !gate.allows(host) {
        return AppError::new(
            StatusCode::FORBIDDEN,
            format!(
                "host '{}' is not this server's (names behind a proxy are added with --allowed-host)",
                echo(host)
            ),
        )
        .into_response();
    }
    if let Some(origin) = headers.get(header::ORIGIN) {
        let ok = origin.to_str().is_ok_and(|o| same_origin(o, host));
        if !ok {
            return AppError::new(StatusCode::FORBIDDEN, "cross-origin request refused")
                .into_response();
        }
    }
    next.run(req).await
}

/// Compares a token with the expected one in time that depends only on the expected
/// token's length.
pub fn same_token(given: &[u8], expected: &[u8]) -> bool {
    let mut diff = given.len() ^ expected.len();
    for (i, e) in expected.iter().enumerate() {
        diff |= usize::from(given.get(i).copied().unwrap_or(0) ^ e);
    }
    std::hint::black_box(diff) == 0
}

/// The token a request carries: `Authorization: Bearer <token>`, or a `token` query
/// parameter (browsers cannot set headers on WebSockets or plain download links).
fn given_token(req: &Request) -> Option<String> {
    if let Some(value) = req.headers().get(header::AUTHORIZATION) {
        let value = value.to_str().ok()?;
        let (scheme, token) = value.split_once(' ')?;
        return scheme
            .eq_ignore_ascii_case("bearer")
            .then(|| token.trim().to_string());
    }
    axum::extract::Query::<std::collections::HashMap<String, String>>::try_from_uri(req.uri())
        .ok()
        .and_then(|q| q.0.get("token").cloned())
}

/// Checks the token, when the server has one: 401 when missing or wrong.
pub async fn require_token(State(gate): State<Arc<Gate>>, req: Request, next: Next) -> Response {
    if let Some(expected) = &gate.token {
        let unauthorised = |m: &str| AppError::new(StatusCode::UNAUTHORIZED, m).into_response();
        let has_header = req.headers().contains_key(header::AUTHORIZATION);
        match given_token(&req) {
            None if has_header => return unauthorised("wrong token"),
            None => return unauthorised("missing 'Authorization: Bearer <token>'"),
            Some(g) if !same_token(g.as_bytes(), expected.as_bytes()) => {
                return unauthorised("wrong token")
            }
            Some(_) => {}
        }
    }
    next.run(req).await
}

/// Whether a request has a body: a non-zero `Content-Length`, or a chunked one.
fn has_body(headers: &HeaderMap) -> bool {
    headers.contains_key(header::TRANSFER_ENCODING)
        || headers
            .get(header::CONTENT_LENGTH)
            .is_some_and(|v| v.to_str().map_or(true, |s| s.trim() != "0"))
}

/// The content types of an ONNX model body, taken by `PUT /api/graphs/{name}` only.
/// Neither is one a cross-site form can send without a CORS preflight.
pub const MODEL_TYPES: [&str; 2] = ["application/onnx", "application/octet-stream"];

/// A request's media type (its `Content-Type` without parameters), if it has one.
pub fn media_type(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .map(str::trim)
}

/// Refuses a POST or PUT body that is not `application/json` (415) — but for an ONNX model
/// ([`MODEL_TYPES`]) put as a graph and a weights file (`application/octet-stream`) put
/// under `/api/weights/`.
pub async fn require_json(req: Request, next: Next) -> Response {
    let writes = matches!(*req.method(), Method::POST | Method::PUT | Method::PATCH);
    if writes && has_body(req.headers()) {
        let media = media_type(req.headers());
        let json = media.is_some_and(|t| t.eq_ignore_ascii_case("application/json"));
        let model = *req.method() == Method::PUT
            && req.uri().path().starts_with("/api/graphs/")
            && media.is_some_and(|t| MODEL_TYPES.iter().any(|m| t.eq_ignore_ascii_case(m)));
        let weights = *req.method() == Method::PUT
            && req.uri().path().starts_with("/api/weights/")
            && media.is_some_and(|t| t.eq_ignore_ascii_case("application/octet-stream"));
        let model = model || weights;
        if !json && !model {
            return AppError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "request bodies must be sent as 'Content-Type: application/json' \
                 (an ONNX model put as a graph: 'application/onnx' or 'application/octet-stream'; \
                 a weights file: 'application/octet-stream')",
            )
            .into_response();
        }
    }
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gate(bound: &str, allowed: &[&str]) -> Gate {
        let allowed: Vec<String> = allowed.iter().map(|s| s.to_string()).collect();
        Gate::new(bound.parse().unwrap(), false, &allowed, None).unwrap()
    }

    #[test]
    fn a_loopback_server_answers_to_its_loopback_names_only() {
        let g = gate("127.0.0.1:7878", &[]);
        for ok in [
            "127.0.0.1:7878",
            "localhost:7878",
            "LOCALHOST:7878",
            "[::1]:7878",
        ] {
            assert!(g.allows(ok), "{ok}");
        }
        for bad in [
            "evil.example:7878",
            "127.0.0.1:7879",
            "localhost",
            "127.0.0.1.nip.io:7878",
            "",
            "localhost:7878/x",
            "[::1",
            "localhost:99999",
        ] {
            assert!(!g.allows(bad), "{bad}");
        }
        let g = gate("127.0.0.1:80", &[]);
        assert!(g.allows("localhost"));
    }

    #[test]
    fn wildcard_and_named_servers() {
        let g = gate(
            "0.0.0.0:9000",
            &["sluice.example.org", "proxy.example.org:8443"],
        );
        for ok in [
            "10.1.2.3:9000",
            "[fe80::1]:9000",
            "localhost:9000",
            "sluice.example.org",
            "sluice.example.org:443",
            "proxy.example.org:8443",
        ] {
            assert!(g.allows(ok), "{ok}");
        }
        for bad in [
            "10.1.2.3:9001",
            "proxy.example.org",
            "rebind.attacker.example:9000",
        ] {
            assert!(!g.allows(bad), "{bad}");
        }
        if let Some(me) = host_name() {
            assert!(g.allows(&format!("{me}:9000")), "{me}");
        }
        let g = gate("10.0.0.5:9000", &[]);
        assert!(g.allows("10.0.0.5:9000") && !g.allows("10.0.0.6:9000"));
        assert!(Gate::new("127.0.0.1:1".parse().unwrap(), false, &["a/b".into()], None).is_err());
    }

    #[test]
    fn origins_and_tokens() {
        assert!(same_origin("http://localhost:7878", "localhost:7878"));
        assert!(same_origin("HTTPS://LocalHost:7878", "localhost:7878"));
        for bad in [
            "http://evil:7878",
            "null",
            "http://localhost:7878/",
            "http://localhost:787",
        ] {
            assert!(!same_origin(bad, "localhost:7878"), "{bad}");
        }
        assert!(same_token(b"s3cret", b"s3cret"));
        for bad in [&b"s3cre"[..], b"s3cret!", b"", b"S3cret"] {
            assert!(!same_token(bad, b"s3cret"));
        }
    }
}
