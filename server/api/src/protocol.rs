//! The worker protocol, version [`PROTOCOL`]: JSON control messages over a WebSocket, each
//! tensor that follows a message as one binary frame (its raw little-endian elements, in
//! the order the message lists them).
//!
//! A worker opens `WS /api/workers` (with `Authorization: Bearer <token>`), sends `hello`;
//! the server answers `welcome` or `refused`. Then the server sends `load` (a stage's
//! plan, its weights following as binary frames), `compute` (a micro-batch's inputs) and
//! `unload`; the worker answers `loaded`, `result` (outputs and its events) or `error`.
//!
//! Neither end trusts the other, and both check with the functions here: a tensor's size
//! is computed from its header with checked arithmetic before its frame is read
//! ([`tensor_bytes`]); the tensors a message announces are compared with the ones the
//! stage's plan says it must carry ([`expect_tensors`]) before any frame is read; and a
//! worker checks a plan it is asked to load for consistency and size ([`check_plan`])
//! before compiling it.

use serde::{Deserialize, Serialize};
use sluice_engine::gpu::AdapterSummary;
use sluice_engine::limits::Limits;
use sluice_engine::plan::cost::Rates;
use sluice_engine::plan::Plan;
use sluice_engine::telemetry::Event;
use sluice_engine::{DType, Tensor};
use std::collections::{HashMap, HashSet};

/// The protocol version this build speaks.
pub const PROTOCOL: u32 = 2;

/// The largest `hello` message a server reads, in bytes.
pub const MAX_HELLO_BYTES: usize = 64 << 10;

/// Describes a tensor sent in the next binary frame.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TensorHeader {
    /// Value name.
    pub name: String,
    /// Shape.
    pub shape: Vec<usize>,
    /// Element type.
    pub dtype: DType,
}

/// Messages from a worker.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ToServer {
    /// First message: who the worker is.
    Hello {
        /// Protocol version.
        protocol: u32,
        /// A display name (host name).
        name: String,
        /// Its adapters.
        adapters: Vec<AdapterSummary>,
        /// The measured rates of the adapter it computes on, for the partitioner.
        rates: Option<Rates>,
    },
    /// A stage is compiled and ready.
    Loaded {
        /// Job id.
        job: String,
    },
    /// A micro-batch's outputs (binary frames follow) and the events of computing it.
    Result {
        /// Job id.
        job: String,
        /// Micro-batch index.
        micro_batch: usize,
        /// The tensors that follow.
        outputs: Vec<TensorHeader>,
        /// Events, times relative to the request's arrival at the worker.
        events: Vec<Event>,
    },
    /// A request failed.
    Error {
        /// Job id, when the failure belongs to one.
        job: Option<String>,
        /// What went wrong.
        error: String,
    },
}

/// Messages to a worker.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ToWorker {
    /// The worker is accepted.
    Welcome {
        /// Its id on this server.
        worker: String,
    },
    /// The worker is refused (and the connection closes).
    Refused {
        /// Why.
        error: String,
    },
    /// Compile a stage's plan (its weights follow as binary frames).
    Load {
        /// Job id (`run/stage`).
        job: String,
        /// The stage's plan (`sluice_engine::plan::Plan` as JSON).
        plan: serde_json::Value,
        /// The weights that follow, in order.
        weights: Vec<TensorHeader>,
        /// Stage index (reported in events).
        stage: usize,
    },
    /// Run a micro-batch (binary frames with the inputs follow).
    Compute {
        /// Job id.
        job: String,
        /// Micro-batch index.
        micro_batch: usize,
        /// The tensors that follow.
        inputs: Vec<TensorHeader>,
    },
    /// Forget a stage.
    Unload {
        /// Job id.
        job: String,
    },
}

