//! The live charts under the canvas, redrawn as events arrive: per-device utilisation
//! over time, the pipeline Gantt (stage rows, one block per micro-batch, transfers
//! between stages, gaps are the bubbles, a newly compiled run's warm-up in a band of its
//! own), GPU time per node as a heat map, and the run's figures (throughput, wall time,
//! utilisation, bubble next to GPipe's (S−1)/(M+S−1), overlap, memory), computed by the
//! engine's own metric definitions from the measured events. Every chart has a legend and
//! tooltips in milliseconds; every figure says what it means.

use crate::charts::{
    self, device_labels, heat_colour, heat_map, ms, stage_colour, transfers, utilisation_series,
    Figures,
};
use crate::model;
use crate::state::{EditorState, RunView};
use leptos::prelude::*;
use sluice_engine::telemetry::metrics::gpipe_bubble;

const WIDTH: f64 = 420.0;
const HEIGHT: f64 = 120.0;
const BINS: usize = 60;
/// Longest device label in the utilisation legend, characters.
const LABEL_CHARS: usize = 34;

fn pct(x: f64) -> String {
    format!("{:.1}%", x * 100.0)
}

fn mib(b: u64) -> String {
    format!("{:.2} MiB", b as f64 / (1024.0 * 1024.0))
}

/// The devices' full names (`device N` where the run has not said yet), one per device.
fn device_names(run: &RunView, count: usize) -> Vec<String> {
    (0..count.max(run.devices.len()))
        .map(|d| {
            run.devices
                .get(d)
                .cloned()
                .unwrap_or_else(|| format!("device {d}"))
        })
        .collect()
}

fn utilisation_chart(run: &RunView, figures: Option<&Figures>) -> impl IntoView {
    let series = utilisation_series(&run.events, BINS);
    let names = device_names(run, series.len());
    let labels = device_labels(&names, LABEL_CHARS);
    let end = run
        .events
        .iter()
        .filter(|e| !e.warm_up)
        .map(|e| e.end_ns)
        .max()
        .unwrap_or(0);
    let bin_ms = end as f64 / 1e6 / BINS as f64;
    let x_of = |i: f64| 30.0 + (WIDTH - 40.0) * i / BINS as f64;
    let busy = |d: usize| {
        let f = figures?;
        let m = f.metrics.devices.iter().find(|m| m.device == d)?;
        Some(format!(
            ": busy {} of {} ({})",
            ms(m.busy_ns),
            ms(f.metrics.wall_ns),
            pct(m.utilisation)
        ))
    };
    let lines = series
        .iter()
        .enumerate()
        .map(|(d, bins)| {
            let points: Vec<String> = bins
                .iter()
                .enumerate()
                .map(|(i, u)| {
                    let y = 10.0 + (HEIGHT - 30.0) * (1.0 - u);
                    format!("{:.1},{y:.1}", x_of(i as f64 + 0.5))
                })
                .collect();
            let title = format!("{}{}", names[d], busy(d).unwrap_or_default());
            // The busy nanoseconds the heat map's cells of this device's stage sum to.
            let busy_ns = figures
                .and_then(|f| f.metrics.devices.iter().find(|m| m.device == d))
                .map(|m| m.busy_ns.to_string());
            view! {
                <polyline class="util-line" data-device=d.to_string() data-busy-ns=busy_ns
                    points=points.join(" ")
                    fill="none" stroke=stage_colour(d) stroke-width="2">
                    <title>{title}</title>
                </polyline>
            }
        })
        .collect_view();
    // One hover target per bin (none before any event), saying its time range and every
    // device's share in it.
    let bin_count = if end > 0 { BINS } else { 0 };
    let bins = (0..bin_count)
        .map(|i| {
            let shares: Vec<String> = series
                .iter()
                .enumerate()
                .filter_map(|(d, s)| s.get(i).map(|u| format!("device {d} {}", pct(*u))))
                .collect();
            let title = format!(
                "{:.2}–{:.2} ms: {}",
                bin_ms * i as f64,
                bin_ms * (i + 1) as f64,
                shares.join(" · ")
            );
            view! {
                <rect class="util-bin" x=x_of(i as f64) y="10" width=(WIDTH - 40.0) / BINS as f64
                    height=HEIGHT - 30.0><title>{title}</title></rect>
            }
        })
        .collect_view();
    let legend = labels
        .into_iter()
        .enumerate()
        .map(|(d, label)| {
            view! {
                <span class="legend-item" data-device=d.to_string() title=names[d].clone()>
                    <span class="swatch" style=format!("background:{}", stage_colour(d))></span>
                    {label}
                </span>
            }
        })
        .collect_view();
    view! {
        <svg class="chart" id="utilisation-chart" viewBox=format!("0 0 {WIDTH} {HEIGHT}")>
            <text class="axis" x="2" y="14">"100%"</text>
            <text class="axis" x="2" y=HEIGHT - 20.0>"0%"</text>
            <line class="axis-line" x1="30" y1=HEIGHT - 20.0 x2=WIDTH - 10.0 y2=HEIGHT - 20.0 />
            <line class="axis-line" x1="30" y1="10" x2="30" y2=HEIGHT - 20.0 />
            <text class="axis" x="30" y=HEIGHT - 6.0>"0"</text>
            <text class="axis" x=WIDTH - 10.0 y=HEIGHT - 6.0 text-anchor="end">{ms(end)}</text>
            {bins}
            {lines}
        </svg>
        <div class="chart-legend" id="utilisation-legend">
            {legend}
            <span class="legend-note">"busy share per device over the measured run; hover for times"</span>
        </div>
    }
}

