//! The soak: 20 concurrent loopback clients send a mix of valid requests (runs, checks,
//! graph writes and reads, listings, live event streams) and hostile ones from the
//! adversarial classes to one `sluice serve` for a set time, while the server's resident
//! memory and open descriptors are sampled every few seconds. At the end every accepted
//! run must have ended (succeeded, or failed or been cancelled with a reason), no valid
//! request may have gone unanswered, and the last minute's memory and descriptors must
//! not have grown past the first minute's.
//!
//! Included by `adversarial.rs` with `#[path]` (next to `attack.rs` and `hostile.rs`).

use crate::attack::{self, mib, short, Req, Server};
use crate::hostile;
use serde_json::json;
use std::collections::BTreeMap;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Concurrent clients.
const CLIENTS: usize = 20;

/// Seconds between samples of the server's memory and descriptors.
const SAMPLE_EVERY: Duration = Duration::from_secs(5);

/// One sample of the server.
#[derive(Debug, Clone, Copy)]
struct Sample {
    at: f64,
    rss: u64,
    fds: usize,
}

/// What one request of a client did.
struct Outcome {
    /// The answer (a status, or what went wrong).
    answer: String,
    /// The run it started, when one was accepted.
    accepted: Option<String>,
    /// Whether a valid request went unanswered.
    lost: bool,
}

impl Outcome {
    fn of(reply: std::io::Result<attack::Reply>, valid: bool) -> Outcome {
        match reply {
            Ok(r) => Outcome {
                answer: r.status.to_string(),
                accepted: (r.status == 202)
                    .then(|| r.json()["id"].as_str().map(str::to_string))
                    .flatten(),
                lost: false,
            },
            Err(e) => Outcome {
                answer: format!("no answer ({})", e.kind()),
                accepted: None,
                lost: valid,
            },
        }
    }
}

/// What one client did: answers counted by (kind, answer), the runs it started, and the
/// valid requests that went unanswered.
type ClientTally = (BTreeMap<(usize, String), usize>, Vec<String>, usize);

/// The kinds of request, each with whether it is valid traffic.
const KINDS: &[(&str, bool)] = &[
    ("run", true),
    ("run 2 stages", true),
    ("validate", true),
    ("put graph", true),
    ("get graph", true),
    ("list runs", true),
    ("metrics", true),
    ("watch events", true),
    ("hostile: no token", false),
    ("hostile: linear 2^33", false),
    ("hostile: slice extremes", false),
    ("hostile: clip min > max", false),
    ("hostile: text/plain", false),
    ("hostile: foreign origin", false),
    ("hostile: bad host", false),
    ("hostile: ../ name", false),
    ("hostile: npy lie", false),
    ("hostile: reset mid-response", false),
    ("hostile: slow headers", false),
    ("hostile: rank 20,000", false),
    ("hostile: junk worker", false),
];

