// Reduce family: sum (times a scale, for means) over a set of axes.
// info = [n_out, count, kept_rank, red_rank, red_contiguous, scale bits,
//         kept shape, kept strides, reduced shape, reduced strides].
// Binding 1 is the output, binding 2 the input.

//! variant common
@group(0) @binding(0) var<storage, read> info: array<u32>;
@group(0) @binding(1) var<storage, read_write> dst: array<f32>;
@group(0) @binding(2) var<storage, read> src: array<f32>;

fn base_offset(o: u32) -> u32 {
    let kr = info[2];
    var rem = o;
    var off = 0u;
    for (var d = kr; d > 0u; d = d - 1u) {
        let size = info[5u + d];
        off = off + (rem % size) * info[5u + kr + d];
        rem = rem / size;
    }
    return off;
}

fn red_offset(r: u32) -> u32 {
    if (info[4] == 1u) {
        return r;
    }
    let kr = info[2];
    let rr = info[3];
    let first = 6u + 2u * kr;
    var rem = r;
    var off = 0u;
    for (var d = rr; d > 0u; d = d - 1u) {
        let size = info[first + d - 1u];
        off = off + (rem % size) * info[first + rr + d - 1u];
        rem = rem / size;
    }
    return off;
}

//! variant thread
// One invocation per output element: for many outputs with short reductions.
@compute @workgroup_size({{WG}})
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let o = gid.x + gid.y * nwg.x * {{WG}}u;
    if (o >= info[0]) {
        return;
    }
    let base = base_offset(o);
    var acc = 0.0;
    for (var r = 0u; r < info[1]; r = r + 1u) {
        acc = acc + src[base + red_offset(r)];
    }
    dst[o] = acc * bitcast<f32>(info[5]);
}

//! variant group
// One workgroup per output element, a tree in workgroup memory: for long reductions.
var<workgroup> partial: array<f32, {{WG}}>;

@compute @workgroup_size({{WG}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32, @builtin(num_workgroups) nwg: vec3<u32>) {
    let o = wid.x + wid.y * nwg.x;
    if (o >= info[0]) {
        return;
    }
    let base = base_offset(o);
    var acc = 0.0;
    for (var r = lid; r < info[1]; r = r + {{WG}}u) {
        acc = acc + src[base + red_offset(r)];
    }
    partial[lid] = acc;
    workgroupBarrier();
    for (var s = {{WG}}u / 2u; s > 0u; s = s / 2u) {
        if (lid < s) {
            partial[lid] = partial[lid] + partial[lid + s];
        }
        workgroupBarrier();
    }
    if (lid == 0u) {
        dst[o] = partial[0] * bitcast<f32>(info[5]);
    }
}
