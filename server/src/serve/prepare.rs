//! Checking what a request asks before the server does it: JSON bodies (values counted
//! while parsing), and run requests — graph, the engine's limits, batch semantics,
//! uploads, weights sent with the graph — so a run is accepted only if it can start.
//! Every function here is CPU work for a blocking thread (see `work.rs`), never the async
//! runtime.

use super::error::{ApiResult, AppError};
use super::workspace::{valid_weights_file, Workspace, MAX_WEIGHTS_FILE};
use serde_json::Value;
use sluice_api::{GraphRef, Kept, RunRequest, Upload};
use sluice_engine::exec::RunConfig;
use sluice_engine::graph::json::JsonError;
use sluice_engine::limits::Limits;
use sluice_engine::weights::Weights;
use sluice_engine::Graph;

/// Parses a JSON body of at most `max_values` values (counted while parsing by the
/// engine's budgeted parser, so a body of a million numbers is refused before a million
/// values exist): 422 naming the limit, or 400 naming the line and column of a syntax
/// error.
pub fn parse_json(bytes: &[u8], max_values: usize) -> ApiResult<Value> {
    let text = std::str::from_utf8(bytes).map_err(|e| {
        AppError::bad(format!(
            "the body is not UTF-8 text (byte {})",
            e.valid_up_to()
        ))
    })?;
    sluice_engine::graph::json::parse_values(text, max_values).map_err(|e| match e {
        JsonError::TooLarge(_) => AppError::unprocessable(e.to_string()),
        JsonError::Malformed { .. } => AppError::bad(e.to_string()),
    })
}

/// Where a run's graph came from, which decides where its weights may come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// A graph stored in the workspace: its `params.file` names a weights file there.
    Stored,
    /// A graph sent with the request, which cannot bring a weights file.
    Inline,
}

/// The weights file a graph names, if it may run with it: a stored graph's `params.file`
/// must name a weights file of the workspace (`NAME.safetensors`); an inline graph must not
/// name one (`sent`: whether the request sends the graph's weights, which only an inline
/// graph may do, [`sluice_api::RunRequest::parse`]).
pub fn weights_file(graph: &Graph, source: Source, sent: bool) -> Result<Option<&str>, String> {
    let Some(file) = graph.doc.params.file.as_deref() else {
        return Ok(None);
    };
    match source {
        Source::Inline if sent => Err(format!(
            "the graph takes its weights from the file '{}' and the request sends weights too; \
             send the graph without \"params\": {{\"file\": ...}} to run it with the weights sent",
            clip(file)
        )),
        Source::Inline => Err(format!(
            "an inline graph cannot take its weights from the file '{}'; store the graph with \
             its weights (PUT /api/graphs/NAME with the ONNX model) and run it by name, or use \
             seeded weights (\"params\": {{\"seed\": ...}})",
            clip(file)
        )),
        Source::Stored if !valid_weights_file(file) => Err(format!(
            "the graph takes its weights from '{}', which is not a weights file of the \
             workspace (NAME.safetensors, stored by putting an ONNX model as the graph NAME)",
            clip(file)
        )),
        Source::Stored => Ok(Some(file)),
    }
}

fn clip(s: &str) -> String {
    s.chars().take(100).collect()
}

/// The weights a run of `graph` uses: those sent with the request (`sent`, a safetensors
/// file), its weights file read from the workspace, or seeded; a file is checked against
/// the graph before anything is converted. Also returns the file's bytes (empty for
/// seeded weights), which tell compiled sessions apart.
pub fn run_weights(
    ws: &Workspace,
    graph: &Graph,
    source: Source,
    sent: Option<Vec<u8>>,
) -> Result<(Weights, Vec<u8>), String> {
    let file = weights_file(graph, source, sent.is_some())?;
    if let Some(bytes) = sent {
        let weights = sluice_engine::weights::load_safetensors(graph, &bytes)
            .map_err(|e| format!("in the weights sent with the run: {e}"))?;
        return Ok((weights, bytes));
    }
    let Some(file) = file else {
        let seed = graph.doc.params.seed.unwrap_or(0);
        return Ok((
            sluice_engine::weights::init_weights(graph, seed),
            Vec::new(),
        ));
    };
    let bytes = ws
        .read_weights(file)
        .map_err(|e| format!("{e:#}"))?
        .ok_or_else(|| format!("the graph's weights file '{file}' does not exist"))?;
    let weights = sluice_engine::weights::load_safetensors(graph, &bytes)
        .map_err(|e| format!("in the weights file '{file}': {e}"))?;
    Ok((weights, bytes))
}

