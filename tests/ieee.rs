//! IEEE results on every device: `pow`'s special cases (C99 Annex F), `cast` to float16
//! and bfloat16 rounding to nearest even with overflow to ±∞, host uploads into 16-bit
//! storage rounding the same way, and NaN propagating through the max/min/clip/relu
//! families. Every case runs on the GPU, the fast CPU and the CPU reference (through a
//! session, fused and not), the reference interpreter and its f64 run, and each is
//! compared with values written out by hand from the standards, never with another
//! device's answer.

use serde_json::{json, Value};
use sluice_engine::exec::{Device, RunConfig, RunContext, Session};
use sluice_engine::graph::Graph;
use sluice_engine::onnx::proto;
use sluice_engine::storage::Storage;
use sluice_engine::tensor::Tensor64;
use sluice_engine::weights::Weights;
use sluice_engine::{cpu, Tensor, TensorData};
use sluice_tests::{gpu, graph};
use std::collections::HashMap;

const NAN: f32 = f32::NAN;
const INF: f32 = f32::INFINITY;

/// Every way a graph is run: (label, outputs).
fn run_everywhere(g: &Graph, inputs: &HashMap<String, Tensor>) -> Vec<(String, Vec<Tensor>)> {
    let weights = Weights::new();
    let mut runs = Vec::new();
    for device in ["gpu", "cpu", "reference"] {
        for fuse in [true, false] {
            let dev: Box<dyn Device> = match device {
                "gpu" => Box::new(sluice_engine::gpu::GpuDevice::new(gpu().clone())),
                "cpu" => Box::new(cpu::CpuDevice::fast()),
                _ => Box::new(cpu::CpuDevice::new()),
            };
            let cfg = RunConfig {
                fuse,
                ..Default::default()
            };
            let label = format!("{device}{}", if fuse { " fused" } else { "" });
            let mut s = Session::compile_blocking(g, &weights, &cfg, vec![dev])
                .unwrap_or_else(|e| panic!("{label}: {e}"));
            let report = s
                .run_blocking(inputs, &RunContext::new("ieee"))
                .unwrap_or_else(|e| panic!("{label}: {e}"));
            runs.push((label, report.outputs.into_iter().map(|(_, t)| t).collect()));
        }
    }
    let interpreted = cpu::run(g, &weights, inputs).unwrap_or_else(|e| panic!("{e}"));
    runs.push((
        "interpreter".into(),
        interpreted.into_iter().map(|(_, t)| t).collect(),
    ));
    let inputs64: HashMap<String, Tensor64> =
        inputs.iter().map(|(k, t)| (k.clone(), t.into())).collect();
    let f64_run =
        cpu::run_f64(g, &HashMap::new(), &inputs64).unwrap_or_else(|e| panic!("f64: {e}"));
    runs.push((
        "interpreter f64".into(),
        f64_run
            .into_iter()
            .map(|(_, t)| {
                let v = t.as_f64().expect("float output");
                Tensor::f32(t.shape.clone(), v.iter().map(|&x| x as f32).collect())
            })
            .collect(),
    ));
    runs
}

/// Whether `got` is `want`: NaN for NaN, the same signed zero and infinity, and a finite
/// value within `rtol` (0: exactly).
fn same(got: f32, want: f32, rtol: f32) -> bool {
    if want.is_nan() {
        return got.is_nan();
    }
    if want == 0.0 || want.is_infinite() || rtol == 0.0 {
        return got == want && got.is_sign_negative() == want.is_sign_negative();
    }
    (got - want).abs() <= rtol * want.abs()
}

