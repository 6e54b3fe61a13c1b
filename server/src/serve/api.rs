//! The HTTP and WebSocket API: the router with its guards, and small handlers over one
//! [`AppState`]. Bodies are typed by the `sluice-api` crate and read within their limits;
//! CPU work runs on blocking threads behind turns, database and file work on blocking
//! threads; every error is a JSON [`AppError`] with the right status.

use super::body::Received;
use super::error::{json_errors, ApiResult, AppError};
use super::events::{forward_finished, forward_live};
use super::guard::{check_host_and_origin, media_type, require_json, require_token, MODEL_TYPES};
use super::prepare::{parse_json, prepare_run};
use super::state::AppState;
use super::workspace::{
    committed_weights_file, settable_weights_file, valid_run_id, valid_weights_file,
};
use super::{metrics, openapi, page};
use axum::body::Body;
use axum::extract::ws::WebSocketUpgrade;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode, Uri};
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use sluice_api::{
    valid_name, DevicesReport, GraphList, GraphSaved, LiveMessage, MemoryFigures, RunAccepted,
    RunList, RunStatus, WorkerInfo, DEFAULT_PAGE, MAX_PAGE,
};
use std::collections::HashMap;
use std::io::Read;

fn check_name(name: &str) -> ApiResult<()> {
    if valid_name(name) {
        Ok(())
    } else {
        Err(AppError::bad(format!(
            "'{}' is not a valid name: use 1-64 of A-Z a-z 0-9 _ -",
            name.chars().take(100).collect::<String>()
        )))
    }
}

fn check_id(id: &str) -> ApiResult<()> {
    if valid_run_id(id) {
        Ok(())
    } else {
        Err(no_run(id))
    }
}

fn no_run(id: &str) -> AppError {
    AppError::not_found(format!(
        "no run with id '{}'",
        id.chars().take(100).collect::<String>()
    ))
}

/// The router with every route, guarded: `Host` and `Origin` on all; the token on all
/// but the editor bundle's files; JSON bodies on the API.
pub fn router(state: AppState) -> Router {
    let api = Router::new()
        .route("/api/ops", get(ops))
        .route("/api/graphs", get(list_graphs))
        .route(
            "/api/graphs/{name}",
            get(get_graph).put(put_graph).delete(delete_graph),
        )
        .route("/api/graphs/{name}/versions", get(list_versions))
        .route("/api/graphs/{name}/versions/{version}", get(get_version))
        .route(
            "/api/graphs/{name}/versions/{version}/restore",
            post(restore_version),
        )
        .route("/api/weights/{file}", get(get_weights).put(put_weights))
        .route("/api/validate", post(validate))
        .route("/api/runs", get(list_runs).post(create_run))
        .route("/api/runs/{id}", get(get_run))
        .route("/api/runs/{id}/outputs/{name}", get(get_output))
        .route("/api/runs/{id}/trace", get(get_trace))
        .route("/api/runs/{id}/cancel", post(cancel_run))
        .route("/api/runs/{id}/events", get(run_events))
        .route("/api/devices", get(devices))
        .route("/api/workers", get(worker_socket))
        .route("/api/openapi.json", get(openapi_json))
        .route(
            "/api/{*rest}",
            any(|| async { AppError::not_found("no such route") }),
        )
        .route("/metrics", get(metrics_text));
    let app =
        match &state.editor {
            Some(bundle) => {
                let bundle = bundle.clone();
                let protected = api.layer(middleware::from_fn(require_json)).layer(
                    middleware::from_fn_with_state(state.gate.clone(), require_token),
                );
                protected.fallback(move |uri: Uri| bundle.clone().serve(uri))
            }
            None => api
                .route("/", get(index))
                .fallback(|| async { AppError::not_found("no such route") })
                .layer(middleware::from_fn(require_json))
                .layer(middleware::from_fn_with_state(
                    state.gate.clone(),
                    require_token,
                )),
        };
    app.layer(middleware::from_fn_with_state(
        state.gate.clone(),
        check_host_and_origin,
    ))
    .layer(middleware::map_response(json_errors))
    .layer(axum::extract::DefaultBodyLimit::disable())
    .with_state(state)
}

