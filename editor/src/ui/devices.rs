//! The devices view: the server's workers (the in-process one and every remote
//! `sluice worker`) with their adapters, features and utilisation, and this browser's
//! WebGPU adapter. Refreshed every two seconds while it is shown.

use crate::state::EditorState;
use crate::web::api;
use leptos::prelude::*;
use sluice_api::{DevicesReport, WorkerInfo};
use sluice_engine::gpu::AdapterSummary;

fn features(a: &AdapterSummary) -> String {
    let mut f = Vec::new();
    if a.shader_f16 {
        f.push("shader-f16");
    }
    if a.timestamp_query {
        f.push("timestamps");
    }
    if a.subgroups {
        f.push("subgroups");
    }
    if f.is_empty() {
        "none".into()
    } else {
        f.join(", ")
    }
}

fn adapter_rows(adapters: Vec<AdapterSummary>) -> impl IntoView {
    adapters
        .into_iter()
        .map(|a| {
            view! {
                <div class="adapter">
                    <div><b>{a.name.clone()}</b>{format!(" · {} · {}", a.backend, a.device_type)}</div>
                    <div class="doc">{format!("driver {}", if a.driver.is_empty() { "unknown" } else { &a.driver })}</div>
                    <div class="doc">{format!("features: {}", features(&a))}</div>
                    <div class="doc">{format!(
                        "limits: buffer {} MiB, storage binding {} MiB, {} workgroups/dim",
                        a.max_buffer_size >> 20, a.max_storage_binding >> 20, a.max_workgroups_per_dimension
                    )}</div>
                </div>
            }
        })
        .collect_view()
}

/// The view.
#[component]
pub fn Devices(state: EditorState) -> impl IntoView {
    let workers = RwSignal::new(None::<Result<Vec<WorkerInfo>, String>>);
    let load = move || {
        leptos::task::spawn_local(async move {
            let result = api::get::<DevicesReport>("/api/devices")
                .await
                .map(|r| r.workers);
            if let Ok(list) = &result {
                state.server_rates.set(list.iter().find_map(|w| w.rates));
            }
            workers.set(Some(result));
        })
    };
    load();
    let timer = set_interval_with_handle(load, std::time::Duration::from_secs(2)).ok();
    on_cleanup(move || {
        if let Some(t) = timer {
            t.clear();
        }
    });
    let server = move || {
        match workers.get() {
        None => view! { <p class="doc">"asking the server…"</p> }.into_any(),
        Some(Err(e)) => view! { <p class="field-error">{e}</p> }.into_any(),
        Some(Ok(list)) => list
            .into_iter()
            .map(|w| {
                let util: Vec<String> = w
                    .utilisation
                    .iter()
                    .map(|x| format!("{:.1}%", x * 100.0))
                    .collect();
                let rates = w.rates.map(|r| {
                    format!(
                        "measured: {:.1} GFLOP/s compute, {:.1} GB/s memory, {:.2} GB/s stage transfers, {:.0} µs per pass",
                        r.flops_per_s / 1e9,
                        r.bytes_per_s / 1e9,
                        r.transfer_bytes_per_s / 1e9,
                        r.pass_overhead_s * 1e6
                    )
                });
                view! {
                    <div class="worker" data-worker=w.id.clone()>
                        <h4>{format!("{} ({})", w.id, w.kind)}</h4>
                        <div class="doc">{format!("utilisation (last or current run): {}", if util.is_empty() { "—".into() } else { util.join(", ") })}</div>
                        {rates.map(|r| view! { <div class="doc">{r}</div> })}
                        {adapter_rows(w.adapters)}
                    </div>
                }
            })
            .collect_view()
            .into_any(),
    }
    };
    view! {
        <div class="props devices">
            <h3>"Server workers"</h3>
            {server}
            <h3>"This browser"</h3>
            {move || match state.browser_gpu.get() {
                None => view! { <p class="doc">"looking for a WebGPU adapter…"</p> }.into_any(),
                Some(Ok(a)) => adapter_rows(vec![a]).into_any(),
                Some(Err(e)) => view! { <p class="doc">{e}</p> }.into_any(),
            }}
        </div>
    }
}
