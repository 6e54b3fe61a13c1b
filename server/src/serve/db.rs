//! Run history in SQLite (`sluice.db`, bundled SQLite): parameters (as kept: uploads and
//! inline graphs are files of the run), status, metrics, outputs, error and timestamps of
//! every run. Schema changes are numbered migrations recorded in `PRAGMA user_version`.
//!
//! The journal is a write-ahead log with `synchronous = FULL`: every commit is on disk
//! before the call returns, so a run answered 202 is still queued after a power loss, not
//! only after a crash of the process (which `NORMAL` would already survive). A run costs
//! three commits, which is nothing next to running it.
//!
//! Lists are paginated (newest first, by insertion order), counts and durations are
//! aggregated in SQL, and old finished runs are pruned, so no request loads the history.

use anyhow::{Context, Result};
use rusqlite::{params, Connection, OptionalExtension};
use sluice_api::{OutputSummary, RunFigures, RunList, RunRecord, RunStatus};
use std::path::Path;
use std::sync::Mutex;

/// Schema migrations, applied in order; the database records how many ran.
const MIGRATIONS: &[&str] = &[
    "CREATE TABLE runs (
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
    CREATE INDEX runs_created ON runs(created_ms);",
    // The inputs a run filled with seeded random values (a JSON list of names).
    "ALTER TABLE runs ADD COLUMN seeded_inputs TEXT;",
];

/// The columns of a [`RunRecord`], in [`Db::row`]'s order.
const COLUMNS: &str =
    "id, graph, params, status, metrics, outputs, error, created_ms, started_ms, finished_ms, \
     seeded_inputs";

/// The database.
pub struct Db {
    conn: Mutex<Connection>,
}

/// What a previous server left: runs to queue again, in the order they were queued.
pub struct Leftover {
    /// Runs still queued.
    pub queued: Vec<String>,
    /// Runs that were running, now failed with the reason.
    pub interrupted: usize,
}

/// Finished runs' durations: how many, their sum, and how many within each bucket bound.
pub struct Durations {
    /// Finished runs with a start and an end.
    pub count: u64,
    /// Sum of their durations, seconds.
    pub sum: f64,
    /// Runs at most each bound long (cumulative, as Prometheus counts).
    pub within: Vec<u64>,
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .ok()
        .and_then(|d| i64::try_from(d.as_millis()).ok())
        .unwrap_or(0)
}

/// A JSON column as a type (None when empty or written by an incompatible build).
fn json_col<T: serde::de::DeserializeOwned>(s: Option<String>) -> Option<T> {
    s.and_then(|t| serde_json::from_str(&t).ok())
}

const FINAL: [RunStatus; 3] = [
    RunStatus::Succeeded,
    RunStatus::Failed,
    RunStatus::Cancelled,
];

impl Db {
    /// Opens the database in WAL mode, applies pending migrations, fails the runs a
    /// previous server left running (the reason is stored) and returns the runs it left
    /// queued, to be queued again.
    pub fn open(path: &Path) -> Result<(Db, Leftover)> {
        let conn =
            Connection::open(path).with_context(|| format!("cannot open {}", path.display()))?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        let mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
        if !mode.eq_ignore_ascii_case("wal") {
            anyhow::bail!(
                "{} cannot use a write-ahead log (journal mode {mode})",
                path.display()
            );
        }
        conn.execute_batch("PRAGMA synchronous = FULL")?;
        let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
        let done = usize::try_from(version).unwrap_or(0);
        for (i, m) in MIGRATIONS.iter().enumerate().skip(done) {
            conn.execute_batch(m)
                .with_context(|| format!("migration {}", i + 1))?;
            conn.execute_batch(&format!("PRAGMA user_version = {}", i + 1))?;
        }
        let interrupted = conn.execute(
            "UPDATE runs SET status = ?2, error = 'the server stopped before the run finished', finished_ms = ?1
             WHERE status = ?3",
            params![
                now_ms(),
                RunStatus::Failed.as_str(),
                RunStatus::Running.as_str()
            ],
        )?;
        let queued = conn
            .prepare("SELECT id FROM runs WHERE status = ?1 ORDER BY rowid")?
            .query_map(params![RunStatus::Queued.as_str()], |r| r.get(0))?
            .collect::<rusqlite::Result<Vec<String>>>()?;
        Ok((
            Db {
                conn: Mutex::new(conn),
            },
            Leftover {
                queued,
                interrupted,
            },
        ))
    }