/// Left edge of the Gantt's timelines (stage names to its left).
const LANES_X: f64 = 52.0;
/// Width of the warm-up band, when there is one.
const WARM_W: f64 = 92.0;

fn gantt_chart(run: &RunView) -> impl IntoView {
    let blocks = charts::gantt(&run.events);
    let moves = transfers(&run.events);
    let warm = charts::warm_up(&run.events);
    let stages = run
        .settings
        .stages
        .max(blocks.iter().map(|b| b.stage + 1).max().unwrap_or(1));
    let end = blocks
        .iter()
        .map(|b| b.end_ns)
        .chain(moves.iter().map(|t| t.end_ns))
        .max()
        .unwrap_or(1)
        .max(1) as f64;
    let row_h = 26.0;
    let top = 14.0;
    let height = top + row_h * stages as f64 + 16.0;
    // The measured timeline starts after the warm-up band.
    let x0 = if warm.is_some() {
        LANES_X + WARM_W + 8.0
    } else {
        LANES_X
    };
    let x = move |ns: u64| x0 + (WIDTH - 10.0 - x0) * ns as f64 / end;
    let warm_x = |ns: u64, total: u64| LANES_X + WARM_W * ns as f64 / total.max(1) as f64;
    let rows = (0..stages)
        .map(|s| {
            let y = top + row_h * s as f64;
            let warm_block = warm.as_ref().and_then(|w| {
                let b = w.stages.iter().find(|b| b.stage == s)?;
                let (a, z) = (warm_x(b.start_ns, w.duration_ns), warm_x(b.end_ns, w.duration_ns));
                let title = format!(
                    "stage {s} · warm-up (compiling pipelines, first dispatch) · {} · not measured",
                    ms(b.end_ns.saturating_sub(b.start_ns))
                );
                Some(view! {
                    <g class="gantt-warmup" data-stage=s.to_string()>
                        <rect class="warmup-block" x=a y=y + 2.0 width=(z - a).max(1.5) height=row_h - 4.0 rx="2" />
                        <title>{title}</title>
                    </g>
                })
            });
            let cells = blocks
                .iter()
                .filter(|b| b.stage == s)
                .map(|b| {
                    let (x1, x2) = (x(b.start_ns), x(b.end_ns));
                    view! {
                        <g class="gantt-block" data-stage=s.to_string() data-mb=b.micro_batch.to_string()>
                            <rect x=x1 y=y + 2.0 width=(x2 - x1).max(1.5) height=row_h - 8.0
                                fill=stage_colour(s) rx="2" />
                            {(x2 - x1 > 18.0).then(|| view! {
                                <text class="block-label" x=(x1 + x2) / 2.0 y=y + row_h / 2.0 + 1.0 text-anchor="middle">
                                    {format!("m{}", b.micro_batch)}
                                </text>
                            })}
                            <title>{b.title()}</title>
                        </g>
                    }
                })
                .collect_view();
            let copies = moves
                .iter()
                .filter(|t| t.stage == s)
                .map(|t| {
                    let (x1, x2) = (x(t.start_ns), x(t.end_ns));
                    view! {
                        <rect class="gantt-transfer" data-stage=s.to_string() data-mb=t.micro_batch.to_string()
                            x=x1 y=y + row_h - 6.0 width=(x2 - x1).max(1.5) height="4">
                            <title>{t.title()}</title>
                        </rect>
                    }
                })
                .collect_view();
            view! {
                <g class="gantt-row" data-stage=s.to_string()>
                    <rect class="gantt-lane" x=x0 y=y width=WIDTH - 10.0 - x0 height=row_h />
                    <text class="axis" x="4" y=y + row_h / 2.0 + 4.0>{format!("stage {s}")}</text>
                    {warm_block}
                    {cells}
                    {copies}
                </g>
            }
        })
        .collect_view();
    let warm_band = warm.as_ref().map(|w| {
        view! {
            <g class="warmup-band" id="gantt-warmup">
                <rect class="warmup-lane" x=LANES_X y=top width=WARM_W height=row_h * stages as f64 />
                <text class="axis warmup-label" x=LANES_X y="10">{format!("warm-up {}", ms(w.duration_ns))}</text>
                <title>{format!(
                    "warm-up (compiling pipelines, first dispatch): {}, on its own scale; left out of every figure",
                    ms(w.duration_ns)
                )}</title>
            </g>
        }
    });
    let warm_note = match &warm {
        Some(w) => format!(
            "warm-up (compiling pipelines) {}: own scale, not measured",
            ms(w.duration_ns)
        ),
        None => "warm-up: none (pipelines already warm)".into(),
    };
    view! {
        <svg class="chart" id="gantt-chart" viewBox=format!("0 0 {WIDTH} {height}")>
            {warm_band}
            <text class="axis" x=x0 y="10">"measured"</text>
            {rows}
            <text class="axis" x=x0 y=height - 4.0>"0"</text>
            <text class="axis" x=WIDTH - 10.0 y=height - 4.0 text-anchor="end">{format!("{:.1} ms", end / 1e6)}</text>
        </svg>
        <div class="chart-legend" id="gantt-legend">
            <span class="legend-item" title="A block spans a micro-batch's first pass to its last pass on that stage; hover one for its times.">
                <span class="swatch" style=format!("background:{}", stage_colour(0))></span>
                "block: a micro-batch's compute (m3: micro-batch 3)"</span>
            <span class="legend-item" title="Each row is a pipeline stage on its own device; empty stretches of a row are bubbles, the stage waiting.">
                "rows: stages; gaps: bubbles"</span>
            <span class="legend-item" title="Activations read back from one stage and uploaded to the next, drawn along the bottom of a row.">
                <span class="swatch transfer-swatch"></span>
                {if moves.is_empty() { "transfer between stages (none yet)" } else { "transfer between stages" }}</span>
            <span class="legend-item" id="gantt-warmup-legend"
                title="A newly compiled run first sends micro-batch 0 through every stage once and throws its outputs away: drivers compile pipelines on first dispatch. It is drawn on its own scale and left out of every figure.">
                <span class="swatch warmup-swatch"></span>{warm_note}</span>
        </div>
    }
}

