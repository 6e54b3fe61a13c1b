//! `/metrics` in the Prometheus text format: runs by status, a run-duration histogram,
//! device utilisation and memory of the last run, workers connected.

use super::state::AppState;
use sluice_api::RunStatus;
use std::fmt::Write;

/// Histogram bucket bounds, seconds.
const BUCKETS: &[f64] = &[0.1, 0.5, 1.0, 5.0, 30.0, 120.0, 600.0];

/// Renders the metrics.
pub fn render(state: &AppState) -> anyhow::Result<String> {
    let runs = state.db.list()?;
    let mut out = String::new();
    writeln!(
        out,
        "# HELP sluice_runs Runs by status.\n# TYPE sluice_runs gauge"
    )?;
    for status in RunStatus::ALL {
        let n = runs.iter().filter(|r| r.status == status).count();
        writeln!(out, "sluice_runs{{status=\"{status}\"}} {n}")?;
    }
    let durations: Vec<f64> = runs
        .iter()
        .filter_map(|r| Some((r.finished_ms? - r.started_ms?) as f64 / 1e3))
        .collect();
    writeln!(out, "# HELP sluice_run_duration_seconds Time from start to end of finished runs.\n# TYPE sluice_run_duration_seconds histogram")?;
    for b in BUCKETS {
        let n = durations.iter().filter(|&&d| d <= *b).count();
        writeln!(out, "sluice_run_duration_seconds_bucket{{le=\"{b}\"}} {n}")?;
    }
    writeln!(
        out,
        "sluice_run_duration_seconds_bucket{{le=\"+Inf\"}} {}",
        durations.len()
    )?;
    writeln!(
        out,
        "sluice_run_duration_seconds_sum {}",
        durations.iter().sum::<f64>()
    )?;
    writeln!(out, "sluice_run_duration_seconds_count {}", durations.len())?;
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
