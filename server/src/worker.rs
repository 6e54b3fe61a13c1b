//! `sluice worker`: joins a server over WebSocket (`wss://` with rustls, or `ws://` on
//! trusted networks), offers this machine's adapter (and its calibrated rates), compiles
//! the stage plans it is given and computes their micro-batches through the engine's
//! execution seam, and reconnects with backoff when the connection drops.
//!
//! The worker never trusts its server: a plan is checked for consistency and size before
//! it is compiled, the tensors a message announces are checked against the stage before
//! their frames are read, every read has a size bound and every wait within a request a
//! timeout, the stages kept loaded are bounded in number and bytes, and any request it
//! cannot serve is answered with an error, never a crash.

use anyhow::{bail, Context, Result};
use futures_util::{SinkExt, StreamExt};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;
use sluice_api::protocol::{self, TensorHeader, ToServer, ToWorker, PROTOCOL};
use sluice_engine::exec::device::{Executable, TraceContext, Values};
use sluice_engine::gpu::{GpuContext, GpuExecutable};
use sluice_engine::limits::Limits;
use sluice_engine::plan::Plan;
use sluice_engine::telemetry::{now_ns, Event};
use sluice_engine::weights::Weights;
use sluice_engine::Tensor;
use std::collections::VecDeque;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::Connector;

/// Arguments of `sluice worker`.
#[derive(clap::Args, Debug)]
pub struct WorkerArgs {
    /// The server, as wss://HOST:PORT (TLS) or ws://HOST:PORT (cleartext: loopback and
    /// trusted networks only); the path /api/workers is added.
    #[arg(long)]
    pub connect: String,
    /// The server's token.
    #[arg(long, env = "SLUICE_TOKEN")]
    pub token: Option<String>,
    /// Name shown by the server (default: the host name).
    #[arg(long)]
    pub name: Option<String>,
    /// PEM file of the certificate authorities to trust for wss:// instead of the system's
    /// roots (for a server with a self-signed certificate).
    #[arg(long)]
    pub tls_ca: Option<PathBuf>,
    /// Device memory the loaded stages may take together, in bytes: a larger stage is
    /// refused, older stages are unloaded to make room.
    #[arg(long, default_value_t = 4 << 30)]
    pub max_bytes: u64,
    /// Stages kept loaded at once; loading one more unloads the least recently used.
    #[arg(long, default_value_t = 16)]
    pub max_jobs: usize,
    /// The engine's limits every stage plan is checked against (as the server's own
    /// plans are; a server started with larger limits needs workers started with them).
    #[command(flatten)]
    pub limits: crate::limits::LimitArgs,
}

/// The largest control message (a stage's plan) the worker reads, in bytes.
const MAX_CONTROL_BYTES: u64 = 64 << 20;

/// How long connecting (TCP, TLS, WebSocket handshake) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long the frames a message announces may take to arrive, and a message to leave,
/// each.
const FRAME_TIMEOUT: Duration = Duration::from_secs(60);

/// Idle time after which the worker pings the server; as long again without a word from
/// it and the connection counts as dead.
const KEEPALIVE: Duration = Duration::from_secs(60);

/// The largest certificate file read, in bytes.
const MAX_PEM_BYTES: u64 = 1 << 20;

/// How a connection ended.
enum End {
    /// The server refused the worker (for example, another protocol version).
    Refused(String),
    /// The connection closed; reconnect.
    Closed,
}

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// Where to connect: the `/api/workers` address and, for `wss://`, the TLS settings.
struct Endpoint {
    url: String,
    tls: Option<Arc<rustls::ClientConfig>>,
}

