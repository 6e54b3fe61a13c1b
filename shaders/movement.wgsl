// Movement (reindex) family: every output element is one input element. Elements are
// copied as raw 32-bit words, so one kernel serves every dtype.

//! variant copy
// A strided copy over a domain: transpose, slice (any step), expand, concat pieces and
// split pieces. info = [n, rank, src base, dst base, domain shape, src strides (i32),
// dst strides].
@group(0) @binding(0) var<storage, read> info: array<u32>;
@group(0) @binding(1) var<storage, read_write> dst: array<u32>;
@group(0) @binding(2) var<storage, read> src: array<u32>;

@compute @workgroup_size({{WG}})
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * {{WG}}u;
    if (i >= info[0]) {
        return;
    }
    let rank = info[1];
    var rem = i;
    var s = i32(info[2]);
    var d = info[3];
    for (var k = rank; k > 0u; k = k - 1u) {
        let size = info[3u + k];
        let c = rem % size;
        rem = rem / size;
        s = s + i32(c) * bitcast<i32>(info[3u + rank + k]);
        d = d + c * info[3u + 2u * rank + k];
    }
    dst[d] = src[u32(s)];
}

//! variant gather
// out[o, j, r] = data[o, indices[j], r]; info = [n, axis length, index count, inner].
// Negative indices count from the end; out-of-range ones are rejected on the host.
@group(0) @binding(0) var<storage, read> info: array<u32>;
@group(0) @binding(1) var<storage, read_write> dst: array<u32>;
@group(0) @binding(2) var<storage, read> src: array<u32>;
@group(0) @binding(3) var<storage, read> indices: array<i32>;

@compute @workgroup_size({{WG}})
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * {{WG}}u;
    if (i >= info[0]) {
        return;
    }
    let len = info[1];
    let count = info[2];
    let inner = info[3];
    let r = i % inner;
    let j = (i / inner) % count;
    let o = i / (inner * count);
    var k = indices[j];
    if (k < 0) {
        k = k + i32(len);
    }
    let kk = u32(clamp(k, 0, i32(len) - 1));
    dst[i] = src[(o * len + kk) * inner + r];
}
