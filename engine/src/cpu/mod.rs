//! The CPU reference: one plain implementation per operator family, mirroring `ops/`.
//! Written for clarity, not speed. It is the oracle the GPU kernels are tested against
//! ([`run`] interprets a bound graph directly) and, behind the execution seam
//! ([`CpuDevice`]), the device where no adapter exists (`--device cpu`).
//!
//! Every family is written once, generic over the float type ([`Float`], [`Host`]): [`eval`]
//! and [`run`] compute in f32, [`run_f64`] runs the same implementations in f64 (the
//! gradient checks difference it).
//!
//! [`eval`] checks its operands before a family sees them: every tensor holds the
//! elements its shape says, and the shapes are what inference gives for them (the output
//! shapes, the weights'). So inside the families, sizes and indices derived from the
//! shapes fit the tensors they index.

mod attention;
mod conv;
mod conv_grad;
mod convert;
mod device;
mod einsum;
mod elementwise;
#[cfg(feature = "native")]
mod fast;
mod grad;
mod host;
mod indexing;
mod loss;
mod matmul;
mod movement;
mod norm;
mod recurrent;
mod reduce;

use crate::error::RunError;
use crate::graph::{Graph, NodeKind};
use crate::ops::{Op, TensorType};
use crate::shape;
use crate::tensor::{Tensor, Tensor64};
use crate::weights::Weights;
use std::collections::HashMap;

use host::{Float, Host};

#[cfg(all(feature = "native", not(target_arch = "wasm32")))]
pub use device::session;
pub use device::{CpuDevice, CpuExecutable};

/// Applies one operator to host tensors; `out_shapes` are the inferred output shapes.
/// The operands must be what inference typed (a checked graph or plan); every tensor is
/// checked to hold its shape's elements, and a wrong number of operands is an error.
pub fn eval(
    op: &Op,
    inputs: &[&Tensor],
    params: &[&Tensor],
    out_shapes: &[Vec<usize>],
) -> Result<Vec<Tensor>, String> {
    apply(op, inputs, params, out_shapes)
}

/// [`eval`] on host tensors of either float type.
fn apply<T: Host>(
    op: &Op,
    inputs: &[&T],
    params: &[&T],
    out_shapes: &[Vec<usize>],
) -> Result<Vec<T>, String> {
    check_operands(op, inputs, params, out_shapes)?;
    // Indexing operators include generators without inputs (`range`).
    if let (Op::Indexing(o), Some(out)) = (op, out_shapes.first()) {
        return indexing::eval(o, inputs, out).map(|t| vec![t]);
    }
    let x = inputs.first().copied();
    let (first, out) = match (x, out_shapes.first()) {
        (Some(x), Some(out)) => (x, out),
        _ if matches!(op, Op::Constant(_)) => return Ok(vec![op_constant(op)]),
        _ if matches!(op, Op::Param(_)) => return param_value(params),
        _ => return Err("an operator needs an input and an output shape".into()),
    };
    match op {
        Op::MatMul(o) => matmul::eval(o, inputs, params, out_shapes),
        Op::Elementwise(o) => Ok(vec![elementwise::eval(o, inputs, out)?]),
        Op::Reduce(o) => reduce::eval(o, first),
        Op::Norm(o) => norm::eval(o, first, params).map(|t| vec![t]),
        Op::Movement(o) => movement::eval(o, inputs, out_shapes),
        Op::Indexing(o) => indexing::eval(o, inputs, out).map(|t| vec![t]),
        Op::Conv(o) => conv::eval(o, first, params, out).map(|t| vec![t]),
        Op::Constant(_) => Ok(vec![op_constant(op)]),
        Op::Convert(o) => Ok(vec![convert::eval(o, inputs, out)?]),
        Op::Loss(o) => Ok(vec![loss::eval(o, inputs, out)?]),
        Op::Param(_) => param_value(params),
        Op::Grad(o) => grad::eval(o, inputs, out).map(|t| vec![t]),
        Op::Attention(o) => attention::eval(o, inputs, out).map(|t| vec![t]),
        Op::Recurrent(o) => recurrent::eval(o, inputs, out_shapes),
        Op::Einsum(o) => einsum::eval(o, inputs, out).map(|t| vec![t]),
    }
}

