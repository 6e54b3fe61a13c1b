//! `sluice serve`: the HTTP server — workspace (locked, written durably), run history,
//! run queue with an in-process worker on the local adapter, JSON API, live events over
//! WebSocket, Prometheus metrics, the editor bundle — behind one accept loop with
//! connection limits and timeouts, optional TLS, and guards on every request (host,
//! origin, token, content type). Binds 127.0.0.1 by default; any other address needs a
//! token. `docs/security.md` describes the threat model and every limit.

mod api;
mod body;
mod db;
mod editor;
mod error;
mod events;
mod guard;
mod listener;
mod metrics;
mod openapi;
mod page;
mod prepare;
mod runs;
mod state;
mod tls;
mod work;
mod workers;
mod workspace;

use anyhow::{bail, Context, Result};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

/// Arguments of `sluice serve`.
#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// Address to listen on (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:7878")]
    pub addr: SocketAddr,
    /// Workspace folder (graphs, run files, sluice.db); one server at a time may use it.
    #[arg(long, default_value = "sluice-workspace")]
    pub workspace: PathBuf,
    /// Bearer token required on every route but the editor's files (mandatory when not
    /// binding a loopback address).
    #[arg(long, env = "SLUICE_TOKEN")]
    pub token: Option<String>,
    /// Another name clients reach the server by, for the Host check (a proxy's name;
    /// NAME matches any port, NAME:PORT that port). Repeatable.
    #[arg(long = "allowed-host", value_name = "NAME")]
    pub allowed_hosts: Vec<String>,
    /// TLS certificate chain (PEM): serve https:// and wss://. Needs --tls-key.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// TLS private key (PEM) of --tls-cert.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Runs waiting at most; further requests get 429.
    #[arg(long, default_value_t = 64)]
    pub max_queued: usize,
    /// Runs executing at once.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    pub concurrency: u16,
    /// Compiled sessions kept for repeated runs (0: compile every run).
    #[arg(long, default_value_t = 8)]
    pub plan_cache: usize,
    /// Finished runs kept, with their files; older ones are deleted.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub keep_runs: u64,
    /// Largest request body, in bytes (at most 4 GiB - 1).
    #[arg(long, default_value_t = 16 << 20)]
    pub body_limit: u32,
    /// Bytes of request bodies held at once by all requests (at least --body-limit);
    /// further requests wait up to --body-timeout, then get 503.
    #[arg(long, default_value_t = 64 << 20)]
    pub body_budget: u32,
    /// Seconds a client has to send a request's headers (and to finish a TLS
    /// handshake); also how long an idle keep-alive connection stays open.
    #[arg(long, value_name = "SECONDS", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    pub header_timeout: u64,
    /// Seconds a client has to send a request's body; also how long a peer may accept
    /// no bytes of a response or WebSocket message before it is dropped.
    #[arg(long, value_name = "SECONDS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    pub body_timeout: u64,
    /// Connections at once; further ones are closed at once.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections: u32,
    /// Connections at once from one client (an IPv4 address or an IPv6 /64), counted
    /// from the moment they are accepted, so one client cannot hold every place; further
    /// ones from it are closed at once. Behind a proxy every client is the proxy: raise it
    /// to --max-connections there.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections_per_client: u32,
    /// Worker sockets at once; further workers get 503.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_workers: u32,
    /// Largest WebSocket message a worker may send, in bytes (a tensor travels as one;
    /// stages whose outputs are larger are not placed on workers).
    #[arg(long, default_value_t = 1 << 30)]
    pub max_worker_message: usize,
    /// Seconds a worker has to answer one request before its run fails and the worker
    /// is dropped.
    #[arg(long, value_name = "SECONDS", default_value_t = workers::REPLY_TIMEOUT.as_secs(), value_parser = clap::value_parser!(u64).range(1..))]
    pub worker_timeout: u64,
    /// Graph checks and run preparations at once (CPU work off the async runtime);
    /// further requests wait up to --body-timeout, then get 503.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..))]
    pub analysis_threads: u16,
    /// Most graphs stored in the workspace; storing a new one beyond gets 422.
    #[arg(long, default_value_t = 10_000)]
    pub max_graphs: usize,
    /// Bytes of messages a live run keeps for watchers who join late (later messages are
    /// only broadcast; the finished run's events file has them all).
    #[arg(long, default_value_t = 8 << 20)]
    pub event_backlog: usize,
    /// The editor bundle's folder (`cargo xtask editor` writes `target/editor`, which a
    /// cargo-built binary finds by itself).
    #[arg(long, env = "SLUICE_EDITOR", conflicts_with = "no_editor")]
    pub editor: Option<PathBuf>,
    /// Serve the API and a plain page listing graphs and runs, not the editor.
    #[arg(long)]
    pub no_editor: bool,
    /// The engine's limits on documents, graphs and runs.
    #[command(flatten)]
    pub limits: crate::limits::LimitArgs,
}

