//! The harness of the hostile tests (`adversarial.rs`, `crash.rs` and the soak): real
//! `sluice` processes watched from `/proc` (peak memory, open descriptors, a memory guard
//! that kills a runaway process before it takes the machine), a raw HTTP/1.1 client that
//! sends exactly the bytes and headers a case asks for, WebSockets with chosen headers,
//! and the table of cases every class prints.
//!
//! Included by the test files with `#[path]` (the support library's `lib.rs` is shared
//! with the other tests and stays as it is).

#![allow(dead_code)] // Each test file uses its own part of the harness.

use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A process whose resident memory passes this (1.5 GiB) is killed by the guard (and the case that
/// caused it fails): the machine is shared, and a server growing to gigabytes must not
/// take it down before the suite can say so.
pub const MEMORY_GUARD_BYTES: u64 = 3 << 29;

/// How long one request may take before the case counts as a hang.
pub const HANG_GUARD: Duration = Duration::from_secs(60);

/// A figure of `/proc/PID/status` in bytes (`VmHWM`, `VmRSS`), if the process exists.
pub fn proc_status_bytes(pid: u32, key: &str) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = text.lines().find(|l| l.starts_with(key))?;
    let kib: u64 = line
        .trim_start_matches(key)
        .trim_start_matches(':')
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(kib * 1024)
}

/// Open descriptors of a process (`/proc/PID/fd`).
pub fn open_fds(pid: u32) -> Option<usize> {
    Some(std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count())
}

/// Mebibytes, for tables.
pub fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1 << 20) as f64
}

/// Watches a process's resident memory every 50 ms, keeping its peak, and kills it
/// (SIGKILL) when it passes [`MEMORY_GUARD_BYTES`].
pub struct MemoryGuard {
    stop: Arc<AtomicBool>,
    peak: Arc<AtomicU64>,
    tripped: Arc<AtomicBool>,
}

impl MemoryGuard {
    /// Starts watching `pid`.
    pub fn watch(pid: u32) -> MemoryGuard {
        let stop = Arc::new(AtomicBool::new(false));
        let peak = Arc::new(AtomicU64::new(0));
        let tripped = Arc::new(AtomicBool::new(false));
        let (s, p, t) = (stop.clone(), peak.clone(), tripped.clone());
        std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let Some(rss) = proc_status_bytes(pid, "VmRSS") else {
                    return;
                };
                p.fetch_max(rss, Ordering::Relaxed);
                if let Some(hwm) = proc_status_bytes(pid, "VmHWM") {
                    p.fetch_max(hwm, Ordering::Relaxed);
                }
                if rss > MEMORY_GUARD_BYTES {
                    t.store(true, Ordering::Relaxed);
                    let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        MemoryGuard {
            stop,
            peak,
            tripped,
        }
    }

    /// The highest resident memory seen (`VmHWM` included), in bytes.
    pub fn peak(&self) -> u64 {
        self.peak.load(Ordering::Relaxed)
    }

    /// Whether the guard killed the process.
    pub fn tripped(&self) -> bool {
        self.tripped.load(Ordering::Relaxed)
    }
}

impl Drop for MemoryGuard {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// How a process ended, in words (`exit 1`, `killed by signal 6 (SIGABRT)`).
pub fn describe_exit(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => format!("exit {c}"),
        (None, Some(s)) => format!("killed by signal {s} ({})", signal_name(s)),
        _ => "ended".into(),
    }
}

fn signal_name(s: i32) -> &'static str {
    match s {
        6 => "SIGABRT",
        9 => "SIGKILL",
        11 => "SIGSEGV",
        13 => "SIGPIPE",
        15 => "SIGTERM",
        _ => "signal",
    }
}

/// A fresh folder under the temp dir, empty.
pub fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("sluice-attack-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("scratch folder");
    d
}

// ---------------------------------------------------------------------------------------
// Raw HTTP.

/// An HTTP request, sent as exactly these bytes: the server's `Host` and token are added
/// unless the case sets or removes them.
#[derive(Debug, Clone)]
pub struct Req {
    /// Method.
    pub method: String,
    /// Path and query, sent as is (no normalisation).
    pub path: String,
    /// Headers, in order; `None` values remove a default header.
    pub headers: Vec<(String, Option<String>)>,
    /// The body (a `Content-Length` is sent when there is one, or for POST and PUT).
    pub body: Option<Vec<u8>>,
}

