//! Remote workers: the `WS /api/workers` endpoint, a registry of connected workers, one
//! actor per connection that sends requests and waits (with a timeout) for their answers,
//! and a worker's stage as an execution device ([`RemoteDevice`]): the engine's one
//! driver runs remote stages like local ones, the activations travelling through the
//! server.

use axum::extract::ws::{Message, WebSocket};
use futures_util::future::LocalBoxFuture;
use sluice_api::protocol::{self, ToServer, ToWorker, PROTOCOL};
use sluice_api::WorkerInfo;
use sluice_engine::exec::device::{CompileStats, Device, Executable, TraceContext, Values};
use sluice_engine::gpu::AdapterSummary;
use sluice_engine::plan::cost::Rates;
use sluice_engine::plan::{HalfStorage, Plan};
use sluice_engine::telemetry::{now_ns, Event, EventKind, TimingSource};
use sluice_engine::weights::Weights;
use sluice_engine::{RunError, Tensor};
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

type Tensors = Vec<(String, Tensor)>;

/// How long a worker may take to answer one request (compiling a stage or computing a
/// micro-batch) before the server gives up on it and drops the connection.
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(300);

/// A request to a worker, with where to send the answer.
enum Request {
    Load {
        job: String,
        plan: serde_json::Value,
        weights: Tensors,
        stage: usize,
        reply: oneshot::Sender<Result<(), String>>,
    },
    Compute {
        job: String,
        micro_batch: usize,
        inputs: Tensors,
        reply: oneshot::Sender<Result<(Tensors, Vec<Event>), String>>,
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
}

/// Connected workers.
#[derive(Default)]
pub struct Workers {
    map: Mutex<BTreeMap<String, WorkerHandle>>,
    counter: AtomicU64,
}

impl Workers {
    /// The connected workers, by id.
    pub fn list(&self) -> Vec<WorkerHandle> {
        self.map
            .lock()
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default()
    }

    fn add(&self, h: WorkerHandle) {
        if let Ok(mut m) = self.map.lock() {
            m.insert(h.id.clone(), h);
        }
    }

