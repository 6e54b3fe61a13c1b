//! Run history in SQLite (`sluice.db`, bundled SQLite): parameters, status, metrics,
//! outputs, error and timestamps of every run. Schema changes are numbered migrations
//! recorded in `PRAGMA user_version`.

use anyhow::{Context, Result};
use rusqlite::{params, Connection, OptionalExtension};
use serde::Serialize;
use std::path::Path;
use std::sync::Mutex;

/// Schema migrations, applied in order; the database records how many ran.
const MIGRATIONS: &[&str] = &["CREATE TABLE runs (
        id TEXT PRIMARY KEY,
        graph TEXT NOT NULL,
        params TEXT NOT NULL,
        status TEXT NOT NULL,
        metrics TEXT,
        outputs TEXT,
        error TEXT,
        created_ms INTEGER NOT NULL,
        started_ms INTEGER,
        finished_ms INTEGER
    );
    CREATE INDEX runs_created ON runs(created_ms);"];

/// A stored run.
#[derive(Debug, Clone, Serialize)]
pub struct RunRow {
    /// Run id.
    pub id: String,
    /// Graph name (or `inline`).
    pub graph: String,
    /// The request's parameters.
    pub params: serde_json::Value,
    /// queued, running, succeeded, failed or cancelled.
    pub status: String,
    /// Metrics of a finished run.
    pub metrics: Option<serde_json::Value>,
    /// Output summaries of a finished run.
    pub outputs: Option<serde_json::Value>,
    /// Why it failed.
    pub error: Option<String>,
    /// Milliseconds since the Unix epoch.
    pub created_ms: i64,
    /// When it started running.
    pub started_ms: Option<i64>,
    /// When it finished.
    pub finished_ms: Option<i64>,
}

/// The database.
pub struct Db {
    conn: Mutex<Connection>,
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

fn json_col(s: Option<String>) -> Option<serde_json::Value> {
    s.and_then(|t| serde_json::from_str(&t).ok())
}

impl Db {
    /// Opens the database, applies pending migrations, and fails runs a previous server
    /// left queued or running (they did not finish; the reason is stored).
    pub fn open(path: &Path) -> Result<Db> {
        let conn =
            Connection::open(path).with_context(|| format!("cannot open {}", path.display()))?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
        for (i, m) in MIGRATIONS.iter().enumerate().skip(version.max(0) as usize) {
            conn.execute_batch(m)
                .with_context(|| format!("migration {}", i + 1))?;
            conn.execute_batch(&format!("PRAGMA user_version = {}", i + 1))?;
        }
        conn.execute(
            "UPDATE runs SET status = 'failed', error = 'the server stopped before the run finished', finished_ms = ?1
             WHERE status IN ('queued', 'running')",
            params![now_ms()],
        )?;
        Ok(Db {
            conn: Mutex::new(conn),
        })
    }

    fn with<T>(&self, f: impl FnOnce(&Connection) -> rusqlite::Result<T>) -> Result<T> {
        let conn = self
            .conn
            .lock()
            .map_err(|_| anyhow::anyhow!("database lock poisoned"))?;
        Ok(f(&conn)?)
    }

    /// Records a new queued run.
    pub fn insert(&self, id: &str, graph: &str, params: &serde_json::Value) -> Result<()> {
        self.with(|c| {
            c.execute(
                "INSERT INTO runs (id, graph, params, status, created_ms) VALUES (?1, ?2, ?3, 'queued', ?4)",
                params![id, graph, params.to_string(), now_ms()],
            )
            .map(|_| ())
        })
    }

    /// Removes a run that was never accepted.
    pub fn remove(&self, id: &str) -> Result<()> {
        self.with(|c| {
            c.execute("DELETE FROM runs WHERE id = ?1", params![id])
                .map(|_| ())
        })
    }

    /// Marks a queued run running; false if it is no longer queued (cancelled).
    pub fn start(&self, id: &str) -> Result<bool> {
        self.with(|c| {
            c.execute(
                "UPDATE runs SET status = 'running', started_ms = ?2 WHERE id = ?1 AND status = 'queued'",
                params![id, now_ms()],
            )
            .map(|n| n == 1)
        })
    }

    /// Records the end of a run.
    pub fn finish(
        &self,
        id: &str,
        status: &str,
        metrics: Option<&serde_json::Value>,
        outputs: Option<&serde_json::Value>,
        error: Option<&str>,
    ) -> Result<()> {
        self.with(|c| {
            c.execute(
                "UPDATE runs SET status = ?2, metrics = ?3, outputs = ?4, error = ?5, finished_ms = ?6 WHERE id = ?1",
                params![id, status, metrics.map(|m| m.to_string()), outputs.map(|o| o.to_string()), error, now_ms()],
            )
            .map(|_| ())
        })
    }

    /// Cancels a queued run; true if it was queued.
    pub fn cancel_queued(&self, id: &str) -> Result<bool> {
        self.with(|c| {
            c.execute(
                "UPDATE runs SET status = 'cancelled', finished_ms = ?2, error = 'cancelled before it started' WHERE id = ?1 AND status = 'queued'",
                params![id, now_ms()],
            )
            .map(|n| n == 1)
        })
    }

    fn row(r: &rusqlite::Row) -> rusqlite::Result<RunRow> {
        Ok(RunRow {
            id: r.get(0)?,
            graph: r.get(1)?,
            params: json_col(r.get(2)?).unwrap_or(serde_json::Value::Null),
            status: r.get(3)?,
            metrics: json_col(r.get(4)?),
            outputs: json_col(r.get(5)?),
            error: r.get(6)?,
            created_ms: r.get(7)?,
            started_ms: r.get(8)?,
            finished_ms: r.get(9)?,
        })
    }

    /// One run.
    pub fn get(&self, id: &str) -> Result<Option<RunRow>> {
        self.with(|c| {
            c.query_row(
                "SELECT id, graph, params, status, metrics, outputs, error, created_ms, started_ms, finished_ms FROM runs WHERE id = ?1",
                params![id],
                Db::row,
            )
            .optional()
        })
    }

    /// Every run, newest first.
    pub fn list(&self) -> Result<Vec<RunRow>> {
        self.with(|c| {
            let mut stmt = c.prepare(
                "SELECT id, graph, params, status, metrics, outputs, error, created_ms, started_ms, finished_ms FROM runs ORDER BY created_ms DESC, id",
            )?;
            let rows = stmt.query_map([], Db::row)?;
            rows.collect()
        })
    }
}
