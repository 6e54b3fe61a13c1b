//! GPU lowering of the gradient family: `unary_grad` as an elementwise expression (so it
//! fuses like the forward pointwise operators), in the generated per-element kernel; the
//! softmax backwards as a row-sum pass into scratch and an element pass, gather's
//! backward as a loop over the indices per element of dx, and the conv family's backwards
//! as one pass per element of dx (or of the weight gradient) summing over the windows
//! that meet it (`shaders/grad.wgsl`).

use super::elementwise::elementwise_kernel;
use super::Lower;
use crate::gpu::kernel::*;
use crate::ops::elementwise::{Unary, HARD_SWISH_ALPHA};
use crate::ops::grad::GradOp;
use crate::shape;

/// conv_transpose2d_grad_input runs conv2d's kernel.
const CONV_SHADER: &str = include_str!("../../../../shaders/conv.wgsl");
const SHADER: &str = include_str!("../../../../shaders/grad.wgsl");

/// The WGSL expression of dy × f′(x) (f32 expressions `x`, `dy`).
fn unary_grad_wgsl(u: Unary, x: &str, dy: &str) -> String {
    let d = match u {
        Unary::Relu => format!("select(0.0, 1.0, ({x}) > 0.0)"),
        Unary::Sigmoid => format!("(sl_sigmoid({x}) * (1.0 - sl_sigmoid({x})))"),
        Unary::Tanh => format!("(1.0 - sl_tanh({x}) * sl_tanh({x}))"),
        Unary::Gelu { tanh: false } => format!(
            "(0.5 * (1.0 + sl_erf(({x}) * 0.70710678118654752)) + ({x}) * exp(-0.5 * ({x}) * ({x})) * 0.39894228040143268)"
        ),
        Unary::Gelu { tanh: true } => {
            let t = format!("sl_tanh(0.79788456080286536 * (({x}) + 0.044715 * ({x}) * ({x}) * ({x})))");
            format!(
                "(0.5 * (1.0 + {t}) + 0.5 * ({x}) * (1.0 - {t} * {t}) * 0.79788456080286536 * (1.0 + 0.134145 * ({x}) * ({x})))"
            )
        }
        Unary::Exp => format!("exp({x})"),
        Unary::Log => format!("(1.0 / ({x}))"),
        Unary::Sqrt => format!("(0.5 / sqrt({x}))"),
        Unary::Erf => format!("(1.12837916709551257 * exp(-({x}) * ({x})))"),
        Unary::Clip { min, max } => {
            let mut c = "true".to_string();
            if let Some(lo) = min {
                c = format!("{c} && ({x}) >= {}", f32_literal(lo));
            }
            if let Some(hi) = max {
                c = format!("{c} && ({x}) <= {}", f32_literal(hi));
            }
            format!("select(0.0, 1.0, {c})")
        }
        Unary::LeakyRelu { alpha } => {
            format!("select(1.0, {}, ({x}) < 0.0)", f32_literal(alpha))
        }
        Unary::Elu { alpha } => {
            format!("select(1.0, {} * exp({x}), ({x}) < 0.0)", f32_literal(alpha))
        }
        Unary::Selu { alpha, gamma } => format!(
            "({} * select({} * exp({x}), 1.0, ({x}) > 0.0))",
            f32_literal(gamma),
            f32_literal(alpha)
        ),
        Unary::Softplus => format!("sl_sigmoid({x})"),
        Unary::Softsign => format!("(1.0 / ((1.0 + abs({x})) * (1.0 + abs({x}))))"),
        Unary::HardSigmoid { alpha, beta } => {
            let a = f32_literal(alpha);
            let v = format!("({a} * ({x}) + {})", f32_literal(beta));
            format!("select(0.0, {a}, {v} > 0.0 && {v} < 1.0)")
        }
        Unary::HardSwish => {
            let a = f32_literal(HARD_SWISH_ALPHA);
            let v = format!("({a} * ({x}) + 0.5)");
            format!("select(select(2.0 * {a} * ({x}) + 0.5, 1.0, {v} > 1.0), 0.0, {v} < 0.0)")
        }
        Unary::Silu => format!("sl_swish_grad({x}, 1.0)"),
        Unary::Swish { alpha } => format!("sl_swish_grad({x}, {})", f32_literal(alpha)),
        Unary::Mish => format!("sl_mish_grad({x})"),
        Unary::Abs => format!("sign({x})"),
        Unary::Neg => "-1.0".to_string(),
        Unary::Reciprocal => format!("(-1.0 / (({x}) * ({x})))"),
        Unary::Sin => format!("cos({x})"),
        Unary::Cos => format!("(-sin({x}))"),
        // Step functions (their rules emit zeros without unary_grad).
        Unary::Sign | Unary::Floor | Unary::Ceil | Unary::Round => "0.0".to_string(),
    };
    format!("({d} * ({dy}))")
}