impl Req {
    /// A request without a body.
    pub fn new(method: &str, path: &str) -> Req {
        Req {
            method: method.into(),
            path: path.into(),
            headers: Vec::new(),
            body: None,
        }
    }

    /// `GET path`.
    pub fn get(path: &str) -> Req {
        Req::new("GET", path)
    }

    /// `method path` with a JSON body (`Content-Type: application/json`).
    pub fn json(method: &str, path: &str, body: &Value) -> Req {
        Req::raw_json(method, path, body.to_string().into_bytes())
    }

    /// `method path` with these bytes as a JSON body.
    pub fn raw_json(method: &str, path: &str, body: Vec<u8>) -> Req {
        Req::new(method, path)
            .header("Content-Type", "application/json")
            .body(body)
    }

    /// Adds (or replaces) a header.
    pub fn header(mut self, name: &str, value: &str) -> Req {
        self.headers.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
        self.headers.push((name.into(), Some(value.into())));
        self
    }

    /// Removes a header the client would otherwise send (`Host`, `Authorization`,
    /// `Content-Type`).
    pub fn without(mut self, name: &str) -> Req {
        self.headers.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
        self.headers.push((name.into(), None));
        self
    }

    /// Sets the body.
    pub fn body(mut self, body: Vec<u8>) -> Req {
        self.body = Some(body);
        self
    }

    fn has(&self, name: &str) -> bool {
        self.headers
            .iter()
            .any(|(n, _)| n.eq_ignore_ascii_case(name))
    }

    /// The request's bytes, with `host` and `token` as defaults.
    pub fn bytes(&self, host: &str, token: Option<&str>) -> Vec<u8> {
        let mut head = format!("{} {} HTTP/1.1\r\n", self.method, self.path);
        if !self.has("Host") {
            head.push_str(&format!("Host: {host}\r\n"));
        }
        if let (Some(t), false) = (token, self.has("Authorization")) {
            head.push_str(&format!("Authorization: Bearer {t}\r\n"));
        }
        if !self.has("Connection") {
            head.push_str("Connection: close\r\n");
        }
        for (n, v) in &self.headers {
            if let Some(v) = v {
                head.push_str(&format!("{n}: {v}\r\n"));
            }
        }
        let needs_length = self.body.is_some() || matches!(self.method.as_str(), "POST" | "PUT");
        if needs_length && !self.has("Content-Length") {
            head.push_str(&format!(
                "Content-Length: {}\r\n",
                self.body.as_ref().map_or(0, Vec::len)
            ));
        }
        head.push_str("\r\n");
        let mut out = head.into_bytes();
        if let Some(b) = &self.body {
            out.extend_from_slice(b);
        }
        out
    }

    /// A one-line description for tables (method, path, headers set, body size).
    pub fn describe(&self) -> String {
        let mut s = format!("{} {}", self.method, short(&self.path, 60));
        for (n, v) in &self.headers {
            match v {
                Some(v) if !n.eq_ignore_ascii_case("Content-Type") || v != "application/json" => {
                    s.push_str(&format!(" [{n}: {}]", short(v, 40)))
                }
                Some(_) => {}
                None => s.push_str(&format!(" [no {n}]")),
            }
        }
        if let Some(b) = &self.body {
            s.push_str(&format!(" ({} B)", b.len()));
        }
        s
    }
}

/// At most `n` characters of a text, control characters shown as `·`, with `…` when
/// cut.
pub fn short(s: &str, n: usize) -> String {
    let mut t: String = s
        .chars()
        .take(n)
        .map(|c| if c.is_control() { '·' } else { c })
        .collect();
    if s.chars().count() > n {
        t.push('…');
    }
    t
}

/// An HTTP response.
#[derive(Debug, Clone)]
pub struct Reply {
    /// Status code.
    pub status: u16,
    /// Headers, names lower-cased.
    pub headers: Vec<(String, String)>,
    /// The body (chunked bodies decoded).
    pub body: Vec<u8>,
}

impl Reply {
    /// The body as text (lossy).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body as JSON (`null` when it is not JSON).
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }

    /// A header's value.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Sends raw bytes and reads one response (the request asks the server to close).
pub fn exchange(addr: SocketAddr, bytes: &[u8], timeout: Duration) -> std::io::Result<Reply> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(10))?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    // A server may answer (413, 415) and close before reading a large body: the answer
    // still counts, so a failed write is not the end.
    let write = s.write_all(bytes);
    let reply = read_reply(&mut s);
    match (reply, write) {
        (Ok(r), _) => Ok(r),
        (Err(e), Ok(())) => Err(e),
        (Err(_), Err(w)) => Err(w),
    }
}

