//! Chrome Trace Event JSON (opens in Perfetto and chrome://tracing): one process per
//! device; per stage, one compute track where each micro-batch is a slice holding its
//! nodes' slices, and one track for its uploads, downloads and transfers. Slice categories
//! are the event kinds.

use super::{Event, EventKind};
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// Track id of a stage's compute track.
pub fn compute_tid(stage: usize) -> usize {
    2 * stage
}

/// Track id of a stage's upload/download/transfer track.
pub fn io_tid(stage: usize) -> usize {
    2 * stage + 1
}

fn us(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

/// Renders events as a Chrome trace document.
pub fn chrome_trace(events: &[Event], device_names: &[String]) -> Value {
    let mut out: Vec<Value> = Vec::new();
    let mut tracks: BTreeMap<(usize, usize), ()> = BTreeMap::new();
    for e in events {
        tracks.insert((e.device, e.stage), ());
    }
    let mut named_devices = std::collections::BTreeSet::new();
    for &(device, stage) in tracks.keys() {
        if named_devices.insert(device) {
            let name = device_names
                .get(device)
                .cloned()
                .unwrap_or_else(|| format!("device {device}"));
            out.push(json!({ "name": "process_name", "ph": "M", "pid": device, "args": { "name": format!("device {device}: {name}") } }));
        }
        out.push(json!({ "name": "thread_name", "ph": "M", "pid": device, "tid": compute_tid(stage), "args": { "name": format!("stage {stage} compute") } }));
        out.push(json!({ "name": "thread_name", "ph": "M", "pid": device, "tid": io_tid(stage), "args": { "name": format!("stage {stage} upload/download/transfer") } }));
    }
    // Micro-batch envelopes on compute tracks.
    let mut envelopes: BTreeMap<(usize, usize, usize), (u64, u64)> = BTreeMap::new();
    for e in events.iter().filter(|e| e.kind == EventKind::Compute) {
        let s = envelopes
            .entry((e.device, e.stage, e.micro_batch))
            .or_insert((e.start_ns, e.end_ns));
        s.0 = s.0.min(e.start_ns);
        s.1 = s.1.max(e.end_ns);
    }
    let mut slices: Vec<(u64, Value)> = Vec::new();
    for (&(device, stage, mb), &(s, e)) in &envelopes {
        slices.push((
            s,
            json!({ "name": format!("micro-batch {mb}"), "cat": "micro_batch", "ph": "X", "ts": us(s), "dur": us(e - s),
                    "pid": device, "tid": compute_tid(stage), "args": { "micro_batch": mb } }),
        ));
    }
    for e in events {
        if e.kind == EventKind::Idle {
            continue;
        }
        let tid = if e.kind == EventKind::Compute {
            compute_tid(e.stage)
        } else {
            io_tid(e.stage)
        };
        let cat = serde_json::to_value(e.kind).unwrap_or(Value::Null);
        slices.push((
            e.start_ns,
            json!({ "name": e.node, "cat": cat, "ph": "X", "ts": us(e.start_ns), "dur": us(e.duration_ns()),
                    "pid": e.device, "tid": tid, "args": { "micro_batch": e.micro_batch, "run": e.run } }),
        ));
    }
    slices.sort_by_key(|(s, _)| *s);
    out.extend(slices.into_iter().map(|(_, v)| v));
    json!({ "traceEvents": out, "displayTimeUnit": "ns" })
}
