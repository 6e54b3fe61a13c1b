//! The wire types of Sluice's HTTP API (`sluice serve`) and its worker protocol: what the
//! server sends and what the editor and the tests read, each defined once. The server
//! and the editor (compiled to wasm) both compile against this crate, so a field renamed
//! on one side is a compile error on the other, not a blank chart.

pub mod protocol;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sluice_engine::exec::device::CompileStats;
use sluice_engine::exec::RunConfig;
use sluice_engine::gpu::AdapterSummary;
use sluice_engine::limits;
use sluice_engine::plan::cost::Rates;
use sluice_engine::plan::Precision;
use sluice_engine::telemetry::metrics::Metrics;
use sluice_engine::telemetry::{Event, TimingSource};
use sluice_engine::{DType, Graph, Problem};
use std::collections::BTreeMap;

/// Whether a graph, output or worker name is safe to use as a file name: 1-64 of
/// `A-Z a-z 0-9 _ -`.
pub fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// The file names (without `.npy`) a run's outputs are written under, by the server and
/// the CLI alike: never a user string unchecked. `node:1` becomes `node_1`; a name that
/// is not a [`valid_name`] then, or one another output already took, becomes `outputI`
/// (I its place), or `outputI_J` if even that is taken.
pub fn output_files<'a>(names: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    let mut files: Vec<String> = Vec::new();
    for (i, name) in names.into_iter().enumerate() {
        let asked = name.replace(':', "_");
        let file = std::iter::once(asked)
            .filter(|f| valid_name(f))
            .chain(std::iter::once(format!("output{i}")))
            .chain((1..).map(|j| format!("output{i}_{j}")))
            .find(|f| !files.contains(f))
            .unwrap_or_default();
        files.push(file);
    }
    files
}

/// Where a run's graph comes from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum GraphRef {
    /// A graph stored in the workspace, by name.
    Stored(String),
    /// A graph document sent with the request, kept by the server as a file of the run
    /// (`runs/ID/graph.json`) once accepted.
    Kept(Kept),
    /// A graph document sent with the request.
    Inline(Value),
}

/// A file uploaded with a run request: an input's `.npy` file, or the weights'
/// safetensors file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Upload {
    /// The file in base64, as clients send it.
    Base64(String),
    /// The file kept by the server as a file of the run: an input as
    /// `runs/ID/inputs/K.npy`, where K is the input's place among the run's uploads in
    /// name order (never a name from the request), the weights as
    /// `runs/ID/weights.safetensors`.
    Kept(Kept),
}

impl Upload {
    /// A file's bytes as a client sends them (base64).
    pub fn of_bytes(bytes: &[u8]) -> Upload {
        use base64::Engine;
        Upload::Base64(base64::engine::general_purpose::STANDARD.encode(bytes))
    }
}

/// Something of a run request the server keeps as a file of the run instead of in its
/// history: the record says how large it is, the file's place is fixed by the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Kept {
    /// Its size in bytes.
    pub kept_bytes: u64,
}

/// Which form of a run request [`RunRequest::parse_as`] reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestForm {
    /// As a client sends it: a graph name or document, inputs in base64.
    Sent,
    /// As the server keeps it once accepted: a graph name or [`Kept`], inputs [`Kept`].
    Kept,
}

/// `POST /api/runs`: what to run and how.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRequest {
    /// The graph.
    pub graph: GraphRef,
    /// Samples per batch.
    pub batch: usize,
    /// Seed of the random values of the inputs not sent (with [`RunRequest::seed_inputs`]).
    pub seed: u64,
    /// Micro-batches per batch.
    pub microbatches: usize,
    /// Pipeline stages.
    pub stages: usize,
    /// Prefetch slots.
    pub prefetch: usize,
    /// Numeric precision.
    pub precision: Precision,
    /// Uploaded inputs (as sent: base64 `.npy` files).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub inputs: BTreeMap<String, Upload>,
    /// Whether the inputs not sent may be filled with seeded random values (from
    /// [`RunRequest::seed`]); without it a request that leaves an input out is refused,
    /// naming it. The run's record lists the inputs so filled
    /// ([`RunRecord::seeded_inputs`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub seed_inputs: bool,
    /// Worker ids pinned to the stages, in stage order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workers: Option<Vec<String>>,
    /// The weights of an inline graph (as sent: a base64 safetensors file, keys
    /// `node.param`), checked against the graph as a stored weights file is: what the
    /// editor sends for an imported model not yet saved. Absent: the graph's weights
    /// file (a stored graph's), else seeded weights.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weights: Option<Upload>,
}