/// `/` without the editor bundle: the graphs and the newest runs.
async fn index(State(state): State<AppState>) -> ApiResult<Response> {
    let s = state.clone();
    let html = state
        .work
        .quick("listing the workspace", move || {
            let graphs = s.workspace.list_graphs()?;
            let runs = s.db.page(DEFAULT_PAGE, None)?.unwrap_or(RunList {
                runs: Vec::new(),
                next: None,
            });
            let counts = s.db.counts()?;
            Ok(page::render(&graphs, &runs.runs, &counts))
        })
        .await?;
    Ok(([(header::CONTENT_TYPE, "text/html; charset=utf-8")], html).into_response())
}

async fn ops() -> Json<Value> {
    Json(json!({ "ops": sluice_engine::ops::schemas() }))
}

async fn list_graphs(State(state): State<AppState>) -> ApiResult<Json<GraphList>> {
    let s = state.clone();
    let graphs = state
        .work
        .quick("listing the graphs", move || {
            Ok(s.workspace.list_graphs()?)
        })
        .await?;
    Ok(Json(GraphList { graphs }))
}

async fn get_graph(State(state): State<AppState>, Path(name): Path<String>) -> ApiResult<Response> {
    check_name(&name)?;
    let s = state.clone();
    let n = name.clone();
    match state
        .work
        .quick("reading the graph", move || {
            Ok(s.workspace.read_graph(&n)?)
        })
        .await?
    {
        Some(text) => Ok(([(header::CONTENT_TYPE, "application/json")], text).into_response()),
        None => Err(AppError::not_found(format!("no graph named '{name}'"))),
    }
}

/// The kept versions of a graph (each save or delete that replaced it kept what it
/// replaced), newest first; a deleted graph's versions stay listed.
async fn list_versions(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> ApiResult<Response> {
    check_name(&name)?;
    let s = state.clone();
    let versions = state
        .work
        .quick("listing the versions", move || {
            Ok(s.workspace.list_versions(&name)?)
        })
        .await?;
    Ok(Json(sluice_api::VersionList { versions }).into_response())
}

/// One kept version of a graph, as it was stored.
async fn get_version(
    State(state): State<AppState>,
    Path((name, version)): Path<(String, String)>,
) -> ApiResult<Response> {
    check_name(&name)?;
    let s = state.clone();
    let (n, v) = (name.clone(), version.clone());
    match state
        .work
        .quick("reading the version", move || {
            s.workspace
                .read_version(&n, &v)
                .map_err(|e| AppError::bad(format!("{e:#}")))
        })
        .await?
    {
        Some(text) => Ok(([(header::CONTENT_TYPE, "application/json")], text).into_response()),
        None => Err(AppError::not_found(format!(
            "'{name}' has no version {version}"
        ))),
    }
}

/// Makes a kept version the stored graph again with the weights kept with it (what it
/// replaces is kept in turn).
async fn restore_version(
    State(state): State<AppState>,
    Path((name, version)): Path<(String, String)>,
) -> ApiResult<Response> {
    check_name(&name)?;
    let s = state.clone();
    let (n, v) = (name.clone(), version.clone());
    let restored = state
        .work
        .quick("restoring the version", move || {
            // A malformed version id is the client's error; anything else the server's.
            s.workspace
                .read_version(&n, &v)
                .map_err(|e| AppError::bad(format!("{e:#}")))?;
            Ok(s.workspace.restore_version(&n, &v)?)
        })
        .await?;
    if restored {
        Ok(Json(serde_json::json!({ "restored": name, "version": version })).into_response())
    } else {
        Err(AppError::not_found(format!(
            "'{name}' has no version {version}"
        )))
    }
}

/// A weights file of the workspace (`NAME.safetensors`), as stored.
async fn get_weights(
    State(state): State<AppState>,
    Path(file): Path<String>,
) -> ApiResult<Response> {
    if !valid_weights_file(&file) {
        return Err(AppError::bad(format!(
            "'{file}' is not a weights file name (NAME.safetensors, NAME a graph name)"
        )));
    }
    let s = state.clone();
    let f = file.clone();
    match state
        .work
        .quick("reading the weights", move || {
            Ok(s.workspace.read_weights(&f)?)
        })
        .await?
    {
        Some(bytes) => {
            Ok(([(header::CONTENT_TYPE, "application/octet-stream")], bytes).into_response())
        }
        None => Err(AppError::not_found(format!(
            "no weights file named '{file}'"
        ))),
    }
}

/// Stores a weights file (`application/octet-stream`, safetensors) durably, after checking
/// that it parses within the limits; a graph naming it in `params.file` then runs with it
/// (the editor saves an imported model's weights so, before the graph). The weights it
/// replaces are kept with a version of each graph naming them. A model's committed
/// weights (`NAME.HASH.safetensors`) never change.
async fn put_weights(
    State(state): State<AppState>,
    Path(file): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    if !settable_weights_file(&file) {
        let why = if valid_weights_file(&file) {
            "names a model's weights committed with its graph, which never change"
        } else {
            "is not a weights file name"
        };
        return Err(AppError::bad(format!(
            "'{}' {why}: put NAME.safetensors, NAME a graph name",
            file.chars().take(100).collect::<String>()
        )));
    }
    if !media_type(&headers).is_some_and(|t| t.eq_ignore_ascii_case("application/octet-stream")) {
        return Err(AppError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "a weights file is sent as 'Content-Type: application/octet-stream'",
        ));
    }
    let body = state.bodies.read(&headers, body).await?;
    let limits = state.limits.clone();
    let body = state
        .work
        .heavy("checking the weights", move || {
            sluice_engine::weights::parse_safetensors(&body.bytes, &limits)
                .map_err(|e| AppError::bad(format!("not a safetensors file: {e}")))?;
            Ok(body)
        })
        .await?;
    let s = state.clone();
    let f = file.clone();
    state
        .work
        .quick("storing the weights", move || {
            Ok(s.workspace.write_weights(&f, &body.bytes)?)
        })
        .await?;
    Ok((StatusCode::OK, Json(serde_json::json!({ "saved": file }))).into_response())
}