fn request(s: &Server, kind: usize, client: usize, i: usize, last_run: &Option<String>) -> Outcome {
    let (name, valid) = KINDS[kind];
    let mlp = || json!({ "seed_inputs": true, "graph": "mlp", "batch": 4, "seed": i });
    let send = |r: Req| Outcome::of(s.send(&r), valid);
    match name {
        "run" => send(Req::json("POST", "/api/runs", &mlp())),
        "run 2 stages" => send(Req::json(
            "POST",
            "/api/runs",
            &json!({ "seed_inputs": true, "graph": "mlp", "batch": 4, "microbatches": 2, "stages": 2, "seed": i }),
        )),
        "validate" => send(Req::json("POST", "/api/validate", &hostile::chain(50))),
        "put graph" => send(Req::json(
            "PUT",
            &format!("/api/graphs/soak{client}"),
            &hostile::chain(1 + i % 40),
        )),
        "get graph" => send(Req::get(&format!("/api/graphs/soak{client}"))),
        "list runs" => send(Req::get("/api/runs")),
        "metrics" => send(Req::get("/metrics")),
        "watch events" => {
            let Some(id) = last_run else {
                return send(Req::get("/api/devices"));
            };
            match s.ws(&format!("/api/runs/{id}/events"), &[]) {
                Ok(mut ws) => {
                    let _ = ws.get_mut().set_read_timeout(Some(Duration::from_secs(10)));
                    let mut answer = "no summary".to_string();
                    while let Ok(m) = ws.read() {
                        if m.to_text().is_ok_and(|t| t.contains("\"summary\"")) {
                            answer = "summary".into();
                            break;
                        }
                    }
                    Outcome {
                        answer,
                        accepted: None,
                        lost: false,
                    }
                }
                Err((code, e)) => Outcome {
                    answer: format!("no WebSocket ({code})"),
                    accepted: None,
                    lost: code == 0 && !e.is_empty(),
                },
            }
        }
        "hostile: no token" => send(Req::get("/api/graphs").without("Authorization")),
        "hostile: linear 2^33" => send(Req::json(
            "POST",
            "/api/runs",
            &json!({ "seed_inputs": true, "graph": hostile::huge_linear(1 << 33) }),
        )),
        "hostile: slice extremes" => send(Req::json(
            "POST",
            "/api/validate",
            &hostile::slice(
                json!([hostile::TWO_63]),
                json!([i64::MIN]),
                json!([i64::MAX]),
                json!([i64::MIN]),
            ),
        )),
        "hostile: clip min > max" => send(Req::json(
            "POST",
            "/api/runs",
            &json!({ "seed_inputs": true, "graph": hostile::clip(1.0, -1.0), "batch": 2 }),
        )),
        "hostile: text/plain" => send(
            Req::new("POST", "/api/runs")
                .header("Content-Type", "text/plain")
                .body(mlp().to_string().into_bytes()),
        ),
        "hostile: foreign origin" => {
            send(Req::json("POST", "/api/runs", &mlp()).header("Origin", "http://evil.example"))
        }
        "hostile: bad host" => send(Req::get("/api/graphs").header("Host", "evil.example")),
        "hostile: ../ name" => send(Req::get("/api/graphs/..%2F..%2Fetc%2Fpasswd")),
        "hostile: npy lie" => {
            let lie = hostile::npy(
                &hostile::npy_dict("<f4", false, "(1099511627776,)"),
                &[0; 16],
            );
            send(Req::json(
                "POST",
                "/api/runs",
                &json!({ "graph": "mlp", "inputs": { "x": hostile::b64(&lie) } }),
            ))
        }
        "hostile: reset mid-response" => {
            let r = std::net::TcpStream::connect(s.addr).and_then(|mut t| {
                t.write_all(&Req::get("/api/runs").bytes(&s.host(), s.token.as_deref()))?;
                t.shutdown(std::net::Shutdown::Write)
            });
            Outcome {
                answer: r.map_or_else(|e| e.kind().to_string(), |_| "reset".into()),
                accepted: None,
                lost: false,
            }
        }
        "hostile: slow headers" => {
            let r = std::net::TcpStream::connect(s.addr).and_then(|mut t| {
                t.write_all(b"GET /api/ops HTTP/1.1\r\nHost: ")?;
                std::thread::sleep(Duration::from_secs(1));
                Ok(())
            });
            Outcome {
                answer: r.map_or_else(|e| e.kind().to_string(), |_| "abandoned".into()),
                accepted: None,
                lost: false,
            }
        }
        "hostile: rank 20,000" => send(Req::json("POST", "/api/validate", &hostile::rank(20_000))),
        _ => {
            let answer = match s.ws("/api/workers", &[]) {
                Ok(mut ws) => {
                    let _ = ws.send(tungstenite::Message::Binary(vec![0xFF; 4096].into()));
                    "junk sent".to_string()
                }
                Err((code, _)) => format!("refused ({code})"),
            };
            Outcome {
                answer,
                accepted: None,
                lost: false,
            }
        }
    }
}

/// The largest figure of the samples in a time window.
fn window_max(samples: &[Sample], from: f64, to: f64) -> (u64, usize) {
    samples
        .iter()
        .filter(|s| s.at >= from && s.at <= to)
        .fold((0, 0), |(r, f), s| (r.max(s.rss), f.max(s.fds)))
}

