//! Runs: request parsing and limits, a bounded queue, executors that run graphs on the
//! in-process worker (the local adapter), cancellation, and the live event stream each
//! run broadcasts to WebSocket subscribers. Every outcome is stored in the database, a
//! failure with its reason.

use super::db::{Db, RunRow};
use super::workers::{run_remote, Workers};
use super::workspace::{valid_name, Workspace};
use serde_json::{json, Value};
use sluice_engine::graph::Graph;
use sluice_engine::runtime::plan::Precision;
use sluice_engine::runtime::session::Session;
use sluice_engine::runtime::RunError;
use sluice_engine::runtime::{dataset, RunConfig};
use sluice_engine::shape::Dim;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::{broadcast, mpsc};

/// Largest graph accepted for a run, in nodes.
pub const MAX_NODES: usize = 10_000;
/// Largest input tensor accepted for a run, in elements.
pub const MAX_INPUT_ELEMENTS: usize = 1 << 26;
/// Largest batch accepted.
pub const MAX_BATCH: usize = 65_536;

/// Where a run's graph comes from.
#[derive(Debug, Clone)]
pub enum GraphSource {
    /// A graph stored in the workspace.
    Stored(String),
    /// A graph document in the request.
    Inline(Value),
}

/// A checked run request.
#[derive(Debug, Clone)]
pub struct RunRequest {
    /// The graph.
    pub graph: GraphSource,
    /// Uploaded inputs (from base64 `.npy`); the others are random from the seed.
    pub inputs: HashMap<String, sluice_engine::Tensor>,
    /// Worker ids pinned to the stages, in stage order (`"workers": ["w2", "w1"]`).
    pub placement: Option<Vec<String>>,
    /// Execution settings.
    pub config: RunConfig,
    /// Seed of the random inputs.
    pub seed: u64,
}

fn field_usize(
    obj: &serde_json::Map<String, Value>,
    key: &str,
    default: usize,
    max: usize,
) -> Result<usize, String> {
    match obj.get(key) {
        None => Ok(default),
        Some(v) => match v.as_u64() {
            Some(n) if (1..=max as u64).contains(&n) => Ok(n as usize),
            _ => Err(format!(
                "'{key}' must be an integer from 1 to {max}, not {v}"
            )),
        },
    }
}

/// Parses and checks a run request body.
pub fn parse_request(body: &Value) -> Result<RunRequest, String> {
    let obj = body.as_object().ok_or("the body must be a JSON object")?;
    const KNOWN: &[&str] = &[
        "graph",
        "batch",
        "seed",
        "inputs",
        "workers",
        "microbatches",
        "stages",
        "prefetch",
        "precision",
    ];
    if let Some(k) = obj.keys().find(|k| !KNOWN.contains(&k.as_str())) {
        return Err(format!("unknown field '{k}' (known: {})", KNOWN.join(", ")));
    }
    let graph = match obj.get("graph") {
        Some(Value::String(name)) if valid_name(name) => GraphSource::Stored(name.clone()),
        Some(Value::String(name)) => {
            return Err(format!(
                "'{name}' is not a valid graph name (1-64 of A-Z a-z 0-9 _ -)"
            ))
        }
        Some(doc @ Value::Object(_)) => GraphSource::Inline(doc.clone()),
        Some(other) => {
            return Err(format!(
                "'graph' must be a graph name or a graph document, not {other}"
            ))
        }
        None => return Err("'graph' is missing".into()),
    };
    let precision = match obj.get("precision") {
        None => Precision::F32,
        Some(Value::String(p)) => Precision::parse(p)
            .ok_or_else(|| format!("'precision' must be f32, f16 or mixed, not '{p}'"))?,
        Some(v) => return Err(format!("'precision' must be a string, not {v}")),
    };
    let seed = match obj.get("seed") {
        None => 0,
        Some(v) => v
            .as_u64()
            .ok_or_else(|| format!("'seed' must be a non-negative integer, not {v}"))?,
    };
    let config = RunConfig {
        batch: field_usize(obj, "batch", 1, MAX_BATCH)?,
        microbatches: field_usize(obj, "microbatches", 1, 1024)?,
        stages: field_usize(obj, "stages", 1, 16)?,
        prefetch: field_usize(obj, "prefetch", 2, 16)?,
        precision,
        ..Default::default()
    };
    if !config.batch.is_multiple_of(config.microbatches) {
        return Err(format!(
            "batch {} does not split into {} micro-batches",
            config.batch, config.microbatches
        ));
    }
    let mut inputs = HashMap::new();
    match obj.get("inputs") {
        None => {}
        Some(Value::Object(m)) => {
            use base64::Engine;
            for (name, v) in m {
                let text = v.as_str().ok_or_else(|| {
                    format!("input '{name}' must be a base64 string of a .npy file")
                })?;
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(text)
                    .map_err(|e| format!("input '{name}' is not valid base64: {e}"))?;
                let t = sluice_engine::npy::parse(&bytes)
                    .map_err(|e| format!("input '{name}': {e}"))?;
                inputs.insert(name.clone(), t);
            }
        }
        Some(v) => {
            return Err(format!(
                "'inputs' must map input names to base64 .npy files, not {v}"
            ))
        }
    }
    let placement = match obj.get("workers") {
        None => None,
        Some(Value::Array(ids)) => {
            let ids: Option<Vec<String>> =
                ids.iter().map(|v| v.as_str().map(str::to_string)).collect();
            let ids = ids.ok_or("'workers' must be a list of worker ids")?;
            if ids.len() != config.stages {
                return Err(format!(
                    "'workers' pins {} workers but the run has {} stages",
                    ids.len(),
                    config.stages
                ));
            }
            Some(ids)
        }
        Some(v) => return Err(format!("'workers' must be a list of worker ids, not {v}")),
    };
    Ok(RunRequest {
        graph,
        inputs,
        placement,
        config,
        seed,
    })
}

