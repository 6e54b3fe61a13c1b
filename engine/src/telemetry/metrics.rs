//! Metrics from events, with fixed definitions:
//!
//! - utilisation of a device = busy time (union of its compute spans) / wall time of the
//!   run; steady state = the same from its second micro-batch's first pass to its last
//!   micro-batch's last pass (excluding warm-up and pipeline fill);
//! - bubble fraction = idle time of all stages / (stages × wall time), next to the GPipe
//!   figure (S−1)/(M+S−1);
//! - overlap = the share of upload time hidden under compute on the same device;
//! - throughput = samples / wall time; latency = per micro-batch, first upload to last
//!   download;
//! - a node's time = its part of its stage's busy time ([`node_times`]): every instant a
//!   stage computes is shared equally by the passes running then, and a fused pass's part
//!   equally by its nodes, so the nodes of a stage sum to exactly its busy time. The CLI's
//!   report, the server's run records and the editor's heat map all read it from here.

use super::{Event, EventKind};
use serde::Serialize;
use std::collections::BTreeMap;

/// Per device (stage) figures.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct DeviceMetrics {
    /// Device index.
    pub device: usize,
    /// Stage it ran.
    pub stage: usize,
    /// Busy nanoseconds.
    pub busy_ns: u64,
    /// Busy / wall.
    pub utilisation: f64,
    /// Busy / window over the steady state.
    pub steady_utilisation: f64,
}

/// Time spent in one node over the run ([`node_times`]).
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct NodeTime {
    /// Node id (or, for a compute event naming no node — host timing of a whole
    /// micro-batch, a remote stage's round trip —, its label).
    pub node: String,
    /// The pipeline stage that ran it.
    #[serde(default)]
    pub stage: usize,
    /// Its part of the stage's busy nanoseconds.
    pub total_ns: u64,
    /// Share of all stages' busy time.
    pub share: f64,
}

/// Everything derived from one run's events.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct Metrics {
    /// First event start to last event end.
    pub wall_ns: u64,
    /// Samples processed.
    pub samples: usize,
    /// Samples per second.
    pub throughput: f64,
    /// Median micro-batch latency.
    pub latency_p50_ns: u64,
    /// 99th percentile micro-batch latency.
    pub latency_p99_ns: u64,
    /// Per device.
    pub devices: Vec<DeviceMetrics>,
    /// Measured bubble fraction (pipelines of 2+ stages).
    pub bubble_fraction: Option<f64>,
    /// GPipe's (S−1)/(M+S−1).
    pub ideal_bubble: Option<f64>,
    /// Share of upload time hidden under compute.
    pub overlap: f64,
    /// The most expensive nodes ([`node_times`]), most expensive first, at most
    /// [`TOP_NODES`].
    pub top_nodes: Vec<NodeTime>,
}

/// Most nodes [`Metrics::top_nodes`] lists.
pub const TOP_NODES: usize = 10;

/// GPipe's ideal bubble fraction (S−1)/(M+S−1) with S stages and M micro-batches.
pub fn gpipe_bubble(stages: usize, micro_batches: usize) -> f64 {
    if stages == 0 || micro_batches == 0 {
        return 0.0;
    }
    (stages - 1) as f64 / micro_batches.saturating_add(stages - 1) as f64
}

/// Total length of the union of intervals.
pub fn union_ns(spans: &mut [(u64, u64)]) -> u64 {
    spans.sort_unstable();
    let mut total = 0u64;
    let mut cur: Option<(u64, u64)> = None;
    for &(s, e) in spans.iter() {
        match cur {
            Some((cs, ce)) if s <= ce => cur = Some((cs, ce.max(e))),
            Some((cs, ce)) => {
                total = total.saturating_add(ce.saturating_sub(cs));
                cur = Some((s, e));
            }
            None => cur = Some((s, e)),
        }
    }
    if let Some((cs, ce)) = cur {
        total = total.saturating_add(ce.saturating_sub(cs));
    }
    total
}

fn overlap_with(span: (u64, u64), merged: &[(u64, u64)]) -> u64 {
    merged
        .iter()
        .map(|&(s, e)| e.min(span.1).saturating_sub(s.max(span.0)))
        .fold(0u64, u64::saturating_add)
}

fn merged(mut spans: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    spans.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::new();
    for (s, e) in spans {
        match out.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => out.push((s, e)),
        }
    }
    out
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let idx = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