impl RunRequest {
    /// A request for a graph with the defaults: batch 1, seed 0, one micro-batch, one
    /// stage, two prefetch slots, f32.
    pub fn new(graph: GraphRef) -> RunRequest {
        RunRequest {
            graph,
            batch: 1,
            seed: 0,
            microbatches: 1,
            stages: 1,
            prefetch: 2,
            precision: Precision::F32,
            inputs: BTreeMap::new(),
            seed_inputs: false,
            workers: None,
            weights: None,
        }
    }

    /// The engine's run configuration.
    pub fn config(&self) -> RunConfig {
        RunConfig {
            batch: self.batch,
            microbatches: self.microbatches,
            stages: self.stages,
            prefetch: self.prefetch,
            precision: self.precision,
            ..RunConfig::default()
        }
    }

    /// The inputs of `graph` this request leaves out, which its run fills with seeded
    /// random values: refused, naming them, unless the request asks for that with
    /// `seed_inputs`, so that no output is computed from invented inputs unasked.
    pub fn seeded_inputs(&self, graph: &Graph) -> Result<Vec<String>, String> {
        let missing: Vec<String> = graph
            .inputs
            .iter()
            .map(|(name, _)| name)
            .filter(|name| !self.inputs.contains_key(*name))
            .cloned()
            .collect();
        match missing.first() {
            Some(first) if !self.seed_inputs => Err(format!(
                "input '{first}' was not sent (inputs not sent: {}): send it in \"inputs\" as a \
                 base64 .npy file, or set \"seed_inputs\": true to fill the inputs not sent \
                 with random values from \"seed\"",
                missing.join(", ")
            )),
            _ => Ok(missing),
        }
    }

    /// Reads and checks a request body as a client sends it, field by field, with an
    /// error naming the field.
    pub fn parse(body: &Value) -> Result<RunRequest, String> {
        RunRequest::parse_as(body, RequestForm::Sent)
    }

