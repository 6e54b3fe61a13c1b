//! Hostile peers of the worker protocol, written with raw JSON as an attacker would (not
//! the typed `sluice-api` messages): a fake worker that joins `sluice serve` and answers
//! its requests wrongly (or not at all), and a fake server that `sluice worker` joins and
//! that sends it what no honest server would.
//!
//! Included by the test files with `#[path]`, like `attack.rs`.

#![allow(dead_code)] // Each test file uses its own part of the peers.

use serde_json::{json, Value};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tungstenite::Message;

/// The protocol version tried first; a refusal naming another version is followed.
const PROTOCOL: u64 = 2;

/// How a fake worker misbehaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hostility {
    /// Answers `load`, then sends its output with one more row than the stage computes.
    WrongShape,
    /// Answers `load`, then sends its output as `i32`.
    WrongDtype,
    /// Answers `load`, then sends an output the stage does not have.
    UnknownName,
    /// Answers `load`, then sends an output whose shape overflows.
    OverflowShape,
    /// Answers `load`, then a correct output with events at the end of time.
    EventsAtTheEndOfTime,
    /// Answers `load`, then a result header and no tensor frames, and drops the
    /// connection.
    VanishMidResult,
    /// Never answers anything.
    Silent,
    /// Sends a 20 MB text message right after joining.
    Flood,
}

/// A fake worker joined to a server: its id, and a log of what it did.
pub struct FakeWorker {
    /// The id the server gave it.
    pub id: String,
    stop: Arc<AtomicBool>,
    log: Arc<Mutex<Vec<String>>>,
    thread: Option<JoinHandle<()>>,
}

impl FakeWorker {
    /// What it did, in order.
    pub fn log(&self) -> Vec<String> {
        self.log.lock().map(|l| l.clone()).unwrap_or_default()
    }

    /// Hangs up.
    pub fn stop(mut self) {
        self.halt();
    }