/// Derives the metrics of a run over `stages` stages and `micro_batches` micro-batches.
/// Warm-up events ([`Event::warm_up`]) are left out.
pub fn compute(events: &[Event], stages: usize, micro_batches: usize, samples: usize) -> Metrics {
    let all_events = events;
    let events: Vec<&Event> = events.iter().filter(|e| !e.warm_up).collect();
    let start = events.iter().map(|e| e.start_ns).min().unwrap_or(0);
    let end = events.iter().map(|e| e.end_ns).max().unwrap_or(0);
    let wall = end.saturating_sub(start).max(1);
    let mut by_device: BTreeMap<(usize, usize), Vec<&Event>> = BTreeMap::new();
    for &e in &events {
        by_device.entry((e.device, e.stage)).or_default().push(e);
    }
    let mut devices = Vec::new();
    let mut overlap_hidden = 0u64;
    let mut upload_total = 0u64;
    for (&(device, stage), evs) in &by_device {
        let compute: Vec<(u64, u64)> = evs
            .iter()
            .filter(|e| e.kind == EventKind::Compute)
            .map(|e| (e.start_ns, e.end_ns))
            .collect();
        let busy = union_ns(&mut compute.clone());
        let mbs: Vec<usize> = {
            let mut v: Vec<usize> = evs
                .iter()
                .filter(|e| e.kind == EventKind::Compute)
                .map(|e| e.micro_batch)
                .collect();
            v.sort_unstable();
            v.dedup();
            v
        };
        let steady = if mbs.len() >= 2 {
            let second = mbs[1];
            let w0 = evs
                .iter()
                .filter(|e| e.kind == EventKind::Compute && e.micro_batch == second)
                .map(|e| e.start_ns)
                .min()
                .unwrap_or(start);
            let w1 = compute.iter().map(|c| c.1).max().unwrap_or(end);
            let mut inside: Vec<(u64, u64)> = compute
                .iter()
                .filter(|c| c.1 > w0)
                .map(|&(s, e)| (s.max(w0), e.min(w1)))
                .collect();
            union_ns(&mut inside) as f64 / (w1.saturating_sub(w0)).max(1) as f64
        } else {
            busy as f64 / wall as f64
        };
        devices.push(DeviceMetrics {
            device,
            stage,
            busy_ns: busy,
            utilisation: busy as f64 / wall as f64,
            steady_utilisation: steady.min(1.0),
        });
        let m = merged(compute);
        for u in evs.iter().filter(|e| e.kind == EventKind::Upload) {
            upload_total = upload_total.saturating_add(u.duration_ns());
            overlap_hidden =
                overlap_hidden.saturating_add(overlap_with((u.start_ns, u.end_ns), &m));
        }
    }
    // Latency per micro-batch: first event to last event of that micro-batch.
    let mut spans: BTreeMap<usize, (u64, u64)> = BTreeMap::new();
    for e in &events {
        let s = spans.entry(e.micro_batch).or_insert((e.start_ns, e.end_ns));
        s.0 = s.0.min(e.start_ns);
        s.1 = s.1.max(e.end_ns);
    }
    let mut lat: Vec<u64> = spans.values().map(|(s, e)| e.saturating_sub(*s)).collect();
    lat.sort_unstable();
    let mut top_nodes = node_times(all_events);
    top_nodes.truncate(TOP_NODES);
    let (bubble_fraction, ideal_bubble) = if stages >= 2 {
        let idle: u64 = devices
            .iter()
            .map(|d| wall.saturating_sub(d.busy_ns))
            .fold(0u64, u64::saturating_add);
        (
            Some(idle as f64 / (stages as f64 * wall as f64)),
            Some(gpipe_bubble(stages, micro_batches)),
        )
    } else {
        (None, None)
    };
    Metrics {
        wall_ns: wall,
        samples,
        throughput: samples as f64 / (wall as f64 / 1e9),
        latency_p50_ns: percentile(&lat, 0.5),
        latency_p99_ns: percentile(&lat, 0.99),
        devices,
        bubble_fraction,
        ideal_bubble,
        overlap: if upload_total == 0 {
            0.0
        } else {
            overlap_hidden as f64 / upload_total as f64
        },
        top_nodes,
    }
}

/// The graph nodes a compute event's label names: `fc1`, or `fc1+act1 (fused)` for a
/// fused pass (the form of `plan::Step::label`). A label is split only when it says it is
/// fused.
pub fn label_nodes(label: &str) -> Vec<&str> {
    match label.strip_suffix(" (fused)") {
        Some(group) => {
            let nodes: Vec<&str> = group.split('+').filter(|s| !s.is_empty()).collect();
            if nodes.is_empty() {
                vec![label]
            } else {
                nodes
            }
        }
        None => vec![label],
    }
}

/// `total` split into `parts` whole parts that add up to it (the first ones one larger).
fn split_evenly(total: u64, parts: usize) -> impl Iterator<Item = u64> {
    let parts = parts.max(1) as u64;
    let (each, extra) = (total / parts, total % parts);
    (0..parts).map(move |i| each + u64::from(i < extra))
}

