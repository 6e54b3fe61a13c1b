//! `/metrics` in the Prometheus text format: runs by status, a run-duration histogram,
//! device utilisation and memory of the last run, workers connected.

use super::state::AppState;
use std::fmt::Write;

/// Histogram bucket bounds, seconds.
const BUCKETS: &[f64] = &[0.1, 0.5, 1.0, 5.0, 30.0, 120.0, 600.0];

/// Renders the metrics (counts and durations aggregated by the database).
pub fn render(state: &AppState) -> anyhow::Result<String> {
    let mut out = String::new();
    writeln!(
        out,
        "# HELP sluice_runs Runs by status.\n# TYPE sluice_runs gauge"
    )?;
    for (status, n) in state.db.counts()? {
        writeln!(out, "sluice_runs{{status=\"{status}\"}} {n}")?;
    }
    let d = state.db.durations(BUCKETS)?;
    writeln!(out, "# HELP sluice_run_duration_seconds Time from start to end of finished runs.\n# TYPE sluice_run_duration_seconds histogram")?;
    for (b, n) in BUCKETS.iter().zip(&d.within) {
        writeln!(out, "sluice_run_duration_seconds_bucket{{le=\"{b}\"}} {n}")?;
    }
    writeln!(
        out,
        "sluice_run_duration_seconds_bucket{{le=\"+Inf\"}} {}",
        d.count
    )?;
    writeln!(out, "sluice_run_duration_seconds_sum {}", d.sum)?;
    writeln!(out, "sluice_run_duration_seconds_count {}", d.count)?;
    let last = state
        .runs
        .last
        .lock()
        .map(|l| l.clone())
        .unwrap_or_default();
    writeln!(out, "# HELP sluice_device_utilisation Busy share of the last run, per device.\n# TYPE sluice_device_utilisation gauge")?;
    for (i, u) in last.utilisation.iter().enumerate() {
        writeln!(
            out,
            "sluice_device_utilisation{{worker=\"local\",device=\"{i}\"}} {u}"
        )?;
    }
    writeln!(out, "# HELP sluice_device_memory_bytes Memory of the last run.\n# TYPE sluice_device_memory_bytes gauge")?;
    writeln!(
        out,
        "sluice_device_memory_bytes{{worker=\"local\",kind=\"planned\"}} {}",
        last.memory.planned_bytes
    )?;
    writeln!(
        out,
        "sluice_device_memory_bytes{{worker=\"local\",kind=\"allocated\"}} {}",
        last.memory.allocated_bytes
    )?;
    writeln!(out, "# HELP sluice_workers_connected Workers serving runs.\n# TYPE sluice_workers_connected gauge")?;
    writeln!(out, "sluice_workers_connected{{kind=\"local\"}} 1")?;
    writeln!(
        out,
        "sluice_workers_connected{{kind=\"remote\"}} {}",
        state.workers.list().len()
    )?;
    Ok(out)
}