    fn remove(&self, id: &str) {
        if let Ok(mut m) = self.map.lock() {
            m.remove(id);
        }
    }
}

async fn send_json(socket: &mut WebSocket, msg: &ToWorker) -> Result<(), String> {
    let text = serde_json::to_string(msg).map_err(|e| e.to_string())?;
    socket
        .send(Message::Text(text.into()))
        .await
        .map_err(|e| format!("send failed: {e}"))
}

/// Reads the next control message, skipping pings; errors name what went wrong.
async fn next_json(socket: &mut WebSocket) -> Result<ToServer, String> {
    loop {
        match socket.recv().await {
            Some(Ok(Message::Text(t))) => {
                return serde_json::from_str(&t)
                    .map_err(|e| format!("unreadable message from the worker: {e}"))
            }
            Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
            Some(Ok(Message::Binary(_))) => {
                return Err("unexpected binary frame from the worker".into())
            }
            Some(Ok(Message::Close(_))) | None => return Err("the worker disconnected".into()),
            Some(Err(e)) => return Err(format!("the worker disconnected ({e})")),
        }
    }
}

async fn next_binary(socket: &mut WebSocket) -> Result<Vec<u8>, String> {
    loop {
        match socket.recv().await {
            Some(Ok(Message::Binary(b))) => return Ok(b.to_vec()),
            Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
            Some(Ok(_)) => return Err("expected a tensor frame from the worker".into()),
            None | Some(Err(_)) => return Err("the worker disconnected".into()),
        }
    }
}

async fn send_tensors(socket: &mut WebSocket, frames: Vec<Vec<u8>>) -> Result<(), String> {
    for f in frames {
        socket
            .send(Message::Binary(f.into()))
            .await
            .map_err(|e| format!("send failed: {e}"))?;
    }
    Ok(())
}

/// Waits (at most [`REPLY_TIMEOUT`]) for an exchange with the worker and hands its answer
/// (the worker's own error included) to the requester. `Err` (the connection failed, the
/// worker said something unexpected or nothing in time) ends the connection.
async fn answer<T>(
    reply: oneshot::Sender<Result<T, String>>,
    exchange: impl std::future::Future<Output = Result<Result<T, String>, String>>,
) -> Result<(), String> {
    let failure = match tokio::time::timeout(REPLY_TIMEOUT, exchange).await {
        Ok(Ok(answer)) => {
            let _ = reply.send(answer);
            return Ok(());
        }
        Ok(Err(e)) => e,
        Err(_) => format!("no answer within {} s", REPLY_TIMEOUT.as_secs()),
    };
    let _ = reply.send(Err(failure.clone()));
    Err(failure)
}

/// One request's exchange with the worker; `Err` ends the connection.
async fn exchange(socket: &mut WebSocket, req: Request) -> Result<(), String> {
    match req {
        Request::Load {
            job,
            plan,
            weights,
            stage,
            reply,
        } => {
            let r = async {
                let (headers, frames) = protocol::encode(&weights);
                send_json(
                    socket,
                    &ToWorker::Load {
                        job: job.clone(),
                        plan,
                        weights: headers,
                        stage,
                    },
                )
                .await?;
                send_tensors(socket, frames).await?;
                match next_json(socket).await? {
                    ToServer::Loaded { .. } => Ok(Ok(())),
                    ToServer::Error { error, .. } => Ok(Err(error)),
                    other => Err(format!("unexpected answer {other:?}")),
                }
            };
            answer(reply, r).await
        }
        Request::Compute {
            job,
            micro_batch,
            inputs,
            reply,
        } => {
            let r = async {
                let (headers, frames) = protocol::encode(&inputs);
                send_json(
                    socket,
                    &ToWorker::Compute {
                        job,
                        micro_batch,
                        inputs: headers,
                    },
                )
                .await?;
                send_tensors(socket, frames).await?;
                match next_json(socket).await? {
                    ToServer::Result {
                        outputs, events, ..
                    } => {
                        let mut tensors = Vec::new();
                        for h in &outputs {
                            let bytes = next_binary(socket).await?;
                            tensors.push((h.name.clone(), protocol::decode(h, &bytes)?));
                        }
                        Ok(Ok((tensors, events)))
                    }
                    ToServer::Error { error, .. } => Ok(Err(error)),
                    other => Err(format!("unexpected answer {other:?}")),
                }
            };
            answer(reply, r).await
        }
        Request::Unload { job } => send_json(socket, &ToWorker::Unload { job }).await,
    }
}

/// Serves one worker connection: handshake, then requests one at a time.
pub async fn serve_worker(mut socket: WebSocket, workers: Arc<Workers>) {
    let hello = tokio::time::timeout(Duration::from_secs(10), next_json(&mut socket)).await;
    let (name, adapters, rates) = match hello {
        Ok(Ok(ToServer::Hello {
            protocol,
            name,
            adapters,
            rates,
        })) if protocol == PROTOCOL => (name, adapters, rates),
        Ok(Ok(ToServer::Hello { protocol, .. })) => {
            let error = format!("protocol version {protocol} is not supported; this server speaks version {PROTOCOL}");
            let _ = send_json(&mut socket, &ToWorker::Refused { error }).await;
            let _ = socket.send(Message::Close(None)).await;
            return;
        }
        Ok(Ok(_)) | Ok(Err(_)) | Err(_) => {
            let error = format!(
                "expected a hello message {{\"type\": \"hello\", \"protocol\": {PROTOCOL}, ...}} first"
            );
            let _ = send_json(&mut socket, &ToWorker::Refused { error }).await;
            let _ = socket.send(Message::Close(None)).await;
            return;
        }
    };
    let id = format!("w{}", workers.counter.fetch_add(1, Ordering::Relaxed) + 1);
    if send_json(&mut socket, &ToWorker::Welcome { worker: id.clone() })
        .await
        .is_err()
    {
        return;
    }
    let (tx, mut rx) = mpsc::channel::<Request>(16);
    workers.add(WorkerHandle {
        id: id.clone(),
        name: name.clone(),
        adapters,
        rates,
        tx,
    });
    tracing::info!(worker = %id, %name, "worker connected");
    loop {
        let req = tokio::select! {
            r = rx.recv() => match r { Some(r) => r, None => break },
            // While idle, notice a disconnect at once.
            incoming = socket.recv() => match incoming {
                Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
                _ => break,
            },
        };
        if let Err(e) = exchange(&mut socket, req).await {
            tracing::warn!(worker = %id, %name, "dropping the worker: {e}");
            break;
        }
    }
    workers.remove(&id);
    tracing::info!(worker = %id, "worker disconnected");
}

/// A worker's stage as an execution device: compiling sends the stage's plan and weights,
/// each micro-batch is one request.
pub struct RemoteDevice {
    worker: WorkerHandle,
    job: String,
    stage: usize,
}

impl RemoteDevice {
    /// The device of stage `stage` of run `run` on `worker`.
    pub fn new(worker: WorkerHandle, run: &str, stage: usize) -> RemoteDevice {
        RemoteDevice {
            job: format!("{run}/{stage}"),
            worker,
            stage,
        }
    }