/// Compute nanoseconds of every node, per stage, over a run's measured events (warm-up
/// left out), most expensive first. Each stage's busy time (the union of its compute
/// spans, [`DeviceMetrics::busy_ns`]) is divided with nothing lost or counted twice: an
/// instant covered by several of its compute events is shared equally by them — except
/// that an event enclosing others of its micro-batch (a remote stage's round trip around
/// the worker's own passes) yields to them —, and an event's part equally by the nodes its
/// label names ([`label_nodes`]). So the nodes of a
/// stage sum to exactly its busy time, and a share is a part of all stages' busy time.
pub fn node_times(events: &[Event]) -> Vec<NodeTime> {
    let mut by_stage: BTreeMap<(usize, usize), Vec<&Event>> = BTreeMap::new();
    for e in events
        .iter()
        .filter(|e| e.kind == EventKind::Compute && !e.warm_up)
    {
        by_stage.entry((e.device, e.stage)).or_default().push(e);
    }
    let mut totals: BTreeMap<(usize, &str), u64> = BTreeMap::new();
    for ((_, stage), mut evs) in by_stage {
        evs.sort_by_key(|e| (e.start_ns, e.end_ns));
        // Each event's part of the busy time: a sweep over the span boundaries, sharing
        // each stretch between the events covering it.
        let mut part = vec![0u64; evs.len()];
        let mut bounds: Vec<u64> = evs.iter().flat_map(|e| [e.start_ns, e.end_ns]).collect();
        bounds.sort_unstable();
        bounds.dedup();
        let mut active: Vec<usize> = Vec::new();
        let mut next = 0;
        for w in bounds.windows(2) {
            let (from, to) = (w[0], w[1]);
            while next < evs.len() && evs[next].start_ns <= from {
                active.push(next);
                next += 1;
            }
            active.retain(|&i| evs[i].end_ns > from);
            // An event enclosing another of its micro-batch (a remote stage's round trip
            // around the worker's passes) keeps only what its detail leaves uncovered.
            let encloses = |a: &Event, b: &Event| {
                a.micro_batch == b.micro_batch
                    && a.start_ns <= b.start_ns
                    && b.end_ns <= a.end_ns
                    && (a.start_ns, a.end_ns) != (b.start_ns, b.end_ns)
            };
            let inner: Vec<usize> = active
                .iter()
                .copied()
                .filter(|&i| !active.iter().any(|&j| encloses(evs[i], evs[j])))
                .collect();
            for (&i, ns) in inner.iter().zip(split_evenly(to - from, inner.len())) {
                part[i] = part[i].saturating_add(ns);
            }
        }
        for (e, ns) in evs.iter().zip(part) {
            let nodes = label_nodes(&e.node);
            for (node, share) in nodes.iter().zip(split_evenly(ns, nodes.len())) {
                let t = totals.entry((stage, node)).or_default();
                *t = t.saturating_add(share);
            }
        }
    }
    let all = totals
        .values()
        .fold(0u64, |a, &b| a.saturating_add(b))
        .max(1);
    let mut out: Vec<NodeTime> = totals
        .into_iter()
        .map(|((stage, node), total_ns)| NodeTime {
            node: node.to_string(),
            stage,
            total_ns,
            share: total_ns as f64 / all as f64,
        })
        .collect();
    out.sort_by(|a, b| {
        b.total_ns
            .cmp(&a.total_ns)
            .then(a.stage.cmp(&b.stage))
            .then(a.node.cmp(&b.node))
    });
    out
}

/// Most devices live utilisation follows.
pub const MAX_LIVE_DEVICES: usize = 1024;

/// Utilisation per device while a run goes, one event at a time: compute time seen so far
/// over the run's elapsed time (the latest event end), the definition [`compute`] applies
/// to the finished run (passes on one device do not overlap, so their sum is the busy
/// time).
#[derive(Debug, Clone, Default)]
pub struct LiveUtilisation {
    busy: Vec<u64>,
    wall: u64,
}

impl LiveUtilisation {
    /// Takes one event into account (events of devices numbered past
    /// [`MAX_LIVE_DEVICES`] are ignored: they cannot make the list grow without bound).
    pub fn record(&mut self, e: &Event) {
        if e.kind != EventKind::Compute || e.device >= MAX_LIVE_DEVICES {
            return;
        }
        if self.busy.len() <= e.device {
            self.busy.resize(e.device + 1, 0);
        }
        self.busy[e.device] = self.busy[e.device].saturating_add(e.duration_ns());
        self.wall = self.wall.max(e.end_ns);
    }