/// Reads one HTTP response from a stream.
pub fn read_reply(s: &mut TcpStream) -> std::io::Result<Reply> {
    let mut r = BufReader::new(s);
    let mut line = String::new();
    r.read_line(&mut line)?;
    if line.is_empty() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "the server closed the connection without answering",
        ));
    }
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("bad status line {line:?}"),
            )
        })?;
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        if r.read_line(&mut h)? == 0 {
            break;
        }
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        if let Some((n, v)) = h.split_once(':') {
            headers.push((n.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
    }
    let find = |n: &str| headers.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
    let mut body = Vec::new();
    if find("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
        loop {
            let mut size = String::new();
            r.read_line(&mut size)?;
            let n = usize::from_str_radix(size.trim().split(';').next().unwrap_or(""), 16)
                .map_err(|_| std::io::Error::other(format!("bad chunk size {size:?}")))?;
            if n == 0 {
                break;
            }
            let start = body.len();
            body.resize(start + n, 0);
            r.read_exact(&mut body[start..])?;
            let mut crlf = [0u8; 2];
            r.read_exact(&mut crlf)?;
        }
    } else if let Some(n) = find("content-length").and_then(|v| v.parse::<usize>().ok()) {
        body.resize(n, 0);
        r.read_exact(&mut body)?;
    } else if status != 101 && status != 204 && status != 304 {
        r.read_to_end(&mut body)?;
    }
    Ok(Reply {
        status,
        headers,
        body,
    })
}

// ---------------------------------------------------------------------------------------
// Processes.

/// Output of a command that ran to its end (or was stopped by the hang guard).
#[derive(Debug)]
pub struct Finished {
    /// How it ended (None: killed by the hang guard).
    pub status: Option<ExitStatus>,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
    /// Peak resident memory.
    pub peak: u64,
    /// Whether the memory guard killed it.
    pub memory_guard: bool,
    /// Wall time.
    pub elapsed: Duration,
}

impl Finished {
    /// `exit N`, `killed by signal S`, or `hung`.
    pub fn describe(&self) -> String {
        match (self.status, self.memory_guard) {
            (_, true) => format!("killed by the memory guard at {:.0} MiB", mib(self.peak)),
            (Some(s), _) => describe_exit(s),
            (None, _) => format!("hung (stopped after {:.0} s)", self.elapsed.as_secs_f64()),
        }
    }

    /// The exit code, if it exited.
    pub fn code(&self) -> Option<i32> {
        self.status.and_then(|s| s.code())
    }
}

/// Runs a command to its end with the hang guard and the memory guard, its output going
/// to files (a chatty process cannot block on a full pipe).
pub fn run_guarded(mut cmd: Command, timeout: Duration) -> Finished {
    let dir = scratch(&format!(
        "cmd-{}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    ));
    let (out, err) = (dir.join("stdout"), dir.join("stderr"));
    let started = Instant::now();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).expect("stdout file"))
        .stderr(std::fs::File::create(&err).expect("stderr file"))
        .spawn()
        .expect("the command starts");
    let guard = MemoryGuard::watch(child.id());
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break Some(s),
            Ok(None) if started.elapsed() > timeout => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(_) => break None,
        }
    };
    let finished = Finished {
        status,
        stdout: std::fs::read_to_string(&out).unwrap_or_default(),
        stderr: std::fs::read_to_string(&err).unwrap_or_default(),
        peak: guard.peak(),
        memory_guard: guard.tripped(),
        elapsed: started.elapsed(),
    };
    let _ = std::fs::remove_dir_all(&dir);
    finished
}

/// A running `sluice serve`, killed on drop; restarted on the same workspace when a case
/// killed it, so the cases after it still report.
pub struct Server {
    child: Child,
    guard: MemoryGuard,
    /// Where it listens.
    pub addr: SocketAddr,
    /// `http://ADDR`.
    pub url: String,
    /// Its token, sent with every request unless a case removes it.
    pub token: Option<String>,
    /// Its workspace.
    pub workspace: PathBuf,
    /// Its log (stderr).
    pub log: PathBuf,
    args: Vec<String>,
    /// Peak memory of earlier lives (before a restart).
    earlier_peak: u64,
    /// Each death a case caused, described.
    pub deaths: Vec<String>,
}

/// Why a server could not start.
#[derive(Debug)]
pub struct StartError(pub String);

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

