//! Remote workers: the `WS /api/workers` endpoint, a registry of connected workers, one
//! actor per connection that sends requests and waits (with a timeout, watching the
//! run's cancel flag) for their answers, and a worker's stage as an execution device
//! ([`RemoteDevice`]): the engine's one driver runs remote stages like local ones, the
//! activations travelling through the server.
//!
//! The server never trusts a worker. The endpoint does its own WebSocket upgrade so that
//! every byte read from a worker is metered: before each read the actor grants the bytes
//! the message it waits for may have (a small hello, a control message, a tensor frame of
//! exactly the size the stage's plan gives it), and a worker that sends more loses its
//! connection before the excess is read. Answers are checked against the stage's plan
//! before their frames are read; anything malformed, oversized, unexpected or late ends
//! the connection, removes the worker from the registry at once, and fails only the run
//! that used it, with the reason.

use axum::body::Body;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::future::LocalBoxFuture;
use futures_util::{SinkExt, StreamExt};
use hyper_util::rt::TokioIo;
use sluice_api::protocol::{self, TensorHeader, ToServer, ToWorker, MAX_HELLO_BYTES, PROTOCOL};
use sluice_api::{ErrorBody, WorkerInfo};
use sluice_engine::exec::device::{CompileStats, Device, Executable, TraceContext, Values};
use sluice_engine::gpu::AdapterSummary;
use sluice_engine::plan::cost::Rates;
use sluice_engine::plan::{HalfStorage, Plan};
use sluice_engine::telemetry::{now_ns, Event, EventKind, TimingSource};
use sluice_engine::weights::Weights;
use sluice_engine::{RunError, Tensor};
use std::collections::{BTreeMap, VecDeque};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{mpsc, oneshot};
use tokio_tungstenite::tungstenite::error::ProtocolError;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_tungstenite::WebSocketStream;

type Tensors = Vec<(String, Tensor)>;

/// How long a worker may take to answer one request (compiling a stage or computing a
/// micro-batch) before the server gives up on it and drops the connection, unless
/// [`WorkerLimits::reply_timeout`] says otherwise.
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(300);

/// How long a new connection may take to send its `hello`.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// Bytes a worker may send while no request is in flight (a close frame, pings).
const IDLE_ALLOWANCE: u64 = 4 << 10;

/// Bytes granted besides a message's own: frame headers and interleaved control frames.
const FRAME_SLACK: u64 = 1 << 10;

/// How long closing a connection may wait for the worker.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// How often a request in flight looks at its run's cancel flag.
const CANCEL_POLL: Duration = Duration::from_millis(100);

/// Requests waiting for one worker at most; more are refused at once.
const QUEUE: usize = 16;

/// The longest worker error text kept (it becomes the run's stored reason).
const MAX_REASON: usize = 2000;

/// What the server accepts from workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkerLimits {
    /// Worker sockets open at once (registered or still saying hello); more get 503.
    pub max_workers: usize,
    /// How long a worker may take to answer one request.
    pub reply_timeout: Duration,
    /// The largest control message (an answer's headers, events, an error) a worker may
    /// send, in bytes.
    pub max_control_bytes: usize,
    /// The largest tensor a worker may send in one frame, in bytes: stages whose outputs
    /// are larger are not placed on workers.
    pub max_frame_bytes: usize,
}

impl Default for WorkerLimits {
    fn default() -> Self {
        WorkerLimits {
            max_workers: 64,
            reply_timeout: REPLY_TIMEOUT,
            max_control_bytes: 8 << 20,
            max_frame_bytes: 1 << 30,
        }
    }
}

/// Why a request to a worker got no answer.
#[derive(Debug)]
enum Failure {
    /// The run was cancelled while it waited.
    Cancelled,
    /// The worker failed it, or the connection ended (the reason).
    Failed(String),
}

type Reply<T> = oneshot::Sender<Result<T, Failure>>;

/// A request to a worker, with where to send the answer.
enum Request {
    Load {
        job: String,
        plan: serde_json::Value,
        weights: Tensors,
        stage: usize,
        cancel: Arc<AtomicBool>,
        reply: Reply<()>,
    },
    Compute {
        job: String,
        micro_batch: usize,
        inputs: Tensors,
        /// The stage's outputs, which the answer must carry.
        outputs: Arc<Vec<TensorHeader>>,
        cancel: Arc<AtomicBool>,
        reply: Reply<(Tensors, Vec<Event>)>,
    },
    Unload {
        job: String,
    },
}

/// A connected worker.
#[derive(Clone)]
pub struct WorkerHandle {
    /// Server-assigned id.
    pub id: String,
    /// Its name (host).
    pub name: String,
    /// Its adapters.
    pub adapters: Vec<AdapterSummary>,
    /// Its measured rates, when it calibrated.
    pub rates: Option<Rates>,
    limits: WorkerLimits,
    tx: mpsc::Sender<Request>,
}

impl WorkerHandle {
    /// What `/api/devices` shows about it.
    pub fn info(&self) -> WorkerInfo {
        WorkerInfo {
            id: self.id.clone(),
            kind: "remote".into(),
            name: Some(self.name.clone()),
            adapters: self.adapters.clone(),
            rates: self.rates,
            utilisation: Vec::new(),
            memory: None,
        }
    }

    /// Queues a request without waiting: a worker with [`QUEUE`] requests waiting is busy.
    fn request(&self, req: Request) -> Result<(), String> {
        self.tx.try_send(req).map_err(|e| match e {
            mpsc::error::TrySendError::Full(_) => {
                format!("{QUEUE} requests are already waiting for this worker")
            }
            mpsc::error::TrySendError::Closed(_) => "the worker disconnected".into(),
        })
    }
}

