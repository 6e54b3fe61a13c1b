//! A live run's messages and the WebSockets that watch runs. Each message is serialised
//! once and shared by every watcher (`Arc<str>`); a live run keeps its messages for late
//! watchers up to a byte budget (`--event-backlog`), later ones are only broadcast (the
//! finished run's events file has them all). A watcher that falls behind the broadcast is
//! dropped with a close message saying so, never buffered without bound; one that stops
//! reading is dropped by the connection's stall timeout.

use axum::extract::ws::{close_code, CloseFrame, Message, WebSocket};
use sluice_api::LiveMessage;
use std::sync::{Arc, Mutex};
use tokio::sync::broadcast;

/// Messages a watcher may be behind the newest before it is dropped.
const WATCHER_LAG: usize = 4096;

/// A live run's messages: broadcast to watchers and kept, so one who joins mid-run gets
/// everything kept so far, then the rest, with no gap and nothing twice.
pub struct EventLog {
    backlog: Mutex<Backlog>,
    tx: broadcast::Sender<Arc<str>>,
    budget: usize,
}

#[derive(Default)]
struct Backlog {
    messages: Vec<Arc<str>>,
    bytes: usize,
    full: bool,
}

/// What a watcher of a live run gets: the kept messages, whether some were not kept,
/// and a receiver of what comes next.
pub struct Watch {
    backlog: Vec<Arc<str>>,
    missed: bool,
    rx: broadcast::Receiver<Arc<str>>,
}

impl EventLog {
    /// A log keeping at most `budget` bytes of messages for late watchers.
    pub fn new(budget: usize) -> EventLog {
        EventLog {
            backlog: Mutex::new(Backlog::default()),
            tx: broadcast::channel(WATCHER_LAG).0,
            budget,
        }
    }

    /// Sends a message to every watcher and keeps it for later ones while the budget
    /// lasts. A summary (the last message) is always kept.
    pub fn send(&self, message: &LiveMessage) {
        let Ok(text) = serde_json::to_string(message) else {
            return;
        };
        let text: Arc<str> = text.into();
        let Ok(mut backlog) = self.backlog.lock() else {
            return;
        };
        let last = matches!(message, LiveMessage::Summary { .. });
        match backlog.bytes.checked_add(text.len()) {
            Some(total) if last || (!backlog.full && total <= self.budget) => {
                backlog.bytes = total;
                backlog.messages.push(text.clone());
            }
            _ => backlog.full = true,
        }
        let _ = self.tx.send(text);
    }

    /// Everything kept so far, and a receiver of what comes next.
    pub fn watch(&self) -> Watch {
        // Copying and subscribing under the lock `send` takes: no message falls between.
        match self.backlog.lock() {
            Ok(b) => Watch {
                backlog: b.messages.clone(),
                missed: b.full,
                rx: self.tx.subscribe(),
            },
            Err(_) => Watch {
                backlog: Vec::new(),
                missed: true,
                rx: self.tx.subscribe(),
            },
        }
    }
}

async fn send(socket: &mut WebSocket, text: &str) -> bool {
    socket.send(Message::Text(text.into())).await.is_ok()
}

async fn close(socket: &mut WebSocket, code: u16, reason: &'static str) {
    let _ = socket
        .send(Message::Close(Some(CloseFrame {
            code,
            reason: reason.into(),
        })))
        .await;
}

fn is_summary(text: &str) -> bool {
    matches!(
        serde_json::from_str::<LiveMessage>(text),
        Ok(LiveMessage::Summary { .. })
    )
}

/// Forwards a live run's messages: those kept, then the rest as they come, until its
/// summary. Whatever the client sends is read and ignored, so garbage frames cannot stop
/// the server.
pub async fn forward_live(mut socket: WebSocket, watch: Watch) {
    let Watch {
        backlog,
        missed,
        mut rx,
    } = watch;
    for text in &backlog {
        if !send(&mut socket, text).await {
            return;
        }
        if is_summary(text) {
            close(&mut socket, close_code::NORMAL, "").await;
            return;
        }
    }
    if missed {
        tracing::debug!("a late watcher missed messages over the backlog budget");
    }
    loop {
        tokio::select! {
            msg = rx.recv() => match msg {
                Ok(text) => {
                    if !send(&mut socket, &text).await {
                        return;
                    }
                    if is_summary(&text) {
                        break;
                    }
                }
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    close(
                        &mut socket,
                        close_code::AGAIN,
                        "this watcher fell behind the run's events; reconnect to catch up",
                    )
                    .await;
                    return;
                }
                Err(broadcast::error::RecvError::Closed) => break,
            },
            incoming = socket.recv() => match incoming {
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => return,
                Some(Ok(_)) => continue,
            },
        }
    }
    close(&mut socket, close_code::NORMAL, "").await;
}

/// Sends a finished run's messages (its kept events, then its summary) and closes.
pub async fn forward_finished(mut socket: WebSocket, messages: impl Iterator<Item = String>) {
    for text in messages {
        if !send(&mut socket, &text).await {
            return;
        }
    }
    close(&mut socket, close_code::NORMAL, "").await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary() -> LiveMessage {
        LiveMessage::Summary { run: None }
    }

    fn metrics() -> LiveMessage {
        LiveMessage::Event {
            event: sluice_engine::telemetry::Event {
                run: "r".into(),
                device: 0,
                stage: 0,
                micro_batch: 0,
                node: "n".into(),
                kind: sluice_engine::telemetry::EventKind::Compute,
                start_ns: 0,
                end_ns: 1,
                warm_up: false,
            },
        }
    }

    #[test]
    fn the_backlog_is_bounded_in_bytes_and_always_ends_with_the_summary() {
        let one = serde_json::to_string(&metrics()).unwrap().len();
        let log = EventLog::new(3 * one);
        for _ in 0..10 {
            log.send(&metrics());
        }
        log.send(&summary());
        let w = log.watch();
        assert_eq!(
            w.backlog.len(),
            4,
            "three messages within budget, then the summary"
        );
        assert!(w.missed);
        assert!(is_summary(w.backlog.last().unwrap()));
    }

    #[test]
    fn watchers_share_each_message() {
        let log = EventLog::new(1 << 20);
        log.send(&metrics());
        let (a, b) = (log.watch(), log.watch());
        assert!(Arc::ptr_eq(&a.backlog[0], &b.backlog[0]));
        assert!(!a.missed);
    }
}
