//! `sluice serve`: the axum server — workspace, run history, run queue with an in-process
//! worker on the local adapter, JSON API, live events over WebSocket, Prometheus metrics.
//! Binds 127.0.0.1 by default; any other address needs a token, which the API then
//! requires.

mod api;
mod db;
mod metrics;
mod openapi;
mod page;
mod runs;
mod state;
mod workers;
mod workspace;

use anyhow::{bail, Context, Result};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

/// Arguments of `sluice serve`.
#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// Address to listen on (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:7878")]
    pub addr: SocketAddr,
    /// Workspace folder (graphs, run outputs, sluice.db).
    #[arg(long, default_value = "sluice-workspace")]
    pub workspace: PathBuf,
    /// Bearer token required by the API (mandatory when not binding a loopback address).
    #[arg(long, env = "SLUICE_TOKEN")]
    pub token: Option<String>,
    /// Runs waiting at most; further requests get 429.
    #[arg(long, default_value_t = 64)]
    pub max_queued: usize,
    /// Runs executing at once.
    #[arg(long, default_value_t = 1)]
    pub concurrency: usize,
    /// Compiled sessions kept for repeated runs (0: compile every run).
    #[arg(long, default_value_t = 8)]
    pub plan_cache: usize,
    /// Largest request body, in bytes.
    #[arg(long, default_value_t = 16 << 20)]
    pub body_limit: usize,
    /// The editor bundle's folder (`cargo xtask editor` writes `target/editor`); by default
    /// `../editor` beside the binary's folder, i.e. `target/editor` for a cargo build.
    #[arg(long, env = "SLUICE_EDITOR", conflicts_with = "no_editor")]
    pub editor: Option<PathBuf>,
    /// Serve the API and a plain page listing graphs and runs, not the editor.
    #[arg(long)]
    pub no_editor: bool,
}

/// Where the editor bundle is: the folder asked for (which must hold `index.html`), or
/// else the default one when it was built; None serves a plain page instead.
fn editor_bundle(asked: Option<&PathBuf>) -> Result<Option<PathBuf>> {
    if let Some(dir) = asked {
        if !dir.join("index.html").is_file() {
            bail!(
                "--editor {}: no index.html there (build the bundle with `cargo xtask editor`)",
                dir.display()
            );
        }
        return Ok(Some(dir.clone()));
    }
    let default = std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.parent()?.join("editor")));
    match default {
        Some(dir) if dir.join("index.html").is_file() => Ok(Some(dir)),
        _ => {
            tracing::warn!(
                "the editor bundle is not built (`cargo xtask editor`): serving the API and a plain page"
            );
            Ok(None)
        }
    }
}

/// Runs the server until interrupted.
pub fn serve(args: &ServeArgs) -> Result<ExitCode> {
    if !args.addr.ip().is_loopback() && args.token.as_deref().is_none_or(str::is_empty) {
        bail!(
            "binding {} (not a loopback address) requires --token (or SLUICE_TOKEN)",
            args.addr
        );
    }
    let editor = if args.no_editor {
        None
    } else {
        editor_bundle(args.editor.as_ref())?
    };
    let workspace = workspace::Workspace::open(&args.workspace)?;
    let db = Arc::new(db::Db::open(&workspace.db_path())?);
    let adapters = pollster::block_on(sluice_engine::gpu::context::list_adapters());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    rt.block_on(async move {
        let workers = Arc::new(workers::Workers::default());
        let runs = runs::Runs::start(
            db.clone(),
            workspace.clone(),
            workers.clone(),
            args.max_queued,
            args.concurrency,
            args.plan_cache,
        );
        let prepare = runs.clone();
        tokio::task::spawn_blocking(move || prepare.prepare_local());
        let state = Arc::new(state::Shared {
            workspace,
            db,
            runs,
            token: args.token.clone().filter(|t| !t.is_empty()),
            body_limit: args.body_limit,
            adapters,
            workers,
            editor: editor.clone(),
        });
        let listener = tokio::net::TcpListener::bind(args.addr)
            .await
            .with_context(|| format!("cannot listen on {}", args.addr))?;
        let local = listener.local_addr()?;
        println!(
            "sluice serving http://{local} (workspace {}; {})",
            args.workspace.display(),
            match &editor {
                Some(dir) => format!("editor from {}", dir.display()),
                None => "editor not built: run `cargo xtask editor`".into(),
            }
        );
        use std::io::Write;
        let _ = std::io::stdout().flush();
        axum::serve(listener, api::router(state))
            .with_graceful_shutdown(async {
                let _ = tokio::signal::ctrl_c().await;
            })
            .await
            .context("the server failed")?;
        Ok::<_, anyhow::Error>(())
    })?;
    Ok(ExitCode::SUCCESS)
}