/// Connected workers, and the count of open worker sockets.
pub struct Workers {
    map: Mutex<BTreeMap<String, WorkerHandle>>,
    counter: AtomicU64,
    open: AtomicUsize,
    limits: WorkerLimits,
}

impl Default for Workers {
    fn default() -> Self {
        Workers::new(WorkerLimits::default())
    }
}

impl Workers {
    /// No workers yet; connections will be held to `limits`.
    pub fn new(limits: WorkerLimits) -> Workers {
        Workers {
            map: Mutex::new(BTreeMap::new()),
            counter: AtomicU64::new(0),
            open: AtomicUsize::new(0),
            limits,
        }
    }

    /// The connected workers, by id.
    pub fn list(&self) -> Vec<WorkerHandle> {
        self.map
            .lock()
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default()
    }

    /// Takes one of the [`WorkerLimits::max_workers`] socket slots, or None when all are
    /// taken.
    fn slot(self: &Arc<Self>) -> Option<Slot> {
        self.open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.limits.max_workers).then_some(n + 1)
            })
            .ok()
            .map(|_| Slot(self.clone()))
    }

    fn remove(&self, id: &str) {
        if let Ok(mut m) = self.map.lock() {
            m.remove(id);
        }
    }
}

/// An open worker socket's share of [`WorkerLimits::max_workers`], given back on drop.
struct Slot(Arc<Workers>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A worker's place in the registry, left however its connection ends.
struct Registration {
    workers: Arc<Workers>,
    id: String,
}

impl Registration {
    fn new(workers: &Arc<Workers>, h: WorkerHandle) -> Registration {
        let id = h.id.clone();
        if let Ok(mut m) = workers.map.lock() {
            m.insert(id.clone(), h);
        }
        Registration {
            workers: workers.clone(),
            id,
        }
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.workers.remove(&self.id);
    }
}

/// A connection's incoming bytes, metered: a read past the allowance fails, so the
/// WebSocket layer never takes in more of a worker's bytes than the message the server
/// waits for may have. Writes pass through.
struct Metered<S> {
    inner: S,
    allowance: u64,
}

/// The error a read past the allowance gives.
#[derive(Debug)]
struct Overdrawn;

impl std::fmt::Display for Overdrawn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the peer sent more bytes than allowed")
    }
}

impl std::error::Error for Overdrawn {}

impl<S: AsyncRead + Unpin> AsyncRead for Metered<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if this.allowance == 0 {
            return Poll::Ready(Err(std::io::Error::other(Overdrawn)));
        }
        let room = usize::try_from(this.allowance)
            .unwrap_or(usize::MAX)
            .min(buf.remaining());
        let n = {
            let mut part = ReadBuf::new(buf.initialize_unfilled_to(room));
            ready!(Pin::new(&mut this.inner).poll_read(cx, &mut part))?;
            part.filled().len()
        };
        buf.advance(n);
        this.allowance = this.allowance.saturating_sub(n as u64);
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Metered<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

type Socket<S> = WebSocketStream<Metered<S>>;

/// A JSON error response (the API's error body).
fn refuse(status: StatusCode, error: String) -> Response {
    let body = ErrorBody {
        error,
        status: status.as_u16(),
        problems: None,
    };
    (status, Json(body)).into_response()
}

/// Whether a header lists a token (comma-separated, any case).
fn lists(headers: &HeaderMap, name: header::HeaderName, token: &str) -> bool {
    headers.get_all(name).iter().any(|v| {
        v.to_str()
            .is_ok_and(|s| s.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
    })
}

/// `GET /api/workers`: checks the WebSocket handshake and takes a socket slot (503 when
/// [`WorkerLimits::max_workers`] are open), answers 101, and serves the connection as a
/// worker's once it is upgraded. Authentication and Host/Origin checks are the router's.
pub fn upgrade(mut req: axum::extract::Request, workers: Arc<Workers>) -> Response {
    let headers = req.headers();
    let key = headers
        .get(header::SEC_WEBSOCKET_KEY)
        .filter(|_| lists(headers, header::UPGRADE, "websocket"))
        .filter(|_| lists(headers, header::CONNECTION, "upgrade"))
        .filter(|_| {
            headers
                .get(header::SEC_WEBSOCKET_VERSION)
                .is_some_and(|v| v == "13")
        })
        .map(|k| derive_accept_key(k.as_bytes()));
    let (Some(accept_key), true) = (
        key,
        req.extensions()
            .get::<hyper::upgrade::OnUpgrade>()
            .is_some(),
    ) else {
        return refuse(
            StatusCode::BAD_REQUEST,
            "workers connect with a WebSocket upgrade (HTTP/1.1, version 13)".into(),
        );
    };
    let Some(slot) = workers.slot() else {
        return refuse(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "{} worker connections are open, the most this server takes (--max-workers)",
                workers.limits.max_workers
            ),
        );
    };
    let on_upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        match on_upgrade.await {
            Ok(upgraded) => {
                let socket = metered(TokioIo::new(upgraded), workers.limits).await;
                serve_worker(socket, workers, slot).await;
            }
            Err(e) => tracing::debug!("a worker's upgrade failed: {e}"),
        }
    });
    Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(header::CONNECTION, "upgrade")
        .header(header::UPGRADE, "websocket")
        .header(header::SEC_WEBSOCKET_ACCEPT, accept_key)
        .body(Body::empty())
        .unwrap_or_else(|e| refuse(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))
}

/// The server's end of an upgraded worker connection, metered from the first byte.
async fn metered<S>(io: S, limits: WorkerLimits) -> Socket<S>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let largest = limits.max_frame_bytes.max(limits.max_control_bytes);
    let config = WebSocketConfig::default()
        .max_message_size(Some(largest))
        .max_frame_size(Some(largest));
    let io = Metered {
        inner: io,
        allowance: 0,
    };
    WebSocketStream::from_raw_socket(io, Role::Server, Some(config)).await
}

