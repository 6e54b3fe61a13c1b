//! Runs on the server: `POST /api/runs` with the run panel's settings, then the run's
//! events live over `WS /api/runs/{id}/events` until its summary arrives.

use super::api::{self, js_error};
use crate::model;
use crate::state::{EditorState, OutputView, RunStatus, RunView, Target, UpdateRun};
use futures_channel::mpsc;
use futures_util::StreamExt;
use leptos::prelude::*;
use serde_json::{json, Value};
use sluice_engine::telemetry::Event;
use wasm_bindgen::prelude::*;

/// Output summaries as the server stores them.
pub fn outputs_of(summary: &Value) -> Vec<OutputView> {
    summary
        .as_array()
        .map(|items| {
            items
                .iter()
                .map(|o| OutputView {
                    name: o["name"].as_str().unwrap_or_default().to_string(),
                    file: o["file"].as_str().unwrap_or_default().to_string(),
                    shape: o["shape"]
                        .as_array()
                        .map(|s| {
                            s.iter()
                                .filter_map(Value::as_u64)
                                .map(|d| d as usize)
                                .collect()
                        })
                        .unwrap_or_default(),
                    dtype: o["dtype"].as_str().unwrap_or_default().to_string(),
                    first: o["first"]
                        .as_array()
                        .map(|s| s.iter().filter_map(Value::as_f64).collect())
                        .unwrap_or_default(),
                    checksum: o["checksum"].as_f64().unwrap_or(f64::NAN),
                    non_finite: o["non_finite"].as_u64().unwrap_or(0) as usize,
                    npy: None,
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Applies a stored run record (the summary) to the run view.
fn apply_summary(view: &mut RunView, row: &Value) {
    view.status = match row["status"].as_str() {
        Some("succeeded") => RunStatus::Succeeded,
        Some("cancelled") => RunStatus::Cancelled,
        Some("failed") => RunStatus::Failed(
            row["error"]
                .as_str()
                .unwrap_or("the run failed")
                .to_string(),
        ),
        Some(other) => RunStatus::Active(other.to_string()),
        None => RunStatus::Failed("the server lost the run".into()),
    };
    view.outputs = outputs_of(&row["outputs"]);
    let m = &row["metrics"];
    if let Some(devices) = m["devices"].as_array() {
        view.devices = devices
            .iter()
            .filter_map(|d| d.as_str().map(String::from))
            .collect();
    }
    view.timing = m["timing"].as_str().map(String::from);
    if let (Some(p), Some(a)) = (
        m["memory"]["planned_bytes"].as_u64(),
        m["memory"]["allocated_bytes"].as_u64(),
    ) {
        view.memory = Some((p, a));
    }
}

/// Starts a run of the current graph on the server and follows it.
pub fn start(state: EditorState) {
    let settings = state.settings.get_untracked();
    let doc = state.doc.get_untracked();
    let saved_clean = state.saved.with_untracked(Option::is_some) && !state.dirty();
    let updater = state.begin_run(Target::Server, "submitting");
    let update = move |f: &dyn Fn(&mut RunView)| updater.update(f);
    let graph = if saved_clean {
        Value::String(doc.name.clone())
    } else {
        model::to_json(&doc)
    };
    let body = json!({
        "graph": graph,
        "batch": settings.batch,
        "microbatches": settings.microbatches,
        "stages": settings.stages,
        "prefetch": settings.prefetch,
        "precision": settings.precision,
        "seed": settings.seed,
    });
    leptos::task::spawn_local(async move {
        let reply = match api::request("POST", "/api/runs", Some(&body.to_string())).await {
            Ok(r) => r,
            Err(e) => return update(&|r| r.status = RunStatus::Failed(e.clone())),
        };
        if !reply.ok() {
            let mut message = reply.error();
            if let Some(problems) = reply.json()["problems"].as_array() {
                for p in problems {
                    message.push_str(&format!("; {}", p["message"].as_str().unwrap_or("")));
                }
            }
            return update(&|r| r.status = RunStatus::Failed(message.clone()));
        }
        let id = reply.json()["id"].as_str().unwrap_or_default().to_string();
        update(&|r| {
            r.run_id = Some(id.clone());
            r.status = RunStatus::Active("queued".into());
        });
        if let Err(e) = follow(&id, &update).await {
            update(&|r| r.status = RunStatus::Failed(e.clone()));
        }
    });
}

/// Reads the run's event stream until its summary; if the stream ends without one, asks
/// for the stored record.
async fn follow(id: &str, update: &UpdateRun) -> Result<(), String> {
    let url = api::ws_url(&format!("/api/runs/{id}/events"))?;
    let ws = web_sys::WebSocket::new(&url).map_err(|e| js_error(&e))?;
    let (tx, mut rx) = mpsc::unbounded::<Option<String>>();
    let on_message = {
        let tx = tx.clone();
        Closure::<dyn FnMut(web_sys::MessageEvent)>::new(move |e: web_sys::MessageEvent| {
            let _ = tx.unbounded_send(e.data().as_string());
        })
    };
    let on_close = Closure::<dyn FnMut(web_sys::Event)>::new(move |_| {
        let _ = tx.unbounded_send(None);
    });
    ws.set_onmessage(Some(on_message.as_ref().unchecked_ref()));
    ws.set_onclose(Some(on_close.as_ref().unchecked_ref()));
    ws.set_onerror(Some(on_close.as_ref().unchecked_ref()));
    let mut finished = false;
    while let Some(Some(text)) = rx.next().await {
        let msg: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        match msg["type"].as_str() {
            Some("event") => {
                if let Ok(e) = serde_json::from_value::<Event>(msg["event"].clone()) {
                    update(&|r| {
                        if matches!(r.status, RunStatus::Active(_)) {
                            r.status = RunStatus::Active("running".into());
                        }
                        r.events.push(e.clone())
                    });
                }
            }
            Some("summary") => {
                update(&|r| apply_summary(r, &msg["run"]));
                finished = true;
                break;
            }
            _ => {}
        }
    }
    ws.set_onmessage(None);
    ws.set_onclose(None);
    ws.set_onerror(None);
    let _ = ws.close();
    drop((on_message, on_close));
    if !finished {
        let row = api::get_json(&format!("/api/runs/{id}")).await?;
        update(&|r| apply_summary(r, &row));
    }
    Ok(())
}

/// Asks the server to cancel the current run.
pub fn cancel(state: EditorState) {
    let Some(id) = state.run.with_untracked(|r| r.run_id.clone()) else {
        return;
    };
    leptos::task::spawn_local(async move {
        match api::request("POST", &format!("/api/runs/{id}/cancel"), None).await {
            Ok(r) if r.ok() => state.info("cancelling the run"),
            Ok(r) => state.error(format!("cannot cancel: {}", r.error())),
            Err(e) => state.error(e),
        }
    });
}