    /// Reads and checks a request in the given form. A client's request never reads as
    /// kept files (only the server's own history does), so no request names a file.
    pub fn parse_as(body: &Value, form: RequestForm) -> Result<RunRequest, String> {
        let obj = body.as_object().ok_or("the body must be a JSON object")?;
        const KNOWN: &[&str] = &[
            "graph",
            "batch",
            "seed",
            "inputs",
            "seed_inputs",
            "workers",
            "microbatches",
            "stages",
            "prefetch",
            "precision",
            "weights",
        ];
        if let Some(k) = obj.keys().find(|k| !KNOWN.contains(&k.as_str())) {
            return Err(format!("unknown field '{k}' (known: {})", KNOWN.join(", ")));
        }
        let count = |key: &str, default: usize, max: usize| -> Result<usize, String> {
            match obj.get(key) {
                None => Ok(default),
                Some(v) => match v.as_u64() {
                    Some(n) if (1..=max as u64).contains(&n) => Ok(n as usize),
                    _ => Err(format!(
                        "'{key}' must be an integer from 1 to {max}, not {v}"
                    )),
                },
            }
        };
        let graph = match obj.get("graph") {
            Some(Value::String(name)) if valid_name(name) => GraphRef::Stored(name.clone()),
            Some(Value::String(name)) => {
                return Err(format!(
                    "'{name}' is not a valid graph name (1-64 of A-Z a-z 0-9 _ -)"
                ))
            }
            Some(doc @ Value::Object(_)) => match form {
                RequestForm::Sent => GraphRef::Inline(doc.clone()),
                RequestForm::Kept => GraphRef::Kept(kept(doc, "graph")?),
            },
            Some(other) => {
                return Err(format!(
                    "'graph' must be a graph name or a graph document, not {other}"
                ))
            }
            None => return Err("'graph' is missing".into()),
        };
        let precision = match obj.get("precision") {
            None => Precision::F32,
            Some(Value::String(p)) => Precision::parse(p)
                .ok_or_else(|| format!("'precision' must be f32, f16 or mixed, not '{p}'"))?,
            Some(v) => return Err(format!("'precision' must be a string, not {v}")),
        };
        let seed = match obj.get("seed") {
            None => 0,
            Some(v) => v
                .as_u64()
                .ok_or_else(|| format!("'seed' must be a non-negative integer, not {v}"))?,
        };
        let seed_inputs = match obj.get("seed_inputs") {
            None => false,
            Some(v) => v
                .as_bool()
                .ok_or_else(|| format!("'seed_inputs' must be true or false, not {v}"))?,
        };
        let batch = count("batch", 1, limits::MAX_BATCH)?;
        let microbatches = count("microbatches", 1, limits::MAX_MICROBATCHES)?;
        let stages = count("stages", 1, limits::MAX_STAGES)?;
        let prefetch = count("prefetch", 2, limits::MAX_PREFETCH)?;
        if !batch.is_multiple_of(microbatches) {
            return Err(format!(
                "batch {batch} does not split into {microbatches} micro-batches"
            ));
        }
        let inputs = match obj.get("inputs") {
            None => BTreeMap::new(),
            Some(Value::Object(m)) => m
                .iter()
                .map(|(name, v)| match (form, v) {
                    (RequestForm::Sent, Value::String(text)) => {
                        Ok((name.clone(), Upload::Base64(text.clone())))
                    }
                    (RequestForm::Kept, v) => Ok((
                        name.clone(),
                        Upload::Kept(kept(v, &format!("input '{name}'"))?),
                    )),
                    _ => Err(format!(
                        "input '{name}' must be a base64 string of a .npy file"
                    )),
                })
                .collect::<Result<_, _>>()?,
            Some(v) => {
                return Err(format!(
                    "'inputs' must map input names to base64 .npy files, not {v}"
                ))
            }
        };
        let weights = match (form, obj.get("weights")) {
            (_, None) => None,
            (RequestForm::Sent, Some(Value::String(text))) => Some(Upload::Base64(text.clone())),
            (RequestForm::Kept, Some(v)) => Some(Upload::Kept(kept(v, "'weights'")?)),
            (RequestForm::Sent, Some(v)) => {
                return Err(format!(
                    "'weights' must be a base64 string of a safetensors file, not {}",
                    clip(&v.to_string())
                ))
            }
        };
        if weights.is_some() && !matches!(graph, GraphRef::Inline(_) | GraphRef::Kept(_)) {
            return Err(
                "'weights' comes only with a graph document: a stored graph runs with its own \
                 weights"
                    .into(),
            );
        }
        let workers = match obj.get("workers") {
            None => None,
            Some(Value::Array(ids)) => {
                let ids: Option<Vec<String>> =
                    ids.iter().map(|v| v.as_str().map(str::to_string)).collect();
                let ids = ids.ok_or("'workers' must be a list of worker ids")?;
                if ids.len() != stages {
                    return Err(format!(
                        "'workers' pins {} workers but the run has {stages} stages",
                        ids.len()
                    ));
                }
                Some(ids)
            }
            Some(v) => return Err(format!("'workers' must be a list of worker ids, not {v}")),
        };
        Ok(RunRequest {
            graph,
            batch,
            seed,
            microbatches,
            stages,
            prefetch,
            precision,
            inputs,
            seed_inputs,
            workers,
            weights,
        })
    }
}