/// What a failed read says about the worker.
fn describe(e: &WsError, allowance: u64, what: &str) -> String {
    match e {
        WsError::Io(io) if io.get_ref().is_some_and(|e| e.is::<Overdrawn>()) => {
            format!("sent more than the {allowance} bytes {what} may have")
        }
        WsError::Capacity(c) => format!("sent {what} over the size limit ({c})"),
        WsError::Protocol(ProtocolError::ResetWithoutClosingHandshake) => {
            "the worker disconnected (without a closing handshake)".into()
        }
        WsError::Protocol(p) => format!("broke the WebSocket protocol ({p})"),
        WsError::Utf8(_) => "sent a text message that is not UTF-8".into(),
        WsError::ConnectionClosed | WsError::AlreadyClosed => "the worker disconnected".into(),
        other => format!("the worker disconnected ({other})"),
    }
}

/// Reads the next data message, granting the worker `allowance` bytes for it (pings
/// included); `what` names it in errors.
async fn next_message<S>(
    socket: &mut Socket<S>,
    allowance: u64,
    what: &str,
) -> Result<Message, String>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    socket.get_mut().allowance = allowance;
    loop {
        match socket.next().await {
            Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
            Some(Ok(Message::Close(_))) | None => return Err("the worker disconnected".into()),
            Some(Ok(m)) => return Ok(m),
            Some(Err(e)) => return Err(describe(&e, allowance, what)),
        }
    }
}

/// Reads a control message of at most `limit` bytes.
async fn next_control<S>(
    socket: &mut Socket<S>,
    limit: usize,
    what: &str,
) -> Result<ToServer, String>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    match next_message(socket, limit as u64 + FRAME_SLACK, what).await? {
        Message::Text(t) if t.len() <= limit => serde_json::from_str(&t)
            .map_err(|e| format!("sent an unreadable message: {}", clip(&e.to_string(), 200))),
        Message::Text(t) => Err(format!(
            "sent {} bytes as {what}, over the {limit} allowed",
            t.len()
        )),
        _ => Err(format!("sent a tensor frame where {what} was due")),
    }
}

/// Reads the frame of a tensor whose header was checked: exactly `bytes` long.
async fn next_tensor<S>(
    socket: &mut Socket<S>,
    h: &TensorHeader,
    bytes: usize,
) -> Result<Tensor, String>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let what = format!("the tensor '{}'", h.name);
    match next_message(socket, bytes as u64 + FRAME_SLACK, &what).await? {
        Message::Binary(b) => protocol::decode(h, &b),
        _ => Err(format!("sent a control message where {what} was due")),
    }
}

async fn send_json<S>(socket: &mut Socket<S>, msg: &ToWorker) -> Result<(), String>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let text = serde_json::to_string(msg).map_err(|e| e.to_string())?;
    socket
        .send(Message::Text(text.into()))
        .await
        .map_err(|e| format!("sending to the worker failed ({e})"))
}

async fn send_tensors<S>(socket: &mut Socket<S>, frames: Vec<Vec<u8>>) -> Result<(), String>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    for f in frames {
        socket
            .send(Message::Binary(f.into()))
            .await
            .map_err(|e| format!("sending to the worker failed ({e})"))?;
    }
    Ok(())
}

/// At most `max` characters of a text.
fn clip(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((i, _)) => format!("{}...", &text[..i]),
        None => text.to_string(),
    }
}

/// The kind of a message, for errors.
fn kind(msg: &ToServer) -> &'static str {
    match msg {
        ToServer::Hello { .. } => "a hello",
        ToServer::Loaded { .. } => "'loaded'",
        ToServer::Result { .. } => "a result",
        ToServer::Error { .. } => "an error",
    }
}

/// The worker's own failure of a job, or a protocol violation when it names another job.
fn worker_error<T>(
    job: &str,
    named: Option<String>,
    error: &str,
) -> Result<Result<T, String>, String> {
    match named {
        Some(other) if other != job => Err(format!(
            "answered for job '{}' where job '{job}' was due",
            clip(&other, 64)
        )),
        _ => Ok(Err(format!(
            "the worker failed: {}",
            clip(error, MAX_REASON)
        ))),
    }
}

/// Runs one exchange with the worker and hands its answer (the worker's own error
/// included) to the requester. `Err` (the connection failed, the worker said something
/// unexpected or nothing within `timeout`, or the run was cancelled mid-request, which
/// would leave the worker's late answer in the stream) ends the connection.
async fn answer<T>(
    mut reply: Reply<T>,
    cancel: &AtomicBool,
    timeout: Duration,
    exchange: impl std::future::Future<Output = Result<Result<T, String>, String>>,
) -> Result<(), String> {
    if cancel.load(Ordering::Relaxed) {
        let _ = reply.send(Err(Failure::Cancelled));
        return Ok(());
    }
    let cancelled = async {
        while !cancel.load(Ordering::Relaxed) {
            tokio::time::sleep(CANCEL_POLL).await;
        }
    };
    let outcome = tokio::select! {
        r = tokio::time::timeout(timeout, exchange) => match r {
            Ok(r) => r,
            Err(_) => Err(format!("no answer within {} s", timeout.as_secs())),
        },
        () = cancelled => {
            let _ = reply.send(Err(Failure::Cancelled));
            return Err("its run was cancelled while a request was in flight".into());
        }
        () = reply.closed() => return Err("the run stopped waiting for an answer".into()),
    };
    match outcome {
        Ok(answer) => {
            let _ = reply.send(answer.map_err(Failure::Failed));
            Ok(())
        }
        Err(e) => {
            let _ = reply.send(Err(Failure::Failed(e.clone())));
            Err(e)
        }
    }
}

