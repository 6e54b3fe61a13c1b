//! `kill -9` of `sluice serve` in the middle of a large graph write and of 20 queued runs:
//! after each restart on the same workspace the graph file is whole (the old document or
//! the new one, never a mix, and it parses), every run that was waiting runs and
//! succeeds, a run cut off while running ends with a reason, and the restarted server
//! answers.
//!
//! The write is killed at several moments (right after the body is sent, then 5, 25 and
//! 100 ms later), each followed by a restart; the last kill also lands in the queue.

#[path = "support/attack.rs"]
mod attack;

use attack::{short, Req, Server};
use serde_json::{json, Value};
use std::io::Write;
use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};

/// The runs queued before the last kill.
const RUNS: usize = 20;

/// A run slow enough that most of the queue is still waiting when the server dies.
fn slow_run(seed: usize) -> Value {
    json!({ "seed_inputs": true, "graph": "transformer_block", "batch": 32, "seed": seed })
}

fn mlp_named(name: &str) -> Value {
    let text = std::fs::read_to_string(sluice_tests::root().join("assets/graphs/mlp.json"))
        .expect("the MLP example");
    let mut g: Value = serde_json::from_str(&text).expect("the MLP example parses");
    g["name"] = json!(name);
    g
}

/// Sends `PUT /api/graphs/victim` with `new` padded to 8 MiB (so writing it takes a
/// while), kills the server `delay` after the body is sent, and checks the file on disk
/// holds `old` or `new`; returns which, and what the file held.
fn put_and_kill(s: &mut Server, ws: &Path, old: &Value, new: &Value, delay: Duration) -> Value {
    let text = new.to_string();
    let bytes = format!("{{{}{}", " ".repeat(8 << 20), &text[1..]).into_bytes();
    let size = bytes.len();
    let request = Req::raw_json("PUT", "/api/graphs/victim", bytes).bytes(&s.host(), None);
    let (sent_tx, sent_rx) = std::sync::mpsc::channel();
    let addr = s.addr;
    let writer = std::thread::spawn(move || {
        let r = TcpStream::connect(addr).and_then(|mut t| {
            t.write_all(&request)?;
            let _ = sent_tx.send(());
            attack::read_reply(&mut t)
        });
        r.map_or_else(|e| format!("no answer ({e})"), |r| r.status.to_string())
    });
    let _ = sent_rx.recv_timeout(Duration::from_secs(60));
    std::thread::sleep(delay);
    s.kill();
    let answer = writer.join().unwrap_or_default();
    // The file on disk, before anything touches it again.
    let on_disk = std::fs::read(ws.join("graphs/victim.json")).unwrap_or_default();
    let parsed: Value = serde_json::from_slice(&on_disk).unwrap_or(Value::Null);
    let which = if parsed == *old {
        "the old document"
    } else if parsed == *new {
        "the new document"
    } else if parsed.is_null() {
        "torn (does not parse)"
    } else {
        "a document that is neither"
    };
    let strays: Vec<String> = std::fs::read_dir(ws.join("graphs"))
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| !n.ends_with(".json") || n.starts_with('.'))
                .collect()
        })
        .unwrap_or_default();
    println!(
        "killed {:>3} ms after the PUT's body (answer: {answer}): {} of {size} bytes on disk, {which}; other files: {strays:?}",
        delay.as_millis(),
        on_disk.len()
    );
    assert!(
        matches!(which, "the old document" | "the new document"),
        "after kill -9 the graph file holds {which} ({} bytes: {})",
        on_disk.len(),
        short(&String::from_utf8_lossy(&on_disk), 200)
    );
    s.restart();
    let served = s.get("/api/graphs/victim");
    assert_eq!(
        served.status,
        200,
        "the graph after the restart: {}",
        served.text()
    );
    assert_eq!(
        served.json(),
        parsed,
        "the restarted server serves what is on disk"
    );
    parsed
}

