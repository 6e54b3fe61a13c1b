//! The HTTP and WebSocket API: small handlers over one [`AppState`], request and response
//! bodies typed by the `sluice-api` crate, every error a JSON [`ErrorBody`] with the right
//! status, the token checked in one middleware.

use super::runs::{check_runnable, decode_inputs, Enqueued};
use super::state::AppState;
use super::{metrics, openapi, page};
use axum::body::{Body, Bytes};
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use sluice_api::{
    valid_name, DevicesReport, ErrorBody, GraphList, GraphRef, GraphSaved, LiveMessage,
    MemoryFigures, RunAccepted, RunList, RunRequest, RunStatus, WorkerInfo,
};
use sluice_engine::Problem;
use tower_http::services::{ServeDir, ServeFile};
use tower_http::set_header::SetResponseHeaderLayer;

/// An error response: a status and a sentence, as JSON.
#[derive(Debug)]
pub struct AppError {
    status: StatusCode,
    message: String,
    problems: Option<Vec<Problem>>,
}

impl AppError {
    /// An error with a status and message.
    pub fn new(status: StatusCode, message: impl Into<String>) -> AppError {
        AppError {
            status,
            message: message.into(),
            problems: None,
        }
    }
}

impl From<anyhow::Error> for AppError {
    fn from(e: anyhow::Error) -> AppError {
        tracing::error!("internal error: {e:#}");
        AppError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("internal error: {e:#}"),
        )
    }
}

impl IntoResponse for AppError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: self.message,
            status: self.status.as_u16(),
            problems: self.problems,
        };
        (self.status, Json(body)).into_response()
    }
}

type ApiResult<T> = Result<T, AppError>;

fn bad(message: impl Into<String>) -> AppError {
    AppError::new(StatusCode::BAD_REQUEST, message)
}

fn not_found(message: impl Into<String>) -> AppError {
    AppError::new(StatusCode::NOT_FOUND, message)
}

/// Reads a request body up to the limit.
async fn read_body(state: &AppState, body: Body) -> ApiResult<Bytes> {
    axum::body::to_bytes(body, state.body_limit)
        .await
        .map_err(|_| {
            AppError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!(
                    "the request body is larger than the limit of {} bytes",
                    state.body_limit
                ),
            )
        })
}

/// Parses a JSON body, naming the line and column of a syntax error.
fn parse_json(bytes: &[u8]) -> ApiResult<Value> {
    serde_json::from_slice(bytes).map_err(|e| {
        bad(format!(
            "malformed JSON at line {}, column {}: {e}",
            e.line(),
            e.column()
        ))
    })
}

fn check_name(name: &str) -> ApiResult<()> {
    if valid_name(name) {
        Ok(())
    } else {
        Err(bad(format!(
            "'{name}' is not a valid name: use 1-64 of A-Z a-z 0-9 _ -"
        )))
    }
}

/// Checks the bearer token: the `Authorization` header, or a `token` query parameter
/// (browsers cannot set headers on WebSockets or plain download links).
async fn require_token(State(state): State<AppState>, req: Request, next: Next) -> Response {
    if let Some(token) = &state.token {
        let from_query =
            axum::extract::Query::<std::collections::HashMap<String, String>>::try_from_uri(
                req.uri(),
            )
            .ok()
            .and_then(|q| q.0.get("token").map(|t| format!("Bearer {t}")));
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .map(String::from)
            .or(from_query);
        let expected = format!("Bearer {token}");
        match given.as_deref() {
            None => {
                return AppError::new(
                    StatusCode::UNAUTHORIZED,
                    "missing 'Authorization: Bearer <token>'",
                )
                .into_response()
            }
            Some(g) if g != expected => {
                return AppError::new(StatusCode::UNAUTHORIZED, "wrong token").into_response()
            }
            Some(_) => {}
        }
    }
    next.run(req).await
}

