//! Costly request work, bounded. CPU-heavy work — decoding, analysing, validating and
//! checking graphs, preparing runs, making traces — runs on blocking threads, at most
//! `--analysis-threads` at once; a request waits at most `--body-timeout` for a turn (then
//! 503), and a panic in the work is an error response, never a dead handler or a stored
//! half-result. Quick blocking work (the database, small files) runs on blocking threads
//! without a turn. Large answers held in memory while a client reads them (a finished
//! run's replayed events, a trace) take one of [`LARGE_ANSWERS`] places until sent, so
//! slow readers cannot pile them up.

use super::error::{ApiResult, AppError};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Large answers being sent at once.
pub const LARGE_ANSWERS: usize = 8;

/// The turns of CPU-heavy work and the places of large answers.
pub struct Work {
    turns: Arc<Semaphore>,
    answers: Arc<Semaphore>,
    wait: Duration,
}

/// Runs blocking work, turning a panic into a 500 (the panic is logged).
async fn blocking<T: Send + 'static>(
    what: &'static str,
    f: impl FnOnce() -> ApiResult<T> + Send + 'static,
) -> ApiResult<T> {
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r,
        Err(e) => {
            tracing::error!("{what} failed: {e}");
            Err(AppError::new(
                axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                format!("{what} failed unexpectedly (a bug; the detail is in the server's log); nothing was stored"),
            ))
        }
    }
}

impl Work {
    /// At most `threads` pieces of heavy work at once, each request waiting at most
    /// `wait` for a turn.
    pub fn new(threads: usize, wait: Duration) -> Work {
        Work {
            turns: Arc::new(Semaphore::new(threads.max(1))),
            answers: Arc::new(Semaphore::new(LARGE_ANSWERS)),
            wait,
        }
    }

    /// Runs CPU-heavy work when a turn is free.
    pub async fn heavy<T: Send + 'static>(
        &self,
        what: &'static str,
        f: impl FnOnce() -> ApiResult<T> + Send + 'static,
    ) -> ApiResult<T> {
        let turn = tokio::time::timeout(self.wait, self.turns.clone().acquire_owned())
            .await
            .ok()
            .and_then(Result::ok)
            .ok_or_else(|| {
                AppError::busy("the server is busy checking other requests; try again shortly")
            })?;
        blocking(what, move || {
            let _turn = turn;
            f()
        })
        .await
    }

    /// A place for a large answer, held until it is sent (dropped).
    pub async fn large_answer(&self) -> ApiResult<OwnedSemaphorePermit> {
        tokio::time::timeout(self.wait, self.answers.clone().acquire_owned())
            .await
            .ok()
            .and_then(Result::ok)
            .ok_or_else(|| {
                AppError::busy("the server is sending other large answers; try again shortly")
            })
    }

    /// Runs quick blocking work (database, small files).
    pub async fn quick<T: Send + 'static>(
        &self,
        what: &'static str,
        f: impl FnOnce() -> ApiResult<T> + Send + 'static,
    ) -> ApiResult<T> {
        blocking(what, f).await
    }
}