/// One request's exchange with the worker; `Err` ends the connection.
async fn exchange<S>(
    socket: &mut Socket<S>,
    req: Request,
    limits: &WorkerLimits,
) -> Result<(), String>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let control = limits.max_control_bytes;
    match req {
        Request::Load {
            job,
            plan,
            weights,
            stage,
            cancel,
            reply,
        } => {
            let r = async {
                let (headers, frames) = protocol::encode(&weights);
                let msg = ToWorker::Load {
                    job: job.clone(),
                    plan,
                    weights: headers,
                    stage,
                };
                send_json(socket, &msg).await?;
                send_tensors(socket, frames).await?;
                match next_control(socket, control, "its answer").await? {
                    ToServer::Loaded { job: j } if j == job => Ok(Ok(())),
                    ToServer::Loaded { job: j } => Err(format!(
                        "reported job '{}' loaded where job '{job}' was due",
                        clip(&j, 64)
                    )),
                    ToServer::Error { job: j, error } => worker_error(&job, j, &error),
                    other => Err(format!(
                        "answered with {} where 'loaded' was due",
                        kind(&other)
                    )),
                }
            };
            answer(reply, &cancel, limits.reply_timeout, r).await
        }
        Request::Compute {
            job,
            micro_batch,
            inputs,
            outputs,
            cancel,
            reply,
        } => {
            let r = async {
                let (headers, frames) = protocol::encode(&inputs);
                let msg = ToWorker::Compute {
                    job: job.clone(),
                    micro_batch,
                    inputs: headers,
                };
                send_json(socket, &msg).await?;
                send_tensors(socket, frames).await?;
                match next_control(socket, control, "its answer").await? {
                    ToServer::Result {
                        job: j,
                        micro_batch: m,
                        outputs: got,
                        events,
                    } => {
                        if j != job || m != micro_batch {
                            return Err(format!(
                                "answered job '{}' micro-batch {m} where job '{job}' micro-batch {micro_batch} was due",
                                clip(&j, 64)
                            ));
                        }
                        let sizes = protocol::expect_tensors(&outputs, &got, "stage's outputs")
                            .map_err(|e| {
                                format!("sent a result that does not fit the stage: {e}")
                            })?;
                        let mut tensors = Vec::with_capacity(got.len());
                        for (h, bytes) in got.iter().zip(sizes) {
                            tensors.push((h.name.clone(), next_tensor(socket, h, bytes).await?));
                        }
                        Ok(Ok((tensors, events)))
                    }
                    ToServer::Error { job: j, error } => worker_error(&job, j, &error),
                    other => Err(format!(
                        "answered with {} where a result was due",
                        kind(&other)
                    )),
                }
            };
            answer(reply, &cancel, limits.reply_timeout, r).await
        }
        Request::Unload { job } => {
            let msg = ToWorker::Unload { job };
            tokio::time::timeout(limits.reply_timeout, send_json(socket, &msg))
                .await
                .unwrap_or_else(|_| Err("it stopped reading".into()))
        }
    }
}

/// Whether rates a worker reports can weigh stages: finite, positive speeds and a
/// finite, non-negative overhead (others are ignored, and the assumed rates used).
fn plausible(r: &Rates) -> bool {
    let speeds = [r.flops_per_s, r.bytes_per_s, r.transfer_bytes_per_s];
    speeds.iter().all(|v| v.is_finite() && *v > 0.0)
        && r.pass_overhead_s.is_finite()
        && r.pass_overhead_s >= 0.0
}

/// Refuses a connection that has not said a valid hello, and closes it.
async fn refuse_worker<S>(socket: &mut Socket<S>, error: String)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    tracing::info!("refusing a worker: {error}");
    let goodbye = async {
        let _ = send_json(socket, &ToWorker::Refused { error }).await;
        let _ = socket.close(None).await;
    };
    let _ = tokio::time::timeout(CLOSE_TIMEOUT, goodbye).await;
}

/// Serves one worker connection: a hello within [`HELLO_TIMEOUT`] and
/// [`MAX_HELLO_BYTES`], then requests one at a time. However it ends, the worker leaves
/// the registry at once and its slot is given back.
async fn serve_worker<S>(mut socket: Socket<S>, workers: Arc<Workers>, slot: Slot)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let _slot = slot;
    let limits = workers.limits;
    let hello = tokio::time::timeout(
        HELLO_TIMEOUT,
        next_control(&mut socket, MAX_HELLO_BYTES, "a hello"),
    )
    .await;
    let (name, adapters, rates) = match hello {
        Ok(Ok(ToServer::Hello {
            protocol,
            name,
            adapters,
            rates,
        })) if protocol == PROTOCOL => (clip(&name, 64), adapters, rates.filter(plausible)),
        Ok(Ok(ToServer::Hello { protocol, .. })) => {
            let error = format!("protocol version {protocol} is not supported; this server speaks version {PROTOCOL}");
            return refuse_worker(&mut socket, error).await;
        }
        Ok(Ok(_)) | Ok(Err(_)) | Err(_) => {
            let why = match hello {
                Ok(Err(e)) => e,
                Err(_) => format!("no hello within {} s", HELLO_TIMEOUT.as_secs()),
                Ok(Ok(other)) => format!("sent {}", kind(&other)),
            };
            let error = format!(
                "expected a hello message {{\"type\": \"hello\", \"protocol\": {PROTOCOL}, ...}} first ({why})"
            );
            return refuse_worker(&mut socket, error).await;
        }
    };
    let id = format!("w{}", workers.counter.fetch_add(1, Ordering::Relaxed) + 1);
    if send_json(&mut socket, &ToWorker::Welcome { worker: id.clone() })
        .await
        .is_err()
    {
        return;
    }
    let (tx, mut rx) = mpsc::channel::<Request>(QUEUE);
    let registration = Registration::new(
        &workers,
        WorkerHandle {
            id: id.clone(),
            name: name.clone(),
            adapters,
            rates,
            limits,
            tx,
        },
    );
    tracing::info!(worker = %id, %name, "worker connected");
    let reason = loop {
        socket.get_mut().allowance = IDLE_ALLOWANCE;
        let req = tokio::select! {
            r = rx.recv() => match r {
                Some(r) => r,
                None => break "the server stopped".to_string(),
            },
            // While idle, notice a disconnect at once.
            incoming = socket.next() => match incoming {
                Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
                Some(Ok(Message::Close(_))) | None => break "the worker disconnected".to_string(),
                Some(Ok(_)) => break "it sent a message while no request was in flight".to_string(),
                Some(Err(e)) => break describe(&e, IDLE_ALLOWANCE, "an idle connection"),
            },
        };
        if let Err(e) = exchange(&mut socket, req, &limits).await {
            break e;
        }
    };
    drop(registration);
    tracing::warn!(worker = %id, %name, "dropping the worker: {reason}");
    // A worker that stopped reading cannot hold the connection (and its slot) open.
    let _ = tokio::time::timeout(CLOSE_TIMEOUT, socket.close(None)).await;
}

