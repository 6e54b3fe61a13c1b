//! Runs in this page on WebGPU: the engine compiled to wasm plans the same graph, opens
//! one device per stage on the browser's adapter and runs it through the same session and
//! driver as the server, every stage on the page's event loop, with the same seeded
//! inputs as a server run and its seeded weights — or the weights imported with the
//! graph — so the outputs agree with the server's. Each run compiles anew, so a warm-up
//! pass precedes the measured one.

use crate::model;
use crate::state::{EditorState, OutputView, RunStatus, RunView, Target, UpdateRun};
use leptos::prelude::*;
use sluice_engine::exec::device::{check_weights_fit, Device};
use sluice_engine::exec::{check_run, dataset, Concurrency, RunConfig, RunContext, Session};
use sluice_engine::gpu::{autotune, GpuDevice};
use sluice_engine::plan::Precision;
use sluice_engine::telemetry::Event;
use wasm_bindgen::JsCast;

/// Finds this page's WebGPU adapter (or why there is none) for the run panel and the
/// devices view.
pub fn probe(state: EditorState) {
    leptos::task::spawn_local(async move {
        let has_gpu = web_sys::window()
            .map(|w| js_sys::Reflect::has(&w.navigator(), &"gpu".into()).unwrap_or(false))
            .unwrap_or(false);
        let result = if has_gpu {
            match sluice_engine::gpu::context::best_adapter().await {
                Ok(mut a) => {
                    if a.name.is_empty() {
                        a.name = adapter_description().await;
                    }
                    Ok(a)
                }
                Err(e) => Err(e.to_string()),
            }
        } else {
            Err("this browser has no WebGPU (navigator.gpu is missing)".into())
        };
        state.browser_gpu.set(Some(result));
    });
}

/// What the page's WebGPU adapter says of itself (`GPUAdapterInfo`: vendor,
/// architecture, description), which wgpu does not pass on in browsers.
async fn adapter_description() -> String {
    use js_sys::Reflect;
    let get = |v: &wasm_bindgen::JsValue, k: &str| Reflect::get(v, &k.into()).unwrap_or_default();
    let Some(window) = web_sys::window() else {
        return "WebGPU adapter".into();
    };
    let gpu = get(&window.navigator(), "gpu");
    let request = get(&gpu, "requestAdapter");
    let Ok(request) = request.dyn_into::<js_sys::Function>() else {
        return "WebGPU adapter".into();
    };
    let Ok(promise) = request
        .call0(&gpu)
        .and_then(|p| p.dyn_into::<js_sys::Promise>())
    else {
        return "WebGPU adapter".into();
    };
    let Ok(adapter) = wasm_bindgen_futures::JsFuture::from(promise).await else {
        return "WebGPU adapter".into();
    };
    let info = get(&adapter, "info");
    let parts: Vec<String> = ["vendor", "architecture", "description"]
        .iter()
        .filter_map(|k| get(&info, k).as_string())
        .filter(|s| !s.is_empty())
        .collect();
    let fallback = get(&adapter, "isFallbackAdapter").as_bool() == Some(true)
        || get(&info, "isFallbackAdapter").as_bool() == Some(true);
    let mut name = if parts.is_empty() {
        "WebGPU adapter".to_string()
    } else {
        parts.join(" ")
    };
    if fallback {
        name.push_str(" (software fallback)");
    }
    name
}

/// Starts a run of the current graph in this page.
pub fn start(state: EditorState) {
    if let Some(why) = super::server_run::refusal(state) {
        return state.error(format!("cannot run: {why}"));
    }
    let settings = state.settings.get_untracked();
    let doc = model::for_engine(&state.doc.get_untracked());
    let updater = state.begin_run(Target::Browser, "preparing");
    // wgpu does not pass the adapter's name on in browsers; the probe asked the page.
    let adapter = state
        .browser_gpu
        .with_untracked(|g| {
            g.as_ref()
                .and_then(|g| g.as_ref().ok())
                .map(|a| a.name.clone())
        })
        .unwrap_or_else(|| "WebGPU adapter".into());
    let update = move |f: &dyn Fn(&mut RunView)| updater.update(f);
    leptos::task::spawn_local(async move {
        if let Err(e) = run(state, &doc, &settings, &adapter, &update).await {
            update(&|r| r.status = RunStatus::Failed(e.clone()));
        }
    });
}

