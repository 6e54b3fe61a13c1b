//! The operator set. One operator is one definition: schema (attributes with defaults and
//! docs), shape and dtype inference, weights it declares, cost, GPU lowering (in the family
//! file here) and CPU reference (in the mirrored file of `crate::cpu`).
//!
//! Operators are grouped in families that share one kernel generator and one WGSL file in
//! `shaders/`: matmul, elementwise, reduce, normalisation, movement, conv/pool, constant.

pub mod attrs;
pub mod constant;
pub mod conv;
pub mod elementwise;
pub mod kernel;
pub mod matmul;
pub mod movement;
pub mod norm;
pub mod reduce;

use crate::dtype::DType;
use crate::shape::{show, Shape};
use attrs::{AttrReader, AttrSpec};
use serde::Serialize;
use serde_json::{Map, Value};
use std::fmt;

pub use kernel::{Epilogue, Kernel, LowerCtx, Lowering, Slot, Storage};

/// The shape and dtype of a value flowing along an edge.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
pub struct TensorType {
    /// Shape (possibly symbolic).
    pub shape: Shape,
    /// Element type.
    pub dtype: DType,
}

impl TensorType {
    /// A float tensor type.
    pub fn f32(shape: Shape) -> TensorType {
        TensorType {
            shape,
            dtype: DType::F32,
        }
    }
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.dtype, show(&self.shape))
    }
}

/// How a weight is initialised when no weights file provides it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub enum Init {
    /// Uniform in [-bound, bound] (Kaiming-uniform style, bound = 1/sqrt(fan_in)).
    Uniform(f32),
    /// All zeros.
    Zeros,
    /// All ones.
    Ones,
}

/// A weight an operator declares (for `linear`: `weight` [in, out] and `bias` [out]).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ParamSpec {
    /// Local name; the file key is `node.name`.
    pub name: &'static str,
    /// Concrete shape.
    pub shape: Vec<usize>,
    /// Seeded initialisation.
    pub init: Init,
}

/// Predicted cost of one operator application.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Cost {
    /// Floating-point operations.
    pub flops: u64,
    /// Bytes read from device memory.
    pub bytes_read: u64,
    /// Bytes written to device memory.
    pub bytes_written: u64,
}

/// How many inputs an operator takes.
#[derive(Debug, Clone, Copy, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Arity {
    /// Exactly these named inputs.
    Fixed(&'static [&'static str]),
    /// At least this many inputs.
    Variadic(usize),
}

/// The schema of an operator, as served to the editor's palette.
#[derive(Debug, Clone, Serialize)]
pub struct OpSchema {
    /// Name used in graph files.
    pub name: &'static str,
    /// Kernel family.
    pub family: &'static str,
    /// One line of documentation.
    pub doc: &'static str,
    /// Inputs.
    pub inputs: Arity,
    /// Names of outputs (`split` has as many as its attributes say).
    pub outputs: &'static [&'static str],
    /// Attributes.
    pub attrs: &'static [AttrSpec],
    /// Names of the weights it declares.
    pub params: &'static [&'static str],
}

/// A parsed operator with its attributes.
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    /// `matmul`, `linear`.
    MatMul(matmul::MatMulOp),
    /// Unary, binary (broadcasting) and `where`.
    Elementwise(elementwise::ElementwiseOp),
    /// `reduce_sum`, `reduce_mean`.
    Reduce(reduce::ReduceOp),
    /// `softmax`, `log_softmax`, `layer_norm`, `batch_norm`.
    Norm(norm::NormOp),
    /// Reshapes, views, copies and gathers.
    Movement(movement::MovementOp),
    /// Convolution and pooling.
    Conv(conv::ConvOp),
    /// A constant tensor.
    Constant(constant::ConstantOp),
}

/// Every operator schema, grouped by family (the palette's data).
pub fn schemas() -> Vec<&'static OpSchema> {
    let families: [&'static [OpSchema]; 7] = [
        matmul::SCHEMAS,
        elementwise::SCHEMAS,
        reduce::SCHEMAS,
        norm::SCHEMAS,
        movement::SCHEMAS,
        conv::SCHEMAS,
        constant::SCHEMAS,
    ];
    families.iter().flat_map(|f| f.iter()).collect()
}

/// The schema of an operator by name.
pub fn schema(name: &str) -> Option<&'static OpSchema> {
    schemas().into_iter().find(|s| s.name == name)
}

/// Parses an operator and its attributes. Errors are (attribute, message) pairs.
pub fn parse(name: &str, attrs: &Map<String, Value>) -> Result<Op, Vec<(String, String)>> {
    let Some(schema) = schema(name) else {
        let known: Vec<&str> = schemas().iter().map(|s| s.name).collect();
        return Err(vec![(
            "op".into(),
            format!("unknown operator '{name}' (known: {})", known.join(", ")),
        )]);
    };
    let mut r = AttrReader::new(attrs, schema.attrs);
    let op = match schema.family {
        matmul::FAMILY => Op::MatMul(matmul::parse(name, &mut r)),
        elementwise::FAMILY => Op::Elementwise(elementwise::parse(name, &mut r)),
        reduce::FAMILY => Op::Reduce(reduce::parse(name, &mut r)),
        norm::FAMILY => Op::Norm(norm::parse(name, &mut r)),
        movement::FAMILY => Op::Movement(movement::parse(name, &mut r)),
        conv::FAMILY => Op::Conv(conv::parse(name, &mut r)),
        _ => Op::Constant(constant::parse(&mut r)),
    };
    if r.problems.is_empty() {
        Ok(op)
    } else {
        Err(r.problems)
    }
}