/// Checks operands against inference: the operator is valid (as parsing makes it), the
/// tensors hold their shapes' elements, the
/// output shapes are the inferred ones (for pointwise operators, ones the inferred shape
/// broadcasts to: fused units evaluate every term at the unit's output shape), and the
/// weights have the declared shapes.
fn check_operands<T: Host>(
    op: &Op,
    inputs: &[&T],
    params: &[&T],
    out_shapes: &[Vec<usize>],
) -> Result<(), String> {
    op.validate(usize::MAX)?;
    for t in inputs.iter().chain(params) {
        t.check()?;
    }
    let types: Vec<TensorType> = inputs
        .iter()
        .map(|t| TensorType {
            shape: shape::known(t.shape()),
            dtype: t.dtype(),
        })
        .collect();
    let inferred = op.infer(&types)?;
    let pointwise = op.capabilities().pointwise;
    let fits = inferred.len() == out_shapes.len()
        && inferred.iter().zip(out_shapes).all(|(t, s)| {
            let s = shape::known(s);
            t.shape == s || pointwise && shape::broadcast(&t.shape, &s).is_ok_and(|b| b == s)
        });
    if !fits {
        return Err(format!(
            "'{}' cannot produce {out_shapes:?} from {:?}",
            op.name(),
            types.iter().map(|t| t.to_string()).collect::<Vec<_>>()
        ));
    }
    let specs = op.params(&types)?;
    if specs.len() != params.len() || specs.iter().zip(params).any(|(p, t)| p.shape != t.shape()) {
        return Err(format!("'{}' got weights of the wrong shapes", op.name()));
    }
    Ok(())
}

/// A `param` operator's value: the weight it reads.
fn param_value<T: Host>(params: &[&T]) -> Result<Vec<T>, String> {
    match params {
        [w] => Ok(vec![(*w).clone()]),
        _ => Err("a param reads exactly one weight".into()),
    }
}

/// A constant operator's value.
fn op_constant<T: Host>(op: &Op) -> T {
    op.constant_value()
        .map_or_else(|| T::from_floats(vec![0], Vec::new()), T::from_tensor)
}

/// Runs a bound graph (all shapes concrete) on the CPU. Returns the outputs in order.
pub fn run(
    graph: &Graph,
    weights: &Weights,
    inputs: &HashMap<String, Tensor>,
) -> Result<Vec<(String, Tensor)>, RunError> {
    crate::exec::dataset::check_inputs(graph, inputs)?;
    interpret(graph, weights, inputs)
}

/// [`run`] in f64: the same operators with f64 floats (constants widened from their f32
/// values), for checks that need more precision than f32 gives. Inputs and weights are
/// checked as [`run`] checks them.
pub fn run_f64(
    graph: &Graph,
    weights: &HashMap<String, Tensor64>,
    inputs: &HashMap<String, Tensor64>,
) -> Result<Vec<(String, Tensor64)>, RunError> {
    let narrowed: HashMap<String, Tensor> = inputs
        .iter()
        .map(|(k, t)| (k.clone(), t.to_f32()))
        .collect();
    crate::exec::dataset::check_inputs(graph, &narrowed)?;
    interpret(graph, weights, inputs)
}