/// Resolves when the process is asked to stop (Ctrl-C, or SIGTERM on Unix).
async fn stop_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// Runs the server until interrupted.
pub fn serve(args: &ServeArgs) -> Result<ExitCode> {
    let token = args.token.clone().filter(|t| !t.is_empty());
    if !args.addr.ip().is_loopback() && token.is_none() {
        bail!(
            "binding {} (not a loopback address) requires --token (or SLUICE_TOKEN)",
            args.addr
        );
    }
    if args.body_budget < args.body_limit {
        bail!(
            "--body-budget ({}) must be at least --body-limit ({})",
            args.body_budget,
            args.body_limit
        );
    }
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(tls::acceptor(cert, key)?),
        _ => None,
    };
    let editor = if args.no_editor {
        None
    } else {
        editor::find(args.editor.as_deref())?
    };
    let (workspace, _lock) = workspace::Workspace::open(&args.workspace)?;
    let (db, leftover) = db::Db::open(&workspace.db_path())?;
    let db = Arc::new(db);
    let keep_runs = usize::try_from(args.keep_runs).unwrap_or(usize::MAX);
    runs::tidy(&db, &workspace, keep_runs)?;
    if leftover.interrupted > 0 || !leftover.queued.is_empty() {
        tracing::warn!(
            "the previous server left {} run(s) running (now failed) and {} queued (queued again)",
            leftover.interrupted,
            leftover.queued.len()
        );
    }
    let adapters = pollster::block_on(sluice_engine::gpu::context::list_adapters());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let timeout = Duration::from_secs(args.body_timeout);
    let served = rt.block_on(async move {
        let workers = Arc::new(workers::Workers::new(workers::WorkerLimits {
            max_workers: usize::try_from(args.max_workers).unwrap_or(usize::MAX),
            max_frame_bytes: args.max_worker_message,
            reply_timeout: Duration::from_secs(args.worker_timeout),
            ..workers::WorkerLimits::default()
        }));
        let runs = runs::Runs::start(
            db.clone(),
            workspace.clone(),
            workers.clone(),
            runs::RunSettings {
                max_queued: args.max_queued,
                concurrency: usize::from(args.concurrency),
                plan_cache: args.plan_cache,
                keep_runs,
                event_backlog: args.event_backlog,
                limits: args.limits.0.clone(),
            },
            leftover.queued,
        );
        let prepare = runs.clone();
        tokio::task::spawn_blocking(move || prepare.prepare_local());
        let listener = tokio::net::TcpListener::bind(args.addr)
            .await
            .with_context(|| format!("cannot listen on {}", args.addr))?;
        let local = listener.local_addr()?;
        let body_limit = usize::try_from(args.body_limit).unwrap_or(usize::MAX);
        let budget = usize::try_from(args.body_budget).unwrap_or(usize::MAX);
        let state = Arc::new(state::Shared {
            workspace,
            db,
            runs,
            gate: Arc::new(guard::Gate::new(
                local,
                tls.is_some(),
                &args.allowed_hosts,
                token,
            )?),
            bodies: body::Bodies::new(body_limit, timeout, budget),
            work: work::Work::new(usize::from(args.analysis_threads), timeout),
            limits: args.limits.0.clone(),
            max_graphs: args.max_graphs,
            adapters,
            workers,
            editor: editor.clone(),
        });
        println!(
            "sluice serving {}://{local} (workspace {}; {})",
            if tls.is_some() { "https" } else { "http" },
            args.workspace.display(),
            match &editor {
                Some(_) => "with the editor",
                None => "editor not built: run `cargo xtask editor`",
            }
        );
        use std::io::Write;
        let _ = std::io::stdout().flush();
        listener::serve(
            listener,
            api::router(state),
            listener::Settings {
                header_timeout: Duration::from_secs(args.header_timeout),
                stall_timeout: timeout,
                max_connections: usize::try_from(args.max_connections).unwrap_or(usize::MAX),
                max_connections_per_client: usize::try_from(args.max_connections_per_client)
                    .unwrap_or(usize::MAX),
                tls,
            },
            stop_signal(),
        )
        .await;
        Ok::<_, anyhow::Error>(())
    });
    // Runs still executing are not waited for: the next server fails them with a reason.
    rt.shutdown_timeout(Duration::from_secs(1));
    served?;
    Ok(ExitCode::SUCCESS)
}
