//! The adversarial suite: hostile inputs in the eight classes of the hardening issue —
//! signals, sizes, arithmetic, the async runtime, paths, authentication and origin,
//! workers, durability — sent to real `sluice serve`, CLI and `sluice worker` processes.
//!
//! Every case sends its input, checks the expected status (or exit code) and a fragment
//! of the answer, then checks that the server still answers (a server a case killed is
//! restarted, so the cases after it still report). Every error body is also checked for
//! absolute server paths. Each class prints a table (case, input, expected, got) and
//! checks the peak memory (`VmHWM`) of every process it started against
//! [`MEMORY_BOUND`]; a memory guard kills any process passing 3 GiB first.
//!
//! The HTTP contract the cases expect (status codes, the token on every route but the
//! editor's files, Host/Origin/Content-Type checks, listener limits) is the hardening
//! issue's; `docs/security.md` lists the limits. The soak (`cargo xtask soak`) is the
//! ignored test at the end: the same classes mixed with valid traffic from 20 clients.

#[path = "support/attack.rs"]
mod attack;
#[path = "support/hostile.rs"]
mod hostile;
#[path = "support/peers.rs"]
mod peers;
#[path = "support/soak.rs"]
mod soak;

use attack::{mib, run_guarded, short, Expect, Req, Server, Table};
use hostile::*;
use peers::Hostility;
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

/// The stated bound on the peak resident memory (`VmHWM`) of every process a class
/// starts: servers, workers and CLI runs.
const MEMORY_BOUND: u64 = 1 << 30;

/// The token of the token-protected servers.
const TOKEN: &str = "hostile-suite-token";

/// How long a CLI case may run.
const CLI_TIMEOUT: Duration = Duration::from_secs(120);

/// A run of a graph document (inline) at a batch size.
fn run_body(graph: Value, batch: u64) -> Value {
    json!({ "seed_inputs": true, "graph": graph, "batch": batch })
}

/// A repository file.
fn asset(path: &str) -> PathBuf {
    sluice_tests::root().join(path)
}

/// Writes a file in a folder and returns its path.
fn put_file(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).expect("a scratch file");
    p
}

/// An argument as tables show it: files of the repository and of the scratch folders by
/// their names (`x=/tmp/.../lie.npy` as `x=lie.npy`), everything else as is.
fn shown_arg(arg: &str) -> String {
    let (prefix, path) = match arg.split_once('=') {
        Some((name, path)) => (format!("{name}="), path),
        None => (String::new(), arg),
    };
    let ours = [std::env::temp_dir(), sluice_tests::root()]
        .iter()
        .any(|d| path.starts_with(&*d.to_string_lossy()));
    match Path::new(path).file_name() {
        Some(n) if ours => format!("{prefix}{}", n.to_string_lossy()),
        _ => arg.to_string(),
    }
}

/// One class of cases: its table, the paths no error body may show, and the peak memory
/// of the processes it ran outside servers.
struct Class {
    table: Table,
    secrets: Vec<String>,
}

impl Class {
    fn new(name: &'static str) -> Class {
        let mut secrets = vec![std::env::temp_dir()
            .join("sluice-attack-")
            .display()
            .to_string()];
        if let Ok(root) = sluice_tests::root().canonicalize() {
            secrets.push(root.display().to_string());
        }
        Class {
            table: Table::new(name),
            secrets,
        }
    }

    /// Starts a server for the class; a server that cannot start (a flag the build does
    /// not know yet) is a failed line, and the cases needing it are left out.
    fn server(&mut self, name: &str, token: Option<&str>, args: &[&str]) -> Option<Server> {
        match Server::start(&format!("{}-{name}", self.table.class), token, args) {
            Ok(s) => Some(s),
            Err(e) => {
                self.table.row(
                    &format!("server '{name}' starts"),
                    &format!("sluice serve {}", args.join(" ")),
                    "listening",
                    &e.0,
                    false,
                );
                None
            }
        }
    }

    /// Sends a request, judges the answer, and checks the server still answers.
    fn http(
        &mut self,
        s: &mut Server,
        case: &str,
        req: Req,
        expect: Expect,
    ) -> Option<attack::Reply> {
        self.http_within(s, case, req, expect, attack::HANG_GUARD)
    }

    /// [`Class::http`] with another hang guard.
    fn http_within(
        &mut self,
        s: &mut Server,
        case: &str,
        req: Req,
        expect: Expect,
        timeout: Duration,
    ) -> Option<attack::Reply> {
        let reply = s.send_within(&req, timeout);
        let (got, ok) = expect.judge(&reply, &self.secrets);
        self.after(s, case, &req.describe(), &expect.describe(), got, ok);
        reply.ok()
    }

    /// `POST /api/runs`; an accepted run is followed to its end, which must be a status
    /// with a reason (never a panic).
    fn run(&mut self, s: &mut Server, case: &str, body: Value, expect: Expect) -> Option<Value> {
        let req = Req::json("POST", "/api/runs", &body);
        let reply = s.send(&req);
        let (mut got, mut ok) = expect.judge(&reply, &self.secrets);
        let mut record = None;
        if let Ok(r) = &reply {
            if r.status == 202 {
                let id = r.json()["id"].as_str().unwrap_or("").to_string();
                match s.wait_run(&id, Duration::from_secs(120)) {
                    Ok(run) => {
                        let error = run["error"].as_str().unwrap_or("");
                        got = format!("202, then {} {}", run["status"], short(error, 120));
                        if error.contains("panick") {
                            ok = false;
                        }
                        record = Some(run);
                    }
                    Err(e) => {
                        got = format!("202, then {e}");
                        ok = false;
                    }
                }
            }
        }
        self.after(s, case, &req.describe(), &expect.describe(), got, ok);
        record
    }

    /// Records a case the caller judged, after checking the server still answers.
    fn after(
        &mut self,
        s: &mut Server,
        case: &str,
        input: &str,
        expected: &str,
        mut got: String,
        mut ok: bool,
    ) {
        if let Err(e) = s.check_alive() {
            got = format!("{got}; then {e}");
            ok = false;
        }
        self.table.row(case, input, expected, &got, ok);
    }

    /// Runs `sluice ARGS` and checks its exit code and a fragment of its output; a panic
    /// message or a peak memory over the bound fails the case.
    fn cli(&mut self, case: &str, args: &[&str], code: i32, fragment: &str) {
        let mut cmd = sluice_tests::sluice();
        cmd.args(args);
        let f = run_guarded(cmd, CLI_TIMEOUT);
        let text = format!("{}\n{}", f.stdout, f.stderr);
        let panicked = f.stderr.contains("panicked");
        let ok = f.code() == Some(code)
            && text.to_lowercase().contains(&fragment.to_lowercase())
            && !panicked
            && f.peak < MEMORY_BOUND;
        let last = f.stderr.trim().lines().last().unwrap_or("").to_string();
        let got = format!(
            "{}, {:.0} MiB peak: {}",
            f.describe(),
            mib(f.peak),
            short(&last, 160)
        );
        let shown: Vec<String> = args.iter().map(|a| shown_arg(a)).collect();
        self.table.row(
            case,
            &format!("sluice {}", shown.join(" ")),
            &format!("exit {code} \"{fragment}\""),
            &got,
            ok,
        );
    }

    /// A line for a check that is not one request.
    fn row(&mut self, case: &str, input: &str, expected: &str, got: &str, ok: bool) {
        self.table.row(case, input, expected, got, ok);
    }

    /// Checks every server's peak memory, prints the table, and fails the test on any
    /// failed line.
    fn finish(mut self, servers: &[&Server]) {
        for s in servers {
            let peak = s.peak_memory();
            let deaths = if s.deaths.is_empty() {
                String::new()
            } else {
                format!("; {} death(s) during the class", s.deaths.len())
            };
            self.table.row(
                "peak memory (VmHWM)",
                &format!("sluice serve on {}", s.addr),
                &format!("< {:.0} MiB", mib(MEMORY_BOUND)),
                &format!("{:.0} MiB{deaths}", mib(peak)),
                peak < MEMORY_BOUND,
            );
        }
        let failed = self.table.print();
        assert!(
            failed.is_empty(),
            "{} of {} lines failed:\n{}",
            failed.len(),
            self.table.rows.len(),
            failed.join("\n")
        );
    }
}

// ---------------------------------------------------------------------------------------
// 1. Signals.

/// Sends a request, reads `read` bytes of the answer (after half-closing when asked) and
/// drops the socket with the rest unread, which makes the kernel answer with a reset.
fn reset_mid_response(addr: SocketAddr, request: &[u8], half_close: bool, read: usize) -> String {
    let r = (|| -> std::io::Result<usize> {
        let mut t = TcpStream::connect(addr)?;
        t.set_read_timeout(Some(Duration::from_secs(30)))?;
        t.write_all(request)?;
        if half_close {
            t.shutdown(Shutdown::Write)?;
        }
        if read > 0 {
            let mut buf = vec![0u8; read];
            t.read_exact(&mut buf)?;
        } else {
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(read)
    })();
    match r {
        Ok(n) => format!("read {n} B, then reset"),
        Err(e) => format!("the exchange ended early ({e})"),
    }
}

/// Runs `sluice ARGS`, reads 16 bytes of its output and closes the pipe: a command that
/// prints must then end quietly (exit 0, or SIGPIPE's default), never panic.
fn close_stdout_early(args: &[&str]) -> (String, bool) {
    use std::os::unix::process::ExitStatusExt;
    let mut child = match sluice_tests::sluice()
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => return (format!("cannot start: {e}"), false),
    };
    if let Some(mut out) = child.stdout.take() {
        let mut buf = [0u8; 16];
        let _ = out.read(&mut buf);
    }
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break Some(s),
            _ if started.elapsed() > CLI_TIMEOUT => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            _ => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    match status {
        None => ("hung".into(), false),
        Some(s) => {
            let quiet = s.code() == Some(0) || s.signal() == Some(13);
            let got = format!(
                "{}{}",
                attack::describe_exit(s),
                if err.trim().is_empty() {
                    String::new()
                } else {
                    format!(": {}", short(err.trim(), 160))
                }
            );
            (got, quiet && !err.contains("panicked"))
        }
    }
}

#[test]
fn signals() {
    let mut c = Class::new("signals");
    let mut s = Server::start("signals", None, &[]).expect("sluice serve starts");
    // A 16 MiB output to walk away from while it is being written.
    let big = one_op(json!(["N", 65536]), "relu", json!({}));
    let accepted = s.json("POST", "/api/runs", &run_body(big, 64)).json();
    let path = match accepted["id"].as_str() {
        Some(id) => match s.wait_run(id, Duration::from_secs(180)) {
            Ok(r) if r["status"] == "succeeded" => format!("/api/runs/{id}/outputs/n"),
            _ => "/api/openapi.json".into(),
        },
        None => "/api/openapi.json".into(),
    };
    let get = Req::get(&path).bytes(&s.host(), None);
    let got = reset_mid_response(s.addr, &get, true, 1024);
    c.after(
        &mut s,
        "half-close, read 1 KiB, reset",
        &format!("GET {path} (16 MiB)"),
        "the server keeps serving",
        got,
        true,
    );
    let got = reset_mid_response(s.addr, &get, false, 0);
    c.after(
        &mut s,
        "reset before reading anything",
        &format!("GET {path}"),
        "the server keeps serving",
        got,
        true,
    );
    let mut last = String::new();
    for _ in 0..20 {
        last = reset_mid_response(s.addr, &get, true, 64 << 10);
    }
    c.after(
        &mut s,
        "20 resets in a row",
        &format!("GET {path} ×20"),
        "the server keeps serving",
        last,
        true,
    );
    let list = Req::get("/api/runs").bytes(&s.host(), None);
    let got = reset_mid_response(s.addr, &list, true, 16);
    c.after(
        &mut s,
        "reset during the run list",
        "GET /api/runs",
        "the server keeps serving",
        got,
        true,
    );
    // A watcher of a live run that vanishes.
    let long = json!({ "seed_inputs": true, "graph": "mlp", "batch": 1024, "microbatches": 64 });
    let id = s.json("POST", "/api/runs", &long).json()["id"]
        .as_str()
        .unwrap_or("0000000000000000")
        .to_string();
    let got = match s.ws(&format!("/api/runs/{id}/events"), &[]) {
        Ok(mut ws) => {
            let first = ws.read().map(|m| m.len()).unwrap_or(0);
            let _ = ws.get_mut().shutdown(Shutdown::Both);
            format!("read a {first} B message, then dropped the connection")
        }
        Err((code, e)) => format!("no WebSocket ({code} {e})"),
    };
    c.after(
        &mut s,
        "watcher vanishes mid-run",
        "WS /api/runs/ID/events, then drop",
        "the server keeps serving",
        got,
        true,
    );
    let run_end = s.wait_run(&id, Duration::from_secs(180));
    let ok = run_end.as_ref().is_ok_and(|r| r["status"] == "succeeded");
    c.after(
        &mut s,
        "the watched run still ends",
        "the run above",
        "succeeded",
        run_end.map_or_else(|e| e, |r| r["status"].to_string()),
        ok,
    );
    // A client that vanishes in the middle of its upload.
    let got = (|| -> std::io::Result<String> {
        let mut t = TcpStream::connect(s.addr)?;
        let head = format!(
            "PUT /api/graphs/upload HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            s.host(),
            8 << 20
        );
        t.write_all(head.as_bytes())?;
        t.write_all(&vec![b' '; 1 << 20])?;
        Ok("sent 1 MiB of 8, then closed".into())
    })()
    .unwrap_or_else(|e| format!("{e}"));
    c.after(
        &mut s,
        "client vanishes mid-upload",
        "PUT with Content-Length 8 MiB, 1 MiB sent",
        "the server keeps serving",
        got,
        true,
    );
    let transformer = asset("assets/graphs/transformer_block.json");
    let transformer = transformer.to_str().unwrap_or_default();
    for args in [
        vec!["plan", transformer, "--kernels", "--json"],
        vec!["ops", "--json"],
        vec!["validate", transformer, "--json"],
    ] {
        let (got, ok) = close_stdout_early(&args);
        let shown: Vec<String> = args.iter().map(|a| shown_arg(a)).collect();
        c.row(
            &format!("stdout closed early: {}", args[0]),
            &format!("sluice {} | head -c 16", shown.join(" ")),
            "exit 0 or SIGPIPE, no panic",
            &got,
            ok,
        );
    }
    c.finish(&[&s]);
}

// ---------------------------------------------------------------------------------------
// 2. Sizes.