/// Whether a URL host (`localhost`, `127.0.0.1`, `[::1]`) is this machine.
fn is_loopback(host: &str) -> bool {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    bare.eq_ignore_ascii_case("localhost")
        || bare.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// The trust roots for `wss://`: the certificates of `ca` (PEM), or the system's.
fn roots(ca: Option<&Path>) -> Result<rustls::RootCertStore> {
    let mut roots = rustls::RootCertStore::empty();
    match ca {
        Some(path) => {
            // Checked on the opened file too: a FIFO swapped in after a check is never
            // waited on.
            let pem = crate::files::read_bounded(path, MAX_PEM_BYTES).with_context(|| {
                format!(
                    "--tls-ca {}: not a PEM file of at most {MAX_PEM_BYTES} bytes",
                    path.display()
                )
            })?;
            for cert in CertificateDer::pem_slice_iter(&pem) {
                let cert =
                    cert.with_context(|| format!("--tls-ca {}: not a PEM file", path.display()))?;
                roots.add(cert).with_context(|| {
                    format!("--tls-ca {}: a certificate is invalid", path.display())
                })?;
            }
            if roots.is_empty() {
                bail!("--tls-ca {}: no certificate in it", path.display());
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            let (added, _) = roots.add_parsable_certificates(found.certs);
            if added == 0 {
                bail!(
                    "no system root certificates were found ({} errors); pass --tls-ca FILE",
                    found.errors.len()
                );
            }
        }
    }
    Ok(roots)
}

/// Works out where to connect from `--connect` and `--tls-ca`, warning when tensors and
/// the token would cross a network in cleartext.
fn endpoint(args: &WorkerArgs) -> Result<Endpoint> {
    let base = args.connect.trim_end_matches('/');
    let url = if base.ends_with("/api/workers") {
        base.to_string()
    } else {
        format!("{base}/api/workers")
    };
    let req = url
        .as_str()
        .into_client_request()
        .with_context(|| format!("'{url}' is not a ws:// or wss:// address"))?;
    let host = req.uri().host().unwrap_or_default().to_string();
    let tls = match req.uri().scheme_str() {
        Some("wss") => {
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let config = rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .context("TLS set-up")?
                .with_root_certificates(roots(args.tls_ca.as_deref())?)
                .with_no_client_auth();
            Some(Arc::new(config))
        }
        Some("ws") => {
            if args.tls_ca.is_some() {
                bail!("--tls-ca needs a wss:// address, not '{url}'");
            }
            if !is_loopback(&host) {
                tracing::warn!(
                    "connecting to {host} without TLS: the token and every tensor cross the network in cleartext; use wss:// unless the network is trusted"
                );
            }
            None
        }
        _ => bail!("'{url}' is not a ws:// or wss:// address"),
    };
    Ok(Endpoint { url, tls })
}

/// Runs the worker until the server refuses it or the process is stopped.
pub fn worker(args: &WorkerArgs) -> Result<ExitCode> {
    let endpoint = endpoint(args)?;
    let ctx = pollster::block_on(GpuContext::new()).context("the worker needs a GPU adapter")?;
    let adapters = pollster::block_on(sluice_engine::gpu::context::list_adapters());
    let rates = match crate::rates::rates_for(&ctx, false) {
        Ok(r) => Some(r),
        Err(e) => {
            eprintln!("sluice worker: calibration failed ({e:#}); the server will assume rates");
            None
        }
    };
    let name = args
        .name
        .clone()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "worker".into());
    let hello = ToServer::Hello {
        protocol: PROTOCOL,
        name,
        adapters,
        rates,
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let mut backoff = Duration::from_millis(500);
        loop {
            let mut jobs = Jobs::new(args.max_jobs, args.max_bytes, args.limits.0.clone());
            match serve(&endpoint, args, &hello, &ctx, &mut jobs).await {
                Ok(End::Refused(e)) => bail!("the server refused this worker: {e}"),
                Ok(End::Closed) => {
                    eprintln!("sluice worker: the connection closed; reconnecting");
                    backoff = Duration::from_millis(500);
                }
                Err(e) => eprintln!(
                    "sluice worker: {e:#}; retrying in {:.1} s",
                    backoff.as_secs_f64()
                ),
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(10));
        }
    })
}

/// Opens the WebSocket, reading messages of at most the larger of a plan's and a stage's
/// bytes.
async fn open(endpoint: &Endpoint, token: Option<&str>, max_bytes: u64) -> Result<Socket> {
    let mut req = endpoint.url.as_str().into_client_request()?;
    if let Some(t) = token {
        req.headers_mut()
            .insert("Authorization", format!("Bearer {t}").parse()?);
    }
    let largest = usize::try_from(max_bytes.max(MAX_CONTROL_BYTES)).unwrap_or(usize::MAX);
    let config = WebSocketConfig::default()
        .max_message_size(Some(largest))
        .max_frame_size(Some(largest));
    let connector = match &endpoint.tls {
        Some(c) => Connector::Rustls(c.clone()),
        None => Connector::Plain,
    };
    let connecting =
        tokio_tungstenite::connect_async_tls_with_config(req, Some(config), true, Some(connector));
    let (socket, _) = tokio::time::timeout(CONNECT_TIMEOUT, connecting)
        .await
        .map_err(|_| anyhow::anyhow!("no answer within {} s", CONNECT_TIMEOUT.as_secs()))?
        .with_context(|| format!("cannot connect to {}", endpoint.url))?;
    Ok(socket)
}

