//! The expression form of fused units: pointwise operators applied one after another to
//! a unit's inputs, each term reading inputs, earlier terms, inlined scalars or (in an
//! epilogue) the anchor's result. Plain data: every backend turns it into its own code
//! (the wgpu backend into WGSL statements, the CPU backend into loops).

use crate::ops::Op;
use serde::{Deserialize, Serialize};

/// What a term reads.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Operand {
    /// Input `k` of the step (broadcast to the result's shape; in an epilogue, a scalar or
    /// a row the length of the result's last axis).
    Input(usize),
    /// The result of an earlier term.
    Term(usize),
    /// A scalar constant inlined into the expression.
    Scalar(f32),
    /// The anchor's result (epilogues only).
    Anchor,
}

/// One pointwise operator application.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Term {
    /// The node it computes.
    pub node: String,
    /// The operator (pointwise).
    pub op: Op,
    /// Its operands, in the operator's input order.
    pub args: Vec<Operand>,
}

/// Pointwise terms evaluated in order; the last one is the result.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Expr {
    /// The terms.
    pub terms: Vec<Term>,
}

impl Expr {
    /// The operator names of the terms, for labels (`relu + add`).
    pub fn op_names(&self) -> Vec<&'static str> {
        self.terms.iter().map(|t| t.op.name()).collect()
    }
}