/// A tuning decision for people: the class, the variant chosen, whether it was measured
/// now, and every variant tried with its time.
fn tuning_line(d: &autotune::Decision) -> String {
    let tried: Vec<String> = d
        .record
        .tried
        .iter()
        .map(|t| format!("{} {:.2} ms", t.variant, t.ms))
        .collect();
    let how = if d.measured { "measured" } else { "cached" };
    format!(
        "{}: chose {} ({how}; tried {})",
        d.class,
        d.record.chosen,
        tried.join(", ")
    )
}

async fn run(
    state: EditorState,
    doc: &sluice_engine::graph::GraphDoc,
    settings: &crate::state::RunSettings,
    adapter: &str,
    update: &UpdateRun,
) -> Result<(), String> {
    let graph = sluice_engine::graph::Graph::build(doc.clone()).map_err(|p| p.render())?;
    let precision = Precision::parse(&settings.precision)
        .ok_or_else(|| format!("unknown precision '{}'", settings.precision))?;
    let config = RunConfig {
        batch: settings.batch,
        microbatches: settings.microbatches,
        stages: settings.stages,
        prefetch: settings.prefetch,
        precision,
        ..RunConfig::default()
    };
    // The run's limits first, as on the server, before anything is made.
    check_run(&graph, &config, None, &graph.limits).map_err(|e| e.to_string())?;
    let data = dataset::seeded(&graph, settings.batch, settings.seed).map_err(|e| e.to_string())?;
    let progress = |what: &str| {
        let what = what.to_string();
        update(&|r| r.status = RunStatus::Active(what.clone()))
    };
    progress("opening devices");
    let devices: Vec<Box<dyn Device>> = GpuDevice::open_many(config.stages)
        .await
        .map_err(|e| e.to_string())?
        .into_iter()
        .map(|d| Box::new(d) as Box<dyn Device>)
        .collect();
    // The weights are sized against the devices before they are made.
    check_weights_fit(&graph, config.precision, &devices).map_err(|e| e.to_string())?;
    let weights = state.weights_for(&graph);
    let decided = autotune::decision_count();
    let mut session = Session::compile(&graph, &weights, &config, devices, &progress)
        .await
        .map_err(|e| e.to_string())?;
    let tuning: Vec<String> = autotune::decisions_since(decided)
        .iter()
        .map(tuning_line)
        .collect();
    update(&|r| {
        r.devices = session
            .device_names()
            .into_iter()
            .map(|n| match n.strip_prefix(" (") {
                Some(backend) => format!("{adapter} ({backend}"),
                None => n,
            })
            .collect();
        r.status = RunStatus::Active("running".into());
        r.tuning = Some(tuning.clone());
    });
    let observe = |e: &Event| update(&|r| r.events.push(e.clone()));
    let ctx = RunContext {
        observer: Some(&observe),
        concurrency: Concurrency::OneThread,
        ..RunContext::new("browser")
    };
    // A session compiled for this run pays for its first dispatches in a warm-up pass,
    // shown apart and left out of the figures, as on the server.
    session
        .warm_up(&data, &ctx)
        .await
        .map_err(|e| e.to_string())?;
    let report = session.run(&data, &ctx).await.map_err(|e| e.to_string())?;
    let mut outputs = Vec::new();
    for (name, t) in &report.outputs {
        let npy = sluice_engine::npy::to_bytes(t).map_err(|e| e.to_string())?;
        outputs.push(OutputView {
            name: name.clone(),
            file: name.replace(':', "_"),
            shape: t.shape.clone(),
            dtype: t.dtype().to_string(),
            first: t.to_f32_vec().into_iter().take(8).map(f64::from).collect(),
            checksum: t.checksum(),
            non_finite: t.non_finite(),
            npy: Some(npy),
        });
    }
    let memory = (session.memory().planned_bytes, session.allocated_bytes());
    let timing = serde_json::to_value(report.timing)
        .ok()
        .and_then(|v| v.as_str().map(String::from))
        .unwrap_or_default();
    update(&|r| {
        r.outputs = outputs.clone();
        r.memory = Some(memory);
        r.timing = Some(timing.clone());
        r.status = RunStatus::Succeeded;
    });
    Ok(())
}