/// What a `PUT /api/graphs/{name}` stores: a graph file as sent, or an imported model.
enum Put {
    /// A graph file, as received (holding its share of the body budget).
    Graph(Received),
    /// An imported model: the graph document's text and its weights file.
    Model { graph: Vec<u8>, weights: Vec<u8> },
}

/// External tensor data of a model sent as a body: there is none.
struct BodyOnly;

impl sluice_engine::onnx::ExternalData for BodyOnly {
    fn read(&self, location: &str, _: u64, _: Option<u64>) -> Result<Vec<u8>, String> {
        Err(format!(
            "the model keeps tensor data in an external file '{}'; the server takes \
             self-contained models only (import it with `sluice import` next to its data)",
            location.chars().take(100).collect::<String>()
        ))
    }
}

/// Imports an ONNX model as the graph `name`: its document (named after the graph when the
/// model names none, `params.file` naming its weights' committed file
/// `NAME.HASH.safetensors`), checked against the limits, and its weights as safetensors. 422 with the importer's message for a model Sluice
/// cannot import.
fn import_model(
    name: &str,
    bytes: &[u8],
    limits: &sluice_engine::limits::Limits,
) -> ApiResult<Put> {
    let imported = sluice_engine::onnx::import(bytes, &BodyOnly, limits)
        .map_err(|e| AppError::unprocessable(format!("cannot import the model: {e}")))?;
    let mut doc = imported.doc;
    if doc.name.is_empty() || doc.name == "imported" {
        doc.name = name.to_string();
    }
    let weights = sluice_engine::train::checkpoint::encode_weights(&imported.weights)
        .map_err(|e| AppError::unprocessable(format!("cannot store the model's weights: {e}")))?;
    doc.params.file = Some(committed_weights_file(name, &weights));
    let graph =
        sluice_engine::Graph::build_with(doc, limits).map_err(|p| AppError::problems(p.0))?;
    let text = serde_json::to_string_pretty(&graph.doc)
        .map_err(|e| AppError::unprocessable(format!("cannot write the imported graph: {e}")))?;
    Ok(Put::Model {
        graph: text.into_bytes(),
        weights,
    })
}