fn heat_chart(state: EditorState, run: &RunView) -> impl IntoView {
    let (cells, hottest) = heat_map(&run.events);
    let cells = state.doc.with(|d| {
        cells
            .into_iter()
            .map(|c| {
                let op = model::node(d, &c.node)
                    .map(|n| n.op.clone())
                    .unwrap_or_default();
                let title = c.title(&op);
                let hot = c.heat > 0.6;
                view! {
                    <div class="heat-cell" class:hot=hot data-node=c.node.clone()
                        data-stage=c.stage.to_string() data-ns=c.ns.to_string() title=title
                        style=format!("background:{}", heat_colour(c.heat))>
                        <span class="heat-node">{c.node.clone()}</span>
                        <span class="heat-ms">{ms(c.ns)}</span>
                    </div>
                }
            })
            .collect_view()
    });
    let gradient = format!(
        "background:linear-gradient(to right, {}, {}, {})",
        heat_colour(0.0),
        heat_colour(0.5),
        heat_colour(1.0)
    );
    view! {
        <div class="heat-map" id="heat-map">{cells}</div>
        <div class="chart-legend" id="heat-legend">
            <span class="legend-item heat-scale">
                <span class="scale-end">"0 ms"</span>
                <span class="heat-gradient" style=gradient></span>
                <span class="scale-end" id="heat-max">{ms(hottest)}</span>
            </span>
            <span class="legend-note" title="A fused pass's time is shared equally by its nodes; Heat (H) colours the canvas's nodes on the same scale.">
                "GPU time per node, measured run, hottest first"</span>
        </div>
    }
}

