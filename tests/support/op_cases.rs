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
}

fn case(label: impl Into<String>, doc: Value) -> OpCase {
    OpCase {
        label: label.into(),
        doc,
        positive: false,
        ints: Vec::new(),
    }
}

fn x(shape: &[usize]) -> In<'static> {
    In {
        name: "x",
        shape: shape.to_vec(),
        dtype: "f32",
    }
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
    ] {
        for op in ["reduce_sum", "reduce_mean"] {
            v.push(case(
                format!("{op} {shape:?} axes {axes} keepdims {keep}"),
                single_op(
                    op,
                    json!({ "axes": axes, "keepdims": keep }),
                    &[x(&shape)],
                    1,
                ),
            ));
        }
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
    v
}