/// Sends one message; a server that stops reading for [`FRAME_TIMEOUT`] ends the
/// connection.
async fn put(socket: &mut Socket, msg: Message) -> Result<()> {
    tokio::time::timeout(FRAME_TIMEOUT, socket.send(msg))
        .await
        .map_err(|_| {
            anyhow::anyhow!(
                "the server stopped reading for {} s",
                FRAME_TIMEOUT.as_secs()
            )
        })?
        .context("sending to the server")
}

async fn send(socket: &mut Socket, msg: &ToServer) -> Result<()> {
    put(socket, Message::Text(serde_json::to_string(msg)?.into())).await
}

async fn send_error(socket: &mut Socket, job: Option<String>, error: String) -> Result<()> {
    send(socket, &ToServer::Error { job, error }).await
}

/// One connection: hello, then the server's requests until it closes.
async fn serve(
    endpoint: &Endpoint,
    args: &WorkerArgs,
    hello: &ToServer,
    ctx: &GpuContext,
    jobs: &mut Jobs<GpuExecutable>,
) -> Result<End> {
    let mut socket = open(endpoint, args.token.as_deref(), args.max_bytes).await?;
    send(&mut socket, hello).await?;
    let mut pinged = false;
    loop {
        let msg = match tokio::time::timeout(KEEPALIVE, socket.next()).await {
            Err(_) if pinged => bail!("the server said nothing for {} s", 2 * KEEPALIVE.as_secs()),
            Err(_) => {
                put(&mut socket, Message::Ping(Vec::new().into())).await?;
                pinged = true;
                continue;
            }
            Ok(None) => return Ok(End::Closed),
            Ok(Some(msg)) => msg.context("reading from the server")?,
        };
        pinged = false;
        let text = match msg {
            Message::Text(t) if t.len() as u64 <= MAX_CONTROL_BYTES => t,
            Message::Text(t) => {
                let e = format!(
                    "a message of {} bytes is over the {MAX_CONTROL_BYTES} this worker reads",
                    t.len()
                );
                send_error(&mut socket, None, e).await?;
                continue;
            }
            Message::Close(_) => return Ok(End::Closed),
            Message::Ping(_) | Message::Pong(_) | Message::Frame(_) => continue,
            Message::Binary(_) => {
                let e = "a tensor frame that no message announced".to_string();
                send_error(&mut socket, None, e).await?;
                continue;
            }
        };
        let request = match serde_json::from_str::<ToWorker>(&text) {
            Ok(r) => r,
            Err(e) => {
                send_error(&mut socket, None, format!("unreadable message: {e}")).await?;
                continue;
            }
        };
        match request {
            ToWorker::Welcome { worker } => eprintln!(
                "sluice worker: joined {} as {worker} on {}",
                endpoint.url, ctx.adapter.name
            ),
            ToWorker::Refused { error } => return Ok(End::Refused(error)),
            ToWorker::Load {
                job,
                plan,
                weights,
                stage,
            } => {
                let answer = match load(&mut socket, ctx, jobs, &job, plan, &weights, stage).await?
                {
                    Ok(()) => ToServer::Loaded { job },
                    Err(error) => ToServer::Error {
                        job: Some(job),
                        error,
                    },
                };
                send(&mut socket, &answer).await?;
            }
            ToWorker::Compute {
                job,
                micro_batch,
                inputs,
            } => match compute(&mut socket, jobs, &job, micro_batch, &inputs).await? {
                Ok((outputs, events)) => {
                    let (headers, frames) = protocol::encode(&outputs);
                    let result = ToServer::Result {
                        job,
                        micro_batch,
                        outputs: headers,
                        events,
                    };
                    send(&mut socket, &result).await?;
                    for f in frames {
                        put(&mut socket, Message::Binary(f.into())).await?;
                    }
                }
                Err(error) => send_error(&mut socket, Some(job), error).await?,
            },
            ToWorker::Unload { job } => jobs.remove(&job),
        }
    }
}