/// At most 100 characters of a value shown in an error.
fn clip(text: &str) -> String {
    text.chars().take(100).collect()
}

/// A kept file's reference in the server's history.
fn kept(v: &Value, what: &str) -> Result<Kept, String> {
    serde_json::from_value(v.clone())
        .map_err(|_| format!("{what} must be a kept file's reference {{\"kept_bytes\": N}}"))
}

/// `202` to `POST /api/runs`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunAccepted {
    /// The run's id.
    pub id: String,
    /// Its status (queued).
    pub status: RunStatus,
}

/// Where a run is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    /// Waiting for an executor.
    Queued,
    /// Running.
    Running,
    /// Finished with outputs.
    Succeeded,
    /// Ended with an error.
    Failed,
    /// Stopped on request.
    Cancelled,
}

impl RunStatus {
    /// Every status, in life order.
    pub const ALL: [RunStatus; 5] = [
        RunStatus::Queued,
        RunStatus::Running,
        RunStatus::Succeeded,
        RunStatus::Failed,
        RunStatus::Cancelled,
    ];

    /// The status as stored and sent (`queued`, `running`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Queued => "queued",
            RunStatus::Running => "running",
            RunStatus::Succeeded => "succeeded",
            RunStatus::Failed => "failed",
            RunStatus::Cancelled => "cancelled",
        }
    }

    /// The status of its stored name.
    pub fn parse(s: &str) -> Option<RunStatus> {
        RunStatus::ALL.into_iter().find(|r| r.as_str() == s)
    }

    /// Whether the run has ended.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            RunStatus::Succeeded | RunStatus::Failed | RunStatus::Cancelled
        )
    }
}

impl std::fmt::Display for RunStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One output of a finished run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OutputSummary {
    /// The output's name (`probs`, `split1:1`).
    pub name: String,
    /// Its file name in the run (without `.npy`), for `GET /api/runs/{id}/outputs/{file}`.
    pub file: String,
    /// Shape.
    pub shape: Vec<usize>,
    /// Element type.
    pub dtype: DType,
    /// The first values.
    pub first: Vec<f32>,
    /// The sum of all values.
    pub checksum: f64,
    /// How many values are NaN or infinite.
    pub non_finite: usize,
}

/// Device memory of a run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct MemoryFigures {
    /// Planned peak bytes of all stages.
    pub planned_bytes: u64,
    /// Bytes of device buffers allocated.
    pub allocated_bytes: u64,
}

/// What preparing a run cost, and how soon it answered.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct CompileFigures {
    /// Whether the compiled plans came from the server's plan cache.
    pub cached: bool,
    /// Pipelines, passes and milliseconds of the compilation this run did (zero when
    /// cached).
    pub stats: CompileStats,
    /// Milliseconds from the run's start (after the queue) to its first micro-batch's
    /// outputs, compiling included.
    pub first_result_ms: f64,
}

/// The figures of a finished run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunFigures {
    /// Metrics derived from its events.
    pub metrics: Metrics,
    /// Where compute times came from.
    pub timing: TimingSource,
    /// The devices, one per stage.
    pub devices: Vec<String>,
    /// Device memory (absent for remote stages).
    #[serde(default)]
    pub memory: Option<MemoryFigures>,
    /// Compilation and time to first result.
    #[serde(default)]
    pub compile: Option<CompileFigures>,
}