fn spawn_server(
    workspace: &Path,
    log: &Path,
    token: Option<&str>,
    args: &[String],
) -> Result<(Child, SocketAddr), StartError> {
    let mut cmd = sluice_tests::sluice();
    cmd.arg("serve");
    if !args.iter().any(|a| a == "--addr") {
        cmd.args(["--addr", "127.0.0.1:0"]);
    }
    cmd.arg("--workspace").arg(workspace).args(args);
    if let Some(t) = token {
        cmd.args(["--token", t]);
    }
    let log_file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(|e| StartError(format!("log {}: {e}", log.display())))?;
    let mut child = cmd
        .env_remove("SLUICE_TOKEN")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log_file)
        .spawn()
        .map_err(|e| StartError(format!("cannot start sluice serve: {e}")))?;
    let stdout = child.stdout.take().expect("piped stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut r = BufReader::new(stdout);
        let mut line = String::new();
        let _ = r.read_line(&mut line);
        let _ = tx.send(line);
        // Keep draining, so the server never blocks on a full pipe.
        let _ = std::io::copy(&mut r, &mut std::io::sink());
    });
    let line = rx
        .recv_timeout(Duration::from_secs(120))
        .unwrap_or_default();
    let url = line
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .map(str::to_string);
    let Some(url) = url else {
        let _ = child.kill();
        let status = child.wait().map(describe_exit).unwrap_or_default();
        let stderr = std::fs::read_to_string(log).unwrap_or_default();
        return Err(StartError(format!(
            "sluice serve {} did not start ({status}): {}",
            args.join(" "),
            short(stderr.trim(), 400)
        )));
    };
    let addr = url
        .trim_start_matches("http://")
        .parse()
        .map_err(|e| StartError(format!("bad address in {url}: {e}")))?;
    Ok((child, addr))
}

impl Server {
    /// Starts `sluice serve` on a new workspace named `name`, with a token (or none) and
    /// extra arguments (`--addr 127.0.0.1:0` unless given).
    pub fn start(name: &str, token: Option<&str>, args: &[&str]) -> Result<Server, StartError> {
        let dir = scratch(name);
        Server::start_in(&dir.join("workspace"), &dir.join("server.log"), token, args)
    }

