//! Remote workers: the `WS /api/workers` endpoint, a registry of connected workers, one
//! actor per connection that sends requests and waits for their answers, and the runner
//! that places the stages of a run on workers (GPipe over their connections; activations
//! travel through the server).

use crate::protocol::{self, ToServer, ToWorker, PROTOCOL};
use axum::extract::ws::{Message, WebSocket};
use sluice_engine::graph::Graph;
use sluice_engine::runtime::gpu::AdapterSummary;
use sluice_engine::runtime::stages::{self, StageSpec};
use sluice_engine::telemetry::{now_ns, Event, EventKind};
use sluice_engine::Tensor;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

type Tensors = Vec<(String, Tensor)>;

/// A request to a worker, with where to send the answer.
enum Request {
    Load {
        job: String,
        graph: serde_json::Value,
        precision: String,
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
    tx: mpsc::Sender<Request>,
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

/// Serves one worker connection: handshake, then requests one at a time.
pub async fn serve_worker(mut socket: WebSocket, workers: Arc<Workers>) {
    let hello = tokio::time::timeout(Duration::from_secs(10), next_json(&mut socket)).await;
    let (name, adapters) = match hello {
        Ok(Ok(ToServer::Hello {
            protocol,
            name,
            adapters,
        })) if protocol == PROTOCOL => (name, adapters),
        Ok(Ok(ToServer::Hello { protocol, .. })) => {
            let error = format!("protocol version {protocol} is not supported; this server speaks version {PROTOCOL}");
            let _ = send_json(&mut socket, &ToWorker::Refused { error }).await;
            let _ = socket.send(Message::Close(None)).await;
            return;
        }
        Ok(Ok(_)) | Ok(Err(_)) | Err(_) => {
            let error =
                "expected a hello message {\"type\": \"hello\", \"protocol\": 1, ...} first"
                    .to_string();
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
        tx,
    });
    tracing::info!(worker = %id, %name, "worker connected");
    let gone = |e: &str| format!("worker {id} ({name}): {e}");
    loop {
        let req = tokio::select! {
            r = rx.recv() => match r { Some(r) => r, None => break },
            // While idle, notice a disconnect at once.
            incoming = socket.recv() => match incoming {
                Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
                _ => break,
            },
        };
        match req {
            Request::Load {
                job,
                graph,
                precision,
                stage,
                reply,
            } => {
                let r = async {
                    send_json(
                        &mut socket,
                        &ToWorker::Load {
                            job: job.clone(),
                            graph,
                            precision,
                            stage,
                        },
                    )
                    .await?;
                    match next_json(&mut socket).await? {
                        ToServer::Loaded { .. } => Ok(()),
                        ToServer::Error { error, .. } => Err(error),
                        other => Err(format!("unexpected answer {other:?}")),
                    }
                }
                .await
                .map_err(|e| gone(&e));
                let failed = r.is_err();
                let _ = reply.send(r);
                if failed {
                    break;
                }
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
                        &mut socket,
                        &ToWorker::Compute {
                            job,
                            micro_batch,
                            inputs: headers,
                        },
                    )
                    .await?;
                    for f in frames {
                        socket
                            .send(Message::Binary(f.into()))
                            .await
                            .map_err(|e| format!("send failed: {e}"))?;
                    }
                    match next_json(&mut socket).await? {
                        ToServer::Result {
                            outputs, events, ..
                        } => {
                            let mut tensors = Vec::new();
                            for h in &outputs {
                                let bytes = next_binary(&mut socket).await?;
                                tensors.push((h.name.clone(), protocol::decode(h, &bytes)?));
                            }
                            Ok((tensors, events))
                        }
                        ToServer::Error { error, .. } => Err(error),
                        other => Err(format!("unexpected answer {other:?}")),
                    }
                }
                .await
                .map_err(|e| gone(&e));
                let failed = r
                    .as_ref()
                    .is_err_and(|e| e.contains("disconnected") || e.contains("failed"));
                let _ = reply.send(r);
                if failed {
                    break;
                }
            }
            Request::Unload { job } => {
                let _ = send_json(&mut socket, &ToWorker::Unload { job }).await;
            }
        }
    }
    workers.remove(&id);
    tracing::info!(worker = %id, "worker disconnected");
}

