//! The editor bundle: where it is, and serving its files. The bundle is the folder given
//! with `--editor` (or `SLUICE_EDITOR`), or else — only for a cargo build — `editor/`
//! beside the binary's profile folder in a cargo target folder (`target/editor` for
//! `target/debug/sluice`, recognised by cargo's `CACHEDIR.TAG`), in both cases a folder
//! holding `index.html`. Only regular files under that folder are served, never a dotfile
//! or a path that leaves it (symbolic links are resolved and checked); paths that name
//! no file get `index.html`, since the app routes itself. The files hold no data, so they
//! are the only thing served without the token.

use anyhow::{bail, Context, Result};
use axum::body::Body;
use axum::http::{header, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use std::path::{Path, PathBuf};

/// Largest bundle file served.
const MAX_FILE_BYTES: u64 = 64 << 20;

/// The editor bundle's folder, resolved.
#[derive(Debug, Clone)]
pub struct Bundle {
    dir: PathBuf,
}

fn holds_index(dir: &Path) -> bool {
    std::fs::metadata(dir.join("index.html")).is_ok_and(|m| m.is_file())
}

/// The bundle beside a cargo-built binary: `<target>/editor` where `<target>` holds
/// the binary's profile folder and cargo's `CACHEDIR.TAG`.
fn beside_binary() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let target = exe.parent()?.parent()?;
    let tagged = std::fs::metadata(target.join("CACHEDIR.TAG")).is_ok_and(|m| m.is_file());
    let dir = target.join("editor");
    (tagged && holds_index(&dir)).then_some(dir)
}

/// The bundle asked for (which must hold `index.html`), or else the one beside a cargo
/// build; None serves the plain page instead.
pub fn find(asked: Option<&Path>) -> Result<Option<Bundle>> {
    let dir = match asked {
        Some(dir) if holds_index(dir) => dir.to_path_buf(),
        Some(dir) => bail!(
            "--editor {}: no index.html there (build the bundle with `cargo xtask editor`)",
            dir.display()
        ),
        None => match beside_binary() {
            Some(dir) => dir,
            None => {
                tracing::warn!(
                    "the editor bundle is not built (`cargo xtask editor`): serving the API and a plain page"
                );
                return Ok(None);
            }
        },
    };
    let dir = dir
        .canonicalize()
        .with_context(|| format!("cannot resolve {}", dir.display()))?;
    Ok(Some(Bundle { dir }))
}

/// Decodes `%XX` escapes; None for a malformed escape or bytes that are not UTF-8.
fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// The content type of a bundle file.
fn content_type(path: &Path) -> &'static str {
    match path.extension().and_then(|e| e.to_str()) {
        Some("html") => "text/html; charset=utf-8",
        Some("js" | "mjs") => "text/javascript; charset=utf-8",
        Some("wasm") => "application/wasm",
        Some("css") => "text/css; charset=utf-8",
        Some("json" | "map") => "application/json",
        Some("svg") => "image/svg+xml",
        Some("png") => "image/png",
        Some("ico") => "image/x-icon",
        Some("txt") => "text/plain; charset=utf-8",
        _ => "application/octet-stream",
    }
}

/// What a request path resolves to.
enum Resolved {
    /// A file of the bundle.
    File(PathBuf),
    /// A path the bundle refuses (a dotfile, an escape, a bad encoding).
    Refused,
    /// No such file: the app's page.
    Index,
}

impl Bundle {
    /// Resolves a request path inside the bundle.
    fn resolve(&self, path: &str) -> Resolved {
        let Some(decoded) = percent_decode(path) else {
            return Resolved::Refused;
        };
        let mut file = self.dir.clone();
        for segment in decoded.split('/').filter(|s| !s.is_empty()) {
            if segment.starts_with('.') || segment.contains(['\\', '\0']) {
                return Resolved::Refused;
            }
            file.push(segment);
        }
        match file.canonicalize() {
            Ok(real) if real.starts_with(&self.dir) && real.is_file() => Resolved::File(real),
            Ok(real) if !real.starts_with(&self.dir) => Resolved::Refused,
            _ => Resolved::Index,
        }
    }

    /// Reads what a request path names: a bundle file or `index.html`.
    fn read(&self, path: &str) -> Result<(PathBuf, Vec<u8>), StatusCode> {
        let file = match self.resolve(path) {
            Resolved::File(f) => f,
            Resolved::Refused => return Err(StatusCode::NOT_FOUND),
            Resolved::Index => self.dir.join("index.html"),
        };
        match crate::files::read_bounded(&file, MAX_FILE_BYTES) {
            Ok(bytes) => Ok((file, bytes)),
            Err(e) => {
                tracing::warn!("the editor file {} cannot be served: {e}", file.display());
                Err(StatusCode::NOT_FOUND)
            }
        }
    }

    /// Serves a request for a bundle file. Browsers revalidate every file, so a rebuilt
    /// bundle is picked up at once.
    pub async fn serve(self, uri: Uri) -> Response {
        let path = uri.path().to_string();
        let read = tokio::task::spawn_blocking(move || self.read(&path)).await;
        match read {
            Ok(Ok((file, bytes))) => (
                [
                    (
                        header::CONTENT_TYPE,
                        HeaderValue::from_static(content_type(&file)),
                    ),
                    (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
                    (
                        header::X_CONTENT_TYPE_OPTIONS,
                        HeaderValue::from_static("nosniff"),
                    ),
                ],
                Body::from(bytes),
            )
                .into_response(),
            Ok(Err(status)) => super::error::AppError::new(status, "no such file").into_response(),
            Err(_) => super::error::AppError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "the editor file could not be read",
            )
            .into_response(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_regular_non_dot_files_inside_the_bundle_are_served() {
        let root = std::env::temp_dir().join(format!("sluice-bundle-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let dir = root.join("editor");
        std::fs::create_dir_all(dir.join("pkg")).unwrap();
        std::fs::write(dir.join("index.html"), "index").unwrap();
        std::fs::write(dir.join("pkg/app.wasm"), "wasm").unwrap();
        std::fs::write(dir.join(".env"), "secret").unwrap();
        std::fs::write(root.join("outside.txt"), "outside").unwrap();
        #[cfg(unix)]
        std::os::unix::fs::symlink(root.join("outside.txt"), dir.join("link.txt")).unwrap();
        let b = find(Some(&dir)).unwrap().unwrap();
        let body = |p: &str| {
            b.read(p)
                .map(|(_, bytes)| String::from_utf8(bytes).unwrap())
        };
        assert_eq!(body("/"), Ok("index".into()));
        assert_eq!(body("/pkg/app.wasm"), Ok("wasm".into()));
        assert_eq!(body("/pkg%2Fapp.wasm"), Ok("wasm".into()));
        assert_eq!(body("/some/app/route"), Ok("index".into()));
        for refused in [
            "/.env",
            "/%2eenv",
            "/../outside.txt",
            "/pkg/%2e%2e/%2e%2e/outside.txt",
            "/%ff",
            "/%2",
            "/link.txt",
        ] {
            assert_eq!(body(refused), Err(StatusCode::NOT_FOUND), "{refused}");
        }
        assert!(find(Some(&root)).is_err(), "a folder without index.html");
        let _ = std::fs::remove_dir_all(&root);
    }
}