/// Reads the frames of the tensors a message announced, checked against the `expected`
/// ones before any is read. When the announcement is wrong the frames are still read (and
/// dropped), so the connection stays in step, and the answer is the error. `Err` means
/// the connection failed (a frame did not come in time, or something else came).
async fn read_tensors(
    socket: &mut Socket,
    expected: Result<Vec<TensorHeader>, String>,
    got: &[TensorHeader],
    what: &str,
    max_bytes: u64,
) -> Result<Result<Values, String>> {
    let sizes = expected.and_then(|want| {
        let sizes = protocol::expect_tensors(&want, got, what)?;
        let total = sizes
            .iter()
            .try_fold(0u64, |t, &b| t.checked_add(b as u64))
            .filter(|&t| t <= max_bytes);
        match total {
            Some(_) => Ok(sizes),
            None => Err(format!("the {what} are over the {max_bytes} bytes allowed")),
        }
    });
    let mut values = Values::new();
    let mut problem = sizes.as_ref().err().cloned();
    for (i, h) in got.iter().enumerate() {
        let frame = match tokio::time::timeout(FRAME_TIMEOUT, socket.next()).await {
            Ok(Some(Ok(Message::Binary(b)))) => b,
            Ok(Some(Ok(_))) => bail!(
                "the server sent something else where the tensor '{}' was due",
                h.name
            ),
            Ok(Some(Err(e))) => return Err(e).context("reading a tensor from the server"),
            Ok(None) => bail!("the server closed the connection mid-message"),
            Err(_) => bail!(
                "the tensor '{}' did not come within {} s",
                h.name,
                FRAME_TIMEOUT.as_secs()
            ),
        };
        if problem.is_some() {
            continue;
        }
        let decoded = match &sizes {
            Ok(s) if s.get(i) == Some(&frame.len()) => protocol::decode(h, &frame),
            _ => Err(format!(
                "the frame of '{}' has {} bytes, not the announced size",
                h.name,
                frame.len()
            )),
        };
        match decoded {
            Ok(t) => {
                values.insert(h.name.clone(), t);
            }
            Err(e) => problem = Some(e),
        }
    }
    Ok(match problem {
        Some(e) => Err(e),
        None => Ok(values),
    })
}

/// A `load`: the plan checked, its weights read against the plan's, room made, the stage
/// compiled. The inner `Err` is the answer to send; the outer one ends the connection.
async fn load(
    socket: &mut Socket,
    ctx: &GpuContext,
    jobs: &mut Jobs<GpuExecutable>,
    job: &str,
    plan: serde_json::Value,
    weights: &[TensorHeader],
    stage: usize,
) -> Result<Result<(), String>> {
    let checked = serde_json::from_value::<Plan>(plan)
        .map_err(|e| format!("the stage plan is not readable: {e}"))
        .and_then(|p| {
            let bytes = protocol::check_plan(&p, &jobs.limits, jobs.max_bytes)
                .map_err(|e| format!("the stage plan is not valid: {e}"))?;
            Ok((p, bytes))
        });
    let expected = match &checked {
        Ok((p, _)) => protocol::plan_tensors(p, &p.params),
        Err(e) => Err(e.clone()),
    };
    let tensors =
        match read_tensors(socket, expected, weights, "stage's weights", jobs.max_bytes).await? {
            Ok(t) => t,
            Err(e) => return Ok(Err(e)),
        };
    let Ok((plan, bytes)) = checked else {
        return Ok(Err("internal: a refused plan passed".into()));
    };
    jobs.remove(job);
    jobs.make_room(bytes);
    let inputs = match protocol::plan_tensors(&plan, &plan.inputs) {
        Ok(i) => i,
        Err(e) => return Ok(Err(e)),
    };
    let weights: Weights = tensors.into_iter().collect();
    let compiled = guarded("compiling the stage", || {
        pollster::block_on(GpuExecutable::compile(ctx, plan, &weights, 1))
            .map_err(|e| e.to_string())
    });
    Ok(compiled.map(|exe| {
        jobs.insert(Job {
            id: job.to_string(),
            exe,
            stage,
            bytes,
            inputs,
        })
    }))
}

/// Runs engine work, turning a panic (an engine bug a hostile plan reached) into an
/// answer instead of the worker's end.
fn guarded<T>(what: &str, work: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)).unwrap_or_else(|_| {
        tracing::error!("the engine panicked {what}; the request is refused");
        Err(format!(
            "the worker's engine failed {what} (see the worker's log)"
        ))
    })
}

type Computed = (Vec<(String, Tensor)>, Vec<Event>);

