//! Runs: a bounded queue, executors that run graphs through the engine's one execution
//! core (on the server's own GPU devices, or with each stage on a remote worker),
//! cancellation, the live message stream each run broadcasts to WebSocket watchers, and
//! a cache of compiled sessions per (graph content, configuration, devices), so repeating
//! a run compiles nothing. Every outcome is stored in the database, a failure with its
//! reason.

use super::db::Db;
use super::workers::{RemoteDevice, WorkerHandle, Workers};
use super::workspace::Workspace;
use serde_json::Value;
use sluice_api::{
    CompileFigures, GraphRef, LiveMessage, MemoryFigures, OutputSummary, RunFigures, RunRecord,
    RunRequest, RunStatus,
};
use sluice_engine::exec::device::Device;
use sluice_engine::exec::{dataset, RunConfig, RunContext, Session};
use sluice_engine::gpu::{GpuContext, GpuDevice};
use sluice_engine::plan::cost::Rates;
use sluice_engine::telemetry::metrics::LiveUtilisation;
use sluice_engine::telemetry::{now_ns, Event};
use sluice_engine::RunError;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::{broadcast, mpsc};

/// Most messages of one run kept for watchers who join late; later ones are only
/// broadcast (the finished run's events file still has them all).
const BACKLOG_LIMIT: usize = 100_000;

/// A live run's messages: broadcast to watchers and kept, so one who joins mid-run gets
/// everything sent before, then the rest, with no gap and nothing twice.
pub struct EventLog {
    backlog: Mutex<Vec<String>>,
    tx: broadcast::Sender<String>,
}

impl EventLog {
    fn new() -> EventLog {
        EventLog {
            backlog: Mutex::new(Vec::new()),
            tx: broadcast::channel(4096).0,
        }
    }

    /// Sends a message to every watcher and keeps it for later ones.
    pub fn send(&self, message: &LiveMessage) {
        let Ok(text) = serde_json::to_string(message) else {
            return;
        };
        let Ok(mut backlog) = self.backlog.lock() else {
            return;
        };
        if backlog.len() < BACKLOG_LIMIT {
            backlog.push(text.clone());
        }
        let _ = self.tx.send(text);
    }

    /// Everything sent so far, and a receiver of what comes next.
    pub fn watch(&self) -> (Vec<String>, broadcast::Receiver<String>) {
        // Copying and subscribing under the lock `send` takes: no message falls between.
        match self.backlog.lock() {
            Ok(backlog) => (backlog.clone(), self.tx.subscribe()),
            Err(_) => (Vec::new(), self.tx.subscribe()),
        }
    }
}

/// A run in progress: its cancel flag and its messages.
struct Live {
    cancel: Arc<AtomicBool>,
    events: Arc<EventLog>,
}

/// Figures of the last (or current) run on the local devices, for `/metrics` and
/// `/api/devices`.
#[derive(Debug, Clone, Default)]
pub struct LastRun {
    /// Utilisation per device.
    pub utilisation: Vec<f64>,
    /// Memory.
    pub memory: MemoryFigures,
}

/// Compiled sessions kept for repeated runs: most recently used last.
struct PlanCache {
    capacity: usize,
    entries: VecDeque<(String, Session)>,
}

impl PlanCache {
    fn take(&mut self, key: &str) -> Option<Session> {
        let i = self.entries.iter().position(|(k, _)| k == key)?;
        self.entries.remove(i).map(|(_, s)| s)
    }

    fn put(&mut self, key: String, session: Session) {
        if self.capacity == 0 {
            return;
        }
        self.entries.retain(|(k, _)| *k != key);
        while self.entries.len() >= self.capacity {
            self.entries.pop_front();
        }
        self.entries.push_back((key, session));
    }
}

/// The server's own GPU devices, opened once and shared by its runs (so pipelines made for
/// one run serve the next), with the adapter's calibrated rates.
#[derive(Default)]
struct LocalDevices {
    contexts: Vec<GpuContext>,
    rates: Option<Rates>,
}

impl LocalDevices {
    /// `count` devices, opened (and the adapter calibrated, or its kept calibration
    /// read) on first need.
    fn take(&mut self, count: usize) -> Result<Vec<Box<dyn Device>>, String> {
        if self.contexts.len() < count {
            let more =
                pollster::block_on(GpuContext::new_many(count)).map_err(|e| e.to_string())?;
            self.contexts
                .extend(more.into_iter().skip(self.contexts.len()));
        }
        if self.rates.is_none() {
            if let Some(ctx) = self.contexts.first() {
                let rates = crate::rates::rates_for(ctx, false).map_err(|e| format!("{e:#}"))?;
                self.rates = Some(rates);
            }
        }
        Ok(self
            .contexts
            .iter()
            .take(count)
            .map(|ctx| {
                Box::new(GpuDevice {
                    ctx: ctx.clone(),
                    rates: self.rates,
                }) as Box<dyn Device>
            })
            .collect())
    }
}

