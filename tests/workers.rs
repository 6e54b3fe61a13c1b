//! Workers and the worker protocol against real processes. Hostile workers written here
//! with tungstenite meet a real `sluice serve` (answers of the wrong shape, garbage,
//! oversized frames, out-of-step answers, a hang-up mid-result, a worker that never
//! answers and whose run is cancelled, a thousand sockets, an oversized hello); a hostile
//! server written here meets a real `sluice worker` (lying plans, oversized and
//! mismatched weights, unknown jobs, garbage, too many stages). The server must stay up
//! with its peak memory (VmHWM, from /proc) barely moved, runs must fail with reasons or
//! move on, no misbehaving worker may stay registered, and the worker must answer errors
//! and keep working.

use serde_json::{json, Value};
use sluice_tests::sluice;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use tungstenite::client::IntoClientRequest;
use tungstenite::Message;

/// The worker protocol version of this build (`sluice_api::protocol::PROTOCOL`).
const PROTOCOL: u32 = 2;

/// How much hostile input may raise the server's peak memory (VmHWM), in KiB.
const PEAK_GROWTH_BOUND_KIB: u64 = 32 << 10;

/// The server's peak memory (VmHWM), in KiB: its local device opened and calibrated.
const PEAK_BOUND_KIB: u64 = 512 << 10;

