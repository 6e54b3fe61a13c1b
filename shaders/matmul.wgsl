// Matmul family: C[b] = A[b] · B[b] (+ bias) for batched, broadcast matrix products.
// Filled by engine/src/ops/matmul.rs. `info` = [M, N, K, batches, then per batch: A offset,
// B offset] in elements. Each variant below is a complete shader.

//! variant vec4
// Register-blocked: each invocation computes a 4×4 block of C with vec4 loads along K of A
// and along N of B. Needs K % 4 == 0 and N % 4 == 0. On software rasterisers (lavapipe)
// this beats shared-memory tiling, whose barriers are expensive there.
@group(0) @binding(0) var<storage, read> info: array<u32>;
@group(0) @binding(1) var<storage, read> a: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> b: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> c: array<vec4<f32>>;
{{BIAS_DECL}}
{{HELPERS}}
{{EP}}

fn epilogue(v: vec4<f32>, col4: u32) -> vec4<f32> {
    let b = {{BIAS}};
    let c = col4 * 4u;
    return vec4<f32>(ep(v.x + b.x, c), ep(v.y + b.y, c + 1u), ep(v.z + b.z, c + 2u), ep(v.w + b.w, c + 3u));
}

@compute @workgroup_size(8, 8, 1)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let m = info[0];
    let n4 = info[1] / 4u;
    let k4 = info[2] / 4u;
    let batch = gid.z;
    let col4 = gid.x;
    let row0 = gid.y * 4u;
    if (col4 >= n4 || row0 >= m) {
        return;
    }
    let a_base = info[4u + 2u * batch] / 4u;
    let b_base = info[5u + 2u * batch] / 4u + col4;
    let ra0 = a_base + row0 * k4;
    let ra1 = a_base + min(row0 + 1u, m - 1u) * k4;
    let ra2 = a_base + min(row0 + 2u, m - 1u) * k4;
    let ra3 = a_base + min(row0 + 3u, m - 1u) * k4;
    var acc0 = vec4<f32>(0.0);
    var acc1 = vec4<f32>(0.0);
    var acc2 = vec4<f32>(0.0);
    var acc3 = vec4<f32>(0.0);
    for (var k = 0u; k < k4; k = k + 1u) {
        let kb = b_base + k * 4u * n4;
        let b0 = b[kb];
        let b1 = b[kb + n4];
        let b2 = b[kb + 2u * n4];
        let b3 = b[kb + 3u * n4];
        let a0 = a[ra0 + k];
        let a1 = a[ra1 + k];
        let a2 = a[ra2 + k];
        let a3 = a[ra3 + k];
        acc0 = fma(vec4<f32>(a0.x), b0, fma(vec4<f32>(a0.y), b1, fma(vec4<f32>(a0.z), b2, fma(vec4<f32>(a0.w), b3, acc0))));
        acc1 = fma(vec4<f32>(a1.x), b0, fma(vec4<f32>(a1.y), b1, fma(vec4<f32>(a1.z), b2, fma(vec4<f32>(a1.w), b3, acc1))));
        acc2 = fma(vec4<f32>(a2.x), b0, fma(vec4<f32>(a2.y), b1, fma(vec4<f32>(a2.z), b2, fma(vec4<f32>(a2.w), b3, acc2))));
        acc3 = fma(vec4<f32>(a3.x), b0, fma(vec4<f32>(a3.y), b1, fma(vec4<f32>(a3.z), b2, fma(vec4<f32>(a3.w), b3, acc3))));
    }
    let c_base = batch * m * n4 + col4;
    c[c_base + row0 * n4] = epilogue(acc0, col4);
    if (row0 + 1u < m) {
        c[c_base + (row0 + 1u) * n4] = epilogue(acc1, col4);
    }
    if (row0 + 2u < m) {
        c[c_base + (row0 + 2u) * n4] = epilogue(acc2, col4);
    }
    if (row0 + 3u < m) {
        c[c_base + (row0 + 3u) * n4] = epilogue(acc3, col4);
    }
}

//! variant scalar
// Any shape: one invocation per element of C.
@group(0) @binding(0) var<storage, read> info: array<u32>;
@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read> b: array<f32>;
@group(0) @binding(3) var<storage, read_write> c: array<f32>;
{{BIAS_DECL}}
{{HELPERS}}
{{EP}}

fn epilogue(v: f32, col: u32) -> f32 {
    return ep(v + {{BIAS}}, col);
}

@compute @workgroup_size({{WG}})
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let idx = gid.x + gid.y * nwg.x * {{WG}}u;
    let m = info[0];
    let n = info[1];
    let k = info[2];
    if (idx >= m * n * info[3]) {
        return;
    }
    let col = idx % n;
    let row = (idx / n) % m;
    let batch = idx / (m * n);
    let ra = info[4u + 2u * batch] + row * k;
    let cb = info[5u + 2u * batch] + col;
    var acc = 0.0;
    for (var i = 0u; i < k; i = i + 1u) {
        acc = fma(a[ra + i], b[cb + i * n], acc);
    }
    c[idx] = epilogue(acc, col);
}