/// A worker's stage as an execution device: compiling sends the stage's plan and weights,
/// each micro-batch is one request. Every request watches the run's cancel flag.
pub struct RemoteDevice {
    worker: WorkerHandle,
    job: String,
    stage: usize,
    cancel: Arc<AtomicBool>,
}

impl RemoteDevice {
    /// The device of stage `stage` of run `run` on `worker`; setting `cancel` ends a
    /// request in flight within a fraction of a second.
    pub fn new(
        worker: WorkerHandle,
        run: &str,
        stage: usize,
        cancel: Arc<AtomicBool>,
    ) -> RemoteDevice {
        RemoteDevice {
            job: format!("{run}/{stage}"),
            worker,
            stage,
            cancel,
        }
    }

    fn gone(&self, e: &str) -> RunError {
        RunError::Device(format!(
            "worker {} ({}): {e}",
            self.worker.id, self.worker.name
        ))
    }
}

/// The run error of a request's failure.
fn failed(failure: Failure, gone: impl Fn(&str) -> RunError) -> RunError {
    match failure {
        Failure::Cancelled => RunError::Cancelled,
        Failure::Failed(e) => gone(&e),
    }
}

impl Device for RemoteDevice {
    fn name(&self) -> String {
        format!("worker {} ({})", self.worker.id, self.worker.name)
    }

    fn compile<'a>(
        &'a self,
        plan: Plan,
        weights: &'a Weights,
        _prefetch: usize,
    ) -> LocalBoxFuture<'a, Result<Box<dyn Executable>, RunError>> {
        Box::pin(async move {
            let started = now_ns();
            if self.cancel.load(Ordering::Relaxed) {
                return Err(RunError::Cancelled);
            }
            let outputs =
                protocol::plan_tensors(&plan, &plan.outputs).map_err(RunError::Internal)?;
            let largest = self.worker.limits.max_frame_bytes;
            for h in &outputs {
                let bytes = protocol::tensor_bytes(h).map_err(RunError::Internal)?;
                if bytes > largest {
                    return Err(self.gone(&format!(
                        "the stage's output '{}' needs {bytes} bytes, over the {largest} bytes a worker may send in one frame",
                        h.name
                    )));
                }
            }
            let stage_weights: Tensors = plan
                .params
                .iter()
                .map(|(key, _)| {
                    weights
                        .get(key)
                        .cloned()
                        .map(|t| (key.clone(), t))
                        .ok_or_else(|| RunError::MissingWeight(key.clone()))
                })
                .collect::<Result<_, _>>()?;
            let wire = serde_json::to_value(&plan)
                .map_err(|e| RunError::Internal(format!("the stage plan: {e}")))?;
            let (reply, rx) = oneshot::channel();
            self.worker
                .request(Request::Load {
                    job: self.job.clone(),
                    plan: wire,
                    weights: stage_weights,
                    stage: self.stage,
                    cancel: self.cancel.clone(),
                    reply,
                })
                .map_err(|e| self.gone(&e))?;
            rx.await
                .map_err(|_| self.gone("the worker disconnected"))?
                .map_err(|f| failed(f, |e| self.gone(e)))?;
            Ok(Box::new(RemoteExecutable {
                worker: self.worker.clone(),
                job: self.job.clone(),
                name: self.name(),
                plan,
                outputs: Arc::new(outputs),
                cancel: self.cancel.clone(),
                pending: VecDeque::new(),
                kept: Values::new(),
                stats: CompileStats {
                    pipelines_created: 0,
                    passes: 0,
                    millis: now_ns().saturating_sub(started) as f64 / 1e6,
                },
            }) as Box<dyn Executable>)
        })
    }

    fn native_f16(&self) -> bool {
        self.worker.adapters.first().is_some_and(|a| a.shader_f16)
    }

    fn faster_half(&self) -> LocalBoxFuture<'_, Result<HalfStorage, RunError>> {
        Box::pin(async { Ok(HalfStorage::Packed) })
    }

    fn rates(&self) -> Rates {
        self.worker.rates.unwrap_or(Rates::ASSUMED)
    }
}