/// Checks a graph against the server's size limits at a batch size, before planning.
pub fn check_limits(graph: &Graph, batch: usize) -> Result<(), String> {
    if let Some(file) = &graph.doc.params.file {
        return Err(format!(
            "the graph takes its weights from the file '{file}', which the server cannot read yet; \
             use seeded weights (\"params\": {{\"seed\": ...}}) or `sluice run` on the command line"
        ));
    }
    if graph.doc.nodes.len() > MAX_NODES {
        return Err(format!(
            "{} nodes exceed the server's limit of {MAX_NODES}",
            graph.doc.nodes.len()
        ));
    }
    for (name, decl) in &graph.doc.inputs {
        let mut n: usize = 1;
        for d in &decl.shape {
            let v = match d {
                Dim::Known(k) => *k,
                Dim::Sym(_) => batch,
            };
            n = n.saturating_mul(v);
        }
        if n > MAX_INPUT_ELEMENTS {
            return Err(format!(
                "input '{name}' would hold {n} elements, over the limit of {MAX_INPUT_ELEMENTS}"
            ));
        }
    }
    Ok(())
}

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
    pub fn send(&self, text: String) {
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

/// Figures of the last finished run, for `/metrics` and `/api/devices`.
#[derive(Debug, Clone, Default)]
pub struct LastRun {
    /// Utilisation per device.
    pub utilisation: Vec<f64>,
    /// Planned peak bytes.
    pub planned_bytes: u64,
    /// Allocated bytes.
    pub allocated_bytes: u64,
}

/// Utilisation per device while a run goes: busy time of its compute events over the run's
/// elapsed time so far, published to [`LastRun`] as events arrive.
#[derive(Default)]
struct LiveUtilisation {
    busy: Mutex<(Vec<u64>, u64)>,
}

impl LiveUtilisation {
    fn record(&self, e: &sluice_engine::telemetry::Event, last: &Mutex<LastRun>) {
        if e.kind != sluice_engine::telemetry::EventKind::Compute {
            return;
        }
        let Ok(mut b) = self.busy.lock() else { return };
        if b.0.len() <= e.device {
            b.0.resize(e.device + 1, 0);
        }
        b.0[e.device] += e.duration_ns();
        b.1 = b.1.max(e.end_ns);
        let wall = b.1.max(1) as f64;
        if let Ok(mut l) = last.lock() {
            l.utilisation = b.0.iter().map(|&x| (x as f64 / wall).min(1.0)).collect();
        }
    }
}

/// The run queue and executors.
pub struct Runs {
    tx: mpsc::Sender<String>,
    workers: Arc<Workers>,
    live: Mutex<HashMap<String, Live>>,
    /// Figures of the last finished run.
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
    /// Starts `concurrency` executors behind a queue of `capacity` runs.
    pub fn start(
        db: Arc<Db>,
        ws: Workspace,
        workers: Arc<Workers>,
        capacity: usize,
        concurrency: usize,
    ) -> Arc<Runs> {
        let (tx, rx) = mpsc::channel::<String>(capacity.max(1));
        let runs = Arc::new(Runs {
            tx,
            workers,
            live: Mutex::new(HashMap::new()),
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

    fn new_id(&self) -> String {
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        let mut rng = sluice_engine::rng::Rng::new(
            sluice_engine::telemetry::now_ns() ^ (n << 32) ^ u64::from(std::process::id()),
        );
        format!("{:016x}", rng.next_u64())
    }

    /// Records and queues a run; `Full` (nothing recorded) when the queue is full.
    pub fn enqueue(&self, db: &Db, graph_label: &str, params: &Value) -> anyhow::Result<Enqueued> {
        let id = self.new_id();
        db.insert(&id, graph_label, params)?;
        let events = Arc::new(EventLog::new());
        self.live
            .lock()
            .map_err(|_| anyhow::anyhow!("lock poisoned"))?
            .insert(
                id.clone(),
                Live {
                    cancel: Arc::new(AtomicBool::new(false)),
                    events,
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

    fn finish_live(&self, id: &str, summary: &Value) {
        if let Ok(mut l) = self.live.lock() {
            if let Some(live) = l.remove(id) {
                live.events
                    .send(json!({ "type": "summary", "run": summary }).to_string());
            }
        }
    }

    async fn execute(self: &Arc<Runs>, db: &Arc<Db>, ws: &Workspace, id: &str) {
        let started = matches!(db.start(id), Ok(true));
        if !started {
            let summary = summary_of(db, id);
            self.finish_live(id, &summary);
            return;
        }
        let (cancel, events) = match self
            .live
            .lock()
            .ok()
            .and_then(|l| l.get(id).map(|r| (r.cancel.clone(), r.events.clone())))
        {
            Some(x) => x,
            None => return,
        };
        let row = db.get(id).ok().flatten();
        let (db2, ws2, id2, runs) = (db.clone(), ws.clone(), id.to_string(), self.clone());
        let outcome = tokio::task::spawn_blocking(move || {
            let row = row.ok_or_else(|| "the run disappeared from the database".to_string())?;
            run_blocking(&row, &ws2, &cancel, &events, &runs)
        })
        .await
        .unwrap_or_else(|e| Err(format!("the run's thread failed: {e}")));
        let result = match outcome {
            Ok((metrics, outputs)) => {
                db2.finish(&id2, "succeeded", Some(&metrics), Some(&outputs), None)
            }
            Err(e) if e == "cancelled" => db2.finish(
                &id2,
                "cancelled",
                None,
                None,
                Some("cancelled while running"),
            ),
            Err(e) => db2.finish(&id2, "failed", None, None, Some(&e)),
        };
        if let Err(e) = result {
            tracing::error!("recording the end of run {id2} failed: {e:#}");
        }
        let summary = summary_of(db, id);
        self.finish_live(id, &summary);
    }
}

/// The stored record of a run as JSON (null when it is gone).
fn summary_of(db: &Db, id: &str) -> Value {
    db.get(id)
        .ok()
        .flatten()
        .map(|r| serde_json::to_value(r).unwrap_or_default())
        .unwrap_or_default()
}

/// Writes a run's outputs as `runs/ID/NAME.npy` and returns their summaries.
fn store_outputs(
    ws: &Workspace,
    id: &str,
    outputs: &[(String, sluice_engine::Tensor)],
) -> Result<Value, String> {
    let dir = ws.run_dir(id);
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let mut summaries = Vec::new();
    for (name, t) in outputs {
        let file = name.replace(':', "_");
        let bytes = sluice_engine::npy::to_bytes(t).map_err(|e| e.to_string())?;
        std::fs::write(dir.join(format!("{file}.npy")), bytes).map_err(|e| e.to_string())?;
        summaries.push(json!({
            "name": name, "file": file, "shape": t.shape, "dtype": t.dtype(),
            "first": t.to_f32_vec().into_iter().take(8).collect::<Vec<_>>(),
            "checksum": t.checksum(), "non_finite": t.non_finite(),
        }));
    }
    Ok(Value::Array(summaries))
}

/// Keeps a finished run's events for late watchers and its trace; a failure to keep them
/// is logged, not fatal (the outputs are what the run was for).
fn store_events(
    ws: &Workspace,
    id: &str,
    events: &[sluice_engine::telemetry::Event],
    devices: &[String],
) {
    if let Err(e) = ws.write_run_events(id, events, devices) {
        tracing::warn!("run {id}: its events were not kept: {e:#}");
    }
}

/// Runs a stored request on the local adapter; returns (metrics, output summaries).
fn run_blocking(
    row: &RunRow,
    ws: &Workspace,
    cancel: &AtomicBool,
    events: &EventLog,
    runs: &Runs,
) -> Result<(Value, Value), String> {
    let req = parse_request(&row.params)?;
    let text = match &req.graph {
        GraphSource::Stored(name) => ws
            .read_graph(name)
            .map_err(|e| format!("{e:#}"))?
            .ok_or_else(|| format!("graph '{name}' no longer exists"))?,
        GraphSource::Inline(doc) => doc.to_string(),
    };
    let graph = sluice_engine::load_graph(&text).map_err(|p| p.render())?;
    check_limits(&graph, req.config.batch)?;
    let weights = sluice_engine::weights::init_weights(&graph, graph.doc.params.seed.unwrap_or(0));
    let bindings: HashMap<String, usize> = graph
        .symbols()
        .into_iter()
        .map(|s| (s, req.config.batch))
        .collect();
    let bound = graph.bind(&bindings).map_err(|p| p.render())?;
    let mut data =
        sluice_engine::runtime::random_inputs(&bound, req.seed).map_err(|e| e.to_string())?;
    for (name, t) in &req.inputs {
        data.insert(name.clone(), t.clone());
    }
    sluice_engine::runtime::check_inputs(&bound, &data).map_err(|e| e.to_string())?;
    let mut remote = runs.workers.list();
    if let Some(ids) = &req.placement {
        let mut pinned = Vec::new();
        for id in ids {
            match remote.iter().find(|w| &w.id == id) {
                Some(w) => pinned.push(w.clone()),
                None => return Err(format!("worker '{id}' named in 'workers' is not connected")),
            }
        }
        remote = pinned;
    }
    if req.config.stages > 1 && remote.len() >= req.config.stages {
        return run_on_workers(row, &req, &graph, &data, &remote, ws, cancel, events, runs);
    }
    let mut session = Session::new(&graph, &weights, &req.config).map_err(|e| e.to_string())?;
    let live = LiveUtilisation::default();
    let observe = |e: &sluice_engine::telemetry::Event| {
        events.send(json!({ "type": "event", "event": e }).to_string());
        live.record(e, &runs.last);
    };
    let report =
        match session.run_observed(&data, &row.id, &|_, _| {}, Some(&observe), Some(cancel)) {
            Ok(r) => r,
            Err(RunError::Cancelled) => return Err("cancelled".into()),
            Err(e) => return Err(e.to_string()),
        };
    let metrics = serde_json::to_value(&report.metrics).map_err(|e| e.to_string())?;
    events.send(json!({ "type": "metrics", "metrics": metrics }).to_string());
    let outputs = store_outputs(ws, &row.id, &report.outputs)?;
    let devices = session.device_names();
    store_events(ws, &row.id, &report.events, &devices);
    if let Ok(mut last) = runs.last.lock() {
        *last = LastRun {
            utilisation: report
                .metrics
                .devices
                .iter()
                .map(|d| d.utilisation)
                .collect(),
            planned_bytes: session.memory().planned_bytes,
            allocated_bytes: session.allocated_bytes(),
        };
    }
    let memory = json!({
        "planned_bytes": session.memory().planned_bytes,
        "allocated_bytes": session.allocated_bytes(),
    });
    Ok((
        json!({ "metrics": metrics, "timing": report.timing, "devices": devices, "memory": memory }),
        outputs,
    ))
}

/// Places the stages of a run on remote workers, one stage each, and stores the outputs.
#[allow(clippy::too_many_arguments)]
fn run_on_workers(
    row: &RunRow,
    req: &RunRequest,
    graph: &Graph,
    data: &HashMap<String, sluice_engine::Tensor>,
    workers: &[super::workers::WorkerHandle],
    ws: &Workspace,
    cancel: &AtomicBool,
    events: &EventLog,
    runs: &Runs,
) -> Result<(Value, Value), String> {
    let cfg = &req.config;
    let micro = cfg.batch / cfg.microbatches;
    let bindings: HashMap<String, usize> =
        graph.symbols().into_iter().map(|s| (s, micro)).collect();
    let bound = graph.bind(&bindings).map_err(|p| p.render())?;
    let micro_batches: Vec<HashMap<String, sluice_engine::Tensor>> = (0..cfg.microbatches)
        .map(|m| dataset::slice(graph, data, m * micro, (m + 1) * micro))
        .collect();
    let live = LiveUtilisation::default();
    let observe = |e: &sluice_engine::telemetry::Event| {
        events.send(json!({ "type": "event", "event": e }).to_string());
        live.record(e, &runs.last);
    };
    let (values, evs) = run_remote(
        workers,
        &bound,
        cfg.stages,
        cfg.precision.name(),
        &row.id,
        micro_batches,
        &observe,
        cancel,
    )?;
    let per_mb = values
        .iter()
        .map(|v| dataset::graph_outputs(graph, v))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("the workers' results: {e}"))?;
    let outputs = dataset::concat_outputs(graph, &per_mb).map_err(|e| e.to_string())?;
    let outputs = store_outputs(ws, &row.id, &outputs)?;
    let metrics =
        sluice_engine::telemetry::metrics::compute(&evs, cfg.stages, cfg.microbatches, cfg.batch);
    let metrics = serde_json::to_value(&metrics).map_err(|e| e.to_string())?;
    let names: Vec<String> = workers
        .iter()
        .take(cfg.stages)
        .map(|w| format!("worker {} ({})", w.id, w.name))
        .collect();
    store_events(ws, &row.id, &evs, &names);
    Ok((
        json!({ "metrics": metrics, "timing": "host_completion", "devices": names }),
        outputs,
    ))
}
