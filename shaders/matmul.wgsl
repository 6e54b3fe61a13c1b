// Matmul family: C[b] = A[b] · B[b] (+ bias, + fused epilogue) for batched, broadcast
// matrix products. Filled by engine/src/ops/matmul.rs, which also declares the bindings
// and their load/store functions for the storage in use (f32, f16, or f16 pairs packed in
// u32). Accumulation is in {{ACC}} (f32 unless the plan runs in f16). `info` = [M, N, K,
// batches, then per batch: A offset, B offset] in elements. Each variant below is the
// body of a complete shader.

//! variant vec4
// Register-blocked: each invocation computes a 4×4 block of C with vec4 loads along K of A
// and along N of B. Needs K % 4 == 0 and N % 4 == 0. On software rasterisers (lavapipe)
// this beats shared-memory tiling, whose barriers are expensive there.
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
    var acc0 = vec4<{{ACC}}>(0.0);
    var acc1 = vec4<{{ACC}}>(0.0);
    var acc2 = vec4<{{ACC}}>(0.0);
    var acc3 = vec4<{{ACC}}>(0.0);
    for (var k = 0u; k < k4; k = k + 1u) {
        let kb = b_base + k * 4u * n4;
        let b0 = vec4<{{ACC}}>(ld4_b(kb));
        let b1 = vec4<{{ACC}}>(ld4_b(kb + n4));
        let b2 = vec4<{{ACC}}>(ld4_b(kb + 2u * n4));
        let b3 = vec4<{{ACC}}>(ld4_b(kb + 3u * n4));
        let a0 = vec4<{{ACC}}>(ld4_a(ra0 + k));
        let a1 = vec4<{{ACC}}>(ld4_a(ra1 + k));
        let a2 = vec4<{{ACC}}>(ld4_a(ra2 + k));
        let a3 = vec4<{{ACC}}>(ld4_a(ra3 + k));
        acc0 = fma(vec4<{{ACC}}>(a0.x), b0, fma(vec4<{{ACC}}>(a0.y), b1, fma(vec4<{{ACC}}>(a0.z), b2, fma(vec4<{{ACC}}>(a0.w), b3, acc0))));
        acc1 = fma(vec4<{{ACC}}>(a1.x), b0, fma(vec4<{{ACC}}>(a1.y), b1, fma(vec4<{{ACC}}>(a1.z), b2, fma(vec4<{{ACC}}>(a1.w), b3, acc1))));
        acc2 = fma(vec4<{{ACC}}>(a2.x), b0, fma(vec4<{{ACC}}>(a2.y), b1, fma(vec4<{{ACC}}>(a2.z), b2, fma(vec4<{{ACC}}>(a2.w), b3, acc2))));
        acc3 = fma(vec4<{{ACC}}>(a3.x), b0, fma(vec4<{{ACC}}>(a3.y), b1, fma(vec4<{{ACC}}>(a3.z), b2, fma(vec4<{{ACC}}>(a3.w), b3, acc3))));
    }
    let c_base = batch * m * n4 + col4;
    st4_c(c_base + row0 * n4, epilogue(vec4<f32>(acc0), col4));
    if (row0 + 1u < m) {
        st4_c(c_base + (row0 + 1u) * n4, epilogue(vec4<f32>(acc1), col4));
    }
    if (row0 + 2u < m) {
        st4_c(c_base + (row0 + 2u) * n4, epilogue(vec4<f32>(acc2), col4));
    }
    if (row0 + 3u < m) {
        st4_c(c_base + (row0 + 3u) * n4, epilogue(vec4<f32>(acc3), col4));
    }
}

//! variant scalar
// Any shape: the value of one element of C (the entry point is generated per storage).
fn value(idx: u32) -> f32 {
    let m = info[0];
    let n = info[1];
    let k = info[2];
    let col = idx % n;
    let row = (idx / n) % m;
    let batch = idx / (m * n);
    let ra = info[4u + 2u * batch] + row * k;
    let cb = info[5u + 2u * batch] + col;
    var acc = {{ACC}}(0.0);
    for (var i = 0u; i < k; i = i + 1u) {
        acc = fma({{ACC}}(ld_a(ra + i)), {{ACC}}(ld_b(cb + i * n)), acc);
    }
    return ep(f32(acc) + {{BIAS}}, col);
}