/// The router with every route: the API behind the token check, and the editor's files
/// (or, without a bundle, a plain page) open to all, since they hold no data.
pub fn router(state: AppState) -> Router {
    let api = Router::new()
        .route("/api/ops", get(ops))
        .route("/api/graphs", get(list_graphs))
        .route(
            "/api/graphs/{name}",
            get(get_graph).put(put_graph).delete(delete_graph),
        )
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
        .route("/api/{*rest}", any(|| async { not_found("no such route") }))
        .route("/metrics", get(metrics_text))
        .layer(middleware::from_fn_with_state(state.clone(), require_token));
    let site = match &state.editor {
        Some(dir) => editor_files(dir),
        None => Router::new()
            .route("/", get(index))
            .fallback(|| async { not_found("no such route") }),
    };
    api.merge(site)
        .layer(axum::extract::DefaultBodyLimit::disable())
        .with_state(state)
}

/// The editor bundle's files; paths that name no file get `index.html` (the app routes
/// itself). Browsers revalidate every file, so a rebuilt bundle is picked up at once.
fn editor_files(dir: &std::path::Path) -> Router<AppState> {
    let files = ServeDir::new(dir).fallback(ServeFile::new(dir.join("index.html")));
    Router::new()
        .fallback_service(files)
        .layer(SetResponseHeaderLayer::overriding(
            header::CACHE_CONTROL,
            HeaderValue::from_static("no-cache"),
        ))
}

async fn index(State(state): State<AppState>) -> ApiResult<Response> {
    let graphs = state.workspace.list_graphs()?;
    let runs = state.db.list()?;
    Ok((
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        page::render(&graphs, &runs),
    )
        .into_response())
}

async fn ops() -> Json<Value> {
    Json(json!({ "ops": sluice_engine::ops::schemas() }))
}

async fn list_graphs(State(state): State<AppState>) -> ApiResult<Json<GraphList>> {
    Ok(Json(GraphList {
        graphs: state.workspace.list_graphs()?,
    }))
}

async fn get_graph(State(state): State<AppState>, Path(name): Path<String>) -> ApiResult<Response> {
    check_name(&name)?;
    match state.workspace.read_graph(&name)? {
        Some(text) => Ok(([(header::CONTENT_TYPE, "application/json")], text).into_response()),
        None => Err(not_found(format!("no graph named '{name}'"))),
    }
}

