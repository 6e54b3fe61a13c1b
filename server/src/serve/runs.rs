//! Runs: a bounded queue (runs a previous server left queued are queued again first),
//! executors that run graphs through the engine's one execution core on blocking threads
//! (on the server's own GPU devices, or with each stage on a remote worker), cancellation,
//! the live messages each run broadcasts to WebSocket watchers, retention of the newest
//! `--keep-runs` finished runs, and a cache of compiled sessions per (graph content,
//! configuration, devices), so repeating a run compiles nothing. Every outcome is stored
//! in the database, a failure with its reason (never a server path: details are logged).

use super::db::Db;
use super::events::{EventLog, Watch};
use super::prepare::{check_runnable, run_weights, Prepared, Source};
use super::workers::{RemoteDevice, WorkerHandle, Workers};
use super::workspace::Workspace;
use sluice_api::{
    CompileFigures, GraphRef, LiveMessage, MemoryFigures, OutputSummary, RequestForm, RunFigures,
    RunRecord, RunRequest, RunStatus,
};
use sluice_engine::exec::device::{check_weights_fit, Device};
use sluice_engine::exec::{dataset, RunConfig, RunContext, Session};
use sluice_engine::gpu::{GpuContext, GpuDevice};
use sluice_engine::plan::cost::Rates;
use sluice_engine::telemetry::metrics::LiveUtilisation;
use sluice_engine::telemetry::{now_ns, Event};
use sluice_engine::RunError;
use std::collections::hash_map::RandomState;
use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::mpsc;

/// Locks a mutex, recovering it if a panicking run poisoned it (a failed run must not
/// fail every later one).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Logs a failure whose detail may name server paths and returns a sentence for the
/// run's record.
fn logged(run: &str, what: &str, e: &anyhow::Error) -> String {
    tracing::error!("run {run}: {what}: {e:#}");
    format!("{what} (the detail is in the server's log)")
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

/// Compiled sessions kept for repeated runs: most recently used last, keyed by a hash of
/// (devices, configuration, graph text) under a key chosen at random per process, so
/// keys cannot be made to collide and the graph texts are not kept.
struct PlanCache {
    capacity: usize,
    hasher: RandomState,
    entries: VecDeque<(u64, Session)>,
}

impl PlanCache {
    /// A compiled session's key: its devices, configuration, graph text and weights file
    /// (a model put again under the same name has the same text but other weights).
    fn key(&self, devices: &str, config: &RunConfig, text: &str, weights: &[u8]) -> u64 {
        let config = serde_json::to_string(config).unwrap_or_default();
        self.hasher.hash_one((devices, config, text, weights))
    }

    fn take(&mut self, key: u64) -> Option<Session> {
        let i = self.entries.iter().position(|(k, _)| *k == key)?;
        self.entries.remove(i).map(|(_, s)| s)
    }

    fn put(&mut self, key: u64, session: Session) {
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
                    rates: self.rates,
                    ..GpuDevice::new(ctx.clone())
                }) as Box<dyn Device>
            })
            .collect())
    }
}

/// A run's devices, and what names them for the plan cache (None: not cacheable).
type RunDevices = (Vec<Box<dyn Device>>, Option<String>);

/// A kept request's graph text, uploaded inputs and sent weights.
type KeptRequest = (String, sluice_engine::exec::Values, Option<Vec<u8>>);

/// How the queue and the executors are set up.
#[derive(Debug, Clone)]
pub struct RunSettings {
    /// Runs waiting at most (`--max-queued`).
    pub max_queued: usize,
    /// Runs executing at once (`--concurrency`).
    pub concurrency: usize,
    /// Compiled sessions kept (`--plan-cache`).
    pub plan_cache: usize,
    /// Finished runs kept with their files (`--keep-runs`).
    pub keep_runs: usize,
    /// Bytes of messages a live run keeps for late watchers (`--event-backlog`).
    pub event_backlog: usize,
    /// The engine's limits every run is checked against again when it starts.
    pub limits: sluice_engine::limits::Limits,
}

/// The run queue, executors, live runs and compiled sessions.
pub struct Runs {
    tx: mpsc::UnboundedSender<String>,
    /// Runs queued and not yet taken by an executor, with the places reserved by
    /// requests being checked; new requests are refused at `max_queued`.
    waiting: AtomicUsize,
    settings: RunSettings,
    workers: Arc<Workers>,
    live: Mutex<HashMap<String, Live>>,
    cache: Mutex<PlanCache>,
    local: Mutex<LocalDevices>,
    rates: Mutex<Option<Rates>>,
    /// Figures of the last run on the local devices.
    pub last: Mutex<LastRun>,
    counter: AtomicU64,
}