/// Where compute times come from, in words, with a line and a longer word on it.
fn timing_words(timing: Option<&str>) -> (String, &'static str, &'static str) {
    match timing {
        Some("timestamp_queries") => (
            "GPU timestamp queries".into(),
            "pass times measured on the GPU: exact",
            "Timestamp queries on the GPU bracket every pass: compute times are the GPU's own.",
        ),
        Some("sampled_timestamp_queries") => (
            "sampled GPU timestamp queries".into(),
            "pass times measured on the GPU for a sample of micro-batches",
            "Timestamp queries bracket every pass of the first two micro-batches and one in sixteen after (each costs some adapters a wait); the others show the latest measured pass times at the end of their host completion.",
        ),
        Some("host_completion") => (
            "host completion times".into(),
            "no GPU timestamps: host times, coarser",
            "The adapter has no timestamp queries: a pass's time runs from its submission to its completion seen on the host, which includes waiting.",
        ),
        Some(other) => (
            other.to_string(),
            "where pass times come from",
            "Where the compute times come from.",
        ),
        None => (
            "—".into(),
            "where pass times come from",
            "Where the compute times come from, known once the run ends.",
        ),
    }
}

fn figures_view(run: &RunView, figures: Option<&Figures>) -> impl IntoView {
    let s = &run.settings;
    let none = if run.is_active() {
        "waiting for the first micro-batch"
    } else {
        "—"
    };
    let warm = charts::warm_up(&run.events);
    let (throughput, wall, utilisation, bubble, overlap) = match figures {
        None => Default::default(),
        Some(f) => {
            let m = &f.metrics;
            let utilisation: Vec<String> = m
                .devices
                .iter()
                .map(|d| format!("stage {} {}", d.stage, pct(d.utilisation)))
                .collect();
            let bubble = match m.bubble_fraction {
                Some(b) => format!(
                    "{} measured · {} ideal (S−1)/(M+S−1)",
                    pct(b),
                    pct(gpipe_bubble(s.stages, s.microbatches))
                ),
                None => "— (one stage)".into(),
            };
            (
                Some(format!(
                    "{:.0} samples/s ({} of {} micro-batches back)",
                    m.throughput, f.done, s.microbatches
                )),
                Some(format!("{:.2} ms", m.wall_ns as f64 / 1e6)),
                (!utilisation.is_empty()).then(|| utilisation.join(" · ")),
                Some(bubble),
                Some(if f.uploads {
                    pct(m.overlap)
                } else {
                    "— (no uploads)".into()
                }),
            )
        }
    };
    let or_none = |v: Option<String>| v.unwrap_or_else(|| none.to_string());
    let memory = run
        .memory
        .map(|(p, a)| format!("{} planned · {} allocated", mib(p), mib(a)))
        .unwrap_or_else(|| "—".into());
    let (timing, timing_line, timing_more) = timing_words(run.timing.as_deref());
    let tuning = match &run.tuning {
        None => "—".to_string(),
        Some(lines) if lines.is_empty() => "defaults".into(),
        Some(lines) => format!("{} tuned", lines.len()),
    };
    let tuning_more = match &run.tuning {
        None => "Server runs: `sluice autotune` on the server lists the matmul kernels chosen for its adapters.".to_string(),
        Some(lines) if lines.is_empty() => "No matrix product here is large enough to tune: every one runs the default kernel.".to_string(),
        Some(lines) => format!(
            "Each class of matrix product (sizes rounded up to powers of two, storage types) runs the variant measured fastest on this adapter, once per page:\n{}",
            lines.join("\n")
        ),
    };
    // (name, value, the line shown under it, the longer word in its tooltip)
    let rows = [
        (
            "warm-up",
            warm.map_or_else(|| "none".into(), |w| ms(w.duration_ns)),
            "first dispatches, not in the figures",
            "A newly compiled run first sends micro-batch 0 through every stage once and throws its outputs away (drivers compile pipelines on first dispatch). Every other figure leaves it out. A run whose compiled pipelines were kept has none.",
        ),
        (
            "throughput",
            or_none(throughput),
            "samples back per second, measured run",
            "Samples whose outputs came back, divided by the measured run's wall time.",
        ),
        (
            "wall time",
            or_none(wall),
            "first to last event, measured run",
            "From the measured run's first event (an upload) to its last (a download).",
        ),
        (
            "utilisation",
            or_none(utilisation),
            "share of the wall time each stage computed",
            "Per stage: the time its device spent in passes (their union) divided by the wall time.",
        ),
        (
            "bubble",
            or_none(bubble),
            "stage time idle while the pipeline fills and drains",
            "Idle time of all stages divided by stages × wall time, next to GPipe's ideal (S−1)/(M+S−1) for S stages and M micro-batches.",
        ),
        (
            "overlap",
            or_none(overlap),
            "upload time hidden under compute (prefetch)",
            "The share of input upload time that ran while the same device was computing: 100% means prefetching hid every upload.",
        ),
        (
            "memory",
            memory,
            "device memory the plans need · the devices hold",
            "Planned: the buffers the memory planner laid out. Allocated: what the devices actually hold, staging buffers included.",
        ),
        ("timing", timing, timing_line, timing_more),
        (
            "events",
            run.events.len().to_string(),
            "timed spans so far, warm-up included",
            "Uploads, passes, transfers and downloads received, each with its start and end.",
        ),
    ];
    view! {
        <div class="figures" id="run-figures">
            {rows.into_iter().map(|(k, v, line, more)| view! {
                <div class="figure" data-figure=k title=more>
                    <span class="figure-name">{k}</span>" "<span class="figure-value">{v}</span>
                    <div class="figure-doc">{line}</div>
                </div>
            }).collect_view()}
            <div class="figure" data-figure="kernels" title=tuning_more>
                <span class="figure-name">"kernels"</span>" "<span class="figure-value">{tuning}</span>
                <div class="figure-doc">"matmul variants the autotuner chose for this adapter"</div>
            </div>
        </div>
    }
}

/// The chart strip (hidden until a run starts, and again once another graph is opened).
#[component]
pub fn Charts(state: EditorState) -> impl IntoView {
    move || {
        let run = state.run.get();
        if run.serial == 0 || (run.status == crate::state::RunStatus::Idle && run.events.is_empty())
        {
            return None;
        }
        let s = &run.settings;
        let figures = charts::figures(&run.events, s.stages, s.microbatches, s.batch);
        let title = if s.stages > 1 {
            format!(
                "Pipeline: {} stages × {} micro-batches",
                s.stages, s.microbatches
            )
        } else {
            "Device timeline".to_string()
        };
        Some(view! {
            <section class="charts" id="charts">
                <div class="chart-row">
                    <div class="chart-box">
                        <h4>"Utilisation over time"</h4>
                        {utilisation_chart(&run, figures.as_ref())}
                    </div>
                    <div class="chart-box gantt-box">
                        <h4>{title}</h4>
                        {gantt_chart(&run)}
                    </div>
                    <div class="chart-box">
                        <h4>"GPU time per node"</h4>
                        {heat_chart(state, &run)}
                    </div>
                </div>
                {figures_view(&run, figures.as_ref())}
            </section>
        })
    }
}
