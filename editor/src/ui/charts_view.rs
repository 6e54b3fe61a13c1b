//! The live charts under the canvas, redrawn as events arrive: per-device utilisation
//! over time, the pipeline Gantt (stage rows, one block per micro-batch, gaps are the
//! bubbles) with the measured bubble next to GPipe's (S−1)/(M+S−1), and the run's
//! figures (throughput, wall time, utilisation, overlap, memory), computed by the engine's
//! own metric definitions from the same events.

use crate::charts::{gantt, stage_colour, utilisation_series};
use crate::state::{EditorState, RunView};
use leptos::prelude::*;
use sluice_engine::telemetry::metrics::gpipe_bubble;
use sluice_engine::telemetry::{metrics, EventKind};

const WIDTH: f64 = 420.0;
const HEIGHT: f64 = 120.0;
const BINS: usize = 60;

fn pct(x: f64) -> String {
    format!("{:.1}%", x * 100.0)
}

fn mib(b: u64) -> String {
    format!("{:.2} MiB", b as f64 / (1024.0 * 1024.0))
}

fn utilisation_chart(run: &RunView) -> impl IntoView {
    let series = utilisation_series(&run.events, BINS);
    let lines = series
        .iter()
        .enumerate()
        .map(|(d, bins)| {
            let points: Vec<String> = bins
                .iter()
                .enumerate()
                .map(|(i, u)| {
                    let x = 30.0 + (WIDTH - 40.0) * (i as f64 + 0.5) / BINS as f64;
                    let y = 10.0 + (HEIGHT - 30.0) * (1.0 - u);
                    format!("{x:.1},{y:.1}")
                })
                .collect();
            let name = match run.devices.get(d) {
                Some(n) => format!("{d}: {n}"),
                None => format!("device {d}"),
            };
            view! {
                <polyline class="util-line" data-device=d.to_string() points=points.join(" ")
                    fill="none" stroke=stage_colour(d) stroke-width="2" />
                <text class="legend" x=34.0 + 190.0 * d as f64 y=HEIGHT - 4.0 fill=stage_colour(d)>
                    {format!("■ {}", super::truncate(&name, 28))}
                </text>
            }
        })
        .collect_view();
    view! {
        <svg class="chart" id="utilisation-chart" viewBox=format!("0 0 {WIDTH} {HEIGHT}")>
            <text class="axis" x="2" y="14">"100%"</text>
            <text class="axis" x="2" y=HEIGHT - 20.0>"0%"</text>
            <line class="axis-line" x1="30" y1=HEIGHT - 20.0 x2=WIDTH - 10.0 y2=HEIGHT - 20.0 />
            <line class="axis-line" x1="30" y1="10" x2="30" y2=HEIGHT - 20.0 />
            {lines}
        </svg>
    }
}

fn gantt_chart(run: &RunView) -> impl IntoView {
    let blocks = gantt(&run.events);
    let stages = run
        .settings
        .stages
        .max(blocks.iter().map(|b| b.stage + 1).max().unwrap_or(1));
    let end = blocks.iter().map(|b| b.end_ns).max().unwrap_or(1).max(1) as f64;
    let row_h = ((HEIGHT - 20.0) / stages as f64).min(36.0);
    let x = move |ns: u64| 60.0 + (WIDTH - 70.0) * ns as f64 / end;
    let rows = (0..stages)
        .map(|s| {
            let y = 6.0 + row_h * s as f64;
            let cells = blocks
                .iter()
                .filter(|b| b.stage == s)
                .map(|b| {
                    let (x0, x1) = (x(b.start_ns), x(b.end_ns));
                    view! {
                        <g class="gantt-block" data-stage=s.to_string() data-mb=b.micro_batch.to_string()>
                            <rect x=x0 y=y + 2.0 width=(x1 - x0).max(1.5) height=row_h - 4.0
                                fill=stage_colour(s) rx="2" />
                            {(x1 - x0 > 18.0).then(|| view! {
                                <text class="block-label" x=(x0 + x1) / 2.0 y=y + row_h / 2.0 + 4.0 text-anchor="middle">
                                    {format!("m{}", b.micro_batch)}
                                </text>
                            })}
                        </g>
                    }
                })
                .collect_view();
            view! {
                <g class="gantt-row" data-stage=s.to_string()>
                    <rect class="gantt-lane" x="60" y=y width=WIDTH - 70.0 height=row_h />
                    <text class="axis" x="4" y=y + row_h / 2.0 + 4.0>{format!("stage {s}")}</text>
                    {cells}
                </g>
            }
        })
        .collect_view();
    view! {
        <svg class="chart" id="gantt-chart" viewBox=format!("0 0 {WIDTH} {HEIGHT}")>
            {rows}
            <text class="axis" x="60" y=HEIGHT - 4.0>"0"</text>
            <text class="axis" x=WIDTH - 10.0 y=HEIGHT - 4.0 text-anchor="end">{format!("{:.1} ms", end / 1e6)}</text>
        </svg>
    }
}