    fn with<T>(&self, f: impl FnOnce(&mut Connection) -> rusqlite::Result<T>) -> Result<T> {
        let mut conn = self
            .conn
            .lock()
            .map_err(|_| anyhow::anyhow!("database lock poisoned"))?;
        Ok(f(&mut conn)?)
    }

    /// Records a new queued run (`params`: the request as kept; `seeded`: the inputs it
    /// fills with seeded random values).
    pub fn insert(
        &self,
        id: &str,
        graph: &str,
        params: &serde_json::Value,
        seeded: &[String],
    ) -> Result<()> {
        let seeded = serde_json::to_string(seeded)?;
        self.with(|c| {
            c.execute(
                "INSERT INTO runs (id, graph, params, status, created_ms, seeded_inputs) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![id, graph, params.to_string(), RunStatus::Queued.as_str(), now_ms(), seeded],
            )
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
            seeded_inputs: json_col(r.get(10)?).unwrap_or_default(),
        })
    }

    /// One run.
    pub fn get(&self, id: &str) -> Result<Option<RunRecord>> {
        self.with(|c| {
            c.query_row(
                &format!("SELECT {COLUMNS} FROM runs WHERE id = ?1"),
                params![id],
                Db::row,
            )
            .optional()
        })
    }

    /// A page of at most `limit` runs, newest first, older than the run `before` (from
    /// the newest when None); None when `before` names no run.
    pub fn page(&self, limit: usize, before: Option<&str>) -> Result<Option<RunList>> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.with(|c| {
            let start = match before {
                None => i64::MAX,
                Some(id) => match c
                    .query_row("SELECT rowid FROM runs WHERE id = ?1", params![id], |r| {
                        r.get(0)
                    })
                    .optional()?
                {
                    Some(rowid) => rowid,
                    None => return Ok(None),
                },
            };
            // One more than asked tells whether another page follows.
            let mut runs = c
                .prepare(&format!(
                    "SELECT {COLUMNS} FROM runs WHERE rowid < ?1 ORDER BY rowid DESC LIMIT ?2"
                ))?
                .query_map(params![start, limit.saturating_add(1)], Db::row)?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            let more = i64::try_from(runs.len()).unwrap_or(i64::MAX) > limit;
            if more {
                runs.pop();
            }
            let next = if more {
                runs.last().map(|r| r.id.clone())
            } else {
                None
            };
            Ok(Some(RunList { runs, next }))
        })
    }

    /// How many runs have each status.
    pub fn counts(&self) -> Result<Vec<(RunStatus, u64)>> {
        self.with(|c| {
            let mut stmt = c.prepare("SELECT status, COUNT(*) FROM runs GROUP BY status")?;
            let rows = stmt
                .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(RunStatus::ALL
                .into_iter()
                .map(|s| {
                    let n = rows
                        .iter()
                        .filter(|(name, _)| name == s.as_str())
                        .map(|(_, n)| u64::try_from(*n).unwrap_or(0))
                        .sum();
                    (s, n)
                })
                .collect())
        })
    }

    /// Durations of finished runs, counted within each bound (seconds).
    pub fn durations(&self, bounds: &[f64]) -> Result<Durations> {
        let within: String = (1..=bounds.len())
            .map(|i| format!(", COALESCE(SUM(d <= ?{i}), 0)"))
            .collect();
        let sql = format!(
            "SELECT COUNT(*), COALESCE(SUM(d), 0.0){within} FROM
             (SELECT (finished_ms - started_ms) / 1000.0 AS d FROM runs
              WHERE finished_ms IS NOT NULL AND started_ms IS NOT NULL)"
        );
        self.with(|c| {
            c.query_row(&sql, rusqlite::params_from_iter(bounds), |r| {
                let count: i64 = r.get(0)?;
                let mut within = Vec::with_capacity(bounds.len());
                for i in 0..bounds.len() {
                    within.push(u64::try_from(r.get::<_, i64>(i + 2)?).unwrap_or(0));
                }
                Ok(Durations {
                    count: u64::try_from(count).unwrap_or(0),
                    sum: r.get(1)?,
                    within,
                })
            })
        })
    }

    /// Deletes the finished runs older than the newest `keep` finished ones; returns
    /// their ids (their files are the caller's to remove).
    pub fn prune(&self, keep: usize) -> Result<Vec<String>> {
        let keep = i64::try_from(keep).unwrap_or(i64::MAX);
        self.with(|c| {
            let tx = c.transaction()?;
            let ids = tx
                .prepare(
                    "SELECT id FROM runs WHERE status IN (?1, ?2, ?3)
                     ORDER BY rowid DESC LIMIT -1 OFFSET ?4",
                )?
                .query_map(
                    params![
                        FINAL[0].as_str(),
                        FINAL[1].as_str(),
                        FINAL[2].as_str(),
                        keep
                    ],
                    |r| r.get(0),
                )?
                .collect::<rusqlite::Result<Vec<String>>>()?;
            for id in &ids {
                tx.execute("DELETE FROM runs WHERE id = ?1", params![id])?;
            }
            tx.commit()?;
            Ok(ids)
        })
    }

    /// Whether a run is recorded.
    pub fn has(&self, id: &str) -> Result<bool> {
        self.with(|c| {
            c.query_row("SELECT 1 FROM runs WHERE id = ?1", params![id], |_| Ok(()))
                .optional()
                .map(|r| r.is_some())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn temp(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("sluice-db-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d.join("sluice.db")
    }

    fn id(i: usize) -> String {
        format!("{i:016x}")
    }

    #[test]
    fn pages_follow_insertion_order_with_a_cursor() {
        let (db, _) = Db::open(&temp("pages")).unwrap();
        for i in 0..25 {
            db.insert(&id(i), "g", &json!({}), &[]).unwrap();
        }
        let mut seen = Vec::new();
        let mut before: Option<String> = None;
        loop {
            let page = db.page(10, before.as_deref()).unwrap().unwrap();
            assert!(page.runs.len() <= 10);
            seen.extend(page.runs.iter().map(|r| r.id.clone()));
            match page.next {
                Some(n) => before = Some(n),
                None => break,
            }
        }
        let want: Vec<String> = (0..25).rev().map(id).collect();
        assert_eq!(seen, want);
        assert!(db.page(10, Some("ffffffffffffffff")).unwrap().is_none());
        assert_eq!(db.page(25, None).unwrap().unwrap().next, None);
    }

    #[test]
    fn queued_runs_survive_a_restart_and_running_ones_fail() {
        let path = temp("restart");
        {
            let (db, _) = Db::open(&path).unwrap();
            for i in 0..4 {
                db.insert(&id(i), "g", &json!({}), &[]).unwrap();
            }
            assert!(db.start(&id(1)).unwrap());
        }
        let (db, left) = Db::open(&path).unwrap();
        assert_eq!(left.queued, vec![id(0), id(2), id(3)]);
        assert_eq!(left.interrupted, 1);
        let r = db.get(&id(1)).unwrap().unwrap();
        assert_eq!(r.status, RunStatus::Failed);
        assert!(r.error.unwrap().contains("stopped before the run finished"));
    }

    #[test]
    fn counts_durations_and_pruning_are_done_in_sql() {
        let (db, _) = Db::open(&temp("prune")).unwrap();
        for i in 0..6 {
            db.insert(&id(i), "g", &json!({}), &[]).unwrap();
            if i < 5 {
                db.start(&id(i)).unwrap();
                db.finish(&id(i), RunStatus::Succeeded, None, None, None)
                    .unwrap();
            }
        }
        let counts = db.counts().unwrap();
        assert!(counts.contains(&(RunStatus::Succeeded, 5)));
        assert!(counts.contains(&(RunStatus::Queued, 1)));
        let d = db.durations(&[0.5, 600.0]).unwrap();
        assert_eq!((d.count, d.within.clone()), (5, vec![5, 5]));
        let gone = db.prune(2).unwrap();
        assert_eq!(gone, vec![id(2), id(1), id(0)]);
        assert!(db.has(&id(5)).unwrap(), "queued runs are never pruned");
        assert!(db.has(&id(4)).unwrap() && !db.has(&id(0)).unwrap());
    }
}
