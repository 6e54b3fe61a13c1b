//! Run history in SQLite (`sluice.db`, bundled SQLite): parameters, status, metrics,
//! outputs, error and timestamps of every run. Schema changes are numbered migrations
//! recorded in `PRAGMA user_version`.

use anyhow::{Context, Result};
use rusqlite::{params, Connection, OptionalExtension};
use sluice_api::{OutputSummary, RunFigures, RunRecord, RunStatus};
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

/// A JSON column as a type (None when empty or written by an incompatible build).
fn json_col<T: serde::de::DeserializeOwned>(s: Option<String>) -> Option<T> {
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
            "UPDATE runs SET status = ?2, error = 'the server stopped before the run finished', finished_ms = ?1
             WHERE status IN (?3, ?4)",
            params![
                now_ms(),
                RunStatus::Failed.as_str(),
                RunStatus::Queued.as_str(),
                RunStatus::Running.as_str()
            ],
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
                "INSERT INTO runs (id, graph, params, status, created_ms) VALUES (?1, ?2, ?3, ?4, ?5)",
                params![id, graph, params.to_string(), RunStatus::Queued.as_str(), now_ms()],
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
                "UPDATE runs SET status = ?3, started_ms = ?2 WHERE id = ?1 AND status = ?4",
                params![
                    id,
                    now_ms(),
                    RunStatus::Running.as_str(),
                    RunStatus::Queued.as_str()
                ],
            )
            .map(|n| n == 1)
        })
    }

    /// Records the end of a run.
    pub fn finish(
        &self,
        id: &str,
        status: RunStatus,
        figures: Option<&RunFigures>,
        outputs: Option<&[OutputSummary]>,
        error: Option<&str>,
    ) -> Result<()> {
        let figures = figures.map(serde_json::to_string).transpose()?;
        let outputs = outputs.map(serde_json::to_string).transpose()?;
        self.with(|c| {
            c.execute(
                "UPDATE runs SET status = ?2, metrics = ?3, outputs = ?4, error = ?5, finished_ms = ?6 WHERE id = ?1",
                params![id, status.as_str(), figures, outputs, error, now_ms()],
            )
            .map(|_| ())
        })
    }

    /// Cancels a queued run; true if it was queued.
    pub fn cancel_queued(&self, id: &str) -> Result<bool> {
        self.with(|c| {
            c.execute(
                "UPDATE runs SET status = ?3, finished_ms = ?2, error = 'cancelled before it started' WHERE id = ?1 AND status = ?4",
                params![
                    id,
                    now_ms(),
                    RunStatus::Cancelled.as_str(),
                    RunStatus::Queued.as_str()
                ],
            )
            .map(|n| n == 1)
        })
    }

    fn row(r: &rusqlite::Row) -> rusqlite::Result<RunRecord> {
        let status: String = r.get(3)?;
        Ok(RunRecord {
            id: r.get(0)?,
            graph: r.get(1)?,
            params: json_col(r.get(2)?).unwrap_or(serde_json::Value::Null),
            // A status this build does not know (a newer server's) reads as failed.
            status: RunStatus::parse(&status).unwrap_or(RunStatus::Failed),
            metrics: json_col(r.get(4)?),
            outputs: json_col(r.get(5)?),
            error: r.get(6)?,
            created_ms: r.get(7)?,
            started_ms: r.get(8)?,
            finished_ms: r.get(9)?,
        })
    }

    /// One run.
    pub fn get(&self, id: &str) -> Result<Option<RunRecord>> {
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
    pub fn list(&self) -> Result<Vec<RunRecord>> {
        self.with(|c| {
            let mut stmt = c.prepare(
                "SELECT id, graph, params, status, metrics, outputs, error, created_ms, started_ms, finished_ms FROM runs ORDER BY created_ms DESC, id",
            )?;
            let rows = stmt.query_map([], Db::row)?;
            rows.collect()
        })
    }
}