#[test]
fn a_server_killed_mid_write_and_mid_queue_loses_nothing() {
    let dir = attack::scratch("crash");
    let (ws, log) = (dir.join("workspace"), dir.join("server.log"));
    let mut s =
        Server::start_in(&ws, &log, None, &["--concurrency", "1"]).expect("sluice serve starts");
    let mut current = mlp_named("version-0");
    let put = s.json("PUT", "/api/graphs/victim", &current);
    assert!(put.status < 300, "storing the first graph: {}", put.status);
    for (round, delay_ms) in [5u64, 25, 100].into_iter().enumerate() {
        let next = mlp_named(&format!("version-{}", round + 1));
        current = put_and_kill(
            &mut s,
            &ws,
            &current,
            &next,
            Duration::from_millis(delay_ms),
        );
    }
    // The last kill: a write, and 20 runs waiting behind one running.
    let ids: Vec<String> = (0..RUNS)
        .map(|seed| {
            let r = s.json("POST", "/api/runs", &slow_run(seed));
            assert_eq!(r.status, 202, "queueing run {seed}: {}", r.text());
            r.json()["id"].as_str().expect("a run id").to_string()
        })
        .collect();
    let before: Value = s.get("/api/runs").json();
    let status_before = |id: &str| -> String {
        before["runs"]
            .as_array()
            .and_then(|runs| runs.iter().find(|r| r["id"] == id))
            .and_then(|r| r["status"].as_str())
            .unwrap_or("?")
            .to_string()
    };
    let last = mlp_named("version-last");
    put_and_kill(&mut s, &ws, &current, &last, Duration::ZERO);
    let started = Instant::now();
    let mut outcomes = Vec::new();
    for id in &ids {
        let left = Duration::from_secs(900).saturating_sub(started.elapsed());
        let end = s.wait_run(id, left.max(Duration::from_secs(5)));
        outcomes.push((id.clone(), status_before(id), end));
    }
    // Runs execute in order, one at a time: the run running at the kill is the one running
    // when the list was taken, or, if that one finished in between, the first waiting one.
    let next_in_line = outcomes
        .iter()
        .find(|(_, before, _)| before == "queued")
        .map(|(id, _, _)| id.clone());
    let mut report = Vec::new();
    let mut wrong = Vec::new();
    for (id, before, end) in &outcomes {
        let (status, error) = match end {
            Ok(r) => (
                r["status"].as_str().unwrap_or("?").to_string(),
                r["error"].as_str().unwrap_or("").to_string(),
            ),
            Err(e) => ("not ended".to_string(), e.clone()),
        };
        report.push(format!("{id}: {before} → {status}"));
        // A run waiting in the queue must run and succeed; one the kill cut off while
        // running may instead end with a reason.
        let cut_off = before != "queued" || next_in_line.as_ref() == Some(id);
        let fine = status == "succeeded" || (cut_off && status == "failed" && !error.is_empty());
        if !fine {
            wrong.push(format!(
                "{id}: {before} at the kill → {status} {}",
                short(&error, 160)
            ));
        }
    }
    println!(
        "{RUNS} runs after the restart ({:.0} s):\n  {}",
        started.elapsed().as_secs_f64(),
        report.join("\n  ")
    );
    assert!(
        wrong.is_empty(),
        "runs lost or wrongly ended:\n{}",
        wrong.join("\n")
    );
    let after = s.json(
        "POST",
        "/api/runs",
        &json!({ "seed_inputs": true, "graph": "victim", "batch": 2 }),
    );
    assert_eq!(
        after.status,
        202,
        "a run after the restart: {}",
        after.text()
    );
    let id = after.json()["id"].as_str().unwrap_or("").to_string();
    let end = s
        .wait_run(&id, Duration::from_secs(120))
        .expect("the new run ends");
    assert_eq!(end["status"], "succeeded", "{end}");
}