/// The expression of a pointwise gradient-family operator over inputs `args` (x, dy).
pub fn wgsl(op: &GradOp, args: &[String]) -> Result<String, String> {
    match (op, args) {
        (GradOp::UnaryGrad(u), [x, dy]) => Ok(unary_grad_wgsl(*u, x, dy)),
        _ => Err(format!(
            "internal: '{}' is not pointwise over {} operands",
            op.name(),
            args.len()
        )),
    }
}

impl Lower for GradOp {
    /// GPU kernel.
    fn lower(&self, ctx: &LowerCtx) -> Result<Lowering, String> {
        match self {
            GradOp::SoftmaxGrad { axis, log } => return softmax_grad(ctx, *axis, *log),
            GradOp::GatherGrad { axis } => return gather_grad(ctx, *axis),
            GradOp::UnaryGrad(_) => {}
            GradOp::ConvTransposeGradInput { .. } => return transpose_grad_input(self, ctx),
            _ => return window_grad(self, ctx),
        }
        let (inputs, outputs) = (ctx.inputs, ctx.outputs);
        let out = outputs
            .first()
            .ok_or("internal: unary_grad without an output")?;
        if inputs.len() != 2 {
            return Err("internal: unary_grad takes x and dy".into());
        }
        let args: Vec<String> = (0..inputs.len()).map(|i| format!("x{i}")).collect();
        let kernel = elementwise_kernel(
            self.name(),
            ("", &wgsl(self, &args)?),
            None,
            inputs,
            &out.shape,
            out.storage,
            None,
        )?;
        Ok(Lowering::Kernels(vec![kernel]))
    }
}

/// The two passes of `softmax_grad` / `log_softmax_grad`: each row's sum along the axis
/// into f32 scratch, then every element (whole words for packed storage).
fn softmax_grad(ctx: &LowerCtx, axis: i64, log: bool) -> Result<Lowering, String> {
    let (Some(y), Some(dy), Some(out)) =
        (ctx.inputs.first(), ctx.inputs.get(1), ctx.outputs.first())
    else {
        return Err("internal: a softmax backward takes y and dy".into());
    };
    let dims = &y.shape;
    let n: usize = dims.iter().product();
    let a = shape::existing_axis(axis, dims.len())?;
    let len = dims[a];
    let inner: usize = dims[a + 1..].iter().product();
    let rows = n.checked_div(len).unwrap_or(0);
    let info = vec![word(rows)?, word(len)?, word(inner.max(1))?];
    let (term, value) = if log {
        ("ld_dy(k)", "dy - exp(y) * s")
    } else {
        ("ld_y(k) * ld_dy(k)", "y * (dy - s)")
    };
    let label = if log {
        "log_softmax_grad"
    } else {
        "softmax_grad"
    };
    let mut sb = Bindings::new();
    // log_softmax's sums read dy only (a binding the kernel never reads is no binding).
    if !log {
        sb.add("y", Slot::Input(0), y.storage, false);
    }
    sb.add("dy", Slot::Input(1), dy.storage, false);
    sb.add("stats", Slot::Scratch(0), Storage::F32, true);
    let stats = Kernel {
        label: format!("{label} sums"),
        source: format!(
            "{}\n{}",
            sb.wgsl(),
            fill(
                variant(SHADER, "softmax_grad_stats"),
                &[("WG", WG.to_string()), ("TERM", term.into())]
            )
        ),
        slots: sb.slots(),
        info: info.clone(),
        workgroups: dispatch_1d(rows, WG)?,
    };
    let mut b = Bindings::new();
    b.add("dst", Slot::Output(0), out.storage, true);
    b.add("y", Slot::Input(0), y.storage, false);
    b.add("dy", Slot::Input(1), dy.storage, false);
    b.add("stats", Slot::Scratch(0), Storage::F32, false);
    let (main, threads) = per_element_main(out.storage, n);
    let element = Kernel {
        label: label.into(),
        source: format!(
            "{}\n{}\n{main}",
            b.wgsl(),
            fill(
                variant(SHADER, "softmax_grad_value"),
                &[("OUT", value.into())]
            )
        ),
        slots: b.slots(),
        info,
        workgroups: dispatch_1d(threads, WG)?,
    };
    Ok(Lowering::KernelsWithScratch(
        vec![stats, element],
        vec![rows],
    ))
}

/// `gather_grad`: one pass over the elements of dx, each summing the dy rows whose index
/// names it.
fn gather_grad(ctx: &LowerCtx, axis: i64) -> Result<Lowering, String> {
    let (Some(x), Some(indices), Some(dy), Some(out)) = (
        ctx.inputs.first(),
        ctx.inputs.get(1),
        ctx.inputs.get(2),
        ctx.outputs.first(),
    ) else {
        return Err("internal: gather_grad takes x, indices and dy".into());
    };
    let dims = &x.shape;
    let a = shape::existing_axis(axis, dims.len())?;
    let n = out.numel();
    let inner = shape::numel(&dims[a + 1..])?;
    let info = vec![
        word(n)?,
        word(dims[a])?,
        word(indices.numel())?,
        word(inner.max(1))?,
    ];
    let mut b = Bindings::new();
    b.add("dst", Slot::Output(0), out.storage, true);
    b.add("indices", Slot::Input(1), Storage::I32, false);
    b.add("dy", Slot::Input(2), dy.storage, false);
    let (main, threads) = per_element_main(out.storage, n);
    Ok(Lowering::Kernels(vec![Kernel {
        label: "gather_grad".into(),
        source: format!(
            "{}\n{}\n{main}",
            b.wgsl(),
            variant(SHADER, "gather_grad_value")
        ),
        slots: b.slots(),
        info,
        workgroups: dispatch_1d(threads, WG)?,
    }]))
}

