//! Runs on the server: `POST /api/runs` with the run panel's settings, then the run's
//! events live over `WS /api/runs/{id}/events` until its summary arrives. A graph saved
//! and unchanged runs by name with its stored weights; any other is sent as a document,
//! with the weights that came with it (an imported model's, as a browser run uses them),
//! so a server run and a browser run of the same graph compute the same answer.

use super::api::{self, js_error};
use crate::model;
use crate::state::{EditorState, OutputView, RunStatus, RunView, Target, UpdateRun};
use futures_channel::mpsc;
use futures_util::StreamExt;
use leptos::prelude::*;
use sluice_api::{
    GraphRef, LiveMessage, OutputSummary, RunAccepted, RunRecord, RunRequest,
    RunStatus as ApiStatus, Upload,
};
use sluice_engine::graph::{Graph, GraphDoc};
use sluice_engine::plan::Precision;
use sluice_engine::train::checkpoint::encode_weights;
use wasm_bindgen::prelude::*;

/// Output summaries as the server stores them.
pub fn outputs_of(outputs: &[OutputSummary]) -> Vec<OutputView> {
    outputs
        .iter()
        .map(|o| OutputView {
            name: o.name.clone(),
            file: o.file.clone(),
            shape: o.shape.clone(),
            dtype: o.dtype.to_string(),
            first: o.first.iter().map(|&v| f64::from(v)).collect(),
            checksum: o.checksum,
            non_finite: o.non_finite,
            npy: None,
        })
        .collect()
}

/// Applies a stored run record (the summary) to the run view.
fn apply_summary(view: &mut RunView, row: Option<&RunRecord>) {
    let Some(row) = row else {
        view.status = RunStatus::Failed("the server lost the run".into());
        return;
    };
    view.status = match row.status {
        ApiStatus::Succeeded => RunStatus::Succeeded,
        ApiStatus::Cancelled => RunStatus::Cancelled,
        ApiStatus::Failed => {
            RunStatus::Failed(row.error.clone().unwrap_or_else(|| "the run failed".into()))
        }
        active => RunStatus::Active(active.as_str().to_string()),
    };
    view.outputs = row.outputs.as_deref().map(outputs_of).unwrap_or_default();
    if let Some(m) = &row.metrics {
        view.devices = m.devices.clone();
        view.timing = serde_json::to_value(m.timing)
            .ok()
            .and_then(|v| v.as_str().map(String::from));
        view.memory = m.memory.map(|mem| (mem.planned_bytes, mem.allocated_bytes));
    }
}

/// Why a run of the current graph with the run panel's settings cannot start, in plain
/// words, or `None`: a pipeline whose stage split the engine's partitioner refuses (more
/// stages than operator nodes, pins that break the order of dependencies, a batch that
/// does not divide) is refused by the server in the same words.
pub fn refusal(state: EditorState) -> Option<String> {
    let stages = state.settings.with(|s| s.stages);
    if stages <= 1 {
        return None;
    }
    let reason = state.stages.with(|placed| placed.as_ref().err().cloned())?;
    let reason = reason.strip_prefix("stages: ").unwrap_or(&reason);
    Some(format!(
        "the graph cannot be split into {stages} stages: {reason}"
    ))
}

/// The graph of a server run that is not the stored graph, as a document, with the
/// weights that came with it (the ones a browser run uses, [`EditorState::weights_for`])
/// as a safetensors file; no weights when none came with it (seeded, as the server seeds
/// them) or when the graph does not build (the server then names its problems). The
/// document sent never names a weights file: the weights travel with it.
fn inline_graph(state: EditorState, doc: &GraphDoc) -> Result<(GraphRef, Option<Upload>), String> {
    let mut doc = model::for_engine(doc);
    if state.weights.with_value(Option::is_none) {
        return Ok((GraphRef::Inline(model::to_json(&doc)), None));
    }
    doc.params.file = None;
    let weights = match Graph::build(doc.clone()) {
        Ok(graph) => {
            let bytes = encode_weights(&state.weights_for(&graph))
                .map_err(|e| format!("cannot write the model's weights: {e}"))?;
            Some(Upload::of_bytes(&bytes))
        }
        Err(_) => None,
    };
    Ok((GraphRef::Inline(model::to_json(&doc)), weights))
}