/// `GET /api/runs/{id}`: a run as stored (its `params` are the request as kept: uploads
/// and an inline graph replaced by [`Kept`] references to files of the run).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    /// Run id.
    pub id: String,
    /// Graph name (or `inline`).
    pub graph: String,
    /// The request as kept (see [`RequestForm::Kept`]).
    pub params: Value,
    /// Where it is.
    pub status: RunStatus,
    /// Figures of a finished run.
    pub metrics: Option<RunFigures>,
    /// Outputs of a finished run.
    pub outputs: Option<Vec<OutputSummary>>,
    /// Why it failed.
    pub error: Option<String>,
    /// The graph inputs the request did not send, filled with seeded random values (it
    /// asked for that with `seed_inputs`): the outputs are not computed from data there.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub seeded_inputs: Vec<String>,
    /// Milliseconds since the Unix epoch.
    pub created_ms: i64,
    /// When it started running.
    pub started_ms: Option<i64>,
    /// When it finished.
    pub finished_ms: Option<i64>,
}

/// `GET /api/runs?limit=N&before=ID`: one page of the history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunList {
    /// Runs, newest first.
    pub runs: Vec<RunRecord>,
    /// The cursor of the next (older) page, for `?before=`; absent on the last page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
}

/// Runs per page of `GET /api/runs` when the request does not say.
pub const DEFAULT_PAGE: usize = 100;
/// Most runs per page of `GET /api/runs`.
pub const MAX_PAGE: usize = 1000;

/// A message of `WS /api/runs/{id}/events`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum LiveMessage {
    /// One event, as soon as it is known.
    Event {
        /// The event.
        event: Event,
    },
    /// The run's metrics, once it has finished computing.
    Metrics {
        /// The metrics.
        metrics: Metrics,
    },
    /// The run as stored once it has ended: always the last message.
    Summary {
        /// The record (absent when the run is gone).
        run: Option<Box<RunRecord>>,
    },
}

/// An error response: a sentence, the status, and the graph's problems where there are.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// What is wrong.
    pub error: String,
    /// The HTTP status.
    pub status: u16,
    /// Every problem of the graph, when the error is about one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub problems: Option<Vec<Problem>>,
}

/// `GET /api/graphs`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GraphList {
    /// Stored graph names.
    pub graphs: Vec<String>,
}

/// One kept version of a graph (`GET /api/graphs/{name}/versions`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GraphVersion {
    /// Its id: when it was replaced, in milliseconds since the Unix epoch.
    pub version: String,
    /// Its size in bytes.
    pub bytes: u64,
}

/// `GET /api/graphs/{name}/versions`: newest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VersionList {
    /// The kept versions.
    pub versions: Vec<GraphVersion>,
}

/// The answer to `PUT /api/graphs/{name}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GraphSaved {
    /// The name saved under.
    pub saved: String,
    /// Always true: a graph with problems is refused (422 naming them) and not stored.
    /// Kept so that clients that read it go on working.
    pub valid: bool,
    /// Always empty, as `valid` is always true.
    pub problems: Vec<Problem>,
}

/// A worker as `GET /api/devices` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerInfo {
    /// `local`, or the id the server gave a remote worker.
    pub id: String,
    /// `in-process` or `remote`.
    pub kind: String,
    /// A remote worker's name (its host).
    #[serde(default)]
    pub name: Option<String>,
    /// Its adapters.
    pub adapters: Vec<AdapterSummary>,
    /// Measured rates of the adapter it computes on (for the partitioner).
    #[serde(default)]
    pub rates: Option<Rates>,
    /// Busy share per device of the last (or current) run.
    #[serde(default)]
    pub utilisation: Vec<f64>,
    /// Memory of the last run.
    #[serde(default)]
    pub memory: Option<MemoryFigures>,
}