    fn halt(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for FakeWorker {
    fn drop(&mut self) {
        self.halt();
    }
}

type Socket = tungstenite::WebSocket<TcpStream>;

fn hello(protocol: u64) -> Message {
    Message::Text(
        json!({ "type": "hello", "protocol": protocol, "name": "fake", "adapters": [], "rates": null })
            .to_string()
            .into(),
    )
}

/// Reads messages until a text one (or an error).
fn next_text(ws: &mut Socket) -> Result<Value, String> {
    loop {
        match ws.read() {
            Ok(Message::Text(t)) => {
                return serde_json::from_str(&t).map_err(|e| format!("not JSON: {e}"))
            }
            Ok(Message::Close(_)) => return Err("closed".into()),
            Ok(_) => continue,
            Err(e) => return Err(e.to_string()),
        }
    }
}

fn next_binary(ws: &mut Socket) -> Result<Vec<u8>, String> {
    loop {
        match ws.read() {
            Ok(Message::Binary(b)) => return Ok(b.to_vec()),
            Ok(Message::Ping(_) | Message::Pong(_)) => continue,
            Ok(other) => return Err(format!("expected a frame, got {other:?}")),
            Err(e) => return Err(e.to_string()),
        }
    }
}

/// Joins `ws://ADDR/api/workers` as a fake worker that misbehaves as asked.
pub fn fake_worker(
    addr: SocketAddr,
    token: Option<&str>,
    hostility: Hostility,
) -> Result<FakeWorker, String> {
    let mut protocol = PROTOCOL;
    let (mut ws, id) = loop {
        let mut ws = crate::attack::ws_connect(addr, "/api/workers", token, &[])
            .map_err(|(code, e)| format!("upgrade refused ({code}): {e}"))?;
        ws.send(hello(protocol)).map_err(|e| e.to_string())?;
        let reply = next_text(&mut ws)?;
        match reply["type"].as_str() {
            Some("welcome") => break (ws, reply["worker"].as_str().unwrap_or("").to_string()),
            Some("refused") => {
                let error = reply["error"].as_str().unwrap_or("").to_string();
                // "... this server speaks version N": follow it once.
                let spoken = error
                    .rsplit("version ")
                    .next()
                    .and_then(|v| v.trim().parse::<u64>().ok());
                match spoken {
                    Some(v) if v != protocol => protocol = v,
                    _ => return Err(format!("refused: {error}")),
                }
            }
            _ => return Err(format!("unexpected answer to hello: {reply}")),
        }
    };
    let _ = ws
        .get_mut()
        .set_read_timeout(Some(Duration::from_millis(200)));
    let stop = Arc::new(AtomicBool::new(false));
    let log = Arc::new(Mutex::new(vec![format!("joined as {id}")]));
    let (s, l) = (stop.clone(), log.clone());
    let thread = std::thread::spawn(move || behave(ws, hostility, &s, &l));
    Ok(FakeWorker {
        id,
        stop,
        log,
        thread: Some(thread),
    })
}

/// A stage's outputs as its plan lists them: (name, shape, dtype).
fn plan_outputs(plan: &Value) -> Vec<(String, Vec<u64>, String)> {
    plan["outputs"]
        .as_array()
        .map(|outs| {
            outs.iter()
                .filter_map(|o| {
                    let name = o[0].as_str()?.to_string();
                    let v = &plan["values"][o[1].as_u64()? as usize];
                    let shape = v["shape"]
                        .as_array()?
                        .iter()
                        .filter_map(Value::as_u64)
                        .collect();
                    Some((name, shape, v["dtype"].as_str()?.to_string()))
                })
                .collect()
        })
        .unwrap_or_default()
}

fn behave(mut ws: Socket, hostility: Hostility, stop: &AtomicBool, log: &Mutex<Vec<String>>) {
    let note = |s: String| {
        if let Ok(mut l) = log.lock() {
            l.push(s);
        }
    };
    if hostility == Hostility::Flood {
        let text = format!(
            "{{\"type\":\"loaded\",\"job\":\"{}\"}}",
            "j".repeat(20 << 20)
        );
        match ws.send(Message::Text(text.into())) {
            Ok(()) => note("sent a 20 MB message".into()),
            Err(e) => note(format!("the 20 MB message failed: {e}")),
        }
    }
    let mut outputs: std::collections::HashMap<String, Vec<(String, Vec<u64>, String)>> =
        Default::default();
    while !stop.load(Ordering::Relaxed) {
        let msg = match ws.read() {
            Ok(Message::Text(t)) => t.to_string(),
            Ok(Message::Close(_)) => {
                note("the server closed".into());
                return;
            }
            Ok(_) => continue,
            Err(tungstenite::Error::Io(e))
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                continue
            }
            Err(e) => {
                note(format!("connection ended: {e}"));
                return;
            }
        };
        let Ok(v) = serde_json::from_str::<Value>(&msg) else {
            continue;
        };
        let job = v["job"].as_str().unwrap_or("").to_string();
        let frames = match v["type"].as_str() {
            Some("load") => v["weights"].as_array().map_or(0, Vec::len),
            Some("compute") => v["inputs"].as_array().map_or(0, Vec::len),
            _ => 0,
        };
        let _ = ws.get_mut().set_read_timeout(Some(Duration::from_secs(30)));
        for _ in 0..frames {
            if next_binary(&mut ws).is_err() {
                note("a tensor frame did not come".into());
                return;
            }
        }
        let _ = ws
            .get_mut()
            .set_read_timeout(Some(Duration::from_millis(200)));
        note(format!("got {} for {job}", v["type"]));
        if hostility == Hostility::Silent {
            continue;
        }
        match v["type"].as_str() {
            Some("load") => {
                outputs.insert(job.clone(), plan_outputs(&v["plan"]));
                let _ = ws.send(Message::Text(
                    json!({ "type": "loaded", "job": job }).to_string().into(),
                ));
            }
            Some("compute") => {
                let outs = outputs.get(&job).cloned().unwrap_or_default();
                answer_compute(&mut ws, hostility, &job, &v, &outs);
                note(format!("answered compute of {job} ({hostility:?})"));
                if hostility == Hostility::VanishMidResult {
                    let _ = ws.get_mut().shutdown(std::net::Shutdown::Both);
                    return;
                }
            }
            _ => {}
        }
    }
}

fn answer_compute(
    ws: &mut Socket,
    hostility: Hostility,
    job: &str,
    request: &Value,
    outs: &[(String, Vec<u64>, String)],
) {
    let micro_batch = request["micro_batch"].clone();
    let (name, shape, dtype) = outs
        .first()
        .cloned()
        .unwrap_or_else(|| ("out".into(), vec![1], "f32".into()));
    let (headers, frames, events) = match hostility {
        Hostility::WrongShape => {
            let mut s = shape.clone();
            if let Some(d) = s.first_mut() {
                *d += 1;
            }
            let n: u64 = s.iter().product();
            (
                json!([{ "name": name, "shape": s, "dtype": dtype }]),
                vec![vec![0u8; n as usize * 4]],
                json!([]),
            )
        }
        Hostility::WrongDtype => {
            let n: u64 = shape.iter().product();
            (
                json!([{ "name": name, "shape": shape, "dtype": "i32" }]),
                vec![vec![0u8; n as usize * 4]],
                json!([]),
            )
        }
        Hostility::UnknownName => (
            json!([{ "name": "../../etc/passwd", "shape": [1], "dtype": "f32" }]),
            vec![vec![0u8; 4]],
            json!([]),
        ),
        Hostility::OverflowShape => (
            json!([{ "name": name, "shape": [1u64 << 63, 4], "dtype": dtype }]),
            vec![vec![0u8; 16]],
            json!([]),
        ),
        Hostility::EventsAtTheEndOfTime => {
            let n: u64 = shape.iter().product();
            (
                json!([{ "name": name, "shape": shape, "dtype": dtype }]),
                vec![vec![0u8; n as usize * 4]],
                json!([{
                    "run": "x", "device": usize::MAX, "stage": usize::MAX,
                    "micro_batch": usize::MAX, "node": "n", "kind": "compute",
                    "start_ns": u64::MAX, "end_ns": u64::MAX
                }]),
            )
        }
        Hostility::VanishMidResult => (
            json!([{ "name": name, "shape": shape, "dtype": dtype }]),
            Vec::new(),
            json!([]),
        ),
        Hostility::Silent | Hostility::Flood => return,
    };
    let header = json!({
        "type": "result", "job": job, "micro_batch": micro_batch,
        "outputs": headers, "events": events
    });
    if ws.send(Message::Text(header.to_string().into())).is_err() {
        return;
    }
    for f in frames {
        if ws.send(Message::Binary(f.into())).is_err() {
            return;
        }
    }
}

/// A fake server `sluice worker` joins: it accepts connections on a loopback port and
/// hands each, after the worker's hello, to the test.
pub struct FakeServer {
    listener: TcpListener,
    /// Where it listens.
    pub addr: SocketAddr,
}

/// One worker connection to the fake server.
pub struct Joined {
    ws: Socket,
    /// The worker's hello.
    pub hello: Value,
}

impl FakeServer {
    /// Listens on a free loopback port.
    pub fn new() -> FakeServer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        let addr = listener.local_addr().expect("its address");
        listener
            .set_nonblocking(true)
            .expect("a non-blocking listener");
        FakeServer { listener, addr }
    }

