// Elementwise family: unary, binary with numpy broadcasting, and `where`; i32 arithmetic
// and `where` over i32 or bool values in the `words` variant.
// Filled by engine/src/gpu/lower/elementwise.rs: {{LOADS}} reads x0.. for element i, {{BODY}}
// holds fused statements and {{EXPR}} is the value stored. Arithmetic is f32 whatever
// the storage. info = [n] (contiguous) or [n, rank, out shape, then each input's
// strides] (broadcast).

//! variant helpers
fn sl_erf(x: f32) -> f32 {
    // Abramowitz & Stegun 7.1.26, |error| < 1.5e-7.
    let t = 1.0 / (1.0 + 0.3275911 * abs(x));
    let y = 1.0 - (((((1.061405429 * t - 1.453152027) * t) + 1.421413741) * t - 0.284496736) * t + 0.254829592) * t * exp(-x * x);
    return select(-y, y, x >= 0.0);
}

fn sl_tanh(x: f32) -> f32 {
    // Near 0, the series (1 − e) would cancel in: error below 1e-12 relative for |x| < 1/16.
    if (abs(x) < 0.0625) {
        let x2 = x * x;
        return x * (1.0 + x2 * (-0.33333333 + x2 * (0.13333333 - x2 * 0.053968254)));
    }
    // exp of a non-positive argument never overflows.
    let e = exp(-2.0 * abs(x));
    let t = (1.0 - e) / (1.0 + e);
    return select(-t, t, x >= 0.0);
}

fn sl_sigmoid(x: f32) -> f32 {
    let e = exp(-abs(x));
    return select(e / (1.0 + e), 1.0 / (1.0 + e), x >= 0.0);
}

fn sl_nan_bits(v: f32) -> bool {
    // NaN by its bits, which no compiler may assume away (`v != v` may be folded).
    return (bitcast<u32>(v) & 0x7fffffffu) > 0x7f800000u;
}

fn sl_maximum(a: f32, b: f32) -> f32 {
    // IEEE 754-2019 maximum: NaN when either operand is (WGSL's max may return the other).
    return select(select(max(a, b), b, sl_nan_bits(b)), a, sl_nan_bits(a));
}

fn sl_minimum(a: f32, b: f32) -> f32 {
    // IEEE 754-2019 minimum: NaN when either operand is.
    return select(select(min(a, b), b, sl_nan_bits(b)), a, sl_nan_bits(a));
}

fn sl_pow(x: f32, y: f32) -> f32 {
    // C's pow (C99 Annex F.9.4.4), as the CPU reference: WGSL's pow is exp2(y·log2(x)),
    // undefined for x < 0 and for x = 0 with y <= 0, so every special case is spelled out.
    // Non-finite results are made at run time from bits: browsers (Tint) refuse a
    // non-finite constant expression.
    var inf_bits = 0x7f800000u;
    var nan_bits = 0x7fc00000u;
    let inf = bitcast<f32>(inf_bits);
    let nan = bitcast<f32>(nan_bits);
    let ax = abs(x);
    // pow(x, ±0) = 1 even for NaN x; pow(1, y) = 1 even for NaN y.
    if (y == 0.0 || x == 1.0) {
        return 1.0;
    }
    if (sl_nan_bits(x) || sl_nan_bits(y)) {
        return nan;
    }
    if ((bitcast<u32>(y) & 0x7fffffffu) == inf_bits) {
        // pow(-1, ±∞) = 1; |x| < 1 gives +∞ for -∞ and +0 for +∞, |x| > 1 the other way.
        if (ax == 1.0) {
            return 1.0;
        }
        return select(0.0, inf, (ax < 1.0) == (y < 0.0));
    }
    // y / 2 is exact (a power of two): an odd integer halves to a fraction (every f32 of
    // magnitude 2^24 or more is an even integer).
    let integer = trunc(y) == y;
    let half_y = y * 0.5;
    let odd = integer && trunc(half_y) != half_y;
    // The sign of x where the exponent is an odd integer, else +.
    let sign = select(0u, bitcast<u32>(x) & 0x80000000u, odd);
    if (x == 0.0) {
        // ±0 with an odd integer exponent keeps its sign: ±∞ below 0, ±0 above.
        return bitcast<f32>(sign | select(0u, inf_bits, y < 0.0));
    }
    if ((bitcast<u32>(x) & 0x7fffffffu) == inf_bits) {
        // ±∞: ±0 for y < 0, ±∞ for y > 0, signed as above.
        return bitcast<f32>(sign | select(inf_bits, 0u, y < 0.0));
    }
    if (x < 0.0 && !integer) {
        return nan;
    }
    return bitcast<f32>(sign | bitcast<u32>(pow(ax, y)));
}

fn sl_softplus(x: f32) -> f32 {
    // max(x, 0) + ln(1 + u), u = e^-|x| (exp never overflows); for small u the series,
    // since 1 + u would round u away (error below 1e-9 relative for u < 2^-7).
    let u = exp(-abs(x));
    var l = log(1.0 + u);
    if (u < 0.0078125) {
        l = u * (1.0 - u * (0.5 - u * 0.33333333));
    }
    return sl_maximum(x, 0.0) + l;
}

