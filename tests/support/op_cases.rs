//! The operator test catalogue: every operator with odd sizes (not multiples of the
//! workgroup size), broadcasting, and each attribute. Shared by the GPU-vs-CPU test and the
//! shader validation test.

use crate::{f32_in, single_op, In};
use serde_json::{json, Value};

/// One operator test case.
pub struct OpCase {
    /// A readable label.
    pub label: String,
    /// The single-node graph.
    pub doc: Value,
    /// Make float inputs positive (log, sqrt, pow bases).
    pub positive: bool,
    /// Explicit i32 inputs: (name, values).
    pub ints: Vec<(&'static str, Vec<i32>)>,
    /// Explicit f32 inputs: (name, values), for ties, NaN and saturation.
    pub floats: Vec<(&'static str, Vec<f32>)>,
    /// Also checked on the 16-bit storage paths (`tests/precision.rs`): false where
    /// rounding inputs to f16 legitimately changes a discrete answer (an argmax, a
    /// comparison, a saturating cast) rather than moving it within a tolerance.
    pub half: bool,
}

fn case(label: impl Into<String>, doc: Value) -> OpCase {
    OpCase {
        label: label.into(),
        doc,
        positive: false,
        ints: Vec::new(),
        floats: Vec::new(),
        half: true,
    }
}

fn typed(name: &'static str, shape: &[usize], dtype: &'static str) -> In<'static> {
    In {
        name,
        shape: shape.to_vec(),
        dtype,
    }
}

fn x(shape: &[usize]) -> In<'static> {
    In {
        name: "x",
        shape: shape.to_vec(),
        dtype: "f32",
    }
}

/// The attributes of a single-operator graph's node.
fn attrs_of(doc: &Value) -> Value {
    doc["nodes"][0]["attrs"].clone()
}