/// Headers and frames for a list of tensors.
pub fn encode(tensors: &[(String, Tensor)]) -> (Vec<TensorHeader>, Vec<Vec<u8>>) {
    tensors
        .iter()
        .map(|(name, t)| {
            (
                TensorHeader {
                    name: name.clone(),
                    shape: t.shape.clone(),
                    dtype: t.dtype(),
                },
                t.to_device_bytes(),
            )
        })
        .unzip()
}

/// The elements of a shape, or None when their count overflows.
fn elements(shape: &[usize]) -> Option<usize> {
    shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d))
}

/// The length of the frame that carries the tensor a header describes, computed with
/// checked arithmetic (an error names the tensor when it overflows).
pub fn tensor_bytes(h: &TensorHeader) -> Result<usize, String> {
    elements(&h.shape)
        .and_then(|n| n.checked_mul(h.dtype.size_bytes()))
        .ok_or_else(|| {
            format!(
                "tensor '{}' of shape {:?} has more bytes than this machine can count",
                h.name, h.shape
            )
        })
}

/// Rebuilds a tensor from its header and frame, checking the frame's length.
pub fn decode(h: &TensorHeader, bytes: &[u8]) -> Result<Tensor, String> {
    let needed = tensor_bytes(h)?;
    if needed != bytes.len() {
        return Err(format!(
            "tensor '{}' of shape {:?} needs {needed} bytes, the frame has {}",
            h.name,
            h.shape,
            bytes.len()
        ));
    }
    Ok(Tensor::from_device_bytes(h.shape.clone(), h.dtype, bytes))
}

/// The headers of some of a plan's values (its inputs, outputs or params), in the plan's
/// order; an error when the plan refers to a value it does not have.
pub fn plan_tensors(plan: &Plan, list: &[(String, usize)]) -> Result<Vec<TensorHeader>, String> {
    list.iter()
        .map(|(name, v)| {
            let value = plan
                .values
                .get(*v)
                .ok_or_else(|| format!("'{name}' refers to value {v}, which the plan lacks"))?;
            Ok(TensorHeader {
                name: name.clone(),
                shape: value.shape.clone(),
                dtype: value.dtype,
            })
        })
        .collect()
}

/// Checks the tensors a message announces against the ones it must carry (`what` names
/// them in errors, e.g. "outputs"): the same names, each once, with the same dtypes and
/// shapes, in any order. Returns the length of each announced tensor's frame, in the
/// message's order, so the frames can be read with exact bounds.
pub fn expect_tensors(
    expected: &[TensorHeader],
    got: &[TensorHeader],
    what: &str,
) -> Result<Vec<usize>, String> {
    if got.len() != expected.len() {
        return Err(format!(
            "{} {what} announced where {} are due",
            got.len(),
            expected.len()
        ));
    }
    let by_name: HashMap<&str, &TensorHeader> =
        expected.iter().map(|h| (h.name.as_str(), h)).collect();
    let mut seen = HashSet::new();
    got.iter()
        .map(|h| {
            let Some(want) = by_name.get(h.name.as_str()) else {
                return Err(format!("'{}' is not one of the {what}", short(&h.name)));
            };
            if !seen.insert(h.name.as_str()) {
                return Err(format!("'{}' is announced twice", short(&h.name)));
            }
            if h.dtype != want.dtype || h.shape != want.shape {
                return Err(format!(
                    "'{}' is announced as {} {:?}, it must be {} {:?}",
                    h.name, h.dtype, h.shape, want.dtype, want.shape
                ));
            }
            tensor_bytes(h)
        })
        .collect()
}

/// A name cut to a length an error message can carry.
fn short(name: &str) -> String {
    match name.char_indices().nth(64) {
        Some((i, _)) => format!("{}...", &name[..i]),
        None => name.to_string(),
    }
}

