//! Hostile inputs shared by the adversarial suite and the soak: graph documents whose
//! sizes, ranks, lists or arithmetic are out of bounds, `.npy` files whose headers lie,
//! and large documents that stress graph analysis. Each is small to send and would be
//! huge, slow or overflowing to honour.
//!
//! Included by the test files with `#[path]`, like `attack.rs`.

#![allow(dead_code)] // Each test file uses its own part of the inputs.

use serde_json::{json, Value};

/// 2^63, the first size past `i64::MAX`.
pub const TWO_63: u64 = 1 << 63;

/// A `sluice/graph@1` document.
pub fn doc(inputs: Value, nodes: Value, outputs: &[&str]) -> Value {
    json!({ "format": "sluice/graph@1", "inputs": inputs, "nodes": nodes, "outputs": outputs })
}

/// A graph of one node `n` of `op` over an f32 input `x` of `shape`.
pub fn one_op(shape: Value, op: &str, attrs: Value) -> Value {
    doc(
        json!({ "x": { "shape": shape, "dtype": "f32" } }),
        json!([{ "id": "n", "op": op, "inputs": ["x"], "attrs": attrs }]),
        &["n"],
    )
}

/// A `linear` of `out_features` outputs on `[N, 4]`: 2^33 needs 128 GiB of weights.
pub fn huge_linear(out_features: u64) -> Value {
    one_op(
        json!(["N", 4]),
        "linear",
        json!({ "out_features": out_features }),
    )
}

/// An input of rank `rank` (all ones) through a `relu`.
pub fn rank(rank: usize) -> Value {
    one_op(json!(vec![1; rank]), "relu", json!({}))
}

/// A `reshape` whose `shape` list has `len` entries (`[-1, 1, 1, ...]`: valid but for
/// its length).
pub fn long_list(len: usize) -> Value {
    let mut shape = vec![1i64; len];
    shape[0] = -1;
    one_op(json!(["N", 4]), "reshape", json!({ "shape": shape }))
}

/// An input whose batch symbol is `len` characters long.
pub fn long_symbol(len: usize) -> Value {
    one_op(json!(["S".repeat(len), 4]), "relu", json!({}))
}

/// An input with `count` distinct symbolic dimensions.
pub fn many_symbols(count: usize) -> Value {
    let dims: Vec<String> = (0..count).map(|i| format!("s{i}")).collect();
    one_op(json!(dims), "relu", json!({}))
}

/// A graph with `count` inputs, all added up by one `concat`.
pub fn many_inputs(count: usize) -> Value {
    let inputs: serde_json::Map<String, Value> = (0..count)
        .map(|i| (format!("i{i}"), json!({ "shape": [1], "dtype": "f32" })))
        .collect();
    let names: Vec<String> = (0..count).map(|i| format!("i{i}")).collect();
    doc(
        Value::Object(inputs),
        json!([{ "id": "c", "op": "concat", "inputs": names, "attrs": { "axis": 0 } }]),
        &["c"],
    )
}

/// A chain of `len` `relu` nodes on `[N, 4]` (long ids make it `len` × ~100 bytes).
pub fn chain(len: usize) -> Value {
    let id = |i: usize| format!("node_{i:06}_{}", "x".repeat(40));
    let nodes: Vec<Value> = (0..len)
        .map(|i| {
            let input = if i == 0 { "x".to_string() } else { id(i - 1) };
            json!({ "id": id(i), "op": "relu", "inputs": [input] })
        })
        .collect();
    let last = id(len - 1);
    doc(
        json!({ "x": { "shape": ["N", 4], "dtype": "f32" } }),
        Value::Array(nodes),
        &[last.as_str()],
    )
}

/// `len` `relu` nodes on one input, every one of them an output, twice (output lookups).
pub fn many_outputs(len: usize) -> Value {
    let nodes: Vec<Value> = (0..len)
        .map(|i| json!({ "id": format!("o{i}"), "op": "relu", "inputs": ["x"] }))
        .collect();
    let outputs: Vec<String> = (0..2 * len).map(|i| format!("o{}", i % len)).collect();
    json!({
        "format": "sluice/graph@1",
        "inputs": { "x": { "shape": ["N", 4], "dtype": "f32" } },
        "nodes": nodes,
        "outputs": outputs,
    })
}

