// Matmul family: C[b] = A[b] · B[b] (+ bias, + fused epilogue) for batched, broadcast
// matrix products. Filled by engine/src/gpu/lower/matmul.rs, which also declares the bindings
// and their load/store functions for the storage in use (f32, f16, or f16 pairs packed in
// u32). Accumulation is in {{ACC}} (f32 unless the plan runs in f16). `info` = [M, N, K,
// batches, then per batch: A offset, B offset] in elements. Each variant below is the
// body of a complete shader.

//! variant epilogue
// The bias and the fused epilogue of four neighbouring columns (every vec4 variant).
fn epilogue(v: vec4<f32>, col4: u32) -> vec4<f32> {
    let b = {{BIAS}};
    let c = col4 * 4u;
    return vec4<f32>(ep(v.x + b.x, c), ep(v.y + b.y, c + 1u), ep(v.z + b.z, c + 2u), ep(v.w + b.w, c + 3u));
}

//! variant blocked
// Register-blocked: each invocation computes {{ROWS}} rows × {{COLS}} vec4 columns of C
// with vec4 loads along K of A and along N of B, no workgroup memory (on software
// rasterisers such as lavapipe, barriers are expensive). Needs K % 4 == 0 and N % 4 == 0.
// The block's statements are generated (engine/src/gpu/lower/matmul.rs, `blocked`);
// every variant adds the products of each k in the same order, so all give the same bits.
@compute @workgroup_size({{WX}}, {{WY}}, 1)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let m = info[0];
    let n4 = info[1] / 4u;
    let k4 = info[2] / 4u;
    let batch = gid.z;
    let col4 = gid.x * {{COLS}}u;
    let row0 = gid.y * {{ROWS}}u;
    if (col4 >= n4 || row0 >= m) {
        return;
    }
    let a_base = info[4u + 2u * batch] / 4u;
    let b_base = info[5u + 2u * batch] / 4u;
{{SETUP}}
    for (var k = 0u; k < k4; k = k + 1u) {
{{STEP}}
    }
    let c_base = batch * m * n4;
{{STORE}}
}

//! variant textured
// The register blocks of `blocked`, with A and B read from rgba32float textures (filled by
// `pack` passes just before): on software rasterisers such as lavapipe a texel fetch
// gathers a vec4 per invocation at once, where a storage-buffer load goes lane by lane.
// One batch; the block's statements are generated (`blocked` in
// engine/src/gpu/lower/matmul.rs) and add the products in the blocked order, so the bits
// are the same.
@group(0) @binding(1) var tex_a: texture_2d<f32>;
@group(0) @binding(2) var tex_b: texture_2d<f32>;

@compute @workgroup_size({{WX}}, {{WY}}, 1)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let m = info[0];
    let n4 = info[1] / 4u;
    let k4 = info[2] / 4u;
    let col4 = gid.x * {{COLS}}u;
    let row0 = gid.y * {{ROWS}}u;
    if (col4 >= n4 || row0 >= m) {
        return;
    }
{{SETUP}}
    for (var k = 0u; k < k4; k = k + 1u) {
{{STEP}}
    }
    let c_base = 0u;
{{STORE}}
}

//! variant subgroup
// The register blocks of `textured`, with the lanes of a subgroup sharing their rows of A:
// each subgroup is one row of the workgroup ({{LANES}} lanes side by side along the
// columns, so all need the same {{ROWS}} rows), each lane fetches the texels of
// {{ROWS}} / {{LANES}} of those rows per step, and subgroupBroadcast hands every row to
// every lane. On lavapipe, where each texel fetch is a call, that is {{ROWS}} / {{LANES}}
// fetches of A per step instead of {{ROWS}}. Lanes and rows come from the subgroup
// builtins, so the subgroups must have exactly {{LANES}} lanes
// (`MatmulVariant::runs_on`). No lane leaves early: every lane fetches rows for the others
// (indices are clamped, stores guarded). Adds the products in the blocked order: the same
// bits.
@group(0) @binding(1) var tex_a: texture_2d<f32>;
@group(0) @binding(2) var tex_b: texture_2d<f32>;

@compute @workgroup_size({{INVOCATIONS}}, 1, 1)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(subgroup_id) subgroup: u32, @builtin(subgroup_invocation_id) lane: u32) {
    let m = info[0];
    let n4 = info[1] / 4u;
    let k4 = info[2] / 4u;
    let col4 = (wid.x * {{LANES}}u + lane) * {{COLS}}u;
    let row0 = (wid.y * {{WY}}u + subgroup) * {{ROWS}}u;
{{SETUP}}
    for (var k = 0u; k < k4; k = k + 1u) {
{{STEP}}
    }
    let c_base = 0u;
{{STORE}}
}

