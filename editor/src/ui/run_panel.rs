//! The run panel: target (the server, or this browser's WebGPU when the page has an
//! adapter), batch, micro-batches, stages, prefetch, precision and input seed; the stage
//! split with auto-partition; run and cancel; the status; each output's shape, first
//! values and checksum with its `.npy` download; the trace download.

use super::actions;
use crate::model;
use crate::state::{EditorState, RunStatus, Target};
use crate::web::{api, files, server_run};
use leptos::prelude::*;
use sluice_engine::telemetry::trace::chrome_trace;

fn number_field(
    state: EditorState,
    id: &'static str,
    label: &'static str,
    doc: &'static str,
    get: fn(&crate::state::RunSettings) -> usize,
    set: fn(&mut crate::state::RunSettings, usize),
) -> impl IntoView {
    view! {
        <label class="field">
            <span class="field-name">{label}</span>
            <input id=id type="number" min="1" prop:value=move || state.settings.with(get).to_string()
                on:change=move |ev| {
                    match event_target_value(&ev).trim().parse::<usize>() {
                        Ok(n) if n >= 1 => state.settings.update(|s| set(s, n)),
                        _ => state.error(format!("{label} must be a whole number of at least 1")),
                    }
                } />
            <span class="field-doc">{doc}</span>
        </label>
    }
}

/// Pins every unpinned node to the stage the partitioner gives it.
fn auto_partition(state: EditorState) {
    match state.stages.get_untracked() {
        Ok(placed) => state.edit(|d| {
            for (id, s) in placed {
                d.stages.entry(id).or_insert(s);
            }
            Ok(())
        }),
        Err(e) => state.error(format!("cannot partition: {e}")),
    }
}

fn stage_summary(state: EditorState) -> impl IntoView {
    move || {
        let s = state.settings.with(|s| s.stages);
        if s <= 1 {
            return view! { <p class="doc">"One stage: the whole graph on one device."</p> }
                .into_any();
        }
        match state.stages.get() {
            Ok(placed) => {
                let rows = (0..s)
                    .map(|k| {
                        let nodes: Vec<String> = placed
                            .iter()
                            .filter(|(_, &v)| v == k)
                            .map(|(id, _)| id.clone())
                            .collect();
                        view! {
                            <li class="stage-row" data-stage=k.to_string()>
                                <span class="swatch" style=format!("background:{}", crate::charts::stage_colour(k))></span>
                                {format!("stage {k}: {}", if nodes.is_empty() { "(empty)".to_string() } else { nodes.join(", ") })}
                            </li>
                        }
                    })
                    .collect_view();
                view! { <ul class="stages">{rows}</ul> }.into_any()
            }
            Err(e) => {
                view! { <p class="field-error">{format!("No stage split: {}", e.strip_prefix("stages: ").unwrap_or(&e))}</p> }.into_any()
            }
        }
    }
}

fn outputs(state: EditorState) -> impl IntoView {
    move || {
        let run = state.run.get();
        if run.outputs.is_empty() {
            return None;
        }
        let run_id = run.run_id.clone();
        let rows = run
            .outputs
            .into_iter()
            .map(|o| {
                let first: Vec<String> = o.first.iter().map(|v| format!("{v:.5}")).collect();
                let shape = format!("{:?}", o.shape);
                let file = o.file.clone();
                let npy = o.npy.clone();
                let run_id = run_id.clone();
                view! {
                    <div class="output" data-output=o.name.clone()>
                        <div><b>{o.name.clone()}</b>{format!(" {} {shape}", o.dtype)}</div>
                        <div class="first">{format!("first: {}", first.join(", "))}</div>
                        <div class="checksum" data-checksum=o.checksum.to_string()>{format!("checksum: {:.6}", o.checksum)}
                            {(o.non_finite > 0).then(|| format!(" · {} non-finite", o.non_finite))}</div>
                        <button class="download-npy" on:click=move |_| {
                            let result = match (&npy, &run_id) {
                                (Some(bytes), _) => files::download(&format!("{file}.npy"), "application/octet-stream", bytes),
                                (None, Some(id)) => files::download_url(&api::with_token(&format!("/api/runs/{id}/outputs/{file}"))),
                                (None, None) => Err("no output to download".into()),
                            };
                            if let Err(e) = result { state.error(e); }
                        }>"Download .npy"</button>
                    </div>
                }
            })
            .collect_view();
        Some(view! { <div class="outputs-list"><h4>"Outputs"</h4>{rows}</div> })
    }
}

/// Downloads the run's Chrome trace (opens in Perfetto).
fn download_trace(state: EditorState) {
    let run = state.run.get_untracked();
    let result = match (&run.run_id, run.target) {
        (Some(id), Target::Server) => {
            files::download_url(&api::with_token(&format!("/api/runs/{id}/trace")))
        }
        _ => {
            let trace = chrome_trace(&run.events, &run.devices);
            files::download(
                "browser-run.trace.json",
                "application/json",
                trace.to_string().as_bytes(),
            )
        }
    };
    if let Err(e) = result {
        state.error(format!("cannot download the trace: {e}"));
    }
}