/// A `compute`: the job found, its inputs read against the stage's, the micro-batch
/// computed (event times relative to the request's arrival). The inner `Err` is the
/// answer to send; the outer one ends the connection.
async fn compute(
    socket: &mut Socket,
    jobs: &mut Jobs<GpuExecutable>,
    job: &str,
    m: usize,
    inputs: &[TensorHeader],
) -> Result<Result<Computed, String>> {
    let max_bytes = jobs.max_bytes;
    let expected = jobs
        .get(job)
        .map(|j| j.inputs.clone())
        .ok_or_else(|| format!("job '{job}' is not loaded here"));
    let values = match read_tensors(socket, expected, inputs, "stage's inputs", max_bytes).await? {
        Ok(v) => v,
        Err(e) => return Ok(Err(e)),
    };
    let Some(job_entry) = jobs.get(job) else {
        return Ok(Err(format!("job '{job}' is not loaded here")));
    };
    let stage = job_entry.stage;
    let exe = &mut job_entry.exe;
    Ok(guarded("computing a micro-batch", || {
        let trace = TraceContext {
            device: stage,
            stage,
            ..TraceContext::new(job, now_ns())
        };
        let mut events = Vec::new();
        exe.submit(
            m,
            sluice_engine::exec::input::owned(values),
            &trace,
            &mut events,
        )
        .map_err(|e| e.to_string())?;
        let (_, outs) =
            pollster::block_on(exe.complete(&trace, &mut events)).map_err(|e| e.to_string())?;
        let mut outs: Vec<(String, Tensor)> = outs.into_iter().collect();
        outs.sort_by(|a, b| a.0.cmp(&b.0));
        Ok((outs, events))
    }))
}

/// A loaded stage.
struct Job<E> {
    id: String,
    exe: E,
    stage: usize,
    /// Device bytes its buffers take.
    bytes: u64,
    /// The inputs a micro-batch must bring.
    inputs: Vec<TensorHeader>,
}

/// The loaded stages, least recently used first, held to a count and a byte total.
struct Jobs<E> {
    list: VecDeque<Job<E>>,
    max_jobs: usize,
    max_bytes: u64,
    /// What each plan is checked against.
    limits: Limits,
}

impl<E> Jobs<E> {
    fn new(max_jobs: usize, max_bytes: u64, limits: Limits) -> Jobs<E> {
        Jobs {
            list: VecDeque::new(),
            max_jobs: max_jobs.max(1),
            max_bytes,
            limits,
        }
    }

    /// A loaded job, now the most recently used.
    fn get(&mut self, id: &str) -> Option<&mut Job<E>> {
        let i = self.list.iter().position(|j| j.id == id)?;
        let job = self.list.remove(i)?;
        self.list.push_back(job);
        self.list.back_mut()
    }

    fn remove(&mut self, id: &str) {
        self.list.retain(|j| j.id != id);
    }

    /// Unloads the least recently used jobs until one more of `bytes` fits (the caller
    /// has checked that `bytes` alone is within the bound).
    fn make_room(&mut self, bytes: u64) {
        let used = |list: &VecDeque<Job<E>>| list.iter().map(|j| j.bytes).sum::<u64>();
        while !self.list.is_empty()
            && (self.list.len() >= self.max_jobs
                || used(&self.list).saturating_add(bytes) > self.max_bytes)
        {
            if let Some(old) = self.list.pop_front() {
                tracing::info!("unloading job '{}' to make room", old.id);
            }
        }
    }