/// Starts a run of the current graph on the server and follows it.
pub fn start(state: EditorState) {
    if let Some(why) = refusal(state) {
        return state.error(format!("cannot run: {why}"));
    }
    let settings = state.settings.get_untracked();
    let doc = state.doc.get_untracked();
    let saved_clean = state.saved.with_untracked(Option::is_some) && !state.dirty();
    let updater = state.begin_run(Target::Server, "submitting");
    let update = move |f: &dyn Fn(&mut RunView)| updater.update(f);
    let (graph, weights) = if saved_clean {
        (GraphRef::Stored(doc.name.clone()), None)
    } else {
        match inline_graph(state, &doc) {
            Ok(sent) => sent,
            Err(e) => return update(&|r| r.status = RunStatus::Failed(e.clone())),
        }
    };
    let sends_weights = weights.is_some();
    let Some(precision) = Precision::parse(&settings.precision) else {
        return update(&|r| {
            r.status = RunStatus::Failed(format!("unknown precision '{}'", settings.precision))
        });
    };
    let request = RunRequest {
        batch: settings.batch,
        microbatches: settings.microbatches,
        stages: settings.stages,
        prefetch: settings.prefetch,
        precision,
        seed: settings.seed,
        // The editor's runs take their inputs from the input seed, as the Run panel says
        // (a browser run does the same), so the request asks for seeded inputs.
        seed_inputs: true,
        weights,
        ..RunRequest::new(graph)
    };
    let body = serde_json::to_string(&request).unwrap_or_default();
    leptos::task::spawn_local(async move {
        let reply = match api::request("POST", "/api/runs", Some(&body)).await {
            Ok(r) => r,
            Err(e) => return update(&|r| r.status = RunStatus::Failed(e.clone())),
        };
        if reply.status == 413 && sends_weights {
            let message = format!(
                "the model's weights are too large to send with the run ({}); save the graph \
                 to the workspace (its weights are stored with it), then run it",
                reply.error()
            );
            return update(&|r| r.status = RunStatus::Failed(message.clone()));
        }
        if !reply.ok() {
            let mut message = reply.error();
            if let Some(problems) = reply.error_body().and_then(|b| b.problems) {
                for p in problems {
                    message.push_str(&format!("; {}", p.message));
                }
            }
            return update(&|r| r.status = RunStatus::Failed(message.clone()));
        }
        let id = match serde_json::from_slice::<RunAccepted>(&reply.body) {
            Ok(a) => a.id,
            Err(e) => {
                let message = format!("the server's answer to the run is unreadable: {e}");
                return update(&|r| r.status = RunStatus::Failed(message.clone()));
            }
        };
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
        match serde_json::from_str::<LiveMessage>(&text) {
            Ok(LiveMessage::Event { event }) => update(&|r| {
                if matches!(r.status, RunStatus::Active(_)) {
                    r.status = RunStatus::Active("running".into());
                }
                r.events.push(event.clone())
            }),
            Ok(LiveMessage::Summary { run }) => {
                update(&|r| apply_summary(r, run.as_deref()));
                finished = true;
                break;
            }
            Ok(LiveMessage::Metrics { .. }) | Err(_) => {}
        }
    }
    ws.set_onmessage(None);
    ws.set_onclose(None);
    ws.set_onerror(None);
    let _ = ws.close();
    drop((on_message, on_close));
    if !finished {
        let row: RunRecord = api::get(&format!("/api/runs/{id}")).await?;
        update(&|r| apply_summary(r, Some(&row)));
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