fn sl_swish_grad(x: f32, alpha: f32) -> f32 {
    // d/dx of x·sigmoid(alpha·x).
    let s = sl_sigmoid(alpha * x);
    return s + alpha * x * s * (1.0 - s);
}

fn sl_mish_grad(x: f32) -> f32 {
    // d/dx of x·tanh(softplus(x)).
    let t = sl_tanh(sl_softplus(x));
    return t + x * sl_sigmoid(x) * (1.0 - t * t);
}

fn sl_hard_sigmoid(x: f32, alpha: f32, beta: f32) -> f32 {
    // NaN stays NaN.
    return sl_maximum(sl_minimum(alpha * x + beta, 1.0), 0.0);
}

fn sl_nonfinite(v: f32) -> bool {
    // By the bits, which no compiler may assume away.
    return (bitcast<u32>(v) & 0x7fffffffu) >= 0x7f800000u;
}

fn sl_fmod(a: f32, b: f32) -> f32 {
    // C's fmod: the remainder of truncated division, with a's sign (a quiet NaN made at
    // run time for an infinite a or a zero or NaN b; a itself for an infinite b). The
    // quotient's rounding is corrected by one step of b, so the result is exact while
    // |a / b| < 2^24.
    var nan_bits = 0x7fc00000u;
    let b_bits = bitcast<u32>(b) & 0x7fffffffu;
    if (sl_nonfinite(a) || b_bits == 0u || b_bits > 0x7f800000u) {
        return bitcast<f32>(nan_bits);
    }
    if (b_bits == 0x7f800000u) {
        return a;
    }
    let m = abs(b);
    var r = fma(-trunc(a / b), b, a);
    if (a >= 0.0) {
        if (r < 0.0) {
            r = r + m;
        }
        if (r >= m) {
            r = r - m;
        }
    } else {
        if (r > 0.0) {
            r = r - m;
        }
        if (r <= -m) {
            r = r + m;
        }
    }
    return r;
}

fn sl_mod(a: f32, b: f32) -> f32 {
    // numpy's mod: the remainder with b's sign.
    let r = sl_fmod(a, b);
    if (r != 0.0 && (r < 0.0) != (b < 0.0)) {
        return r + b;
    }
    return r;
}

fn sl_idiv(a: i32, b: i32) -> i32 {
    // Truncating division; a divisor of 0 gives 0 (and i32's minimum / -1 wraps, as WGSL
    // defines).
    if (b == 0) {
        return 0;
    }
    return a / b;
}

fn sl_imod(a: i32, b: i32, fmod: bool) -> i32 {
    // The remainder with a's sign (fmod) or b's; a divisor of 0 gives 0.
    if (b == 0) {
        return 0;
    }
    // `%` on non-negative operands only: the GLSL that wgpu's GL backend emits leaves a
    // negative operand's remainder undefined. u32(abs(i32 minimum)) is 2^31, as it must be.
    let m = i32(u32(abs(a)) % u32(abs(b)));
    let r = select(m, -m, a < 0);
    if (!fmod && r != 0 && (r < 0) != (b < 0)) {
        return r + b;
    }
    return r;
}

fn sl_offset(i: u32, operand: u32) -> u32 {
    let rank = info[1];
    var rem = i;
    var off = 0u;
    for (var d = rank; d > 0u; d = d - 1u) {
        let size = info[1u + d];
        let coord = rem % size;
        rem = rem / size;
        off = off + coord * info[1u + rank * (1u + operand) + d];
    }
    return off;
}

//! variant value
// The value of output element i: inputs read through ld_src{k} (whatever their storage),
// fused statements, then the stored expression. The entry point is generated
// (engine/src/gpu/kernel.rs, per_element_main) for the output's storage.
fn value(i: u32) -> f32 {
{{LOADS}}
{{BODY}}
    return {{EXPR}};
}

//! variant value4
// The value of one output element from its inputs' elements x0.. (f32), for kernels that
// read and write four neighbouring elements at a time (`vec4_main` below). A fused chain's
// kernel computes its four lanes through a generated `value4` instead (LANES), the lanes'
// terms interleaved, and has no use for this one.
fn value({{PARAMS}}) -> f32 {
{{BODY}}
    return {{EXPR}};
}

//! variant vec4_main
// Four elements per invocation, each input and the output moved as one vec4: software
// rasterisers (lavapipe) move a vec4 as cheaply as one element, and GPUs coalesce it.
@compute @workgroup_size({{WG}})
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let t = gid.x + gid.y * nwg.x * {{WG}}u;
    _ = info[0];
    if (t >= {{N4}}u) {
        return;
    }
{{LOADS}}
    dst[t] = vec4<f32>({{LANES}});
}

//! variant words
// An i32 or bool output (i32 arithmetic, `where` over i32 or bool values): inputs read
// from their i32 or u32 arrays as they are, never through f32. info as above.
fn word(i: u32) -> {{TYPE}} {
{{LOADS}}
    return {{EXPR}};
}

@compute @workgroup_size({{WG}})
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * {{WG}}u;
    if (i >= info[0]) {
        return;
    }
    dst[i] = word(i);
}