/// Interprets a bound graph on checked inputs.
fn interpret<T: Host>(
    graph: &Graph,
    weights: &HashMap<String, T>,
    inputs: &HashMap<String, T>,
) -> Result<Vec<(String, T)>, RunError> {
    let mut values: HashMap<(petgraph::stable_graph::NodeIndex, usize), T> = HashMap::new();
    for (name, ix) in &graph.inputs {
        if let Some(t) = inputs.get(name) {
            values.insert((*ix, 0), t.clone());
        }
    }
    for &ix in &graph.order {
        let node = &graph.dag[ix];
        let NodeKind::Op(op) = &node.kind else {
            continue;
        };
        let args: Vec<&T> = graph
            .node_inputs(ix)
            .into_iter()
            .map(|k| {
                values.get(&k).ok_or_else(|| {
                    RunError::Internal(format!("value for node '{}' missing", node.id))
                })
            })
            .collect::<Result<_, _>>()?;
        let params: Vec<&T> = node
            .params
            .iter()
            .map(|p| {
                let key = node.param_key(p);
                weights.get(&key).ok_or(RunError::MissingWeight(key))
            })
            .collect::<Result<_, _>>()?;
        let out_shapes: Vec<Vec<usize>> = node
            .outputs
            .iter()
            .map(|t| shape::concrete(&t.shape).ok_or_else(|| RunError::Unbound(node.id.clone())))
            .collect::<Result<_, _>>()?;
        let outs = apply(op, &args, &params, &out_shapes).map_err(|e| RunError::Op {
            node: node.id.clone(),
            message: e,
        })?;
        for (k, t) in outs.into_iter().enumerate() {
            values.insert((ix, k), t);
        }
    }
    graph
        .outputs
        .iter()
        .map(|o| {
            values
                .get(&(o.node, o.port))
                .cloned()
                .map(|t| (o.name.clone(), t))
                .ok_or_else(|| RunError::Internal(format!("output '{}' was not computed", o.name)))
        })
        .collect()
}

/// The float elements of a tensor (the validator guarantees f32 where operators need it).
pub(crate) fn floats<T: Host>(t: &T) -> Result<&[T::F], String> {
    t.floats()
        .ok_or_else(|| format!("expected an f32 tensor, got {}", t.dtype()))
}

/// Row-major multi-index of a linear index (`out` has one entry per dimension).
pub(crate) fn unravel(mut i: usize, dims: &[usize], out: &mut [usize]) {
    for d in (0..dims.len()).rev() {
        out[d] = i % dims[d].max(1);
        i /= dims[d].max(1);
    }
}

#[cfg(test)]
mod tests {
    use crate::exec::{dataset, RunConfig, RunContext};
    use crate::graph::testing::{random_document, Mode};
    use crate::graph::{load_graph, Graph};
    use crate::ops::TensorType;
    use crate::shape;
    use crate::tensor::{Tensor, Tensor64};
    use crate::weights::init_weights;
    use proptest::prelude::*;
    use std::collections::HashMap;

    /// The inferred concrete shapes of a bound graph's outputs.
    fn inferred(g: &Graph) -> Vec<Option<Vec<usize>>> {
        g.outputs
            .iter()
            .map(|o| {
                let t: Option<&TensorType> = g.dag[o.node].outputs.get(o.port);
                t.and_then(|t| shape::concrete(&t.shape))
            })
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        /// For small accepted graphs, the CPU reference computes outputs of exactly the
        /// inferred shapes, in f32 and in f64, and so does the same graph planned and run
        /// as a session on the CPU device (when the run is allowed at all); nothing panics
        /// on the way.
        #[test]
        fn the_reference_computes_the_inferred_shapes(seed in any::<u64>()) {
            let doc = random_document(seed, Mode::Tame);
            let Ok(g) = load_graph(&doc.to_string()) else { return Ok(()) };
            let Ok(bound) = dataset::bind(&g, 2) else { return Ok(()) };
            let weights = init_weights(&g, 1);
            let inputs = dataset::random_inputs(&bound, 2)
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            let want = inferred(&bound);
            if let Ok(outs) = super::run(&bound, &weights, &inputs) {
                let got: Vec<Option<Vec<usize>>> =
                    outs.iter().map(|(_, t)| Some(t.shape.clone())).collect();
                prop_assert_eq!(&got, &want);
                for (_, t) in &outs {
                    prop_assert!(t.check().is_ok());
                }
            }
            let widen = |m: &HashMap<String, Tensor>| -> HashMap<String, Tensor64> {
                m.iter().map(|(k, t)| (k.clone(), t.into())).collect()
            };
            if let Ok(outs) = super::run_f64(&bound, &widen(&weights), &widen(&inputs)) {
                let got: Vec<Option<Vec<usize>>> =
                    outs.iter().map(|(_, t)| Some(t.shape.clone())).collect();
                prop_assert_eq!(&got, &want);
                for (_, t) in &outs {
                    prop_assert!(t.check().is_ok());
                }
            }
            let config = RunConfig { batch: 2, ..RunConfig::default() };
            if let Ok(mut session) = super::session(&g, &weights, &config) {
                if let Ok(report) = session.run_blocking(&inputs, &RunContext::new("p")) {
                    let got: Vec<Option<Vec<usize>>> =
                        report.outputs.iter().map(|(_, t)| Some(t.shape.clone())).collect();
                    prop_assert_eq!(&got, &want);
                }
            }
        }
    }