/// A running `sluice serve`, killed on drop.
struct Server {
    child: Child,
    url: String,
    agent: ureq::Agent,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn workspace(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("sluice-workers-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn start(ws: &Path, extra: &[&str]) -> Server {
    let mut child = sluice()
        .args([
            "serve",
            "--addr",
            "127.0.0.1:0",
            "--no-editor",
            "--workspace",
        ])
        .arg(ws)
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("sluice serve starts");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("first line");
    let url = line
        .split_whitespace()
        .find(|w| w.starts_with("http"))
        .unwrap_or_else(|| panic!("no URL in {line:?}"))
        .to_string();
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    Server { child, url, agent }
}

impl Server {
    fn json(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        let url = format!("{}{path}", self.url);
        let resp = match body {
            None => self.agent.get(&url).call(),
            Some(b) => self
                .agent
                .post(&url)
                .header("Content-Type", "application/json")
                .send(b.to_string()),
        }
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        let status = resp.status().as_u16();
        let text = resp.into_body().read_to_string().unwrap_or_default();
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    fn run(&self, body: Value) -> String {
        let (code, r) = self.json("POST", "/api/runs", Some(body));
        assert_eq!(code, 202, "{r}");
        r["id"].as_str().expect("run id").to_string()
    }

    fn wait_run(&self, id: &str) -> Value {
        let t = Instant::now();
        loop {
            let (_, r) = self.json("GET", &format!("/api/runs/{id}"), None);
            if !matches!(r["status"].as_str(), Some("queued") | Some("running")) {
                return r;
            }
            assert!(
                t.elapsed() < Duration::from_secs(120),
                "run {id} did not finish"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The ids of the registered remote workers.
    fn remote(&self) -> Vec<String> {
        let (code, d) = self.json("GET", "/api/devices", None);
        assert_eq!(code, 200, "the server answers");
        d["workers"]
            .as_array()
            .expect("workers")
            .iter()
            .filter(|w| w["kind"] == "remote")
            .map(|w| w["id"].as_str().unwrap_or_default().to_string())
            .collect()
    }

    /// Waits until exactly these workers are registered.
    fn wait_remote(&self, ids: &[&str]) {
        let t = Instant::now();
        loop {
            let mut have = self.remote();
            have.sort();
            let mut want: Vec<String> = ids.iter().map(|s| s.to_string()).collect();
            want.sort();
            if have == want {
                return;
            }
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "registered workers: {have:?}, expected {want:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Runs the MLP on the local device, so that opening and calibrating it does not
    /// count as growth of the peak memory.
    fn warm(&self) {
        let run =
            self.wait_run(&self.run(json!({ "seed_inputs": true, "graph": "mlp", "batch": 4 })));
        assert_eq!(run["status"], "succeeded", "{run}");
    }

    /// Checks the growth of the peak memory since `baseline`, and the peak itself.
    fn check_peak(&self, baseline: u64) {
        let peak = self.peak_kib();
        let growth = peak.saturating_sub(baseline);
        println!("peak memory {peak} KiB, grown by {growth} KiB (bounds: {PEAK_BOUND_KIB}, {PEAK_GROWTH_BOUND_KIB} KiB)");
        assert!(
            growth < PEAK_GROWTH_BOUND_KIB,
            "the server's peak memory grew by {growth} KiB"
        );
        assert!(
            peak < PEAK_BOUND_KIB,
            "the server's peak memory is {peak} KiB"
        );
    }

    fn ws_request(&self) -> tungstenite::handshake::client::Request {
        format!("{}/api/workers", self.url.replace("http://", "ws://"))
            .into_client_request()
            .unwrap()
    }

    /// Peak resident memory of the server process, in KiB.
    fn peak_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .expect("the server process is alive");
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmHWM")
    }
}

type Ws<S> = tungstenite::WebSocket<S>;
type ClientWs = Ws<tungstenite::stream::MaybeTlsStream<TcpStream>>;

fn send_json<S: Read + Write>(ws: &mut Ws<S>, v: &Value) {
    ws.send(Message::Text(v.to_string().into())).unwrap();
}

/// The next text message as JSON; `{"closed": ...}` when the connection ended.
fn read_json<S: Read + Write>(ws: &mut Ws<S>) -> Value {
    loop {
        match ws.read() {
            Ok(Message::Text(t)) => {
                return serde_json::from_str(&t).unwrap_or(json!({ "text": t.to_string() }))
            }
            Ok(Message::Ping(_) | Message::Pong(_)) => continue,
            Ok(other) => return json!({ "unexpected": format!("{other:?}") }),
            Err(e) => return json!({ "closed": e.to_string() }),
        }
    }
}

fn read_frame<S: Read + Write>(ws: &mut Ws<S>) -> Vec<u8> {
    loop {
        match ws.read() {
            Ok(Message::Binary(b)) => return b.to_vec(),
            Ok(Message::Ping(_) | Message::Pong(_)) => continue,
            other => panic!("expected a tensor frame, got {other:?}"),
        }
    }
}

fn set_timeout(ws: &mut ClientWs, t: Duration) {
    if let tungstenite::stream::MaybeTlsStream::Plain(s) = ws.get_mut() {
        s.set_read_timeout(Some(t)).unwrap();
    }
}

fn elements(shape: &Value) -> usize {
    shape
        .as_array()
        .expect("shape")
        .iter()
        .map(|d| d.as_u64().unwrap() as usize)
        .product()
}

/// How a fake worker answers a `compute`.
#[derive(Clone, Copy, Debug)]
enum Play {
    /// Zeros of the stage's output shapes.
    Honest,
    /// An output announced with another shape.
    WrongShape,
    /// Text that is not JSON.
    Garbage,
    /// The right header, then a 64 MiB frame.
    Oversized,
    /// The right header, then it hangs up before the frames.
    HangUpMidResult,
    /// An answer for another micro-batch.
    OutOfStep,
    /// The worker's own error: the run fails, the connection stays.
    OwnError,
    /// Never answers (and says when it got the request).
    Silent,
}

/// A worker written here: joins with a hello, then plays its part in a thread.
struct Fake {
    id: String,
    thread: std::thread::JoinHandle<()>,
    got_compute: mpsc::Receiver<()>,
}

fn fake(s: &Server, play: Play) -> Fake {
    let (mut ws, _) = tungstenite::connect(s.ws_request()).expect("the worker socket opens");
    set_timeout(&mut ws, Duration::from_secs(60));
    send_json(
        &mut ws,
        &json!({ "type": "hello", "protocol": PROTOCOL, "name": format!("{play:?}"), "adapters": [], "rates": null }),
    );
    let welcome = read_json(&mut ws);
    assert_eq!(welcome["type"], "welcome", "{welcome}");
    let (tell, got_compute) = mpsc::channel();
    let thread = std::thread::spawn(move || act(ws, play, &tell));
    Fake {
        id: welcome["worker"].as_str().unwrap().to_string(),
        thread,
        got_compute,
    }
}

/// The fake worker's loop: loads are accepted (their frames read), computes answered as
/// `play` says, until the server closes the connection.
fn act(mut ws: ClientWs, play: Play, tell: &mpsc::Sender<()>) {
    let mut outputs: std::collections::HashMap<String, Vec<Value>> = Default::default();
    loop {
        let msg = read_json(&mut ws);
        match msg["type"].as_str() {
            Some("load") => {
                for _ in msg["weights"].as_array().unwrap() {
                    read_frame(&mut ws);
                }
                let plan = &msg["plan"];
                let outs = plan["outputs"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|o| {
                        let v = &plan["values"][o[1].as_u64().unwrap() as usize];
                        json!({ "name": o[0], "shape": v["shape"], "dtype": v["dtype"] })
                    })
                    .collect();
                let job = msg["job"].as_str().unwrap().to_string();
                outputs.insert(job.clone(), outs);
                send_json(&mut ws, &json!({ "type": "loaded", "job": job }));
            }
            Some("compute") => {
                for _ in msg["inputs"].as_array().unwrap() {
                    read_frame(&mut ws);
                }
                let _ = tell.send(());
                let job = msg["job"].as_str().unwrap();
                let m = msg["micro_batch"].as_u64().unwrap();
                let outs = outputs[job].clone();
                let header = |outs: &[Value], m: u64| json!({ "type": "result", "job": job, "micro_batch": m, "outputs": outs, "events": [] });
                let frames = |ws: &mut ClientWs, outs: &[Value]| {
                    for o in outs {
                        let _ =
                            ws.send(Message::Binary(vec![0u8; 4 * elements(&o["shape"])].into()));
                    }
                };
                match play {
                    Play::Honest => {
                        send_json(&mut ws, &header(&outs, m));
                        frames(&mut ws, &outs);
                    }
                    Play::WrongShape => {
                        let mut bad = outs.clone();
                        bad[0]["shape"] = json!([3, 1]);
                        send_json(&mut ws, &header(&bad, m));
                        frames(&mut ws, &bad);
                    }
                    Play::Garbage => {
                        let _ = ws.send(Message::Text("this is not json".into()));
                    }
                    Play::Oversized => {
                        send_json(&mut ws, &header(&outs, m));
                        let _ = ws.send(Message::Binary(vec![0u8; 64 << 20].into()));
                    }
                    Play::HangUpMidResult => {
                        send_json(&mut ws, &header(&outs, m));
                        return;
                    }
                    Play::OutOfStep => {
                        send_json(&mut ws, &header(&outs, m + 7));
                        frames(&mut ws, &outs);
                    }
                    Play::OwnError => send_json(
                        &mut ws,
                        &json!({ "type": "error", "job": job, "error": "out of memory (test)" }),
                    ),
                    Play::Silent => {}
                }
            }
            Some("unload") => {}
            _ => return,
        }
    }
}

/// A two-stage run of the MLP pinned to two workers.
fn pipeline(s: &Server, first: &Fake, second: &Fake) -> String {
    s.run(json!({ "seed_inputs": true, "graph": "mlp", "batch": 4, "microbatches": 2, "stages": 2, "workers": [first.id, second.id] }))
}

#[test]
fn hostile_workers_fail_only_their_run_and_are_dropped_at_once() {
    let s = start(&workspace("hostile"), &[]);
    s.warm();
    let honest = fake(&s, Play::Honest);
    let baseline = s.peak_kib();
    let cases = [
        (
            Play::WrongShape,
            "does not fit the stage: 'probs' is announced as f32 [3, 1]",
        ),
        (Play::Garbage, "sent an unreadable message"),
        (Play::Oversized, "bytes the tensor 'probs' may have"),
        (Play::HangUpMidResult, "disconnected"),
        (Play::OutOfStep, "micro-batch 7 where job"),
        (Play::OwnError, "the worker failed: out of memory (test)"),
    ];
    let mut kept = vec![honest.id.clone()];
    for (play, reason) in cases {
        let hostile = fake(&s, play);
        kept.push(hostile.id.clone());
        s.wait_remote(&kept.iter().map(String::as_str).collect::<Vec<_>>());
        // The honest worker computes stage 0; the hostile one answers stage 1.
        let run = s.wait_run(&pipeline(&s, &honest, &hostile));
        assert_eq!(run["status"], "failed", "{play:?}: {run}");
        let error = run["error"].as_str().unwrap_or_default();
        assert!(
            error.contains(reason) && error.contains(&hostile.id),
            "{play:?}: expected '{reason}' naming {} in: {error}",
            hostile.id
        );
        if !matches!(play, Play::OwnError) {
            // Dropped at once: no zombie registration for later runs.
            kept.pop();
            s.wait_remote(&kept.iter().map(String::as_str).collect::<Vec<_>>());
            hostile.thread.join().unwrap();
        }
        println!("{play:?}: run failed with \"{error}\"");
    }
    // The worker whose own error failed a run is still there and serves the next one.
    let own_error = kept.pop().unwrap();
    let second = fake(&s, Play::Honest);
    kept.extend([own_error.clone(), second.id.clone()]);
    s.wait_remote(&kept.iter().map(String::as_str).collect::<Vec<_>>());
    let run = s.wait_run(&s.run(json!({ "seed_inputs": true, "graph": "mlp", "batch": 4, "microbatches": 2, "stages": 2, "workers": [honest.id, second.id] })));
    assert_eq!(run["status"], "succeeded", "{run}");
    assert!(s.remote().contains(&own_error));
    // Local runs go on.
    let run = s.wait_run(&s.run(json!({ "seed_inputs": true, "graph": "mlp", "batch": 4 })));
    assert_eq!(run["status"], "succeeded", "{run}");
    s.check_peak(baseline);
}

#[test]
fn a_run_waiting_on_a_silent_worker_is_cancelled_within_seconds() {
    let s = start(&workspace("silent"), &[]);
    let honest = fake(&s, Play::Honest);
    let silent = fake(&s, Play::Silent);
    s.wait_remote(&[&honest.id, &silent.id]);
    let id = pipeline(&s, &honest, &silent);
    silent
        .got_compute
        .recv_timeout(Duration::from_secs(60))
        .expect("the silent worker got its request");
    std::thread::sleep(Duration::from_millis(500));
    let asked = Instant::now();
    let (code, r) = s.json("POST", &format!("/api/runs/{id}/cancel"), Some(json!({})));
    assert_eq!(code, 202, "{r}");
    let run = s.wait_run(&id);
    let took = asked.elapsed();
    assert_eq!(run["status"], "cancelled", "{run}");
    assert!(took < Duration::from_secs(3), "cancelling took {took:?}");
    println!("a run waiting on a silent worker was cancelled in {took:?}");
    // The silent worker's late answer would be out of step: it is dropped, the other kept.
    s.wait_remote(&[&honest.id]);
    silent.thread.join().unwrap();
}

#[test]
fn a_thousand_worker_sockets_get_at_most_max_workers_and_idle_ones_are_closed() {
    // All sockets come from one address: the per-client cap is lifted so that the
    // worker cap is what this test meets.
    let s = start(
        &workspace("sockets"),
        &["--max-connections-per-client", "2000"],
    );
    s.warm();
    let baseline = s.peak_kib();
    let mut open = Vec::new();
    let mut refused = 0;
    for _ in 0..1000 {
        match tungstenite::connect(s.ws_request()) {
            Ok((ws, _)) => open.push(ws),
            Err(tungstenite::Error::Http(resp)) => {
                assert_eq!(resp.status(), 503);
                refused += 1;
            }
            Err(e) => panic!("unexpected failure: {e}"),
        }
    }
    assert_eq!(
        (open.len(), refused),
        (64, 936),
        "--max-workers defaults to 64"
    );
    assert!(s.remote().is_empty(), "no socket said hello");
    // Sockets that never say hello are refused and closed after 10 s, giving their
    // slots back.
    std::thread::sleep(Duration::from_secs(11));
    for ws in &mut open {
        set_timeout(ws, Duration::from_secs(5));
        let reply = read_json(ws);
        assert!(
            reply["error"]
                .as_str()
                .is_some_and(|e| e.contains("no hello within 10 s")),
            "{reply}"
        );
    }
    let late = fake(&s, Play::Honest);
    s.wait_remote(&[&late.id]);
    s.check_peak(baseline);
}

#[test]
fn an_oversized_hello_is_refused_without_being_read() {
    let s = start(&workspace("hello"), &[]);
    s.warm();
    let baseline = s.peak_kib();
    let (mut ws, _) = tungstenite::connect(s.ws_request()).unwrap();
    set_timeout(&mut ws, Duration::from_secs(10));
    let hello = format!(
        "{{\"type\":\"hello\",\"protocol\":{PROTOCOL},\"name\":\"{}\",\"adapters\":[]}}",
        "x".repeat(64 << 20)
    );
    // The server stops reading after its 64 KiB; sending the rest may fail.
    let _ = ws.send(Message::Text(hello.into()));
    let reply = read_json(&mut ws);
    if let Some(e) = reply["error"].as_str() {
        assert!(e.contains("sent more than the"), "{reply}");
    }
    assert!(s.remote().is_empty());
    s.check_peak(baseline);
    let honest = fake(&s, Play::Honest);
    s.wait_remote(&[&honest.id]);
}

/// A `sluice worker` process, killed on drop.
struct WorkerProcess {
    child: Child,
    stderr: mpsc::Receiver<String>,
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn worker_process(args: &[&str]) -> WorkerProcess {
    let mut child = sluice()
        .arg("worker")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("sluice worker starts");
    let (tx, stderr) = mpsc::channel();
    let pipe = child.stderr.take().expect("stderr");
    std::thread::spawn(move || {
        for line in BufReader::new(pipe).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    WorkerProcess { child, stderr }
}

impl WorkerProcess {
    /// Waits for a line of its stderr containing `text`.
    fn wait_line(&self, text: &str, within: Duration) -> String {
        let t = Instant::now();
        let mut seen = Vec::new();
        while let Some(left) = within.checked_sub(t.elapsed()) {
            match self.stderr.recv_timeout(left) {
                Ok(line) if line.contains(text) => return line,
                Ok(line) => seen.push(line),
                Err(_) => break,
            }
        }
        panic!("no line with '{text}' from the worker; it said: {seen:#?}");
    }
}

/// A stage plan as the server would send it: the graph bound to batch 2, planned.
fn plan_of(doc: &str) -> Value {
    let graph = sluice_engine::load_graph(doc).expect("graph");
    let bound = sluice_engine::exec::dataset::bind(&graph, 2).expect("bind");
    serde_json::to_value(sluice_engine::plan::Plan::new(&bound).expect("plan")).unwrap()
}

/// x [N, 8] → linear (4) → relu: with every weight 0.5 and x all ones, every output is
/// relu(8 · 0.5 + 0.5) = 4.5.
const SMALL: &str = r#"{
    "format": "sluice/graph@1",
    "inputs": { "x": { "shape": ["N", 8], "dtype": "f32" } },
    "nodes": [
        { "id": "fc", "op": "linear", "inputs": ["x"], "attrs": { "out_features": 4 } },
        { "id": "r", "op": "relu", "inputs": ["fc"] }
    ],
    "outputs": ["r"]
}"#;

fn f32_frame(n: usize, v: f32) -> Message {
    Message::Binary(v.to_le_bytes().repeat(n).into())
}

/// The plan's weights as headers and frames filled with `v`.
fn weights(plan: &Value, v: f32) -> (Vec<Value>, Vec<Message>) {
    plan["params"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let value = &plan["values"][p[1].as_u64().unwrap() as usize];
            (
                json!({ "name": p[0], "shape": value["shape"], "dtype": "f32" }),
                f32_frame(elements(&value["shape"]), v),
            )
        })
        .unzip()
}

/// A hostile server's end of one worker connection.
struct Hostile {
    ws: Ws<TcpStream>,
}

impl Hostile {
    /// Sends a message and its frames; returns the worker's answer.
    fn ask(&mut self, msg: Value, frames: Vec<Message>) -> Value {
        send_json(&mut self.ws, &msg);
        for f in frames {
            self.ws.send(f).unwrap();
        }
        read_json(&mut self.ws)
    }

    fn load(
        &mut self,
        job: &str,
        plan: &Value,
        headers: Vec<Value>,
        frames: Vec<Message>,
    ) -> Value {
        self.ask(
            json!({ "type": "load", "job": job, "plan": plan, "weights": headers, "stage": 0 }),
            frames,
        )
    }

    fn compute(&mut self, job: &str, shape: Value, frame: Message) -> Value {
        self.ask(
            json!({ "type": "compute", "job": job, "micro_batch": 0, "inputs": [{ "name": "x", "shape": shape, "dtype": "f32" }] }),
            vec![frame],
        )
    }
}

fn expect_error(answer: &Value, job: Option<&str>, text: &str) {
    assert_eq!(answer["type"], "error", "{answer}");
    assert_eq!(answer["job"].as_str(), job, "{answer}");
    let e = answer["error"].as_str().unwrap_or_default();
    assert!(e.contains(text), "expected '{text}' in: {e}");
}

#[test]
fn a_worker_answers_a_hostile_server_with_errors_and_keeps_working() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let worker = worker_process(&[
        "--connect",
        &format!("ws://127.0.0.1:{port}"),
        "--max-jobs",
        "2",
        "--max-bytes",
        "2000000",
    ]);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(listener.accept().map(|(tcp, _)| tcp));
    });
    let tcp = rx
        .recv_timeout(Duration::from_secs(120))
        .expect("the worker connects")
        .unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut h = Hostile {
        ws: tungstenite::accept(tcp).expect("a WebSocket handshake"),
    };
    let hello = read_json(&mut h.ws);
    assert_eq!(hello["type"], "hello", "{hello}");
    send_json(&mut h.ws, &json!({ "type": "welcome", "worker": "h1" }));

    // Garbage, stray frames and unknown jobs.
    h.ws.send(Message::Text("garbage".into())).unwrap();
    expect_error(&read_json(&mut h.ws), None, "unreadable message");
    h.ws.send(Message::Binary(vec![1, 2, 3].into())).unwrap();
    expect_error(&read_json(&mut h.ws), None, "no message announced");
    let a = h.compute("nope", json!([2, 8]), f32_frame(16, 1.0));
    expect_error(&a, Some("nope"), "job 'nope' is not loaded here");

    // Plans that are not plans, or lie.
    let small = plan_of(SMALL);
    let (headers, _) = weights(&small, 0.5);
    let zeros = |headers: &[Value]| -> Vec<Message> {
        headers
            .iter()
            .map(|h| f32_frame(elements(&h["shape"]), 0.0))
            .collect()
    };
    let a = h.load(
        "j",
        &json!({ "values": 1 }),
        headers.clone(),
        zeros(&headers),
    );
    expect_error(&a, Some("j"), "the stage plan is not readable");
    let mut lying = small.clone();
    lying["values"][0]["buffer"] = json!(999);
    let a = h.load("j", &lying, headers.clone(), zeros(&headers));
    expect_error(&a, Some("j"), "the stage plan is not valid");
    let mut lying = small.clone();
    let b = lying["values"][0]["buffer"].as_u64().unwrap() as usize;
    lying["buffers"][b] = json!(4);
    let a = h.load("j", &lying, headers.clone(), zeros(&headers));
    expect_error(&a, Some("j"), "does not fit its buffer");
    let mut lying = small.clone();
    let out = lying["outputs"][0][1].as_u64().unwrap() as usize;
    lying["values"][out]["shape"] = json!([2, 5]);
    let a = h.load("j", &lying, headers.clone(), zeros(&headers));
    expect_error(&a, Some("j"), "the stage plan is not valid");
    let mut lying = small.clone();
    lying["buffers"] = json!([u64::MAX, u64::MAX]);
    let a = h.load("j", &lying, headers.clone(), zeros(&headers));
    expect_error(&a, Some("j"), "the stage plan is not valid");

    // Weights that do not match the plan: announced sizes are refused before any frame is
    // taken for them (an exabyte announced, 8 bytes sent).
    let mut huge = headers.clone();
    huge[0]["shape"] = json!([1u64 << 30, 1u64 << 30]);
    let mut frames = zeros(&headers);
    frames[0] = Message::Binary(vec![0; 8].into());
    let a = h.load("j", &small, huge, frames);
    expect_error(&a, Some("j"), "must be f32");
    let a = h.load("j", &small, headers[..1].to_vec(), zeros(&headers[..1]));
    expect_error(&a, Some("j"), "1 stage's weights announced where 2 are due");
    let mut short = zeros(&headers);
    short[0] = Message::Binary(vec![0; 12].into());
    let a = h.load("j", &small, headers.clone(), short);
    expect_error(&a, Some("j"), "not the announced size");

    // A stage over --max-bytes (2 MB): the MLP's weights alone are 2.7 MB.
    let mlp = plan_of(
        &std::fs::read_to_string(sluice_tests::root().join("assets/graphs/mlp.json")).unwrap(),
    );
    let (mlp_headers, mlp_frames) = weights(&mlp, 0.0);
    let a = h.load("big", &mlp, mlp_headers, mlp_frames);
    expect_error(&a, Some("big"), "more than the 2000000 bytes allowed");

    // A good stage loads and computes; wrong inputs are refused, it still computes.
    let (headers, frames) = weights(&small, 0.5);
    let a = h.load("a", &small, headers.clone(), frames);
    assert_eq!(a, json!({ "type": "loaded", "job": "a" }));
    expect_error(
        &h.compute("a", json!([2, 9]), f32_frame(18, 1.0)),
        Some("a"),
        "must be f32 [2, 8]",
    );
    expect_error(
        &h.compute("a", json!([2, 8]), f32_frame(3, 1.0)),
        Some("a"),
        "not the announced size",
    );
    let a = h.compute("a", json!([2, 8]), f32_frame(16, 1.0));
    assert_eq!(a["type"], "result", "{a}");
    assert_eq!(
        a["outputs"],
        json!([{ "name": "r", "shape": [2, 4], "dtype": "f32" }])
    );
    let out = read_frame(&mut h.ws);
    let values: Vec<f32> = out
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    assert_eq!(values, vec![4.5; 8]);

    // At most two stages stay loaded (--max-jobs 2): the least recently used goes.
    for job in ["b", "c"] {
        let (headers, frames) = weights(&small, 0.5);
        assert_eq!(h.load(job, &small, headers, frames)["type"], "loaded");
    }
    expect_error(
        &h.compute("a", json!([2, 8]), f32_frame(16, 1.0)),
        Some("a"),
        "not loaded",
    );
    assert_eq!(
        h.compute("c", json!([2, 8]), f32_frame(16, 1.0))["type"],
        "result"
    );
    read_frame(&mut h.ws);
    send_json(&mut h.ws, &json!({ "type": "unload", "job": "c" }));
    expect_error(
        &h.compute("c", json!([2, 8]), f32_frame(16, 1.0)),
        Some("c"),
        "not loaded",
    );

    let mut worker = worker;
    assert!(
        worker.child.try_wait().unwrap().is_none(),
        "the worker is still running"
    );
}

#[test]
fn worker_addresses_and_cleartext_warnings() {
    let w = worker_process(&["--connect", "ws://127.0.0.1:1", "--tls-ca", "ca.pem"]);
    w.wait_line("--tls-ca needs a wss:// address", Duration::from_secs(30));
    let w = worker_process(&["--connect", "ws://192.0.2.1:9"]);
    w.wait_line("without TLS", Duration::from_secs(30));
    let w = worker_process(&["--connect", "http://127.0.0.1:1"]);
    w.wait_line("is not a ws:// or wss:// address", Duration::from_secs(30));
}

#[test]
fn a_worker_joins_over_wss_trusting_the_servers_own_ca() {
    let data = sluice_tests::root().join("tests/data/tls");
    let (cert, key, ca) = (
        data.join("server.pem"),
        data.join("server.key"),
        data.join("ca.pem"),
    );
    let s = start(
        &workspace("tls"),
        &[
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
        ],
    );
    let port = s
        .url
        .rsplit(':')
        .next()
        .unwrap()
        .trim_end_matches('/')
        .to_string();
    let wss = format!("wss://localhost:{port}");
    let trusted = worker_process(&["--connect", &wss, "--tls-ca", ca.to_str().unwrap()]);
    trusted.wait_line("joined wss://localhost", Duration::from_secs(120));
    // Without the CA the server's certificate is not trusted.
    let untrusted = worker_process(&["--connect", &wss]);
    untrusted.wait_line("certificate", Duration::from_secs(120));
}

/// The commands of `docs/security.md`'s self-signed certificate recipe, a line each
/// (continuation lines joined).
fn certificate_recipe() -> Vec<String> {
    let doc = std::fs::read_to_string(sluice_tests::root().join("docs/security.md"))
        .expect("docs/security.md");
    let (_, after) = doc
        .split_once("A self-signed certificate for a cluster")
        .expect("the recipe's paragraph");
    let (_, block) = after.split_once("```sh\n").expect("the recipe's commands");
    let (block, _) = block.split_once("```").expect("the end of the commands");
    block
        .replace("\\\n", " ")
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect()
}

#[test]
fn the_documented_self_signed_certificate_recipe_lets_a_worker_join_over_wss() {
    // The recipe's exact openssl commands (they used to make an authority's certificate,
    // which rustls refuses from a server), then `sluice serve` and `sluice worker` with
    // the recipe's flags and files; only the address and the token are this test's.
    let which = std::process::Command::new("sh")
        .args(["-c", "command -v openssl"])
        .output()
        .expect("sh runs");
    assert!(
        which.status.success(),
        "this test runs the openssl commands of docs/security.md: install openssl"
    );
    let dir = workspace("recipe-files");
    std::fs::create_dir_all(&dir).unwrap();
    let token = "recipe-token-0123456789abcdef";
    let mut serve: Option<Vec<String>> = None;
    let mut worker: Option<Vec<String>> = None;
    for line in certificate_recipe() {
        let words = || -> Vec<String> {
            line.split_whitespace()
                .skip(2)
                .map(|w| match w.trim_matches('"') {
                    "$SLUICE_TOKEN" => token.to_string(),
                    w if w.ends_with(".crt") || w.ends_with(".key") => {
                        dir.join(w).display().to_string()
                    }
                    w => w.to_string(),
                })
                .collect()
        };
        if line.starts_with("openssl ") {
            let out = std::process::Command::new("sh")
                .arg("-c")
                .arg(&line)
                .current_dir(&dir)
                .output()
                .expect("sh runs");
            assert!(
                out.status.success(),
                "{line}\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        } else if line.starts_with("sluice serve ") {
            serve = Some(words());
        } else if line.starts_with("sluice worker ") {
            worker = Some(words());
        } else {
            panic!("a line of the recipe this test does not know: {line}");
        }
    }
    let (serve, worker) = (serve.expect("a serve line"), worker.expect("a worker line"));
    // The worker's documented address names a host the certificate is for.
    let connect = worker
        .iter()
        .skip_while(|w| *w != "--connect")
        .nth(1)
        .expect("--connect URL")
        .clone();
    let host = connect
        .trim_start_matches("wss://")
        .split(':')
        .next()
        .unwrap()
        .to_string();
    let names = std::process::Command::new("openssl")
        .args(["x509", "-noout", "-ext", "subjectAltName", "-in"])
        .arg(dir.join("server.crt"))
        .output()
        .expect("openssl runs");
    let names = String::from_utf8_lossy(&names.stdout);
    assert!(
        names.contains(&format!("DNS:{host}")),
        "{host} not in {names}"
    );
    // The server on a free loopback port (its other flags as documented).
    let mut args: Vec<&str> = Vec::new();
    let mut it = serve.iter();
    while let Some(w) = it.next() {
        if w == "--addr" {
            it.next();
        } else {
            args.push(w);
        }
    }
    let s = start(&workspace("recipe"), &args);
    let port = s
        .url
        .rsplit(':')
        .next()
        .unwrap()
        .trim_end_matches('/')
        .to_string();
    let wss = format!("wss://localhost:{port}");
    let worker: Vec<&str> = worker
        .iter()
        .map(|w| {
            if *w == connect {
                wss.as_str()
            } else {
                w.as_str()
            }
        })
        .collect();
    let w = worker_process(&worker);
    w.wait_line("joined wss://localhost", Duration::from_secs(120));
}
