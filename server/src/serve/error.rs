//! Error responses: a status and a sentence as a JSON [`ErrorBody`], never a server path
//! (internal failures are logged in full and answered with a sentence); the framework's
//! own refusals (a malformed path or query, a wrong method) are made JSON too.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use sluice_api::ErrorBody;
use sluice_engine::Problem;

/// An error response.
#[derive(Debug)]
pub struct AppError {
    status: StatusCode,
    message: String,
    problems: Option<Vec<Problem>>,
    close: bool,
}

/// A handler's result.
pub type ApiResult<T> = Result<T, AppError>;

impl AppError {
    /// An error with a status and a sentence.
    pub fn new(status: StatusCode, message: impl Into<String>) -> AppError {
        AppError {
            status,
            message: message.into(),
            problems: None,
            close: false,
        }
    }

    /// A graph's problems (422), with a sentence counting them.
    pub fn problems(problems: Vec<Problem>) -> AppError {
        let mut e = AppError::unprocessable(format!("the graph has {} problem(s)", problems.len()));
        e.problems = Some(problems);
        e
    }

    /// Asks the client to close the connection after this answer (its request body was
    /// not read).
    pub fn closing(mut self) -> AppError {
        self.close = true;
        self
    }

    /// 400.
    pub fn bad(message: impl Into<String>) -> AppError {
        AppError::new(StatusCode::BAD_REQUEST, message)
    }

    /// 404.
    pub fn not_found(message: impl Into<String>) -> AppError {
        AppError::new(StatusCode::NOT_FOUND, message)
    }

    /// 409.
    pub fn conflict(message: impl Into<String>) -> AppError {
        AppError::new(StatusCode::CONFLICT, message)
    }

    /// 422: a request or graph the server understands but refuses (a limit, a problem).
    pub fn unprocessable(message: impl Into<String>) -> AppError {
        AppError::new(StatusCode::UNPROCESSABLE_ENTITY, message)
    }

    /// 503: the server cannot take this now; try again.
    pub fn busy(message: impl Into<String>) -> AppError {
        AppError::new(StatusCode::SERVICE_UNAVAILABLE, message)
    }

    /// 500 for a failure whose detail (which may name server paths) is only logged.
    pub fn internal(what: &str, detail: &anyhow::Error) -> AppError {
        tracing::error!("{what}: {detail:#}");
        AppError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("{what} failed on the server (the detail is in its log)"),
        )
    }
}

impl From<anyhow::Error> for AppError {
    fn from(e: anyhow::Error) -> AppError {
        AppError::internal("the request", &e)
    }
}

impl IntoResponse for AppError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: self.message,
            status: self.status.as_u16(),
            problems: self.problems,
        };
        let mut response = (self.status, Json(body)).into_response();
        if self.close {
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        response
    }
}

/// Longest framework error text kept when it is made JSON.
const MAX_REFUSAL: usize = 1024;

/// Makes an error answer that is not JSON (axum's refusal of a malformed path segment or
/// query, a wrong method) a JSON [`ErrorBody`] with the same status.
pub async fn json_errors(response: Response) -> Response {
    let status = response.status();
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.starts_with("application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return response;
    }
    let (parts, body) = response.into_parts();
    let text = axum::body::to_bytes(body, MAX_REFUSAL)
        .await
        .map(|b| String::from_utf8_lossy(&b).trim().to_string())
        .unwrap_or_default();
    let message = if text.is_empty() {
        status
            .canonical_reason()
            .unwrap_or("the request was refused")
            .to_string()
    } else {
        text
    };
    let mut json = AppError::new(status, message).into_response();
    for (name, value) in parts.headers.iter() {
        if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH {
            json.headers_mut().insert(name.clone(), value.clone());
        }
    }
    json
}