    /// Waits (at most `timeout`) for a worker to connect and say hello; welcomes it.
    pub fn accept(&self, timeout: Duration) -> Result<Joined, String> {
        let t = Instant::now();
        let stream = loop {
            match self.listener.accept() {
                Ok((s, _)) => break s,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if t.elapsed() > timeout {
                        return Err(format!(
                            "no worker connected within {:.0} s",
                            timeout.as_secs_f64()
                        ));
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(e) => return Err(e.to_string()),
            }
        };
        stream.set_nonblocking(false).map_err(|e| e.to_string())?;
        stream
            .set_read_timeout(Some(Duration::from_secs(60)))
            .map_err(|e| e.to_string())?;
        let mut ws = tungstenite::accept(stream).map_err(|e| e.to_string())?;
        let hello = next_text(&mut ws)?;
        ws.send(Message::Text(
            json!({ "type": "welcome", "worker": "w1" })
                .to_string()
                .into(),
        ))
        .map_err(|e| e.to_string())?;
        Ok(Joined { ws, hello })
    }
}

impl Joined {
    /// Sends a control message and the frames after it.
    pub fn send(&mut self, message: &Value, frames: &[Vec<u8>]) -> Result<(), String> {
        self.send_text(&message.to_string())?;
        for f in frames {
            self.ws
                .send(Message::Binary(f.clone().into()))
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// Sends a text frame as is.
    pub fn send_text(&mut self, text: &str) -> Result<(), String> {
        self.ws
            .send(Message::Text(text.to_string().into()))
            .map_err(|e| e.to_string())
    }

    /// Sends a binary frame as is.
    pub fn send_binary(&mut self, bytes: Vec<u8>) -> Result<(), String> {
        self.ws
            .send(Message::Binary(bytes.into()))
            .map_err(|e| e.to_string())
    }

    /// The worker's next control message (its frames skipped).
    pub fn reply(&mut self) -> Result<Value, String> {
        next_text(&mut self.ws)
    }

    /// Closes the connection.
    pub fn close(mut self) {
        let _ = self.ws.close(None);
        let _ = self.ws.flush();
    }
}