impl Op {
    /// The operator's name as written in graph files.
    pub fn name(&self) -> &'static str {
        match self {
            Op::MatMul(o) => o.name(),
            Op::Elementwise(o) => o.name(),
            Op::Reduce(o) => o.name(),
            Op::Norm(o) => o.name(),
            Op::Movement(o) => o.name(),
            Op::Conv(o) => o.name(),
            Op::Constant(_) => "constant",
        }
    }

    /// The operator's schema.
    pub fn schema(&self) -> &'static OpSchema {
        schema(self.name()).expect("every parsed operator has a schema")
    }

    /// Number of outputs (`split` has several).
    pub fn num_outputs(&self) -> usize {
        match self {
            Op::Movement(m) => m.num_outputs(),
            _ => 1,
        }
    }

    /// Checks the number of inputs.
    pub fn check_arity(&self, n: usize) -> Result<(), String> {
        match self.schema().inputs {
            Arity::Fixed(names) if names.len() != n => Err(format!(
                "'{}' takes {} input{} ({}), got {n}",
                self.name(),
                names.len(),
                if names.len() == 1 { "" } else { "s" },
                names.join(", ")
            )),
            Arity::Variadic(min) if n < min => Err(format!(
                "'{}' takes at least {min} inputs, got {n}",
                self.name()
            )),
            _ => Ok(()),
        }
    }

    /// Infers output types from input types. Errors name the offending shapes.
    pub fn infer(&self, inputs: &[TensorType]) -> Result<Vec<TensorType>, String> {
        match self {
            Op::MatMul(o) => o.infer(inputs),
            Op::Elementwise(o) => o.infer(inputs),
            Op::Reduce(o) => o.infer(inputs),
            Op::Norm(o) => o.infer(inputs),
            Op::Movement(o) => o.infer(inputs),
            Op::Conv(o) => o.infer(inputs),
            Op::Constant(o) => o.infer(inputs),
        }
    }

    /// The weights this operator declares, given its (inferred) input types.
    pub fn params(&self, inputs: &[TensorType]) -> Result<Vec<ParamSpec>, String> {
        match self {
            Op::MatMul(o) => o.params(inputs),
            Op::Norm(o) => o.params(inputs),
            Op::Conv(o) => o.params(inputs),
            _ => Ok(Vec::new()),
        }
    }

    /// Predicted cost on concrete shapes.
    pub fn cost(&self, inputs: &[Vec<usize>], outputs: &[Vec<usize>]) -> Cost {
        let read: usize = inputs.iter().map(|s| s.iter().product::<usize>()).sum();
        let written: usize = outputs.iter().map(|s| s.iter().product::<usize>()).sum();
        let flops = match self {
            Op::MatMul(o) => o.flops(inputs, outputs),
            Op::Conv(o) => o.flops(inputs, outputs),
            Op::Norm(_) => 8 * read as u64,
            Op::Movement(_) | Op::Constant(_) => 0,
            _ => read.max(written) as u64,
        };
        Cost {
            flops,
            bytes_read: 4 * read as u64,
            bytes_written: 4 * written as u64,
        }
    }

    /// Lowers the operator to GPU kernels for concrete values.
    pub fn lower(&self, ctx: &kernel::LowerCtx) -> Result<Lowering, String> {
        let lowering = match self {
            Op::MatMul(o) => o.lower(ctx),
            Op::Elementwise(o) => o.lower(ctx),
            Op::Reduce(o) => o.lower(ctx),
            Op::Norm(o) => o.lower(ctx),
            Op::Movement(o) => o.lower(ctx),
            Op::Conv(o) => o.lower(ctx),
            Op::Constant(_) => Ok(Lowering::Constant),
        }?;
        let fix = |ks: Vec<Kernel>| -> Vec<Kernel> {
            ks.into_iter()
                .map(|mut k| {
                    k.source = kernel::with_f16_enable(k.source);
                    k
                })
                .collect()
        };
        Ok(match lowering {
            Lowering::Kernels(ks) => Lowering::Kernels(fix(ks)),
            Lowering::KernelsWithScratch(ks, s) => Lowering::KernelsWithScratch(fix(ks), s),
            other => other,
        })
    }
}

/// Checks that an input is a float tensor.
pub(crate) fn need_f32(op: &str, which: &str, t: &TensorType) -> Result<(), String> {
    if t.dtype == DType::F32 {
        Ok(())
    } else {
        Err(format!("'{op}' needs an f32 {which}, got {t}"))
    }
}