/// Stores a graph file as sent, only after it checks exactly as `sluice validate` checks
/// it (the engine's `load_graph_with` under the same limits): a graph with any problem is
/// refused with 422 and every problem, and nothing is stored. A body sent as an ONNX model
/// (`application/onnx` or `application/octet-stream`) is imported and stored with its
/// weights as one commit (`NAME.HASH.safetensors`, which its `params.file` names).
async fn put_graph(
    State(state): State<AppState>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    check_name(&name)?;
    let model =
        media_type(&headers).is_some_and(|t| MODEL_TYPES.iter().any(|m| t.eq_ignore_ascii_case(m)));
    let body = state.bodies.read(&headers, body).await?;
    let limits = state.limits.clone();
    let n = name.clone();
    let put = state
        .work
        .heavy("checking the graph", move || {
            if model {
                return import_model(&n, &body.bytes, &limits);
            }
            let value = parse_json(&body.bytes, limits.max_json_values)?;
            if !value.is_object() {
                return Err(AppError::bad("a graph file must be a JSON object"));
            }
            let text = std::str::from_utf8(&body.bytes)
                .map_err(|_| AppError::bad("a graph file must be UTF-8 text"))?;
            sluice_engine::load_graph_with(text, &limits).map_err(|p| AppError::problems(p.0))?;
            Ok(Put::Graph(body))
        })
        .await?;
    let s = state.clone();
    let n = name.clone();
    let existed = state
        .work
        .quick("storing the graph", move || {
            let graphs = s.workspace.list_graphs()?;
            let existed = graphs.binary_search(&n).is_ok();
            if !existed && graphs.len() >= s.max_graphs {
                return Err(AppError::unprocessable(format!(
                    "the workspace needs {} graphs, over the limit of {} graphs (max_graphs; raise it with --max-graphs)",
                    graphs.len() + 1,
                    s.max_graphs
                )));
            }
            match &put {
                Put::Graph(body) => s.workspace.write_graph(&n, &body.bytes)?,
                Put::Model { graph, weights } => s.workspace.write_model(&n, graph, weights)?,
            }
            Ok(existed)
        })
        .await?;
    let status = if existed {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    Ok((
        status,
        Json(GraphSaved {
            saved: name,
            valid: true,
            problems: Vec::new(),
        }),
    )
        .into_response())
}

async fn delete_graph(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> ApiResult<Response> {
    check_name(&name)?;
    let s = state.clone();
    let n = name.clone();
    if state
        .work
        .quick("deleting the graph", move || {
            Ok(s.workspace.delete_graph(&n)?)
        })
        .await?
    {
        Ok(StatusCode::NO_CONTENT.into_response())
    } else {
        Err(AppError::not_found(format!("no graph named '{name}'")))
    }
}

async fn validate(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    let body = state.bodies.read(&headers, body).await?;
    let limits = state.limits.clone();
    state
        .work
        .heavy("validating the graph", move || {
            parse_json(&body.bytes, limits.max_json_values)?;
            let text = std::str::from_utf8(&body.bytes)
                .map_err(|_| AppError::bad("a graph file must be UTF-8 text"))?;
            Ok(match sluice_engine::load_graph_with(text, &limits) {
                Ok(g) => {
                    let nodes: Vec<Value> = g
                        .order
                        .iter()
                        .map(|&ix| {
                            let n = &g.dag[ix];
                            json!({ "id": n.id, "op": n.op_name(), "outputs": n.outputs, "batch": n.batch })
                        })
                        .collect();
                    let couplings = g.batch_semantics().couplings;
                    Json(json!({ "valid": true, "nodes": nodes, "couplings": couplings }))
                        .into_response()
                }
                Err(p) => (
                    StatusCode::UNPROCESSABLE_ENTITY,
                    Json(json!({ "valid": false, "problems": p.0 })),
                )
                    .into_response(),
            })
        })
        .await
}

async fn create_run(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    let full = || {
        AppError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "the run queue is full; try again later",
        )
    };
    let body = state.bodies.read(&headers, body).await?;
    // A full queue is answered before any checking.
    let place = state.runs.reserve().ok_or_else(full)?;
    let s = state.clone();
    let prepared = state
        .work
        .heavy("checking the run", move || {
            prepare_run(&s.workspace, &body.bytes, &s.limits)
        })
        .await?;
    let s = state.clone();
    let id = state
        .work
        .quick("queueing the run", move || {
            Ok(s.runs.accept(place, &s.db, &s.workspace, prepared)?)
        })
        .await?;
    Ok((
        StatusCode::ACCEPTED,
        Json(RunAccepted {
            id,
            status: RunStatus::Queued,
        }),
    )
        .into_response())
}

/// `GET /api/runs?limit=N&before=ID`: a page of the history, newest first.
async fn list_runs(
    State(state): State<AppState>,
    Query(query): Query<HashMap<String, String>>,
) -> ApiResult<Json<RunList>> {
    if let Some(k) = query
        .keys()
        .find(|k| !matches!(k.as_str(), "limit" | "before" | "token"))
    {
        return Err(AppError::bad(format!(
            "unknown parameter '{}' (known: limit, before)",
            k.chars().take(100).collect::<String>()
        )));
    }
    let limit = match query.get("limit") {
        None => DEFAULT_PAGE,
        Some(v) => match v.parse::<usize>() {
            Ok(n) if (1..=MAX_PAGE).contains(&n) => n,
            _ => {
                return Err(AppError::bad(format!(
                    "'limit' must be an integer from 1 to {MAX_PAGE}"
                )))
            }
        },
    };
    let before = query.get("before").cloned();
    if let Some(b) = &before {
        if !valid_run_id(b) {
            return Err(AppError::bad("'before' must be a run id (a page's 'next')"));
        }
    }
    let s = state.clone();
    let page = state
        .work
        .quick("listing the runs", move || {
            Ok(s.db.page(limit, before.as_deref())?)
        })
        .await?;
    page.map(Json)
        .ok_or_else(|| AppError::bad("'before' names no run"))
}

/// A run's record, read on a blocking thread.
async fn run_record(state: &AppState, id: &str) -> ApiResult<sluice_api::RunRecord> {
    check_id(id)?;
    let s = state.clone();
    let i = id.to_string();
    state
        .work
        .quick("reading the run", move || Ok(s.db.get(&i)?))
        .await?
        .ok_or_else(|| no_run(id))
}

async fn get_run(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult<Json<sluice_api::RunRecord>> {
    run_record(&state, &id).await.map(Json)
}

/// Bytes read from an output file per chunk of the response.
const CHUNK: usize = 64 << 10;

/// `GET /api/runs/{id}/outputs/{name}`: an output of a succeeded run, by its name or its
/// file name as the run's record lists them (never a path from the request), streamed.
async fn get_output(
    State(state): State<AppState>,
    Path((id, name)): Path<(String, String)>,
) -> ApiResult<Response> {
    let row = run_record(&state, &id).await?;
    if row.status != RunStatus::Succeeded {
        return Err(AppError::conflict(format!(
            "run '{id}' is {}; it has no outputs",
            row.status
        )));
    }
    let missing = || {
        AppError::not_found(format!(
            "run '{id}' has no output '{}'",
            name.chars().take(100).collect::<String>()
        ))
    };
    let file = row
        .outputs
        .unwrap_or_default()
        .into_iter()
        .find(|o| o.name == name || o.file == name)
        .map(|o| o.file)
        .ok_or_else(missing)?;
    let s = state.clone();
    let (i, f) = (id.clone(), file.clone());
    let (handle, len) = state
        .work
        .quick("opening the output", move || {
            Ok(s.workspace.open_output(&i, &f)?)
        })
        .await?
        .ok_or_else(missing)?;
    let chunks = futures_util::stream::unfold(Some(handle), |handle| async move {
        let mut handle = handle?;
        let read = tokio::task::spawn_blocking(move || {
            let mut buf = vec![0; CHUNK];
            let n = handle.read(&mut buf)?;
            buf.truncate(n);
            Ok::<_, std::io::Error>((buf, handle))
        })
        .await
        .map_err(std::io::Error::other)
        .and_then(|r| r);
        match read {
            Ok((buf, _)) if buf.is_empty() => None,
            Ok((buf, handle)) => Some((Ok(axum::body::Bytes::from(buf)), Some(handle))),
            Err(e) => Some((Err(e), None)),
        }
    });
    Ok((
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/octet-stream"),
            ),
            (
                header::CONTENT_DISPOSITION,
                HeaderValue::from_str(&format!("attachment; filename=\"{file}.npy\""))
                    .unwrap_or(HeaderValue::from_static("attachment")),
            ),
            (header::CONTENT_LENGTH, HeaderValue::from(len)),
        ],
        Body::from_stream(chunks),
    )
        .into_response())
}