/// `GET /api/devices`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DevicesReport {
    /// The in-process worker first, then remote workers.
    pub workers: Vec<WorkerInfo>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_request_round_trips_through_its_wire_form() {
        let mut r = RunRequest::new(GraphRef::Stored("mlp".into()));
        r.batch = 8;
        r.microbatches = 4;
        r.precision = Precision::Mixed;
        let wire = serde_json::to_value(&r).unwrap();
        assert_eq!(RunRequest::parse(&wire).unwrap(), r);
    }

    #[test]
    fn bad_requests_name_the_field() {
        for (body, fragment) in [
            (json!({"graph": 5}), "'graph' must be"),
            (
                json!({"graph": "mlp", "batch": 0}),
                "'batch' must be an integer from 1",
            ),
            (json!({"graph": "mlp", "bacth": 3}), "unknown field 'bacth'"),
            (
                json!({"graph": "mlp", "batch": 6, "microbatches": 4}),
                "does not split",
            ),
            (json!({"graph": "../x"}), "not a valid graph name"),
            (
                json!({"graph": "mlp", "weights": "AAAA"}),
                "'weights' comes only with a graph document",
            ),
            (
                json!({"graph": {}, "weights": [1, 2]}),
                "'weights' must be a base64 string",
            ),
        ] {
            let e = RunRequest::parse(&body).unwrap_err();
            assert!(e.contains(fragment), "{body}: {e}");
        }
    }

    #[test]
    fn a_kept_request_round_trips_and_clients_cannot_send_one() {
        let mut r = RunRequest::new(GraphRef::Kept(Kept { kept_bytes: 120 }));
        r.inputs
            .insert("x".into(), Upload::Kept(Kept { kept_bytes: 6272 }));
        let wire = serde_json::to_value(&r).unwrap();
        assert_eq!(wire["graph"], json!({ "kept_bytes": 120 }));
        assert_eq!(RunRequest::parse_as(&wire, RequestForm::Kept).unwrap(), r);
        // Sent by a client, the same body is an inline document and a bad input.
        let e = RunRequest::parse(&wire).unwrap_err();
        assert!(e.contains("input 'x' must be a base64 string"), "{e}");
        let sent = json!({ "graph": { "kept_bytes": 1 } });
        assert!(matches!(
            RunRequest::parse(&sent).unwrap().graph,
            GraphRef::Inline(_)
        ));
        // The server's history never reads a document or base64 as a kept file.
        for bad in [
            json!({ "graph": { "format": "sluice/graph@1" } }),
            json!({ "graph": "mlp", "inputs": { "x": "AAAA" } }),
            json!({ "graph": "mlp", "inputs": { "x": { "kept_bytes": 1, "file": "/etc/passwd" } } }),
        ] {
            assert!(
                RunRequest::parse_as(&bad, RequestForm::Kept).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn weights_travel_as_base64_and_are_kept_as_a_file() {
        let mut r = RunRequest::new(GraphRef::Inline(json!({ "format": "sluice/graph@1" })));
        r.weights = Some(Upload::of_bytes(&[0, 1, 2, 255]));
        let wire = serde_json::to_value(&r).unwrap();
        assert_eq!(wire["weights"], json!("AAEC/w=="));
        assert_eq!(RunRequest::parse(&wire).unwrap(), r);
        let mut kept = RunRequest::new(GraphRef::Kept(Kept { kept_bytes: 20 }));
        kept.weights = Some(Upload::Kept(Kept { kept_bytes: 4 }));
        let wire = serde_json::to_value(&kept).unwrap();
        assert_eq!(
            RunRequest::parse_as(&wire, RequestForm::Kept).unwrap(),
            kept
        );
        // A client cannot send a kept file's reference as weights.
        let e = RunRequest::parse(&wire).unwrap_err();
        assert!(e.contains("'weights' must be a base64 string"), "{e}");
    }

    #[test]
    fn output_file_names_are_safe_and_distinct() {
        let files = output_files(["probs", "split:1", "../../x", "split_1", "output2", ""]);
        assert_eq!(
            files,
            ["probs", "split_1", "output2", "output3", "output4", "output5"]
        );
        assert_eq!(output_files(["output1", "x/y"]), ["output1", "output1_1"]);
    }

    #[test]
    fn statuses_are_stored_by_name() {
        for s in RunStatus::ALL {
            assert_eq!(RunStatus::parse(s.as_str()), Some(s));
            assert_eq!(serde_json::to_value(s).unwrap(), json!(s.as_str()));
        }
    }
}
