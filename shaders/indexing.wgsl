// Indexing family: one invocation per output element computes `value_t(i)`, of type
// {{T}} (f32, or i32 for i32 data; f32 for 16-bit storages). The lowering
// (engine/src/gpu/lower/indexing.rs) generates the bindings, a `get_NAME(i) -> {{T}}`
// loader for every data binding, and the entry point: `main_words` stores {{T}}
// elements directly, `main_half` goes through `value(i)` and the generated 16-bit
// entry point. Integer indices are `array<i32>` bindings read directly.
//
// Out-of-range indices never reach memory: gathers clamp them into their axis, scatters
// skip their updates (the CPU reference refuses them).

//! variant main_words
@compute @workgroup_size({{WG}})
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * {{WG}}u;
    if (i >= info[0]) {
        return;
    }
    dst[i] = value_t(i);
}

//! variant main_half
fn value(i: u32) -> f32 {
    return f32(value_t(i));
}

//! variant resolve
// Index k along an axis of length len, negative counting from the end; `ok` says whether
// it lies inside, `at` is it clamped inside (len > 0, checked by the lowering).
struct Resolved {
    at: u32,
    ok: bool,
}

fn resolve(k: i32, len: u32) -> Resolved {
    var kk = k;
    if (kk < 0) {
        kk = kk + i32(len);
    }
    let ok = kk >= 0 && kk < i32(len);
    return Resolved(u32(clamp(kk, 0, i32(len) - 1)), ok);
}

//! variant gather_elements
// info = [n, rank, axis, axis length, output (indices) shape × rank, data strides × rank].
fn value_t(i: u32) -> {{T}} {
    let rank = info[1];
    let axis = info[2];
    let k = resolve(idx[i], info[3]).at;
    var rem = i;
    var off = 0u;
    for (var d = rank; d > 0u; d = d - 1u) {
        let size = info[3u + d];
        var c = rem % size;
        rem = rem / size;
        if (d - 1u == axis) {
            c = k;
        }
        off = off + c * info[3u + rank + d];
    }
    return get_src(off);
}

//! variant scatter_elements
// info = [n, rank, axis, axis length, data shape × rank, indices shape × rank,
//         indices strides × rank]. Element i of data gathers every update whose index
// lands on it, in order.
fn value_t(i: u32) -> {{T}} {
    let rank = info[1];
    let axis = info[2];
    var acc = get_src(i);
    var rem = i;
    var base = 0u;
    var want = 0u;
    for (var d = rank; d > 0u; d = d - 1u) {
        let size = info[3u + d];
        let c = rem % size;
        rem = rem / size;
        if (d - 1u == axis) {
            want = c;
        } else {
            if (c >= info[3u + rank + d]) {
                return acc;
            }
            base = base + c * info[3u + 2u * rank + d];
        }
    }
    let count = info[3u + rank + axis + 1u];
    let step = info[3u + 2u * rank + axis + 1u];
    for (var j = 0u; j < count; j = j + 1u) {
        let p = base + j * step;
        let r = resolve(idx[p], info[3]);
        if (r.ok && r.at == want) {
            acc = combine(acc, get_upd(p));
        }
    }
    return acc;
}

//! variant gather_nd
// info = [n, m, slice size, tuples per batch, data elements per batch, data dims × m,
//         data strides × m] (the m axes the tuples address).
fn value_t(i: u32) -> {{T}} {
    let m = info[1];
    let slice = info[2];
    let per = info[3];
    let s = i % slice;
    let t = i / slice;
    let batch = t / per;
    var off = batch * info[4] + s;
    for (var j = 0u; j < m; j = j + 1u) {
        off = off + resolve(idx[t * m + j], info[5u + j]).at * info[5u + m + j];
    }
    return get_src(off);
}

//! variant scatter_nd
// info = [n, m, slice size, tuple count, data dims × m, data strides × m]. Element i of
// data gathers every update slice whose tuple addresses its slice, in order.
fn value_t(i: u32) -> {{T}} {
    let m = info[1];
    let slice = info[2];
    let s = i % slice;
    let cell = i - s;
    var acc = get_src(i);
    for (var t = 0u; t < info[3]; t = t + 1u) {
        var off = 0u;
        var ok = true;
        for (var j = 0u; j < m; j = j + 1u) {
            let r = resolve(idx[t * m + j], info[4u + j]);
            ok = ok && r.ok;
            off = off + r.at * info[4u + m + j];
        }
        if (ok && off == cell) {
            acc = combine(acc, get_upd(t * slice + s));
        }
    }
    return acc;
}

//! variant tile
// info = [n, rank, output shape × rank, input shape × rank, input strides × rank].
fn value_t(i: u32) -> {{T}} {
    let rank = info[1];
    var rem = i;
    var off = 0u;
    for (var d = rank; d > 0u; d = d - 1u) {
        let size = info[1u + d];
        let c = rem % size;
        rem = rem / size;
        off = off + (c % info[1u + rank + d]) * info[1u + 2u * rank + d];
    }
    return get_src(off);
}

//! variant trilu
// info = [n, rows, cols, k (i32 bits), upper].
fn value_t(i: u32) -> {{T}} {
    let cols = info[2];
    let row = i32((i / cols) % info[1]);
    let col = i32(i % cols);
    let k = bitcast<i32>(info[3]);
    var keep = col - row <= k;
    if (info[4] == 1u) {
        keep = col - row >= k;
    }
    return select({{T}}(0), get_src(i), keep);
}

//! variant range
// info = [n, start bits, delta bits].
fn value_t(i: u32) -> {{T}} {
    return bitcast<{{T}}>(info[1]) + {{T}}(i) * bitcast<{{T}}>(info[2]);
}

//! variant fill
// shape and constant_of_shape: info = [n, per element, values]: element i is value i when
// per element is 1 (a shape's dimensions), else the one value.
fn value_t(i: u32) -> {{T}} {
    return bitcast<{{T}}>(info[2u + select(0u, i, info[1] == 1u)]);
}

//! variant combine
fn combine(a: {{T}}, b: {{T}}) -> {{T}} {
    return {{COMBINE}};
}