async fn cancel_run(State(state): State<AppState>, Path(id): Path<String>) -> ApiResult<Response> {
    let row = run_record(&state, &id).await?;
    let s = state.clone();
    let i = id.clone();
    let cancelled_queued = row.status == RunStatus::Queued
        && state
            .work
            .quick("cancelling the run", move || Ok(s.db.cancel_queued(&i)?))
            .await?;
    match row.status {
        RunStatus::Queued if cancelled_queued => {
            state.runs.cancel(&id);
            Ok(Json(json!({ "id": id, "status": RunStatus::Cancelled })).into_response())
        }
        RunStatus::Queued | RunStatus::Running => {
            state.runs.cancel(&id);
            Ok((
                StatusCode::ACCEPTED,
                Json(json!({ "id": id, "status": "cancelling" })),
            )
                .into_response())
        }
        s => Err(AppError::conflict(format!(
            "run '{id}' already ended ({s})"
        ))),
    }
}

async fn devices(State(state): State<AppState>) -> ApiResult<Json<DevicesReport>> {
    let last = state
        .runs
        .last
        .lock()
        .map(|l| l.clone())
        .unwrap_or_default();
    let mut workers = vec![WorkerInfo {
        id: "local".into(),
        kind: "in-process".into(),
        name: None,
        adapters: state.adapters.clone(),
        rates: state.runs.local_rates(),
        utilisation: last.utilisation,
        memory: Some(MemoryFigures {
            planned_bytes: last.memory.planned_bytes,
            allocated_bytes: last.memory.allocated_bytes,
        }),
    }];
    workers.extend(state.workers.list().iter().map(|w| w.info()));
    Ok(Json(DevicesReport { workers }))
}

