//! The state every handler shares: workspace, run history, runs, workers, the request
//! guards' settings, the body reader and the turns of heavy work.

use super::body::Bodies;
use super::db::Db;
use super::editor::Bundle;
use super::guard::Gate;
use super::runs::Runs;
use super::work::Work;
use super::workers::Workers;
use super::workspace::Workspace;
use sluice_engine::gpu::AdapterSummary;
use std::sync::Arc;

/// Shared server state.
pub struct Shared {
    /// The workspace folder.
    pub workspace: Workspace,
    /// Run history.
    pub db: Arc<Db>,
    /// Queue and executors.
    pub runs: Arc<Runs>,
    /// The server's names and token, for the guards.
    pub gate: Arc<Gate>,
    /// Reads request bodies within their limits.
    pub bodies: Bodies,
    /// Turns of CPU-heavy request work.
    pub work: Work,
    /// The engine's limits on documents, graphs and runs.
    pub limits: sluice_engine::limits::Limits,
    /// Most graphs stored (`--max-graphs`).
    pub max_graphs: usize,
    /// The local adapters (the in-process worker's).
    pub adapters: Vec<AdapterSummary>,
    /// Connected remote workers.
    pub workers: Arc<Workers>,
    /// The editor bundle (None: serve a plain page at `/`).
    pub editor: Option<Bundle>,
}

/// The state handlers receive.
pub type AppState = Arc<Shared>;
