//! What the live charts draw, derived from a run's events (the engine's event stream,
//! from the server's WebSocket or from an in-browser run): utilisation of each device
//! over time, the pipeline Gantt (one block per stage and micro-batch), and GPU time per
//! graph node for the heat map. Pure data, tested natively.

use sluice_engine::telemetry::metrics::union_ns;
use sluice_engine::telemetry::{Event, EventKind};
use std::collections::BTreeMap;

/// Busy share of each time bin, per device: `series[device][bin]` in [0, 1], over
/// [0, the last event's end] cut into `bins` equal bins.
pub fn utilisation_series(events: &[Event], bins: usize) -> Vec<Vec<f64>> {
    let end = events.iter().map(|e| e.end_ns).max().unwrap_or(0);
    let devices = events.iter().map(|e| e.device + 1).max().unwrap_or(0);
    if end == 0 || bins == 0 {
        return vec![Vec::new(); devices];
    }
    let width = end as f64 / bins as f64;
    (0..devices)
        .map(|d| {
            let mut spans: Vec<(u64, u64)> = events
                .iter()
                .filter(|e| e.device == d && e.kind == EventKind::Compute)
                .map(|e| (e.start_ns, e.end_ns))
                .collect();
            spans.sort_unstable();
            (0..bins)
                .map(|b| {
                    let (lo, hi) = (b as f64 * width, (b + 1) as f64 * width);
                    let mut clipped: Vec<(u64, u64)> = spans
                        .iter()
                        .filter(|s| (s.1 as f64) > lo && (s.0 as f64) < hi)
                        .map(|s| ((s.0 as f64).max(lo) as u64, (s.1 as f64).min(hi) as u64))
                        .collect();
                    (union_ns(&mut clipped) as f64 / width).min(1.0)
                })
                .collect()
        })
        .collect()
}

/// One block of the Gantt: a micro-batch's compute on one stage.
#[derive(Debug, Clone, PartialEq)]
pub struct Block {
    /// Pipeline stage (the row).
    pub stage: usize,
    /// Micro-batch.
    pub micro_batch: usize,
    /// First pass start, ns since the run started.
    pub start_ns: u64,
    /// Last pass end.
    pub end_ns: u64,
}

/// Gantt blocks: for each (stage, micro-batch), its first compute start to last compute
/// end; sorted by stage, then start.
pub fn gantt(events: &[Event]) -> Vec<Block> {
    let mut spans: BTreeMap<(usize, usize), (u64, u64)> = BTreeMap::new();
    for e in events.iter().filter(|e| e.kind == EventKind::Compute) {
        let s = spans
            .entry((e.stage, e.micro_batch))
            .or_insert((e.start_ns, e.end_ns));
        s.0 = s.0.min(e.start_ns);
        s.1 = s.1.max(e.end_ns);
    }
    let mut blocks: Vec<Block> = spans
        .into_iter()
        .map(|((stage, micro_batch), (start_ns, end_ns))| Block {
            stage,
            micro_batch,
            start_ns,
            end_ns,
        })
        .collect();
    blocks.sort_by_key(|b| (b.stage, b.start_ns));
    blocks
}

/// The graph nodes a compute event's label covers: `fc1`, or `fc1+act1 (fused)`.
pub fn label_nodes(label: &str) -> Vec<&str> {
    label
        .trim_end_matches(" (fused)")
        .split('+')
        .filter(|s| !s.is_empty())
        .collect()
}

/// GPU nanoseconds per graph node; a fused pass's time is shared equally by its nodes.
pub fn node_time(events: &[Event]) -> BTreeMap<String, u64> {
    let mut out: BTreeMap<String, u64> = BTreeMap::new();
    for e in events.iter().filter(|e| e.kind == EventKind::Compute) {
        let nodes = label_nodes(&e.node);
        let share = e.duration_ns() / nodes.len().max(1) as u64;
        for n in nodes {
            *out.entry(n.to_string()).or_default() += share;
        }
    }
    out
}

/// A colour from cool (0) to hot (1) for the heat map.
pub fn heat_colour(t: f64) -> String {
    let t = t.clamp(0.0, 1.0);
    // From pale yellow through orange to deep red.
    let r = 255.0 - 75.0 * t;
    let g = 240.0 - 200.0 * t;
    let b = 170.0 - 150.0 * t;
    format!("rgb({:.0},{:.0},{:.0})", r, g, b)
}

/// The colour of pipeline stage `s`.
pub fn stage_colour(s: usize) -> &'static str {
    const COLOURS: [&str; 8] = [
        "#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#e15759", "#76b7b2", "#edc948", "#9c755f",
    ];
    COLOURS[s % COLOURS.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(stage: usize, mb: usize, node: &str, start: u64, end: u64) -> Event {
        Event {
            run: "r".into(),
            device: stage,
            stage,
            micro_batch: mb,
            node: node.into(),
            kind: EventKind::Compute,
            start_ns: start,
            end_ns: end,
        }
    }

    #[test]
    fn gantt_has_a_block_per_stage_and_micro_batch() {
        let events = vec![
            ev(0, 0, "a", 0, 10),
            ev(0, 0, "b", 10, 20),
            ev(0, 1, "a", 20, 40),
            ev(1, 0, "c", 25, 35),
            ev(1, 1, "c", 45, 50),
        ];
        let g = gantt(&events);
        assert_eq!(g.len(), 4);
        assert_eq!(
            g[0],
            Block {
                stage: 0,
                micro_batch: 0,
                start_ns: 0,
                end_ns: 20
            }
        );
        assert_eq!(g.iter().filter(|b| b.stage == 1).count(), 2);
    }

    #[test]
    fn utilisation_bins_measure_busy_shares() {
        let events = vec![ev(0, 0, "a", 0, 50), ev(1, 0, "b", 50, 100)];
        let s = utilisation_series(&events, 2);
        assert_eq!(s, vec![vec![1.0, 0.0], vec![0.0, 1.0]]);
        assert!(utilisation_series(&[], 10).is_empty());
    }

    #[test]
    fn fused_time_is_shared_by_its_nodes() {
        let events = vec![ev(0, 0, "fc1+act1 (fused)", 0, 100), ev(0, 1, "fc1", 0, 10)];
        let t = node_time(&events);
        assert_eq!(t["fc1"], 60);
        assert_eq!(t["act1"], 50);
        assert_ne!(heat_colour(0.0), heat_colour(1.0));
    }
}
