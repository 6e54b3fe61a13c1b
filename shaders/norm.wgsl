// Normalisation family: softmax / log-softmax along an axis, layer norm over trailing
// axes, batch norm (inference) per channel. Binding 1 is the output, 2 the input, then
// weights. Statistics are computed in f32 with the max subtracted (softmax) and two passes
// (layer norm), so large inputs neither overflow nor lose precision.

//! variant softmax
// info = [rows, axis length, inner]; one invocation per (outer, inner) row.
@group(0) @binding(0) var<storage, read> info: array<u32>;
@group(0) @binding(1) var<storage, read_write> dst: array<f32>;
@group(0) @binding(2) var<storage, read> src: array<f32>;

@compute @workgroup_size({{WG}})
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = gid.x + gid.y * nwg.x * {{WG}}u;
    if (row >= info[0]) {
        return;
    }
    let len = info[1];
    let inner = info[2];
    let base = (row / inner) * len * inner + row % inner;
    var m = -3.4028234e38;
    for (var j = 0u; j < len; j = j + 1u) {
        m = max(m, src[base + j * inner]);
    }
    var s = 0.0;
    for (var j = 0u; j < len; j = j + 1u) {
        s = s + exp(src[base + j * inner] - m);
    }
    for (var j = 0u; j < len; j = j + 1u) {
        let v = src[base + j * inner] - m;
        dst[base + j * inner] = {{OUT}};
    }
}

//! variant layer_norm
// info = [rows, row length, epsilon bits]; one invocation per row; scale and bias have
// the row's shape.
@group(0) @binding(0) var<storage, read> info: array<u32>;
@group(0) @binding(1) var<storage, read_write> dst: array<f32>;
@group(0) @binding(2) var<storage, read> src: array<f32>;
@group(0) @binding(3) var<storage, read> scale: array<f32>;
@group(0) @binding(4) var<storage, read> bias: array<f32>;

@compute @workgroup_size({{WG}})
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = gid.x + gid.y * nwg.x * {{WG}}u;
    if (row >= info[0]) {
        return;
    }
    let len = info[1];
    let base = row * len;
    var mean = 0.0;
    for (var j = 0u; j < len; j = j + 1u) {
        mean = mean + src[base + j];
    }
    mean = mean / f32(len);
    var var_sum = 0.0;
    for (var j = 0u; j < len; j = j + 1u) {
        let d = src[base + j] - mean;
        var_sum = var_sum + d * d;
    }
    let inv = inverseSqrt(var_sum / f32(len) + bitcast<f32>(info[2]));
    for (var j = 0u; j < len; j = j + 1u) {
        dst[base + j] = (src[base + j] - mean) * inv * scale[j] + bias[j];
    }
}

//! variant batch_norm
// info = [n, channels, inner (H×W...), epsilon bits]; one invocation per element.
@group(0) @binding(0) var<storage, read> info: array<u32>;
@group(0) @binding(1) var<storage, read_write> dst: array<f32>;
@group(0) @binding(2) var<storage, read> src: array<f32>;
@group(0) @binding(3) var<storage, read> scale: array<f32>;
@group(0) @binding(4) var<storage, read> bias: array<f32>;
@group(0) @binding(5) var<storage, read> mean: array<f32>;
@group(0) @binding(6) var<storage, read> variance: array<f32>;

@compute @workgroup_size({{WG}})
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * {{WG}}u;
    if (i >= info[0]) {
        return;
    }
    let c = (i / info[2]) % info[1];
    let inv = inverseSqrt(variance[c] + bitcast<f32>(info[3]));
    dst[i] = (src[i] - mean[c]) * inv * scale[c] + bias[c];
}