    /// Busy share of each device so far.
    pub fn utilisation(&self) -> Vec<f64> {
        let wall = self.wall.max(1) as f64;
        self.busy
            .iter()
            .map(|&b| (b as f64 / wall).min(1.0))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(device: usize, stage: usize, mb: usize, kind: EventKind, s: u64, e: u64) -> Event {
        Event {
            run: "r".into(),
            device,
            stage,
            micro_batch: mb,
            node: format!("n{mb}"),
            kind,
            start_ns: s,
            end_ns: e,
            warm_up: false,
        }
    }

    #[test]
    fn ideal_two_stage_pipeline_has_the_gpipe_bubble() {
        // S = 2, M = 4, every stage step takes 10: stage s runs m during [10(s+m), 10(s+m+1)).
        let mut events = Vec::new();
        for s in 0..2 {
            for m in 0..4 {
                let t = 10 * (s + m) as u64;
                events.push(ev(s, s, m, EventKind::Compute, t, t + 10));
            }
        }
        let m = compute(&events, 2, 4, 8);
        assert_eq!(m.wall_ns, 50);
        let b = m.bubble_fraction.unwrap();
        assert!((b - 0.2).abs() < 1e-12, "bubble {b}");
        assert!((m.ideal_bubble.unwrap() - 0.2).abs() < 1e-12);
        assert!((m.devices[0].utilisation - 0.8).abs() < 1e-12);
        assert!((m.devices[0].steady_utilisation - 1.0).abs() < 1e-12);
    }

    #[test]
    fn overlap_counts_uploads_under_compute() {
        let events = vec![
            ev(0, 0, 0, EventKind::Compute, 0, 100),
            ev(0, 0, 1, EventKind::Upload, 50, 150),
            ev(0, 0, 1, EventKind::Compute, 150, 250),
        ];
        let m = compute(&events, 1, 2, 2);
        assert!((m.overlap - 0.5).abs() < 1e-12);
        assert_eq!(m.devices[0].busy_ns, 200);
        assert_eq!(union_ns(&mut [(0, 10), (5, 20), (30, 40)]), 30);
    }

    fn named(mut e: Event, node: &str) -> Event {
        e.node = node.into();
        e
    }

    #[test]
    fn node_times_divide_each_stages_busy_time_exactly() {
        let mut warm = named(ev(1, 1, 0, EventKind::Compute, 0, 10_000), "late");
        warm.warm_up = true;
        let events = vec![
            // Stage 0: a pass, a fused pass of three nodes, and an overlapping pass.
            named(ev(0, 0, 0, EventKind::Compute, 0, 100), "a"),
            named(ev(0, 0, 0, EventKind::Compute, 100, 200), "b+c+d (fused)"),
            named(ev(0, 0, 1, EventKind::Compute, 150, 251), "a"),
            named(ev(0, 0, 1, EventKind::Upload, 0, 400), "x"),
            // Stage 1: a node whose id holds '+', unfused; a warm-up pass left out.
            named(ev(1, 1, 0, EventKind::Compute, 300, 307), "late+1"),
            named(ev(1, 1, 1, EventKind::Compute, 307, 310), "k"),
            warm,
        ];
        let m = compute(&events, 2, 2, 4);
        let times = node_times(&events);
        for d in &m.devices {
            let sum: u64 = times
                .iter()
                .filter(|t| t.stage == d.stage)
                .map(|t| t.total_ns)
                .sum();
            assert_eq!(sum, d.busy_ns, "stage {}: {times:?}", d.stage);
        }
        let of = |n: &str| {
            times
                .iter()
                .find(|t| t.node == n)
                .map(|t| (t.stage, t.total_ns))
        };
        // 'a': 100 alone, then half of 150..200, then 200..251 alone.
        assert_eq!(of("a"), Some((0, 100 + 25 + 51)));
        // The fused pass: 50 alone and 25 shared, split by three.
        assert_eq!(
            of("b").unwrap().1 + of("c").unwrap().1 + of("d").unwrap().1,
            75
        );
        assert_eq!(of("late+1"), Some((1, 7)));
        assert_eq!(of("late"), None);
        assert_eq!(of("x"), None);
        let shares: f64 = times.iter().map(|t| t.share).sum();
        assert!((shares - 1.0).abs() < 1e-12);
        assert_eq!(
            m.top_nodes,
            times.into_iter().take(TOP_NODES).collect::<Vec<_>>()
        );
    }

    #[test]
    fn a_round_trip_yields_to_the_passes_inside_it() {
        let events = vec![
            named(ev(1, 1, 0, EventKind::Compute, 0, 100), "stage 1 on w1"),
            named(ev(1, 1, 0, EventKind::Compute, 10, 40), "fc"),
            named(ev(1, 1, 0, EventKind::Compute, 40, 90), "act+out (fused)"),
        ];
        let times = node_times(&events);
        let of = |n: &str| times.iter().find(|t| t.node == n).map_or(0, |t| t.total_ns);
        assert_eq!(of("fc"), 30);
        assert_eq!(of("act") + of("out"), 50);
        assert_eq!(of("stage 1 on w1"), 20);
        assert_eq!(compute(&events, 2, 1, 1).devices[0].busy_ns, 100);
    }
}