/// Stores the graph file as sent (a draft may still have problems, which are reported).
async fn put_graph(
    State(state): State<AppState>,
    Path(name): Path<String>,
    body: Body,
) -> ApiResult<Response> {
    check_name(&name)?;
    let bytes = read_body(&state, body).await?;
    let value = parse_json(&bytes)?;
    if !value.is_object() {
        return Err(bad("a graph file must be a JSON object"));
    }
    let existed = state.workspace.read_graph(&name)?.is_some();
    state.workspace.write_graph(&name, &bytes)?;
    let problems = match sluice_engine::load_graph(&String::from_utf8_lossy(&bytes)) {
        Ok(_) => Vec::new(),
        Err(p) => p.0,
    };
    let status = if existed {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    Ok((
        status,
        Json(GraphSaved {
            saved: name,
            valid: problems.is_empty(),
            problems,
        }),
    )
        .into_response())
}

async fn delete_graph(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> ApiResult<Response> {
    check_name(&name)?;
    if state.workspace.delete_graph(&name)? {
        Ok(StatusCode::NO_CONTENT.into_response())
    } else {
        Err(not_found(format!("no graph named '{name}'")))
    }
}

async fn validate(State(state): State<AppState>, body: Body) -> ApiResult<Response> {
    let bytes = read_body(&state, body).await?;
    parse_json(&bytes)?;
    match sluice_engine::load_graph(&String::from_utf8_lossy(&bytes)) {
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
            Ok(
                Json(json!({ "valid": true, "nodes": nodes, "couplings": couplings }))
                    .into_response(),
            )
        }
        Err(p) => Ok((
            StatusCode::UNPROCESSABLE_ENTITY,
            Json(json!({ "valid": false, "problems": p.0 })),
        )
            .into_response()),
    }
}

async fn create_run(State(state): State<AppState>, body: Body) -> ApiResult<Response> {
    let bytes = read_body(&state, body).await?;
    let value = parse_json(&bytes)?;
    let req = RunRequest::parse(&value)
        .map_err(|m| AppError::new(StatusCode::UNPROCESSABLE_ENTITY, m))?;
    decode_inputs(&req).map_err(|m| AppError::new(StatusCode::UNPROCESSABLE_ENTITY, m))?;
    let (label, text) = match &req.graph {
        GraphRef::Stored(name) => match state.workspace.read_graph(name)? {
            Some(t) => (name.clone(), t),
            None => return Err(not_found(format!("no graph named '{name}'"))),
        },
        GraphRef::Inline(doc) => ("inline".to_string(), doc.to_string()),
    };
    let graph = sluice_engine::load_graph(&text).map_err(|p| AppError {
        status: StatusCode::UNPROCESSABLE_ENTITY,
        message: format!("the graph has {} problem(s)", p.0.len()),
        problems: Some(p.0),
    })?;
    check_runnable(&graph, req.batch)
        .map_err(|m| AppError::new(StatusCode::UNPROCESSABLE_ENTITY, m))?;
    // Configurations that would change the answer are refused now, not after queueing.
    sluice_engine::exec::config::check_batching(&graph.batch_semantics(), &req.config(), None)
        .map_err(|e| AppError::new(StatusCode::UNPROCESSABLE_ENTITY, e.to_string()))?;
    match state.runs.enqueue(&state.db, &label, &value)? {
        Enqueued::Accepted(id) => Ok((
            StatusCode::ACCEPTED,
            Json(RunAccepted {
                id,
                status: RunStatus::Queued,
            }),
        )
            .into_response()),
        Enqueued::Full => Err(AppError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "the run queue is full; try again later",
        )),
    }
}

async fn list_runs(State(state): State<AppState>) -> ApiResult<Json<RunList>> {
    Ok(Json(RunList {
        runs: state.db.list()?,
    }))
}

fn check_id(id: &str) -> ApiResult<()> {
    if id.len() == 16 && id.chars().all(|c| c.is_ascii_hexdigit()) {
        Ok(())
    } else {
        Err(not_found(format!("no run with id '{id}'")))
    }
}

async fn get_run(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult<Json<sluice_api::RunRecord>> {
    check_id(&id)?;
    match state.db.get(&id)? {
        Some(r) => Ok(Json(r)),
        None => Err(not_found(format!("no run with id '{id}'"))),
    }
}

async fn get_output(
    State(state): State<AppState>,
    Path((id, name)): Path<(String, String)>,
) -> ApiResult<Response> {
    check_id(&id)?;
    let file = name.replace(':', "_");
    check_name(&file)?;
    let row = state
        .db
        .get(&id)?
        .ok_or_else(|| not_found(format!("no run with id '{id}'")))?;
    if row.status != RunStatus::Succeeded {
        return Err(AppError::new(
            StatusCode::CONFLICT,
            format!("run '{id}' is {}; it has no outputs", row.status),
        ));
    }
    let path = state.workspace.run_dir(&id).join(format!("{file}.npy"));
    match std::fs::read(&path) {
        Ok(bytes) => Ok((
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
            ],
            bytes,
        )
            .into_response()),
        Err(_) => Err(not_found(format!("run '{id}' has no output '{name}'"))),
    }
}