/// Runs `micro_batches` of a bound graph split over `stages` workers (GPipe), returning
/// each micro-batch's values and the server-side events (host times).
#[allow(clippy::type_complexity, clippy::too_many_arguments)]
pub fn run_remote(
    workers: &[WorkerHandle],
    bound: &Graph,
    stage_count: usize,
    precision: &str,
    run: &str,
    micro_batches: Vec<HashMap<String, Tensor>>,
    observe: &(dyn Fn(&Event) + Sync),
    cancel: &AtomicBool,
) -> Result<(Vec<HashMap<String, Tensor>>, Vec<Event>), String> {
    let part = stages::choose(bound, stage_count, &stages::model_costs(bound))
        .map_err(|e| e.to_string())?;
    let specs: Vec<StageSpec> = stages::split(bound, &part).map_err(|e| e.to_string())?;
    for (s, spec) in specs.iter().enumerate() {
        let (reply, rx) = oneshot::channel();
        let graph = serde_json::to_value(&spec.graph.doc).map_err(|e| e.to_string())?;
        workers[s]
            .tx
            .blocking_send(Request::Load {
                job: format!("{run}/{s}"),
                graph,
                precision: precision.into(),
                stage: s,
                reply,
            })
            .map_err(|_| format!("worker {} disconnected", workers[s].id))?;
        rx.blocking_recv()
            .map_err(|_| format!("worker {} disconnected", workers[s].id))??;
    }
    let start = now_ns();
    let n = micro_batches.len();
    let events = Mutex::new(Vec::new());
    let result = std::thread::scope(|scope| -> Result<Vec<HashMap<String, Tensor>>, String> {
        let mut senders = Vec::new();
        let mut receivers = Vec::new();
        for _ in 0..=specs.len() {
            let (tx, rx) =
                std::sync::mpsc::channel::<Result<(usize, HashMap<String, Tensor>), String>>();
            senders.push(tx);
            receivers.push(Some(rx));
        }
        for (s, spec) in specs.iter().enumerate() {
            let rx = receivers[s].take().ok_or("internal: receiver")?;
            let tx = senders[s + 1].clone();
            let worker = workers[s].clone();
            let events = &events;
            scope.spawn(move || {
                for _ in 0..n {
                    let (m, mut values) = match rx.recv() {
                        Ok(Ok(x)) => x,
                        Ok(Err(e)) => {
                            let _ = tx.send(Err(e));
                            return;
                        }
                        Err(_) => return,
                    };
                    if cancel.load(Ordering::Relaxed) {
                        let _ = tx.send(Err("cancelled".into()));
                        return;
                    }
                    let inputs: Tensors = spec
                        .inputs
                        .iter()
                        .filter_map(|(name, key)| {
                            values.get(key).map(|t| (name.clone(), t.clone()))
                        })
                        .collect();
                    let t0 = now_ns();
                    let (reply, rrx) = oneshot::channel();
                    let sent = worker.tx.blocking_send(Request::Compute {
                        job: format!("{run}/{s}"),
                        micro_batch: m,
                        inputs,
                        reply,
                    });
                    let answer = match sent {
                        Ok(()) => rrx
                            .blocking_recv()
                            .unwrap_or_else(|_| Err(format!("worker {} disconnected", worker.id))),
                        Err(_) => Err(format!("worker {} disconnected", worker.id)),
                    };
                    let t1 = now_ns();
                    match answer {
                        Ok((outs, worker_events)) => {
                            let mut e = Event {
                                run: run.to_string(),
                                device: s,
                                stage: s,
                                micro_batch: m,
                                node: format!("stage {s} on worker {}", worker.id),
                                kind: EventKind::Compute,
                                start_ns: t0.saturating_sub(start),
                                end_ns: t1.saturating_sub(start),
                            };
                            observe(&e);
                            if let Ok(mut ev) = events.lock() {
                                ev.push(e.clone());
                                // The worker's own per-pass events, placed in this round trip.
                                for w in worker_events {
                                    e = Event {
                                        run: run.to_string(),
                                        device: s,
                                        stage: s,
                                        micro_batch: m,
                                        start_ns: w.start_ns + t0.saturating_sub(start),
                                        end_ns: w.end_ns + t0.saturating_sub(start),
                                        ..w
                                    };
                                    observe(&e);
                                }
                            }
                            values.extend(outs);
                            if tx.send(Ok((m, values))).is_err() {
                                return;
                            }
                        }
                        Err(err) => {
                            let _ = tx.send(Err(err));
                            return;
                        }
                    }
                }
            });
        }
        for (m, mb) in micro_batches.into_iter().enumerate() {
            if senders[0].send(Ok((m, mb))).is_err() {
                break;
            }
        }
        drop(senders);
        let out = receivers[specs.len()].take().ok_or("internal: collector")?;
        let mut values = Vec::new();
        for _ in 0..n {
            match out.recv() {
                Ok(Ok((_, v))) => values.push(v),
                Ok(Err(e)) => return Err(e),
                Err(_) => return Err("a stage stopped".into()),
            }
        }
        Ok(values)
    });
    for (s, w) in workers.iter().enumerate().take(specs.len()) {
        let _ = w.tx.blocking_send(Request::Unload {
            job: format!("{run}/{s}"),
        });
    }
    let values = result?;
    Ok((values, events.into_inner().unwrap_or_default()))
}

/// What `/api/devices` shows about a worker.
pub fn describe(w: &WorkerHandle) -> serde_json::Value {
    serde_json::json!({ "id": w.id, "kind": "remote", "name": w.name, "adapters": w.adapters })
}
