//! Gradient checks: for every operator with a gradient rule, a one-operator graph with
//! small odd-sized random inputs (broadcasting, each attribute), the loss
//! `reduce_sum(output × R)` with a fixed random R, and its joint graph. Every gradient (of
//! the inputs and of the weights) is checked three ways, each error measured per element
//! as |value − reference| / max(1, |reference|) and reported as the largest:
//!
//! - **the rule**: the joint graph run by the CPU reference in f64 (`cpu::run_f64`)
//!   against central finite differences of the forward graph, also in f64, with ε = 1e-6.
//!   Round-off of a loss of order 10 is about 1e-15, 1e-9 after dividing by 2ε; the
//!   truncation error is ε²/6 times the third derivative, about 1e-13; so a right rule
//!   agrees to far better than the bound, 1e-6. The absolute floor (the max with 1) keeps
//!   tiny gradients, whose differences are all round-off, from dominating. A wrong rule (a
//!   flipped sign, a missing factor) is off by the size of the gradient itself, 1e-2 and
//!   more, which `a_wrong_rule_is_caught` shows. Inputs of operators with kinks (relu,
//!   clip, max, min) sit on grids away from the kinks. `erf` and exact `gelu` are the one
//!   exception: their forward is an approximation of erf with error up to 1.5e-7 (the
//!   kernels' formula), whose slope differs from the rule's exact 2/√π·e^(−x²) by up to
//!   7e-6 (near 0; 1e-6 beyond 0.5), so they are held to [`APPROXIMATED`] instead.
//! - **f32 against f64**: the same joint graph by the f32 CPU reference against the f64
//!   one. f32 round-off through a few operators is a few 1e-7; the bound,
//!   [`F32_TOLERANCE`], leaves room for longer sums and is a thousandth of a wrong rule's
//!   error.
//! - **GPU against CPU**: the joint graph planned, fused and run on the GPU against the f64
//!   reference, to [`GPU_TOLERANCE`], the forward kernels' bound in `gpu_vs_cpu` (WGSL's
//!   `exp`, `tanh` and `pow` may be less exact than Rust's). A kernel computing a wrong
//!   gradient fails both comparisons, which `a_wrong_rule_is_caught` also shows.
//!
//! `cargo test -p sluice-tests --test gradients -- --nocapture` prints the table.

use serde_json::{json, Value};
use sluice_engine::autodiff::{backward, backward_wrt, AutodiffError};
use sluice_engine::rng::Rng;
use sluice_engine::tensor::Tensor64;
use sluice_engine::weights::Weights;
use sluice_engine::{cpu, Graph, Tensor, TensorData};
use sluice_tests::{graph, random_weights, run_gpu};
use std::collections::HashMap;

/// Central differences step, in f64.
const EPS: f64 = 1e-6;
/// Largest error of the f64 rule against finite differences.
const TOLERANCE: f64 = 1e-6;
/// Largest error of the rule for operators whose forward approximates erf.
const APPROXIMATED: f64 = 1e-5;
/// Largest error of the f32 CPU reference's gradients against the f64 ones.
const F32_TOLERANCE: f64 = 1e-5;
/// Largest error of the GPU's gradients against the f64 reference's.
const GPU_TOLERANCE: f64 = 1e-4;

/// How an input's values are drawn.
#[derive(Clone, Copy)]
enum Values {
    /// Uniform in [-2, 2).
    Any,
    /// Uniform in [0.5, 2) (log, sqrt, pow bases, divisors).
    Positive,
    /// offset + 0.5·k for k in -4..4: away from kinks at multiples of 0.5 (offset 0.25).
    Grid(f32),
    /// Random bools (not differentiated).
    Bool,
    /// i32 indices in [-n, n), repeating (not differentiated).
    Index(i32),
    /// i32 class labels in [0, n) (not differentiated).
    Class(i32),
    /// A random permutation of 0.05·(k − n/2) for k in 0..n: all distinct, 0.05 apart
    /// (more than 2ε), so no finite difference moves a maximum (max_pool2d).
    Distinct,
}

/// One case: an operator, its attributes and inputs, and which outputs the loss reads.
struct Case {
    label: String,
    op: &'static str,
    attrs: Value,
    inputs: Vec<(&'static str, Vec<usize>, Values)>,
    outputs: Vec<usize>,
}

fn case(op: &'static str, attrs: Value, inputs: &[(&'static str, &[usize], Values)]) -> Case {
    Case {
        label: format!(
            "{op} {attrs} {:?}",
            inputs.iter().map(|i| &i.1).collect::<Vec<_>>()
        ),
        op,
        attrs,
        inputs: inputs
            .iter()
            .map(|(n, s, v)| (*n, s.to_vec(), *v))
            .collect(),
        outputs: vec![0],
    }
}