    fn gone(&self, e: &str) -> RunError {
        RunError::Device(format!(
            "worker {} ({}): {e}",
            self.worker.id, self.worker.name
        ))
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
                .tx
                .send(Request::Load {
                    job: self.job.clone(),
                    plan: wire,
                    weights: stage_weights,
                    stage: self.stage,
                    reply,
                })
                .await
                .map_err(|_| self.gone("the worker disconnected"))?;
            rx.await
                .map_err(|_| self.gone("the worker disconnected"))?
                .map_err(|e| self.gone(&e))?;
            Ok(Box::new(RemoteExecutable {
                worker: self.worker.clone(),
                job: self.job.clone(),
                name: self.name(),
                plan,
                pending: VecDeque::new(),
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
    pending: VecDeque<(usize, Values)>,
    stats: CompileStats,
}

impl RemoteExecutable {
    fn gone(&self, e: &str) -> RunError {
        RunError::Device(format!("{}: {e}", self.name))
    }

    /// Checks a worker's outputs against the stage's plan: every output, with its dtype
    /// and shape, and nothing else.
    fn check_outputs(&self, outs: &Tensors) -> Result<(), RunError> {
        if outs.len() != self.plan.outputs.len() {
            return Err(self.gone(&format!(
                "sent {} outputs, the stage has {}",
                outs.len(),
                self.plan.outputs.len()
            )));
        }
        for (name, t) in outs {
            let Some(v) = self.plan.value(name) else {
                return Err(self.gone(&format!("sent an output '{name}' the stage does not have")));
            };
            if t.shape != v.shape || t.dtype() != v.dtype {
                return Err(self.gone(&format!(
                    "sent '{name}' as {} {:?}, the stage computes {} {:?}",
                    t.dtype(),
                    t.shape,
                    v.dtype,
                    v.shape
                )));
            }
        }
        Ok(())
    }

    async fn compute(
        &mut self,
        trace: &TraceContext<'_>,
        events: &mut Vec<Event>,
    ) -> Result<(usize, Values), RunError> {
        let (m, inputs) = self.pending.pop_front().ok_or_else(|| {
            RunError::Internal("completion awaited with nothing in flight".into())
        })?;
        let t0 = now_ns();
        let (reply, rx) = oneshot::channel();
        self.worker
            .tx
            .send(Request::Compute {
                job: self.job.clone(),
                micro_batch: m,
                inputs: inputs.into_iter().collect(),
                reply,
            })
            .await
            .map_err(|_| self.gone("the worker disconnected"))?;
        let (outs, worker_events) = rx
            .await
            .map_err(|_| self.gone("the worker disconnected"))?
            .map_err(|e| self.gone(&e))?;
        let t1 = now_ns();
        self.check_outputs(&outs)?;
        let round_trip = trace.event(
            m,
            format!("stage {} on {}", trace.stage, self.name),
            EventKind::Compute,
            t0,
            t1,
        );
        trace.record(events, round_trip);
        // The worker's own per-pass events, placed in this round trip (they count as
        // detail of it, not as more busy time).
        if let Some(observe) = trace.observer {
            for w in worker_events {
                let e = Event {
                    run: trace.run.to_string(),
                    device: trace.device,
                    stage: trace.stage,
                    micro_batch: m,
                    start_ns: w.start_ns + t0.saturating_sub(trace.start_ns),
                    end_ns: w.end_ns + t0.saturating_sub(trace.start_ns),
                    ..w
                };
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
        inputs: &Values,
        _trace: &TraceContext<'_>,
        _events: &mut Vec<Event>,
    ) -> Result<(), RunError> {
        sluice_engine::exec::dataset::check_plan_inputs(&self.plan, inputs)?;
        self.pending.push_back((m, inputs.clone()));
        Ok(())
    }

    fn complete<'a>(
        &'a mut self,
        trace: &'a TraceContext<'a>,
        events: &'a mut Vec<Event>,
    ) -> LocalBoxFuture<'a, Result<(usize, Values), RunError>> {
        Box::pin(self.compute(trace, events))
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