    fn insert(&mut self, job: Job<E>) {
        self.list.push_back(job);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(id: &str, bytes: u64) -> Job<()> {
        Job {
            id: id.into(),
            exe: (),
            stage: 0,
            bytes,
            inputs: Vec::new(),
        }
    }

    fn ids(jobs: &Jobs<()>) -> Vec<&str> {
        jobs.list.iter().map(|j| j.id.as_str()).collect()
    }

    #[test]
    fn jobs_are_held_to_a_count_and_bytes_least_recently_used_first() {
        let mut jobs = Jobs::new(2, 100, Limits::default());
        for (id, bytes) in [("a", 10), ("b", 10)] {
            jobs.make_room(bytes);
            jobs.insert(job(id, bytes));
        }
        assert!(jobs.get("a").is_some(), "a is now the most recent");
        jobs.make_room(10);
        jobs.insert(job("c", 10));
        assert_eq!(ids(&jobs), ["a", "c"], "b, the least recently used, went");
        jobs.make_room(95);
        jobs.insert(job("d", 95));
        assert_eq!(ids(&jobs), ["d"], "both went to fit 95 of 100 bytes");
        assert!(jobs.get("a").is_none());
        jobs.remove("d");
        assert!(jobs.list.is_empty());
    }

    #[test]
    fn addresses_are_checked_and_cleartext_is_only_for_ws() {
        let args = |connect: &str, ca: Option<&str>| WorkerArgs {
            connect: connect.into(),
            token: None,
            name: None,
            tls_ca: ca.map(PathBuf::from),
            max_bytes: 1 << 20,
            max_jobs: 1,
            limits: crate::limits::LimitArgs::default(),
        };
        let e = endpoint(&args("ws://127.0.0.1:1/", None)).unwrap();
        assert_eq!(e.url, "ws://127.0.0.1:1/api/workers");
        assert!(e.tls.is_none());
        assert!(endpoint(&args("http://127.0.0.1:1", None)).is_err());
        assert!(endpoint(&args("not an address", None)).is_err());
        let e = endpoint(&args("ws://127.0.0.1:1", Some("ca.pem")))
            .err()
            .unwrap();
        assert!(e.to_string().contains("needs a wss://"), "{e}");
        let e = endpoint(&args("wss://127.0.0.1:1", Some("/dev/zero")))
            .err()
            .unwrap();
        assert!(format!("{e:#}").contains("not a PEM file"), "{e:#}");
        let dir = std::env::temp_dir().join(format!("sluice-ca-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ca = dir.join("ca.pem");
        std::fs::write(&ca, tls::CA).unwrap();
        let e = endpoint(&args("wss://localhost:1", ca.to_str())).unwrap();
        assert!(e.tls.is_some());
        std::fs::write(&ca, "no certificate here").unwrap();
        assert!(endpoint(&args("wss://localhost:1", ca.to_str())).is_err());
        assert!(is_loopback("[::1]") && is_loopback("localhost") && is_loopback("127.0.0.9"));
        assert!(!is_loopback("example.org") && !is_loopback("10.0.0.1"));
    }

    #[test]
    fn a_wss_server_with_a_self_signed_certificate_is_reached_with_tls_ca() {
        let dir = std::env::temp_dir().join(format!("sluice-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ca = dir.join("ca.pem");
        std::fs::write(&ca, tls::CA).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let port = listener.local_addr().unwrap().port();
            let server = tokio::spawn(async move {
                let (tcp, _) = listener.accept().await.unwrap();
                let tls = tokio_rustls::TlsAcceptor::from(tls::server_config())
                    .accept(tcp)
                    .await
                    .unwrap();
                let mut ws = tokio_tungstenite::accept_async(tls).await.unwrap();
                let hello = ws.next().await.unwrap().unwrap();
                hello.into_text().unwrap().to_string()
            });
            let args = WorkerArgs {
                connect: format!("wss://localhost:{port}"),
                token: Some("tok".into()),
                name: None,
                tls_ca: Some(ca.clone()),
                max_bytes: 1 << 20,
                max_jobs: 1,
                limits: crate::limits::LimitArgs::default(),
            };
            let endpoint = endpoint(&args).unwrap();
            let mut socket = open(&endpoint, Some("tok"), 1 << 20).await.unwrap();
            socket
                .send(Message::Text("{\"type\":\"loaded\",\"job\":\"j\"}".into()))
                .await
                .unwrap();
            assert!(server.await.unwrap().contains("loaded"));
            // Without the CA, the system's roots do not trust the certificate.
            let untrusted = WorkerArgs {
                tls_ca: None,
                ..args
            };
            if let Ok(e) = super::endpoint(&untrusted) {
                assert!(open(&e, None, 1 << 20).await.is_err());
            }
        });
    }

    /// A test certificate authority and a certificate it signed for `localhost` and
    /// 127.0.0.1 (valid until 2126; in `tests/data/tls`), for TLS tests only.
    pub(crate) mod tls {
        use std::sync::Arc;

        pub const CA: &str = include_str!("../../tests/data/tls/ca.pem");
        const CERT: &str = include_str!("../../tests/data/tls/server.pem");
        const KEY: &str = include_str!("../../tests/data/tls/server.key");

        pub fn server_config() -> Arc<rustls::ServerConfig> {
            use rustls_pki_types::pem::PemObject;
            let certs = rustls_pki_types::CertificateDer::pem_slice_iter(CERT.as_bytes())
                .collect::<Result<Vec<_>, _>>()
                .unwrap();
            let key = rustls_pki_types::PrivateKeyDer::from_pem_slice(KEY.as_bytes()).unwrap();
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            Arc::new(
                rustls::ServerConfig::builder_with_provider(provider)
                    .with_safe_default_protocol_versions()
                    .unwrap()
                    .with_no_client_auth()
                    .with_single_cert(certs, key)
                    .unwrap(),
            )
        }
    }
}