/// Every case.
fn cases() -> Vec<Case> {
    use Values::*;
    let mut v = Vec::new();
    let x = |s: &'static [usize], vals| ("x", s, vals);
    for (op, vals) in [
        ("relu", Grid(0.25)),
        ("sigmoid", Any),
        ("tanh", Any),
        ("exp", Any),
        ("log", Positive),
        ("sqrt", Positive),
        ("erf", Any),
    ] {
        v.push(case(op, json!({}), &[x(&[3, 5], vals)]));
    }
    for a in ["none", "tanh"] {
        v.push(case(
            "gelu",
            json!({ "approximate": a }),
            &[x(&[2, 3, 5], Any)],
        ));
    }
    for attrs in [
        json!({ "min": -1.0, "max": 1.0 }),
        json!({ "min": -0.5 }),
        json!({ "max": 0.5 }),
        json!({ "min": 1.0, "max": -1.0 }),
    ] {
        v.push(case("clip", attrs, &[x(&[3, 7], Grid(0.25))]));
    }
    // Activations away from their kinks; the step functions' gradient is zero.
    for (op, attrs, vals) in [
        ("leaky_relu", json!({ "alpha": 0.2 }), Grid(0.25)),
        ("elu", json!({ "alpha": 1.5 }), Grid(0.25)),
        ("selu", json!({}), Grid(0.25)),
        ("softplus", json!({}), Any),
        ("softsign", json!({}), Grid(0.25)),
        (
            "hard_sigmoid",
            json!({ "alpha": 0.5, "beta": 0.6 }),
            Grid(0.25),
        ),
        ("hard_swish", json!({}), Any),
        ("silu", json!({}), Any),
        ("swish", json!({ "alpha": 1.5 }), Any),
        ("mish", json!({}), Any),
        ("abs", json!({}), Grid(0.25)),
        ("neg", json!({}), Any),
        ("reciprocal", json!({}), Positive),
        ("sin", json!({}), Any),
        ("cos", json!({}), Any),
        ("floor", json!({}), Grid(0.25)),
        ("ceil", json!({}), Grid(0.25)),
        ("round", json!({}), Grid(0.25)),
        ("sign", json!({}), Grid(0.25)),
    ] {
        v.push(case(op, attrs, &[x(&[3, 5], vals)]));
    }
    for slope in [&[5][..], &[3, 5], &[]] {
        v.push(case(
            "prelu",
            json!({}),
            &[("x", &[3, 5], Grid(0.25)), ("slope", slope, Any)],
        ));
    }
    for fmod in [0, 1] {
        v.push(case(
            "mod",
            json!({ "fmod": fmod }),
            &[("a", &[3, 5], Any), ("b", &[5], Positive)],
        ));
    }
    let pairs: [(&[usize], &[usize]); 4] = [
        (&[3, 5], &[3, 5]),
        (&[3, 5], &[5]),
        (&[2, 1, 3], &[4, 1]),
        (&[1], &[2, 3]),
    ];
    for (a, b) in pairs {
        for op in ["add", "sub", "mul"] {
            v.push(case(op, json!({}), &[("a", a, Any), ("b", b, Any)]));
        }
        v.push(case("div", json!({}), &[("a", a, Any), ("b", b, Positive)]));
        v.push(case("pow", json!({}), &[("a", a, Positive), ("b", b, Any)]));
        v.push(case(
            "max",
            json!({}),
            &[("a", a, Grid(0.25)), ("b", b, Grid(0.0))],
        ));
        v.push(case(
            "min",
            json!({}),
            &[("a", a, Grid(0.0)), ("b", b, Grid(0.25))],
        ));
    }
    v.push(case(
        "where",
        json!({}),
        &[("c", &[3, 1], Bool), ("a", &[3, 5], Any), ("b", &[5], Any)],
    ));
    // Matmul family.
    let products: [(&[usize], &[usize]); 6] = [
        (&[3, 5], &[5, 4]),
        (&[2, 3, 5], &[5, 4]),
        (&[5], &[5, 3]),
        (&[3, 5], &[5]),
        (&[5], &[5]),
        (&[2, 1, 3, 4], &[3, 4, 2]),
    ];
    for (a, b) in products {
        v.push(case("matmul", json!({}), &[("a", a, Any), ("b", b, Any)]));
    }
    v.push(case(
        "linear",
        json!({ "out_features": 4 }),
        &[x(&[3, 5], Any)],
    ));
    v.push(case(
        "linear",
        json!({ "out_features": 3, "bias": false }),
        &[x(&[2, 3, 5], Any)],
    ));
    v.push(case(
        "linear",
        json!({ "out_features": 3 }),
        &[x(&[5], Any)],
    ));
    // Reduce family.
    for op in ["reduce_sum", "reduce_mean"] {
        for attrs in [
            json!({}),
            json!({ "axes": [1] }),
            json!({ "axes": [0, 2], "keepdims": false }),
            json!({ "axes": [-1], "keepdims": false }),
            json!({ "axes": [] }),
        ] {
            v.push(case(op, attrs, &[x(&[2, 3, 5], Any)]));
        }
    }
    // Normalisation family.
    for op in ["softmax", "log_softmax"] {
        for axis in [-1, 0, 1] {
            v.push(case(op, json!({ "axis": axis }), &[x(&[2, 3, 5], Any)]));
        }
    }
    v.push(case("layer_norm", json!({}), &[x(&[3, 5], Any)]));
    v.push(case(
        "layer_norm",
        json!({ "axis": 1, "epsilon": 1e-3 }),
        &[x(&[2, 3, 4], Any)],
    ));
    v.push(case("rms_norm", json!({}), &[x(&[3, 5], Any)]));
    v.push(case(
        "rms_norm",
        json!({ "axis": 1, "epsilon": 1e-3 }),
        &[x(&[2, 3, 4], Any)],
    ));
    v.push(case("instance_norm", json!({}), &[x(&[2, 3, 4], Any)]));
    v.push(case(
        "group_norm",
        json!({ "num_groups": 2, "epsilon": 1e-3 }),
        &[x(&[2, 4, 3], Any)],
    ));
    v.push(case("batch_norm", json!({}), &[x(&[2, 3, 4], Any)]));
    v.push(case(
        "batch_norm",
        json!({ "epsilon": 0.1 }),
        &[x(&[3, 2], Any)],
    ));
    // Movement family.
    v.push(case(
        "reshape",
        json!({ "shape": [5, -1] }),
        &[x(&[3, 5], Any)],
    ));
    v.push(case("flatten", json!({ "axis": 2 }), &[x(&[2, 3, 5], Any)]));
    v.push(case("squeeze", json!({}), &[x(&[3, 1, 5], Any)]));
    v.push(case(
        "unsqueeze",
        json!({ "axes": [0, 3] }),
        &[x(&[3, 5], Any)],
    ));
    v.push(case("identity", json!({}), &[x(&[3, 5], Any)]));
    v.push(case("dropout", json!({ "ratio": 0.3 }), &[x(&[3, 5], Any)]));
    v.push(case("transpose", json!({}), &[x(&[2, 3, 5], Any)]));
    v.push(case(
        "transpose",
        json!({ "perm": [1, 2, 0] }),
        &[x(&[2, 3, 5], Any)],
    ));
    v.push(case(
        "concat",
        json!({ "axis": 1 }),
        &[
            ("a", &[2, 3], Any),
            ("b", &[2, 1], Any),
            ("c", &[2, 4], Any),
        ],
    ));
    let mut split = case(
        "split",
        json!({ "axis": 1, "sizes": [2, 1, 4] }),
        &[x(&[3, 7], Any)],
    );
    split.outputs = vec![0, 2];
    v.push(split);
    let mut split = case("split", json!({ "num_outputs": 2 }), &[x(&[5, 3], Any)]);
    split.outputs = vec![1];
    v.push(split);
    v.push(case(
        "slice",
        json!({ "starts": [1, -4], "ends": [3, 100], "axes": [0, 1] }),
        &[x(&[4, 7], Any)],
    ));
    for attrs in [
        json!({ "starts": [0], "ends": [7], "steps": [2] }),
        json!({ "starts": [1, 6], "ends": [4, 0], "axes": [0, 1], "steps": [2, -3] }),
        json!({ "starts": [-1], "ends": [-100], "axes": [1], "steps": [-1] }),
        json!({ "starts": [5], "ends": [2], "axes": [1], "steps": [1] }),
    ] {
        v.push(case("slice", attrs, &[x(&[7, 8], Any)]));
    }
    v.push(case(
        "expand",
        json!({ "shape": [3, 4, 5] }),
        &[x(&[4, 1], Any)],
    ));
    for attrs in [
        json!({ "pads": [1, -1, 2, 3], "constant_value": 0.5 }),
        json!({ "pads": [2, 1, 1, 2], "mode": "reflect" }),
        json!({ "pads": [0, 3, 2, 1], "mode": "edge" }),
        json!({ "pads": [3, 0, 1, 4], "mode": "wrap" }),
        json!({ "pads": [2, 1], "axes": [-1], "mode": "reflect" }),
    ] {
        v.push(case("pad", attrs, &[x(&[3, 4], Any)]));
    }
    for mode in ["DCR", "CRD"] {
        v.push(case(
            "depth_to_space",
            json!({ "blocksize": 2, "mode": mode }),
            &[x(&[1, 8, 2, 3], Any)],
        ));
        v.push(case(
            "space_to_depth",
            json!({ "blocksize": 2, "mode": mode }),
            &[x(&[2, 2, 4, 2], Any)],
        ));
    }
    v.push(case(
        "gather",
        json!({}),
        &[x(&[5, 3], Any), ("i", &[2, 4], Index(5))],
    ));
    v.push(case(
        "gather",
        json!({ "axis": -1 }),
        &[x(&[2, 3, 7], Any), ("i", &[9], Index(7))],
    ));
    // Loss family: every reduction, label smoothing, more than one leading axis.
    for attrs in [
        json!({}),
        json!({ "reduction": "sum" }),
        json!({ "reduction": "none", "label_smoothing": 0.2 }),
        json!({ "label_smoothing": 1.0 }),
    ] {
        v.push(case(
            "softmax_cross_entropy",
            attrs,
            &[x(&[5, 7], Any), ("labels", &[5], Class(7))],
        ));
    }
    v.push(case(
        "softmax_cross_entropy",
        json!({}),
        &[x(&[2, 3, 11], Any), ("labels", &[2, 3], Class(11))],
    ));
    for attrs in [json!({}), json!({ "reduction": "none" })] {
        v.push(case(
            "nll_loss",
            attrs,
            &[x(&[5, 7], Any), ("labels", &[5], Class(7))],
        ));
    }
    for op in ["mse_loss", "bce_with_logits"] {
        for attrs in [
            json!({}),
            json!({ "reduction": "sum" }),
            json!({ "reduction": "none" }),
        ] {
            v.push(case(
                op,
                attrs,
                &[x(&[4, 3], Any), ("t", &[4, 3], Positive)],
            ));
        }
    }
    // reduce_max: distinct values, so differences never cross a tie.
    for attrs in [
        json!({}),
        json!({ "axes": [1] }),
        json!({ "axes": [0, 2], "keepdims": false }),
    ] {
        v.push(case("reduce_max", attrs, &[x(&[3, 4, 5], Distinct)]));
    }
    // reduce_min, top_k: distinct values, so differences never cross a tie.
    for attrs in [
        json!({}),
        json!({ "axes": [1] }),
        json!({ "axes": [0, 2], "keepdims": false }),
    ] {
        v.push(case("reduce_min", attrs, &[x(&[3, 4, 5], Distinct)]));
    }
    for attrs in [json!({}), json!({ "axes": [1], "keepdims": false })] {
        v.push(case("reduce_prod", attrs.clone(), &[x(&[3, 4], Any)]));
        v.push(case("reduce_l2", attrs, &[x(&[3, 4], Any)]));
    }
    for attrs in [
        json!({ "axis": 1 }),
        json!({ "axis": 0, "exclusive": true, "reverse": true }),
        json!({ "axis": -1, "exclusive": true }),
    ] {
        v.push(case("cumsum", attrs, &[x(&[3, 5], Any)]));
    }
    for attrs in [
        json!({ "k": 2 }),
        json!({ "k": 3, "axis": 0, "largest": false }),
    ] {
        v.push(case("top_k", attrs, &[x(&[4, 5], Distinct)]));
    }
    // Indexing family. Scatters with reduction none get one update per element
    // (duplicates are undefined in ONNX).
    v.push(case(
        "gather_elements",
        json!({}),
        &[x(&[4, 5], Any), ("i", &[3, 5], Index(4))],
    ));
    v.push(case(
        "gather_elements",
        json!({ "axis": -1 }),
        &[x(&[3, 6], Any), ("i", &[2, 9], Index(6))],
    ));
    v.push(case(
        "scatter_elements",
        json!({ "reduction": "add" }),
        &[
            x(&[4, 5], Any),
            ("i", &[3, 5], Index(4)),
            ("u", &[3, 5], Any),
        ],
    ));
    v.push(case(
        "scatter_elements",
        json!({ "axis": 1 }),
        &[
            x(&[4, 5], Any),
            ("i", &[3, 1], Index(5)),
            ("u", &[3, 1], Any),
        ],
    ));
    v.push(case(
        "gather_nd",
        json!({}),
        &[x(&[4, 5, 3], Any), ("i", &[2, 3, 2], Index(4))],
    ));
    v.push(case(
        "scatter_nd",
        json!({ "reduction": "add" }),
        &[
            x(&[4, 5], Any),
            ("i", &[3, 1], Index(4)),
            ("u", &[3, 5], Any),
        ],
    ));
    v.push(case(
        "scatter_nd",
        json!({}),
        &[x(&[4, 5], Any), ("i", &[1, 2], Index(4)), ("u", &[1], Any)],
    ));
    for repeats in [json!([2, 1]), json!([3, 2])] {
        v.push(case(
            "tile",
            json!({ "repeats": repeats }),
            &[x(&[2, 3], Any)],
        ));
    }
    for attrs in [json!({}), json!({ "upper": false, "k": -1 })] {
        v.push(case("trilu", attrs, &[x(&[2, 4, 5], Any)]));
    }
    v.push(case("cast", json!({ "to": "f32" }), &[x(&[4, 3], Any)]));
    // Dropout in training: a fixed mask for a given seed and stream.
    for (ratio, seed) in [(0.4, 3), (0.0, 0), (0.9, 4_000_000_000u32)] {
        v.push(case(
            "dropout_train",
            json!({ "ratio": ratio, "seed": seed }),
            &[x(&[5, 7], Any), ("stream", &[], Index(50))],
        ));
    }
    // Conv family: odd sizes, padding, strides, dilations, groups, bias on and off.
    v.push(case("global_avg_pool", json!({}), &[x(&[2, 3, 3, 5], Any)]));
    let convs: [(Value, &'static [usize]); 5] = [
        (
            json!({ "out_channels": 4, "kernel_size": [3, 3] }),
            &[2, 3, 5, 7],
        ),
        (
            json!({ "out_channels": 3, "kernel_size": [3, 2], "strides": [2, 2],
                    "pads": [1, 2, 0, 1], "bias": false }),
            &[1, 2, 7, 6],
        ),
        (
            json!({ "out_channels": 3, "kernel_size": [3, 3], "dilations": [2, 2],
                    "pads": [2, 2] }),
            &[1, 2, 7, 7],
        ),
        (
            json!({ "out_channels": 6, "kernel_size": [3, 3], "groups": 2,
                    "strides": [1, 2], "pads": [1, 1] }),
            &[2, 4, 5, 5],
        ),
        (
            json!({ "out_channels": 3, "kernel_size": [2, 2], "groups": 3, "bias": false }),
            &[1, 3, 6, 5],
        ),
    ];
    // Attention: 4-D and 3-D, grouped-query heads, causal, softcap, float and bool masks
    // (a float mask of full key length gets a gradient too).
    type AttentionCase = (
        Value,
        [&'static [usize]; 3],
        Option<(&'static [usize], Values)>,
    );
    let attention: [AttentionCase; 5] = [
        (
            json!({}),
            [&[2, 2, 3, 4], &[2, 2, 5, 4], &[2, 2, 5, 3]],
            None,
        ),
        (
            json!({ "is_causal": 1, "softcap": 1.5 }),
            [&[1, 4, 3, 2], &[1, 2, 4, 2], &[1, 2, 4, 3]],
            Some((&[3, 4], Any)),
        ),
        (
            json!({ "q_num_heads": 4, "kv_num_heads": 2, "scale": 0.7 }),
            [&[2, 3, 8], &[2, 4, 4], &[2, 4, 6]],
            Some((&[2, 1, 3, 4], Bool)),
        ),
        (
            json!({ "is_causal": 1, "left_window_size": 1 }),
            [&[1, 2, 4, 3], &[1, 2, 4, 3], &[1, 2, 4, 2]],
            None,
        ),
        (
            json!({ "q_num_heads": 2, "kv_num_heads": 1 }),
            [&[1, 2, 6], &[1, 3, 3], &[1, 3, 2]],
            Some((&[2], Any)),
        ),
    ];
    for (attrs, [q, k, vv], mask) in attention {
        let mut inputs = vec![("q", q, Any), ("k", k, Any), ("v", vv, Any)];
        if let Some((m, how)) = mask {
            inputs.push(("m", m, how));
        }
        v.push(case("attention", attrs, &inputs));
    }
    // Einsum: contractions, transposes, an index only one operand has (summed inside
    // it), ellipsis broadcasting from size 1.
    let einsums: [(&str, &[&'static [usize]]); 5] = [
        ("bij,bjk->bik", &[&[2, 3, 4], &[2, 4, 5]]),
        ("ij->ji", &[&[3, 4]]),
        ("ij,jk->k", &[&[3, 4], &[4, 2]]),
        ("...ij,...jk->...ik", &[&[2, 1, 3, 4], &[3, 4, 2]]),
        ("bi,bi->b", &[&[4, 5], &[4, 5]]),
    ];
    for (equation, shapes) in einsums {
        let inputs: Vec<_> = shapes
            .iter()
            .zip(["a", "b"])
            .map(|(s, n)| (n, *s, Any))
            .collect();
        v.push(case("einsum", json!({ "equation": equation }), &inputs));
    }
    // Recurrent cells, unrolled for backpropagation through time: H = 3, seq 3, batch 2,
    // input 4; every output read; sequence lengths 0..3 per sequence, so some sequences
    // stop early (and a reverse direction starts at its own last element).
    let rnn = |cell: &'static str,
               attrs: Value,
               dirs: usize,
               batch_first: bool,
               extra: &[&'static str]| {
        let g = if cell == "lstm" { 4 } else { 3 };
        let h = 3;
        let leak = |v: Vec<usize>| -> &'static [usize] { Vec::leak(v) };
        let x: &'static [usize] = if batch_first { &[2, 3, 4] } else { &[3, 2, 4] };
        let state: &'static [usize] = leak(if batch_first {
            vec![2, dirs, h]
        } else {
            vec![dirs, 2, h]
        });
        let mut inputs: Vec<(&'static str, &'static [usize], Values)> = vec![
            ("x", x, Any),
            ("w", leak(vec![dirs, g * h, 4]), Any),
            ("r", leak(vec![dirs, g * h, h]), Any),
            ("b", leak(vec![dirs, 2 * g * h]), Any),
        ];
        for &e in extra {
            inputs.push(match e {
                "lens" => ("lens", &[2], Class(4)),
                "h0" => ("h0", state, Any),
                "c0" => ("c0", state, Any),
                _ => ("p", leak(vec![dirs, 3 * h]), Any),
            });
        }
        let mut c = case(cell, attrs, &inputs);
        c.outputs = if cell == "lstm" {
            vec![0, 1, 2]
        } else {
            vec![0, 1]
        };
        c
    };
    v.push(rnn("lstm", json!({ "hidden_size": 3 }), 1, false, &[]));
    v.push(rnn(
        "lstm",
        json!({ "hidden_size": 3, "direction": "bidirectional" }),
        2,
        false,
        &["lens", "h0", "c0", "p"],
    ));
    v.push(rnn(
        "lstm",
        json!({ "hidden_size": 3, "direction": "reverse", "layout": 1 }),
        1,
        true,
        &["lens", "h0"],
    ));
    v.push(rnn("gru", json!({ "hidden_size": 3 }), 1, false, &["lens"]));
    v.push(rnn(
        "gru",
        json!({ "hidden_size": 3, "direction": "bidirectional", "linear_before_reset": 1 }),
        2,
        false,
        &["lens", "h0"],
    ));
    v.push(rnn(
        "gru",
        json!({ "hidden_size": 3, "direction": "reverse", "layout": 1 }),
        1,
        true,
        &[],
    ));
    for (attrs, shape) in convs {
        v.push(case("conv2d", attrs, &[x(shape, Any)]));
    }
    let pools: [(Value, &'static [usize]); 4] = [
        (
            json!({ "kernel_size": [3, 3], "strides": [2, 2] }),
            &[2, 2, 7, 7],
        ),
        (
            json!({ "kernel_size": [3, 3], "pads": [1, 1] }),
            &[1, 2, 5, 6],
        ),
        (
            json!({ "kernel_size": [2, 3], "strides": [2, 2], "pads": [0, 1],
                    "ceil_mode": true }),
            &[1, 2, 7, 8],
        ),
        (
            json!({ "kernel_size": [2, 2], "dilations": [2, 2], "pads": [1, 0, 0, 1] }),
            &[1, 1, 6, 6],
        ),
    ];
    v.push(case(
        "conv2d",
        json!({ "out_channels": 3, "kernel_size": [3], "strides": [2], "pads": [1, 2] }),
        &[x(&[2, 2, 7], Any)],
    ));
    v.push(case(
        "max_pool2d",
        json!({ "kernel_size": [2], "strides": [2], "pads": [1, 0] }),
        &[x(&[1, 2, 7], Distinct)],
    ));
    v.push(case(
        "avg_pool2d",
        json!({ "kernel_size": [3], "pads": [1, 1], "count_include_pad": true }),
        &[x(&[1, 2, 6], Any)],
    ));
    v.push(case(
        "conv_transpose2d",
        json!({ "out_channels": 4, "kernel_size": [3, 2], "strides": [2, 1], "pads": [1, 0, 0, 1],
                "output_padding": [1, 0], "groups": 2 }),
        &[x(&[2, 2, 3, 3], Any)],
    ));
    v.push(case(
        "conv_transpose2d",
        json!({ "out_channels": 2, "kernel_size": [2], "strides": [2], "dilations": [2], "bias": false }),
        &[x(&[1, 3, 4], Any)],
    ));
    v.push(case(
        "resize",
        json!({ "scales": [1.0, 2.0, 1.5], "mode": "linear" }),
        &[x(&[2, 3, 4], Any)],
    ));
    v.push(case(
        "resize",
        json!({ "sizes": [2, 7], "axes": [1, 2], "coordinate_transformation_mode": "align_corners", "mode": "linear" }),
        &[x(&[2, 3, 4], Any)],
    ));
    v.push(case(
        "resize",
        json!({ "scales": [0.6, 3.0], "axes": [0, 1] }),
        &[x(&[5, 2], Any)],
    ));
    v.push(case("global_avg_pool", json!({}), &[x(&[2, 3, 4], Any)]));
    for (attrs, shape) in &pools {
        v.push(case("max_pool2d", attrs.clone(), &[x(shape, Distinct)]));
    }
    for (mut attrs, shape) in pools {
        v.push(case("avg_pool2d", attrs.clone(), &[x(shape, Any)]));
        attrs["count_include_pad"] = json!(true);
        v.push(case("avg_pool2d", attrs, &[x(shape, Any)]));
    }
    v
}

/// Random values for one input.
fn values(rng: &mut Rng, shape: &[usize], how: Values) -> Tensor {
    let n: usize = shape.iter().product();
    if let Values::Distinct = how {
        let mut data: Vec<f32> = (0..n).map(|k| 0.05 * (k as f32 - n as f32 / 2.0)).collect();
        for i in (1..n).rev() {
            let j = ((rng.uniform(0.0, 1.0) * (i + 1) as f32) as usize).min(i);
            data.swap(i, j);
        }
        return Tensor::f32(shape.to_vec(), data);
    }
    let data: Vec<f32> = (0..n)
        .map(|_| match how {
            Values::Any => rng.uniform(-2.0, 2.0),
            Values::Positive => rng.uniform(0.5, 2.0),
            Values::Grid(offset) => offset + 0.5 * (rng.uniform(-4.0, 4.0).floor()),
            Values::Bool => f32::from(rng.uniform(0.0, 1.0) < 0.5),
            Values::Index(n) => (rng.uniform(-1.0, 1.0) * n as f32).floor(),
            Values::Class(n) => (rng.uniform(0.0, 1.0) * n as f32)
                .floor()
                .min(n as f32 - 1.0),
            Values::Distinct => 0.0,
        })
        .collect();
    match how {
        Values::Index(_) | Values::Class(_) => Tensor {
            shape: shape.to_vec(),
            data: TensorData::I32(data.iter().map(|&k| k as i32).collect()),
        },
        Values::Bool => Tensor {
            shape: shape.to_vec(),
            data: TensorData::Bool(data.iter().map(|&b| b != 0.0).collect()),
        },
        _ => Tensor::f32(shape.to_vec(), data),
    }
}

/// The graph of a case with its loss: `loss = Σ_k reduce_sum(output_k × R_k)`.
fn loss_graph(c: &Case, rng: &mut Rng) -> Graph {
    let decls: serde_json::Map<String, Value> = c
        .inputs
        .iter()
        .map(|(n, s, v)| {
            let dtype = match v {
                Values::Bool => "bool",
                Values::Index(_) | Values::Class(_) => "i32",
                _ => "f32",
            };
            (n.to_string(), json!({ "shape": s, "dtype": dtype }))
        })
        .collect();
    let names: Vec<&str> = c.inputs.iter().map(|i| i.0).collect();
    let forward = graph(&json!({
        "format": "sluice/graph@1", "inputs": decls,
        "nodes": [{ "id": "n", "op": c.op, "inputs": names, "attrs": c.attrs }],
        "outputs": ["n"],
    }));
    let node = forward.op_nodes().next().expect("one node").1;
    let mut nodes = vec![json!({ "id": "n", "op": c.op, "inputs": names, "attrs": c.attrs })];
    let mut terms = Vec::new();
    for &k in &c.outputs {
        let shape: Vec<usize> = sluice_engine::shape::concrete(&node.outputs[k].shape).unwrap();
        let n: usize = shape.iter().product();
        let r: Vec<f32> = (0..n).map(|_| rng.uniform(-1.0, 1.0)).collect();
        let out = if k == 0 {
            "n".to_string()
        } else {
            format!("n:{k}")
        };
        nodes.push(json!({ "id": format!("r{k}"), "op": "constant",
                           "attrs": { "value": r, "shape": shape } }));
        nodes.push(json!({ "id": format!("m{k}"), "op": "mul", "inputs": [out, format!("r{k}")] }));
        nodes.push(json!({ "id": format!("s{k}"), "op": "reduce_sum",
                           "inputs": [format!("m{k}")], "attrs": { "keepdims": false } }));
        terms.push(format!("s{k}"));
    }
    let mut last = terms[0].clone();
    for (i, t) in terms.iter().enumerate().skip(1) {
        let id = format!("t{i}");
        nodes.push(json!({ "id": id, "op": "add", "inputs": [last, t] }));
        last = id;
    }
    nodes.push(json!({ "id": "loss", "op": "identity", "inputs": [last] }));
    graph(&json!({
        "format": "sluice/graph@1", "inputs": decls, "nodes": nodes, "outputs": ["loss"],
        "params": { "seed": 7 },
    }))
}

/// Host tensors by name, in f64.
type Values64 = HashMap<String, Tensor64>;

/// Inputs or weights widened to f64.
fn widen(values: &HashMap<String, Tensor>) -> Values64 {
    values.iter().map(|(k, t)| (k.clone(), t.into())).collect()
}

/// The loss of a graph on inputs and weights, by the f64 reference.
fn loss(g: &Graph, weights: &Values64, inputs: &Values64) -> f64 {
    let outs = cpu::run_f64(g, weights, inputs).expect("the forward graph runs");
    outs[0].1.as_f64().expect("float loss")[0]
}

/// Central differences of the loss with respect to every element of input or weight
/// `of`, each written into a copy of the inputs and weights.
fn numeric(
    g: &Graph,
    weights: &Values64,
    inputs: &Values64,
    of: &str,
    is_weight: bool,
) -> Vec<f64> {
    let base = if is_weight { &weights[of] } else { &inputs[of] };
    let n = base.as_f64().unwrap().len();
    (0..n)
        .map(|i| {
            let at = |delta: f64| {
                let (mut w, mut x) = (weights.clone(), inputs.clone());
                let t = if is_weight {
                    w.get_mut(of)
                } else {
                    x.get_mut(of)
                }
                .unwrap();
                let mut data = t.as_f64().unwrap().to_vec();
                data[i] += delta;
                *t = Tensor64::f64(t.shape.clone(), data);
                loss(g, &w, &x)
            };
            (at(EPS) - at(-EPS)) / (2.0 * EPS)
        })
        .collect()
}

/// The largest |value − reference| / max(1, |reference|) over pairs (value, reference);
/// a NaN counts as infinitely wrong.
fn worst(pairs: impl IntoIterator<Item = (f64, f64)>) -> f64 {
    pairs.into_iter().fold(0.0, |w: f64, (v, r)| {
        let e = (v - r).abs() / r.abs().max(1.0);
        if e.is_nan() {
            f64::INFINITY
        } else {
            w.max(e)
        }
    })
}

/// A joint graph's gradient outputs by the f64 reference, the f32 reference and the GPU.
struct Runs {
    f64: HashMap<String, Vec<f64>>,
    f32: HashMap<String, Vec<f64>>,
    gpu: HashMap<String, Vec<f64>>,
}

/// Runs a joint graph every way.
fn run_joint(joint: &Graph, weights: &Weights, inputs: &HashMap<String, Tensor>) -> Runs {
    let floats = |outs: Vec<(String, Tensor)>| -> HashMap<String, Vec<f64>> {
        outs.into_iter()
            .filter_map(|(k, t)| Some((k, t.as_f32()?.iter().map(|&v| f64::from(v)).collect())))
            .collect()
    };
    let f64 = cpu::run_f64(joint, &widen(weights), &widen(inputs))
        .expect("the joint graph runs in f64")
        .into_iter()
        .filter_map(|(k, t)| Some((k, t.as_f64()?.to_vec())))
        .collect();
    let f32 = floats(cpu::run(joint, weights, inputs).expect("the joint graph runs in f32"));
    let gpu = floats(run_gpu(joint, weights, inputs));
    Runs { f64, f32, gpu }
}

/// The largest error of every gradient output of `got` against `want`.
fn compare(
    got: &HashMap<String, Vec<f64>>,
    want: &HashMap<String, Vec<f64>>,
    grads: &[(String, String, bool)],
) -> f64 {
    let pairs = grads.iter().flat_map(|(of, output, _)| {
        let (g, w) = (&got[output], &want[output]);
        assert_eq!(g.len(), w.len(), "{of}: gradient size");
        g.iter().copied().zip(w.iter().copied())
    });
    worst(pairs)
}

/// The errors of a joint graph's gradients (see the module documentation).
#[derive(Debug, Clone, Copy)]
struct Errors {
    /// The f64 rule against central differences.
    rule: f64,
    /// The f32 CPU reference against the f64 one.
    f32: f64,
    /// The GPU against the f64 reference.
    gpu: f64,
}

/// The errors of a joint graph's gradients `grads` (of, output, is a weight).
fn check_joint(
    forward: &Graph,
    joint: &Graph,
    grads: &[(String, String, bool)],
    weights: &Weights,
    inputs: &HashMap<String, Tensor>,
) -> Errors {
    let runs = run_joint(joint, weights, inputs);
    let (w64, x64) = (widen(weights), widen(inputs));
    let pairs = grads.iter().flat_map(|(of, output, is_weight)| {
        let fd = numeric(forward, &w64, &x64, of, *is_weight);
        let analytic = &runs.f64[output];
        assert_eq!(analytic.len(), fd.len(), "{of}: gradient size");
        analytic.iter().copied().zip(fd).collect::<Vec<_>>()
    });
    Errors {
        rule: worst(pairs),
        f32: compare(&runs.f32, &runs.f64, grads),
        gpu: compare(&runs.gpu, &runs.f64, grads),
    }
}

/// The bound on the rule's error for an operator.
fn rule_tolerance(op: &str) -> f64 {
    if matches!(op, "erf" | "gelu") {
        APPROXIMATED
    } else {
        TOLERANCE
    }
}

/// `SLUICE_GRADIENT_OPS=lstm,gru` checks only those operators' cases (while working on
/// them); unset, every case runs.
#[test]
fn every_rule_matches_finite_differences() {
    let mut table: Vec<(String, usize, usize, Errors)> = Vec::new();
    let mut failures = Vec::new();
    let only = std::env::var("SLUICE_GRADIENT_OPS").ok();
    for (i, c) in cases().iter().enumerate() {
        if only
            .as_deref()
            .is_some_and(|o| !o.split(',').any(|op| op == c.op))
        {
            continue;
        }
        let mut rng = Rng::new(1000 + i as u64);
        let g = loss_graph(c, &mut rng);
        let inputs: HashMap<String, Tensor> = c
            .inputs
            .iter()
            .map(|(n, s, v)| (n.to_string(), values(&mut rng, s, *v)))
            .collect();
        let weights = random_weights(&g, 11 + i as u64);
        let wrt: Vec<&str> = c
            .inputs
            .iter()
            .filter(|i| !matches!(i.2, Values::Bool | Values::Index(_) | Values::Class(_)))
            .map(|i| i.0)
            .collect();
        let joint = match backward_wrt(&g, "loss", &wrt) {
            Ok(j) => j,
            Err(e) => {
                failures.push(format!("{}: {e}", c.label));
                continue;
            }
        };
        let grads: Vec<(String, String, bool)> = joint
            .inputs
            .iter()
            .map(|gr| (gr.of.clone(), gr.output.clone(), false))
            .chain(
                joint
                    .params
                    .iter()
                    .map(|gr| (gr.of.clone(), gr.output.clone(), true)),
            )
            .collect();
        let expected = wrt.len() + sluice_engine::weights::param_specs(&g).len()
            - usize::from(c.op == "batch_norm") * 2;
        if grads.len() != expected {
            failures.push(format!(
                "{}: {} gradients, expected {expected}",
                c.label,
                grads.len()
            ));
        }
        let err = check_joint(&g, &joint.graph, &grads, &weights, &inputs);
        // `worst` made NaN infinite, so it fails.
        for (what, e, bound) in [
            ("rule", err.rule, rule_tolerance(c.op)),
            ("f32", err.f32, F32_TOLERANCE),
            ("GPU", err.gpu, GPU_TOLERANCE),
        ] {
            if e > bound {
                failures.push(format!("{}: {what} error {e:.2e}", c.label));
            }
        }
        let n = grads.len();
        match table.iter_mut().find(|r| r.0 == c.op) {
            Some(row) => {
                row.1 += 1;
                row.2 += n;
                row.3 = Errors {
                    rule: row.3.rule.max(err.rule),
                    f32: row.3.f32.max(err.f32),
                    gpu: row.3.gpu.max(err.gpu),
                };
            }
            None => table.push((c.op.to_string(), 1, n, err)),
        }
    }
    println!("| operator | cases | gradients | f64 rule vs FD | f32 CPU vs f64 | GPU vs f64 CPU |");
    println!("|---|---|---|---|---|---|");
    for (op, cases, grads, e) in &table {
        println!(
            "| {op} | {cases} | {grads} | {:.1e} | {:.1e} | {:.1e} |",
            e.rule, e.f32, e.gpu
        );
    }
    assert!(
        failures.is_empty(),
        "wrong gradients:\n{}",
        failures.join("\n")
    );
}

/// The checks catch a wrong rule: the joint graphs of `sub` and `div` with the −1 of
/// their rules flipped to +1 fail the finite differences by far more than the bound, and
/// their f32 CPU and GPU gradients are far from the right rule's f64 gradients.
#[test]
fn a_wrong_rule_is_caught() {
    for (op, from, to) in [("sub", -1.0, 1.0), ("div", -1.0, 1.0)] {
        let c = case(
            op,
            json!({}),
            &[("a", &[3, 5], Values::Any), ("b", &[5], Values::Positive)],
        );
        let mut rng = Rng::new(5);
        let g = loss_graph(&c, &mut rng);
        let inputs: HashMap<String, Tensor> = c
            .inputs
            .iter()
            .map(|(n, s, v)| (n.to_string(), values(&mut rng, s, *v)))
            .collect();
        let joint = backward_wrt(&g, "loss", &["a", "b"]).unwrap();
        let mut doc = joint.doc.clone();
        let mut flipped = 0;
        for n in doc.nodes.iter_mut().skip(g.doc.nodes.len()) {
            if n.op == "constant" && n.attrs["value"] == json!([from]) {
                n.attrs.insert("value".into(), json!([to]));
                flipped += 1;
            }
        }
        assert_eq!(flipped, 1, "{op}: the rule's constant");
        let wrong = Graph::build(doc).unwrap();
        let grads: Vec<(String, String, bool)> = joint
            .inputs
            .iter()
            .map(|gr| (gr.of.clone(), gr.output.clone(), false))
            .collect();
        let ok = check_joint(&g, &joint.graph, &grads, &Weights::new(), &inputs);
        let err = check_joint(&g, &wrong, &grads, &Weights::new(), &inputs);
        assert!(
            ok.rule <= TOLERANCE && ok.f32 <= F32_TOLERANCE && ok.gpu <= GPU_TOLERANCE,
            "{op}: the right rule passes ({ok:?})"
        );
        assert!(
            err.rule > 1e4 * TOLERANCE,
            "{op}: a flipped sign is caught ({err:?})"
        );
        let right = run_joint(&joint.graph, &Weights::new(), &inputs);
        let wrong = run_joint(&wrong, &Weights::new(), &inputs);
        for (what, got) in [("f32", &wrong.f32), ("GPU", &wrong.gpu)] {
            let e = compare(got, &right.f64, &grads);
            assert!(
                e > 100.0 * GPU_TOLERANCE,
                "{op}: a wrong {what} gradient is caught ({e})"
            );
        }
    }
}

/// Operators without a rule on a path to the loss are refused, naming the node and the
/// operator; off the path they do not matter.
#[test]
fn operators_without_a_rule_are_refused_by_name() {
    let refused = |op: &'static str,
                   attrs: Value,
                   inputs: &[(&'static str, &[usize], Values)],
                   wrt: &[&str]| {
        let c = case(op, attrs, inputs);
        let g = loss_graph(&c, &mut Rng::new(1));
        match backward_wrt(&g, "loss", wrt) {
            Err(AutodiffError::NoGradient {
                node,
                op: o,
                reason,
            }) => {
                assert_eq!((node.as_str(), o.as_str()), ("n", op), "{reason}");
                reason
            }
            other => panic!(
                "{op}: expected a refusal, got {:?}",
                other.map(|j| j.params)
            ),
        }
    };
    let r = refused(
        "unary_grad",
        json!({ "op": "relu" }),
        &[("x", &[3], Values::Any), ("dy", &[3], Values::Any)],
        &["x"],
    );
    assert!(r.contains("second"), "{r}");
    // gather's indices are integers: they carry no gradient and end no path.
    let text = json!({
        "format": "sluice/graph@1",
        "inputs": { "x": { "shape": [4, 3] }, "i": { "shape": [2], "dtype": "i32" } },
        "nodes": [
            { "id": "emb", "op": "gather", "inputs": ["x", "i"] },
            { "id": "loss", "op": "reduce_sum", "inputs": ["emb"], "attrs": { "keepdims": false } }
        ],
        "outputs": ["loss"] });
    let g = graph(&text);
    let j = backward_wrt(&g, "loss", &["x"]).unwrap();
    assert_eq!(j.inputs.len(), 1);
    assert!(j.doc.nodes.iter().any(|n| n.op == "gather_grad"));
    // Not differentiated: no path, no refusal, no gradients.
    let j = backward(&g, "loss").unwrap();
    assert!(j.params.is_empty() && j.inputs.is_empty());
}

/// The loss must be an f32 scalar output; shapes must be concrete.
#[test]
fn bad_losses_and_unbound_graphs_are_refused() {
    let doc = |shape: Value| {
        json!({
            "format": "sluice/graph@1",
            "inputs": { "x": { "shape": shape } },
            "nodes": [
                { "id": "fc", "op": "linear", "inputs": ["x"], "attrs": { "out_features": 2 } },
                { "id": "loss", "op": "reduce_mean", "inputs": ["fc"], "attrs": { "keepdims": false } }
            ],
            "outputs": ["fc", "loss"] })
    };
    let g = graph(&doc(json!([3, 4])));
    let e = backward(&g, "fc").unwrap_err().to_string();
    assert!(e.contains("f32 scalar"), "{e}");
    let e = backward(&g, "nothing").unwrap_err().to_string();
    assert!(e.contains("not an output") && e.contains("fc, loss"), "{e}");
    let e = backward_wrt(&g, "loss", &["fc"]).unwrap_err().to_string();
    assert!(e.contains("'fc'"), "{e}");
    let e = backward(&graph(&doc(json!(["N", 4]))), "loss")
        .unwrap_err()
        .to_string();
    assert!(e.contains("bind the graph first"), "{e}");
    // The joint graph: the forward outputs, then the weights' gradients in order.
    let j = backward(&g, "loss").unwrap();
    assert_eq!(
        j.doc.outputs,
        ["fc", "loss", "fc.weight.grad", "fc.bias.grad"]
    );
    let of: Vec<&str> = j.params.iter().map(|p| p.of.as_str()).collect();
    assert_eq!(of, ["fc.weight", "fc.bias"]);
}

/// A weight used by two nodes (a `param` reading `fc.weight`, tied weights) gets the sum
/// of both contributions; a key declared twice with two shapes is refused naming both.
#[test]
fn shared_weights_sum_their_gradients() {
    let doc = json!({
        "format": "sluice/graph@1",
        "inputs": { "x": { "shape": [2, 3] } },
        "nodes": [
            { "id": "fc", "op": "linear", "inputs": ["x"], "attrs": { "out_features": 3, "bias": false } },
            { "id": "w", "op": "param", "attrs": { "key": "fc.weight", "shape": [3, 3] } },
            { "id": "h", "op": "matmul", "inputs": ["fc", "w"] },
            { "id": "t", "op": "tanh", "inputs": ["h"] },
            { "id": "loss", "op": "reduce_sum", "inputs": ["t"], "attrs": { "keepdims": false } }
        ],
        "outputs": ["loss"] });
    let g = graph(&doc);
    assert_eq!(sluice_engine::weights::param_specs(&g).len(), 1);
    let weights = random_weights(&g, 3);
    let inputs = HashMap::from([(
        "x".to_string(),
        values(&mut Rng::new(2), &[2, 3], Values::Any),
    )]);
    let j = backward_wrt(&g, "loss", &["x"]).unwrap();
    let grads = vec![
        ("fc.weight".to_string(), j.params[0].output.clone(), true),
        ("x".to_string(), j.inputs[0].output.clone(), false),
    ];
    let err = check_joint(&g, &j.graph, &grads, &weights, &inputs);
    assert!(
        err.rule <= TOLERANCE && err.f32 <= F32_TOLERANCE && err.gpu <= GPU_TOLERANCE,
        "{err:?}"
    );
    let mut bad = doc.clone();
    bad["nodes"][1]["attrs"]["shape"] = json!([3, 4]);
    let e = Graph::build(serde_json::from_value(bad).unwrap())
        .unwrap_err()
        .to_string();
    assert!(e.contains("'fc.weight'") && e.contains("'fc'"), "{e}");
}

/// A two-layer network's joint graph plans (fusion, memory planning) and runs as a session
/// on the CPU device with the reference's gradients; its weight gradients reduce over the
/// batch, so micro-batching is refused naming a node.
#[test]
fn the_joint_graph_of_a_network_plans_and_runs() {
    let doc = json!({
        "format": "sluice/graph@1",
        "inputs": { "x": { "shape": [4, 6] } },
        "nodes": [
            { "id": "fc1", "op": "linear", "inputs": ["x"], "attrs": { "out_features": 5 } },
            { "id": "act", "op": "gelu", "inputs": ["fc1"] },
            { "id": "ln", "op": "layer_norm", "inputs": ["act"] },
            { "id": "fc2", "op": "linear", "inputs": ["ln"], "attrs": { "out_features": 3 } },
            { "id": "p", "op": "log_softmax", "inputs": ["fc2"] },
            { "id": "loss", "op": "reduce_mean", "inputs": ["p"], "attrs": { "keepdims": false } }
        ],
        "outputs": ["loss"] });
    let g = graph(&doc);
    let weights = random_weights(&g, 9);
    let inputs = HashMap::from([(
        "x".to_string(),
        values(&mut Rng::new(4), &[4, 6], Values::Any),
    )]);
    let j = backward(&g, "loss").unwrap();
    assert_eq!(j.params.len(), 6);
    let grads: Vec<(String, String, bool)> = j
        .params
        .iter()
        .map(|p| (p.of.clone(), p.output.clone(), true))
        .collect();
    let err = check_joint(&g, &j.graph, &grads, &weights, &inputs);
    assert!(
        err.rule <= APPROXIMATED && err.f32 <= F32_TOLERANCE && err.gpu <= GPU_TOLERANCE,
        "{err:?}"
    );
    let reference: HashMap<String, Tensor> = cpu::run(&j.graph, &weights, &inputs)
        .unwrap()
        .into_iter()
        .collect();
    let config = sluice_engine::exec::RunConfig {
        batch: 4,
        ..Default::default()
    };
    let mut session = cpu::session(&j.graph, &weights, &config).expect("the joint graph plans");
    let report = session
        .run_blocking(&inputs, &sluice_engine::exec::RunContext::new("train"))
        .expect("the joint graph runs on the CPU device");
    for (name, t) in &report.outputs {
        let want = reference[name].as_f32().unwrap();
        for (a, b) in t.as_f32().unwrap().iter().zip(want) {
            assert!(
                (a - b).abs() <= 1e-4 * b.abs().max(1.0),
                "{name}: {a} vs {b}"
            );
        }
    }
    let micro = sluice_engine::exec::RunConfig {
        batch: 4,
        microbatches: 2,
        ..Default::default()
    };
    assert!(
        cpu::session(&j.graph, &weights, &micro).is_err(),
        "micro-batching is refused"
    );
}