/// `conv_transpose2d_grad_input`: conv2d's kernel over dy with the weight read from an
/// input, at x's shape.
fn transpose_grad_input(op: &GradOp, ctx: &LowerCtx) -> Result<Lowering, String> {
    let (Some(weight), Some(dy), Some(out)) =
        (ctx.inputs.get(1), ctx.inputs.get(2), ctx.outputs.first())
    else {
        return Err("internal: conv_transpose2d_grad_input takes x, weight and dy".into());
    };
    let (d, o) = (&dy.shape, &out.shape);
    let ([n, c, h, w], [_, oc, oh, ow]) = (&d[..], &o[..]) else {
        return Err(format!("internal: conv_transpose2d_grad_input over {d:?}"));
    };
    let GradOp::ConvTransposeGradInput { window, groups } = op else {
        return Err("internal: not conv_transpose2d_grad_input".into());
    };
    let mut info = [*n, *c, *h, *w, *oc, *oh, *ow]
        .iter()
        .map(|&v| word(v))
        .collect::<Result<Vec<_>, _>>()?;
    info.extend(super::conv::window_info(window)?);
    info.push(word(*groups)?);
    let mut b = Bindings::new();
    b.add("dst", Slot::Output(0), out.storage, true);
    b.add("src", Slot::Input(2), dy.storage, false);
    b.add("weight", Slot::Input(1), weight.storage, false);
    let value = fill(
        variant(CONV_SHADER, "conv2d"),
        &[("ACC", "f32".into()), ("OUT", "acc".into())],
    );
    let (main, threads) = per_element_main(out.storage, out.numel());
    Ok(Lowering::Kernels(vec![Kernel {
        label: op.name().into(),
        source: format!("{}\n{value}\n{main}", b.wgsl()),
        slots: b.slots(),
        info,
        workgroups: dispatch_1d(threads, WG)?,
    }]))
}

/// The conv family's backwards: one pass over the elements of the output, each summing
/// over the windows that meet it (the weight gradient over samples and positions).
fn window_grad(op: &GradOp, ctx: &LowerCtx) -> Result<Lowering, String> {
    let name = op.name();
    let (Some(x), Some(dy), Some(out)) =
        (ctx.inputs.first(), ctx.inputs.last(), ctx.outputs.first())
    else {
        return Err(format!("internal: {name} takes x and dy"));
    };
    let (xs, ys) = (&x.shape, &dy.shape);
    let (Some(forward), [n, c, h, w], [_, oc, oh, ow]) = (op.forward(1), &xs[..], &ys[..]) else {
        return Err(format!("internal: {name} over {xs:?} and {ys:?}"));
    };
    let window = forward.window().ok_or("internal: no window")?;
    let last = match op {
        GradOp::ConvGradInput { groups, .. } | GradOp::ConvGradFilter { groups, .. } => *groups,
        GradOp::AvgPoolGrad {
            count_include_pad, ..
        } => usize::from(*count_include_pad),
        _ => 0,
    };
    let mut info = [*n, *c, *h, *w, *oc, *oh, *ow]
        .iter()
        .map(|&v| word(v))
        .collect::<Result<Vec<_>, _>>()?;
    info.extend(super::conv::window_info(window)?);
    info.extend([word(last)?, word(window.pads[2])?, word(window.pads[3])?]);
    let mut b = Bindings::new();
    b.add("dst", Slot::Output(0), out.storage, true);
    match op {
        GradOp::ConvGradInput { .. } => {
            let weight = ctx.inputs.get(1).ok_or("internal: no weight")?;
            b.add("weight", Slot::Input(1), weight.storage, false);
            b.add("dy", Slot::Input(2), dy.storage, false);
        }
        GradOp::AvgPoolGrad { .. } => b.add("dy", Slot::Input(1), dy.storage, false),
        _ => {
            b.add("x", Slot::Input(0), x.storage, false);
            b.add("dy", Slot::Input(1), dy.storage, false);
        }
    }
    let n_out = out.numel();
    let (main, threads) = per_element_main(out.storage, n_out);
    Ok(Lowering::Kernels(vec![Kernel {
        label: name.into(),
        source: format!(
            "{}\n{}\n{}\n{main}",
            b.wgsl(),
            variant(SHADER, "window_taps"),
            fill(
                variant(SHADER, &format!("{name}_value")),
                &[("BIAS", String::new())]
            )
        ),
        slots: b.slots(),
        info,
        workgroups: dispatch_1d(threads, WG)?,
    }]))
}