/// A run's devices, and what names them for the plan cache (None: not cacheable).
type RunDevices = (Vec<Box<dyn Device>>, Option<String>);

/// The run queue, executors, live runs and compiled sessions.
pub struct Runs {
    tx: mpsc::Sender<String>,
    workers: Arc<Workers>,
    live: Mutex<HashMap<String, Live>>,
    cache: Mutex<PlanCache>,
    local: Mutex<LocalDevices>,
    /// Figures of the last run on the local devices.
    pub last: Mutex<LastRun>,
    counter: AtomicU64,
}

/// Outcome of an enqueue.
pub enum Enqueued {
    /// Accepted with this id.
    Accepted(String),
    /// The queue is full.
    Full,
}

impl Runs {
    /// Starts `concurrency` executors behind a queue of `capacity` runs, keeping up to
    /// `cached` compiled sessions.
    pub fn start(
        db: Arc<Db>,
        ws: Workspace,
        workers: Arc<Workers>,
        capacity: usize,
        concurrency: usize,
        cached: usize,
    ) -> Arc<Runs> {
        let (tx, rx) = mpsc::channel::<String>(capacity.max(1));
        let runs = Arc::new(Runs {
            tx,
            workers,
            live: Mutex::new(HashMap::new()),
            cache: Mutex::new(PlanCache {
                capacity: cached,
                entries: VecDeque::new(),
            }),
            local: Mutex::new(LocalDevices::default()),
            last: Mutex::new(LastRun::default()),
            counter: AtomicU64::new(0),
        });
        let rx = Arc::new(tokio::sync::Mutex::new(rx));
        for _ in 0..concurrency.max(1) {
            let (runs, db, ws, rx) = (runs.clone(), db.clone(), ws.clone(), rx.clone());
            tokio::spawn(async move {
                loop {
                    let next = rx.lock().await.recv().await;
                    let Some(id) = next else { break };
                    runs.execute(&db, &ws, &id).await;
                }
            });
        }
        runs
    }

    /// Opens the local device and calibrates it (or reads its kept calibration), so the
    /// first run does not wait for it and `/api/devices` reports the rates.
    pub fn prepare_local(&self) {
        match self.local.lock() {
            Ok(mut local) => {
                if let Err(e) = local.take(1) {
                    tracing::warn!("the local device is not ready: {e}");
                }
            }
            Err(_) => tracing::warn!("the device lock is poisoned"),
        }
    }

    /// The calibrated rates of the local devices, once known.
    pub fn local_rates(&self) -> Option<Rates> {
        self.local.lock().ok().and_then(|l| l.rates)
    }

    fn new_id(&self) -> String {
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        let mut rng =
            sluice_engine::rng::Rng::new(now_ns() ^ (n << 32) ^ u64::from(std::process::id()));
        format!("{:016x}", rng.next_u64())
    }

    /// Records and queues a run; `Full` (nothing recorded) when the queue is full.
    pub fn enqueue(&self, db: &Db, graph_label: &str, params: &Value) -> anyhow::Result<Enqueued> {
        let id = self.new_id();
        db.insert(&id, graph_label, params)?;
        self.live
            .lock()
            .map_err(|_| anyhow::anyhow!("lock poisoned"))?
            .insert(
                id.clone(),
                Live {
                    cancel: Arc::new(AtomicBool::new(false)),
                    events: Arc::new(EventLog::new()),
                },
            );
        match self.tx.try_send(id.clone()) {
            Ok(()) => Ok(Enqueued::Accepted(id)),
            Err(_) => {
                db.remove(&id)?;
                if let Ok(mut l) = self.live.lock() {
                    l.remove(&id);
                }
                Ok(Enqueued::Full)
            }
        }
    }

    /// Watches a live run: what it sent so far and a receiver of the rest (None when it
    /// is not live).
    pub fn watch(&self, id: &str) -> Option<(Vec<String>, broadcast::Receiver<String>)> {
        let log = self.live.lock().ok()?.get(id).map(|l| l.events.clone())?;
        Some(log.watch())
    }

    /// Asks a running run to stop; false when it is not live.
    pub fn cancel(&self, id: &str) -> bool {
        match self
            .live
            .lock()
            .ok()
            .and_then(|l| l.get(id).map(|r| r.cancel.clone()))
        {
            Some(flag) => {
                flag.store(true, Ordering::Relaxed);
                true
            }
            None => false,
        }
    }