/// A place in the queue, reserved before a request is checked (so a full queue is
/// answered at once) and given back unless the run is accepted.
pub struct Place {
    runs: Arc<Runs>,
    used: bool,
}

impl Drop for Place {
    fn drop(&mut self) {
        if !self.used {
            self.runs.waiting.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl Runs {
    /// Starts the executors behind a queue that first holds the runs a previous server
    /// left queued, in their order.
    pub fn start(
        db: Arc<Db>,
        ws: Workspace,
        workers: Arc<Workers>,
        settings: RunSettings,
        queued: Vec<String>,
    ) -> Arc<Runs> {
        let (tx, rx) = mpsc::unbounded_channel::<String>();
        let (executors, plan_cache) = (settings.concurrency.max(1), settings.plan_cache);
        let runs = Arc::new(Runs {
            tx,
            waiting: AtomicUsize::new(0),
            settings,
            workers,
            live: Mutex::new(HashMap::new()),
            cache: Mutex::new(PlanCache {
                capacity: plan_cache,
                hasher: RandomState::new(),
                entries: VecDeque::new(),
            }),
            local: Mutex::new(LocalDevices::default()),
            rates: Mutex::new(None),
            last: Mutex::new(LastRun::default()),
            counter: AtomicU64::new(0),
        });
        for id in queued {
            runs.add_live(&id);
            runs.waiting.fetch_add(1, Ordering::AcqRel);
            let _ = runs.tx.send(id);
        }
        let rx = Arc::new(tokio::sync::Mutex::new(rx));
        for _ in 0..executors {
            let (runs, db, ws, rx) = (runs.clone(), db.clone(), ws.clone(), rx.clone());
            tokio::spawn(async move {
                loop {
                    let next = rx.lock().await.recv().await;
                    let Some(id) = next else { break };
                    runs.waiting.fetch_sub(1, Ordering::AcqRel);
                    let (runs, db, ws) = (runs.clone(), db.clone(), ws.clone());
                    let done = tokio::task::spawn_blocking(move || runs.execute(&db, &ws, &id));
                    if let Err(e) = done.await {
                        tracing::error!("an executor failed: {e}");
                    }
                }
            });
        }
        runs
    }

    /// Opens the local device and calibrates it (or reads its kept calibration), so the
    /// first run does not wait for it and `/api/devices` reports the rates.
    pub fn prepare_local(&self) {
        if let Err(e) = self.take_local(1) {
            tracing::warn!("the local device is not ready: {e}");
        }
    }

    /// `count` local devices (opening and calibrating them may take seconds, under the
    /// devices' lock; their rates are published for readers that must not wait).
    fn take_local(&self, count: usize) -> Result<Vec<Box<dyn Device>>, String> {
        let mut local = lock(&self.local);
        let devices = local.take(count);
        *lock(&self.rates) = local.rates;
        devices
    }

    /// The calibrated rates of the local devices, once known (never waits for a
    /// calibration).
    pub fn local_rates(&self) -> Option<Rates> {
        *lock(&self.rates)
    }

    /// Reserves a place in the queue; None when it is full.
    pub fn reserve(self: &Arc<Runs>) -> Option<Place> {
        let before = self.waiting.fetch_add(1, Ordering::AcqRel);
        let place = Place {
            runs: self.clone(),
            used: false,
        };
        (before < self.settings.max_queued).then_some(place)
    }

    fn new_id(&self) -> String {
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        let mut rng =
            sluice_engine::rng::Rng::new(now_ns() ^ (n << 32) ^ u64::from(std::process::id()));
        format!("{:016x}", rng.next_u64())
    }

    fn add_live(&self, id: &str) {
        lock(&self.live).insert(
            id.to_string(),
            Live {
                cancel: Arc::new(AtomicBool::new(false)),
                events: Arc::new(EventLog::new(self.settings.event_backlog)),
            },
        );
    }

    /// Accepts a checked run in its reserved place: keeps its files, records it (the
    /// request as kept) and queues it. Returns its id.
    pub fn accept(
        &self,
        mut place: Place,
        db: &Db,
        ws: &Workspace,
        run: Prepared,
    ) -> anyhow::Result<String> {
        let id = self.new_id();
        let kept = serde_json::to_value(run.kept())?;
        let recorded = ws
            .keep_request(&id, run.inline.as_deref(), &run.uploads)
            .and_then(|()| match &run.weights {
                Some(bytes) => ws.keep_weights(&id, bytes),
                None => Ok(()),
            })
            .and_then(|()| db.insert(&id, &run.label, &kept, &run.seeded));
        if let Err(e) = recorded {
            let _ = ws.remove_run(&id);
            return Err(e);
        }
        self.add_live(&id);
        place.used = true;
        if self.tx.send(id.clone()).is_err() {
            anyhow::bail!("the executors have stopped");
        }
        Ok(id)
    }

    /// Watches a live run (None when it is not live).
    pub fn watch(&self, id: &str) -> Option<Watch> {
        let log = lock(&self.live).get(id).map(|l| l.events.clone())?;
        Some(log.watch())
    }

    /// Asks a running run to stop; false when it is not live.
    pub fn cancel(&self, id: &str) -> bool {
        match lock(&self.live).get(id).map(|r| r.cancel.clone()) {
            Some(flag) => {
                flag.store(true, Ordering::Relaxed);
                true
            }
            None => false,
        }
    }

    fn finish_live(&self, id: &str, summary: Option<RunRecord>) {
        if let Some(live) = lock(&self.live).remove(id) {
            live.events.send(&LiveMessage::Summary {
                run: summary.map(Box::new),
            });
        }
    }

    /// Runs a queued run to its end (on a blocking thread), records the outcome, and
    /// prunes the history.
    fn execute(&self, db: &Db, ws: &Workspace, id: &str) {
        let started = match db.start(id) {
            Ok(s) => s,
            Err(e) => {
                tracing::error!("run {id}: cannot record its start: {e:#}");
                false
            }
        };
        if !started {
            self.finish_live(id, db.get(id).ok().flatten());
            return;
        }
        let Some((cancel, events)) = lock(&self.live)
            .get(id)
            .map(|r| (r.cancel.clone(), r.events.clone()))
        else {
            return;
        };
        let outcome = match db.get(id) {
            Ok(Some(row)) => std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                self.run_blocking(&row, ws, &cancel, &events)
            }))
            .unwrap_or_else(|_| {
                Err("the run failed unexpectedly (a bug; the detail is in the server's log)".into())
            }),
            Ok(None) => Err("the run disappeared from the database".into()),
            Err(e) => Err(logged(id, "cannot read the run's record", &e)),
        };
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
            Err(e) => db.finish(id, RunStatus::Failed, None, None, Some(&shortened(&e))),
        };
        if let Err(e) = result {
            tracing::error!("recording the end of run {id} failed: {e:#}");
        }
        self.finish_live(id, db.get(id).ok().flatten());
        prune(db, ws, self.settings.keep_runs);
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
        let devices = self.take_local(req.stages)?;
        Ok((devices, Some(format!("local x{}", req.stages))))
    }

    /// The graph text, uploaded inputs and sent weights (a safetensors file) of a kept
    /// request.
    fn kept_request(ws: &Workspace, id: &str, req: &RunRequest) -> Result<KeptRequest, String> {
        let text = match &req.graph {
            GraphRef::Stored(name) => ws
                .read_graph(name)
                .map_err(|e| logged(id, &format!("cannot read graph '{name}'"), &e))?
                .ok_or_else(|| format!("graph '{name}' no longer exists"))?,
            GraphRef::Kept(_) => ws
                .kept_graph(id)
                .map_err(|e| logged(id, "cannot read the run's kept graph", &e))?,
            GraphRef::Inline(_) => return Err("the run's graph was not kept".into()),
        };
        let mut inputs = HashMap::new();
        for (k, name) in req.inputs.keys().enumerate() {
            let bytes = ws
                .kept_input(id, k)
                .map_err(|e| logged(id, &format!("cannot read the kept input '{name}'"), &e))?;
            let t =
                sluice_engine::npy::parse(&bytes).map_err(|e| format!("input '{name}': {e}"))?;
            inputs.insert(name.clone(), t);
        }
        let weights = match &req.weights {
            None => None,
            Some(_) => Some(
                ws.kept_weights(id)
                    .map_err(|e| logged(id, "cannot read the run's kept weights", &e))?,
            ),
        };
        Ok((text, inputs, weights))
    }

    /// Runs a kept request; returns its figures and output summaries.
    fn run_blocking(
        &self,
        row: &RunRecord,
        ws: &Workspace,
        cancel: &Arc<AtomicBool>,
        events: &EventLog,
    ) -> Result<(RunFigures, Vec<OutputSummary>), String> {
        let began = now_ns();
        let req = RunRequest::parse_as(&row.params, RequestForm::Kept)?;
        let (text, uploaded, sent) = Runs::kept_request(ws, &row.id, &req)?;
        let limits = &self.settings.limits;
        let graph = sluice_engine::load_graph_with(&text, limits).map_err(|p| p.render())?;
        let config: RunConfig = req.config();
        let source = match &req.graph {
            GraphRef::Stored(_) => Source::Stored,
            _ => Source::Inline,
        };
        check_runnable(&graph, source, sent.is_some(), &config, limits)?;
        // Checked when the run was accepted too; a run queued by an older server is held
        // to the same rule.
        req.seeded_inputs(&graph)?;
        let data =
            dataset::complete(&graph, uploaded, req.seed, req.batch).map_err(|e| e.to_string())?;
        let (devices, device_key) = self.devices(&req, &row.id, cancel)?;
        // The weights are sized against the devices before they are made or read.
        check_weights_fit(&graph, config.precision, &devices).map_err(|e| e.to_string())?;
        let (weights, weights_bytes) = run_weights(ws, &graph, source, sent)?;
        let cache_key =
            device_key.map(|d| lock(&self.cache).key(&d, &config, &text, &weights_bytes));
        let cached = cache_key.and_then(|k| lock(&self.cache).take(k));
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
                let mut l = lock(&live);
                l.record(e);
                lock(&self.last).utilisation = l.utilisation();
            }
        };
        let ctx = RunContext {
            observer: Some(&observe),
            cancel: Some(cancel),
            ..RunContext::new(&row.id)
        };
        // A newly compiled session pays for its first dispatches (drivers compiling
        // pipelines, first allocations) in a warm-up pass, marked as such in the events,
        // so that the measured run and its figures show the steady pipeline. Inference
        // keeps no state, so the outputs are the same either way.
        let warmed = if was_cached {
            Ok(Vec::new())
        } else {
            session.warm_up_blocking(&data, &ctx)
        };
        let run_start = now_ns();
        let result = warmed.and_then(|_| session.run_blocking(&data, &ctx));
        let compile = CompileFigures {
            cached: was_cached,
            stats: if was_cached {
                Default::default()
            } else {
                session.compile_stats()
            },
            first_result_ms: result.as_ref().map_or(0.0, |r| {
                run_start
                    .saturating_sub(began)
                    .saturating_add(r.first_result_ns) as f64
                    / 1e6
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
            lock(&self.cache).put(k, session);
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
            *lock(&self.last) = LastRun {
                utilisation: report
                    .metrics
                    .devices
                    .iter()
                    .map(|d| d.utilisation)
                    .collect(),
                memory,
            };
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

/// Longest failure reason kept in a run's record, bytes (a graph's problems can be many;
/// records are listed a thousand at a time).
const MAX_REASON: usize = 4096;

/// A failure reason cut to [`MAX_REASON`] bytes, saying how much was cut.
fn shortened(reason: &str) -> String {
    if reason.len() <= MAX_REASON {
        return reason.to_string();
    }
    let mut end = MAX_REASON;
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} more bytes)", &reason[..end], reason.len() - end)
}

/// Deletes the finished runs beyond the newest `keep`, with their files.
fn prune(db: &Db, ws: &Workspace, keep: usize) {
    match db.prune(keep) {
        Ok(gone) => {
            for id in gone {
                if let Err(e) = ws.remove_run(&id) {
                    tracing::warn!("run {id}: its files were not removed: {e:#}");
                }
            }
        }
        Err(e) => tracing::warn!("pruning the run history failed: {e:#}"),
    }
}

/// Tidies the history at startup: prunes it to `keep` finished runs and removes run
/// folders no record names (left by a server killed between keeping a request's files
/// and recording it, or between pruning a record and its files).
pub fn tidy(db: &Db, ws: &Workspace, keep: usize) -> anyhow::Result<()> {
    prune(db, ws, keep);
    for id in ws.run_ids()? {
        if !db.has(&id)? {
            ws.remove_run(&id)?;
        }
    }
    Ok(())
}

/// Writes a run's outputs as `runs/ID/FILE.npy` (file names from
/// [`sluice_api::output_files`]) and returns their summaries.
fn store_outputs(
    ws: &Workspace,
    id: &str,
    outputs: &[(String, sluice_engine::Tensor)],
) -> Result<Vec<OutputSummary>, String> {
    let files = sluice_api::output_files(outputs.iter().map(|(n, _)| n.as_str()));
    let mut summaries = Vec::new();
    for ((name, t), file) in outputs.iter().zip(files) {
        let bytes = sluice_engine::npy::to_bytes(t).map_err(|e| e.to_string())?;
        ws.write_output(id, &file, &bytes)
            .map_err(|e| logged(id, &format!("cannot write output '{file}'"), &e))?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_reasons_are_cut_on_a_character_boundary() {
        assert_eq!(shortened("short"), "short");
        let long = "é".repeat(MAX_REASON);
        let cut = shortened(&long);
        assert!(cut.len() < MAX_REASON + 40, "{}", cut.len());
        assert!(cut.ends_with(&format!("({} more bytes)", long.len() - MAX_REASON)));
    }
}