/// A stage loaded on a worker.
pub struct RemoteExecutable {
    worker: WorkerHandle,
    job: String,
    name: String,
    plan: Plan,
    /// The stage's outputs, which every answer must carry.
    outputs: Arc<Vec<TensorHeader>>,
    cancel: Arc<AtomicBool>,
    pending: VecDeque<(usize, Values)>,
    /// Inputs kept for later micro-batches: held here and sent with each one (the worker
    /// protocol has no kept values).
    kept: Values,
    stats: CompileStats,
}

impl RemoteExecutable {
    fn gone(&self, e: &str) -> RunError {
        RunError::Device(format!("{}: {e}", self.name))
    }

    async fn compute(
        &mut self,
        trace: &TraceContext<'_>,
        events: &mut Vec<Event>,
    ) -> Result<(usize, Values), RunError> {
        let (m, inputs) = self.pending.pop_front().ok_or_else(|| {
            RunError::Internal("completion awaited with nothing in flight".into())
        })?;
        if self.cancel.load(Ordering::Relaxed) {
            return Err(RunError::Cancelled);
        }
        let t0 = now_ns();
        let (reply, rx) = oneshot::channel();
        self.worker
            .request(Request::Compute {
                job: self.job.clone(),
                micro_batch: m,
                inputs: inputs.into_iter().collect(),
                outputs: self.outputs.clone(),
                cancel: self.cancel.clone(),
                reply,
            })
            .map_err(|e| self.gone(&e))?;
        let (outs, worker_events) = rx
            .await
            .map_err(|_| self.gone("the worker disconnected"))?
            .map_err(|f| failed(f, |e| self.gone(e)))?;
        let t1 = now_ns();
        let round_trip = trace.event(
            m,
            format!("stage {} on {}", trace.stage, self.name),
            EventKind::Compute,
            t0,
            t1,
        );
        trace.record(events, round_trip);
        // The worker's own per-pass events, placed in this round trip (they count as
        // detail of it, not as more busy time). They are the worker's word: their times
        // are clamped into the round trip, their number and labels bounded. Its compute
        // events are kept with the run's (the per-node times of its record, as the
        // editor's heat map reads them from the relayed events); the rest are only shown.
        let base = t0.saturating_sub(trace.start_ns);
        let span = t1.saturating_sub(t0);
        let plan = &self.plan;
        let most = 4 * (plan.steps.len() + plan.inputs.len() + plan.outputs.len()) + 16;
        for w in worker_events.into_iter().take(most) {
            let start = w.start_ns.min(span);
            let e = Event {
                run: trace.run.to_string(),
                device: trace.device,
                stage: trace.stage,
                micro_batch: m,
                start_ns: base.saturating_add(start),
                end_ns: base.saturating_add(w.end_ns.clamp(start, span)),
                node: clip(&w.node, 200),
                kind: w.kind,
                warm_up: trace.warm_up,
            };
            if e.kind == EventKind::Compute {
                trace.record(events, e);
            } else if let Some(observe) = trace.observer {
                observe(&e);
            }
        }
        Ok((m, outs.into_iter().collect()))
    }
}

impl Executable for RemoteExecutable {
    fn plan(&self) -> &Plan {
        &self.plan
    }

    fn capacity(&self) -> usize {
        1
    }

    fn submit(
        &mut self,
        m: usize,
        inputs: sluice_engine::exec::Inputs<'_>,
        _trace: &TraceContext<'_>,
        _events: &mut Vec<Event>,
    ) -> Result<(), RunError> {
        let kept = self.kept.keys().cloned().collect();
        sluice_engine::exec::dataset::check_plan_inputs(&self.plan, &inputs, &kept)?;
        let inputs = sluice_engine::exec::input::into_values(inputs);
        // A kept input given again replaces the kept value (as it does on a GPU).
        for (name, t) in inputs.iter().filter(|(n, _)| kept.contains(*n)) {
            self.kept.insert(name.clone(), t.clone());
        }
        let mut all = self.kept.clone();
        all.extend(inputs);
        self.pending.push_back((m, all));
        Ok(())
    }

    fn keep_inputs(&mut self, inputs: &Values) -> Result<(), RunError> {
        sluice_engine::exec::dataset::check_kept_inputs(&self.plan, inputs)?;
        self.kept
            .extend(inputs.iter().map(|(n, t)| (n.clone(), t.clone())));
        Ok(())
    }

    fn complete<'a>(
        &'a mut self,
        trace: &'a TraceContext<'a>,
        events: &'a mut Vec<Event>,
    ) -> LocalBoxFuture<'a, Result<(usize, Values), RunError>> {
        Box::pin(self.compute(trace, events))
    }

    fn write_weights(&mut self, _weights: &Weights) -> Result<(), RunError> {
        Err(RunError::Unsupported(format!(
            "{}: a remote worker's stage keeps the weights it was sent; training on remote workers is not supported",
            self.name
        )))
    }

    fn allocated_bytes(&self) -> u64 {
        0
    }

    fn timing(&self) -> TimingSource {
        TimingSource::HostCompletion
    }

    fn device_name(&self) -> String {
        self.name.clone()
    }

    fn compile_stats(&self) -> CompileStats {
        self.stats
    }
}