fn figures(run: &RunView) -> impl IntoView {
    let s = &run.settings;
    // Samples done so far: micro-batches whose outputs came back.
    let done: std::collections::BTreeSet<usize> = run
        .events
        .iter()
        .filter(|e| e.kind == EventKind::Download)
        .map(|e| e.micro_batch)
        .collect();
    let samples = done.len() * s.batch / s.microbatches.max(1);
    let m = metrics::compute(&run.events, s.stages, s.microbatches, samples);
    let ideal = gpipe_bubble(s.stages, s.microbatches);
    let utilisation: Vec<String> = m
        .devices
        .iter()
        .map(|d| format!("stage {} {}", d.stage, pct(d.utilisation)))
        .collect();
    let bubble = match m.bubble_fraction {
        Some(b) => format!("{} measured · {} ideal (S−1)/(M+S−1)", pct(b), pct(ideal)),
        None => "— (one stage)".into(),
    };
    let memory = run
        .memory
        .map(|(p, a)| format!("{} planned · {} allocated", mib(p), mib(a)))
        .unwrap_or_else(|| "—".into());
    let rows = [
        ("throughput", format!("{:.0} samples/s", m.throughput)),
        ("wall time", format!("{:.2} ms", m.wall_ns as f64 / 1e6)),
        (
            "utilisation",
            if utilisation.is_empty() {
                "—".into()
            } else {
                utilisation.join(" · ")
            },
        ),
        ("bubble", bubble),
        ("overlap", pct(m.overlap)),
        ("memory", memory),
        ("timing", run.timing.clone().unwrap_or_else(|| "—".into())),
        ("events", run.events.len().to_string()),
    ];
    view! {
        <div class="figures" id="run-figures">
            {rows.into_iter().map(|(k, v)| view! {
                <div class="figure" data-figure=k><span class="figure-name">{k}</span>" "<span class="figure-value">{v}</span></div>
            }).collect_view()}
        </div>
    }
}

/// The chart strip (hidden until a run starts).
#[component]
pub fn Charts(state: EditorState) -> impl IntoView {
    move || {
        let run = state.run.get();
        if run.serial == 0 {
            return None;
        }
        let title = if run.settings.stages > 1 {
            format!(
                "Pipeline: {} stages × {} micro-batches",
                run.settings.stages, run.settings.microbatches
            )
        } else {
            "Device timeline".to_string()
        };
        Some(view! {
            <section class="charts" id="charts">
                <div class="chart-row">
                    <div class="chart-box">
                        <h4>"Utilisation over time"</h4>
                        {utilisation_chart(&run)}
                    </div>
                    <div class="chart-box">
                        <h4>{title}</h4>
                        {gantt_chart(&run)}
                    </div>
                </div>
                {figures(&run)}
            </section>
        })
    }
}