async fn openapi_json() -> Json<Value> {
    Json(openapi::spec())
}

async fn metrics_text(State(state): State<AppState>) -> ApiResult<Response> {
    let s = state.clone();
    let text = state
        .work
        .quick("the metrics", move || Ok(metrics::render(&s)?))
        .await?;
    Ok(([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response())
}

/// `GET /api/runs/{id}/trace`: a finished run's Chrome trace (opens in Perfetto).
async fn get_trace(State(state): State<AppState>, Path(id): Path<String>) -> ApiResult<Response> {
    let row = run_record(&state, &id).await?;
    let place = state.work.large_answer().await?;
    let s = state.clone();
    let i = id.clone();
    let trace = state
        .work
        .heavy("making the trace", move || {
            Ok(s.workspace.read_run_events(&i)?.map(|kept| {
                sluice_engine::telemetry::trace::chrome_trace(&kept.events, &kept.devices)
                    .to_string()
            }))
        })
        .await?
        .ok_or_else(|| {
            AppError::conflict(format!("run '{id}' is {} and has no trace", row.status))
        })?;
    Ok((
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            ),
            (
                header::CONTENT_DISPOSITION,
                HeaderValue::from_str(&format!("attachment; filename=\"run-{id}.trace.json\""))
                    .unwrap_or(HeaderValue::from_static("attachment")),
            ),
        ],
        // The place is given back once the trace is sent (or the client is gone).
        Body::from_stream(futures_util::stream::unfold(
            (Some(trace), place),
            |(trace, place)| async move {
                trace.map(|t| (Ok::<_, std::convert::Infallible>(t), (None, place)))
            },
        )),
    )
        .into_response())
}

type Upgrade = Result<WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>;

/// `WS /api/runs/{id}/events`: a live run's messages, or a finished run's kept events
/// and its summary.
async fn run_events(
    State(state): State<AppState>,
    Path(id): Path<String>,
    ws: Upgrade,
) -> ApiResult<Response> {
    run_record(&state, &id).await?;
    let ws = ws.map_err(|e| {
        AppError::bad(format!(
            "this endpoint is a WebSocket: connect with an Upgrade: websocket request ({e})"
        ))
    })?;
    if let Some(watch) = state.runs.watch(&id) {
        return Ok(ws.on_upgrade(move |socket| forward_live(socket, watch)));
    }
    // A finished run: replay what it kept, so a late watcher still sees its charts.
    let place = state.work.large_answer().await?;
    let s = state.clone();
    let messages = state
        .work
        .quick("reading the run's events", move || {
            let kept = s.workspace.read_run_events(&id).unwrap_or_else(|e| {
                tracing::warn!("run {id}: its events cannot be replayed: {e:#}");
                None
            });
            let run = s.db.get(&id)?.map(Box::new);
            let summary = serde_json::to_string(&LiveMessage::Summary { run }).unwrap_or_default();
            Ok((kept.map(|k| k.events).unwrap_or_default(), summary))
        })
        .await?;
    Ok(ws.on_upgrade(move |socket| {
        let (events, summary) = messages;
        let texts = events
            .into_iter()
            .filter_map(|event| serde_json::to_string(&LiveMessage::Event { event }).ok())
            .chain(std::iter::once(summary));
        async move {
            forward_finished(socket, texts).await;
            drop(place);
        }
    }))
}

/// `WS /api/workers`: where `sluice worker` processes join (the token is checked by the
/// middleware like every route's; the upgrade is the workers module's, which meters what
/// a worker may send).
async fn worker_socket(State(state): State<AppState>, req: axum::extract::Request) -> Response {
    super::workers::upgrade(req, state.workers.clone())
}
