//! GPU lowering of the gradient family: `unary_grad` as an elementwise expression (so it
//! fuses like the forward pointwise operators), in the generated per-element kernel.

use super::elementwise::elementwise_kernel;
use super::Lower;
use crate::gpu::kernel::*;
use crate::ops::elementwise::Unary;
use crate::ops::grad::GradOp;

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
    };
    format!("({d} * ({dy}))")
}

/// The expression of a gradient-family operator over inputs `args` (x, dy).
pub fn wgsl(op: &GradOp, args: &[String]) -> String {
    let GradOp::UnaryGrad(u) = op;
    unary_grad_wgsl(*u, &args[0], &args[1])
}

impl Lower for GradOp {
    /// GPU kernel.
    fn lower(&self, ctx: &LowerCtx) -> Result<Lowering, String> {
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
            "",
            &wgsl(self, &args),
            inputs,
            &out.shape,
            out.storage,
            None,
        )?;
        Ok(Lowering::Kernels(vec![kernel]))
    }
}