/// Runs the soak for `duration` against a server with `token`, asserting that nothing
/// leaked, nothing was lost and the server's peak memory stayed under `memory_bound`.
pub fn soak(duration: Duration, token: &str, memory_bound: u64) {
    // Retention is off for the soak (it is tested in the durability class): every run
    // accepted in the soak must still be there at the end to show how it ended.
    let server = Server::start("soak", Some(token), &["--keep-runs", "100000000"])
        .expect("sluice serve starts");
    let pid = server.pid();
    let started = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let samples = Arc::new(Mutex::new(Vec::<Sample>::new()));
    let sampler = {
        let (stop, samples) = (stop.clone(), samples.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let rss = attack::proc_status_bytes(pid, "VmRSS").unwrap_or(0);
                let fds = attack::open_fds(pid).unwrap_or(0);
                if let Ok(mut s) = samples.lock() {
                    s.push(Sample {
                        at: started.elapsed().as_secs_f64(),
                        rss,
                        fds,
                    });
                }
                let t = Instant::now();
                while t.elapsed() < SAMPLE_EVERY && !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        })
    };
    let deadline = started + duration;
    let results: Vec<ClientTally> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..CLIENTS)
            .map(|client| {
                let server = &server;
                scope.spawn(move || {
                    let mut counts = BTreeMap::new();
                    let (mut accepted, mut lost) = (Vec::new(), 0);
                    let mut i = 0;
                    while Instant::now() < deadline {
                        let kind = (client * 7 + i) % KINDS.len();
                        let o = request(server, kind, client, i, &accepted.last().cloned());
                        *counts.entry((kind, o.answer)).or_insert(0) += 1;
                        accepted.extend(o.accepted);
                        lost += usize::from(o.lost);
                        i += 1;
                    }
                    (counts, accepted, lost)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a soak client"))
            .collect()
    });
    let traffic_s = started.elapsed().as_secs_f64();
    // Every accepted run must end, with a reason when it did not succeed.
    let accepted: Vec<String> = results.iter().flat_map(|r| r.1.clone()).collect();
    let lost_requests: usize = results.iter().map(|r| r.2).sum();
    let mut ends: BTreeMap<String, usize> = BTreeMap::new();
    let mut problems = Vec::new();
    let settle = Instant::now();
    for id in &accepted {
        let left = Duration::from_secs(600).saturating_sub(settle.elapsed());
        match server.wait_run(id, left.max(Duration::from_secs(5))) {
            Ok(run) => {
                let status = run["status"].as_str().unwrap_or("?").to_string();
                if status != "succeeded" && run["error"].as_str().is_none_or(str::is_empty) {
                    problems.push(format!("run {id} {status} without a reason"));
                }
                *ends.entry(status).or_insert(0) += 1;
            }
            Err(e) => {
                problems.push(e);
                *ends.entry("lost or stuck".into()).or_insert(0) += 1;
            }
        }
    }
    let listed = server.get("/api/runs").json()["runs"]
        .as_array()
        .map_or(0, Vec::len);
    stop.store(true, Ordering::Relaxed);
    let _ = sampler.join();
    let samples = samples.lock().map(|s| s.clone()).unwrap_or_default();
    let window = (traffic_s / 3.0).min(60.0);
    let (first_rss, first_fds) = window_max(&samples, 0.0, window);
    let (last_rss, last_fds) = window_max(&samples, traffic_s - window, traffic_s);
    let peak = server.peak_memory();
    // Summary.
    let mut totals: BTreeMap<(usize, String), usize> = BTreeMap::new();
    for (counts, _, _) in &results {
        for (k, n) in counts {
            *totals.entry(k.clone()).or_insert(0) += n;
        }
    }
    println!(
        "\n== soak: {CLIENTS} clients for {:.1} min against sluice serve on {} ==",
        traffic_s / 60.0,
        server.addr
    );
    let mut by_kind: BTreeMap<usize, Vec<String>> = BTreeMap::new();
    for ((kind, answer), n) in &totals {
        by_kind
            .entry(*kind)
            .or_default()
            .push(format!("{answer} ×{n}"));
    }
    for (kind, answers) in by_kind {
        println!("  {:<30} {}", KINDS[kind].0, answers.join(", "));
    }
    let requests: usize = totals.values().sum();
    println!(
        "  requests: {requests}; valid requests unanswered: {lost_requests}\n  accepted runs: {} → {}; /api/runs lists {listed}",
        accepted.len(),
        ends.iter()
            .map(|(k, n)| format!("{k} {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!(
        "  memory (RSS, max): first {window:.0} s {:.0} MiB, last {window:.0} s {:.0} MiB, peak {:.0} MiB\n  descriptors (max): first {first_fds}, last {last_fds}\n  samples: {}",
        mib(first_rss),
        mib(last_rss),
        mib(peak),
        samples
            .iter()
            .map(|s| format!("{:.0}s:{:.0}MiB/{}fd", s.at, mib(s.rss), s.fds))
            .collect::<Vec<_>>()
            .join(" ")
    );
    for p in problems.iter().take(20) {
        println!("  problem: {}", short(p, 200));
    }
    let mut failures = Vec::new();
    if lost_requests > 0 {
        failures.push(format!("{lost_requests} valid requests went unanswered"));
    }
    if !problems.is_empty() {
        failures.push(format!(
            "{} accepted runs did not end with a reason",
            problems.len()
        ));
    }
    if last_rss > first_rss + first_rss / 4 + (64 << 20) {
        failures.push(format!(
            "memory grew: {:.0} MiB in the first window, {:.0} MiB in the last",
            mib(first_rss),
            mib(last_rss)
        ));
    }
    if last_fds > first_fds + 16 {
        failures.push(format!("descriptors grew: {first_fds} → {last_fds}"));
    }
    if peak >= memory_bound {
        failures.push(format!(
            "peak memory {:.0} MiB over the bound of {:.0} MiB",
            mib(peak),
            mib(memory_bound)
        ));
    }
    assert!(
        failures.is_empty(),
        "the soak failed:\n{}",
        failures.join("\n")
    );
    println!("  soak passed: nothing leaked, nothing lost");
}
