//! Lowering to WGSL, one file per operator family mirroring `crate::ops` (as `crate::cpu`
//! does for the CPU reference): each family turns its operators into kernels for concrete
//! values, and the elementwise family also writes the expressions fused units compose.
//!
//! Lowering sees only checked plans (`Plan::validate`: every value's element count fits,
//! every step's values are what inference gives), so products of a value's dimensions
//! fit too; every size and stride reaches a kernel through `word`/`signed_word`, which
//! refuse what does not fit 32 bits.

mod attention;
mod conv;
mod convert;
mod einsum;
pub mod elementwise;
mod grad;
mod indexing;
mod loss;
pub mod matmul;
mod movement;
mod norm;
mod recurrent;
pub mod reduce;

use super::kernel::{with_f16_enable, Kernel, LowerCtx, Lowering};
use crate::ops::Op;

/// An operator family's lowering.
pub trait Lower {
    /// The kernels computing the operator for concrete values.
    fn lower(&self, ctx: &LowerCtx) -> Result<Lowering, String>;
}

/// Lowers one operator to its kernels (`enable f16;` added where a kernel uses `f16`).
pub fn lower_op(op: &Op, ctx: &LowerCtx) -> Result<Lowering, String> {
    if ctx.prologue.is_some() && !op.capabilities().prologue {
        return Err(format!("'{}' takes no prologue", op.name()));
    }
    let lowering = match op {
        Op::MatMul(o) => o.lower(ctx),
        Op::Elementwise(o) => o.lower(ctx),
        Op::Reduce(o) => o.lower(ctx),
        Op::Norm(o) => o.lower(ctx),
        Op::Movement(o) => o.lower(ctx),
        Op::Indexing(o) => o.lower(ctx),
        Op::Conv(o) => o.lower(ctx),
        Op::Convert(o) => o.lower(ctx),
        Op::Loss(o) => o.lower(ctx),
        Op::Constant(_) => Err("internal: constants are uploaded, not lowered".into()),
        Op::Param(_) => Err("internal: a param is its weight's buffer, not lowered".into()),
        Op::Grad(o) => o.lower(ctx),
        Op::Attention(o) => o.lower(ctx),
        Op::Recurrent(o) => o.lower(ctx),
        Op::Einsum(o) => o.lower(ctx),
    }?;
    let fix = |ks: Vec<Kernel>| -> Vec<Kernel> {
        ks.into_iter()
            .map(|mut k| {
                k.source = with_f16_enable(k.source);
                k
            })
            .collect()
    };
    Ok(match lowering {
        Lowering::Kernels(ks) => Lowering::Kernels(fix(ks)),
        Lowering::KernelsWithScratch(ks, s) => Lowering::KernelsWithScratch(fix(ks), s),
        Lowering::KernelsWithTextures(ks, t) => Lowering::KernelsWithTextures(fix(ks), t),
    })
}

/// The WGSL expression of a pointwise operator over `args` (f32 expressions; a bool
/// operand is a WGSL `bool`).
pub fn pointwise_wgsl(op: &Op, args: &[String]) -> Result<String, String> {
    match op {
        Op::Elementwise(e) => Ok(elementwise::wgsl(e, args)),
        Op::Grad(g) => grad::wgsl(g, args),
        other => Err(format!(
            "internal: '{}' is not pointwise and cannot be fused",
            other.name()
        )),
    }
}