    fn finish_live(&self, id: &str, summary: Option<RunRecord>) {
        if let Ok(mut l) = self.live.lock() {
            if let Some(live) = l.remove(id) {
                live.events.send(&LiveMessage::Summary {
                    run: summary.map(Box::new),
                });
            }
        }
    }

    async fn execute(self: &Arc<Runs>, db: &Arc<Db>, ws: &Workspace, id: &str) {
        let started = matches!(db.start(id), Ok(true));
        if !started {
            self.finish_live(id, db.get(id).ok().flatten());
            return;
        }
        let Some((cancel, events)) = self
            .live
            .lock()
            .ok()
            .and_then(|l| l.get(id).map(|r| (r.cancel.clone(), r.events.clone())))
        else {
            return;
        };
        let row = db.get(id).ok().flatten();
        let (ws2, runs) = (ws.clone(), self.clone());
        let outcome = tokio::task::spawn_blocking(move || {
            let row = row.ok_or_else(|| "the run disappeared from the database".to_string())?;
            runs.run_blocking(&row, &ws2, &cancel, &events)
        })
        .await
        .unwrap_or_else(|e| Err(format!("the run's thread failed: {e}")));
        let result = match outcome {
            Ok((figures, outputs)) => db.finish(
                id,
                RunStatus::Succeeded,
                Some(&figures),
                Some(&outputs),
                None,
            ),
            Err(e) if e == RunError::Cancelled.to_string() => db.finish(
                id,
                RunStatus::Cancelled,
                None,
                None,
                Some("cancelled while running"),
            ),
            Err(e) => db.finish(id, RunStatus::Failed, None, None, Some(&e)),
        };
        if let Err(e) = result {
            tracing::error!("recording the end of run {id} failed: {e:#}");
        }
        self.finish_live(id, db.get(id).ok().flatten());
    }

    /// The devices of a run: one remote worker per stage when the run is pipelined and
    /// enough workers are connected (or the run pins them), else the local devices. The
    /// second value names the devices for the plan cache (None: not cacheable). Remote
    /// stages watch `cancel` while they wait for their worker.
    fn devices(
        &self,
        req: &RunRequest,
        run: &str,
        cancel: &Arc<AtomicBool>,
    ) -> Result<RunDevices, String> {
        let mut remote: Vec<WorkerHandle> = self.workers.list();
        if let Some(ids) = &req.workers {
            let mut pinned = Vec::new();
            for id in ids {
                match remote.iter().find(|w| &w.id == id) {
                    Some(w) => pinned.push(w.clone()),
                    None => {
                        return Err(format!("worker '{id}' named in 'workers' is not connected"))
                    }
                }
            }
            remote = pinned;
        }
        if req.stages > 1 && remote.len() >= req.stages {
            let devices = remote
                .into_iter()
                .take(req.stages)
                .enumerate()
                .map(|(s, w)| {
                    Box::new(RemoteDevice::new(w, run, s, cancel.clone())) as Box<dyn Device>
                })
                .collect();
            return Ok((devices, None));
        }
        let devices = self
            .local
            .lock()
            .map_err(|_| "the device lock is poisoned".to_string())?
            .take(req.stages)?;
        Ok((devices, Some(format!("local x{}", req.stages))))
    }