#[test]
fn sizes() {
    let mut c = Class::new("sizes");
    let mut s = Server::start("sizes", Some(TOKEN), &["--body-limit", "4194304"])
        .expect("sluice serve starts");
    let limit = || Expect::status(422, "limit");
    // 2^33 outputs is past what an operator attribute may say at all; 2^30 is a valid
    // attribute whose 16 GiB of weights are over the tensor limit.
    let attribute = || Expect::status(422, "out_features must be at most");
    c.run(
        &mut s,
        "linear of 2^33 outputs",
        run_body(huge_linear(1 << 33), 1),
        attribute(),
    );
    c.run(
        &mut s,
        "linear of 2^30 outputs",
        run_body(huge_linear(1 << 30), 1),
        limit(),
    );
    let put = c.http(
        &mut s,
        "linear of 2^33 outputs, stored",
        Req::json("PUT", "/api/graphs/huge_linear", &huge_linear(1 << 33)),
        Expect::any(&[200, 201, 422], ""),
    );
    let stored = put.is_some_and(|r| r.status < 300);
    c.run(
        &mut s,
        "...then run by name",
        json!({ "seed_inputs": true, "graph": "huge_linear" }),
        if stored {
            attribute()
        } else {
            Expect::status(404, "no graph")
        },
    );
    for (case, doc) in [
        ("rank 100,000", rank(100_000)),
        ("list attribute of 100,000", long_list(100_000)),
        ("symbol of 200,000 chars", long_symbol(200_000)),
        ("40,000 distinct symbols", many_symbols(40_000)),
        ("50,000 inputs", many_inputs(50_000)),
    ] {
        c.http(
            &mut s,
            &format!("validate: {case}"),
            Req::json("POST", "/api/validate", &doc),
            limit(),
        );
    }
    c.run(
        &mut s,
        "run: rank 100,000",
        run_body(rank(100_000), 1),
        limit(),
    );
    c.run(
        &mut s,
        "run: 50,000 inputs",
        run_body(many_inputs(50_000), 1),
        limit(),
    );
    c.run(
        &mut s,
        "input [N, 100000] at batch 65536",
        run_body(one_op(json!(["N", 100_000]), "relu", json!({})), 65_536),
        limit(),
    );
    c.run(
        &mut s,
        "input [2^20, 2^20]",
        run_body(one_op(json!([1 << 20, 1 << 20]), "relu", json!({})), 1),
        limit(),
    );
    c.run(
        &mut s,
        "16 inputs of 2^26 elements",
        run_body(
            doc(
                Value::Object(
                    (0..16)
                        .map(|i| (format!("i{i}"), json!({ "shape": ["N", 1 << 22] })))
                        .collect(),
                ),
                json!([{ "id": "c", "op": "concat", "inputs": (0..16).map(|i| format!("i{i}")).collect::<Vec<_>>(), "attrs": { "axis": 1 } }]),
                &["c"],
            ),
            16,
        ),
        limit(),
    );
    c.run(
        &mut s,
        "activation of 2^28 elements",
        run_body(
            one_op(
                json!(["N", 1, 1024]),
                "expand",
                json!({ "shape": [1, 4096, 1024] }),
            ),
            64,
        ),
        limit(),
    );
    let layers: Vec<Value> = (0..40)
        .map(|i| {
            let input = if i == 0 { "x".to_string() } else { format!("l{}", i - 1) };
            json!({ "id": format!("l{i}"), "op": "linear", "inputs": [input], "attrs": { "out_features": 4096 } })
        })
        .collect();
    c.run(
        &mut s,
        "40 linears of 4096² (2.5 GiB of weights)",
        run_body(
            doc(
                json!({ "x": { "shape": ["N", 4096] } }),
                Value::Array(layers),
                &["l39"],
            ),
            1,
        ),
        limit(),
    );
    c.run(&mut s, "20,000 nodes", run_body(chain(20_000), 1), limit());
    let with_input =
        |bytes: &[u8]| json!({ "graph": "mlp", "batch": 2, "inputs": { "x": b64(bytes) } });
    for (case, bytes, fragment) in [
        (
            "npy header says 2^40 elements",
            npy(&npy_dict("<f4", false, "(1099511627776,)"), &[0; 16]),
            "input 'x'",
        ),
        (
            "npy shape product overflows",
            npy(
                &npy_dict("<f4", false, "(4294967296, 4294967296, 4294967296)"),
                &[0; 16],
            ),
            "input 'x'",
        ),
        (
            "npy header length 65535, file 25 B",
            npy_header_len_lie(65535),
            "input 'x'",
        ),
        (
            "npy v2 header length 4 GiB",
            npy_v2_header_len_lie(),
            "input 'x'",
        ),
        (
            "npy in Fortran order",
            npy(&npy_dict("<f4", true, "(2, 784)"), &[0; 2 * 784 * 4]),
            "Fortran",
        ),
        (
            "npy of complex64",
            npy(&npy_dict("<c8", false, "(2, 784)"), &[0; 2 * 784 * 8]),
            "not supported",
        ),
    ] {
        c.run(
            &mut s,
            case,
            with_input(&bytes),
            Expect::status(422, fragment),
        );
    }
    let inputs: serde_json::Map<String, Value> =
        (0..100_000).map(|i| (format!("i{i}"), json!(""))).collect();
    c.run(
        &mut s,
        "100,000 uploaded inputs",
        json!({ "graph": "mlp", "inputs": inputs }),
        Expect::status(422, "input"),
    );
    let weights_from = |file: &str| {
        let mut g: Value = serde_json::from_str(
            &std::fs::read_to_string(asset("assets/graphs/mlp.json")).unwrap(),
        )
        .unwrap();
        g["params"] = json!({ "file": file });
        g
    };
    c.run(
        &mut s,
        "params.file /dev/zero",
        run_body(weights_from("/dev/zero"), 1),
        Expect::status(422, "file"),
    );
    c.run(
        &mut s,
        "params.file ../../../../etc/passwd",
        run_body(weights_from("../../../../etc/passwd"), 1),
        Expect::status(422, "file"),
    );
    c.http(
        &mut s,
        "5 MiB body over a 4 MiB limit",
        Req::raw_json(
            "POST",
            "/api/validate",
            format!("{{\"pad\": \"{}\"}}", "x".repeat(5 << 20)).into_bytes(),
        ),
        Expect::status(413, "limit"),
    );
    c.http_within(
        &mut s,
        "Content-Length of 10 GB",
        Req::new("POST", "/api/validate")
            .header("Content-Type", "application/json")
            .header("Content-Length", "10000000000")
            .body(b"{}".to_vec()),
        Expect::status(413, "limit"),
        Duration::from_secs(15),
    );
    c.http(
        &mut s,
        "Content-Length not a number",
        Req::new("POST", "/api/validate")
            .header("Content-Type", "application/json")
            .header("Content-Length", "lots")
            .body(b"{}".to_vec()),
        Expect::status(400, ""),
    );
    // The CLI shares the limits and reads no devices.
    let dir = attack::scratch("sizes-cli");
    let mlp = asset("assets/graphs/mlp.json");
    let mlp = mlp.to_str().unwrap_or_default();
    let file = |name: &str, v: &Value| {
        put_file(&dir, name, v.to_string().as_bytes())
            .display()
            .to_string()
    };
    let zero_weights = file("zero_weights.json", &weights_from("/dev/zero"));
    let huge = file("huge_linear.json", &huge_linear(1 << 33));
    let ranked = file("rank.json", &rank(100_000));
    let wide = file(
        "wide.json",
        &one_op(json!(["N", 100_000]), "relu", json!({})),
    );
    let inputs = file("inputs.json", &many_inputs(50_000));
    let lie = put_file(
        &dir,
        "lie.npy",
        &npy(&npy_dict("<f4", false, "(1099511627776,)"), &[0; 16]),
    )
    .display()
    .to_string();
    let v2 = put_file(&dir, "v2.npy", &npy_v2_header_len_lie())
        .display()
        .to_string();
    c.cli(
        "validate /dev/zero",
        &["validate", "/dev/zero"],
        1,
        "/dev/zero",
    );
    c.cli(
        "--input x=/dev/zero",
        &["run", mlp, "--device", "cpu", "--input", "x=/dev/zero"],
        1,
        "--input x",
    );
    c.cli(
        "params.file /dev/zero",
        &["run", &zero_weights, "--device", "cpu", "--seed-inputs"],
        1,
        "weights file",
    );
    c.cli(
        "--input: npy says 2^40 elements",
        &[
            "run",
            mlp,
            "--device",
            "cpu",
            "--input",
            &format!("x={lie}"),
        ],
        1,
        "--input x",
    );
    c.cli(
        "--input: npy v2 header of 4 GiB",
        &["run", mlp, "--device", "cpu", "--input", &format!("x={v2}")],
        1,
        "--input x",
    );
    c.cli(
        "run: linear of 2^33",
        &["run", &huge, "--device", "cpu"],
        1,
        "out_features must be at most",
    );
    c.cli(
        "plan: linear of 2^33",
        &["plan", &huge],
        1,
        "out_features must be at most",
    );
    let heavy = file("heavy_linear.json", &huge_linear(1 << 30));
    c.cli(
        "run: linear of 2^30",
        &["run", &heavy, "--device", "cpu", "--seed-inputs"],
        1,
        "max_tensor_elements",
    );
    c.cli("validate: rank 100,000", &["validate", &ranked], 1, "limit");
    c.cli(
        "validate: 50,000 inputs",
        &["validate", &inputs],
        1,
        "limit",
    );
    c.cli(
        "run: [N, 100000] at batch 65536",
        &[
            "run",
            &wide,
            "--device",
            "cpu",
            "--batch",
            "65536",
            "--seed-inputs",
        ],
        1,
        "limit",
    );
    c.finish(&[&s]);
}

// ---------------------------------------------------------------------------------------
// 3. Arithmetic.

/// A hostile arithmetic case: its graph, what validating it must answer and what a run
/// of it must answer.
struct Arith {
    name: &'static str,
    doc: Value,
    validate: Expect,
    run: Expect,
}

fn arithmetic_cases() -> Vec<Arith> {
    let max = i64::MAX;
    let min = i64::MIN;
    let valid_or_not = || Expect::any(&[200, 422], "");
    let runs_or_not = || Expect::any(&[202, 422], "");
    let bad = |fragment: &str| Expect::status(422, fragment);
    let slice_of = |shape: Value, starts: Value, ends: Value, steps: Value| {
        one_op(
            shape,
            "slice",
            json!({ "starts": starts, "ends": ends, "axes": [1], "steps": steps }),
        )
    };
    vec![
        Arith {
            name: "slice of an axis of 2^63",
            doc: slice(json!([TWO_63]), json!([0]), json!([max]), json!([1])),
            validate: valid_or_not(),
            run: bad(""),
        },
        Arith {
            name: "slice step i64::MAX",
            doc: slice_of(json!(["N", 8]), json!([0]), json!([8]), json!([max])),
            validate: valid_or_not(),
            run: runs_or_not(),
        },
        Arith {
            name: "slice step i64::MIN",
            doc: slice_of(json!(["N", 8]), json!([7]), json!([min]), json!([min])),
            validate: valid_or_not(),
            run: runs_or_not(),
        },
        Arith {
            name: "slice starts i64::MIN, ends i64::MAX",
            doc: slice_of(json!(["N", 8]), json!([min]), json!([max]), json!([1])),
            validate: valid_or_not(),
            run: runs_or_not(),
        },
        Arith {
            name: "slice step 0",
            doc: slice_of(json!(["N", 8]), json!([0]), json!([8]), json!([0])),
            validate: bad("step"),
            run: bad("step"),
        },
        Arith {
            name: "slice axes [i64::MIN]",
            doc: one_op(
                json!(["N", 8]),
                "slice",
                json!({ "starts": [0], "ends": [1], "axes": [min] }),
            ),
            validate: bad("out of range"),
            run: bad("out of range"),
        },
        Arith {
            name: "concat total past 2^64",
            doc: doc(
                json!({
                    "a": { "shape": [TWO_63 - 1] }, "b": { "shape": [TWO_63 - 1] },
                    "c": { "shape": [TWO_63 - 1] }
                }),
                json!([{ "id": "cat", "op": "concat", "inputs": ["a", "b", "c"], "attrs": { "axis": 0 } }]),
                &["cat"],
            ),
            validate: bad(""),
            run: bad(""),
        },
        Arith {
            name: "split sizes past 2^64",
            doc: split_overflow(),
            validate: bad("sizes"),
            run: bad("sizes"),
        },
        Arith {
            name: "split sizes [-1, 9]",
            doc: one_op(json!([8]), "split", json!({ "sizes": [-1, 9] })),
            validate: bad("sizes"),
            run: bad("sizes"),
        },
        Arith {
            name: "split num_outputs 0",
            doc: one_op(
                json!(["N", 8]),
                "split",
                json!({ "axis": 1, "num_outputs": 0 }),
            ),
            validate: bad("num_outputs"),
            run: bad("num_outputs"),
        },
        Arith {
            name: "conv2d pads i64::MAX",
            doc: conv_pad_overflow(),
            validate: bad("pads"),
            run: bad("pads"),
        },
        Arith {
            name: "conv2d dilations i64::MAX",
            doc: conv_dilation_overflow(),
            validate: bad("dilations"),
            run: bad("dilations"),
        },
        Arith {
            name: "conv2d groups 0",
            doc: one_op(
                json!(["N", 4, 8, 8]),
                "conv2d",
                json!({ "out_channels": 4, "kernel_size": [3, 3], "groups": 0 }),
            ),
            validate: bad("groups"),
            run: bad("groups"),
        },
        Arith {
            name: "max_pool2d strides 0",
            doc: one_op(
                json!(["N", 1, 8, 8]),
                "max_pool2d",
                json!({ "kernel_size": [2, 2], "strides": [0, 0] }),
            ),
            validate: bad("strides"),
            run: bad("strides"),
        },
        Arith {
            name: "avg_pool2d kernel 2^62",
            doc: one_op(
                json!(["N", 1, 8, 8]),
                "avg_pool2d",
                json!({ "kernel_size": [1u64 << 62, 1u64 << 62] }),
            ),
            validate: bad("kernel_size"),
            run: bad("kernel_size"),
        },
        Arith {
            name: "linear fan-in 2^62",
            doc: fan_in_overflow(),
            validate: bad(""),
            run: bad(""),
        },
        Arith {
            name: "input of 2^96 elements",
            doc: numel_overflow(),
            validate: valid_or_not(),
            run: bad(""),
        },
        Arith {
            name: "expand to [2^62, 2^62]",
            doc: one_op(
                json!([1, 1]),
                "expand",
                json!({ "shape": [1u64 << 62, 1u64 << 62] }),
            ),
            validate: valid_or_not(),
            run: bad(""),
        },
        Arith {
            name: "reshape to [2^32, 2^32, 2^32]",
            doc: one_op(
                json!(["N", 4]),
                "reshape",
                json!({ "shape": [1u64 << 32, 1u64 << 32, 1u64 << 32] }),
            ),
            validate: bad("overflow"),
            run: bad("overflow"),
        },
        Arith {
            name: "reshape [-1, -1]",
            doc: one_op(json!(["N", 4]), "reshape", json!({ "shape": [-1, -1] })),
            validate: bad("shape"),
            run: bad("shape"),
        },
        Arith {
            name: "clip min > max",
            doc: clip(1.0, -1.0),
            validate: valid_or_not(),
            run: runs_or_not(),
        },
        Arith {
            name: "softmax axis i64::MIN",
            doc: one_op(json!(["N", 4]), "softmax", json!({ "axis": min })),
            validate: bad("axis"),
            run: bad("axis"),
        },
        Arith {
            name: "reduce_sum axes [i64::MIN]",
            doc: one_op(json!(["N", 4]), "reduce_sum", json!({ "axes": [min] })),
            validate: bad("out of range"),
            run: bad("out of range"),
        },
        Arith {
            name: "transpose perm [i64::MAX, 0]",
            doc: one_op(json!(["N", 4]), "transpose", json!({ "perm": [max, 0] })),
            validate: bad("out of range"),
            run: bad("out of range"),
        },
        Arith {
            name: "unsqueeze axes [i64::MAX]",
            doc: one_op(json!(["N", 4]), "unsqueeze", json!({ "axes": [max] })),
            validate: bad("out of range"),
            run: bad("out of range"),
        },
        Arith {
            name: "flatten axis i64::MIN",
            doc: one_op(json!(["N", 4]), "flatten", json!({ "axis": min })),
            validate: bad("axis"),
            run: bad("axis"),
        },
        Arith {
            name: "gather axis i64::MIN",
            doc: doc(
                json!({ "x": { "shape": ["N", 4] }, "i": { "shape": [2], "dtype": "i32" } }),
                json!([{ "id": "g", "op": "gather", "inputs": ["x", "i"], "attrs": { "axis": min } }]),
                &["g"],
            ),
            validate: bad("axis"),
            run: bad("axis"),
        },
        Arith {
            name: "constant shape [2^32, 2^32], one value",
            doc: doc(
                json!({}),
                json!([{ "id": "k", "op": "constant", "attrs": { "value": [1.0], "shape": [1u64 << 32, 1u64 << 32] } }]),
                &["k"],
            ),
            validate: bad(""),
            run: bad(""),
        },
    ]
}

#[test]
fn arithmetic() {
    let mut c = Class::new("arithmetic");
    let mut s = Server::start("arithmetic", None, &[]).expect("sluice serve starts");
    let cases = arithmetic_cases();
    for a in &cases {
        c.http(
            &mut s,
            &format!("validate: {}", a.name),
            Req::json("POST", "/api/validate", &a.doc),
            a.validate.clone(),
        );
        c.run(
            &mut s,
            &format!("run: {}", a.name),
            run_body(a.doc.clone(), 2),
            a.run.clone(),
        );
    }
    // A stored graph is checked before anything runs it: storing a poisoned graph either
    // fails or keeps a graph whose runs are refused, and the listing still works.
    for (name, doc) in [
        (
            "reshape_poison",
            one_op(json!(["N", 4]), "reshape", json!({ "shape": [-1, -1] })),
        ),
        ("concat_poison", cases[6].doc.clone()),
    ] {
        let put = c.http(
            &mut s,
            &format!("PUT {name}"),
            Req::json("PUT", &format!("/api/graphs/{name}"), &doc),
            Expect::any(&[200, 201, 422], ""),
        );
        let stored = put.is_some_and(|r| r.status < 300);
        c.run(
            &mut s,
            &format!("run stored {name}"),
            json!({ "seed_inputs": true, "graph": name }),
            if stored {
                Expect::status(422, "")
            } else {
                Expect::status(404, "no graph")
            },
        );
    }
    c.http(
        &mut s,
        "list graphs after the poison",
        Req::get("/api/graphs"),
        Expect::status(200, "mlp"),
    );
    // The CLI shares the checks.
    let dir = attack::scratch("arithmetic-cli");
    for (i, a) in cases.iter().enumerate() {
        let path = put_file(&dir, &format!("case{i}.json"), a.doc.to_string().as_bytes());
        let path = path.to_str().unwrap_or_default();
        let code = if a.validate.statuses.contains(&200) {
            None
        } else {
            Some(1)
        };
        match code {
            Some(code) => c.cli(
                &format!("validate: {}", a.name),
                &["validate", path],
                code,
                "",
            ),
            None => {
                // Either verdict is right; neither may crash.
                let mut cmd = sluice_tests::sluice();
                cmd.args(["validate", path]);
                let f = run_guarded(cmd, CLI_TIMEOUT);
                let ok = matches!(f.code(), Some(0) | Some(1)) && !f.stderr.contains("panicked");
                c.row(
                    &format!("validate: {}", a.name),
                    &format!("sluice validate case{i}.json"),
                    "exit 0|1, no panic",
                    &format!("{}: {}", f.describe(), short(f.stderr.trim(), 120)),
                    ok,
                );
            }
        }
    }
    let slice_file = put_file(&dir, "slice.json", cases[0].doc.to_string().as_bytes());
    let slice_file = slice_file.to_str().unwrap_or_default();
    c.cli(
        "run: slice of an axis of 2^63",
        &[
            "run",
            slice_file,
            "--device",
            "cpu",
            "--batch",
            "2",
            "--seed-inputs",
        ],
        1,
        "",
    );
    let pads = put_file(
        &dir,
        "pads.json",
        conv_pad_overflow().to_string().as_bytes(),
    );
    c.cli(
        "plan: conv2d pads i64::MAX",
        &["plan", pads.to_str().unwrap_or_default()],
        1,
        "pads",
    );
    // Crashes the fuzzers found, replayed through the CLI.
    let regressions = asset("fuzz/regressions");
    for target in ["graph", "plan"] {
        let Ok(entries) = std::fs::read_dir(regressions.join(target)) else {
            continue;
        };
        for e in entries.flatten() {
            let path = e.path();
            let mut cmd = sluice_tests::sluice();
            cmd.arg("validate").arg(&path);
            let f = run_guarded(cmd, CLI_TIMEOUT);
            let ok = matches!(f.code(), Some(0) | Some(1)) && !f.stderr.contains("panicked");
            c.row(
                &format!("fuzz regression {target}"),
                &format!("sluice validate {}", e.file_name().to_string_lossy()),
                "exit 0|1, no panic",
                &format!("{}: {}", f.describe(), short(f.stderr.trim(), 120)),
                ok,
            );
        }
    }
    c.finish(&[&s]);
}