impl Drop for RemoteExecutable {
    fn drop(&mut self) {
        let _ = self.worker.tx.try_send(Request::Unload {
            job: self.job.clone(),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use tokio::net::{TcpListener, TcpStream};

    type Client = WebSocketStream<TcpStream>;

    /// A worker actor serving one end of a loopback connection; the other end.
    async fn connect(workers: &Arc<Workers>) -> Client {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let slot = workers.slot().expect("a free slot");
        let w = workers.clone();
        tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.unwrap();
            let socket = metered(tcp, w.limits).await;
            serve_worker(socket, w, slot).await;
        });
        let tcp = TcpStream::connect(addr).await.unwrap();
        WebSocketStream::from_raw_socket(tcp, Role::Client, None).await
    }

    async fn text(ws: &mut Client, v: serde_json::Value) {
        ws.send(Message::Text(v.to_string().into())).await.unwrap();
    }

    async fn read_json(ws: &mut Client) -> serde_json::Value {
        loop {
            match ws.next().await {
                Some(Ok(Message::Text(t))) => return serde_json::from_str(&t).unwrap(),
                Some(Ok(Message::Binary(_))) | Some(Ok(Message::Ping(_))) => continue,
                other => return json!({ "closed": format!("{other:?}") }),
            }
        }
    }

    /// Says hello and waits until the server has registered the worker.
    async fn join(workers: &Arc<Workers>) -> (Client, WorkerHandle) {
        let mut ws = connect(workers).await;
        text(&mut ws, json!({ "type": "hello", "protocol": PROTOCOL, "name": "t", "adapters": [], "rates": null })).await;
        assert_eq!(read_json(&mut ws).await["type"], "welcome");
        for _ in 0..100 {
            if let Some(h) = workers.list().pop() {
                return (ws, h);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the worker was not registered");
    }

    async fn gone(workers: &Arc<Workers>) -> bool {
        for _ in 0..100 {
            if workers.list().is_empty() && workers.open.load(Ordering::Acquire) == 0 {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        false
    }

    type Answer = oneshot::Receiver<Result<(Tensors, Vec<Event>), Failure>>;

    /// Asks for micro-batch 3 of job `r/0`, whose one output is `y`, f32 [2, 2].
    fn ask(h: &WorkerHandle, cancel: &Arc<AtomicBool>) -> Answer {
        let (reply, rx) = oneshot::channel();
        h.request(Request::Compute {
            job: "r/0".into(),
            micro_batch: 3,
            inputs: vec![("x".into(), Tensor::f32(vec![2], vec![1.0, 2.0]))],
            outputs: Arc::new(vec![TensorHeader {
                name: "y".into(),
                shape: vec![2, 2],
                dtype: sluice_engine::DType::F32,
            }]),
            cancel: cancel.clone(),
            reply,
        })
        .unwrap();
        rx
    }

    /// Reads a compute request and its one input frame.
    async fn take_request(ws: &mut Client) {
        let req = read_json(ws).await;
        assert_eq!(req["type"], "compute", "{req}");
        assert!(matches!(ws.next().await, Some(Ok(Message::Binary(b))) if b.len() == 8));
    }

    fn result(micro_batch: usize, shape: &[usize]) -> serde_json::Value {
        json!({ "type": "result", "job": "r/0", "micro_batch": micro_batch,
                "outputs": [{ "name": "y", "shape": shape, "dtype": "f32" }], "events": [] })
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn hellos_that_are_too_big_late_or_wrong_are_refused_unregistered() {
        runtime().block_on(async {
            let workers = Arc::new(Workers::default());
            let mut ws = connect(&workers).await;
            let big = format!(
                "{{\"type\":\"hello\",\"name\":\"{}\"}}",
                "x".repeat(200 << 10)
            );
            // The server stops reading before the end; the send may fail.
            let _ = ws.send(Message::Text(big.into())).await;
            let reply = read_json(&mut ws).await;
            assert_eq!(reply["type"], "refused", "{reply}");
            assert!(
                reply["error"]
                    .as_str()
                    .unwrap()
                    .contains("sent more than the"),
                "{reply}"
            );
            assert!(gone(&workers).await, "no registration, the slot given back");
            let mut ws = connect(&workers).await;
            ws.send(Message::Binary(vec![1, 2, 3].into()))
                .await
                .unwrap();
            let reply = read_json(&mut ws).await;
            assert!(
                reply["error"].as_str().unwrap().contains("tensor frame"),
                "{reply}"
            );
            let mut ws = connect(&workers).await;
            text(&mut ws, json!({ "type": "loaded", "job": "x" })).await;
            let reply = read_json(&mut ws).await;
            assert!(
                reply["error"].as_str().unwrap().contains("sent 'loaded'"),
                "{reply}"
            );
            assert!(gone(&workers).await);
        });
    }

    #[test]
    fn hostile_answers_fail_the_request_and_drop_the_worker_at_once() {
        runtime().block_on(async {
            let cancel = Arc::new(AtomicBool::new(false));
            let frame = |n: usize| Message::Binary(vec![0u8; n].into());
            let cases: Vec<(&str, Vec<Message>)> = vec![
                ("unreadable", vec![Message::Text("nonsense".into())]),
                (
                    "does not fit the stage",
                    vec![Message::Text(result(3, &[4]).to_string().into()), frame(16)],
                ),
                (
                    "micro-batch 7 where",
                    vec![
                        Message::Text(result(7, &[2, 2]).to_string().into()),
                        frame(16),
                    ],
                ),
                (
                    "sent more than the 1040 bytes the tensor 'y'",
                    vec![
                        Message::Text(result(3, &[2, 2]).to_string().into()),
                        frame(1 << 20),
                    ],
                ),
                (
                    "needs 16 bytes, the frame has 12",
                    vec![
                        Message::Text(result(3, &[2, 2]).to_string().into()),
                        frame(12),
                    ],
                ),
                (
                    "where the tensor 'y' was due",
                    vec![
                        Message::Text(result(3, &[2, 2]).to_string().into()),
                        Message::Text("{}".into()),
                    ],
                ),
                (
                    "disconnected",
                    vec![
                        Message::Text(result(3, &[2, 2]).to_string().into()),
                        Message::Close(None),
                    ],
                ),
                (
                    "'loaded' where a result",
                    vec![Message::Text(
                        json!({ "type": "loaded", "job": "r/0" }).to_string().into(),
                    )],
                ),
                (
                    "answered for job 'other'",
                    vec![Message::Text(
                        json!({ "type": "error", "job": "other", "error": "x" })
                            .to_string()
                            .into(),
                    )],
                ),
                (
                    "bytes its answer may have",
                    vec![Message::Text(format!("\"{}\"", "x".repeat(9 << 20)).into())],
                ),
            ];
            for (want, answer) in cases {
                let workers = Arc::new(Workers::default());
                let (mut ws, h) = join(&workers).await;
                let rx = ask(&h, &cancel);
                take_request(&mut ws).await;
                for m in answer {
                    let _ = ws.send(m).await;
                }
                match rx.await.unwrap() {
                    Err(Failure::Failed(e)) => {
                        assert!(e.contains(want), "expected '{want}' in: {e}")
                    }
                    other => panic!("{want}: {other:?}"),
                }
                assert!(
                    gone(&workers).await,
                    "{want}: the worker is still registered"
                );
            }
        });
    }

    #[test]
    fn good_answers_and_the_workers_own_errors_keep_the_connection() {
        runtime().block_on(async {
            let cancel = Arc::new(AtomicBool::new(false));
            let workers = Arc::new(Workers::default());
            let (mut ws, h) = join(&workers).await;
            let rx = ask(&h, &cancel);
            take_request(&mut ws).await;
            text(
                &mut ws,
                json!({ "type": "error", "job": "r/0", "error": "boom" }),
            )
            .await;
            match rx.await.unwrap() {
                Err(Failure::Failed(e)) => assert_eq!(e, "the worker failed: boom"),
                other => panic!("{other:?}"),
            }
            let rx = ask(&h, &cancel);
            take_request(&mut ws).await;
            ws.send(Message::Ping(vec![1].into())).await.unwrap();
            text(&mut ws, result(3, &[2, 2])).await;
            ws.send(Message::Binary(vec![0u8; 16].into()))
                .await
                .unwrap();
            let (tensors, _) = rx.await.unwrap().unwrap();
            assert_eq!(tensors[0].1.shape, vec![2, 2]);
            assert_eq!(workers.list().len(), 1);
            // A message while no request is in flight ends the connection.
            text(&mut ws, json!({ "type": "loaded", "job": "r/0" })).await;
            assert!(gone(&workers).await);
        });
    }

    #[test]
    fn a_silent_worker_times_out_and_a_cancelled_run_stops_waiting() {
        runtime().block_on(async {
            let limits = WorkerLimits {
                reply_timeout: Duration::from_millis(300),
                ..WorkerLimits::default()
            };
            let workers = Arc::new(Workers::new(limits));
            let (mut ws, h) = join(&workers).await;
            let cancel = Arc::new(AtomicBool::new(false));
            let rx = ask(&h, &cancel);
            take_request(&mut ws).await;
            match rx.await.unwrap() {
                Err(Failure::Failed(e)) => assert!(e.contains("no answer within"), "{e}"),
                other => panic!("{other:?}"),
            }
            assert!(gone(&workers).await);

            let workers = Arc::new(Workers::default());
            let (mut ws, h) = join(&workers).await;
            let rx = ask(&h, &cancel);
            take_request(&mut ws).await;
            let started = std::time::Instant::now();
            let flag = cancel.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(200)).await;
                flag.store(true, Ordering::Relaxed);
            });
            assert!(matches!(rx.await.unwrap(), Err(Failure::Cancelled)));
            assert!(started.elapsed() < Duration::from_secs(1));
            assert!(gone(&workers).await, "the late answer would be out of step");
            drop(ws);
        });
    }

    #[test]
    fn a_worker_that_stops_reading_is_dropped_and_its_slot_given_back() {
        runtime().block_on(async {
            let limits = WorkerLimits {
                reply_timeout: Duration::from_millis(300),
                ..WorkerLimits::default()
            };
            let workers = Arc::new(Workers::new(limits));
            let (_ws, h) = join(&workers).await;
            let (reply, rx) = oneshot::channel();
            let weights = vec![("w".to_string(), Tensor::full(vec![8 << 20], 1.0))];
            h.request(Request::Load {
                job: "r/0".into(),
                plan: json!({}),
                weights,
                stage: 0,
                cancel: Arc::new(AtomicBool::new(false)),
                reply,
            })
            .unwrap();
            match rx.await.unwrap() {
                Err(Failure::Failed(e)) => assert!(e.contains("no answer within"), "{e}"),
                other => panic!("{other:?}"),
            }
            let started = std::time::Instant::now();
            while workers.open.load(Ordering::Acquire) != 0 {
                assert!(started.elapsed() < CLOSE_TIMEOUT * 2, "the slot is held");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            assert!(workers.list().is_empty());
        });
    }

    #[test]
    fn implausible_rates_are_ignored() {
        let good = Rates::ASSUMED;
        assert!(plausible(&good));
        for bad in [
            Rates {
                flops_per_s: f64::NAN,
                ..good
            },
            Rates {
                bytes_per_s: 0.0,
                ..good
            },
            Rates {
                transfer_bytes_per_s: f64::INFINITY,
                ..good
            },
            Rates {
                pass_overhead_s: -1.0,
                ..good
            },
        ] {
            assert!(!plausible(&bad), "{bad:?}");
        }
    }

    #[test]
    fn worker_sockets_are_limited() {
        let workers = Arc::new(Workers::new(WorkerLimits {
            max_workers: 2,
            ..WorkerLimits::default()
        }));
        let a = workers.slot().unwrap();
        let _b = workers.slot().unwrap();
        assert!(workers.slot().is_none());
        drop(a);
        assert!(workers.slot().is_some());
    }
}
