//! What the live charts draw, derived from a run's events (the engine's event stream,
//! from the server's WebSocket or from an in-browser run): utilisation of each device
//! over time, the pipeline Gantt (one block per stage and micro-batch, the transfers
//! between stages, the warm-up apart), GPU time per graph node for the heat map with its
//! colour scale, the run's figures and the devices' legend labels. Events of a warm-up
//! pass ([`Event::warm_up`]) are shown apart and left out of everything measured. Pure
//! data, tested natively.

use sluice_engine::telemetry::metrics::{self, union_ns, Metrics};
use sluice_engine::telemetry::{Event, EventKind};
use std::collections::BTreeMap;

/// The measured events (warm-up left out).
fn measured(events: &[Event]) -> impl Iterator<Item = &Event> {
    events.iter().filter(|e| !e.warm_up)
}

/// Busy share of each time bin, per device: `series[device][bin]` in [0, 1], over
/// [0, the last measured event's end] cut into `bins` equal bins.
pub fn utilisation_series(events: &[Event], bins: usize) -> Vec<Vec<f64>> {
    let end = measured(events).map(|e| e.end_ns).max().unwrap_or(0);
    let devices = measured(events).map(|e| e.device + 1).max().unwrap_or(0);
    if end == 0 || bins == 0 {
        return vec![Vec::new(); devices];
    }
    let width = end as f64 / bins as f64;
    (0..devices)
        .map(|d| {
            let mut spans: Vec<(u64, u64)> = measured(events)
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

impl Block {
    /// The block's tooltip: `stage 1 · micro-batch 3 · 4.21 ms (12.0–16.2 ms)`.
    pub fn title(&self) -> String {
        format!(
            "stage {} · micro-batch {} · {} ({:.1}–{:.1} ms)",
            self.stage,
            self.micro_batch,
            ms(self.end_ns.saturating_sub(self.start_ns)),
            self.start_ns as f64 / 1e6,
            self.end_ns as f64 / 1e6
        )
    }
}

/// `4.21 ms`.
pub fn ms(ns: u64) -> String {
    format!("{:.2} ms", ns as f64 / 1e6)
}

/// Per (stage, micro-batch), first start to last end of the given events.
fn spans<'e>(events: impl Iterator<Item = &'e Event>) -> Vec<Block> {
    let mut spans: BTreeMap<(usize, usize), (u64, u64)> = BTreeMap::new();
    for e in events {
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

/// Gantt blocks of the measured run: for each (stage, micro-batch), its first compute
/// start to last compute end; sorted by stage, then start.
pub fn gantt(events: &[Event]) -> Vec<Block> {
    spans(measured(events).filter(|e| e.kind == EventKind::Compute))
}

/// A copy of activations between stages (in the measured run).
#[derive(Debug, Clone, PartialEq)]
pub struct Transfer {
    /// The stage it was timed on: the sending stage reads back, the receiving one
    /// uploads.
    pub stage: usize,
    /// Micro-batch.
    pub micro_batch: usize,
    /// The tensor (or outputs) moved.
    pub what: String,
    /// Start, ns since the run started.
    pub start_ns: u64,
    /// End.
    pub end_ns: u64,
}

impl Transfer {
    /// The tooltip: `transfer on stage 1 · micro-batch 3 · h1 · 0.12 ms (4.0–4.1 ms)`.
    pub fn title(&self) -> String {
        format!(
            "transfer on stage {} · micro-batch {} · {} · {} ({:.1}–{:.1} ms)",
            self.stage,
            self.micro_batch,
            self.what,
            ms(self.end_ns.saturating_sub(self.start_ns)),
            self.start_ns as f64 / 1e6,
            self.end_ns as f64 / 1e6
        )
    }
}

/// Transfers between stages in the measured run, in event order.
pub fn transfers(events: &[Event]) -> Vec<Transfer> {
    measured(events)
        .filter(|e| e.kind == EventKind::Transfer)
        .map(|e| Transfer {
            stage: e.stage,
            micro_batch: e.micro_batch,
            what: e.node.clone(),
            start_ns: e.start_ns,
            end_ns: e.end_ns,
        })
        .collect()
}

/// The warm-up pass of a newly compiled run: its length and each stage's span, timed
/// from the warm-up's own start.
#[derive(Debug, Clone, PartialEq)]
pub struct WarmUp {
    /// First warm-up event start to last end.
    pub duration_ns: u64,
    /// One block per stage that worked in it (micro-batch 0), sorted by stage.
    pub stages: Vec<Block>,
}

/// The run's warm-up, if it had one.
pub fn warm_up(events: &[Event]) -> Option<WarmUp> {
    let warm: Vec<&Event> = events.iter().filter(|e| e.warm_up).collect();
    let start = warm.iter().map(|e| e.start_ns).min()?;
    let end = warm.iter().map(|e| e.end_ns).max()?;
    Some(WarmUp {
        duration_ns: end.saturating_sub(start),
        stages: spans(warm.into_iter()),
    })
}

/// GPU nanoseconds per graph node in the measured run: the engine's
/// [`metrics::node_times`] (each stage's busy time divided among its nodes, a fused
/// pass's part shared equally by its nodes), as the CLI and the server report them.
pub fn node_time(events: &[Event]) -> BTreeMap<String, u64> {
    let mut out: BTreeMap<String, u64> = BTreeMap::new();
    for t in metrics::node_times(events) {
        let total = out.entry(t.node).or_default();
        *total = total.saturating_add(t.total_ns);
    }
    out
}

/// One cell of the heat map.
#[derive(Debug, Clone, PartialEq)]
pub struct HeatCell {
    /// Node id.
    pub node: String,
    /// The stage that ran it.
    pub stage: usize,
    /// GPU nanoseconds over the measured run.
    pub ns: u64,
    /// Share of all nodes' GPU time, in [0, 1].
    pub share: f64,
    /// Place on the colour scale, in [0, 1] (the hottest node is 1).
    pub heat: f64,
}

impl HeatCell {
    /// The tooltip: `conv1 (conv2d): 3.10 ms GPU, 21% of the run's GPU time`.
    pub fn title(&self, op: &str) -> String {
        let name = if op.is_empty() {
            self.node.clone()
        } else {
            format!("{} ({op})", self.node)
        };
        format!(
            "{name}: {} GPU, {:.0}% of the run's GPU time",
            ms(self.ns),
            self.share * 100.0
        )
    }
}

/// The heat map's cells, hottest first, and the colour scale's top (the hottest node's
/// nanoseconds: the scale runs from 0 to it).
pub fn heat_map(events: &[Event]) -> (Vec<HeatCell>, u64) {
    let times = metrics::node_times(events);
    let hottest = times.iter().map(|t| t.total_ns).max().unwrap_or(0);
    let cells = times
        .into_iter()
        .map(|t| HeatCell {
            heat: t.total_ns as f64 / hottest.max(1) as f64,
            share: t.share,
            stage: t.stage,
            node: t.node,
            ns: t.total_ns,
        })
        .collect();
    (cells, hottest)
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

/// Legend labels of devices, at most `max` characters each, that tell them apart: the
/// index, then the name; a long name is cut at its end (`0: llvmpipe (LLVM 15…`), or,
/// where different names share a long beginning, keeps its end instead
/// (`1: …instance 1`), where they differ.
pub fn device_labels(names: &[String], max: usize) -> Vec<String> {
    let all_same = names.windows(2).all(|w| w[0] == w[1]);
    names
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let label = format!("{i}: {name}");
            if label.chars().count() <= max {
                return label;
            }
            let prefix = format!("{i}: ");
            let room = max.saturating_sub(prefix.chars().count() + 1);
            if all_same {
                format!("{prefix}{}…", name.chars().take(room).collect::<String>())
            } else {
                let skip = name.chars().count().saturating_sub(room);
                format!("{prefix}…{}", name.chars().skip(skip).collect::<String>())
            }
        })
        .collect()
}

/// The measured figures of a run so far: the engine's metrics over the measured events.
#[derive(Debug, Clone, PartialEq)]
pub struct Figures {
    /// The engine's metrics.
    pub metrics: Metrics,
    /// Micro-batches whose outputs came back.
    pub done: usize,
    /// Whether any input was uploaded (else overlap means nothing).
    pub uploads: bool,
}

/// The figures of the measured events, or `None` before the first measured micro-batch
/// has come back (a figure then would only say 0). Samples count the micro-batches whose
/// outputs came back, `batch / microbatches` each.
pub fn figures(
    events: &[Event],
    stages: usize,
    microbatches: usize,
    batch: usize,
) -> Option<Figures> {
    let own: Vec<Event> = measured(events).cloned().collect();
    let done: std::collections::BTreeSet<usize> = own
        .iter()
        .filter(|e| e.kind == EventKind::Download)
        .map(|e| e.micro_batch)
        .collect();
    if done.is_empty() {
        return None;
    }
    let samples = done.len().saturating_mul(batch) / microbatches.max(1);
    Some(Figures {
        metrics: metrics::compute(&own, stages, microbatches, samples),
        done: done.len(),
        uploads: own.iter().any(|e| e.kind == EventKind::Upload),
    })
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
            warm_up: false,
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
        let events = vec![
            ev(0, 0, "fc1+act1 (fused)", 0, 100),
            ev(0, 1, "fc1", 100, 110),
        ];
        let t = node_time(&events);
        assert_eq!(t["fc1"], 60);
        assert_eq!(t["act1"], 50);
        assert_ne!(heat_colour(0.0), heat_colour(1.0));
    }

    fn warm(mut e: Event) -> Event {
        e.warm_up = true;
        e
    }

    fn kind(mut e: Event, kind: EventKind) -> Event {
        e.kind = kind;
        e
    }

    /// Two stages, two micro-batches, each with an upload, a transfer and a download;
    /// optionally after a long warm-up pass of micro-batch 0.
    fn pipeline(with_warm_up: bool) -> Vec<Event> {
        let mut events = Vec::new();
        if with_warm_up {
            events.push(warm(kind(ev(0, 0, "x", 0, 5), EventKind::Upload)));
            events.push(warm(ev(0, 0, "a", 5, 1_600_000_000)));
            events.push(warm(ev(1, 0, "b", 1_600_000_000, 1_700_000_000)));
            events.push(warm(kind(
                ev(1, 0, "y", 1_700_000_000, 1_700_000_010),
                EventKind::Download,
            )));
        }
        for m in 0..2u64 {
            let t = 100 * m;
            let mb = m as usize;
            events.push(kind(ev(0, mb, "x", t, t + 10), EventKind::Upload));
            events.push(ev(0, mb, "a", t + 10, t + 60));
            events.push(kind(ev(0, mb, "h", t + 60, t + 70), EventKind::Transfer));
            events.push(ev(1, mb, "b", t + 70, t + 120));
            events.push(kind(ev(1, mb, "y", t + 120, t + 130), EventKind::Download));
        }
        events
    }

    #[test]
    fn the_warm_up_is_kept_apart_from_the_measured_run() {
        let events = pipeline(true);
        let w = warm_up(&events).expect("a warm-up");
        assert_eq!(w.duration_ns, 1_700_000_010);
        assert_eq!(w.stages.len(), 2);
        assert_eq!((w.stages[1].stage, w.stages[1].micro_batch), (1, 0));
        assert_eq!(warm_up(&pipeline(false)), None);
        // The Gantt, the transfers, the utilisation and the heat map see only the
        // measured run: the same as without a warm-up.
        let cold = pipeline(false);
        assert_eq!(gantt(&events), gantt(&cold));
        assert_eq!(gantt(&events).len(), 4);
        assert_eq!(transfers(&events), transfers(&cold));
        assert_eq!(utilisation_series(&events, 4), utilisation_series(&cold, 4));
        assert_eq!(node_time(&events), node_time(&cold));
        assert_eq!(node_time(&events)["a"], 100);
    }

    #[test]
    fn figures_leave_the_warm_up_out_and_wait_for_data() {
        let warmed = figures(&pipeline(true), 2, 2, 8).expect("figures");
        let cold = figures(&pipeline(false), 2, 2, 8).expect("figures");
        assert_eq!(warmed, cold);
        assert_eq!(warmed.done, 2);
        assert_eq!(warmed.metrics.samples, 8);
        assert_eq!(warmed.metrics.wall_ns, 230);
        assert!(warmed.uploads);
        // Nothing measured yet (only the warm-up, or no micro-batch back): no figures.
        let only_warm: Vec<Event> = pipeline(true).into_iter().filter(|e| e.warm_up).collect();
        assert_eq!(figures(&only_warm, 2, 2, 8), None);
        let not_back: Vec<Event> = pipeline(false)
            .into_iter()
            .filter(|e| e.kind != EventKind::Download)
            .collect();
        assert_eq!(figures(&not_back, 2, 2, 8), None);
        assert_eq!(figures(&[], 1, 1, 8), None);
    }

    #[test]
    fn transfers_and_blocks_say_their_milliseconds() {
        let t = transfers(&pipeline(false));
        assert_eq!(t.len(), 2);
        assert_eq!(t[1].micro_batch, 1);
        assert_eq!(t[1].what, "h");
        let block = Block {
            stage: 1,
            micro_batch: 3,
            start_ns: 12_000_000,
            end_ns: 16_210_000,
        };
        assert_eq!(
            block.title(),
            "stage 1 · micro-batch 3 · 4.21 ms (12.0–16.2 ms)"
        );
        assert!(t[0].title().contains(" ms ("), "{}", t[0].title());
    }

    #[test]
    fn the_heat_map_runs_from_zero_to_the_hottest_node() {
        let events = vec![
            ev(0, 0, "conv1", 0, 3_000_000),
            ev(0, 1, "conv1", 3_000_000, 3_100_000),
            ev(1, 0, "fc", 0, 1_000_000),
            warm(ev(1, 0, "fc", 0, 9_000_000_000)),
        ];
        let (cells, hottest) = heat_map(&events);
        assert_eq!(hottest, 3_100_000);
        assert_eq!(cells.len(), 2);
        assert_eq!((cells[0].node.as_str(), cells[0].stage), ("conv1", 0));
        assert_eq!((cells[1].node.as_str(), cells[1].stage), ("fc", 1));
        assert_eq!(cells[0].heat, 1.0);
        assert!((cells[1].heat - 1.0 / 3.1).abs() < 1e-9);
        assert!((cells[0].share + cells[1].share - 1.0).abs() < 1e-9);
        assert_eq!(
            cells[0].title("conv2d"),
            "conv1 (conv2d): 3.10 ms GPU, 76% of the run's GPU time"
        );
        assert_eq!(heat_map(&[]), (Vec::new(), 0));
    }

    #[test]
    fn long_device_names_sharing_a_beginning_stay_apart() {
        let names = vec![
            "Vulkan llvmpipe (LLVM 15.0.7, 256 bits) instance 0".to_string(),
            "Vulkan llvmpipe (LLVM 15.0.7, 256 bits) instance 1".to_string(),
            "cpu".to_string(),
        ];
        let labels = device_labels(&names, 28);
        assert_eq!(labels[2], "2: cpu");
        assert_ne!(labels[0], labels[1]);
        for l in &labels {
            assert!(l.chars().count() <= 28, "{l}");
        }
        assert!(labels[1].starts_with("1: …") && labels[1].ends_with("instance 1"));
        // Identical names keep their beginning and differ by their index.
        let same = device_labels(&[names[0].clone(), names[0].clone()], 14);
        assert_eq!(same, vec!["0: Vulkan llv…", "1: Vulkan llv…"]);
    }

    #[test]
    fn node_times_sum_to_each_stages_busy_time() {
        // Overlapping passes on stage 0 (sampled spans can overlap): the busy time is
        // shared, never counted twice, and one stage's time stays on its own nodes.
        let mut events = pipeline(false);
        events.push(ev(0, 1, "a2+a3 (fused)", 140, 180));
        let f = figures(&events, 2, 2, 8).expect("figures");
        let (cells, _) = heat_map(&events);
        for d in &f.metrics.devices {
            let sum: u64 = cells
                .iter()
                .filter(|c| c.stage == d.stage)
                .map(|c| c.ns)
                .sum();
            assert_eq!(sum, d.busy_ns, "stage {}: {cells:?}", d.stage);
        }
        assert!(cells.iter().all(|c| (c.node == "b") == (c.stage == 1)));
        assert_eq!(node_time(&events)["b"], 100);
    }
}