// ---------------------------------------------------------------------------------------
// 4. The async runtime.

/// Sends `requests` at once while a tiny `GET /api/ops` is timed every 100 ms; returns
/// the answers' statuses and the slowest tiny answer.
fn while_busy(s: &Server, requests: Vec<Req>) -> (Vec<Result<u16, String>>, Duration, usize) {
    let (addr, host) = (s.addr, s.host());
    let token = s.token.clone();
    std::thread::scope(|scope| {
        let handles: Vec<_> = requests
            .into_iter()
            .map(|r| {
                let (host, token) = (host.clone(), token.clone());
                scope.spawn(move || {
                    attack::exchange(
                        addr,
                        &r.bytes(&host, token.as_deref()),
                        Duration::from_secs(300),
                    )
                    .map(|a| a.status)
                    .map_err(|e| e.to_string())
                })
            })
            .collect();
        let (mut slowest, mut pings) = (Duration::ZERO, 0);
        while handles.iter().any(|h| !h.is_finished()) {
            let t = Instant::now();
            let ok = s
                .send_within(&Req::get("/api/ops"), Duration::from_secs(120))
                .is_ok_and(|r| r.status == 200);
            let took = t.elapsed();
            slowest = slowest.max(if ok { took } else { Duration::from_secs(120) });
            pings += 1;
            std::thread::sleep(Duration::from_millis(100));
        }
        let statuses = handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("client thread failed".into()))
            })
            .collect();
        (statuses, slowest, pings)
    })
}

/// Streams 64 MiB as the start of a 1 GiB binary message on a WebSocket before any hello:
/// one frame announcing 2^30 bytes, or 1 MiB frames without FIN (a message of many
/// fragments). Returns what happened.
fn flood_before_hello(t: &mut TcpStream, fragmented: bool) -> String {
    let _ = t.set_write_timeout(Some(Duration::from_secs(10)));
    let frame = |first: bool, len: u64| {
        let opcode = if first { 0x2 } else { 0x0 };
        let fin = if fragmented { 0 } else { 0x80 };
        let mut h = vec![fin | opcode, 0x80 | 127];
        h.extend_from_slice(&len.to_be_bytes());
        h.extend_from_slice(&[1, 2, 3, 4]);
        h
    };
    let chunk = vec![0u8; 1 << 20];
    let mut sent = 0usize;
    let mut r = if fragmented {
        Ok(())
    } else {
        t.write_all(&frame(true, 1 << 30))
    };
    while r.is_ok() && sent < 64 << 20 {
        r = if fragmented {
            t.write_all(&frame(sent == 0, chunk.len() as u64))
                .and_then(|()| t.write_all(&chunk))
        } else {
            t.write_all(&chunk)
        };
        if r.is_ok() {
            sent += chunk.len();
        }
    }
    match r {
        Ok(()) => "all 64 MiB accepted".to_string(),
        Err(e) => format!("closed after {} MiB ({e})", sent >> 20),
    }
}

/// A generous bound on how long a tiny request may wait while the server analyses large
/// documents: far above what a responsive server needs, far below a freeze.
const RESPONSIVE: Duration = Duration::from_secs(20);

fn busy_case(
    c: &mut Class,
    s: &mut Server,
    case: &str,
    input: &str,
    requests: Vec<Req>,
    accept: &[u16],
) {
    let (statuses, slowest, pings) = while_busy(s, requests);
    let answers: Vec<String> = statuses
        .iter()
        .map(|r| r.as_ref().map_or_else(|e| e.clone(), u16::to_string))
        .collect();
    let ok = statuses
        .iter()
        .all(|r| r.as_ref().is_ok_and(|c| accept.contains(c)))
        && slowest < RESPONSIVE;
    let codes: Vec<String> = accept.iter().map(u16::to_string).collect();
    c.after(
        s,
        case,
        input,
        &format!(
            "{} each; GET /api/ops < {} s",
            codes.join("|"),
            RESPONSIVE.as_secs()
        ),
        format!(
            "answers [{}]; slowest of {pings} GET /api/ops: {:.2} s",
            answers.join(", "),
            slowest.as_secs_f64()
        ),
        ok,
    );
}

/// Whether the server closed a connection within `limit`; how long it took.
fn closed_within(t: &mut TcpStream, limit: Duration) -> Result<Duration, String> {
    let started = Instant::now();
    let _ = t.set_read_timeout(Some(limit));
    let mut buf = [0u8; 4096];
    loop {
        match t.read(&mut buf) {
            Ok(0) => return Ok(started.elapsed()),
            // A 408 answer before closing counts as closing.
            Ok(_) => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return Err(format!(
                    "still open after {:.0} s",
                    started.elapsed().as_secs_f64()
                ))
            }
            Err(_) => return Ok(started.elapsed()),
        }
    }
}

#[test]
fn async_runtime() {
    let mut c = Class::new("async runtime");
    let mut s = Server::start("async", None, &[]).expect("sluice serve starts");
    let big = [chain(8000), many_outputs(20_000), many_outputs(20_000)];
    let sizes: Vec<String> = big
        .iter()
        .map(|d| format!("{:.0} KB", d.to_string().len() as f64 / 1000.0))
        .collect();
    busy_case(
        &mut c,
        &mut s,
        "3 large documents at once",
        &format!("POST /api/validate ×3 ({})", sizes.join(", ")),
        big.iter()
            .map(|d| Req::json("POST", "/api/validate", d))
            .collect(),
        &[200, 413, 422],
    );
    busy_case(
        &mut c,
        &mut s,
        "8 large graphs stored at once",
        "PUT /api/graphs/bigN ×8 (chain of 8000)",
        (0..8)
            .map(|i| Req::json("PUT", &format!("/api/graphs/big{i}"), &big[0]))
            .collect(),
        &[200, 201, 413, 422],
    );
    busy_case(
        &mut c,
        &mut s,
        "4 runs of 12,000-node graphs",
        "POST /api/runs ×4 (chain of 12000)",
        (0..4)
            .map(|_| Req::json("POST", "/api/runs", &run_body(chain(12_000), 1)))
            .collect(),
        &[413, 422],
    );
    // 1 GiB announced before a worker's hello, as one frame and as a message of many
    // small frames: the server must stop reading long before.
    for (case, fragmented) in [
        ("1 GiB frame before the hello", false),
        ("1 GiB message of 1 MiB frames before the hello", true),
    ] {
        let got = match s.ws("/api/workers", &[]) {
            Err((code, e)) => format!("no upgrade ({code} {e})"),
            Ok(mut ws) => flood_before_hello(ws.get_mut(), fragmented),
        };
        let ok = got.starts_with("closed") || got.starts_with("no upgrade");
        c.after(
            &mut s,
            case,
            if fragmented {
                "WS /api/workers, 64 frames of 1 MiB, no FIN"
            } else {
                "WS /api/workers, frame header of 2^30 B, 64 MiB streamed"
            },
            "closed before 64 MiB are read",
            got,
            ok,
        );
    }
    // Watchers that never read while a run streams its events.
    let id = s
        .json(
            "POST",
            "/api/runs",
            &json!({ "seed_inputs": true, "graph": "mlp", "batch": 512, "microbatches": 64, "stages": 2 }),
        )
        .json()["id"]
        .as_str()
        .unwrap_or("0000000000000000")
        .to_string();
    let watchers: Vec<_> = (0..20)
        .filter_map(|_| s.ws(&format!("/api/runs/{id}/events"), &[]).ok())
        .collect();
    let end = s.wait_run(&id, Duration::from_secs(240));
    let ok = end.as_ref().is_ok_and(|r| r["status"] == "succeeded");
    c.after(
        &mut s,
        "20 watchers that never read",
        "WS /api/runs/ID/events ×20 on a 64-micro-batch run",
        "the run succeeds, memory bounded",
        format!(
            "{} watchers; {}",
            watchers.len(),
            end.map_or_else(|e| e, |r| r["status"].to_string())
        ),
        ok,
    );
    drop(watchers);
    let got = match s.ws(&format!("/api/runs/{id}/events"), &[]) {
        Ok(mut ws) => {
            let mut sent = 0;
            for i in 0..100u32 {
                let m = if i % 2 == 0 {
                    tungstenite::Message::Binary(vec![0xFF; 1000].into())
                } else {
                    tungstenite::Message::Text("{\"type\":\"evil\"".into())
                };
                if ws.send(m).is_err() {
                    break;
                }
                sent += 1;
            }
            format!("sent {sent} junk frames")
        }
        Err((code, e)) => format!("no WebSocket ({code} {e})"),
    };
    c.after(
        &mut s,
        "junk frames on an event stream",
        "WS /api/runs/ID/events, 100 junk frames",
        "ignored, the server keeps serving",
        got,
        true,
    );
    // The listener's limits, tightened so the cases are quick.
    if let Some(mut l) = c.server(
        "listener",
        None,
        &[
            "--header-timeout",
            "2",
            "--body-timeout",
            "3",
            "--max-connections",
            "32",
            "--max-workers",
            "4",
        ],
    ) {
        let got = TcpStream::connect(l.addr)
            .and_then(|mut t| {
                t.write_all(format!("GET /api/ops HTTP/1.1\r\nHost: {}\r\n", l.host()).as_bytes())?;
                Ok(t)
            })
            .map_err(|e| e.to_string())
            .and_then(|mut t| closed_within(&mut t, Duration::from_secs(30)));
        c.after(
            &mut l,
            "headers never finished",
            "GET with half its headers, then silence",
            "closed after --header-timeout 2 s",
            got.as_ref().map_or_else(
                |e| e.clone(),
                |d| format!("closed after {:.1} s", d.as_secs_f64()),
            ),
            got.is_ok(),
        );
        let got = TcpStream::connect(l.addr)
            .and_then(|mut t| {
                t.write_all(
                    format!(
                        "POST /api/validate HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"format\"",
                        l.host()
                    )
                    .as_bytes(),
                )?;
                Ok(t)
            })
            .map_err(|e| e.to_string())
            .and_then(|mut t| closed_within(&mut t, Duration::from_secs(30)));
        c.after(
            &mut l,
            "body never finished",
            "POST with 9 of 100 body bytes, then silence",
            "closed after --body-timeout 3 s",
            got.as_ref().map_or_else(
                |e| e.clone(),
                |d| format!("closed after {:.1} s", d.as_secs_f64()),
            ),
            got.is_ok(),
        );
        std::thread::sleep(Duration::from_millis(500));
        let before = l.fds();
        let idle: Vec<TcpStream> = (0..64)
            .filter_map(|_| TcpStream::connect(l.addr).ok())
            .collect();
        std::thread::sleep(Duration::from_millis(700));
        let during = l.fds();
        let held = during.saturating_sub(before);
        c.row(
            "64 idle connections, limit 32",
            &format!("{} TCP connections, no bytes", idle.len()),
            "the server holds ≤ 36 more descriptors",
            &format!("descriptors {before} → {during} (+{held})"),
            held <= 36,
        );
        drop(idle);
        std::thread::sleep(Duration::from_secs(3));
        let after = l.fds();
        c.after(
            &mut l,
            "descriptors after they close",
            "the 64 connections closed",
            "back to the start (±4)",
            format!("descriptors {before} → {after}"),
            after <= before + 4,
        );
        let sockets: Vec<_> = (0..10).map(|_| l.ws("/api/workers", &[])).collect();
        let upgraded = sockets.iter().filter(|r| r.is_ok()).count();
        let refused: Vec<String> = sockets
            .iter()
            .filter_map(|r| r.as_ref().err().map(|(c, _)| c.to_string()))
            .collect();
        c.row(
            "10 worker sockets, limit 4",
            "WS /api/workers ×10, no hello",
            "≤ 4 upgraded",
            &format!("{upgraded} upgraded, refused: [{}]", refused.join(", ")),
            upgraded <= 4,
        );
        let started = Instant::now();
        let mut open = 0;
        for mut ws in sockets.into_iter().flatten() {
            let _ = ws.get_mut().set_read_timeout(Some(Duration::from_secs(30)));
            loop {
                match ws.read() {
                    Ok(tungstenite::Message::Close(_)) | Err(_) => break,
                    Ok(_) => continue,
                }
            }
            if started.elapsed() > Duration::from_secs(30) {
                open += 1;
            }
        }
        c.after(
            &mut l,
            "worker sockets without a hello",
            "the upgraded sockets, silent",
            "closed by the server (hello timeout)",
            format!(
                "all closed after {:.1} s; {open} outlived 30 s",
                started.elapsed().as_secs_f64()
            ),
            open == 0,
        );
        c.finish(&[&s, &l]);
    } else {
        c.finish(&[&s]);
    }
}

// ---------------------------------------------------------------------------------------
// 5. Paths.

/// Files named `name` (with `.npy`) anywhere from the workspace up to the scratch root,
/// or at an absolute path.
fn escaped(ws: &Path, name: &str) -> Vec<PathBuf> {
    let file = format!("{name}.npy");
    let mut places = vec![ws.to_path_buf(), ws.join("runs")];
    let mut up = ws.to_path_buf();
    for _ in 0..3 {
        if let Some(p) = up.parent() {
            up = p.to_path_buf();
            places.push(up.clone());
        }
    }
    let mut found: Vec<PathBuf> = places
        .into_iter()
        .map(|d| d.join(&file))
        .filter(|p| p.exists())
        .collect();
    if Path::new(&file).is_absolute() && Path::new(&file).exists() {
        found.push(PathBuf::from(&file));
    }
    found
}