/// Checks output `k` of every run against `want`; every mismatch is listed.
fn check(
    runs: &[(String, Vec<Tensor>)],
    k: usize,
    what: &str,
    inputs: &str,
    want: &[f32],
    rtol: f32,
) {
    let mut wrong = Vec::new();
    for (label, outs) in runs {
        let got = outs[k].as_f32().expect("f32 output");
        assert_eq!(got.len(), want.len(), "{label}: {what}: length");
        for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
            if !same(g, w, rtol) {
                wrong.push(format!(
                    "{label}: {what}[{i}] ({inputs}[{i}]) = {g:e}, expected {w:e}"
                ));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "{} wrong:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}

fn input(v: &[f32]) -> Tensor {
    Tensor::f32(vec![v.len()], v.to_vec())
}

/// A graph over f32 inputs of `len` elements (names in order) with `nodes` and `outputs`.
fn doc(inputs: &[&str], len: usize, nodes: Value, outputs: &[&str]) -> Graph {
    let decls: serde_json::Map<String, Value> = inputs
        .iter()
        .map(|n| (n.to_string(), json!({ "shape": [len], "dtype": "f32" })))
        .collect();
    graph(&json!({
        "format": "sluice/graph@1",
        "inputs": decls,
        "nodes": nodes,
        "outputs": outputs,
    }))
}

/// The lengths every table runs at: a multiple of 4 (the GPU's four-lane kernels) and
/// one more (its one-element kernels), the tail padded with `pad`.
fn lengths(n: usize) -> [usize; 2] {
    let four = n.div_ceil(4) * 4;
    [four, four + 1]
}

fn padded(v: &[f32], len: usize, pad: f32) -> Vec<f32> {
    let mut v = v.to_vec();
    v.resize(len, pad);
    v
}

/// C99 Annex F.9.4.4: (x, y, pow(x, y)), every special case and a few ordinary ones.
const POW_TABLE: &[(f32, f32, f32)] = &[
    // pow(±0, y < 0): ±∞ for an odd integer y, +∞ otherwise.
    (0.0, -3.0, INF),
    (-0.0, -3.0, -INF),
    (0.0, -2.0, INF),
    (-0.0, -2.0, INF),
    (0.0, -0.5, INF),
    (-0.0, -0.5, INF),
    (0.0, -INF, INF),
    (-0.0, -INF, INF),
    // pow(±0, y > 0): ±0 for an odd integer y, +0 otherwise.
    (0.0, 3.0, 0.0),
    (-0.0, 3.0, -0.0),
    (-0.0, 2.0, 0.0),
    (-0.0, 0.5, 0.0),
    (-0.0, INF, 0.0),
    // pow(-1, ±∞) = 1; pow(+1, y) = 1 even for NaN; pow(x, ±0) = 1 even for NaN.
    (-1.0, INF, 1.0),
    (-1.0, -INF, 1.0),
    (1.0, NAN, 1.0),
    (1.0, -INF, 1.0),
    (1.0, 7.5, 1.0),
    (NAN, 0.0, 1.0),
    (NAN, -0.0, 1.0),
    (-INF, 0.0, 1.0),
    (-5.0, -0.0, 1.0),
    // A negative finite base with a non-integer exponent: NaN.
    (-8.0, 1.0 / 3.0, NAN),
    (-2.0, 0.5, NAN),
    (-0.5, -1.5, NAN),
    // pow(x, -∞): +∞ for |x| < 1, +0 for |x| > 1; pow(x, +∞) the other way round.
    (0.5, -INF, INF),
    (-0.5, -INF, INF),
    (2.0, -INF, 0.0),
    (-2.0, -INF, 0.0),
    (0.5, INF, 0.0),
    (-0.5, INF, 0.0),
    (2.0, INF, INF),
    (-2.0, INF, INF),
    // pow(-∞, y): -0 / +0 for y < 0 (odd integer / otherwise), -∞ / +∞ for y > 0.
    (-INF, -3.0, -0.0),
    (-INF, -2.0, 0.0),
    (-INF, -0.5, 0.0),
    (-INF, 3.0, -INF),
    (-INF, 2.0, INF),
    (-INF, 0.5, INF),
    // pow(+∞, y): +0 for y < 0, +∞ for y > 0.
    (INF, -1.0, 0.0),
    (INF, 0.5, INF),
    // NaN otherwise.
    (NAN, 2.0, NAN),
    (2.0, NAN, NAN),
    (-1.0, NAN, NAN),
    // Negative bases with integer exponents, odd and even (2^24 - 1 is odd, 1e10 even).
    (-2.0, 3.0, -8.0),
    (-2.0, 2.0, 4.0),
    (-2.0, -1.0, -0.5),
    (-1.0, 16_777_215.0, -1.0),
    (-1.0, 1e10, 1.0),
    // Overflow to ±∞ and ordinary values.
    (10.0, 50.0, INF),
    (-10.0, 39.0, -INF),
    (2.0, 0.5, std::f32::consts::SQRT_2),
    (9.0, -0.5, 1.0 / 3.0),
];

#[test]
fn pow_follows_c99_special_cases_on_every_device() {
    let n = POW_TABLE.len();
    for len in lengths(n) {
        let x = padded(&POW_TABLE.iter().map(|c| c.0).collect::<Vec<_>>(), len, 2.0);
        let y = padded(&POW_TABLE.iter().map(|c| c.1).collect::<Vec<_>>(), len, 2.0);
        let want = padded(&POW_TABLE.iter().map(|c| c.2).collect::<Vec<_>>(), len, 4.0);
        // `p`: pow alone; `q`: pow inside a fused chain (x·1 keeps -0, NaN and ∞ as they
        // are, and the result times 1 too).
        let g = doc(
            &["x", "y", "one"],
            len,
            json!([
                { "id": "p", "op": "pow", "inputs": ["x", "y"] },
                { "id": "x1", "op": "mul", "inputs": ["x", "one"] },
                { "id": "q0", "op": "pow", "inputs": ["x1", "y"] },
                { "id": "q", "op": "mul", "inputs": ["q0", "one"] },
            ]),
            &["p", "q"],
        );
        let inputs = HashMap::from([
            ("x".to_string(), input(&x)),
            ("y".to_string(), input(&y)),
            ("one".to_string(), input(&vec![1.0; len])),
        ]);
        let runs = run_everywhere(&g, &inputs);
        let label = "(x, y)";
        check(&runs, 0, "pow", label, &want, 2e-6);
        check(&runs, 1, "fused pow", label, &want, 2e-6);
    }
}

/// (x, x rounded to float16 and widened back), by hand from IEEE 754 binary16.
const F16_TABLE: &[(f32, f32)] = &[
    // The 3.14159265 (π in f32).
    (std::f32::consts::PI, 3.140_625),
    (1e5, INF),
    (-1e5, -INF),
    (65504.0, 65504.0),
    (65519.996, 65504.0),
    // 65504 + half an ulp (16) is a tie that rounds to the even 65536: ∞.
    (65520.0, INF),
    (-65520.0, -INF),
    (1e-8, 0.0),
    (-1e-8, -0.0),
    // The smallest subnormal 2^-24, ties at 2^-25 (to 0) and 3·2^-25 (to 2^-23).
    (5.960_464_5e-8, 5.960_464_5e-8),
    (2.980_232_2e-8, 0.0),
    (8.940_697e-8, 1.192_092_9e-7),
    (3.0e-8, 5.960_464_5e-8),
    // A subnormal: 6e-5 · 2^24 = 1006.63 → 1007 · 2^-24.
    (6e-5, 6.002_187_7e-5),
    // The largest subnormal rounding up into the smallest normal 2^-14.
    (6.1033e-5, 6.103_515_6e-5),
    // 1 + 2^-11 ties to 1; 1 + 3·2^-11 ties to 1 + 2^-9.
    (1.000_488_3, 1.0),
    (1.001_464_8, 1.001_953_1),
    (2049.0, 2048.0),
    (2051.0, 2052.0),
    (-0.0, -0.0),
    (INF, INF),
    (-INF, -INF),
    (NAN, NAN),
];

/// (x, x rounded to bfloat16 and widened back).
const BF16_TABLE: &[(f32, f32)] = &[
    (std::f32::consts::PI, 3.140_625),
    (1e5, 99840.0),
    (65520.0, 65536.0),
    // f32's largest value rounds past bfloat16's largest (0x7f7f0000): ∞.
    (f32::MAX, INF),
    (-f32::MAX, -INF),
    (3.389_531_4e38, 3.389_531_4e38),
    // 1 + 2^-8 ties to 1; 1 + 3·2^-8 ties to 1 + 2^-6.
    (1.003_906_3, 1.0),
    (1.011_718_8, 1.015_625),
    // 1e-8 is 0x322bcc77: its low half rounds up.
    (1e-8, f32::from_bits(0x322c_0000)),
    (-0.0, -0.0),
    (INF, INF),
    (-INF, -INF),
    (NAN, NAN),
];

/// `cast` to `to` then used as f32, alone (`c`) and between pointwise neighbours (`d`).
fn cast_graph(to: &str, len: usize) -> Graph {
    doc(
        &["x", "one"],
        len,
        json!([
            { "id": "c", "op": "cast", "inputs": ["x"], "attrs": { "to": to } },
            { "id": "x1", "op": "mul", "inputs": ["x", "one"] },
            { "id": "d0", "op": "cast", "inputs": ["x1"], "attrs": { "to": to } },
            { "id": "d", "op": "mul", "inputs": ["d0", "one"] },
        ]),
        &["c", "d"],
    )
}

fn cast_table(to: &str, table: &[(f32, f32)]) {
    for len in lengths(table.len()) {
        let x = padded(&table.iter().map(|c| c.0).collect::<Vec<_>>(), len, 1.0);
        let want = padded(&table.iter().map(|c| c.1).collect::<Vec<_>>(), len, 1.0);
        let inputs = HashMap::from([
            ("x".to_string(), input(&x)),
            ("one".to_string(), input(&vec![1.0; len])),
        ]);
        let runs = run_everywhere(&cast_graph(to, len), &inputs);
        // The f64 run rounds the f64 values: the same for these f32 inputs.
        check(&runs, 0, &format!("cast to {to}"), "x", &want, 0.0);
        check(
            &runs,
            1,
            &format!("cast to {to} in a chain"),
            "x",
            &want,
            0.0,
        );
    }
}

#[test]
fn cast_to_float16_rounds_to_nearest_even_and_overflows_to_infinity_everywhere() {
    cast_table("f16", F16_TABLE);
}

#[test]
fn cast_to_bfloat16_rounds_to_nearest_even_everywhere() {
    // bfloat16 keeps f32's exponent: an f32 subnormal rounds on its bits too.
    let mut table = BF16_TABLE.to_vec();
    table.push((f32::from_bits(0x0001_16c2), f32::from_bits(0x0001_0000)));
    table.push((f32::from_bits(0x0001_8000), f32::from_bits(0x0002_0000)));
    table.push((f32::from_bits(0x0002_8000), f32::from_bits(0x0002_0000)));
    cast_table("bf16", &table);
}

#[test]
fn cast_of_integers_to_float16_rounds_too() {
    let g = graph(&json!({
        "format": "sluice/graph@1",
        "inputs": { "i": { "shape": [5], "dtype": "i32" } },
        "nodes": [
            { "id": "h", "op": "cast", "inputs": ["i"], "attrs": { "to": "f16" } },
            { "id": "b", "op": "cast", "inputs": ["i"], "attrs": { "to": "bf16" } },
        ],
        "outputs": ["h", "b"],
    }));
    let inputs = HashMap::from([(
        "i".to_string(),
        Tensor {
            shape: vec![5],
            data: TensorData::I32(vec![2049, 2051, 65520, -100_000, 257]),
        },
    )]);
    let runs = run_everywhere(&g, &inputs);
    check(
        &runs,
        0,
        "i32 to f16",
        "i",
        &[2048.0, 2052.0, INF, -INF, 257.0],
        0.0,
    );
    check(
        &runs,
        1,
        "i32 to bf16",
        "i",
        &[2048.0, 2048.0, 65536.0, -99840.0, 256.0],
        0.0,
    );
}

/// A model of `Cast(to)` then `Cast(to=FLOAT)` over a float input of `n` elements.
fn onnx_cast_model(to: i32, n: usize) -> Vec<u8> {
    use prost::Message;
    let value = |name: &str| proto::ValueInfoProto {
        name: name.into(),
        r#type: Some(proto::TypeProto {
            tensor_type: Some(proto::TypeTensor {
                elem_type: proto::data_type::FLOAT,
                shape: Some(proto::TensorShapeProto {
                    dim: vec![proto::Dimension {
                        dim_value: Some(n as i64),
                        dim_param: None,
                    }],
                }),
            }),
        }),
        ..Default::default()
    };
    let cast = |input: &str, output: &str, to: i32| proto::NodeProto {
        op_type: "Cast".into(),
        input: vec![input.into()],
        output: vec![output.into()],
        attribute: vec![proto::AttributeProto {
            name: "to".into(),
            r#type: proto::attribute_type::INT,
            i: i64::from(to),
            ..Default::default()
        }],
        ..Default::default()
    };
    proto::ModelProto {
        ir_version: 8,
        opset_import: vec![proto::OperatorSetIdProto {
            domain: String::new(),
            version: 17,
        }],
        graph: Some(proto::GraphProto {
            name: "cast".into(),
            node: vec![cast("x", "h", to), cast("h", "y", proto::data_type::FLOAT)],
            input: vec![value("x")],
            output: vec![value("y")],
            ..Default::default()
        }),
        ..Default::default()
    }
    .encode_to_vec()
}

#[test]
fn onnx_cast_to_float16_and_bfloat16_round_as_onnx_does() {
    // The model: Cast(to=FLOAT16) then back to float gave 1e5 and 3.14159265
    // unchanged; ONNX gives inf and 3.140625.
    for (to, table) in [
        (proto::data_type::FLOAT16, F16_TABLE),
        (proto::data_type::BFLOAT16, BF16_TABLE),
    ] {
        let x: Vec<f32> = table.iter().map(|c| c.0).collect();
        let want: Vec<f32> = table.iter().map(|c| c.1).collect();
        let bytes = onnx_cast_model(to, x.len());
        let limits = sluice_engine::limits::Limits::default();
        let imported = sluice_engine::onnx::import(
            &bytes,
            &sluice_engine::onnx::tensor::NoExternalData,
            &limits,
        )
        .unwrap_or_else(|e| panic!("import: {e}"));
        let g = Graph::build(imported.doc).unwrap_or_else(|p| panic!("{p}"));
        let inputs = HashMap::from([("x".to_string(), input(&x))]);
        let runs = run_everywhere(&g, &inputs);
        check(&runs, 0, &format!("ONNX Cast to {to}"), "x", &want, 0.0);
    }
}

#[test]
fn host_uploads_into_16_bit_storage_round_to_nearest_even_with_overflow_to_infinity() {
    // A host value becoming a 16-bit element rounds as `cast` to float16 does (as
    // PyTorch's `.half()`), never saturating at 65504.
    let x: Vec<f32> = F16_TABLE.iter().map(|c| c.0).collect();
    let t = input(&x);
    for storage in [Storage::F16, Storage::Packed] {
        let bytes = t.to_storage_bytes(storage);
        let back = Tensor::from_storage_bytes(vec![x.len()], t.dtype(), storage, &bytes);
        let got = back.as_f32().unwrap();
        for (i, (&g, c)) in got.iter().zip(F16_TABLE).enumerate() {
            assert!(
                same(g, c.1, 0.0),
                "{storage:?}: element {i} ({}) is {g:e}, expected {:e}",
                c.0,
                c.1
            );
        }
    }
}

/// Inputs holding NaN among ordinary values, infinities and signed zeros.
const NAN_X: &[f32] = &[NAN, -2.0, NAN, 0.5, -INF, INF, 3.0, NAN, -0.5, 7.0];
/// A second operand, NaN where the first is not (both orders of a binary op).
const NAN_Y: &[f32] = &[1.0, NAN, NAN, -1.0, 0.0, NAN, 4.0, -3.0, NAN, 2.0];

/// The unary cases: (operator, attributes, its value at a number, by hand).
type UnaryCase = (&'static str, Value, fn(f32) -> f32);

fn nan_unary_cases() -> Vec<UnaryCase> {
    vec![
        ("relu", json!({}), |v| if v > 0.0 { v } else { 0.0 }),
        ("leaky_relu", json!({ "alpha": 0.5 }), |v| {
            if v < 0.0 {
                0.5 * v
            } else {
                v
            }
        }),
        ("clip", json!({ "min": -1.0, "max": 1.0 }), |v| {
            v.clamp(-1.0, 1.0)
        }),
        (
            "clip",
            json!({ "min": 0.0 }),
            |v| if v < 0.0 { 0.0 } else { v },
        ),
        (
            "clip",
            json!({ "max": 0.0 }),
            |v| if v > 0.0 { 0.0 } else { v },
        ),
        ("hard_sigmoid", json!({}), |v| {
            (0.2 * v + 0.5).clamp(0.0, 1.0)
        }),
        // -∞ · 0 is NaN, as in ONNX's x · HardSigmoid(x).
        ("hard_swish", json!({}), |v| {
            v * (v / 6.0 + 0.5).clamp(0.0, 1.0)
        }),
        ("softplus", json!({}), |v| {
            (if v > 0.0 { v } else { 0.0 }) + (-v.abs()).exp().ln_1p()
        }),
        (
            "elu",
            json!({}),
            |v| if v < 0.0 { v.exp() - 1.0 } else { v },
        ),
    ]
}

#[test]
fn nan_propagates_through_relu_clip_and_hard_sigmoid_families_everywhere() {
    // onnxruntime and PyTorch: relu(NaN) = clip(NaN) = hard_sigmoid(NaN) = NaN.
    for (op, attrs, f) in nan_unary_cases() {
        for len in lengths(NAN_X.len()) {
            let x = padded(NAN_X, len, 0.25);
            let want: Vec<f32> = x
                .iter()
                .map(|&v| if v.is_nan() { NAN } else { f(v) })
                .collect();
            // `u`: the op alone; `v`: fused after an add (x + 0 keeps NaN), as add → relu is.
            let g = doc(
                &["x", "zero"],
                len,
                json!([
                    { "id": "u", "op": op, "inputs": ["x"], "attrs": attrs },
                    { "id": "a", "op": "add", "inputs": ["x", "zero"] },
                    { "id": "v", "op": op, "inputs": ["a"], "attrs": attrs },
                ]),
                &["u", "v"],
            );
            let inputs = HashMap::from([
                ("x".to_string(), input(&x)),
                ("zero".to_string(), input(&vec![0.0; len])),
            ]);
            let runs = run_everywhere(&g, &inputs);
            check(&runs, 0, op, "x", &want, 1e-5);
            check(&runs, 1, &format!("add → {op}"), "x", &want, 1e-5);
        }
    }
}

#[test]
fn nan_propagates_through_max_and_min_in_either_operand_everywhere() {
    // ONNX Max/Min (numpy's maximum/minimum) and torch.maximum/minimum: NaN if either is.
    for len in lengths(NAN_X.len()) {
        let x = padded(NAN_X, len, 1.0);
        let y = padded(NAN_Y, len, 2.0);
        let pick = |f: fn(f32, f32) -> f32| -> Vec<f32> {
            x.iter()
                .zip(&y)
                .map(|(&a, &b)| {
                    if a.is_nan() || b.is_nan() {
                        NAN
                    } else {
                        f(a, b)
                    }
                })
                .collect()
        };
        let g = doc(
            &["x", "y", "zero"],
            len,
            json!([
                { "id": "mx", "op": "max", "inputs": ["x", "y"] },
                { "id": "mn", "op": "min", "inputs": ["x", "y"] },
                { "id": "yx", "op": "max", "inputs": ["y", "x"] },
                { "id": "a", "op": "add", "inputs": ["x", "zero"] },
                { "id": "fmx", "op": "max", "inputs": ["a", "y"] },
                { "id": "fmn", "op": "min", "inputs": ["y", "a"] },
            ]),
            &["mx", "mn", "yx", "fmx", "fmn"],
        );
        let inputs = HashMap::from([
            ("x".to_string(), input(&x)),
            ("y".to_string(), input(&y)),
            ("zero".to_string(), input(&vec![0.0; len])),
        ]);
        let runs = run_everywhere(&g, &inputs);
        let (max, min) = (pick(f32::max), pick(f32::min));
        check(&runs, 0, "max(x, y)", "x", &max, 0.0);
        check(&runs, 1, "min(x, y)", "x", &min, 0.0);
        check(&runs, 2, "max(y, x)", "x", &max, 0.0);
        check(&runs, 3, "max(x + 0, y)", "x", &max, 0.0);
        check(&runs, 4, "min(y, x + 0)", "x", &min, 0.0);
    }
}

#[test]
fn nan_propagates_through_reductions_pooling_and_epilogues_everywhere() {
    // Rows of 5: NaN first, in the middle, last, none, and a row of -∞.
    let rows: [[f32; 5]; 5] = [
        [NAN, 1.0, 2.0, -3.0, 0.0],
        [1.0, -2.0, NAN, 5.0, 4.0],
        [1.0, 2.0, 3.0, 4.0, NAN],
        [1.0, -7.0, 3.0, 9.0, 2.0],
        [-INF, -INF, -INF, -INF, -INF],
    ];
    let x: Vec<f32> = rows.iter().flatten().copied().collect();
    let g = graph(&json!({
        "format": "sluice/graph@1",
        "inputs": {
            "x": { "shape": [5, 5], "dtype": "f32" },
            "eye": { "shape": [5, 5], "dtype": "f32" },
        },
        "nodes": [
            { "id": "rmax", "op": "reduce_max", "inputs": ["x"], "attrs": { "axes": [1], "keepdims": false } },
            { "id": "rmin", "op": "reduce_min", "inputs": ["x"], "attrs": { "axes": [1], "keepdims": false } },
            { "id": "x4", "op": "reshape", "inputs": ["x"], "attrs": { "shape": [1, 1, 5, 5] } },
            { "id": "pool", "op": "max_pool2d", "inputs": ["x4"], "attrs": { "kernel_size": [1, 5] } },
            { "id": "pool2", "op": "max_pool2d", "inputs": ["x4"], "attrs": { "kernel_size": [2, 2], "strides": [2, 2] } },
            { "id": "mm", "op": "matmul", "inputs": ["x", "eye"] },
            { "id": "mmr", "op": "relu", "inputs": ["mm"] },
        ],
        "outputs": ["rmax", "rmin", "pool", "pool2", "mmr"],
    }));
    let mut eye = vec![0.0; 25];
    for i in 0..5 {
        eye[i * 6] = 1.0;
    }
    let inputs = HashMap::from([
        ("x".to_string(), Tensor::f32(vec![5, 5], x.clone())),
        ("eye".to_string(), Tensor::f32(vec![5, 5], eye)),
    ]);
    let runs = run_everywhere(&g, &inputs);
    check(
        &runs,
        0,
        "reduce_max",
        "row",
        &[NAN, NAN, NAN, 9.0, -INF],
        0.0,
    );
    check(
        &runs,
        1,
        "reduce_min",
        "row",
        &[NAN, NAN, NAN, -7.0, -INF],
        0.0,
    );
    check(
        &runs,
        2,
        "max_pool2d 1×5",
        "row",
        &[NAN, NAN, NAN, 9.0, -INF],
        0.0,
    );
    // 2×2 windows over rows 0-1 and 2-3: [NaN 1 | 1 -2], [2 -3 | NaN 5], then [1 2 | 1 -7],
    // [3 4 | 3 9].
    check(
        &runs,
        3,
        "max_pool2d 2×2",
        "window",
        &[NAN, NAN, 2.0, 9.0],
        0.0,
    );
    // x · I then relu (an epilogue where fused): NaN stays NaN (NaN · 0 is NaN too, so a
    // NaN spreads over its row).
    let mut mmr = Vec::new();
    for r in rows {
        let nan = r.iter().any(|v| v.is_nan());
        let inf = r.iter().any(|v| v.is_infinite());
        for v in r {
            mmr.push(if nan || inf { NAN } else { v.max(0.0) });
        }
    }
    check(&runs, 4, "relu(x · I)", "x", &mmr, 0.0);
}

#[test]
fn exported_casts_to_16_bit_floats_keep_their_rounding() {
    // Written as Cast(to=FLOAT16 or BFLOAT16) then Cast(to=FLOAT): imported back, the
    // graph rounds as the original did.
    for (to, table) in [("f16", F16_TABLE), ("bf16", BF16_TABLE)] {
        let x: Vec<f32> = table.iter().map(|c| c.0).collect();
        let want: Vec<f32> = table.iter().map(|c| c.1).collect();
        let g = doc(
            &["x"],
            x.len(),
            json!([{ "id": "c", "op": "cast", "inputs": ["x"], "attrs": { "to": to } }]),
            &["c"],
        );
        let bytes = sluice_engine::onnx::export(&g, &Weights::new())
            .unwrap_or_else(|e| panic!("export: {e}"));
        let model = <proto::ModelProto as prost::Message>::decode(bytes.as_slice()).unwrap();
        let casts: Vec<i64> = model
            .graph
            .as_ref()
            .unwrap()
            .node
            .iter()
            .filter(|n| n.op_type == "Cast")
            .map(|n| n.attribute[0].i)
            .collect();
        let half = if to == "f16" {
            proto::data_type::FLOAT16
        } else {
            proto::data_type::BFLOAT16
        };
        assert_eq!(
            casts,
            vec![i64::from(half), i64::from(proto::data_type::FLOAT)],
            "{to}"
        );
        let imported = sluice_engine::onnx::import(
            &bytes,
            &sluice_engine::onnx::tensor::NoExternalData,
            &sluice_engine::limits::Limits::default(),
        )
        .unwrap_or_else(|e| panic!("import: {e}"));
        let g = Graph::build(imported.doc).unwrap_or_else(|p| panic!("{p}"));
        let inputs = HashMap::from([("x".to_string(), input(&x))]);
        let got = cpu::run(&g, &Weights::new(), &inputs).unwrap();
        let got = got[0].1.as_f32().unwrap();
        for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
            assert!(
                same(g, w, 0.0),
                "{to}: element {i} is {g:e}, expected {w:e}"
            );
        }
    }
}