/// `slice` of an input of `shape` with these attributes.
pub fn slice(shape: Value, starts: Value, ends: Value, steps: Value) -> Value {
    one_op(
        shape,
        "slice",
        json!({ "starts": starts, "ends": ends, "axes": [0], "steps": steps }),
    )
}

/// `concat` of two inputs of 2^63 - 1 elements along axis 0: the total overflows.
pub fn concat_overflow() -> Value {
    let big = TWO_63 - 1;
    doc(
        json!({ "a": { "shape": [big], "dtype": "f32" }, "b": { "shape": [big], "dtype": "f32" } }),
        json!([{ "id": "c", "op": "concat", "inputs": ["a", "b"], "attrs": { "axis": 0 } }]),
        &["c"],
    )
}

/// `split` with sizes adding up past `u64::MAX`.
pub fn split_overflow() -> Value {
    let s = TWO_63 - 1;
    one_op(
        json!([8]),
        "split",
        json!({ "axis": 0, "sizes": [s, s, s, 8] }),
    )
}

/// `conv2d` whose padded size overflows.
pub fn conv_pad_overflow() -> Value {
    let p = i64::MAX;
    one_op(
        json!(["N", 1, 8, 8]),
        "conv2d",
        json!({ "out_channels": 1, "kernel_size": [3, 3], "pads": [p, p, p, p] }),
    )
}

/// `conv2d` whose dilated kernel overflows.
pub fn conv_dilation_overflow() -> Value {
    one_op(
        json!(["N", 1, 8, 8]),
        "conv2d",
        json!({ "out_channels": 1, "kernel_size": [3, 3], "dilations": [i64::MAX, i64::MAX] }),
    )
}

/// `linear` on an input whose fan-in is 2^62: the weights' element count overflows.
pub fn fan_in_overflow() -> Value {
    one_op(
        json!(["N", 1u64 << 62]),
        "linear",
        json!({ "out_features": 16 }),
    )
}

/// An input of 2^96 elements.
pub fn numel_overflow() -> Value {
    let d = 1u64 << 32;
    one_op(json!([d, d, d]), "relu", json!({}))
}

/// `clip` with `min` and `max`.
pub fn clip(min: f64, max: f64) -> Value {
    one_op(json!(["N", 4]), "clip", json!({ "min": min, "max": max }))
}

/// A valid `relu` graph whose only node has this id (file-name attacks on outputs).
pub fn node_named(id: &str) -> Value {
    doc(
        json!({ "x": { "shape": ["N", 4], "dtype": "f32" } }),
        json!([{ "id": id, "op": "relu", "inputs": ["x"] }]),
        &[id],
    )
}

/// A `.npy` version 1 file: the header as given, padded, and `data` after it.
pub fn npy(header: &str, data: &[u8]) -> Vec<u8> {
    let mut h = header.to_string();
    let total = (10 + h.len() + 1).div_ceil(64) * 64;
    h.push_str(&" ".repeat(total - 10 - h.len() - 1));
    h.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(h.len() as u16).to_le_bytes());
    out.extend_from_slice(h.as_bytes());
    out.extend_from_slice(data);
    out
}

/// A `.npy` header dictionary.
pub fn npy_dict(descr: &str, fortran: bool, shape: &str) -> String {
    format!(
        "{{'descr': '{descr}', 'fortran_order': {}, 'shape': {shape}, }}",
        if fortran { "True" } else { "False" }
    )
}

/// A `.npy` file whose (version 1) header length field says `len` but holds less.
pub fn npy_header_len_lie(len: u16) -> Vec<u8> {
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(b"{'descr': '<f4'");
    out
}

/// A version 2 `.npy` file whose header length field says 4 GiB.
pub fn npy_v2_header_len_lie() -> Vec<u8> {
    let mut out = b"\x93NUMPY\x02\x00".to_vec();
    out.extend_from_slice(&u32::MAX.to_le_bytes());
    out.extend_from_slice(b"{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }\n");
    out
}

/// Base64 of bytes (for run requests' `inputs`).
pub fn b64(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}