//! variant pack
// Copies a row-major matrix of `info[0]` rows × `info[1]` vec4 columns, starting at vec4
// `info[2]` of `src`, into the rgba32float texture `dst` (texel (column, row)).
@group(0) @binding(2) var dst: texture_storage_2d<rgba32float, write>;

@compute @workgroup_size(8, 8, 1)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    if (gid.x < info[1] && gid.y < info[0]) {
        textureStore(dst, vec2<u32>(gid.x, gid.y), ld4_src(info[2] + gid.y * info[1] + gid.x));
    }
}

//! variant tiled
// Shared-memory tiling: a 16×16 workgroup computes a 64×64 tile of C, each invocation 4
// rows × one vec4 column, staging 64×16 of A and 16×64 of B in workgroup memory per step
// of 16 along K (zeros past the edges). For GPUs with fast workgroup memory. Needs
// K % 4 == 0 and N % 4 == 0.
var<workgroup> tile_a: array<vec4<{{ACC}}>, 256>;
var<workgroup> tile_b: array<vec4<{{ACC}}>, 256>;

@compute @workgroup_size(16, 16, 1)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let m = info[0];
    let n4 = info[1] / 4u;
    let k4 = info[2] / 4u;
    let batch = wid.z;
    let a_base = info[4u + 2u * batch] / 4u;
    let b_base = info[5u + 2u * batch] / 4u;
    let t = lid.y * 16u + lid.x;
    let col4 = wid.x * 16u + lid.x;
    let row0 = wid.y * 64u + lid.y * 4u;
    // What this invocation stages: a vec4 of A (row t/4 of the tile, k quad t%4) and a
    // vec4 of B (k row t/16 of the tile, column t%16).
    let a_row = wid.y * 64u + t / 4u;
    let b_col = wid.x * 16u + t % 16u;
    var acc0 = vec4<{{ACC}}>(0.0);
    var acc1 = vec4<{{ACC}}>(0.0);
    var acc2 = vec4<{{ACC}}>(0.0);
    var acc3 = vec4<{{ACC}}>(0.0);
    for (var k0 = 0u; k0 < k4; k0 = k0 + 4u) {
        let ak = k0 + t % 4u;
        var av = vec4<{{ACC}}>(0.0);
        if (a_row < m && ak < k4) {
            av = vec4<{{ACC}}>(ld4_a(a_base + a_row * k4 + ak));
        }
        tile_a[t] = av;
        let bk = k0 * 4u + t / 16u;
        var bv = vec4<{{ACC}}>(0.0);
        if (bk < k4 * 4u && b_col < n4) {
            bv = vec4<{{ACC}}>(ld4_b(b_base + bk * n4 + b_col));
        }
        tile_b[t] = bv;
        workgroupBarrier();
        for (var q = 0u; q < 4u; q = q + 1u) {
            let b0 = tile_b[q * 64u + lid.x];
            let b1 = tile_b[q * 64u + 16u + lid.x];
            let b2 = tile_b[q * 64u + 32u + lid.x];
            let b3 = tile_b[q * 64u + 48u + lid.x];
            let a0 = tile_a[lid.y * 16u + q];
            let a1 = tile_a[lid.y * 16u + 4u + q];
            let a2 = tile_a[lid.y * 16u + 8u + q];
            let a3 = tile_a[lid.y * 16u + 12u + q];
            acc0 = fma(vec4<{{ACC}}>(a0.x), b0, fma(vec4<{{ACC}}>(a0.y), b1, fma(vec4<{{ACC}}>(a0.z), b2, fma(vec4<{{ACC}}>(a0.w), b3, acc0))));
            acc1 = fma(vec4<{{ACC}}>(a1.x), b0, fma(vec4<{{ACC}}>(a1.y), b1, fma(vec4<{{ACC}}>(a1.z), b2, fma(vec4<{{ACC}}>(a1.w), b3, acc1))));
            acc2 = fma(vec4<{{ACC}}>(a2.x), b0, fma(vec4<{{ACC}}>(a2.y), b1, fma(vec4<{{ACC}}>(a2.z), b2, fma(vec4<{{ACC}}>(a2.w), b3, acc2))));
            acc3 = fma(vec4<{{ACC}}>(a3.x), b0, fma(vec4<{{ACC}}>(a3.y), b1, fma(vec4<{{ACC}}>(a3.z), b2, fma(vec4<{{ACC}}>(a3.w), b3, acc3))));
        }
        workgroupBarrier();
    }
    if (col4 >= n4) {
        return;
    }
    let c_base = batch * m * n4 + col4;
    if (row0 < m) {
        st4_c(c_base + row0 * n4, epilogue(vec4<f32>(acc0), col4));
    }
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