#[test]
fn paths() {
    let mut c = Class::new("paths");
    let dir = attack::scratch("paths-bundle");
    let bundle = dir.join("bundle");
    std::fs::create_dir_all(bundle.join(".git")).unwrap();
    std::fs::write(
        bundle.join("index.html"),
        "<!doctype html><title>editor page</title>",
    )
    .unwrap();
    std::fs::write(bundle.join("app.wasm"), b"\0asm\x01\0\0\0").unwrap();
    std::fs::write(bundle.join(".secret"), "TOP-SECRET-DOTFILE").unwrap();
    std::fs::write(bundle.join(".git/config"), "TOP-SECRET-GIT-CONFIG").unwrap();
    std::fs::write(dir.join("outside.txt"), "OUTSIDE-THE-BUNDLE").unwrap();
    let editor = bundle.to_str().unwrap_or_default();
    let mut s = Server::start("paths", None, &["--editor", editor]).expect("sluice serve starts");
    let abs = std::env::temp_dir()
        .join(format!("sluice-attack-{}-absolute", std::process::id()))
        .display()
        .to_string();
    for (case, id) in [
        ("node id ../../escape", "../../escape".to_string()),
        ("node id as an absolute path", abs.clone()),
        ("node id of 128 dots", ".".repeat(128)),
        ("node id with a NUL", "a\u{0}b".to_string()),
    ] {
        let run = c.run(
            &mut s,
            case,
            run_body(node_named(&id), 1),
            Expect::any(&[202, 422], ""),
        );
        let outside = escaped(&s.workspace, &id);
        let file = run
            .as_ref()
            .and_then(|r| r["outputs"][0]["file"].as_str().map(str::to_string));
        let downloads = match (&run, &file) {
            (Some(r), Some(f)) if r["status"] == "succeeded" => {
                let id = r["id"].as_str().unwrap_or("");
                let got = s.get(&format!("/api/runs/{id}/outputs/{f}"));
                safe_file_name(f) && got.status == 200
            }
            _ => true,
        };
        c.row(
            &format!("{case}: nothing written outside"),
            &format!("output file {:?}", file.as_deref().unwrap_or("-")),
            "no .npy outside runs/ID; a safe file name that downloads",
            &format!("outside: {outside:?}; downloads: {downloads}"),
            outside.is_empty() && downloads,
        );
    }
    let no_name = || Expect::status(400, "not a valid name");
    c.http(
        &mut s,
        "graph name ../../etc/passwd",
        Req::get("/api/graphs/..%2F..%2Fetc%2Fpasswd"),
        no_name(),
    );
    c.http(
        &mut s,
        "store as ../escape",
        Req::json("PUT", "/api/graphs/..%2Fescape", &node_named("x")),
        no_name(),
    );
    let not_db = |r: &Option<attack::Reply>| {
        r.as_ref()
            .is_none_or(|r| !r.text().contains("SQLite format"))
    };
    let r = c.http(
        &mut s,
        "output ../../../sluice.db",
        Req::get("/api/runs/0123456789abcdef/outputs/..%2F..%2F..%2Fsluice.db"),
        Expect::any(&[400, 404], ""),
    );
    c.row(
        "...no database bytes",
        "the answer above",
        "not the database",
        if not_db(&r) {
            "not the database"
        } else {
            "the database!"
        },
        not_db(&r),
    );
    let r = c.http(
        &mut s,
        "raw ../ in an API path",
        Req::get("/api/runs/../../sluice.db"),
        Expect::status(404, ""),
    );
    c.row(
        "...no database bytes",
        "the answer above",
        "not the database",
        if not_db(&r) {
            "not the database"
        } else {
            "the database!"
        },
        not_db(&r),
    );
    for (case, path, secret) in [
        ("editor dotfile", "/.secret", "TOP-SECRET-DOTFILE"),
        (
            "editor .git/config",
            "/.git/config",
            "TOP-SECRET-GIT-CONFIG",
        ),
    ] {
        let r = s.send(&Req::get(path).without("Authorization"));
        let (got, ok) = match &r {
            Ok(r) => (
                format!("{} {}", r.status, short(r.text().trim(), 80)),
                r.status == 404 && !r.text().contains(secret),
            ),
            Err(e) => (e.to_string(), false),
        };
        c.after(
            &mut s,
            case,
            &format!("GET {path}"),
            "404, never the file",
            got,
            ok,
        );
    }
    for path in [
        "/../outside.txt",
        "/%2e%2e/outside.txt",
        "/..%2foutside.txt",
        "/%2e%2e%2foutside.txt",
    ] {
        let r = s.send(&Req::get(path));
        let (got, ok) = match &r {
            Ok(r) => (
                format!("{} {}", r.status, short(r.text().trim(), 80)),
                !r.text().contains("OUTSIDE-THE-BUNDLE") && [200, 400, 404].contains(&r.status),
            ),
            Err(e) => (e.to_string(), false),
        };
        c.after(
            &mut s,
            "a file beside the bundle",
            &format!("GET {path}"),
            "400|404 or the editor page, never the file",
            got,
            ok,
        );
    }
    // Errors from the file system never show the server's paths.
    std::fs::create_dir_all(s.workspace.join("graphs/blocked.json")).unwrap();
    c.http(
        &mut s,
        "store over a folder",
        // A graph that checks (node `x` would clash with input `x`), so the store is tried.
        Req::json("PUT", "/api/graphs/blocked", &node_named("y")),
        Expect::any(&[409, 500], ""),
    );
    std::fs::write(
        s.workspace.join("graphs/broken.json"),
        b"\xff\xfe{not utf-8",
    )
    .unwrap();
    c.http(
        &mut s,
        "read a graph that is not UTF-8",
        Req::get("/api/graphs/broken"),
        Expect::any(&[422, 500], ""),
    );
    let id = s
        .json(
            "POST",
            "/api/runs",
            &json!({ "seed_inputs": true, "graph": "mlp" }),
        )
        .json()["id"]
        .as_str()
        .unwrap_or("0000000000000000")
        .to_string();
    let _ = s.wait_run(&id, Duration::from_secs(120));
    let _ = std::fs::write(
        s.workspace.join(format!("runs/{id}/events.json")),
        "{damaged",
    );
    c.http(
        &mut s,
        "trace of damaged events",
        Req::get(&format!("/api/runs/{id}/trace")),
        Expect::any(&[409, 500], ""),
    );
    c.finish(&[&s]);
}

/// Whether an output's file name is one the server may use: 1-64 of `A-Z a-z 0-9 _ -`.
fn safe_file_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

// ---------------------------------------------------------------------------------------
// 6. Authentication and origin.

#[test]
fn auth_and_origin() {
    let mut c = Class::new("auth/origin");
    let mut t =
        Server::start("auth-token", Some(TOKEN), &["--no-editor"]).expect("sluice serve starts");
    let id = t
        .json(
            "POST",
            "/api/runs",
            &json!({ "seed_inputs": true, "graph": "mlp" }),
        )
        .json()["id"]
        .as_str()
        .unwrap_or("0123456789abcdef")
        .to_string();
    let _ = t.wait_run(&id, Duration::from_secs(120));
    let unauthorized = || Expect::status(401, "token");
    let mlp: Value =
        serde_json::from_str(&std::fs::read_to_string(asset("assets/graphs/mlp.json")).unwrap())
            .unwrap();
    let routes = vec![
        Req::get("/"),
        Req::get("/api/ops"),
        Req::get("/api/graphs"),
        Req::get("/api/graphs/mlp"),
        Req::json("PUT", "/api/graphs/intruder", &mlp),
        Req::new("DELETE", "/api/graphs/mlp"),
        Req::json("POST", "/api/validate", &mlp),
        Req::json(
            "POST",
            "/api/runs",
            &json!({ "seed_inputs": true, "graph": "mlp" }),
        ),
        Req::get("/api/runs"),
        Req::get(&format!("/api/runs/{id}")),
        Req::get(&format!("/api/runs/{id}/outputs/probs")),
        Req::get(&format!("/api/runs/{id}/trace")),
        Req::new("POST", &format!("/api/runs/{id}/cancel")),
        Req::get("/api/devices"),
        Req::get("/api/openapi.json"),
        Req::get("/metrics"),
        Req::get("/api/no/such/route"),
        Req::get("/no-such-page"),
    ];
    for r in routes {
        let r = r.without("Authorization");
        c.http(&mut t, "no token", r, unauthorized());
    }
    for path in [format!("/api/runs/{id}/events"), "/api/workers".to_string()] {
        let got = attack::ws_connect(t.addr, &path, None, &[]);
        let (got, ok) = match got {
            Ok(_) => ("upgraded".to_string(), false),
            Err((code, e)) => (format!("{code} {}", short(&e, 80)), code == 401),
        };
        c.after(&mut t, "no token", &format!("WS {path}"), "401", got, ok);
    }
    for (case, auth) in [
        ("wrong token", "Bearer wrong".to_string()),
        (
            "a prefix of the token",
            format!("Bearer {}", &TOKEN[..TOKEN.len() - 1]),
        ),
        ("the token and more", format!("Bearer {TOKEN}x")),
        ("empty bearer", "Bearer ".to_string()),
        (
            "basic scheme",
            format!("Basic {}", b64(format!("user:{TOKEN}").as_bytes())),
        ),
        ("token without scheme", TOKEN.to_string()),
    ] {
        c.http(
            &mut t,
            case,
            Req::get("/api/graphs").header("Authorization", &auth),
            unauthorized(),
        );
    }
    c.http(
        &mut t,
        "wrong token in the query",
        Req::get("/api/graphs?token=wrong").without("Authorization"),
        unauthorized(),
    );
    c.http(
        &mut t,
        "nothing was deleted",
        Req::get("/api/graphs/mlp"),
        Expect::status(200, "sluice/graph@1"),
    );
    c.http(
        &mut t,
        "foreign Origin with the token",
        Req::json(
            "POST",
            "/api/runs",
            &json!({ "seed_inputs": true, "graph": "mlp" }),
        )
        .header("Origin", "http://evil.example"),
        Expect::status(403, "cross-origin request refused"),
    );
    // The default server has no token: Host, Origin and Content-Type are its defence.
    let mut o = Server::start("auth-open", None, &[]).expect("sluice serve starts");
    let own = o.url.clone();
    let run = || {
        Req::json(
            "POST",
            "/api/runs",
            &json!({ "seed_inputs": true, "graph": "mlp" }),
        )
    };
    let cross = || Expect::status(403, "cross-origin request refused");
    for origin in [
        "http://evil.example",
        "null",
        "http://127.0.0.1:1",
        "http://localhost.evil.example",
    ] {
        c.http(
            &mut o,
            "foreign Origin",
            run().header("Origin", origin),
            cross(),
        );
    }
    c.http(
        &mut o,
        "foreign Origin on a GET",
        Req::get("/api/graphs").header("Origin", "http://evil.example"),
        cross(),
    );
    c.http(
        &mut o,
        "own Origin",
        run().header("Origin", &own),
        Expect::status(202, "queued"),
    );
    let port = o.addr.port();
    let not_ours = || Expect::status(403, "is not this server's");
    for host in [
        "evil.example".to_string(),
        format!("rebind.evil.example:{port}"),
        "127.0.0.1:1".to_string(),
    ] {
        c.http(
            &mut o,
            "bad Host",
            Req::get("/api/graphs").header("Host", &host),
            not_ours(),
        );
    }
    for host in [
        format!("localhost:{port}"),
        format!("[::1]:{port}"),
        format!("127.0.0.1:{port}"),
    ] {
        c.http(
            &mut o,
            "loopback Host",
            Req::get("/api/graphs").header("Host", &host),
            Expect::status(200, "graphs"),
        );
    }
    c.http(
        &mut o,
        "no Host",
        Req::get("/api/graphs").without("Host"),
        Expect::any(&[400, 403], ""),
    );
    let typed = |ct: &str| {
        Req::new("POST", "/api/runs")
            .header("Content-Type", ct)
            .body(
                json!({ "seed_inputs": true, "graph": "mlp" })
                    .to_string()
                    .into_bytes(),
            )
    };
    let unsupported = || Expect::status(415, "");
    c.http(
        &mut o,
        "JSON as text/plain",
        typed("text/plain"),
        unsupported(),
    );
    c.http(
        &mut o,
        "JSON as a form",
        typed("application/x-www-form-urlencoded"),
        unsupported(),
    );
    c.http(
        &mut o,
        "JSON as multipart",
        typed("multipart/form-data; boundary=x"),
        unsupported(),
    );
    c.http(
        &mut o,
        "validate as text/plain",
        Req::new("POST", "/api/validate")
            .header("Content-Type", "text/plain")
            .body(mlp.to_string().into_bytes()),
        unsupported(),
    );
    c.http(
        &mut o,
        "PUT without a Content-Type",
        Req::new("PUT", "/api/graphs/typeless").body(mlp.to_string().into_bytes()),
        unsupported(),
    );
    c.http(
        &mut o,
        "JSON with a charset",
        typed("application/json; charset=utf-8"),
        Expect::status(202, "queued"),
    );
    c.http(
        &mut o,
        "cancel with no body",
        Req::new("POST", "/api/runs/0123456789abcdef/cancel"),
        Expect::status(404, "no run"),
    );
    // Cross-site WebSocket hijacking.
    for (case, path, headers) in [
        (
            "worker socket from a web page",
            "/api/workers",
            vec![("Origin", "http://evil.example")],
        ),
        (
            "event socket from a web page",
            "/api/runs/0123456789abcdef/events",
            vec![("Origin", "http://evil.example")],
        ),
        (
            "worker socket, rebound Host",
            "/api/workers",
            vec![("Host", "evil.example")],
        ),
    ] {
        let got = attack::ws_connect(o.addr, path, None, &headers);
        let (got, ok) = match got {
            Ok(_) => ("upgraded".to_string(), false),
            Err((code, e)) => (format!("{code} {}", short(&e, 80)), code == 403),
        };
        c.after(
            &mut o,
            case,
            &format!("WS {path} {headers:?}"),
            "403",
            got,
            ok,
        );
    }
    let own_origin = [("Origin", own.as_str())];
    let got = attack::ws_connect(o.addr, "/api/workers", None, &own_origin);
    c.after(
        &mut o,
        "worker socket, own Origin",
        "WS /api/workers [Origin: own]",
        "upgraded",
        got.as_ref()
            .map_or_else(|(c, e)| format!("{c} {e}"), |_| "upgraded".into()),
        got.is_ok(),
    );
    drop(got);
    // With the editor bundle: its files are open, everything else wants the token.
    let dir = attack::scratch("auth-bundle");
    std::fs::write(
        dir.join("index.html"),
        "<!doctype html><title>editor page</title>",
    )
    .unwrap();
    std::fs::write(dir.join("app.wasm"), b"\0asm\x01\0\0\0").unwrap();
    let mut e = Server::start(
        "auth-editor",
        Some(TOKEN),
        &["--editor", dir.to_str().unwrap_or_default()],
    )
    .expect("sluice serve starts");
    c.http(
        &mut e,
        "editor page without token",
        Req::get("/").without("Authorization"),
        Expect::status(200, "editor page"),
    );
    c.http(
        &mut e,
        "editor file without token",
        Req::get("/app.wasm").without("Authorization"),
        Expect::status(200, ""),
    );
    c.http(
        &mut e,
        "API beside the editor",
        Req::get("/api/runs").without("Authorization"),
        unauthorized(),
    );
    c.http(
        &mut e,
        "metrics beside the editor",
        Req::get("/metrics").without("Authorization"),
        unauthorized(),
    );
    c.finish(&[&t, &o, &e]);
}

// ---------------------------------------------------------------------------------------
// 7. Workers.

