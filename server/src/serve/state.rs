//! The state every handler shares: workspace, run history, runs, workers, settings.

use super::db::Db;
use super::runs::Runs;
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
    /// Required bearer token, if any.
    pub token: Option<String>,
    /// Largest request body, in bytes.
    pub body_limit: usize,
    /// The local adapters (the in-process worker's).
    pub adapters: Vec<AdapterSummary>,
    /// Connected remote workers.
    pub workers: Arc<Workers>,
    /// The editor bundle's folder (None: serve a plain page at `/`).
    pub editor: Option<std::path::PathBuf>,
}

/// The state handlers receive.
pub type AppState = Arc<Shared>;