/// Checks a plan a worker is asked to load before it is compiled, with the engine's own
/// plan check ([`Plan::check_limits`]: every reference in range, every size countable,
/// every step's values exactly what inference gives, constants holding their elements)
/// under `limits`, and that its buffers need at most `max_bytes` bytes together. Returns
/// those bytes. Nothing is allocated by the size of anything the plan claims.
pub fn check_plan(plan: &Plan, limits: &Limits, max_bytes: u64) -> Result<u64, String> {
    plan.check_limits(limits).map_err(|e| e.to_string())?;
    let mut total: u64 = 0;
    for (i, &b) in plan.buffers.iter().enumerate() {
        total = total
            .checked_add(b)
            .filter(|&t| t <= max_bytes)
            .ok_or_else(|| {
                format!("its buffers need more than the {max_bytes} bytes allowed (at buffer {i})")
            })?;
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_engine::exec::dataset;
    use sluice_engine::plan::expr::{Expr, Operand};
    use sluice_engine::plan::{HalfStorage, PlanOptions, Precision, Step, Work};
    use sluice_engine::TensorData;

    fn plan_with(name: &str, batch: usize, options: PlanOptions) -> Plan {
        let text = match name {
            "mlp" => include_str!("../../../assets/graphs/mlp.json"),
            "cnn" => include_str!("../../../assets/graphs/cnn.json"),
            _ => include_str!("../../../assets/graphs/transformer_block.json"),
        };
        let graph = sluice_engine::load_graph(text).expect("example graph");
        let bound = dataset::bind(&graph, batch).expect("bind");
        Plan::with_options(&bound, options).expect("plan")
    }

    fn plan(name: &str, batch: usize) -> Plan {
        plan_with(name, batch, PlanOptions::default())
    }

    /// Breaks a plan in one way.
    type Breaker = Box<dyn Fn(&mut Plan)>;

    /// Each case breaks a copy of `p`; the plan check must refuse every one with a reason
    /// (the engine's plan check words them).
    fn assert_all_refused(p: &Plan, cases: Vec<(&str, Breaker)>) {
        for (want, break_it) in cases {
            let mut bad = p.clone();
            break_it(&mut bad);
            let e = check_plan(&bad, &Limits::default(), u64::MAX).expect_err(want);
            assert!(
                e.starts_with("invalid plan: ") || e.contains("(max_"),
                "{want}: {e}"
            );
        }
    }

    fn header(name: &str, shape: &[usize]) -> TensorHeader {
        TensorHeader {
            name: name.into(),
            shape: shape.to_vec(),
            dtype: DType::F32,
        }
    }

    #[test]
    fn the_planners_own_plans_pass() {
        let precisions = [Precision::F32, Precision::F16, Precision::Mixed];
        for name in ["mlp", "cnn", "transformer_block"] {
            for (batch, fuse) in [(1, true), (3, true), (2, false)] {
                for precision in precisions {
                    for half in [HalfStorage::Packed, HalfStorage::Native] {
                        let options = PlanOptions {
                            fuse,
                            precision,
                            half,
                        };
                        let p = plan_with(name, batch, options);
                        let bytes = check_plan(&p, &Limits::default(), u64::MAX)
                            .unwrap_or_else(|e| panic!("{name} {options:?}: {e}"));
                        assert_eq!(bytes, p.buffers.iter().sum::<u64>());
                    }
                }
            }
        }
    }

    #[test]
    fn a_plan_over_the_byte_bound_is_refused() {
        let p = plan("mlp", 2);
        let need: u64 = p.buffers.iter().sum();
        assert!(check_plan(&p, &Limits::default(), need).is_ok());
        let e = check_plan(&p, &Limits::default(), need - 1).unwrap_err();
        assert!(e.contains("bytes allowed"), "{e}");
        let mut huge = p.clone();
        huge.buffers[0] = u64::MAX;
        huge.buffers.push(u64::MAX);
        let e = check_plan(&huge, &Limits::default(), u64::MAX).unwrap_err();
        assert!(e.contains("overflow"), "{e}");
    }

    #[test]
    fn lying_plans_are_refused_with_a_reason() {
        let p = plan("mlp", 2);
        let cases: Vec<(&str, Breaker)> = vec![
            ("buffer", Box::new(|p| p.values[0].buffer = 10_000)),
            (
                "buffer",
                Box::new(|p| {
                    let b = p.values[0].buffer;
                    p.buffers[b] = 4;
                }),
            ),
            (
                "over the",
                Box::new(|p| p.values[0].shape = vec![1 << 40, 1 << 40]),
            ),
            (
                "stores",
                Box::new(|p| {
                    p.values[0].dtype = DType::I32;
                }),
            ),
            ("lacks", Box::new(|p| p.steps[0].inputs[0] = 99_999)),
            ("lacks", Box::new(|p| p.steps[0].outputs.push(99_999))),
            ("writes nothing", Box::new(|p| p.steps[0].outputs.clear())),
            (
                "computes",
                Box::new(|p| {
                    let last = p.steps.len() - 1;
                    let v = p.steps[last].outputs[0];
                    p.values[v].shape.push(1);
                }),
            ),
            (
                "takes",
                Box::new(|p| p.steps.last_mut().unwrap().inputs.clear()),
            ),
            (
                "weights",
                Box::new(|p| {
                    let s = p.steps.iter_mut().find(|s| !s.params.is_empty()).unwrap();
                    s.params.pop();
                }),
            ),
            ("in-place", Box::new(|p| p.steps[0].in_place = Some(7))),
            (
                "plan's input values",
                Box::new(|p| p.inputs[0].1 = p.params[0].1),
            ),
            (
                "plan's weight values",
                Box::new(|p| p.params[0].1 = p.inputs[0].1),
            ),
            (
                "twice",
                Box::new(|p| {
                    let first = p.params[0].clone();
                    p.params.push(first);
                }),
            ),
            ("not one value", Box::new(|p| p.outputs[0].1 = 12_345)),
            (
                "constant",
                Box::new(|p| {
                    p.constants.push((
                        0,
                        Tensor {
                            shape: vec![2],
                            data: TensorData::F32(vec![1.0]),
                        },
                    ))
                }),
            ),
        ];
        assert_all_refused(&p, cases);
    }

    /// A plan with a constant, a fused pointwise unit (exp, tanh, adding the constant) and
    /// a linear anchor with a relu epilogue.
    fn fused_plan() -> Plan {
        let text = r#"{
            "format": "sluice/graph@1",
            "inputs": { "x": { "shape": ["N", 8], "dtype": "f32" } },
            "nodes": [
                { "id": "e", "op": "exp", "inputs": ["x"] },
                { "id": "t", "op": "tanh", "inputs": ["e"] },
                { "id": "c", "op": "constant", "attrs": { "value": [1, 2, 3, 4, 5, 6, 7, 8] } },
                { "id": "s", "op": "add", "inputs": ["t", "c"] },
                { "id": "fc", "op": "linear", "inputs": ["s"], "attrs": { "out_features": 4 } },
                { "id": "r", "op": "relu", "inputs": ["fc"] }
            ],
            "outputs": ["r"]
        }"#;
        let graph = sluice_engine::load_graph(text).expect("graph");
        let bound = dataset::bind(&graph, 2).expect("bind");
        let p = Plan::new(&bound).expect("plan");
        assert!(p.steps.iter().any(|s| matches!(s.work, Work::Fused(_))));
        assert_eq!(p.constants.len(), 1);
        assert!(p
            .steps
            .iter()
            .any(|s| matches!(&s.work, Work::Epilogue { expr, .. } if !expr.terms.is_empty())));
        check_plan(&p, &Limits::default(), u64::MAX).expect("the planner's plan passes");
        p
    }

    #[test]
    fn fused_and_epilogue_operands_are_checked() {
        let p = fused_plan();
        fn fused(p: &mut Plan) -> &mut Expr {
            p.steps
                .iter_mut()
                .find_map(|s| match &mut s.work {
                    Work::Fused(e) => Some(e),
                    _ => None,
                })
                .unwrap()
        }
        fn epilogue(p: &mut Plan) -> &mut Step {
            p.steps
                .iter_mut()
                .find(|s| matches!(s.work, Work::Epilogue { .. }))
                .unwrap()
        }
        let cases: Vec<(&str, Breaker)> = vec![
            (
                "operand",
                Box::new(|p| fused(p).terms[0].args[0] = Operand::Input(50)),
            ),
            (
                "operand",
                Box::new(|p| fused(p).terms[0].args[0] = Operand::Term(0)),
            ),
            (
                "operand",
                Box::new(|p| fused(p).terms[0].args[0] = Operand::Anchor),
            ),
            ("without terms", Box::new(|p| fused(p).terms.clear())),
            (
                "constant 'c' holds 1",
                Box::new(|p| p.constants[0].1.data = TensorData::F32(vec![1.0])),
            ),
            (
                "takes",
                Box::new(|p| fused(p).terms[0].args.push(Operand::Scalar(1.0))),
            ),
            (
                "not pointwise",
                Box::new(|p| {
                    let anchor = match &epilogue(p).work {
                        Work::Epilogue { anchor, .. } => anchor.clone(),
                        _ => unreachable!(),
                    };
                    fused(p).terms[0].op = anchor;
                }),
            ),
            // An anchor input read as an epilogue operand (the lowering would underflow).
            (
                "operand",
                Box::new(|p| {
                    if let Work::Epilogue { expr, .. } = &mut epilogue(p).work {
                        expr.terms[0].args[0] = Operand::Input(0);
                    }
                }),
            ),
            (
                "lacks",
                Box::new(|p| {
                    if let Work::Epilogue { anchor_inputs, .. } = &mut epilogue(p).work {
                        *anchor_inputs = 40;
                    }
                }),
            ),
            (
                "neither a scalar nor a row",
                Box::new(|p| {
                    let x = p.inputs[0].1;
                    epilogue(p).inputs.push(x);
                }),
            ),
            (
                "cannot anchor",
                Box::new(|p| {
                    let relu = fused(p).terms[0].op.clone();
                    if let Work::Epilogue { anchor, .. } = &mut epilogue(p).work {
                        *anchor = relu;
                    }
                }),
            ),
        ];
        assert_all_refused(&p, cases);
    }

    #[test]
    fn announced_tensors_must_be_the_expected_ones() {
        let want = vec![header("a", &[2, 3]), header("b", &[4])];
        let sizes = expect_tensors(&want, &[header("b", &[4]), header("a", &[2, 3])], "outputs");
        assert_eq!(sizes.unwrap(), vec![16, 24]);
        let cases = [
            (vec![header("a", &[2, 3])], "1 outputs announced where 2"),
            (vec![header("a", &[2, 3]), header("a", &[2, 3])], "twice"),
            (
                vec![header("a", &[2, 3]), header("c", &[4])],
                "not one of the outputs",
            ),
            (
                vec![header("a", &[3, 2]), header("b", &[4])],
                "must be f32 [2, 3]",
            ),
        ];
        for (got, e) in cases {
            let err = expect_tensors(&want, &got, "outputs").unwrap_err();
            assert!(err.contains(e), "{err}");
        }
    }

    #[test]
    fn sizes_overflowing_are_errors_not_panics() {
        let h = header("x", &[usize::MAX, 2]);
        assert!(tensor_bytes(&h).unwrap_err().contains("more bytes"));
        assert!(decode(&h, &[0; 8]).is_err());
        let h = header("x", &[usize::MAX / 2]);
        assert!(tensor_bytes(&h).is_err());
        let h = header("x", &[2]);
        assert!(decode(&h, &[0; 7]).unwrap_err().contains("needs 8 bytes"));
        assert_eq!(decode(&h, &[0; 8]).unwrap().shape, vec![2]);
    }
}
