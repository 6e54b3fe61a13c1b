//! Printing what runs measured: metrics tables, and Chrome trace files.

use anyhow::{Context, Result};
use sluice_engine::exec::{RunReport, Session};
use sluice_engine::telemetry::trace::chrome_trace;
use std::path::Path;

/// Bytes as MiB.
pub fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 20) as f64
}

/// Writes the run's events as a Chrome trace.
pub fn write_trace(path: &Path, report: &RunReport, session: &Session) -> Result<()> {
    let doc = chrome_trace(&report.events, &session.device_names());
    crate::files::write_path_durably(path, &serde_json::to_vec(&doc)?)
        .with_context(|| format!("cannot write trace {}", path.display()))
}

/// Prints the metrics of a run as a table.
pub fn print_metrics(report: &RunReport, session: &Session) {
    let m = &report.metrics;
    println!(
        "  throughput:   {:.1} samples/s ({} samples in {:.3} ms, {} micro-batches of {})",
        m.throughput,
        m.samples,
        m.wall_ns as f64 / 1e6,
        report.micro_batches,
        session.micro_batch_size()
    );
    println!(
        "  latency:      p50 {:.3} ms, p99 {:.3} ms per micro-batch",
        m.latency_p50_ns as f64 / 1e6,
        m.latency_p99_ns as f64 / 1e6
    );
    let names = session.device_names();
    for d in &m.devices {
        println!(
            "  device {} (stage {}): utilisation {:.1}% (steady state {:.1}%), busy {:.3} ms  [{}]",
            d.device,
            d.stage,
            100.0 * d.utilisation,
            100.0 * d.steady_utilisation,
            d.busy_ns as f64 / 1e6,
            names.get(d.device).map(String::as_str).unwrap_or("?")
        );
    }
    if let (Some(b), Some(i)) = (m.bubble_fraction, m.ideal_bubble) {
        println!(
            "  bubble:       {:.1}% measured, {:.1}% ideal (S-1)/(M+S-1) over the run's {} micro-batches",
            100.0 * b,
            100.0 * i,
            report.micro_batches
        );
    }
    println!(
        "  overlap:      {:.1}% of upload time hidden under compute",
        100.0 * m.overlap
    );
    let mem = session.memory();
    println!(
        "  memory:       planned peak {:.2} MiB (naive {:.2} MiB, {:.0}%), weights {:.2} MiB, allocated {:.2} MiB",
        mib(mem.planned_bytes),
        mib(mem.naive_bytes),
        100.0 * mem.planned_bytes as f64 / mem.naive_bytes.max(1) as f64,
        mib(mem.weight_bytes),
        mib(session.allocated_bytes())
    );
    if let Some(policy) = &report.half_policy {
        for (i, line) in policy.describe().iter().enumerate() {
            let head = if i == 0 {
                "  f32 kept:     "
            } else {
                "                "
            };
            println!("{head}{line}");
        }
    }
    println!("  timing:       {:?}", report.timing);
    if !m.top_nodes.is_empty() {
        println!("  most expensive nodes (each stage's busy time shared by its nodes):");
        for n in &m.top_nodes {
            println!(
                "    {:<40} stage {:<3} {:>10.3} ms {:>6.1}%",
                n.node,
                n.stage,
                n.total_ns as f64 / 1e6,
                100.0 * n.share
            );
        }
    }
}