async fn cancel_run(State(state): State<AppState>, Path(id): Path<String>) -> ApiResult<Response> {
    check_id(&id)?;
    let row = state
        .db
        .get(&id)?
        .ok_or_else(|| not_found(format!("no run with id '{id}'")))?;
    match row.status {
        RunStatus::Queued if state.db.cancel_queued(&id)? => {
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
        s => Err(AppError::new(
            StatusCode::CONFLICT,
            format!("run '{id}' already ended ({s})"),
        )),
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
    let text = metrics::render(&state)?;
    Ok(([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response())
}

/// `GET /api/runs/{id}/trace`: a finished run's Chrome trace (opens in Perfetto).
async fn get_trace(State(state): State<AppState>, Path(id): Path<String>) -> ApiResult<Response> {
    check_id(&id)?;
    let row = state
        .db
        .get(&id)?
        .ok_or_else(|| not_found(format!("no run with id '{id}'")))?;
    let Some(kept) = state.workspace.read_run_events(&id)? else {
        return Err(AppError::new(
            StatusCode::CONFLICT,
            format!("run '{id}' is {} and has no trace", row.status),
        ));
    };
    let trace = sluice_engine::telemetry::trace::chrome_trace(&kept.events, &kept.devices);
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
        trace.to_string(),
    )
        .into_response())
}

async fn run_events(
    State(state): State<AppState>,
    Path(id): Path<String>,
    ws: Result<WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
) -> ApiResult<Response> {
    check_id(&id)?;
    if state.db.get(&id)?.is_none() {
        return Err(not_found(format!("no run with id '{id}'")));
    }
    let ws = ws.map_err(|e| {
        bad(format!(
            "this endpoint is a WebSocket: connect with an Upgrade: websocket request ({e})"
        ))
    })?;
    let watch = state.runs.watch(&id);
    Ok(ws.on_upgrade(move |socket| forward_events(socket, state, id, watch)))
}

/// Forwards a run's events, then its summary: a live run's messages so far and then as
/// they come, a finished run's kept events. Whatever the client sends is read and
/// ignored, so garbage frames cannot stop the server.
async fn forward_events(
    mut socket: WebSocket,
    state: AppState,
    id: String,
    watch: Option<(Vec<String>, tokio::sync::broadcast::Receiver<String>)>,
) {
    let summary = || {
        let run = state.db.get(&id).ok().flatten().map(Box::new);
        serde_json::to_string(&LiveMessage::Summary { run }).unwrap_or_default()
    };
    let Some((backlog, mut rx)) = watch else {
        // A finished run: replay what it kept, so a late watcher still sees its charts.
        if let Ok(Some(kept)) = state.workspace.read_run_events(&id) {
            for event in kept.events {
                let text = serde_json::to_string(&LiveMessage::Event { event }).unwrap_or_default();
                if socket.send(Message::Text(text.into())).await.is_err() {
                    return;
                }
            }
        }
        let _ = socket.send(Message::Text(summary().into())).await;
        let _ = socket.send(Message::Close(None)).await;
        return;
    };
    for text in backlog {
        if socket.send(Message::Text(text.into())).await.is_err() {
            return;
        }
    }
    loop {
        tokio::select! {
            msg = rx.recv() => match msg {
                Ok(text) => {
                    let done = matches!(
                        serde_json::from_str::<LiveMessage>(&text),
                        Ok(LiveMessage::Summary { .. })
                    );
                    if socket.send(Message::Text(text.into())).await.is_err() {
                        return;
                    }
                    if done {
                        break;
                    }
                }
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                Err(tokio::sync::broadcast::error::RecvError::Closed) => {
                    let _ = socket.send(Message::Text(summary().into())).await;
                    break;
                }
            },
            incoming = socket.recv() => match incoming {
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => return,
                Some(Ok(_)) => continue,
            },
        }
    }
    let _ = socket.send(Message::Close(None)).await;
}

/// `WS /api/workers`: where `sluice worker` processes join (the token is checked by the
/// middleware like every route's; the upgrade is the workers module's, which meters what
/// a worker may send).
async fn worker_socket(State(state): State<AppState>, req: axum::extract::Request) -> Response {
    super::workers::upgrade(req, state.workers.clone())
}