/// Every case.
pub fn op_cases() -> Vec<OpCase> {
    let mut v = Vec::new();
    // Matmul family.
    for (a, b) in [
        (vec![37, 29], vec![29, 41]),
        (vec![2, 64, 128], vec![128, 96]),
        (vec![3, 1, 8, 12], vec![5, 12, 4]),
        (vec![29], vec![29, 7]),
        (vec![6, 29], vec![29]),
        (vec![13], vec![13]),
        (vec![5, 33, 20], vec![5, 20, 3]),
    ] {
        v.push(case(
            format!("matmul {a:?}x{b:?}"),
            single_op("matmul", json!({}), &[f32_in("a", &a), f32_in("b", &b)], 1),
        ));
    }
    for (shape, out, bias) in [
        (vec![5, 33], 17, true),
        (vec![3, 7, 64], 128, true),
        (vec![9, 16], 8, false),
        (vec![4, 30], 12, false),
    ] {
        v.push(case(
            format!("linear {shape:?}->{out} bias={bias}"),
            single_op(
                "linear",
                json!({ "out_features": out, "bias": bias }),
                &[x(&shape)],
                1,
            ),
        ));
    }
    // Elementwise family.
    for op in ["add", "sub", "mul", "div", "pow", "max", "min"] {
        for (a, b) in [
            (vec![3, 1, 5], vec![4, 1]),
            (vec![257], vec![257]),
            (vec![2, 3], vec![]),
        ] {
            let mut c = case(
                format!("{op} {a:?},{b:?}"),
                single_op(op, json!({}), &[f32_in("a", &a), f32_in("b", &b)], 1),
            );
            c.positive = op == "pow";
            v.push(c);
        }
    }
    for op in [
        "relu", "sigmoid", "tanh", "gelu", "exp", "log", "sqrt", "erf",
    ] {
        let mut c = case(
            format!("{op} [1000]"),
            single_op(op, json!({}), &[x(&[1000])], 1),
        );
        c.positive = matches!(op, "log" | "sqrt");
        v.push(c);
    }
    v.push(case(
        "gelu tanh",
        single_op("gelu", json!({ "approximate": "tanh" }), &[x(&[3, 67])], 1),
    ));
    for attrs in [
        json!({ "min": -0.5 }),
        json!({ "max": 0.25 }),
        json!({ "min": -0.3, "max": 0.4 }),
        json!({}),
    ] {
        v.push(case(
            format!("clip {attrs}"),
            single_op("clip", attrs, &[x(&[7, 11])], 1),
        ));
    }
    // Activations and the other unary operators, over [-6, 6] (every kink inside, 0 not).
    let spread: Vec<f32> = (0..1001)
        .map(|i| (i as f32 - 500.0) * 0.012 + 0.005)
        .collect();
    for (op, attrs) in [
        ("leaky_relu", json!({})),
        ("leaky_relu", json!({ "alpha": 0.2 })),
        ("elu", json!({})),
        ("elu", json!({ "alpha": 2.0 })),
        ("selu", json!({})),
        ("selu", json!({ "alpha": 2.0, "gamma": 3.0 })),
        ("softplus", json!({})),
        ("softsign", json!({})),
        ("hard_sigmoid", json!({})),
        ("hard_sigmoid", json!({ "alpha": 0.5, "beta": 0.6 })),
        ("hard_swish", json!({})),
        ("silu", json!({})),
        ("swish", json!({ "alpha": 1.5 })),
        ("mish", json!({})),
        ("abs", json!({})),
        ("neg", json!({})),
        ("reciprocal", json!({})),
        ("sin", json!({})),
        ("cos", json!({})),
    ] {
        let mut c = case(
            format!("{op} {attrs} [7,143]"),
            single_op(op, attrs, &[x(&[7, 143])], 1),
        );
        c.floats = vec![("x", spread.clone())];
        v.push(c);
    }
    // Step functions on quarters (halves included: round takes them to even).
    let quarters: Vec<f32> = (0..1001)
        .map(|i| ((i % 101) as f32 - 50.0) * 0.25)
        .collect();
    for op in ["floor", "ceil", "round", "sign"] {
        let mut c = case(
            format!("{op} [7,143]"),
            single_op(op, json!({}), &[x(&[7, 143])], 1),
        );
        c.floats = vec![("x", quarters.clone())];
        v.push(c);
    }
    for slope in [vec![5], vec![4, 1], vec![], vec![3, 4, 5]] {
        v.push(case(
            format!("prelu slope {slope:?}"),
            single_op(
                "prelu",
                json!({}),
                &[f32_in("x", &[3, 4, 5]), f32_in("slope", &slope)],
                1,
            ),
        ));
    }
    for fmod in [0, 1] {
        let mut c = case(
            format!("mod f32 fmod {fmod}"),
            single_op(
                "mod",
                json!({ "fmod": fmod }),
                &[f32_in("a", &[3, 67]), f32_in("b", &[67])],
                1,
            ),
        );
        c.floats = vec![
            ("a", (0..201).map(|i| (i as f32 - 100.0) * 0.37).collect()),
            (
                "b",
                (0..67)
                    .map(|i| [2.5, -2.5, 0.75, -1.25, 4.0][i % 5])
                    .collect(),
            ),
        ];
        c.half = false;
        v.push(c);
    }
    // i32 arithmetic: wrapping, truncating division, 0 for a zero divisor.
    let (lo, hi) = (i32::MIN, i32::MAX);
    let int_a: Vec<i32> = (0..201)
        .map(|i| [lo, hi, -7, 7, 0, -1, 13, -100_000][i % 8])
        .collect();
    let int_b: Vec<i32> = (0..67).map(|i| [3, -3, 0, -1, 1, 7, -2][i % 7]).collect();
    for (op, attrs) in [
        ("add", json!({})),
        ("sub", json!({})),
        ("mul", json!({})),
        ("div", json!({})),
        ("max", json!({})),
        ("min", json!({})),
        ("mod", json!({})),
        ("mod", json!({ "fmod": 1 })),
    ] {
        let mut c = case(
            format!("{op} {attrs} i32 broadcast"),
            single_op(
                op,
                attrs,
                &[typed("a", &[3, 67], "i32"), typed("b", &[67], "i32")],
                1,
            ),
        );
        c.ints = vec![("a", int_a.clone()), ("b", int_b.clone())];
        v.push(c);
    }
    for op in ["abs", "neg", "sign"] {
        let mut c = case(
            format!("{op} i32"),
            single_op(op, json!({}), &[typed("x", &[201], "i32")], 1),
        );
        c.ints = vec![("x", int_a.clone())];
        v.push(c);
    }
    for dtype in ["i32", "bool"] {
        v.push(case(
            format!("where {dtype} values"),
            single_op(
                "where",
                json!({}),
                &[
                    typed("c", &[4, 1], "bool"),
                    typed("a", &[3, 4, 5], dtype),
                    typed("b", &[5], dtype),
                ],
                1,
            ),
        ));
    }
    v.push(case(
        "where broadcast",
        single_op(
            "where",
            json!({}),
            &[
                In {
                    name: "c",
                    shape: vec![4, 1],
                    dtype: "bool",
                },
                f32_in("a", &[3, 4, 5]),
                f32_in("b", &[5]),
            ],
            1,
        ),
    ));
    // Reduce family.
    for (shape, axes, keep) in [
        (vec![3, 4, 5], json!(null), true),
        (vec![3, 4, 5], json!([1]), false),
        (vec![3, 4, 5], json!([0, 2]), true),
        (vec![3, 4, 5], json!([-1]), false),
        (vec![3, 5000], json!([1]), true),
        (vec![70, 3], json!([0]), false),
        (vec![3, 4], json!([]), true),
        (vec![3, 4, 5], json!(null), false),
    ] {
        v.extend(reductions(&shape, &axes, keep));
    }
    // Over an empty axis: +inf, 1 and 0.
    for op in ["reduce_min", "reduce_prod", "reduce_l2"] {
        let mut c = case(
            format!("{op} over an empty axis"),
            single_op(op, json!({ "axes": [1] }), &[x(&[3, 0, 2])], 1),
        );
        c.half = op != "reduce_min";
        v.push(c);
    }
    // Reduce family: argmax, and maxima with ties, infinities and NaN (f16-exact values).
    for (shape, attrs) in [
        (vec![7, 13], json!({})),
        (vec![3, 70, 5], json!({ "axis": 1, "keepdims": true })),
        (vec![4, 3], json!({ "axis": 0 })),
        (vec![65], json!({ "axis": 0 })),
    ] {
        for op in ["argmax", "argmin"] {
            let mut c = case(
                format!("{op} {shape:?} {attrs}"),
                single_op(op, attrs.clone(), &[x(&shape)], 1),
            );
            c.half = false;
            v.push(c);
        }
    }
    let mut c = case(
        "top_k i32 beyond 2^24 with ties",
        single_op(
            "top_k",
            json!({ "k": 4, "axis": 0 }),
            &[typed("x", &[9, 5], "i32")],
            2,
        ),
    );
    let big = 16_777_217;
    c.ints = vec![(
        "x",
        (0..45)
            .map(|i| [big, big - 1, -3, big, 0][i % 5] + (i as i32 % 3))
            .collect(),
    )];
    v.push(c);
    // Scans and selections along one axis.
    for (shape, attrs) in [
        (vec![3, 70], json!({ "axis": 1 })),
        (vec![5, 4, 3], json!({ "axis": 0, "exclusive": true })),
        (vec![5, 4, 3], json!({ "axis": -2, "reverse": true })),
        (
            vec![67],
            json!({ "axis": 0, "exclusive": true, "reverse": true }),
        ),
    ] {
        v.push(case(
            format!("cumsum {shape:?} {attrs}"),
            single_op("cumsum", attrs, &[x(&shape)], 1),
        ));
    }
    let mut c = case(
        "cumsum i32 wrapping",
        single_op(
            "cumsum",
            json!({ "axis": 1 }),
            &[typed("x", &[2, 67], "i32")],
            1,
        ),
    );
    c.ints = vec![("x", (0..134).map(|i| (i - 60) * 29_000_011).collect())];
    v.push(c);
    for (shape, attrs) in [
        (vec![3, 70], json!({ "k": 5 })),
        (
            vec![6, 4, 3],
            json!({ "k": 6, "axis": 0, "largest": false }),
        ),
        (vec![5, 9, 2], json!({ "k": 0, "axis": 1 })),
        (
            vec![5, 9, 2],
            json!({ "k": 9, "axis": -2, "sorted": false }),
        ),
    ] {
        v.push(case(
            format!("top_k {shape:?} {attrs}"),
            single_op("top_k", attrs, &[x(&shape)], 2),
        ));
    }
    let (nan, inf) = (f32::NAN, f32::INFINITY);
    let special = vec![
        1.0, 5.0, 5.0, -1.0, //
        nan, 2.0, nan, 3.0, //
        -inf, -inf, -inf, -inf, //
        -2.0, inf, 7.0, inf, //
        0.5, 0.5, -0.0, 0.0,
    ];
    for (op, attrs) in [
        ("argmax", json!({})),
        ("argmax", json!({ "axis": 0, "keepdims": true })),
        ("argmax", json!({ "axis": 1, "select_last_index": true })),
        ("argmin", json!({ "axis": 1 })),
        ("argmin", json!({ "axis": 0, "select_last_index": true })),
        ("reduce_max", json!({ "axes": [1] })),
        ("reduce_max", json!({ "axes": [0], "keepdims": false })),
        ("reduce_min", json!({ "axes": [1] })),
        ("top_k", json!({ "k": 3, "axis": 1 })),
        ("top_k", json!({ "k": 5, "axis": 0, "largest": false })),
    ] {
        let mut c = case(
            format!("{op} ties and NaN {attrs}"),
            single_op(op, attrs, &[x(&[5, 4])], 1),
        );
        c.floats = vec![("x", special.clone())];
        // f16 storage saturates infinities at ±65504 on upload.
        c.half = op.starts_with("arg");
        if op == "top_k" {
            c.doc = single_op(op, attrs_of(&c.doc), &[x(&[5, 4])], 2);
        }
        v.push(c);
    }
    // Normalisation family.
    for axis in [0, 1, -1] {
        for op in ["softmax", "log_softmax"] {
            v.push(case(
                format!("{op} axis {axis}"),
                single_op(op, json!({ "axis": axis }), &[x(&[3, 4, 70])], 1),
            ));
        }
    }
    for axis in [-1, 1] {
        v.push(case(
            format!("layer_norm axis {axis}"),
            single_op(
                "layer_norm",
                json!({ "axis": axis, "epsilon": 1e-3 }),
                &[x(&[2, 3, 50])],
                1,
            ),
        ));
    }
    for (op, attrs, shape) in [
        ("rms_norm", json!({}), vec![2, 3, 50]),
        (
            "rms_norm",
            json!({ "axis": 1, "epsilon": 0.1 }),
            vec![2, 3, 7],
        ),
        (
            "instance_norm",
            json!({ "epsilon": 1e-3 }),
            vec![2, 3, 5, 7],
        ),
        ("instance_norm", json!({}), vec![3, 5, 9]),
        ("group_norm", json!({ "num_groups": 2 }), vec![2, 6, 5, 3]),
        (
            "group_norm",
            json!({ "num_groups": 3, "epsilon": 0.01 }),
            vec![3, 3, 7],
        ),
    ] {
        v.push(case(
            format!("{op} {attrs} {shape:?}"),
            single_op(op, attrs, &[x(&shape)], 1),
        ));
    }
    v.push(case(
        "batch_norm",
        single_op(
            "batch_norm",
            json!({ "epsilon": 1e-4 }),
            &[x(&[2, 3, 5, 7])],
            1,
        ),
    ));
    // Movement family.
    let movement = [
        ("reshape", json!({ "shape": [4, -1] }), vec![2, 3, 4], 1),
        ("reshape", json!({ "shape": [0, 12] }), vec![2, 3, 4], 1),
        ("flatten", json!({ "axis": 0 }), vec![2, 3, 4], 1),
        ("flatten", json!({ "axis": 2 }), vec![2, 3, 4], 1),
        ("squeeze", json!({}), vec![2, 1, 3, 1], 1),
        ("squeeze", json!({ "axes": [-1] }), vec![2, 1, 3, 1], 1),
        ("unsqueeze", json!({ "axes": [0, 3] }), vec![2, 3], 1),
        ("identity", json!({}), vec![5, 3], 1),
        ("dropout", json!({ "ratio": 0.3 }), vec![5, 3], 1),
        ("transpose", json!({}), vec![2, 3, 4], 1),
        ("transpose", json!({ "perm": [1, 0, 2] }), vec![2, 3, 65], 1),
        (
            "split",
            json!({ "axis": 1, "sizes": [2, 5, 0, 3] }),
            vec![3, 10],
            4,
        ),
        (
            "split",
            json!({ "axis": -1, "num_outputs": 3 }),
            vec![2, 7],
            3,
        ),
        (
            "slice",
            json!({ "starts": [1, -3], "ends": [3, 100], "axes": [0, 1] }),
            vec![4, 10],
            1,
        ),
        (
            "slice",
            json!({ "starts": [-1], "ends": [-100], "axes": [1], "steps": [-2] }),
            vec![3, 10],
            1,
        ),
        (
            "slice",
            json!({ "starts": [0, 1], "ends": [4, 5], "steps": [3, 2] }),
            vec![5, 6, 2],
            1,
        ),
        ("expand", json!({ "shape": [2, 3, 4] }), vec![3, 1], 1),
        ("expand", json!({ "shape": [5, 1] }), vec![1, 6], 1),
        (
            "pad",
            json!({ "pads": [1, -1, 2, 3], "constant_value": 1.5 }),
            vec![3, 7],
            1,
        ),
        (
            "pad",
            json!({ "pads": [2, 3, 5, 1], "axes": [-1, 1], "mode": "reflect" }),
            vec![2, 5, 4],
            1,
        ),
        (
            "pad",
            json!({ "pads": [0, 3, 4, 0, 2, 1], "mode": "edge" }),
            vec![2, 3, 5],
            1,
        ),
        (
            "pad",
            json!({ "pads": [4, 1, 2, 6], "mode": "wrap" }),
            vec![3, 4],
            1,
        ),
        (
            "depth_to_space",
            json!({ "blocksize": 2 }),
            vec![2, 12, 3, 5],
            1,
        ),
        (
            "depth_to_space",
            json!({ "blocksize": 3, "mode": "CRD" }),
            vec![1, 18, 2, 3],
            1,
        ),
        (
            "space_to_depth",
            json!({ "blocksize": 2 }),
            vec![2, 3, 6, 4],
            1,
        ),
        (
            "space_to_depth",
            json!({ "blocksize": 3, "mode": "CRD" }),
            vec![1, 2, 3, 9],
            1,
        ),
    ];
    for (op, attrs, shape, outs) in movement {
        v.push(case(
            format!("{op} {shape:?} {attrs}"),
            single_op(op, attrs, &[x(&shape)], outs),
        ));
    }
    v.push(case(
        "concat axis 1",
        single_op(
            "concat",
            json!({ "axis": 1 }),
            &[
                f32_in("a", &[2, 3, 4]),
                f32_in("b", &[2, 1, 4]),
                f32_in("c", &[2, 5, 4]),
            ],
            1,
        ),
    ));
    v.push(case(
        "concat axis -1",
        single_op(
            "concat",
            json!({ "axis": -1 }),
            &[f32_in("a", &[3, 2]), f32_in("b", &[3, 67])],
            1,
        ),
    ));
    for (axis, data, idx_shape, ints) in [
        (0, vec![5, 4], vec![3], vec![4, -5, 0]),
        (1, vec![3, 6, 2], vec![2, 2], vec![5, -1, 0, 2]),
    ] {
        let mut c = case(
            format!("gather axis {axis}"),
            single_op(
                "gather",
                json!({ "axis": axis }),
                &[
                    x(&data),
                    In {
                        name: "i",
                        shape: idx_shape,
                        dtype: "i32",
                    },
                ],
                1,
            ),
        );
        c.ints = vec![("i", ints)];
        v.push(c);
    }
    // Indexing family: every reduction, negative indices, i32 data, odd sizes.
    let ints_in = |name: &'static str, shape: &[usize]| typed(name, shape, "i32");
    let mut c = case(
        "gather_elements axis 1",
        single_op(
            "gather_elements",
            json!({ "axis": 1 }),
            &[x(&[3, 70]), ints_in("i", &[2, 67])],
            1,
        ),
    );
    c.ints = vec![("i", (0..134).map(|i| (i * 37) % 140 - 70).collect())];
    v.push(c);
    let mut c = case(
        "gather_elements i32 data axis -3",
        single_op(
            "gather_elements",
            json!({ "axis": -3 }),
            &[typed("x", &[4, 3, 2], "i32"), ints_in("i", &[5, 2, 2])],
            1,
        ),
    );
    c.ints = vec![
        ("x", (0..24).map(|i| i * 87_000_011).collect()),
        ("i", (0..20).map(|i| i % 8 - 4).collect()),
    ];
    v.push(c);
    for reduction in ["none", "add", "mul", "max", "min"] {
        let mut c = case(
            format!("scatter_elements {reduction}"),
            single_op(
                "scatter_elements",
                json!({ "axis": 0, "reduction": reduction }),
                &[x(&[5, 67]), ints_in("i", &[3, 60]), f32_in("u", &[3, 60])],
                1,
            ),
        );
        c.ints = vec![("i", (0..180).map(|i| (i * 7) % 10 - 5).collect())];
        v.push(c);
        let mut c = case(
            format!("scatter_nd {reduction}"),
            single_op(
                "scatter_nd",
                json!({ "reduction": reduction }),
                &[x(&[4, 5, 33]), ints_in("i", &[3, 2]), f32_in("u", &[3, 33])],
                1,
            ),
        );
        c.ints = vec![("i", vec![1, -1, 3, 0, 1, 4])];
        v.push(c);
    }
    let mut c = case(
        "scatter_nd i32 add",
        single_op(
            "scatter_nd",
            json!({ "reduction": "add" }),
            &[
                typed("x", &[6, 7], "i32"),
                ints_in("i", &[2, 1]),
                typed("u", &[2, 7], "i32"),
            ],
            1,
        ),
    );
    c.ints = vec![
        ("x", (0..42).map(|i| i * 50_000_017).collect()),
        ("i", vec![-2, 4]),
        ("u", (0..14).map(|i| i - 7).collect()),
    ];
    v.push(c);
    for (data, idx, ints, batch_dims) in [
        (vec![5, 4, 33], vec![3, 2], vec![4, 3, -1, 0, 2, -4], 0),
        (vec![3, 4, 5], vec![3, 2, 1], vec![3, -1, 0, 2, 1, 1], 1),
        (vec![2, 3], vec![2, 2], vec![1, 2, -2, 0], 0),
    ] {
        let mut c = case(
            format!("gather_nd {data:?} {idx:?} batch_dims {batch_dims}"),
            single_op(
                "gather_nd",
                json!({ "batch_dims": batch_dims }),
                &[x(&data), ints_in("i", &idx)],
                1,
            ),
        );
        c.ints = vec![("i", ints)];
        v.push(c);
    }
    v.push(case(
        "tile [3,1,5] by [2,3,1]",
        single_op("tile", json!({ "repeats": [2, 3, 1] }), &[x(&[3, 1, 5])], 1),
    ));
    let mut c = case(
        "tile i32 by [1,0]",
        single_op(
            "tile",
            json!({ "repeats": [1, 0] }),
            &[typed("x", &[3, 2], "i32")],
            1,
        ),
    );
    c.ints = vec![("x", vec![1, 2, 3, 4, 5, 6])];
    v.push(c);
    let mut c = case(
        "tile i32 [67] by [3]",
        single_op(
            "tile",
            json!({ "repeats": [3] }),
            &[typed("x", &[67], "i32")],
            1,
        ),
    );
    c.ints = vec![("x", (0..67).map(|i| i * 31_000_001).collect())];
    v.push(c);
    for attrs in [
        json!({}),
        json!({ "upper": false }),
        json!({ "k": -2 }),
        json!({ "upper": false, "k": 40 }),
    ] {
        v.push(case(
            format!("trilu {attrs}"),
            single_op("trilu", attrs, &[x(&[3, 7, 67])], 1),
        ));
    }
    for attrs in [
        json!({ "start": -3, "limit": 7.5, "delta": 0.25 }),
        json!({ "start": 100, "limit": -3, "delta": -7, "dtype": "i32" }),
        json!({ "start": 5, "limit": 5, "delta": 1 }),
    ] {
        v.push(case(
            format!("range {attrs}"),
            single_op("range", attrs, &[], 1),
        ));
    }
    for attrs in [
        json!({}),
        json!({ "start": -2, "end": 3 }),
        json!({ "start": 2, "end": 1 }),
    ] {
        v.push(case(
            format!("shape {attrs}"),
            single_op("shape", attrs, &[x(&[3, 70, 5])], 1),
        ));
    }
    for attrs in [
        json!({ "shape": [3, 67] }),
        json!({ "shape": [5, 1, 3], "value": 2.5 }),
        json!({ "shape": [67], "value": -12345678, "dtype": "i32" }),
    ] {
        v.push(case(
            format!("constant_of_shape {attrs}"),
            single_op("constant_of_shape", attrs, &[], 1),
        ));
    }
    // Convert family.
    for op in [
        "equal",
        "less",
        "greater",
        "less_or_equal",
        "greater_or_equal",
    ] {
        let mut c = case(
            format!("{op} f32 [3,1,5],[4,1]"),
            single_op(
                op,
                json!({}),
                &[f32_in("a", &[3, 1, 5]), f32_in("b", &[4, 1])],
                1,
            ),
        );
        c.half = false;
        v.push(c);
        let mut c = case(
            format!("{op} f32 ties and NaN"),
            single_op(op, json!({}), &[f32_in("a", &[2, 4]), f32_in("b", &[4])], 1),
        );
        c.floats = vec![
            ("a", vec![1.0, nan, -0.0, 3.0, 2.5, 2.0, inf, nan]),
            ("b", vec![1.0, 1.0, 0.0, 4.0]),
        ];
        v.push(c);
        let mut c = case(
            format!("{op} i32 broadcast"),
            single_op(
                op,
                json!({}),
                &[typed("a", &[3, 67], "i32"), typed("b", &[67], "i32")],
                1,
            ),
        );
        // Beyond 2^24 integers must compare as integers, not as rounded floats.
        let big = 16_777_217;
        let a: Vec<i32> = (0..201).map(|i| [big, big - 1, -3, 0][i % 4]).collect();
        let b: Vec<i32> = (0..67).map(|i| [big - 1, big, 0, -3, 7][i % 5]).collect();
        c.ints = vec![("a", a), ("b", b)];
        v.push(c);
        v.push(case(
            format!("{op} i32 scalar"),
            single_op(
                op,
                json!({}),
                &[typed("a", &[], "i32"), typed("b", &[257], "i32")],
                1,
            ),
        ));
    }
    v.push(case(
        "not [3,67]",
        single_op("not", json!({}), &[typed("x", &[3, 67], "bool")], 1),
    ));
    for op in ["and", "or", "xor"] {
        v.push(case(
            format!("{op} broadcast"),
            single_op(
                op,
                json!({}),
                &[typed("a", &[3, 1, 5], "bool"), typed("b", &[4, 1], "bool")],
                1,
            ),
        ));
    }
    for (from, to) in [
        ("f32", "i32"),
        ("f32", "bool"),
        ("f32", "f32"),
        ("i32", "f32"),
        ("i32", "bool"),
        ("i32", "i32"),
        ("bool", "f32"),
        ("bool", "i32"),
        ("bool", "bool"),
        ("f32", "f16"),
        ("f32", "bf16"),
        ("i32", "f16"),
    ] {
        let mut c = case(
            format!("cast {from} to {to}"),
            single_op(
                "cast",
                json!({ "to": to }),
                &[typed("x", &[3, 67], from)],
                1,
            ),
        );
        if from == "f32" {
            // Truncation toward zero, saturation, NaN and signed zero; f16-exact where
            // the 16-bit paths check them, beyond f16 (saturating) where they do not.
            let mut values: Vec<f32> = (0..201).map(|i| (i as f32 - 100.0) * 0.375).collect();
            values[..6].copy_from_slice(&[nan, -0.0, 1e4, -1e4, 2.75, -2.75]);
            c.floats = vec![("x", values.clone())];
            v.push(c);
            if to == "i32" {
                values[6..12].copy_from_slice(&[3e9, -3e9, 2147483520.0, -2147483648.0, inf, -inf]);
                let mut c = case(
                    "cast f32 to i32 saturating",
                    single_op("cast", json!({ "to": "i32" }), &[x(&[201])], 1),
                );
                c.floats = vec![("x", values)];
                c.half = false;
                v.push(c);
            }
            continue;
        }
        if from == "i32" {
            // Beyond 2^24 where the result stays an integer; within f16 where it is a
            // float the 16-bit paths store.
            let scale = if matches!(to, "f32" | "f16") {
                331
            } else {
                1_000_003
            };
            let values: Vec<i32> = (0..201).map(|i| (i - 100) * scale).collect();
            c.ints = vec![("x", values)];
        }
        v.push(c);
    }
    for (shape, depth, ints) in [
        (vec![2, 3], 4, vec![0, 3, -1, 4, 2, 1]),
        (vec![], 1, vec![0]),
        (
            vec![67],
            5,
            (0..67).map(|i| i % 7 - 1).collect::<Vec<i32>>(),
        ),
    ] {
        let mut c = case(
            format!("one_hot {shape:?} depth {depth}"),
            single_op(
                "one_hot",
                json!({ "depth": depth }),
                &[typed("i", &shape, "i32")],
                1,
            ),
        );
        c.ints = vec![("i", ints)];
        v.push(c);
    }
    for mode in ["constant", "reflect", "edge", "wrap"] {
        let mut c = case(
            format!("pad i32 {mode}"),
            single_op(
                "pad",
                json!({ "pads": [1, 2, 2, 1], "mode": mode, "constant_value": -7.9 }),
                &[typed("x", &[3, 4], "i32")],
                1,
            ),
        );
        c.ints = vec![("x", (0..12).map(|i| i * 3 - 20).collect())];
        v.push(c);
    }
    for (shape, ratio, seed, stream) in [
        (vec![5, 67], 0.3, 11, 4),
        (vec![2, 3, 7], 0.0, 0, -9),
        (vec![301], 0.9, 4_000_000_000u32, 123_456),
    ] {
        let mut c = case(
            format!("dropout_train {shape:?} ratio {ratio} seed {seed} stream {stream}"),
            single_op(
                "dropout_train",
                json!({ "ratio": ratio, "seed": seed }),
                &[x(&shape), typed("stream", &[], "i32")],
                1,
            ),
        );
        c.ints = vec![("stream", vec![stream])];
        v.push(c);
    }
    // Loss family: every reduction, odd sizes, label smoothing, rank-0 results.
    for (logits, labels, attrs) in [
        (vec![5, 7], vec![6, 0, 3, 3, 1], json!({})),
        (
            vec![5, 7],
            vec![6, 0, 3, 3, 1],
            json!({ "reduction": "sum" }),
        ),
        (
            vec![2, 3, 11],
            vec![10, 0, 5, 2, 2, 9],
            json!({ "reduction": "none", "label_smoothing": 0.2 }),
        ),
        (vec![9], vec![4], json!({ "reduction": "none" })),
        (
            vec![70, 300],
            (0..70).map(|i| (i * 37) % 300).collect(),
            json!({ "label_smoothing": 1.0 }),
        ),
    ] {
        for op in ["softmax_cross_entropy", "nll_loss"] {
            let mut attrs = attrs.clone();
            if op == "nll_loss" {
                if let Some(a) = attrs.as_object_mut() {
                    a.remove("label_smoothing");
                }
            }
            let rows = &logits[..logits.len() - 1];
            let mut c = case(
                format!("{op} {logits:?} {attrs}"),
                single_op(
                    op,
                    attrs,
                    &[f32_in("x", &logits), typed("y", rows, "i32")],
                    1,
                ),
            );
            c.ints = vec![("y", labels.clone())];
            v.push(c);
        }
    }
    for reduction in ["mean", "sum", "none"] {
        for (op, shape) in [("mse_loss", vec![3, 67]), ("bce_with_logits", vec![257])] {
            v.push(case(
                format!("{op} {shape:?} {reduction}"),
                single_op(
                    op,
                    json!({ "reduction": reduction }),
                    &[f32_in("p", &shape), f32_in("t", &shape)],
                    1,
                ),
            ));
        }
    }
    let mut c = case(
        "bce_with_logits extreme logits",
        single_op(
            "bce_with_logits",
            json!({ "reduction": "none" }),
            &[f32_in("p", &[6]), f32_in("t", &[6])],
            1,
        ),
    );
    c.floats = vec![
        ("p", vec![30.0, -30.0, 0.0, 80.0, -80.0, 1e-3]),
        ("t", vec![1.0, 0.0, 0.5, 0.0, 1.0, 0.25]),
    ];
    v.push(c);
    // Conv/pool family.
    let convs = [
        json!({ "out_channels": 4, "kernel_size": [3, 3] }),
        json!({ "out_channels": 6, "kernel_size": [3, 2], "strides": [2, 1], "pads": [1, 0, 2, 1], "bias": false }),
        json!({ "out_channels": 4, "kernel_size": [3, 3], "dilations": [2, 2], "pads": [2, 2] }),
        json!({ "out_channels": 6, "kernel_size": [3, 3], "groups": 3, "pads": [1, 1] }),
    ];
    for attrs in convs {
        v.push(case(
            format!("conv2d {attrs}"),
            single_op("conv2d", attrs, &[x(&[2, 3, 9, 11])], 1),
        ));
    }
    let pools = [
        (
            "max_pool2d",
            json!({ "kernel_size": [2, 2], "strides": [2, 2] }),
        ),
        (
            "max_pool2d",
            json!({ "kernel_size": [3, 3], "strides": [2, 2], "pads": [1, 1], "ceil_mode": true }),
        ),
        (
            "max_pool2d",
            json!({ "kernel_size": [2, 3], "dilations": [2, 1] }),
        ),
        (
            "avg_pool2d",
            json!({ "kernel_size": [3, 3], "strides": [2, 2], "pads": [1, 1] }),
        ),
        (
            "avg_pool2d",
            json!({ "kernel_size": [3, 3], "strides": [2, 2], "pads": [1, 1], "count_include_pad": true }),
        ),
        (
            "avg_pool2d",
            json!({ "kernel_size": [2, 2], "strides": [2, 2], "ceil_mode": true }),
        ),
    ];
    // 1-D: [N, C, L] with one-entry windows; global_avg_pool over any spatial rank.
    for (op, attrs, shape) in [
        (
            "conv2d",
            json!({ "out_channels": 4, "kernel_size": [3], "strides": [2], "pads": [1, 2], "dilations": [2] }),
            vec![2, 3, 19],
        ),
        (
            "conv2d",
            json!({ "out_channels": 6, "kernel_size": [2], "groups": 3, "bias": false }),
            vec![2, 3, 9],
        ),
        (
            "max_pool2d",
            json!({ "kernel_size": [3], "strides": [2], "pads": [1, 1], "ceil_mode": true }),
            vec![2, 3, 10],
        ),
        (
            "avg_pool2d",
            json!({ "kernel_size": [3], "strides": [2], "pads": [0, 1], "count_include_pad": true }),
            vec![2, 3, 10],
        ),
        (
            "conv_transpose2d",
            json!({ "out_channels": 4, "kernel_size": [3, 2], "strides": [2, 3], "pads": [1, 0, 0, 1], "output_padding": [1, 2] }),
            vec![2, 3, 5, 4],
        ),
        (
            "conv_transpose2d",
            json!({ "out_channels": 6, "kernel_size": [2, 2], "groups": 3, "dilations": [2, 1], "bias": false }),
            vec![1, 3, 4, 5],
        ),
        (
            "conv_transpose2d",
            json!({ "out_channels": 2, "kernel_size": [3], "strides": [2], "output_shape": [12] }),
            vec![2, 3, 5],
        ),
        (
            "resize",
            json!({ "scales": [1.0, 1.0, 2.0, 1.5], "mode": "linear" }),
            vec![2, 3, 5, 4],
        ),
        (
            "resize",
            json!({ "sizes": [3, 7], "axes": [-1, 2], "mode": "linear", "coordinate_transformation_mode": "align_corners" }),
            vec![1, 2, 5, 6],
        ),
        (
            "resize",
            json!({ "scales": [0.6, 2.5], "axes": [2, 3], "nearest_mode": "round_prefer_ceil", "coordinate_transformation_mode": "asymmetric" }),
            vec![2, 3, 9, 4],
        ),
        (
            "resize",
            json!({ "sizes": [4, 9], "axes": [1, 2], "keep_aspect_ratio_policy": "not_smaller", "coordinate_transformation_mode": "pytorch_half_pixel", "mode": "linear" }),
            vec![2, 7, 5],
        ),
        ("global_avg_pool", json!({}), vec![2, 3, 7]),
        ("global_avg_pool", json!({}), vec![2, 3, 3, 4, 5]),
    ] {
        v.push(case(
            format!("{op} {attrs} {shape:?}"),
            single_op(op, attrs, &[x(&shape)], 1),
        ));
    }
    for (op, attrs) in pools {
        v.push(case(
            format!("{op} {attrs}"),
            single_op(op, attrs, &[x(&[2, 3, 9, 11])], 1),
        ));
    }
    v.push(case(
        "global_avg_pool",
        single_op("global_avg_pool", json!({}), &[x(&[2, 3, 9, 11])], 1),
    ));
    v.push(case(
        "global_avg_pool large",
        single_op("global_avg_pool", json!({}), &[x(&[1, 2, 40, 40])], 1),
    ));
    v.push(case(
        "constant",
        single_op(
            "constant",
            json!({ "value": [1.5, -2.0, 3.25, 0.0, 7.0, 8.5], "shape": [2, 3] }),
            &[],
            1,
        ),
    ));
    v.push(case(
        "param",
        single_op("param", json!({ "key": "w", "shape": [5, 7] }), &[], 1),
    ));
    // Gradient family: every unary's derivative, contiguous and broadcast dy.
    for (op, attrs, positive) in [
        ("relu", json!({}), false),
        ("sigmoid", json!({}), false),
        ("tanh", json!({}), false),
        ("gelu", json!({ "approximate": "none" }), false),
        ("gelu", json!({ "approximate": "tanh" }), false),
        ("exp", json!({}), false),
        ("log", json!({}), true),
        ("sqrt", json!({}), true),
        ("erf", json!({}), false),
        ("clip", json!({ "min": -0.3, "max": 0.4 }), false),
        ("clip", json!({ "min": 0.1 }), false),
    ] {
        let mut attrs = attrs;
        attrs["op"] = json!(op);
        for dy in [vec![37, 29], vec![29]] {
            let mut c = case(
                format!("unary_grad {attrs} dy {dy:?}"),
                single_op(
                    "unary_grad",
                    attrs.clone(),
                    &[f32_in("x", &[37, 29]), f32_in("dy", &dy)],
                    1,
                ),
            );
            c.positive = positive;
            v.push(c);
        }
    }
    for (x, indices, axis, dy) in [
        (vec![11, 7], vec![5], 0, vec![5, 7]),
        (vec![3, 9, 5], vec![2, 4], 1, vec![3, 2, 4, 5]),
        (vec![6, 4], vec![3], -1, vec![6, 3]),
    ] {
        let mut c = case(
            format!("gather_grad {x:?} {indices:?} axis {axis}"),
            single_op(
                "gather_grad",
                json!({ "axis": axis }),
                &[
                    f32_in("x", &x),
                    In {
                        name: "i",
                        shape: indices.clone(),
                        dtype: "i32",
                    },
                    f32_in("dy", &dy),
                ],
                1,
            ),
        );
        let len = x[if axis < 0 { x.len() - 1 } else { axis as usize }] as i32;
        let count: usize = indices.iter().product();
        // Repeated and negative indices: rows that sum several dy rows.
        c.ints = vec![(
            "i",
            (0..count as i32)
                .map(|k| (k * 3) % len - (k % 2) * len)
                .collect(),
        )];
        v.push(c);
    }
    // The conv family's backwards: dy is the forward's output shape on x.
    let conv_grads = [
        (
            json!({ "kernel_size": [3, 3], "strides": [2, 1], "pads": [1, 1, 0, 2],
                    "dilations": [1, 2], "groups": 2 }),
            vec![2, 4, 9, 11],
            vec![6, 2, 3, 3],
            vec![2, 6, 4, 10],
        ),
        (
            json!({ "kernel_size": [3, 3], "pads": [1, 1] }),
            vec![1, 3, 8, 8],
            vec![5, 3, 3, 3],
            vec![1, 5, 8, 8],
        ),
        (
            json!({ "kernel_size": [2, 2], "strides": [2, 2], "groups": 3 }),
            vec![3, 3, 7, 9],
            vec![3, 1, 2, 2],
            vec![3, 3, 3, 4],
        ),
    ];
    // conv_transpose2d's dx: conv2d over dy [2, 3, 9, 8] gives x [2, 4, 4, 8].
    v.push(case(
        "conv_transpose2d_grad_input",
        single_op(
            "conv_transpose2d_grad_input",
            json!({ "kernel_size": [3, 2], "strides": [2, 1], "pads": [1, 0, 0, 1] }),
            &[
                f32_in("x", &[2, 4, 4, 8]),
                f32_in("weight", &[4, 3, 3, 2]),
                f32_in("dy", &[2, 3, 9, 8]),
            ],
            1,
        ),
    ));
    for (attrs, x, weight, dy) in conv_grads {
        v.push(case(
            format!("conv2d_grad_input {attrs} x {x:?}"),
            single_op(
                "conv2d_grad_input",
                attrs.clone(),
                &[
                    f32_in("x", &x),
                    f32_in("weight", &weight),
                    f32_in("dy", &dy),
                ],
                1,
            ),
        ));
        v.push(case(
            format!("conv2d_grad_filter {attrs} x {x:?}"),
            single_op(
                "conv2d_grad_filter",
                attrs,
                &[f32_in("x", &x), f32_in("dy", &dy)],
                1,
            ),
        ));
    }
    let pool_grads = [
        (
            json!({ "kernel_size": [3, 3], "strides": [2, 2], "pads": [1, 1], "ceil_mode": true }),
            vec![2, 3, 9, 11],
            vec![2, 3, 5, 6],
        ),
        (
            json!({ "kernel_size": [2, 3], "strides": [1, 2], "dilations": [2, 1],
                    "pads": [0, 1, 1, 0] }),
            vec![1, 2, 8, 7],
            vec![1, 2, 7, 3],
        ),
    ];
    for (attrs, x, dy) in pool_grads {
        let inputs = [f32_in("x", &x), f32_in("dy", &dy)];
        // Rounding x to 16 bits may tie or swap two values of a window: another maximum.
        let mut c = case(
            format!("max_pool2d_grad {attrs} x {x:?}"),
            single_op("max_pool2d_grad", attrs.clone(), &inputs, 1),
        );
        c.half = false;
        v.push(c);
        for include in [false, true] {
            let mut attrs = attrs.clone();
            attrs["count_include_pad"] = json!(include);
            v.push(case(
                format!("avg_pool2d_grad {attrs} x {x:?}"),
                single_op("avg_pool2d_grad", attrs, &inputs, 1),
            ));
        }
    }
    // Attention family: 4-D and 3-D layouts, grouped-query heads, causal, softcap, float
    // (broadcast, shorter than the keys) and bool masks.
    type AttentionCase = (
        Value,
        [&'static [usize]; 3],
        Option<(&'static [usize], &'static str)>,
    );
    let attention: [AttentionCase; 7] = [
        (
            json!({}),
            [&[2, 3, 5, 8], &[2, 3, 7, 8], &[2, 3, 7, 6]],
            None,
        ),
        (
            json!({ "is_causal": 1, "softcap": 2.0 }),
            [&[2, 6, 5, 4], &[2, 2, 7, 4], &[2, 2, 7, 3]],
            Some((&[2, 1, 5, 7], "f32")),
        ),
        (
            json!({ "q_num_heads": 4, "kv_num_heads": 2, "scale": 0.3 }),
            [&[3, 5, 12], &[3, 9, 6], &[3, 9, 10]],
            Some((&[5, 9], "bool")),
        ),
        (
            json!({ "q_num_heads": 3, "kv_num_heads": 3, "is_causal": 1 }),
            [&[1, 70, 6], &[1, 70, 6], &[1, 70, 9]],
            Some((&[3, 1, 40], "f32")),
        ),
        (
            json!({}),
            [&[2, 2, 3, 5], &[2, 2, 4, 5], &[2, 2, 4, 5]],
            Some((&[2, 2, 3, 4], "bool")),
        ),
        (
            json!({ "is_causal": 1 }),
            [&[1, 1, 4, 3], &[1, 1, 2, 3], &[1, 1, 2, 3]],
            None,
        ),
        (
            json!({ "left_window_size": 2, "right_window_size": 1 }),
            [&[2, 2, 6, 4], &[2, 1, 7, 4], &[2, 1, 7, 5]],
            Some((&[6, 7], "f32")),
        ),
    ];
    // attention_probs takes nonpad_kv_seqlen right after the mask: uneven lengths, a
    // query block placed at each sample's end (causal), an empty sample.
    let mut c = case(
        "attention_probs nonpad_kv_seqlen",
        single_op(
            "attention_probs",
            json!({ "is_causal": 1, "left_window_size": 3 }),
            &[
                f32_in("q", &[3, 2, 4, 5]),
                f32_in("k", &[3, 2, 9, 5]),
                f32_in("m", &[4, 9]),
                typed("lens", &[3], "i32"),
            ],
            1,
        ),
    );
    c.ints = vec![("lens", vec![9, 6, 0])];
    v.push(c);
    for (attrs, [q, k, vv], mask) in attention {
        for probs in [false, true] {
            let op = if probs {
                "attention_probs"
            } else {
                "attention"
            };
            let mut inputs = vec![f32_in("q", q), f32_in("k", k)];
            if !probs {
                inputs.push(f32_in("v", vv));
            }
            if let Some((m, dtype)) = mask {
                inputs.push(typed("m", m, dtype));
            }
            v.push(case(
                format!("{op} {attrs} q {q:?} k {k:?} mask {mask:?}"),
                single_op(op, attrs.clone(), &inputs, 1),
            ));
        }
    }
    // Recurrent family: every direction, both layouts, GRU's linear_before_reset, every
    // optional input (absent ones before given ones as zero-element tensors), uneven
    // sequence lengths.
    for (op, gates, outputs) in [("lstm", 4, 3), ("gru", 3, 2)] {
        let (seq, batch, input, h) = (5, 3, 4, 7);
        for (k, direction) in ["forward", "reverse", "bidirectional"].iter().enumerate() {
            let dirs = if k == 2 { 2 } else { 1 };
            let batch_first = k == 1;
            let mut attrs = json!({ "hidden_size": h, "direction": direction });
            if batch_first {
                attrs["layout"] = json!(1);
            }
            if op == "gru" && k != 1 {
                attrs["linear_before_reset"] = json!(1);
            }
            let x_shape = if batch_first {
                [batch, seq, input]
            } else {
                [seq, batch, input]
            };
            let state = if batch_first {
                [batch, dirs, h]
            } else {
                [dirs, batch, h]
            };
            let mut inputs = vec![
                f32_in("x", &x_shape),
                f32_in("w", &[dirs, gates * h, input]),
                f32_in("r", &[dirs, gates * h, h]),
            ];
            v.push(case(
                format!("{op} {attrs} defaults"),
                single_op(op, attrs.clone(), &inputs, outputs),
            ));
            inputs.push(f32_in("b", &[dirs, 2 * gates * h]));
            inputs.push(typed("lens", &[batch], "i32"));
            inputs.push(f32_in("h0", &state));
            if op == "lstm" {
                inputs.push(f32_in("c0", &state));
                inputs.push(f32_in("p", &[dirs, 3 * h]));
            }
            let mut c = case(
                format!("{op} {attrs} every input"),
                single_op(op, attrs.clone(), &inputs, outputs),
            );
            c.ints = vec![("lens", vec![5, 2, 0])];
            v.push(c);
        }
    }
    // Einsum: batched contractions, transposes, sums, dot products, outer products,
    // ellipsis broadcasting, implicit output.
    let einsums: [(&str, &[&[usize]]); 9] = [
        ("bij,bjk->bik", &[&[3, 5, 7], &[3, 7, 4]]),
        ("bhid,bhjd->bhij", &[&[2, 3, 5, 4], &[2, 3, 6, 4]]),
        ("ij->ji", &[&[37, 29]]),
        ("i,i->", &[&[33], &[33]]),
        ("bi,bi->b", &[&[5, 9], &[5, 9]]),
        ("ij->", &[&[7, 9]]),
        ("i,j->ij", &[&[5], &[7]]),
        ("...ij,...jk->...ik", &[&[2, 1, 3, 4], &[5, 4, 6]]),
        ("ikj,kl", &[&[3, 4, 5], &[4, 2]]),
    ];
    for (equation, shapes) in einsums {
        let inputs: Vec<_> = shapes
            .iter()
            .zip(["a", "b"])
            .map(|(s, n)| f32_in(n, s))
            .collect();
        v.push(case(
            format!("einsum {equation} {shapes:?}"),
            single_op("einsum", json!({ "equation": equation }), &inputs, 1),
        ));
    }
    for op in ["softmax_grad", "log_softmax_grad"] {
        for (shape, axis) in [(vec![37, 29], -1), (vec![3, 33, 5], 1), (vec![4, 7], 0)] {
            v.push(case(
                format!("{op} {shape:?} axis {axis}"),
                single_op(
                    op,
                    json!({ "axis": axis }),
                    &[f32_in("y", &shape), f32_in("dy", &shape)],
                    1,
                ),
            ));
        }
    }
    // Reductions long enough to be split across workgroups (two passes on the GPU). Last,
    // so that the cases before keep their seeds.
    for (shape, axes, keep) in [
        (vec![3, 70000], json!([1]), false),
        (vec![33000, 2, 3], json!([0, 2]), true),
        (vec![131075], json!(null), false),
    ] {
        v.extend(reductions(&shape, &axes, keep));
    }
    // Pointwise work fused into the reductions reading it. Last, as above.
    v.extend(prologue_cases().into_iter().map(|(c, _)| c));
    v
}

/// Reductions of pointwise work, `(case, fused)`: every kind that takes a prologue on
/// every kernel path (split with vec4 and scalar reads, trailing or not, one workgroup
/// per output, one thread per output), and graphs where fusing would be wrong (an
/// operand broadcast along the reduced axis, the pointwise result also an output, an
/// index reduction), with whether the planner should fuse each.
pub fn prologue_cases() -> Vec<(OpCase, bool)> {
    let kinds = [
        "reduce_sum",
        "reduce_mean",
        "reduce_max",
        "reduce_min",
        "reduce_prod",
        "reduce_l2",
    ];
    let mut v = Vec::new();
    for (shape, axes, keep) in [
        (vec![3, 70000], json!([1]), false),
        (vec![131075], json!(null), false),
        (vec![33000, 2, 3], json!([0, 2]), true),
        (vec![37, 300], json!([1]), false),
        (vec![5, 7, 3], json!([1]), true),
    ] {
        for op in kinds {
            let attrs = json!({ "axes": axes, "keepdims": keep });
            let doc = prologue_graph(op, attrs, &shape, &shape, false);
            let mut c = case(format!("{op} of pointwise work {shape:?} axes {axes}"), doc);
            c.half = op != "reduce_prod";
            v.push((c, true));
        }
    }
    let sum = json!({ "axes": [1], "keepdims": false });
    let no = |label: &str, doc: Value| (case(format!("reduce_sum not fused: {label}"), doc), false);
    v.push(no(
        "an operand broadcast along the reduced axis",
        prologue_graph("reduce_sum", sum.clone(), &[3, 70000], &[3, 1], false),
    ));
    v.push(no(
        "the pointwise result is an output too",
        prologue_graph("reduce_sum", sum, &[3, 70000], &[3, 70000], true),
    ));
    let argmax = prologue_graph("argmax", json!({ "axis": 1 }), &[4, 9], &[4, 9], false);
    let mut c = case("argmax not fused: an index reduction", argmax);
    c.half = false;
    v.push((c, false));
    v
}

/// `op` (attributes `attrs`) over `tanh(x·y + 0.5)·x` (odd in x and y together, so that
/// sums of many stay within f16's range), x of `shape` and y of `y_shape`; the pointwise
/// result is an output too when `expose`.
fn prologue_graph(
    op: &str,
    attrs: Value,
    shape: &[usize],
    y_shape: &[usize],
    expose: bool,
) -> Value {
    let outputs = if expose {
        json!(["r", "d"])
    } else {
        json!(["r"])
    };
    json!({
        "format": "sluice/graph@1",
        "inputs": {
            "x": { "shape": shape, "dtype": "f32" },
            "y": { "shape": y_shape, "dtype": "f32" }
        },
        "nodes": [
            { "id": "k", "op": "constant", "attrs": { "value": [0.5], "shape": [] } },
            { "id": "m", "op": "mul", "inputs": ["x", "y"] },
            { "id": "a", "op": "add", "inputs": ["m", "k"] },
            { "id": "s", "op": "tanh", "inputs": ["a"] },
            { "id": "d", "op": "mul", "inputs": ["s", "x"] },
            { "id": "r", "op": op, "inputs": ["d"], "attrs": attrs }
        ],
        "outputs": outputs,
    })
}

/// Every reduction of the family over `axes` of a `shape` input.
fn reductions(shape: &[usize], axes: &Value, keep: bool) -> Vec<OpCase> {
    let ops = [
        "reduce_sum",
        "reduce_mean",
        "reduce_max",
        "reduce_min",
        "reduce_prod",
        "reduce_l2",
    ];
    ops.into_iter()
        .map(|op| {
            let attrs = json!({ "axes": axes, "keepdims": keep });
            let mut c = case(
                format!("{op} {shape:?} axes {axes} keepdims {keep}"),
                single_op(op, attrs, &[x(shape)], 1),
            );
            // Products of many f16-rounded factors drift beyond a tolerance.
            c.half = op != "reduce_prod";
            c
        })
        .collect()
}
