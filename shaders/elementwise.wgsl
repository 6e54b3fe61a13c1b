// Elementwise family: unary, binary with numpy broadcasting, and `where`.
// Filled by engine/src/ops/elementwise.rs: {{LOADS}} reads x0.. for element i, {{BODY}}
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
    // exp of a non-positive argument never overflows.
    let e = exp(-2.0 * abs(x));
    let t = (1.0 - e) / (1.0 + e);
    return select(-t, t, x >= 0.0);
}

fn sl_sigmoid(x: f32) -> f32 {
    let e = exp(-abs(x));
    return select(e / (1.0 + e), 1.0 / (1.0 + e), x >= 0.0);
}

fn sl_pow(x: f32, y: f32) -> f32 {
    // WGSL pow is undefined for x < 0; integral exponents of negative bases are exact here.
    if (y == 0.0) {
        return 1.0;
    }
    if (x >= 0.0) {
        return pow(x, y);
    }
    if (y != trunc(y)) {
        // A quiet NaN made at run time: browsers (Tint) refuse a NaN constant expression.
        var nan_bits = 0x7fc00000u;
        return bitcast<f32>(nan_bits);
    }
    let p = pow(-x, y);
    return select(p, -p, abs(y % 2.0) == 1.0);
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
// (engine/src/ops/kernel.rs, per_element_main) for the output's storage.
fn value(i: u32) -> f32 {
{{LOADS}}
{{BODY}}
    return {{EXPR}};
}