    /// `run_f64` runs the same operators in f64: e^x − 1 keeps what f32 rounds away
    /// (constants widened from f32), and the shapes are the f32 run's.
    #[test]
    fn run_f64_keeps_what_f32_rounds_away() {
        let text = r#"{ "format": "sluice/graph@1",
            "inputs": { "x": { "shape": [3] } },
            "nodes": [
              { "id": "e", "op": "exp", "inputs": ["x"] },
              { "id": "one", "op": "constant", "attrs": { "value": [1.0], "shape": [] } },
              { "id": "d", "op": "sub", "inputs": ["e", "one"] }
            ],
            "outputs": ["d"] }"#;
        let g = load_graph(text).unwrap();
        let x = [1e-10, 0.5, -3e-9];
        let narrow = crate::Tensor::f32(vec![3], x.iter().map(|&v| v as f32).collect());
        let wide = crate::tensor::Tensor64::f64(vec![3], x.to_vec());
        let outs =
            super::run(&g, &Default::default(), &[("x".to_string(), narrow)].into()).unwrap();
        assert_eq!(outs[0].1.as_f32().unwrap()[0], 0.0);
        let outs =
            super::run_f64(&g, &Default::default(), &[("x".to_string(), wide)].into()).unwrap();
        assert_eq!(outs[0].1.shape, vec![3]);
        for (got, x) in outs[0].1.as_f64().unwrap().iter().zip(x) {
            let want = f64::exp_m1(x);
            assert!(
                (got - want).abs() <= 1e-16 * want.abs().max(1.0),
                "{got} vs {want}"
            );
        }
    }

    #[test]
    fn slices_at_the_i64_extremes_run() {
        let text = r#"{ "format": "sluice/graph@1",
            "inputs": { "x": { "shape": [5, 3] } },
            "nodes": [
              { "id": "a", "op": "slice", "inputs": ["x"], "attrs":
                { "starts": [-9223372036854775808], "ends": [9223372036854775807], "axes": [0],
                  "steps": [9223372036854775807] } },
              { "id": "b", "op": "slice", "inputs": ["x"], "attrs":
                { "starts": [9223372036854775807], "ends": [-9223372036854775808], "axes": [0],
                  "steps": [-9223372036854775808] } },
              { "id": "c", "op": "slice", "inputs": ["x"], "attrs":
                { "starts": [9223372036854775807], "ends": [-9223372036854775808], "axes": [1],
                  "steps": [-1] } }
            ],
            "outputs": ["a", "b", "c"] }"#;
        let g = load_graph(text).unwrap();
        let x = crate::Tensor::f32(vec![5, 3], (0..15).map(|v| v as f32).collect());
        let inputs = std::collections::HashMap::from([("x".to_string(), x)]);
        let outs = super::run(&g, &Default::default(), &inputs).unwrap();
        // a: row 0 only; b: the last row only; c: columns reversed.
        assert_eq!(outs[0].1.as_f32().unwrap(), &[0.0, 1.0, 2.0]);
        assert_eq!(outs[1].1.as_f32().unwrap(), &[12.0, 13.0, 14.0]);
        assert_eq!(outs[2].1.shape, vec![5, 3]);
        assert_eq!(&outs[2].1.as_f32().unwrap()[..3], &[2.0, 1.0, 0.0]);
    }

    #[test]
    fn operands_that_do_not_fit_inference_are_errors_not_panics() {
        use crate::ops::parse;
        let relu = parse("relu", &Default::default()).unwrap();
        let lying = crate::Tensor::f32(vec![4, 4], vec![1.0; 3]);
        assert!(super::eval(&relu, &[&lying], &[], &[vec![4, 4]]).is_err());
        let x = crate::Tensor::f32(vec![2, 2], vec![1.0; 4]);
        assert!(super::eval(&relu, &[&x], &[], &[vec![3, 3]]).is_err());
        assert!(super::eval(&relu, &[], &[], &[vec![2, 2]]).is_err());
        let linear = parse(
            "linear",
            serde_json::json!({ "out_features": 3 })
                .as_object()
                .unwrap(),
        )
        .unwrap();
        let w = crate::Tensor::f32(vec![5, 3], vec![0.0; 15]);
        assert!(super::eval(&linear, &[&x], &[&w], &[vec![2, 3]]).is_err());
    }

    #[test]
    fn a_mean_loss_runs_as_one_batch_refuses_micro_batches_and_checks_labels() {
        use crate::exec::{RunConfig, RunContext};
        use crate::tensor::{Tensor, TensorData};
        let text = r#"{ "format": "sluice/graph@1",
            "inputs": { "x": { "shape": ["N", 3] }, "y": { "shape": ["N"], "dtype": "i32" } },
            "nodes": [ { "id": "ce", "op": "softmax_cross_entropy", "inputs": ["x", "y"] } ],
            "outputs": ["ce"] }"#;
        let g = load_graph(text).unwrap();
        let data = |labels: Vec<i32>| {
            std::collections::HashMap::from([
                (
                    "x".to_string(),
                    Tensor::f32(vec![2, 3], vec![1.0, 2.0, 3.0, 0.0, 0.0, 0.0]),
                ),
                (
                    "y".to_string(),
                    Tensor {
                        shape: vec![2],
                        data: TensorData::I32(labels),
                    },
                ),
            ])
        };
        let run = |microbatches: usize, labels: Vec<i32>| {
            let config = RunConfig {
                batch: 2,
                microbatches,
                ..RunConfig::default()
            };
            super::session(&g, &Default::default(), &config)
                .and_then(|mut s| s.run_blocking(&data(labels), &RunContext::new("ce")))
                .map(|r| r.outputs)
                .map_err(|e| e.to_string())
        };
        let outs = run(1, vec![2, 0]).unwrap();
        assert_eq!(outs[0].1.shape, Vec::<usize>::new());
        // (0.407606 + ln 3) / 2, as computed by hand in cpu::loss's tests.
        let v = outs[0].1.as_f32().unwrap()[0];
        assert!((v - 0.753_109).abs() < 1e-5, "{v}");
        let e = run(2, vec![2, 0]).unwrap_err();
        assert!(
            e.contains("softmax_cross_entropy with reduction \"mean\" over axis 0"),
            "{e}"
        );
        let e = run(1, vec![3, 0]).unwrap_err();
        assert!(e.contains("label 3 is outside [0, 3)"), "{e}");
        let e = run(1, vec![0, -1]).unwrap_err();
        assert!(e.contains("label -1 is outside [0, 3)"), "{e}");
    }
}