    /// Starts `sluice serve` on an existing (or new) workspace.
    pub fn start_in(
        workspace: &Path,
        log: &Path,
        token: Option<&str>,
        args: &[&str],
    ) -> Result<Server, StartError> {
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        let (child, addr) = spawn_server(workspace, log, token, &args)?;
        Ok(Server {
            guard: MemoryGuard::watch(child.id()),
            child,
            addr,
            url: format!("http://{addr}"),
            token: token.map(str::to_string),
            workspace: workspace.to_path_buf(),
            log: log.to_path_buf(),
            args,
            earlier_peak: 0,
            deaths: Vec::new(),
        })
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `HOST:PORT` as clients name it.
    pub fn host(&self) -> String {
        self.addr.to_string()
    }

    /// Sends a request (the server's `Host` and token added unless the request sets them).
    pub fn send(&self, req: &Req) -> std::io::Result<Reply> {
        self.send_within(req, HANG_GUARD)
    }

    /// [`Server::send`] with another hang guard.
    pub fn send_within(&self, req: &Req, timeout: Duration) -> std::io::Result<Reply> {
        exchange(
            self.addr,
            &req.bytes(&self.host(), self.token.as_deref()),
            timeout,
        )
    }

    /// `GET path`, panicking on a transport error.
    pub fn get(&self, path: &str) -> Reply {
        self.send(&Req::get(path))
            .unwrap_or_else(|e| panic!("GET {path}: {e}"))
    }

    /// A JSON request, panicking on a transport error.
    pub fn json(&self, method: &str, path: &str, body: &Value) -> Reply {
        self.send(&Req::json(method, path, body))
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
    }

    /// Whether the process is running and answers `GET /api/ops` with 200 in time.
    pub fn answers(&mut self) -> Result<(), String> {
        if let Ok(Some(status)) = self.child.try_wait() {
            return Err(format!("the server died ({})", self.death(status)));
        }
        match self.send_within(&Req::get("/api/ops"), Duration::from_secs(30)) {
            Ok(r) if r.status == 200 => Ok(()),
            Ok(r) => Err(format!("GET /api/ops answered {}", r.status)),
            Err(e) => match self.child.try_wait() {
                Ok(Some(status)) => Err(format!("the server died ({})", self.death(status))),
                _ => Err(format!("GET /api/ops failed: {e}")),
            },
        }
    }

    fn death(&self, status: ExitStatus) -> String {
        if self.guard.tripped() {
            return format!(
                "killed by the memory guard at {:.0} MiB",
                mib(self.guard.peak())
            );
        }
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(3).collect();
        format!(
            "{}; log: {}",
            describe_exit(status),
            short(&tail.into_iter().rev().collect::<Vec<_>>().join(" | "), 300)
        )
    }

    /// Checks the server still answers; if a case killed it, records why and starts it
    /// again on the same workspace. Returns what went wrong.
    pub fn check_alive(&mut self) -> Result<(), String> {
        let e = match self.answers() {
            Ok(()) => return Ok(()),
            Err(e) => e,
        };
        self.deaths.push(e.clone());
        self.restart();
        Err(e)
    }

    /// Kills the server (SIGKILL) and waits for it.
    pub fn kill(&mut self) {
        self.earlier_peak = self.earlier_peak.max(self.peak_memory());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Kills the server if it still runs and starts it again on the same workspace.
    pub fn restart(&mut self) {
        self.kill();
        let (args, token) = (self.args.clone(), self.token.clone());
        match spawn_server(&self.workspace, &self.log, token.as_deref(), &args) {
            Ok((child, addr)) => {
                self.guard = MemoryGuard::watch(child.id());
                self.child = child;
                self.addr = addr;
                self.url = format!("http://{addr}");
            }
            Err(e) => panic!("cannot restart the server: {e}"),
        }
    }

    /// Peak resident memory (`VmHWM`) over every life of the server, in bytes.
    pub fn peak_memory(&self) -> u64 {
        let now = proc_status_bytes(self.pid(), "VmHWM").unwrap_or(0);
        now.max(self.guard.peak()).max(self.earlier_peak)
    }

    /// Current resident memory in bytes.
    pub fn rss(&self) -> u64 {
        proc_status_bytes(self.pid(), "VmRSS").unwrap_or(0)
    }

    /// Open descriptors now.
    pub fn fds(&self) -> usize {
        open_fds(self.pid()).unwrap_or(0)
    }

    /// Whether the process has exited, and how.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Polls a run until it ends (or `timeout`), returning its record.
    pub fn wait_run(&self, id: &str, timeout: Duration) -> Result<Value, String> {
        let t = Instant::now();
        loop {
            let r = self
                .send(&Req::get(&format!("/api/runs/{id}")))
                .map_err(|e| format!("GET run {id}: {e}"))?;
            let v = r.json();
            if r.status != 200 {
                return Err(format!(
                    "GET run {id}: {} {}",
                    r.status,
                    short(&r.text(), 200)
                ));
            }
            if !matches!(v["status"].as_str(), Some("queued") | Some("running")) {
                return Ok(v);
            }
            if t.elapsed() > timeout {
                return Err(format!(
                    "run {id} still {} after {:.0} s",
                    v["status"],
                    timeout.as_secs_f64()
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// A WebSocket to `path` with extra headers; `Err` holds the refusal's status (0 when
    /// the connection failed) and text.
    pub fn ws(&self, path: &str, headers: &[(&str, &str)]) -> Result<WebSocket, (u16, String)> {
        ws_connect(self.addr, path, self.token.as_deref(), headers)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A client WebSocket over a plain TCP stream.
pub type WebSocket = tungstenite::WebSocket<TcpStream>;

/// Opens a WebSocket to `ws://ADDR/path`, with the token (unless the headers carry an
/// `Authorization`) and the headers given (which replace the defaults, `Host` included).
pub fn ws_connect(
    addr: SocketAddr,
    path: &str,
    token: Option<&str>,
    headers: &[(&str, &str)],
) -> Result<WebSocket, (u16, String)> {
    use tungstenite::client::IntoClientRequest;
    let mut req = format!("ws://{addr}{path}")
        .into_client_request()
        .map_err(|e| (0, e.to_string()))?;
    if let Some(t) = token {
        if !headers
            .iter()
            .any(|(n, _)| n.eq_ignore_ascii_case("Authorization"))
        {
            req.headers_mut().insert(
                "Authorization",
                format!("Bearer {t}")
                    .parse()
                    .map_err(|_| (0, "token".into()))?,
            );
        }
    }
    for (n, v) in headers {
        let name: tungstenite::http::HeaderName =
            n.parse().map_err(|_| (0, format!("header {n}")))?;
        req.headers_mut()
            .insert(name, v.parse().map_err(|_| (0, format!("value {v}")))?);
    }
    let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(10))
        .map_err(|e| (0, e.to_string()))?;
    let _ = stream.set_read_timeout(Some(HANG_GUARD));
    match tungstenite::client(req, stream) {
        Ok((socket, _)) => Ok(socket),
        Err(tungstenite::HandshakeError::Failure(tungstenite::Error::Http(resp))) => {
            let status = resp.status().as_u16();
            let body = resp
                .body()
                .as_ref()
                .map(|b| String::from_utf8_lossy(b).into_owned())
                .unwrap_or_default();
            Err((status, body))
        }
        Err(e) => Err((0, e.to_string())),
    }
}

// ---------------------------------------------------------------------------------------
// The table of cases.

/// One case's line.
#[derive(Debug, Clone)]
pub struct Row {
    /// The case.
    pub case: String,
    /// What was sent.
    pub input: String,
    /// What was expected.
    pub expected: String,
    /// What happened.
    pub got: String,
    /// Whether it met the expectation (the server answering afterwards included).
    pub ok: bool,
}

/// The cases of one class, printed as a table.
pub struct Table {
    /// The class.
    pub class: &'static str,
    /// Its cases so far.
    pub rows: Vec<Row>,
}

impl Table {
    /// An empty table.
    pub fn new(class: &'static str) -> Table {
        Table {
            class,
            rows: Vec::new(),
        }
    }

    /// Adds a case's line.
    pub fn row(&mut self, case: &str, input: &str, expected: &str, got: &str, ok: bool) {
        self.rows.push(Row {
            case: case.into(),
            input: input.into(),
            expected: expected.into(),
            got: got.into(),
            ok,
        });
    }

    /// Prints the table and returns the failed cases' lines.
    pub fn print(&self) -> Vec<String> {
        println!(
            "\n== class: {} ({} cases) ==\n{:<4} {:<34} | {:<46} | {:<34} | got",
            self.class,
            self.rows.len(),
            "ok",
            "case",
            "input",
            "expected",
        );
        let mut failed = Vec::new();
        for r in &self.rows {
            println!(
                "{:<4} {:<34} | {:<46} | {:<34} | {}",
                if r.ok { "ok" } else { "FAIL" },
                short(&r.case, 34),
                short(&r.input, 46),
                short(&r.expected, 34),
                short(&r.got, 200)
            );
            if !r.ok {
                failed.push(format!(
                    "[{}] {}: expected {}, got {}",
                    self.class, r.case, r.expected, r.got
                ));
            }
        }
        failed
    }
}

/// What a case expects of an HTTP answer.
#[derive(Debug, Clone)]
pub struct Expect {
    /// Acceptable statuses.
    pub statuses: Vec<u16>,
    /// A fragment the body must contain (case-insensitive; empty: any body).
    pub fragment: String,
}

impl Expect {
    /// One status and a fragment of the body.
    pub fn status(code: u16, fragment: &str) -> Expect {
        Expect {
            statuses: vec![code],
            fragment: fragment.into(),
        }
    }

    /// Any of some statuses, and a fragment.
    pub fn any(codes: &[u16], fragment: &str) -> Expect {
        Expect {
            statuses: codes.to_vec(),
            fragment: fragment.into(),
        }
    }

    /// The expectation in words.
    pub fn describe(&self) -> String {
        let codes: Vec<String> = self.statuses.iter().map(u16::to_string).collect();
        if self.fragment.is_empty() {
            codes.join("|")
        } else {
            format!("{} \"{}\"", codes.join("|"), self.fragment)
        }
    }

    /// Judges an answer: (what happened, whether it is what was expected). A body that
    /// names one of `secrets` (absolute server paths) never is.
    pub fn judge(&self, reply: &std::io::Result<Reply>, secrets: &[String]) -> (String, bool) {
        match reply {
            Err(e) => (format!("no answer: {e}"), false),
            Ok(r) => {
                let text = r.text();
                let got = format!("{} {}", r.status, short(text.trim(), 160));
                if let Some(s) = secrets
                    .iter()
                    .find(|s| !s.is_empty() && text.contains(s.as_str()))
                {
                    return (format!("{got} (leaks the server path {s})"), false);
                }
                let ok = self.statuses.contains(&r.status)
                    && text.to_lowercase().contains(&self.fragment.to_lowercase());
                (got, ok)
            }
        }
    }
}