/// The panel.
#[component]
pub fn RunPanel(state: EditorState) -> impl IntoView {
    let browser_ok = move || state.browser_gpu.with(|g| matches!(g, Some(Ok(_))));
    let browser_note = move || match state.browser_gpu.get() {
        None => "looking for a WebGPU adapter…".to_string(),
        Some(Ok(a)) => format!("this browser: {} ({})", a.name, a.backend),
        Some(Err(e)) => format!("in-browser runs unavailable: {e}"),
    };
    view! {
        <div class="props run-panel">
            <h3>"Run"</h3>
            <label class="field">
                <span class="field-name">"target"</span>
                <select id="run-target" on:change=move |ev| {
                    let t = if event_target_value(&ev) == "browser" { Target::Browser } else { Target::Server };
                    state.settings.update(|s| s.target = t);
                }>
                    <option value="server" selected=move || state.settings.with(|s| s.target == Target::Server)>"server workers"</option>
                    <option value="browser" disabled=move || !browser_ok()
                        selected=move || state.settings.with(|s| s.target == Target::Browser)>"this browser (WebGPU)"</option>
                </select>
                <span class="field-doc" id="browser-gpu">{browser_note}</span>
            </label>
            {number_field(state, "run-batch", "batch", "Samples per batch (N).", |s| s.batch, |s, n| s.batch = n)}
            {number_field(state, "run-microbatches", "micro-batches", "M: the batch is cut into M micro-batches.", |s| s.microbatches, |s, n| s.microbatches = n)}
            {number_field(state, "run-stages", "stages", "S: pipeline stages, each on its own device (GPipe).", |s| s.stages, |s, n| s.stages = n)}
            {number_field(state, "run-prefetch", "prefetch", "K: micro-batches in flight, uploaded ahead of compute.", |s| s.prefetch, |s, n| s.prefetch = n)}
            <label class="field">
                <span class="field-name">"precision"</span>
                <select id="run-precision" on:change=move |ev| {
                    let p = event_target_value(&ev);
                    state.settings.update(|s| s.precision = p);
                }>
                    {["f32", "mixed", "f16"].into_iter().map(|p| view! {
                        <option value=p selected=move || state.settings.with(|s| s.precision == p)>{p}</option>
                    }).collect_view()}
                </select>
                <span class="field-doc">"mixed: f16 storage, f32 accumulation (packed 16-bit where the adapter lacks shader-f16)."</span>
            </label>
            <label class="field">
                <span class="field-name">"input seed"</span>
                <input id="run-seed" type="number" min="0" prop:value=move || state.settings.with(|s| s.seed.to_string())
                    on:change=move |ev| {
                        match event_target_value(&ev).trim().parse::<u64>() {
                            Ok(n) => state.settings.update(|s| s.seed = n),
                            Err(_) => state.error("the input seed must be a non-negative integer"),
                        }
                    } />
                <span class="field-doc">"Inputs are seeded random values, the same on the server and here."</span>
            </label>
            <h4>"Stages"</h4>
            {stage_summary(state)}
            <div class="buttons">
                <button id="auto-partition" on:click=move |_| auto_partition(state)
                    title="Pin every unpinned node to the stage the partitioner chooses">"Auto-partition"</button>
                <button id="clear-pins" on:click=move |_| state.edit(|d| { d.stages.clear(); Ok(()) })>"Clear pins"</button>
            </div>
            <div class="buttons">
                <button id="run-button" class="primary"
                    disabled=move || state.run.with(|r| r.is_active()) || server_run::refusal(state).is_some()
                    on:click=move |_| actions::run(state)
                    title=move || server_run::refusal(state).map_or_else(|| "Run (Ctrl+Enter)".to_string(), |why| format!("Cannot run: {why}"))>"Run"</button>
                <button id="cancel-button" disabled=move || state.run.with(|r| !r.is_active() || r.target != Target::Server)
                    on:click=move |_| server_run::cancel(state)>"Cancel"</button>
                <button id="trace-button" disabled=move || state.run.with(|r| r.status != RunStatus::Succeeded)
                    on:click=move |_| download_trace(state)>"Trace"</button>
            </div>
            {move || server_run::refusal(state).map(|why| view! {
                <p id="run-refused" class="field-error">{format!("Run is off: {why}.")}</p>
            })}
            {move || state.weights_lost.get().then(|| view! {
                <p id="run-weights-lost" class="field-error">"The weights imported with this model were not kept when the page reloaded: runs here and on the server use seeded weights, not the model's. Import the model again (or open it from the workspace, if it was saved) to run it with its own."</p>
            })}
            <div id="run-status" class="run-status" data-status=move || state.run.with(|r| match &r.status {
                RunStatus::Idle => "idle", RunStatus::Active(_) => "active", RunStatus::Succeeded => "succeeded",
                RunStatus::Failed(_) => "failed", RunStatus::Cancelled => "cancelled" }.to_string())>
                {move || state.run.with(|r| {
                    let target = match r.target { Target::Server => "server", Target::Browser => "browser" };
                    match &r.status {
                        RunStatus::Idle => "No run yet.".to_string(),
                        RunStatus::Active(what) => format!("{target} run: {what}…"),
                        RunStatus::Succeeded => format!("{target} run {} succeeded.", r.run_id.clone().unwrap_or_default()),
                        RunStatus::Failed(e) => format!("{target} run failed: {e}"),
                        RunStatus::Cancelled => format!("{target} run cancelled."),
                    }
                })}
            </div>
            {outputs(state)}
            {move || state.unplaced.with(|d| model::for_engine(d).nodes.is_empty()).then(|| view! {
                <p class="hint">"Add nodes to the graph to run it."</p>
            })}
        </div>
    }
}