/// What the server can run: a graph whose weights it can make or read (see
/// [`weights_file`]; `sent`: whether the request sends them), within the run limits for
/// `config` (one batch).
pub fn check_runnable(
    graph: &Graph,
    source: Source,
    sent: bool,
    config: &RunConfig,
    limits: &Limits,
) -> Result<(), String> {
    weights_file(graph, source, sent)?;
    sluice_engine::exec::check_run(graph, config, None, limits)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// A run request checked and ready to be accepted.
pub struct Prepared {
    /// The graph's name, or `inline`.
    pub label: String,
    /// The request as sent.
    pub request: RunRequest,
    /// The text of an inline graph, to keep as a file of the run.
    pub inline: Option<Vec<u8>>,
    /// The uploaded `.npy` files, decoded from base64, in input-name order.
    pub uploads: Vec<Vec<u8>>,
    /// The weights sent with the graph (a safetensors file, checked against it), decoded
    /// from base64.
    pub weights: Option<Vec<u8>>,
    /// The graph inputs the request did not send, which the run fills with seeded random
    /// values (the request asked for that with `seed_inputs`).
    pub seeded: Vec<String>,
}

impl Prepared {
    /// The request as the history keeps it: the inline graph and the uploads replaced
    /// by references to the run's files.
    pub fn kept(&self) -> RunRequest {
        let mut kept = self.request.clone();
        if let Some(text) = &self.inline {
            kept.graph = GraphRef::Kept(Kept {
                kept_bytes: len(text),
            });
        }
        for (upload, bytes) in kept.inputs.values_mut().zip(&self.uploads) {
            *upload = Upload::Kept(Kept {
                kept_bytes: len(bytes),
            });
        }
        if let Some(bytes) = &self.weights {
            kept.weights = Some(Upload::Kept(Kept {
                kept_bytes: len(bytes),
            }));
        }
        kept
    }
}

fn len(bytes: &[u8]) -> u64 {
    u64::try_from(bytes.len()).unwrap_or(u64::MAX)
}

/// Checks a `POST /api/runs` body: the request, its uploads (base64 `.npy` files naming
/// inputs of the graph), the graph (stored or inline) and its problems, the weights sent
/// with an inline graph (checked against it as a stored weights file is: names, dtypes,
/// shapes and sizes), the run limits, the batch semantics of the configuration, and the
/// inputs it leaves out (refused unless it asks for seeded inputs).
pub fn prepare_run(ws: &Workspace, body: &[u8], limits: &Limits) -> ApiResult<Prepared> {
    use base64::Engine;
    let value = parse_json(body, limits.max_json_values)?;
    let request = RunRequest::parse(&value).map_err(AppError::unprocessable)?;
    let mut uploads = Vec::with_capacity(request.inputs.len());
    for (name, upload) in &request.inputs {
        let Upload::Base64(text) = upload else {
            return Err(AppError::unprocessable(format!(
                "input '{name}' must be a base64 string of a .npy file"
            )));
        };
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(text)
            .map_err(|e| {
                AppError::unprocessable(format!("input '{name}' is not valid base64: {e}"))
            })?;
        sluice_engine::npy::parse(&bytes)
            .map_err(|e| AppError::unprocessable(format!("input '{name}': {e}")))?;
        uploads.push(bytes);
    }
    let (label, text, inline, source) = match &request.graph {
        GraphRef::Stored(name) => match ws.read_graph(name)? {
            Some(t) => (name.clone(), t, None, Source::Stored),
            None => return Err(AppError::not_found(format!("no graph named '{name}'"))),
        },
        GraphRef::Inline(doc) => {
            let text = doc.to_string();
            (
                "inline".to_string(),
                text.clone(),
                Some(text.into_bytes()),
                Source::Inline,
            )
        }
        GraphRef::Kept(_) => {
            return Err(AppError::unprocessable(
                "'graph' must be a graph name or a graph document",
            ))
        }
    };
    let graph =
        sluice_engine::load_graph_with(&text, limits).map_err(|p| AppError::problems(p.0))?;
    if let Some(name) = request
        .inputs
        .keys()
        .find(|n| graph.input_type(n).is_none())
    {
        let known: Vec<&str> = graph.inputs.iter().map(|(n, _)| n.as_str()).collect();
        return Err(AppError::unprocessable(format!(
            "the graph has no input '{name}' (inputs: {})",
            known.join(", ")
        )));
    }
    let sent = request.weights.is_some();
    check_runnable(&graph, source, sent, &request.config(), limits)
        .map_err(AppError::unprocessable)?;
    let weights = match &request.weights {
        None => None,
        Some(Upload::Base64(text)) => {
            // Within the body limit, so decoding allocates at most that much.
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(text)
                .map_err(|e| {
                    AppError::unprocessable(format!("'weights' is not valid base64: {e}"))
                })?;
            sluice_engine::weights::check_safetensors(&graph, &bytes).map_err(|e| {
                AppError::unprocessable(format!("in the weights sent with the run: {e}"))
            })?;
            Some(bytes)
        }
        Some(Upload::Kept(_)) => {
            return Err(AppError::unprocessable(
                "'weights' must be a base64 string of a safetensors file",
            ))
        }
    };
    if let Some(file) = weights_file(&graph, source, sent).map_err(AppError::unprocessable)? {
        if !ws.has_weights(file)? {
            return Err(AppError::unprocessable(format!(
                "the graph's weights file '{file}' does not exist or is over {MAX_WEIGHTS_FILE} bytes"
            )));
        }
    }
    // Configurations that would change the answer are refused now, not after queueing.
    sluice_engine::exec::config::check_batching(&graph.batch_semantics(), &request.config(), None)
        .map_err(|e| AppError::unprocessable(e.to_string()))?;
    let seeded = request
        .seeded_inputs(&graph)
        .map_err(AppError::unprocessable)?;
    Ok(Prepared {
        label,
        request,
        inline,
        uploads,
        weights,
        seeded,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn json_values_are_counted_while_parsing() {
        let e = format!("{:?}", parse_json(b"[0,0,0,0]", 3).unwrap_err());
        assert!(e.contains("--max-json-values"), "{e}");
        assert_eq!(parse_json(b"[0,0]", 3).unwrap(), json!([0, 0]));
        let e = format!("{:?}", parse_json(b"[0,", 3).unwrap_err());
        assert!(e.contains("line 1, column 3"), "{e}");
    }

    /// A linear layer of 3 → 2 without a bias, as a document.
    fn linear() -> Value {
        json!({ "format": "sluice/graph@1", "inputs": { "x": { "shape": ["N", 3] } },
                "nodes": [{ "id": "fc", "op": "linear", "inputs": ["x"],
                            "attrs": { "out_features": 2, "bias": false } }],
                "outputs": ["fc"] })
    }

    /// A safetensors file of one f32 tensor.
    fn weights(key: &str, shape: Vec<usize>) -> Vec<u8> {
        let n = shape.iter().product();
        let t = sluice_engine::Tensor::f32(shape, vec![0.5; n]);
        sluice_engine::train::checkpoint::encode_weights(&[(key.to_string(), t)].into()).unwrap()
    }

    #[test]
    fn an_input_not_sent_is_refused_unless_seeded_inputs_are_asked_for() {
        let root = std::env::temp_dir().join(format!("sluice-seeded-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let (ws, _lock) = Workspace::open(&root).unwrap();
        let limits = Limits::default();
        let mut r = RunRequest::new(GraphRef::Inline(linear()));
        let e = prepare_run(&ws, &serde_json::to_vec(&r).unwrap(), &limits)
            .err()
            .expect("an input not sent is refused");
        let e = format!("{e:?}");
        assert!(e.contains("input 'x' was not sent"), "{e}");
        assert!(e.contains(r#"set \"seed_inputs\": true"#), "{e}");
        r.seed_inputs = true;
        let prepared = prepare_run(&ws, &serde_json::to_vec(&r).unwrap(), &limits).unwrap();
        assert_eq!(prepared.seeded, vec!["x".to_string()]);
        assert!(prepared.kept().seed_inputs);
        // An input sent is not seeded, asked or not.
        let x = sluice_engine::Tensor::f32(vec![1, 3], vec![1.0, 2.0, 3.0]);
        r.inputs.insert(
            "x".into(),
            Upload::of_bytes(&sluice_engine::npy::to_bytes(&x).unwrap()),
        );
        let prepared = prepare_run(&ws, &serde_json::to_vec(&r).unwrap(), &limits).unwrap();
        assert!(prepared.seeded.is_empty());
        r.seed_inputs = false;
        assert!(prepare_run(&ws, &serde_json::to_vec(&r).unwrap(), &limits).is_ok());
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn weights_sent_with_a_graph_are_checked_against_it_and_kept() {
        let root = std::env::temp_dir().join(format!("sluice-prepare-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let (ws, _lock) = Workspace::open(&root).unwrap();
        let limits = Limits::default();
        let body = |graph: Value, weights: &[u8]| {
            let mut r = RunRequest::new(GraphRef::Inline(graph));
            r.weights = Some(Upload::of_bytes(weights));
            r.seed_inputs = true;
            serde_json::to_vec(&r).unwrap()
        };
        let good = weights("fc.weight", vec![3, 2]);
        let prepared = prepare_run(&ws, &body(linear(), &good), &limits).unwrap();
        assert_eq!(prepared.weights.as_deref(), Some(good.as_slice()));
        assert_eq!(
            prepared.kept().weights,
            Some(Upload::Kept(Kept {
                kept_bytes: len(&good)
            }))
        );
        let refused = |body: Vec<u8>| format!("{:?}", prepare_run(&ws, &body, &limits).err());
        for (bytes, fragment) in [
            (weights("fc.weight", vec![2, 3]), "has shape [2, 3]"),
            (weights("other.weight", vec![3, 2]), "no tensor 'fc.weight'"),
            (b"not safetensors".to_vec(), "not valid safetensors"),
        ] {
            let e = refused(body(linear(), &bytes));
            assert!(e.contains("in the weights sent with the run"), "{e}");
            assert!(e.contains(fragment), "{fragment}: {e}");
        }
        let mut named = linear();
        named["params"] = json!({ "file": "other.safetensors" });
        let e = refused(body(named, &good));
        assert!(e.contains("sends weights too"), "{e}");
        let e =
            refused(serde_json::to_vec(&json!({ "graph": linear(), "weights": "%%" })).unwrap());
        assert!(e.contains("'weights' is not valid base64"), "{e}");
        let _ = std::fs::remove_dir_all(&root);
    }
}