/// Polls `/api/devices` until no remote worker is listed (at most 15 s).
fn remote_workers_gone(s: &Server) -> Result<(), String> {
    let t = Instant::now();
    loop {
        let d = s.get("/api/devices").json();
        let remote: Vec<String> = d["workers"]
            .as_array()
            .map(|w| {
                w.iter()
                    .filter(|w| w["kind"] == "remote")
                    .map(|w| w["id"].to_string())
                    .collect()
            })
            .unwrap_or_default();
        if remote.is_empty() {
            return Ok(());
        }
        if t.elapsed() > Duration::from_secs(15) {
            return Err(format!("still listed: {}", remote.join(", ")));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A two-stage run of the MLP with both stages pinned on one worker.
fn pinned(worker: &str) -> Value {
    json!({ "seed_inputs": true, "graph": "mlp", "batch": 2, "stages": 2, "workers": [worker, worker] })
}

fn hostile_worker_case(
    c: &mut Class,
    s: &mut Server,
    hostility: Hostility,
    status: &str,
    fragment: &str,
) {
    let case = format!("worker answers {hostility:?}");
    let fake = match peers::fake_worker(s.addr, s.token.as_deref(), hostility) {
        Ok(f) => f,
        Err(e) => {
            c.after(s, &case, "fake worker joins", "welcome", e, false);
            return;
        }
    };
    let r = s.json("POST", "/api/runs", &pinned(&fake.id));
    let id = r.json()["id"].as_str().unwrap_or("").to_string();
    let end = if r.status == 202 {
        s.wait_run(&id, Duration::from_secs(60))
    } else {
        Err(format!("{} {}", r.status, short(&r.text(), 120)))
    };
    let (got, ok) = match &end {
        Ok(run) => {
            let error = run["error"].as_str().unwrap_or("");
            (
                format!("{} {}", run["status"], short(error, 140)),
                run["status"]
                    .as_str()
                    .is_some_and(|st| status.split('|').any(|x| x == st))
                    && error.to_lowercase().contains(&fragment.to_lowercase())
                    && !error.contains("panick"),
            )
        }
        Err(e) => (e.clone(), false),
    };
    fake.stop();
    let gone = remote_workers_gone(s);
    c.after(
        s,
        &case,
        &format!("2-stage run pinned on a fake worker ({hostility:?})"),
        &format!("{status} \"{fragment}\", worker deregistered"),
        format!(
            "{got}; {}",
            gone.as_ref()
                .map_or_else(|e| e.clone(), |_| "deregistered".into())
        ),
        ok && gone.is_ok(),
    );
}

/// A stage plan and its weights as a server would send them: the MLP bound to two
/// samples.
fn real_plan() -> (Value, Vec<(Value, Vec<u8>)>) {
    let g = sluice_tests::load_asset("assets/graphs/mlp.json");
    let bound = sluice_tests::bind_all(&g, 2);
    let plan = sluice_engine::plan::Plan::new(&bound).expect("the MLP plans");
    let weights = plan
        .params
        .iter()
        .map(|(key, v)| {
            let value = &plan.values[*v];
            let n: usize = value.shape.iter().product();
            (
                json!({ "name": key, "shape": value.shape, "dtype": "f32" }),
                vec![0u8; n * 4],
            )
        })
        .collect();
    (
        serde_json::to_value(&plan).expect("a plan serialises"),
        weights,
    )
}

fn load(job: &str, plan: &Value, weights: &[(Value, Vec<u8>)]) -> (Value, Vec<Vec<u8>>) {
    (
        json!({ "type": "load", "job": job, "plan": plan, "stage": 0,
                "weights": weights.iter().map(|(h, _)| h.clone()).collect::<Vec<_>>() }),
        weights.iter().map(|(_, f)| f.clone()).collect(),
    )
}

/// What a hostile server sends before hanging up, to see the worker reconnect.
enum Junk {
    Text(&'static str),
    Binary(Vec<u8>),
    Announce(usize),
}

/// A `sluice worker` process joined to a fake server, started again when a case kills it
/// so the cases after it still report.
struct Target {
    child: std::process::Child,
    guard: attack::MemoryGuard,
    log: PathBuf,
    conn: Option<peers::Joined>,
    /// Whether the last exchange failed (the connection is then gone).
    broken: bool,
    earlier_peak: u64,
}

impl Target {
    fn start(server: &peers::FakeServer) -> Target {
        let log = attack::scratch("workers-worker").join("worker.log");
        let child = sluice_tests::sluice()
            .args([
                "worker",
                "--connect",
                &format!("ws://{}", server.addr),
                "--name",
                "target",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("a log file"))
            .spawn()
            .expect("sluice worker starts");
        Target {
            guard: attack::MemoryGuard::watch(child.id()),
            child,
            log,
            conn: None,
            broken: false,
            earlier_peak: 0,
        }
    }

    /// Waits for the worker's (next) connection; returns its hello.
    fn join(&mut self, server: &peers::FakeServer) -> Result<String, String> {
        let joined = server.accept(Duration::from_secs(180))?;
        let hello = joined.hello.to_string();
        self.conn = Some(joined);
        self.broken = false;
        Ok(hello)
    }

    /// Sends a message and its frames, and reads the answer.
    fn exchange(&mut self, msg: &Value, frames: Vec<Vec<u8>>) -> Result<Value, String> {
        let conn = self.conn.as_mut().ok_or("not connected")?;
        let r = conn.send(msg, &frames).and_then(|()| conn.reply());
        self.broken |= r.is_err();
        r
    }

    /// Sends junk and hangs up; the worker must connect again.
    fn reconnect_after(&mut self, server: &peers::FakeServer, junk: Junk) -> Result<(), String> {
        let mut conn = self.conn.take().ok_or("not connected")?;
        let _ = match junk {
            Junk::Text(t) => conn.send_text(t),
            Junk::Binary(b) => conn.send_binary(b),
            Junk::Announce(n) => conn.send(
                &json!({ "type": "load", "job": "j", "plan": {}, "stage": 0,
                         "weights": (0..n).map(|i| json!({ "name": format!("w{i}"), "shape": [4], "dtype": "f32" })).collect::<Vec<_>>() }),
                &[],
            ),
        };
        conn.close();
        self.join(server).map(|_| ())
    }

    /// Refuses the worker; returns how it ended and whether that was exit 1 naming the
    /// refusal.
    fn refuse(&mut self) -> (String, bool) {
        if let Some(conn) = self.conn.as_mut() {
            let _ = conn.send(&json!({ "type": "refused", "error": "go away" }), &[]);
        }
        let t = Instant::now();
        let status = loop {
            match self.child.try_wait() {
                Ok(Some(st)) => break Some(st),
                _ if t.elapsed() > Duration::from_secs(30) => break None,
                _ => std::thread::sleep(Duration::from_millis(50)),
            }
        };
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        (
            format!(
                "{}: {}",
                status.map_or_else(|| "still running".into(), attack::describe_exit),
                short(log.trim().lines().last().unwrap_or(""), 120)
            ),
            status.and_then(|s| s.code()) == Some(1) && log.contains("refused"),
        )
    }

    /// Records a case; a worker the case killed is described, started again and joined,
    /// and one that dropped the connection is joined again.
    #[allow(clippy::too_many_arguments)]
    fn row(
        &mut self,
        c: &mut Class,
        server: &peers::FakeServer,
        case: &str,
        input: &str,
        expected: &str,
        got: String,
        ok: bool,
    ) {
        // A worker that dropped the connection may be on its way out: give it a moment.
        let t = Instant::now();
        while self.broken
            && matches!(self.child.try_wait(), Ok(None))
            && t.elapsed() < Duration::from_secs(3)
        {
            std::thread::sleep(Duration::from_millis(50));
        }
        if matches!(self.child.try_wait(), Ok(None)) {
            c.row(case, input, expected, &got, ok);
            if self.broken {
                let _ = self.join(server);
            }
            return;
        }
        let status = self
            .child
            .try_wait()
            .ok()
            .flatten()
            .map_or_else(|| "gone".into(), attack::describe_exit);
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let cause = log
            .lines()
            .find(|l| l.contains("panicked"))
            .or_else(|| log.lines().last())
            .unwrap_or("");
        c.row(
            case,
            input,
            expected,
            &format!("{got}; the worker died ({status}): {}", short(cause, 160)),
            false,
        );
        let earlier_peak = self.earlier_peak.max(self.guard.peak());
        *self = Target::start(server);
        self.earlier_peak = earlier_peak;
        let _ = self.join(server);
    }

    fn peak(&self) -> u64 {
        self.guard.peak().max(self.earlier_peak)
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn workers() {
    let mut c = Class::new("workers");
    let mut s = Server::start("workers", Some(TOKEN), &[]).expect("sluice serve starts");
    for (h, status, fragment) in [
        (Hostility::WrongShape, "failed", "does not fit the stage"),
        (Hostility::WrongDtype, "failed", "does not fit the stage"),
        (
            Hostility::UnknownName,
            "failed",
            "is not one of the stage's",
        ),
        (Hostility::OverflowShape, "failed", "does not fit the stage"),
        (Hostility::VanishMidResult, "failed", "disconnected"),
        // Events at the end of time are only figures: the run may keep them or fail,
        // but nothing may panic.
        (Hostility::EventsAtTheEndOfTime, "succeeded|failed", ""),
    ] {
        hostile_worker_case(&mut c, &mut s, h, status, fragment);
    }
    // A flood right after joining drops the worker.
    match peers::fake_worker(s.addr, Some(TOKEN), Hostility::Flood) {
        Ok(fake) => {
            std::thread::sleep(Duration::from_millis(500));
            let gone = remote_workers_gone(&s);
            let log = fake.log().join("; ");
            c.after(
                &mut s,
                "20 MB message from a worker",
                "a text message of 20 MB after the welcome",
                "the worker is dropped",
                format!(
                    "{}; {}",
                    gone.as_ref()
                        .map_or_else(|e| e.clone(), |_| "dropped".into()),
                    short(&log, 120)
                ),
                gone.is_ok(),
            );
        }
        Err(e) => c.after(
            &mut s,
            "20 MB message from a worker",
            "fake worker joins",
            "welcome",
            e,
            false,
        ),
    }
    // A worker that never answers: cancelling the run ends it, and a worker that then
    // hangs up leaves no registration behind.
    match peers::fake_worker(s.addr, Some(TOKEN), Hostility::Silent) {
        Ok(fake) => {
            let r = s.json("POST", "/api/runs", &pinned(&fake.id));
            let id = r.json()["id"].as_str().unwrap_or("").to_string();
            let t = Instant::now();
            while s.get(&format!("/api/runs/{id}")).json()["status"] == "queued"
                && t.elapsed() < Duration::from_secs(30)
            {
                std::thread::sleep(Duration::from_millis(100));
            }
            let cancel = s.send(&Req::new("POST", &format!("/api/runs/{id}/cancel")));
            let cancelled_at = Instant::now();
            let end = s.wait_run(&id, Duration::from_secs(30));
            let ok = end.as_ref().is_ok_and(|r| r["status"] == "cancelled");
            c.after(
                &mut s,
                "cancel a run waiting on a silent worker",
                "2-stage run on a worker that never answers, then cancel",
                "cancelled within 30 s",
                format!(
                    "cancel {}; {} after {:.1} s",
                    cancel.map_or_else(|e| e.to_string(), |r| r.status.to_string()),
                    end.map_or_else(|e| e, |r| r["status"].to_string()),
                    cancelled_at.elapsed().as_secs_f64()
                ),
                ok,
            );
            fake.stop();
            let gone = remote_workers_gone(&s);
            c.after(
                &mut s,
                "the silent worker hangs up",
                "its connection closed",
                "deregistered",
                gone.as_ref()
                    .map_or_else(|e| e.clone(), |_| "deregistered".into()),
                gone.is_ok(),
            );
        }
        Err(e) => c.after(
            &mut s,
            "silent worker",
            "fake worker joins",
            "welcome",
            e,
            false,
        ),
    }
    match peers::fake_worker(s.addr, Some(TOKEN), Hostility::Silent) {
        Ok(fake) => {
            let r = s.json("POST", "/api/runs", &pinned(&fake.id));
            let id = r.json()["id"].as_str().unwrap_or("").to_string();
            std::thread::sleep(Duration::from_secs(2));
            fake.stop();
            let end = s.wait_run(&id, Duration::from_secs(30));
            let ok = end.as_ref().is_ok_and(|r| {
                r["status"] == "failed"
                    && r["error"]
                        .as_str()
                        .is_some_and(|e| e.contains("disconnected"))
            });
            c.after(
                &mut s,
                "silent worker hangs up mid-run",
                "2-stage run, the worker disconnects",
                "failed \"disconnected\" within 30 s",
                end.map_or_else(|e| e, |r| format!("{} {}", r["status"], r["error"])),
                ok,
            );
        }
        Err(e) => c.after(
            &mut s,
            "silent worker hangs up",
            "fake worker joins",
            "welcome",
            e,
            false,
        ),
    }
    let mut servers = vec![];
    if let Some(mut m) = c.server("max-workers", Some(TOKEN), &["--max-workers", "4"]) {
        let joined: Vec<_> = (0..8)
            .map(|_| peers::fake_worker(m.addr, Some(TOKEN), Hostility::Silent))
            .collect();
        let welcomed = joined.iter().filter(|j| j.is_ok()).count();
        let refusals: Vec<String> = joined
            .iter()
            .filter_map(|j| j.as_ref().err().map(|e| short(e, 60)))
            .collect();
        c.after(
            &mut m,
            "8 workers join, limit 4",
            "8 fake workers say hello",
            "≤ 4 welcomed",
            format!("{welcomed} welcomed; refused: {}", refusals.join(" | ")),
            welcomed <= 4,
        );
        drop(joined);
        servers.push(m);
    }
    // `sluice worker` against a hostile server.
    let fake_server = peers::FakeServer::new();
    let mut t = Target::start(&fake_server);
    let (plan, weights) = real_plan();
    let shown = |r: &Result<Value, String>| {
        r.as_ref()
            .map_or_else(|e| e.clone(), |v| short(&v.to_string(), 140))
    };
    let error_for = |r: &Result<Value, String>, job: &str| {
        r.as_ref()
            .is_ok_and(|v| v["type"] == "error" && v["job"] == job)
    };
    let joined = t.join(&fake_server);
    t.row(
        &mut c,
        &fake_server,
        "the worker joins",
        "sluice worker --connect ws://fake",
        "hello",
        joined.map_or_else(|e| e, |h| short(&h, 100)),
        true,
    );
    let garbage =
        json!({ "type": "load", "job": "j1", "plan": "garbage", "weights": [], "stage": 0 });
    let r = t.exchange(&garbage, vec![]);
    t.row(
        &mut c,
        &fake_server,
        "load a plan that is not one",
        "load {plan: \"garbage\"}",
        "error for j1",
        shown(&r),
        error_for(&r, "j1"),
    );
    let r = t.exchange(
        &json!({ "type": "load", "job": "j2", "plan": plan, "stage": 0,
                 "weights": [{ "name": "fc1.weight", "shape": [1u64 << 40], "dtype": "f32" }] }),
        vec![vec![0u8; 16]],
    );
    t.row(
        &mut c,
        &fake_server,
        "weight header of 2^40 elements",
        "load, weight [2^40] with a 16 B frame",
        "error for j2",
        shown(&r),
        error_for(&r, "j2"),
    );
    let r = t.exchange(
        &json!({ "type": "load", "job": "j3", "plan": plan, "stage": 0,
                 "weights": [{ "name": "fc1.weight", "shape": [TWO_63, TWO_63], "dtype": "f32" }] }),
        vec![vec![0u8; 16]],
    );
    t.row(
        &mut c,
        &fake_server,
        "weight shape overflows",
        "load, weight [2^63, 2^63]",
        "error for j3",
        shown(&r),
        error_for(&r, "j3"),
    );
    let r = t.exchange(
        &json!({ "type": "compute", "job": "nobody", "micro_batch": 0, "inputs": [] }),
        vec![],
    );
    t.row(
        &mut c,
        &fake_server,
        "compute for no loaded job",
        "compute {job: nobody}",
        "error for nobody",
        shown(&r),
        error_for(&r, "nobody"),
    );
    let mut huge = plan.clone();
    if let Some(v) = huge["values"].get_mut(0) {
        v["shape"] = json!([1u64 << 31, 1u64 << 31]);
    }
    let (msg, frames) = load("j4", &huge, &weights);
    let r = t.exchange(&msg, frames);
    t.row(
        &mut c,
        &fake_server,
        "plan with a 2^62-element buffer",
        "load of the MLP plan, one value [2^31, 2^31]",
        "error for j4",
        shown(&r),
        error_for(&r, "j4"),
    );
    let mut lying = plan.clone();
    if let Some(steps) = lying["steps"].as_array_mut() {
        steps.truncate(1);
        if let Some(step) = steps.first_mut() {
            step["inputs"] = json!([usize::MAX]);
        }
    }
    let (msg, frames) = load("j5", &lying, &weights);
    let r = t.exchange(&msg, frames);
    t.row(
        &mut c,
        &fake_server,
        "plan step naming no value",
        "load of the MLP plan, a step's input usize::MAX",
        "error for j5",
        shown(&r),
        error_for(&r, "j5"),
    );
    let (msg, frames) = load("j6", &plan, &weights);
    let r = t.exchange(&msg, frames);
    let loaded = r.as_ref().is_ok_and(|v| v["type"] == "loaded");
    t.row(
        &mut c,
        &fake_server,
        "a valid plan loads",
        "load of the MLP plan",
        "loaded j6",
        shown(&r),
        loaded,
    );
    let r = t.exchange(
        &json!({ "type": "compute", "job": "j6", "micro_batch": 0,
                 "inputs": [{ "name": "x", "shape": [1], "dtype": "f32" }] }),
        vec![vec![0u8; 4]],
    );
    t.row(
        &mut c,
        &fake_server,
        "compute with the wrong input shape",
        "compute j6, x as [1]",
        "error for j6",
        shown(&r),
        error_for(&r, "j6"),
    );
    let mut answered = 0;
    for i in 0..20 {
        let (msg, frames) = load(&format!("many{i}"), &plan, &weights);
        if t.exchange(&msg, frames).is_ok() {
            answered += 1;
        }
    }
    t.row(
        &mut c,
        &fake_server,
        "20 more loads",
        "load ×20 of the MLP plan",
        "each answered (loaded or error)",
        format!("{answered} answered"),
        answered == 20,
    );
    for (case, input, junk) in [
        (
            "a message that is not JSON",
            "text frame \"this is not JSON\"",
            Junk::Text("this is not JSON"),
        ),
        (
            "a binary frame first",
            "binary frame of 64 B",
            Junk::Binary(vec![0xFF; 64]),
        ),
        (
            "weights announced, connection closed",
            "load with 100 weights, then close",
            Junk::Announce(100),
        ),
    ] {
        let again = t.reconnect_after(&fake_server, junk);
        t.row(
            &mut c,
            &fake_server,
            case,
            input,
            "the worker reconnects",
            again.clone().map_or_else(|e| e, |_| "reconnected".into()),
            again.is_ok(),
        );
    }
    let exit = t.refuse();
    c.row(
        "refused by the server",
        "refused {error: \"go away\"}",
        "exit 1 \"refused\"",
        &exit.0,
        exit.1,
    );
    c.row(
        "peak memory (VmHWM)",
        "sluice worker against the hostile server",
        &format!("< {:.0} MiB", mib(MEMORY_BOUND)),
        &format!("{:.0} MiB", mib(t.peak())),
        t.peak() < MEMORY_BOUND,
    );
    let mut refs: Vec<&Server> = vec![&s];
    refs.extend(servers.iter());
    c.finish(&refs);
}

// ---------------------------------------------------------------------------------------
// 8. Durability.

#[test]
fn durability() {
    let mut c = Class::new("durability");
    let mut s = Server::start("durability", None, &[]).expect("sluice serve starts");
    let mlp: Value =
        serde_json::from_str(&std::fs::read_to_string(asset("assets/graphs/mlp.json")).unwrap())
            .unwrap();
    // 24 writers, each document padded to 2 MiB so the writes overlap.
    let versions: Vec<Value> = (0..24)
        .map(|i| {
            let mut g = mlp.clone();
            g["name"] = json!(format!("writer-{i}"));
            g
        })
        .collect();
    let bodies: Vec<Vec<u8>> = versions
        .iter()
        .map(|v| format!("{{{}{}", " ".repeat(2 << 20), &v.to_string()[1..]).into_bytes())
        .collect();
    let (addr, host) = (s.addr, s.host());
    let statuses: Vec<String> = std::thread::scope(|scope| {
        let handles: Vec<_> = bodies
            .iter()
            .map(|b| {
                let host = host.clone();
                scope.spawn(move || {
                    let req = Req::raw_json("PUT", "/api/graphs/contended", b.clone());
                    attack::exchange(addr, &req.bytes(&host, None), attack::HANG_GUARD)
                        .map_or_else(|e| e.to_string(), |r| r.status.to_string())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_default())
            .collect()
    });
    let all_saved = statuses.iter().all(|st| st == "200" || st == "201");
    c.after(
        &mut s,
        "24 PUTs of one graph at once",
        "PUT /api/graphs/contended ×24, 2 MiB each",
        "200|201 each",
        statuses.join(","),
        all_saved,
    );
    let saved = s.get("/api/graphs/contended").json();
    let whole = versions.contains(&saved);
    c.after(
        &mut s,
        "...the stored graph is one of them",
        "GET /api/graphs/contended",
        "exactly one writer's document",
        format!("name {}", saved["name"]),
        whole,
    );
    let strays: Vec<String> = std::fs::read_dir(s.workspace.join("graphs"))
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| !n.ends_with(".json") || n.starts_with('.'))
                .collect()
        })
        .unwrap_or_default();
    c.row(
        "...no temp files left",
        "the graphs folder",
        "only NAME.json",
        &format!("{strays:?}"),
        strays.is_empty(),
    );
    // A second server on the same workspace.
    let run = s
        .json(
            "POST",
            "/api/runs",
            &json!({ "seed_inputs": true, "graph": "transformer_block", "batch": 16 }),
        )
        .json();
    let second = Server::start_in(
        &s.workspace,
        &s.workspace.with_file_name("second.log"),
        None,
        &[],
    );
    let (got, ok) = match second {
        Ok(mut other) => {
            other.kill();
            (
                "a second server started on the workspace".to_string(),
                false,
            )
        }
        Err(e) => {
            let lower = e.0.to_lowercase();
            (
                short(&e.0, 160),
                lower.contains("lock") || lower.contains("in use"),
            )
        }
    };
    c.after(
        &mut s,
        "second server, same workspace",
        "sluice serve --workspace SAME",
        "exit 1 naming the lock",
        got,
        ok,
    );
    let end = run["id"]
        .as_str()
        .map(|id| s.wait_run(id, Duration::from_secs(180)));
    let ok = matches!(&end, Some(Ok(r)) if r["status"] == "succeeded");
    c.after(
        &mut s,
        "...the first server's run is untouched",
        "the run queued before",
        "succeeded",
        match end {
            Some(Ok(r)) => format!("{} {}", r["status"], r["error"]),
            Some(Err(e)) => e,
            None => "not accepted".into(),
        },
        ok,
    );
    let wal = s.workspace.join("sluice.db-wal").exists();
    c.row(
        "history in WAL mode",
        "the workspace",
        "sluice.db-wal exists",
        &format!("sluice.db-wal exists: {wal}"),
        wal,
    );
    // Large uploads are kept as files, not in the history every listing loads.
    let x = sluice_engine::Tensor::f32(vec![330, 784], vec![0.25; 330 * 784]);
    let input = b64(&sluice_engine::npy::to_bytes(&x).unwrap());
    let ids: Vec<String> = (0..8)
        .filter_map(|seed| {
            s.json(
                "POST",
                "/api/runs",
                &json!({ "graph": "mlp", "batch": 330, "seed": seed, "inputs": { "x": input } }),
            )
            .json()["id"]
                .as_str()
                .map(str::to_string)
        })
        .collect();
    let ended = ids
        .iter()
        .filter(|id| s.wait_run(id, Duration::from_secs(180)).is_ok())
        .count();
    c.row(
        "8 runs with 1 MB uploads",
        &format!(
            "POST /api/runs ×8, input of {:.1} MB base64",
            input.len() as f64 / 1e6
        ),
        "8 accepted and ended",
        &format!("{} accepted, {ended} ended", ids.len()),
        ids.len() == 8 && ended == 8,
    );
    for path in ["/api/runs", "/metrics", "/"] {
        let r = s.send(&Req::get(path));
        let (got, ok) = match &r {
            Ok(r) => (
                format!("{} {:.0} KiB", r.status, r.body.len() as f64 / 1024.0),
                r.status == 200 && r.body.len() < 256 << 10,
            ),
            Err(e) => (e.to_string(), false),
        };
        c.after(
            &mut s,
            "history listing stays small",
            &format!("GET {path}"),
            "200, < 256 KiB",
            got,
            ok,
        );
    }
    let db = std::fs::metadata(s.workspace.join("sluice.db")).map_or(0, |m| m.len());
    c.row(
        "the database stays small",
        "sluice.db after 8 MB of uploads",
        "< 2 MiB",
        &format!("{:.1} MiB", mib(db)),
        db < 2 << 20,
    );
    c.finish(&[&s]);
}

// ---------------------------------------------------------------------------------------
// The soak.

#[test]
#[ignore = "the soak runs for minutes: `cargo xtask soak [--minutes N]`"]
fn soak() {
    let minutes: f64 = std::env::var("SLUICE_SOAK_MINUTES")
        .ok()
        .and_then(|m| m.parse().ok())
        .unwrap_or(10.0);
    soak::soak(Duration::from_secs_f64(minutes * 60.0), TOKEN, MEMORY_BOUND);
}

// ---------------------------------------------------------------------------------------
// ONNX uploads: small models that fold into huge constants or weights, external data
// that is a FIFO, and run-time flags the importer cannot honour — through `sluice
// validate`, `import` and `run` and the server's model upload.

/// ONNX models built byte by byte for the hostile cases.
mod hostile_onnx {
    use prost::Message;
    use sluice_engine::onnx::proto::*;

    /// A tensor of int64 values.
    pub fn ints(dims: &[i64], values: &[i64]) -> TensorProto {
        TensorProto {
            dims: dims.to_vec(),
            data_type: data_type::INT64,
            int64_data: values.to_vec(),
            ..Default::default()
        }
    }

    /// A tensor of float values.
    pub fn floats(dims: &[i64], values: &[f32]) -> TensorProto {
        TensorProto {
            dims: dims.to_vec(),
            data_type: data_type::FLOAT,
            float_data: values.to_vec(),
            ..Default::default()
        }
    }

    fn tensor_attr(name: &str, t: TensorProto) -> AttributeProto {
        AttributeProto {
            name: name.into(),
            r#type: attribute_type::TENSOR,
            t: Some(t),
            ..Default::default()
        }
    }

    /// A node named `name` (its first output's name too).
    pub fn node(op: &str, name: &str, inputs: &[&str], extra_outputs: &[&str]) -> NodeProto {
        NodeProto {
            op_type: op.into(),
            name: name.into(),
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output: std::iter::once(name)
                .chain(extra_outputs.iter().copied())
                .map(str::to_string)
                .collect(),
            ..Default::default()
        }
    }

    /// A `Constant` node holding `t`.
    pub fn constant(name: &str, t: TensorProto) -> NodeProto {
        let mut n = node("Constant", name, &[], &[]);
        n.attribute.push(tensor_attr("value", t));
        n
    }

    /// A `ConstantOfShape` node filling `shape` with `value`.
    pub fn constant_of_shape(name: &str, shape: &str, value: TensorProto) -> NodeProto {
        let mut n = node("ConstantOfShape", name, &[shape], &[]);
        n.attribute.push(tensor_attr("value", value));
        n
    }

    /// A graph input or output: a tensor of `elem` with these sizes (`None`: the batch).
    pub fn value(name: &str, elem: i32, dims: &[Option<i64>]) -> ValueInfoProto {
        let dim = dims
            .iter()
            .map(|d| Dimension {
                dim_value: *d,
                dim_param: d.is_none().then(|| "N".to_string()),
            })
            .collect();
        ValueInfoProto {
            name: name.into(),
            r#type: Some(TypeProto {
                tensor_type: Some(TypeTensor {
                    elem_type: elem,
                    shape: Some(TensorShapeProto { dim }),
                }),
            }),
            ..Default::default()
        }
    }

    /// A model (opset 17) of these nodes, inputs, outputs (by name) and initialisers.
    pub fn model(
        nodes: Vec<NodeProto>,
        inputs: Vec<ValueInfoProto>,
        outputs: &[&str],
        initializer: Vec<TensorProto>,
    ) -> Vec<u8> {
        ModelProto {
            ir_version: 8,
            opset_import: vec![OperatorSetIdProto {
                domain: String::new(),
                version: 17,
            }],
            graph: Some(GraphProto {
                node: nodes,
                name: "hostile".into(),
                initializer,
                input: inputs,
                output: outputs
                    .iter()
                    .map(|o| ValueInfoProto {
                        name: o.to_string(),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            }),
            ..Default::default()
        }
        .encode_to_vec()
    }

    /// The few-hundred-byte class: `ConstantOfShape` of one known shape of `elements`,
    /// filled with int64 (8 bytes an element on the host) or float.
    pub fn fill_bomb(elements: i64, int64: bool) -> Vec<u8> {
        let value = if int64 {
            ints(&[1], &[1])
        } else {
            floats(&[1], &[1.0])
        };
        model(
            vec![
                constant("shape", ints(&[1], &[elements])),
                constant_of_shape("bomb", "shape", value),
            ],
            vec![],
            &["bomb"],
            vec![],
        )
    }

    /// `Range(0, elements, 1)` of int64 scalars.
    pub fn range_bomb(elements: i64) -> Vec<u8> {
        model(
            vec![
                constant("start", ints(&[], &[0])),
                constant("limit", ints(&[], &[elements])),
                constant("delta", ints(&[], &[1])),
                node("Range", "bomb", &["start", "limit", "delta"], &[]),
            ],
            vec![],
            &["bomb"],
            vec![],
        )
    }

    /// `Concat` of one int64 vector of 2^20 entries with itself `times` times.
    pub fn concat_bomb(times: usize) -> Vec<u8> {
        let names = vec!["v"; times];
        let mut len = ints(&[1], &[1 << 20]);
        len.name = "len".into();
        model(
            vec![
                constant_of_shape("v", "len", ints(&[1], &[7])),
                node("Concat", "bomb", &names, &[]),
            ],
            vec![],
            &["bomb"],
            vec![len],
        )
    }

    /// `outputs` graph outputs, each a `ConstantOfShape` of 1024 × 1024 floats: every one
    /// is under the per-constant limit, together they are a weights file of
    /// `outputs` × 4 MiB (1 GiB for 256).
    pub fn weights_bomb(outputs: usize) -> Vec<u8> {
        let mut nodes = vec![constant("shape", ints(&[2], &[1024, 1024]))];
        let names: Vec<String> = (0..outputs).map(|k| format!("w{k}")).collect();
        for (k, n) in names.iter().enumerate() {
            nodes.push(constant_of_shape(
                n,
                "shape",
                floats(&[1], &[k as f32 + 0.5]),
            ));
        }
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        model(nodes, vec![], &refs, vec![])
    }

    /// `y = x + w` with `w` (4 floats) in the external file `location`.
    pub fn external(location: &str) -> Vec<u8> {
        let w = TensorProto {
            name: "w".into(),
            dims: vec![4],
            data_type: data_type::FLOAT,
            data_location: 1,
            external_data: [("location", location), ("offset", "0"), ("length", "16")]
                .iter()
                .map(|(k, v)| StringStringEntryProto {
                    key: k.to_string(),
                    value: v.to_string(),
                })
                .collect(),
            ..Default::default()
        };
        model(
            vec![node("Add", "y", &["x", "w"], &[])],
            vec![value("x", data_type::FLOAT, &[Some(1), Some(4)])],
            &["y"],
            vec![w],
        )
    }

    /// `Dropout(x, ratio, training_mode)` with `training_mode` a graph input: known
    /// only at run time.
    pub fn runtime_dropout() -> Vec<u8> {
        let mut ratio = floats(&[], &[0.5]);
        ratio.name = "ratio".into();
        model(
            vec![node("Dropout", "drop", &["x", "ratio", "training"], &[])],
            vec![
                value("x", data_type::FLOAT, &[None, Some(4)]),
                value("training", data_type::BOOL, &[]),
            ],
            &["drop"],
            vec![ratio],
        )
    }
}

/// Runs `sluice ARGS` within `timeout` and records whether it exited 1 with every one of
/// `fragments` in its output, without a panic, a hang or a peak memory over the bound.
fn cli_refuses(c: &mut Class, case: &str, args: &[&str], fragments: &[&str], timeout: Duration) {
    let mut cmd = sluice_tests::sluice();
    cmd.args(args);
    let f = run_guarded(cmd, timeout);
    let text = format!("{}\n{}", f.stdout, f.stderr).to_lowercase();
    let ok = f.code() == Some(1)
        && fragments
            .iter()
            .all(|frag| text.contains(&frag.to_lowercase()))
        && !text.contains("panicked")
        && f.peak < MEMORY_BOUND;
    let last = f.stderr.trim().lines().last().unwrap_or("").to_string();
    let shown: Vec<String> = args.iter().map(|a| shown_arg(a)).collect();
    c.row(
        case,
        &format!("sluice {}", shown.join(" ")),
        &format!("exit 1 {fragments:?}"),
        &format!(
            "{}, {:.0} MiB peak: {}",
            f.describe(),
            mib(f.peak),
            short(&last, 200)
        ),
        ok,
    );
}

/// Puts `bytes` as the ONNX model `name` and records whether the answer is `status` with
/// every one of `fragments`, the server still answering.
fn upload_model(
    c: &mut Class,
    s: &mut Server,
    case: &str,
    name: &str,
    bytes: Vec<u8>,
    status: u16,
    fragments: &[&str],
) {
    let req = Req::new("PUT", &format!("/api/graphs/{name}"))
        .header("Content-Type", "application/onnx")
        .body(bytes);
    let reply = s.send(&req);
    let expect = Expect::status(status, fragments.first().copied().unwrap_or(""));
    let (got, mut ok) = expect.judge(&reply, &c.secrets);
    if let Ok(r) = &reply {
        let text = r.text().to_lowercase();
        ok &= fragments.iter().all(|f| text.contains(&f.to_lowercase()));
    }
    c.after(
        s,
        case,
        &req.describe(),
        &format!("{status} {fragments:?}"),
        got,
        ok,
    );
}

#[test]
fn onnx_uploads() {
    use hostile_onnx::*;
    let mut c = Class::new("onnx uploads");
    let dir = attack::scratch("onnx-uploads");
    let quick = Duration::from_secs(20);
    let fold = ["'bomb'", "max_constant_elements", "--max-constant-elements"];
    let budget = ["max_import_bytes", "--max-import-bytes"];
    let int_bomb = fill_bomb(1 << 28, true);
    let float_bomb = fill_bomb(1 << 28, false);
    let weights = weights_bomb(256);
    let models = [
        ("fill-int64.onnx", int_bomb.clone()),
        ("fill-float.onnx", float_bomb.clone()),
        ("range.onnx", range_bomb(1 << 28)),
        ("concat.onnx", concat_bomb(256)),
        ("weights.onnx", weights.clone()),
        ("dropout.onnx", runtime_dropout()),
    ];
    for (name, bytes) in &models {
        put_file(&dir, name, bytes);
    }
    let path = |name: &str| dir.join(name).display().to_string();
    let out = dir.join("imported").display().to_string();
    c.row(
        "the int64 fill bomb is a few hundred bytes",
        "ConstantOfShape([2^28]) of int64",
        "< 444 B",
        &format!("{} B", int_bomb.len()),
        int_bomb.len() < 444,
    );
    for (case, file, fragments) in [
        (
            "ConstantOfShape of 2^28 int64 (2 GiB)",
            "fill-int64.onnx",
            &fold[..],
        ),
        (
            "ConstantOfShape of 2^28 floats (1 GiB)",
            "fill-float.onnx",
            &fold[..],
        ),
        ("Range of 2^28 int64", "range.onnx", &fold[..]),
        (
            "Concat of a 2^20 vector 256 times",
            "concat.onnx",
            &fold[..],
        ),
        (
            "256 fills of 4 MiB: a 1 GiB weights file",
            "weights.onnx",
            &budget[..],
        ),
    ] {
        let model = path(file);
        cli_refuses(
            &mut c,
            &format!("validate: {case}"),
            &["validate", &model],
            fragments,
            CLI_TIMEOUT,
        );
        cli_refuses(
            &mut c,
            &format!("import: {case}"),
            &["import", &model, "--out", &out],
            fragments,
            CLI_TIMEOUT,
        );
    }
    let written = std::fs::read_dir(&out).map_or(0, |d| d.count());
    c.row(
        "import writes nothing for a refused model",
        "the --out folder",
        "no file",
        &format!("{written} file(s)"),
        written == 0,
    );
    cli_refuses(
        &mut c,
        "run: 256 fills of 4 MiB",
        &["run", &path("weights.onnx")],
        &budget,
        CLI_TIMEOUT,
    );
    cli_refuses(
        &mut c,
        "validate: Dropout with a run-time training_mode",
        &["validate", &path("dropout.onnx")],
        &["'drop'", "training_mode", "run time"],
        CLI_TIMEOUT,
    );

    // External data that is a FIFO: an error naming the file, at once.
    let fifo_dir = dir.join("fifo");
    std::fs::create_dir_all(&fifo_dir).unwrap();
    let fifo_model = put_file(&fifo_dir, "model.onnx", &external("weights.bin"));
    let made = std::process::Command::new("mkfifo")
        .arg(fifo_dir.join("weights.bin"))
        .status()
        .is_ok_and(|s| s.success());
    c.row(
        "a FIFO as external data",
        "mkfifo weights.bin",
        "made",
        if made { "made" } else { "mkfifo failed" },
        made,
    );
    let fifo_model = fifo_model.display().to_string();
    let fifo_out = fifo_dir.join("out").display().to_string();
    let fifo = ["weights.bin", "not a regular file"];
    for (case, args) in [
        ("validate", vec!["validate", fifo_model.as_str()]),
        (
            "import",
            vec!["import", fifo_model.as_str(), "--out", fifo_out.as_str()],
        ),
        ("run", vec!["run", fifo_model.as_str()]),
    ] {
        cli_refuses(
            &mut c,
            &format!("{case}: external data is a FIFO"),
            &args,
            &fifo,
            quick,
        );
    }

    // The server's model upload runs the same importer: 422 naming the limit, alive after.
    let Some(mut s) = c.server("uploads", None, &[]) else {
        return c.finish(&[]);
    };
    upload_model(
        &mut c,
        &mut s,
        "upload: the int64 fill bomb",
        "bomb",
        int_bomb,
        422,
        &fold,
    );
    upload_model(
        &mut c,
        &mut s,
        "upload: the float fill bomb",
        "bomb",
        float_bomb,
        422,
        &fold,
    );
    upload_model(
        &mut c,
        &mut s,
        "upload: Range of 2^28",
        "bomb",
        range_bomb(1 << 28),
        422,
        &fold,
    );
    upload_model(
        &mut c,
        &mut s,
        "upload: a 1 GiB weights file from 256 fills",
        "bomb",
        weights,
        422,
        &budget,
    );
    upload_model(
        &mut c,
        &mut s,
        "upload: Dropout with a run-time training_mode",
        "drop",
        runtime_dropout(),
        422,
        &["'drop'", "training_mode", "run time"],
    );
    let listed = s.get("/api/graphs").text();
    c.row(
        "refused models are not stored",
        "GET /api/graphs",
        "neither 'bomb' nor 'drop'",
        &short(&listed, 120),
        !listed.contains("bomb") && !listed.contains("\"drop\""),
    );
    let mlp = std::fs::read(asset("tests/data/onnx-models/mlp_tiny/model.onnx")).unwrap();
    upload_model(
        &mut c,
        &mut s,
        "upload: a real model still imports",
        "mlp_onnx",
        mlp,
        201,
        &[],
    );
    c.finish(&[&s]);
}

// ---------------------------------------------------------------------------------------
// Stored models and connections (issue 34): a model's graph and weights as one commit,
// versions keeping both, stored graphs checked as `sluice validate` checks them, and one
// client unable to hold every connection.

/// External tensor data of a model in memory: there is none.
struct NoExternalData;

impl sluice_engine::onnx::ExternalData for NoExternalData {
    fn read(&self, location: &str, _: u64, _: Option<u64>) -> Result<Vec<u8>, String> {
        Err(format!("no external data '{location}'"))
    }
}

/// A tiny model as ONNX bytes: the `mlp_tiny` fixture (`x [N, 4]`, two `Gemm` layers
/// whose weights import as a weights file) named `name`, every weight multiplied by
/// `scale`, its output `out` wide (3 as in the fixture, or more: other shapes). Also its
/// outputs for [`tiny_input`] by the engine's CPU reference.
fn tiny_model(name: &str, out: usize, scale: f32) -> (Vec<u8>, sluice_engine::Tensor) {
    use prost::Message;
    use sluice_engine::onnx::proto::ModelProto;
    let bytes = std::fs::read(asset("tests/data/onnx-models/mlp_tiny/model.onnx"))
        .expect("the mlp_tiny fixture");
    let mut model = ModelProto::decode(bytes.as_slice()).expect("the fixture decodes");
    let graph = model.graph.as_mut().expect("the fixture has a graph");
    graph.name = name.to_string();
    for t in &mut graph.initializer {
        let mut values: Vec<f32> = if t.raw_data.is_empty() {
            t.float_data.clone()
        } else {
            t.raw_data
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect()
        };
        // The last layer (3 outputs of 8) widened: its rows repeated.
        if t.dims.first() == Some(&3) {
            let row = values.len() / 3;
            let mut wide = values.clone();
            wide.extend((3..out).flat_map(|r| values[(r % 3) * row..(r % 3 + 1) * row].to_vec()));
            values = wide;
            t.dims[0] = out as i64;
        }
        t.raw_data = values
            .iter()
            .flat_map(|v| (v * scale).to_le_bytes())
            .collect();
        t.float_data.clear();
    }
    for o in &mut graph.output {
        let dims = o
            .r#type
            .as_mut()
            .and_then(|t| t.tensor_type.as_mut())
            .and_then(|t| t.shape.as_mut());
        if let Some(d) = dims.and_then(|s| s.dim.get_mut(1)) {
            d.dim_value = Some(out as i64);
        }
    }
    let bytes = model.encode_to_vec();
    let limits = sluice_engine::limits::Limits::default();
    let imported = sluice_engine::onnx::import(&bytes, &NoExternalData, &limits)
        .expect("the tiny model imports");
    let graph = sluice_engine::Graph::build(imported.doc).expect("the tiny model checks");
    let bound = sluice_tests::bind_all(&graph, 2);
    let x = sluice_engine::npy::parse(&tiny_input()).expect("the input parses");
    let inputs = std::collections::HashMap::from([("x".to_string(), x)]);
    let mut outputs = sluice_engine::cpu::run(&bound, &imported.weights, &inputs)
        .expect("the CPU reference runs");
    (bytes, outputs.swap_remove(0).1)
}

/// The tiny models' input: `x [2, 4]` as `.npy` bytes.
fn tiny_input() -> Vec<u8> {
    let values: Vec<f32> = (0..8).map(|i| i as f32 * 0.25 - 1.0).collect();
    let t = sluice_engine::Tensor::f32(vec![2, 4], values);
    sluice_engine::npy::to_bytes(&t).expect("an .npy file")
}

/// `PUT /api/graphs/NAME` with an ONNX model.
fn put_model(name: &str, model: &[u8]) -> Req {
    Req::new("PUT", &format!("/api/graphs/{name}"))
        .header("Content-Type", "application/onnx")
        .body(model.to_vec())
}

/// The stored graph `name` and the weights it names, read as a client reads them:
/// `(the graph's name, its weights' bytes)`.
fn stored_pair(s: &Server, name: &str) -> Result<(String, Vec<u8>), String> {
    let g = s
        .send(&Req::get(&format!("/api/graphs/{name}")))
        .map_err(|e| e.to_string())?;
    if g.status != 200 {
        return Err(format!("GET graph: {} {}", g.status, short(&g.text(), 120)));
    }
    let doc = g.json();
    let file = doc["params"]["file"].as_str().unwrap_or("").to_string();
    let w = s
        .send(&Req::get(&format!("/api/weights/{file}")))
        .map_err(|e| e.to_string())?;
    if w.status != 200 {
        return Err(format!(
            "GET weights {file}: {} {}",
            w.status,
            short(&w.text(), 120)
        ));
    }
    Ok((doc["name"].as_str().unwrap_or("").to_string(), w.body))
}

/// Runs the stored graph `name` on [`tiny_input`]; its output `logits`.
fn run_tiny(s: &Server, name: &str) -> Result<sluice_engine::Tensor, String> {
    use base64::Engine;
    let input = base64::engine::general_purpose::STANDARD.encode(tiny_input());
    let body = json!({ "graph": name, "batch": 2, "inputs": { "x": input } });
    let r = s
        .send(&Req::json("POST", "/api/runs", &body))
        .map_err(|e| e.to_string())?;
    if r.status != 202 {
        return Err(format!("run: {} {}", r.status, short(&r.text(), 160)));
    }
    let id = r.json()["id"].as_str().unwrap_or("").to_string();
    let run = s.wait_run(&id, Duration::from_secs(120))?;
    if run["status"] != "succeeded" {
        return Err(format!(
            "run {}: {}",
            run["status"],
            short(&run["error"].to_string(), 160)
        ));
    }
    let out = s
        .send(&Req::get(&format!("/api/runs/{id}/outputs/logits")))
        .map_err(|e| e.to_string())?;
    sluice_engine::npy::parse(&out.body).map_err(|e| format!("output: {e}"))
}

/// Whether a run's output is a model's (within the server device's rounding).
fn same_output(got: &sluice_engine::Tensor, want: &sluice_engine::Tensor) -> bool {
    sluice_tests::compare("output", got, want, 1e-4, 1e-4).is_ok()
}

#[test]
fn stored_models() {
    let mut c = Class::new("stored models");
    let mut s = Server::start("stored-models", None, &[]).expect("sluice serve starts");
    let models =
        [("alpha", 3, 1.0), ("beta", 3, -0.5), ("gamma", 5, 2.0)].map(|(n, out, scale)| {
            let (model, output) = tiny_model(n, out, scale);
            (n, model, output)
        });
    // Each model alone: the weights a client reads back for it.
    let mut own: std::collections::HashMap<String, Vec<u8>> = Default::default();
    for (n, model, _) in &models {
        let r = s.send(&put_model(n, model)).expect("the server answers");
        assert_eq!(r.status, 201, "{n}: {}", r.text());
        let (named, weights) = stored_pair(&s, n).expect("the model reads back");
        assert_eq!(&named, n);
        own.insert(n.to_string(), weights);
    }
    // 300 rounds of two uploads of one name at once: alpha against beta (same shapes: a
    // mix would run without an error) or against gamma (other shapes).
    let (mut mismatches, mut failures, mut wrong_runs, mut runs) = (0, Vec::new(), 0, 0);
    for round in 0..300 {
        let (a, b) = (&models[0], &models[1 + round % 2]);
        let barrier = std::sync::Barrier::new(2);
        let statuses: Vec<u16> = std::thread::scope(|scope| {
            let handles: Vec<_> = [a, b]
                .map(|(_, model, _)| {
                    let (s, barrier) = (&s, &barrier);
                    scope.spawn(move || {
                        barrier.wait();
                        s.send(&put_model("race", model)).map_or(0, |r| r.status)
                    })
                })
                .into_iter()
                .collect();
            handles.into_iter().map(|h| h.join().unwrap_or(0)).collect()
        });
        if statuses.iter().any(|&c| c != 200 && c != 201) {
            failures.push(format!("round {round}: {statuses:?}"));
            continue;
        }
        match stored_pair(&s, "race") {
            Ok((named, weights)) if own.get(&named) == Some(&weights) => {}
            Ok((named, _)) => {
                mismatches += 1;
                failures.push(format!("round {round}: graph '{named}' with other weights"));
            }
            Err(e) => failures.push(format!("round {round}: {e}")),
        }
        if round % 100 == 99 {
            runs += 1;
            let named = stored_pair(&s, "race").map(|p| p.0).unwrap_or_default();
            let want = models.iter().find(|m| m.0 == named).map(|m| &m.2);
            match (run_tiny(&s, "race"), want) {
                (Ok(got), Some(want)) if same_output(&got, want) => {}
                (got, _) => {
                    wrong_runs += 1;
                    failures.push(format!("round {round}: run of '{named}': {:?}", got.err()));
                }
            }
        }
    }
    c.after(
        &mut s,
        "two uploads of one name at once, 300 rounds",
        "PUT /api/graphs/race ×2 at once (alpha | beta or gamma, ONNX)",
        "every stored graph with its own weights; runs with them",
        format!(
            "{mismatches} mismatches, {wrong_runs} of {runs} runs wrong{}",
            if failures.is_empty() {
                String::new()
            } else {
                format!("; {}", short(&failures.join("; "), 300))
            }
        ),
        failures.is_empty(),
    );
    // A deleted model restored from its version runs with its own weights.
    let alpha = &models[0];
    let got = (|| -> Result<String, String> {
        let put = s
            .send(&put_model("kept", &alpha.1))
            .map_err(|e| e.to_string())?;
        if put.status != 201 {
            return Err(format!("PUT: {}", put.status));
        }
        let before = run_tiny(&s, "kept")?;
        let del = s
            .send(&Req::new("DELETE", "/api/graphs/kept"))
            .map_err(|e| e.to_string())?;
        if del.status != 204 {
            return Err(format!("DELETE: {}", del.status));
        }
        let list = s.get("/api/graphs/kept/versions").json();
        let v = list["versions"][0]["version"]
            .as_str()
            .unwrap_or("0")
            .to_string();
        let r = s
            .send(&Req::new(
                "POST",
                &format!("/api/graphs/kept/versions/{v}/restore"),
            ))
            .map_err(|e| e.to_string())?;
        if r.status != 200 {
            return Err(format!("restore: {} {}", r.status, short(&r.text(), 120)));
        }
        let after = run_tiny(&s, "kept")?;
        if !same_output(&after, &before) || !same_output(&after, &alpha.2) {
            return Err("the restored model runs with other weights".into());
        }
        Ok("restored; runs with its own weights".into())
    })();
    c.after(
        &mut s,
        "a deleted model restored",
        "PUT (ONNX), run, DELETE, restore the version, run",
        "the same outputs as before the delete",
        got.clone().unwrap_or_else(|e| e),
        got.is_ok(),
    );
    // Graphs `sluice validate` refuses are refused by PUT with the same problems, and
    // nothing is stored.
    let dir = attack::scratch("stored-models-validate");
    let _ = std::fs::create_dir_all(&dir);
    let graph = |inputs: Value, nodes: Value, outputs: Value| json!({ "format": "sluice/graph@1", "name": "g", "inputs": inputs, "nodes": nodes, "outputs": outputs });
    let relu = |input: &str| json!([{ "id": "r", "op": "relu", "inputs": [input] }]);
    let x = |shape: Value| json!({ "x": { "shape": shape, "dtype": "f32" } });
    let many_inputs: serde_json::Map<String, Value> = (0..300)
        .map(|i| (format!("x{i}"), json!({ "shape": [1], "dtype": "f32" })))
        .collect();
    let refused = [
        (
            "a 2^64-1 dimension",
            graph(x(json!([u64::MAX])), relu("x"), json!(["r"])),
        ),
        (
            "a dimension past the tensor limit",
            graph(x(json!([1 << 20, 1 << 20])), relu("x"), json!(["r"])),
        ),
        (
            "a missing reference",
            graph(x(json!([2])), relu("nope"), json!(["r"])),
        ),
        (
            "an unknown output",
            graph(x(json!([2])), relu("x"), json!(["nope"])),
        ),
        (
            "rank 9, over --max-rank",
            graph(
                x(json!([1, 1, 1, 1, 1, 1, 1, 1, 1])),
                relu("x"),
                json!(["r"]),
            ),
        ),
        (
            "300 inputs, over --max-inputs",
            graph(Value::Object(many_inputs), relu("x0"), json!(["r"])),
        ),
        (
            "an unknown operator",
            graph(
                x(json!([2])),
                json!([{ "id": "r", "op": "frobnicate", "inputs": ["x"] }]),
                json!(["r"]),
            ),
        ),
    ];
    for (case, doc) in refused {
        let path = put_file(&dir, "g.json", doc.to_string().as_bytes());
        let mut cmd = sluice_tests::sluice();
        cmd.args(["validate", "--json"]).arg(&path);
        let f = run_guarded(cmd, CLI_TIMEOUT);
        let cli: Value = serde_json::from_str(f.stdout.trim()).unwrap_or(Value::Null);
        let put = s.send(&Req::json("PUT", "/api/graphs/refused", &doc));
        let stored = s
            .send(&Req::get("/api/graphs/refused"))
            .map_or(0, |r| r.status);
        let (got, ok) = match &put {
            Ok(r) => {
                let same = cli["valid"] == false && r.json()["problems"] == cli["problems"];
                (
                    format!(
                        "validate exit {:?}; PUT {} {}; {}; then GET {stored}",
                        f.code(),
                        r.status,
                        short(&r.json()["problems"][0].to_string(), 100),
                        if same {
                            "the same problems"
                        } else {
                            "other problems"
                        }
                    ),
                    f.code() == Some(1) && r.status == 422 && same && stored == 404,
                )
            }
            Err(e) => (e.to_string(), false),
        };
        c.after(
            &mut s,
            &format!("PUT of a graph validate refuses: {case}"),
            "PUT /api/graphs/refused",
            "422 with validate's problems; nothing stored",
            got,
            ok,
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
    c.finish(&[&s]);
}

/// A TCP connection to `addr` from the local address `from` (any 127.x.y.z is this
/// machine on Linux), so cases can be several clients.
fn connect_from(from: std::net::Ipv4Addr, addr: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
    socket.bind(&SocketAddr::from((from, 0)).into())?;
    socket.connect_timeout(&addr.into(), Duration::from_secs(10))?;
    Ok(socket.into())
}

/// `GET /api/ops` from the local address `from`: its status, or why there was none.
fn probe_from(s: &Server, from: std::net::Ipv4Addr) -> Result<u16, String> {
    let mut t = connect_from(from, s.addr).map_err(|e| e.to_string())?;
    t.set_read_timeout(Some(Duration::from_secs(10)))
        .and_then(|()| t.write_all(&Req::get("/api/ops").bytes(&s.host(), None)))
        .map_err(|e| e.to_string())?;
    attack::read_reply(&mut t)
        .map(|r| r.status)
        .map_err(|e| e.to_string())
}

#[test]
fn one_client_cannot_hold_every_connection() {
    let mut c = Class::new("connections");
    // A long header timeout, so held connections stay held while the probes run.
    let mut s = Server::start("connections", None, &["--header-timeout", "60"])
        .expect("sluice serve starts");
    let attacker = std::net::Ipv4Addr::new(127, 0, 0, 2);
    let prober = std::net::Ipv4Addr::new(127, 0, 0, 3);
    let head = format!("GET /api/ops HTTP/1.1\r\nHost: {}\r\n", s.host());
    for (case, input, bytes) in [
        (
            "300 half-sent request heads from one client",
            "300 connections from 127.0.0.2, each a request line and Host, never finished",
            head.as_bytes(),
        ),
        (
            "300 silent connections from one client",
            "300 connections from 127.0.0.2, no bytes",
            &b""[..],
        ),
    ] {
        let held: Vec<TcpStream> = (0..300)
            .filter_map(|_| connect_from(attacker, s.addr).ok())
            .filter_map(|mut t| t.write_all(bytes).ok().map(|()| t))
            .collect();
        std::thread::sleep(Duration::from_millis(500));
        let probes: Vec<Result<u16, String>> = (0..30).map(|_| probe_from(&s, prober)).collect();
        let answered = probes
            .iter()
            .filter(|r| r.as_ref().is_ok_and(|&c| c == 200))
            .count();
        let first_failure = probes.iter().find_map(|r| match r {
            Ok(200) => None,
            Ok(c) => Some(c.to_string()),
            Err(e) => Some(e.clone()),
        });
        c.after(
            &mut s,
            case,
            &format!(
                "{input} ({} opened); 30 × GET /api/ops from 127.0.0.3",
                held.len()
            ),
            "every probe answered 200",
            format!(
                "{answered} of 30 answered{}",
                first_failure.map_or(String::new(), |f| format!(" (first failure: {f})"))
            ),
            answered == 30,
        );
        drop(held);
        std::thread::sleep(Duration::from_millis(500));
    }
    // Its places come back once it leaves: the same client is served again.
    let got = probe_from(&s, attacker);
    c.after(
        &mut s,
        "the client is served again once it closes",
        "GET /api/ops from 127.0.0.2 after its connections closed",
        "200",
        got.clone().map_or_else(|e| e, |c| c.to_string()),
        got == Ok(200),
    );
    c.finish(&[&s]);
}

/// A run request of about 200 bytes whose one weight is larger than the largest buffer
/// the server's adapter binds (1 GiB on lavapipe, whose storage bindings stop at 128 MiB):
/// refused with the limit named before the weight is made, so the server's peak memory
/// stays far below the weight's size; `sluice run` on the same graph refuses alike.
#[test]
fn weights_sized_against_the_device_before_they_are_made() {
    let mut c = Class::new("device-sized weights");
    let Some(mut s) = c.server("device-weights", Some(TOKEN), &[]) else {
        return c.finish(&[]);
    };
    // The adapter's smaller buffer limit, as the server reports it.
    let devices = s.get("/api/devices").json();
    let adapter = &devices["workers"][0]["adapters"][0];
    let (buffer, binding) = (
        adapter["max_buffer_size"].as_u64().unwrap_or(u64::MAX),
        adapter["max_storage_binding"].as_u64().unwrap_or(u64::MAX),
    );
    let (limit, what) = if binding < buffer {
        (binding, "maximum storage binding size")
    } else {
        (buffer, "maximum buffer size")
    };
    // A [16384, out] f32 weight of 1 GiB, or just past the adapter's limit where that is
    // larger (the run's max_tensor_elements then refuses it first).
    const IN: u64 = 16_384;
    let out = IN.max((limit / (4 * IN)).saturating_add(1));
    let (status, fragment) = if out == IN && IN * IN * 4 > limit {
        (202, what)
    } else {
        (422, "max_tensor_elements")
    };
    let graph = doc(
        json!({ "x": { "shape": ["N", IN] } }),
        json!([{ "id": "fc", "op": "linear", "inputs": ["x"],
                 "attrs": { "out_features": out, "bias": false } }]),
        &["fc"],
    );
    let body = run_body(graph.clone(), 1);
    let bytes = body.to_string().len();
    let input = format!(
        "POST /api/runs, {bytes} bytes: linear [N, {IN}] → {out} ({} MiB of weights; the adapter's {what} is {} MiB)",
        IN.saturating_mul(out).saturating_mul(4) >> 20,
        limit >> 20
    );
    let reply = s.send(&Req::json("POST", "/api/runs", &body));
    let (got, ok) = match &reply {
        Ok(r) if r.status == 202 => {
            let id = r.json()["id"].as_str().unwrap_or("").to_string();
            match s.wait_run(&id, Duration::from_secs(120)) {
                Ok(run) => {
                    let error = run["error"].as_str().unwrap_or("");
                    (
                        format!("202, then {} {}", run["status"], short(error, 160)),
                        status == 202 && run["status"] == "failed" && error.contains(fragment),
                    )
                }
                Err(e) => (format!("202, then {e}"), false),
            }
        }
        Ok(r) => (
            format!("{} {}", r.status, short(&r.text(), 160)),
            r.status == status && r.text().contains(fragment),
        ),
        Err(e) => (format!("no answer: {e}"), false),
    };
    let expected = if status == 202 {
        format!("202, then failed naming the {fragment}")
    } else {
        format!("422 naming {fragment}")
    };
    c.after(
        &mut s,
        "weights past the device's buffer limit",
        &input,
        &expected,
        got,
        ok,
    );
    // No weight of that size was made: the peak is a fraction of it.
    let peak = s.peak_memory();
    c.row(
        "...and the server's peak memory",
        "VmHWM of sluice serve after the run",
        "< 512 MiB",
        &format!("{:.0} MiB", mib(peak)),
        peak < 512 << 20,
    );
    // The CLI on the same graph and adapter, with the input given.
    let dir = attack::scratch("device-weights-cli");
    let graph_file = put_file(&dir, "wide_linear.json", graph.to_string().as_bytes());
    let x = put_file(
        &dir,
        "x.npy",
        &npy(
            &npy_dict("<f4", false, &format!("(1, {IN})")),
            &vec![0u8; IN as usize * 4],
        ),
    );
    c.cli(
        "sluice run: weights past the device's buffer limit",
        &[
            "run",
            &graph_file.display().to_string(),
            "--device",
            "gpu",
            "--input",
            &format!("x={}", x.display()),
        ],
        1,
        fragment,
    );
    c.finish(&[&s]);
}

/// Runs `cmd` under the hang guard and records whether it exited `code` with every one
/// of `fragments` in its output, without a panic.
fn cli_case(c: &mut Class, case: &str, cmd: std::process::Command, code: i32, fragments: &[&str]) {
    let shown: Vec<String> = cmd
        .get_args()
        .map(|a| shown_arg(&a.to_string_lossy()))
        .collect();
    let f = run_guarded(cmd, CLI_TIMEOUT);
    let text = format!("{}\n{}", f.stdout, f.stderr).to_lowercase();
    let ok = f.code() == Some(code)
        && fragments.iter().all(|x| text.contains(&x.to_lowercase()))
        && !text.contains("panicked");
    let last = f.stderr.trim().lines().last().unwrap_or("").to_string();
    c.row(
        case,
        &format!("sluice {}", shown.join(" ")),
        &format!("exit {code} {fragments:?}"),
        &format!("{}: {}", f.describe(), short(&last, 200)),
        ok,
    );
}

#[test]
fn checkpoint_counters_outputs_and_caches_from_hostile_files() {
    use std::os::unix::fs::FileTypeExt;
    let mut c = Class::new("checkpoints, outputs and caches");
    let dir = attack::scratch("outputs-caches");
    let root = sluice_tests::root();
    let path = |p: PathBuf| p.display().to_string();
    let spirals = path(root.join("assets/graphs/spirals_mlp.json"));
    let data = root.join("assets/datasets/spirals");
    let train = |extra: &[&str]| {
        let mut cmd = sluice_tests::sluice();
        cmd.args(["train", &spirals, "--device", "cpu", "--data"])
            .arg(format!("x={}", data.join("features.npy").display()))
            .arg(format!("labels={}", data.join("labels.npy").display()))
            .args(extra);
        if !extra.contains(&"--epochs") {
            cmd.args(["--epochs", "1"]);
        }
        cmd
    };
    let fifo = |name: &str| {
        let p = dir.join(name);
        let made = std::process::Command::new("mkfifo").arg(&p).status();
        assert!(made.is_ok_and(|s| s.success()), "mkfifo {}", p.display());
        p
    };
    // A checkpoint whose step count is one short of u64::MAX: the next step counts to
    // the largest count, the one after is refused by name (no overflow, no panic).
    let ckpt = dir.join("ckpt");
    let out = path(dir.join("w.safetensors"));
    let first = run_guarded(
        train(&["--checkpoint", &path(ckpt.clone()), "--output", &out]),
        CLI_TIMEOUT,
    );
    c.row(
        "a checkpoint to poison",
        "sluice train spirals_mlp --epochs 1 --checkpoint ckpt",
        "exit 0",
        &first.describe(),
        first.code() == Some(0),
    );
    let progress = ckpt.join("progress.json");
    if let Ok(text) = std::fs::read_to_string(&progress) {
        let mut doc: Value = serde_json::from_str(&text).unwrap_or_default();
        doc["steps"] = json!(u64::MAX - 1);
        std::fs::write(&progress, doc.to_string()).expect("poisoned progress");
    }
    cli_case(
        &mut c,
        "--resume: steps 2^64 - 2",
        train(&[
            "--resume",
            &path(ckpt.clone()),
            "--epochs",
            "2",
            "--output",
            &out,
        ]),
        1,
        &["step count 18446744073709551615 cannot grow"],
    );
    // Outputs never replace what is not a regular file, and the FIFO stays a FIFO.
    let pipe = fifo("pipe");
    let null_link = dir.join("null-link");
    let _ = std::os::unix::fs::symlink("/dev/null", &null_link);
    let folder = dir.join("folder");
    std::fs::create_dir_all(&folder).expect("folder");
    for (case, target) in [
        ("train --output FIFO", &pipe),
        ("train --output link to /dev/null", &null_link),
        ("train --output folder", &folder),
    ] {
        cli_case(
            &mut c,
            case,
            train(&["--output", &path(target.clone())]),
            1,
            &["not a regular file"],
        );
    }
    cli_case(
        &mut c,
        "train --metrics FIFO",
        train(&["--metrics", &path(pipe.clone()), "--output", &out]),
        1,
        &["not a regular file"],
    );
    let ckpt_fifo = dir.join("ckpt-fifo");
    std::fs::create_dir_all(&ckpt_fifo).expect("folder");
    let made = std::process::Command::new("mkfifo")
        .arg(ckpt_fifo.join("progress.json"))
        .status();
    assert!(made.is_ok_and(|s| s.success()));
    cli_case(
        &mut c,
        "train --checkpoint with progress.json a FIFO",
        train(&["--checkpoint", &path(ckpt_fifo.clone()), "--output", &out]),
        1,
        &["not a regular file"],
    );
    let mlp = path(root.join("assets/graphs/mlp.json"));
    let mut run = sluice_tests::sluice();
    run.args([
        "run",
        &mlp,
        "--device",
        "cpu",
        "--seed-inputs",
        "--trace",
        &path(pipe.clone()),
    ]);
    cli_case(&mut c, "run --trace FIFO", run, 1, &["not a regular file"]);
    let outdir = dir.join("outs");
    std::fs::create_dir_all(&outdir).expect("folder");
    let made = std::process::Command::new("mkfifo")
        .arg(outdir.join("probs.npy"))
        .status();
    assert!(made.is_ok_and(|s| s.success()));
    let mut run = sluice_tests::sluice();
    run.args([
        "run",
        &mlp,
        "--device",
        "cpu",
        "--seed-inputs",
        "--output",
        &path(outdir.clone()),
    ]);
    cli_case(
        &mut c,
        "run --output DIR holding a FIFO probs.npy",
        run,
        1,
        &["not a regular file"],
    );
    for p in [
        pipe.clone(),
        ckpt_fifo.join("progress.json"),
        outdir.join("probs.npy"),
    ] {
        let kept = std::fs::symlink_metadata(&p).is_ok_and(|m| m.file_type().is_fifo());
        c.row(
            "the FIFO is left alone",
            &path(p),
            "a FIFO",
            if kept { "a FIFO" } else { "replaced" },
            kept,
        );
    }
    // Caches: poisoned rates (every kept adapter's) are named and ignored — `plan` falls
    // back to the assumed rates; huge or FIFO caches are read under a bound, reported and
    // ignored, never waited on.
    let cache = dir.join("cache");
    std::fs::create_dir_all(&cache).expect("folder");
    let shared = root.join("target/debug/sluice-test-cache/rates.json");
    let mut kept: Value = std::fs::read_to_string(&shared)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_else(|| json!({}));
    let poison = json!({ "flops_per_s": -1e308, "bytes_per_s": 0.0,
                         "transfer_bytes_per_s": 1e308, "pass_overhead_s": 1e308 });
    if let Some(all) = kept.as_object_mut() {
        all.values_mut().for_each(|v| *v = poison.clone());
        all.insert("any adapter".into(), poison.clone());
    }
    let rates = cache.join("rates.json");
    let plan = |cache: &Path| {
        let mut cmd = sluice_tests::sluice();
        cmd.env("SLUICE_CACHE_DIR", cache)
            .args(["plan", &mlp, "--stages", "2", "--batch", "8"]);
        cmd
    };
    std::fs::write(&rates, kept.to_string()).expect("poisoned rates");
    cli_case(
        &mut c,
        "rates.json poisoned",
        plan(&cache),
        0,
        &[
            "rates.json",
            "unusable",
            "flops_per_s is -1e308",
            "assumed rates",
        ],
    );
    std::fs::write(&rates, vec![b' '; 64 << 20]).expect("huge rates");
    cli_case(
        &mut c,
        "rates.json of 64 MiB",
        plan(&cache),
        0,
        &["rates.json", "over the limit", "assumed rates"],
    );
    let _ = std::fs::remove_file(&rates);
    let made = std::process::Command::new("mkfifo").arg(&rates).status();
    assert!(made.is_ok_and(|s| s.success()));
    cli_case(
        &mut c,
        "rates.json a FIFO",
        plan(&cache),
        0,
        &["rates.json", "not a regular file", "assumed rates"],
    );
    let tuning = cache.join("autotune.json");
    std::fs::write(&tuning, vec![b' '; 64 << 20]).expect("huge tuning file");
    let mut autotune = sluice_tests::sluice();
    autotune
        .env("SLUICE_AUTOTUNE_CACHE", &tuning)
        .args(["autotune", "--json"]);
    cli_case(
        &mut c,
        "autotune.json of 64 MiB",
        autotune,
        1,
        &["autotune.json", "over the limit"],
    );
    let _ = std::fs::remove_file(&tuning);
    let made = std::process::Command::new("mkfifo").arg(&tuning).status();
    assert!(made.is_ok_and(|s| s.success()));
    let w1 = path(root.join("assets/bench/w1_matmul.json"));
    let mut run = sluice_tests::sluice();
    run.env("SLUICE_AUTOTUNE_CACHE", &tuning)
        .args(["run", &w1, "--seed-inputs", "--batch", "128"]);
    cli_case(
        &mut c,
        "autotune.json a FIFO, a GPU run",
        run,
        0,
        &["autotune.json", "not a regular file", "checksum"],
    );
    let kept = std::fs::symlink_metadata(&tuning).is_ok_and(|m| m.file_type().is_fifo());
    c.row(
        "the FIFO cache is left alone",
        "autotune.json",
        "a FIFO",
        if kept { "a FIFO" } else { "replaced" },
        kept,
    );
    c.finish(&[]);
}