    /// Runs a stored request; returns its figures and output summaries.
    fn run_blocking(
        &self,
        row: &RunRecord,
        ws: &Workspace,
        cancel: &Arc<AtomicBool>,
        events: &EventLog,
    ) -> Result<(RunFigures, Vec<OutputSummary>), String> {
        let began = now_ns();
        let req = RunRequest::parse(&row.params)?;
        let text = match &req.graph {
            GraphRef::Stored(name) => ws
                .read_graph(name)
                .map_err(|e| format!("{e:#}"))?
                .ok_or_else(|| format!("graph '{name}' no longer exists"))?,
            GraphRef::Inline(doc) => doc.to_string(),
        };
        let graph = sluice_engine::load_graph(&text).map_err(|p| p.render())?;
        check_runnable(&graph, req.batch)?;
        let weights =
            sluice_engine::weights::init_weights(&graph, graph.doc.params.seed.unwrap_or(0));
        let uploaded = decode_inputs(&req)?;
        let data =
            dataset::complete(&graph, uploaded, req.seed, req.batch).map_err(|e| e.to_string())?;
        let config: RunConfig = req.config();
        let (devices, device_key) = self.devices(&req, &row.id, cancel)?;
        let cache_key = device_key.map(|d| {
            format!(
                "{d}|{}|{}",
                serde_json::to_string(&config).unwrap_or_default(),
                text
            )
        });
        let cached = cache_key
            .as_ref()
            .and_then(|k| self.cache.lock().ok()?.take(k));
        let was_cached = cached.is_some();
        let mut session = match cached {
            Some(s) => s,
            None => Session::compile_blocking(&graph, &weights, &config, devices)
                .map_err(|e| e.to_string())?,
        };
        let local = cache_key.is_some();
        let live = Mutex::new(LiveUtilisation::default());
        let observe = |e: &Event| {
            events.send(&LiveMessage::Event { event: e.clone() });
            if local {
                if let Ok(mut l) = live.lock() {
                    l.record(e);
                    if let Ok(mut last) = self.last.lock() {
                        last.utilisation = l.utilisation();
                    }
                }
            }
        };
        let ctx = RunContext {
            observer: Some(&observe),
            cancel: Some(cancel),
            ..RunContext::new(&row.id)
        };
        let run_start = now_ns();
        let result = session.run_blocking(&data, &ctx);
        let compile = CompileFigures {
            cached: was_cached,
            stats: if was_cached {
                Default::default()
            } else {
                session.compile_stats()
            },
            first_result_ms: result.as_ref().map_or(0.0, |r| {
                (run_start.saturating_sub(began) + r.first_result_ns) as f64 / 1e6
            }),
        };
        let memory = MemoryFigures {
            planned_bytes: session.memory().planned_bytes,
            allocated_bytes: session.allocated_bytes(),
        };
        let devices = session.device_names();
        let timing = session.timing();
        // A session that failed (a lost device, say) is not kept.
        if let (Some(k), true) = (cache_key, result.is_ok()) {
            if let Ok(mut c) = self.cache.lock() {
                c.put(k, session);
            }
        }
        let report = result.map_err(|e| e.to_string())?;
        events.send(&LiveMessage::Metrics {
            metrics: report.metrics.clone(),
        });
        let outputs = store_outputs(ws, &row.id, &report.outputs)?;
        if let Err(e) = ws.write_run_events(&row.id, &report.events, &devices) {
            tracing::warn!("run {}: its events were not kept: {e:#}", row.id);
        }
        if local {
            if let Ok(mut last) = self.last.lock() {
                *last = LastRun {
                    utilisation: report
                        .metrics
                        .devices
                        .iter()
                        .map(|d| d.utilisation)
                        .collect(),
                    memory,
                };
            }
        }
        Ok((
            RunFigures {
                metrics: report.metrics,
                timing,
                devices,
                memory: local.then_some(memory),
                compile: Some(compile),
            },
            outputs,
        ))
    }
}

/// What the server can run: a graph within the run limits whose weights it can make.
pub fn check_runnable(graph: &sluice_engine::Graph, batch: usize) -> Result<(), String> {
    if let Some(file) = &graph.doc.params.file {
        return Err(format!(
            "the graph takes its weights from the file '{file}', which the server cannot read yet; \
             use seeded weights (\"params\": {{\"seed\": ...}}) or `sluice run` on the command line"
        ));
    }
    sluice_engine::limits::check_run(graph, batch)
}

/// The request's uploaded inputs, decoded from base64 `.npy`.
pub fn decode_inputs(req: &RunRequest) -> Result<sluice_engine::exec::Values, String> {
    use base64::Engine;
    let mut inputs = HashMap::new();
    for (name, text) in &req.inputs {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(text)
            .map_err(|e| format!("input '{name}' is not valid base64: {e}"))?;
        let t = sluice_engine::npy::parse(&bytes).map_err(|e| format!("input '{name}': {e}"))?;
        inputs.insert(name.clone(), t);
    }
    Ok(inputs)
}

/// Writes a run's outputs as `runs/ID/FILE.npy` and returns their summaries.
fn store_outputs(
    ws: &Workspace,
    id: &str,
    outputs: &[(String, sluice_engine::Tensor)],
) -> Result<Vec<OutputSummary>, String> {
    let dir = ws.run_dir(id);
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let mut summaries = Vec::new();
    for (i, (name, t)) in outputs.iter().enumerate() {
        // File names never come from user strings unchecked: `node:1` becomes `node_1`,
        // anything else unsafe becomes `outputI`.
        let file = match name.replace(':', "_") {
            f if sluice_api::valid_name(&f) => f,
            _ => format!("output{i}"),
        };
        let bytes = sluice_engine::npy::to_bytes(t).map_err(|e| e.to_string())?;
        std::fs::write(dir.join(format!("{file}.npy")), bytes).map_err(|e| e.to_string())?;
        summaries.push(OutputSummary {
            name: name.clone(),
            file,
            shape: t.shape.clone(),
            dtype: t.dtype(),
            first: t.to_f32_vec().into_iter().take(8).collect(),
            checksum: t.checksum(),
            non_finite: t.non_finite(),
        });
    }
    Ok(summaries)
}
