//! Reading request bodies: at most `--body-limit` bytes (a larger `Content-Length` is
//! refused before reading), within `--body-timeout` (a client that sends slower is
//! answered 408 and its connection closed), and within a budget of bytes held by all
//! requests at once (`--body-budget`), so many large bodies in flight cannot exhaust
//! memory: a request waits at most `--body-timeout` for room, then gets 503.

use super::error::{ApiResult, AppError};
use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap, StatusCode};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The body reader's settings and budget.
pub struct Bodies {
    limit: usize,
    timeout: Duration,
    /// Permits are bytes.
    budget: Arc<Semaphore>,
}

/// A body read in full, holding its share of the budget until dropped.
pub struct Received {
    /// The bytes.
    pub bytes: Bytes,
    _share: OwnedSemaphorePermit,
}

impl Bodies {
    /// Bodies of at most `limit` bytes, read within `timeout`, at most `budget` bytes held
    /// at once (at least `limit`; both at most `u32::MAX`, which `serve` checks).
    pub fn new(limit: usize, timeout: Duration, budget: usize) -> Bodies {
        Bodies {
            limit,
            timeout,
            budget: Arc::new(Semaphore::new(budget.max(limit))),
        }
    }

    fn too_large(&self) -> AppError {
        AppError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "the request body is larger than the limit of {} bytes (--body-limit)",
                self.limit
            ),
        )
        .closing()
    }

    /// Reads a request's body.
    pub async fn read(&self, headers: &HeaderMap, body: Body) -> ApiResult<Received> {
        let declared = match headers.get(header::CONTENT_LENGTH) {
            None => None,
            Some(v) => match v.to_str().ok().and_then(|s| s.trim().parse::<u64>().ok()) {
                Some(n) => Some(n),
                None => {
                    return Err(AppError::bad("the Content-Length header is not a number").closing())
                }
            },
        };
        let share = match declared {
            Some(n) if n > u64::try_from(self.limit).unwrap_or(u64::MAX) => {
                return Err(self.too_large())
            }
            // At most the limit, which fits in u32 (checked at startup).
            Some(n) => u32::try_from(n).unwrap_or(u32::MAX),
            None => u32::try_from(self.limit).unwrap_or(u32::MAX),
        };
        let share =
            tokio::time::timeout(self.timeout, self.budget.clone().acquire_many_owned(share))
                .await
                .ok()
                .and_then(Result::ok)
                .ok_or_else(|| {
                    AppError::busy(
                        "the server is receiving too many large requests; try again shortly",
                    )
                    .closing()
                })?;
        match tokio::time::timeout(self.timeout, axum::body::to_bytes(body, self.limit)).await {
            Err(_) => Err(AppError::new(
                StatusCode::REQUEST_TIMEOUT,
                format!(
                    "the request body did not arrive within {} s (--body-timeout)",
                    self.timeout.as_secs()
                ),
            )
            .closing()),
            Ok(Err(e)) if is_length_limit(&e) => Err(self.too_large()),
            Ok(Err(_)) => Err(AppError::bad("the request body could not be read").closing()),
            Ok(Ok(bytes)) => Ok(Received {
                bytes,
                _share: share,
            }),
        }
    }
}

/// Whether reading stopped at the length limit.
fn is_length_limit(e: &axum::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = source {
        if err.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        source = err.source();
    }
    false
}
