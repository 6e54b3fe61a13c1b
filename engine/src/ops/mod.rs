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

    /// How the operator treats the batch axis: given each input's batch axis (None: the
    /// input does not depend on the batch; at least one is Some), each output's batch axis,
    /// or Err(reason) when the operator combines samples (reduces, normalises, contracts,
    /// concatenates, splits, slices or indexes along the batch axis, or reshapes so that a
    /// sample's elements are no longer a contiguous block along one axis).
    ///
    /// The reason names the operator and the axis ("softmax along axis 0, the batch
    /// axis"). Inputs and outputs are the types inference gave; a wrong number of inputs
    /// or batch axes, or an axis outside its input's rank, is an `Err` too (never a panic).
    pub fn batch(
        &self,
        inputs: &[TensorType],
        batch: &[Option<usize>],
        outputs: &[TensorType],
    ) -> Result<Vec<Option<usize>>, String> {
        let name = self.name();
        self.check_arity(inputs.len())?;
        if batch.len() != inputs.len() {
            return Err(format!(
                "'{name}' got {} batch axes for {} inputs",
                batch.len(),
                inputs.len()
            ));
        }
        for (k, (t, b)) in inputs.iter().zip(batch).enumerate() {
            if let Some(a) = *b {
                if a >= t.shape.len() {
                    return Err(format!(
                        "'{name}': batch axis {a} of input {k} is outside {t}"
                    ));
                }
            }
        }
        if outputs.is_empty() || batch.iter().all(Option::is_none) {
            return Ok(vec![None; outputs.len()]);
        }
        let axes = match self {
            Op::MatMul(o) => o.batch(inputs, batch, outputs),
            Op::Elementwise(o) => o.batch(inputs, batch, outputs),
            Op::Reduce(o) => o.batch(inputs, batch, outputs),
            Op::Norm(o) => o.batch(inputs, batch, outputs),
            Op::Movement(o) => o.batch(inputs, batch, outputs),
            Op::Conv(o) => o.batch(inputs, batch, outputs),
            Op::Constant(o) => o.batch(inputs, batch, outputs),
        }?;
        for (k, (t, b)) in outputs.iter().zip(&axes).enumerate() {
            if let Some(a) = *b {
                if a >= t.shape.len() {
                    return Err(format!(
                        "'{name}' puts the batch of output {k} on axis {a}, outside {t}"
                    ));
                }
            }
        }
        Ok(axes)
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

/// The one output axis that the batched inputs of a broadcasting operator land on (input
/// axis `a` of rank `r` is output axis `a + rank - r`, numpy-style), or Err when two land
/// on different axes: every sample of one then meets every sample of the other.
pub(crate) fn broadcast_batch(
    op: &str,
    inputs: &[TensorType],
    batch: &[Option<usize>],
    rank: usize,
) -> Result<Option<usize>, String> {
    let mut found: Option<(usize, usize)> = None;
    for (k, (t, b)) in inputs.iter().zip(batch).enumerate() {
        let Some(a) = *b else { continue };
        let Some(out) = (a + rank).checked_sub(t.shape.len()) else {
            return Err(format!(
                "{op} has an input of rank {} above its output's {rank}",
                t.shape.len()
            ));
        };
        match found {
            None => found = Some((k, out)),
            Some((j, o)) if o != out => {
                return Err(format!(
                    "{op} broadcasts the batch of input {j} along axis {o} against the batch of input {k} along axis {out}: every sample meets every other"
                ))
            }
            Some(_) => {}
        }
    }
    Ok(found.map(|(_, o)| o))
}

#[cfg(test)]
pub(crate) mod testing {
    //! Running one operator's batch rule on symbolic shapes written as text.

    use super::{parse, TensorType};
    use crate::dtype::DType;
    use crate::shape::{Dim, Shape};
    use serde_json::Value;

    /// `"N,4"` → `[N, 4]`; a leading `i32:` or `bool:` sets the dtype.
    pub fn tensor(text: &str) -> TensorType {
        let (dtype, dims) = match text.split_once(':') {
            Some(("i32", d)) => (DType::I32, d),
            Some(("bool", d)) => (DType::Bool, d),
            _ => (DType::F32, text),
        };
        let shape: Shape = dims
            .split(',')
            .filter(|d| !d.trim().is_empty())
            .map(|d| match d.trim().parse::<usize>() {
                Ok(n) => Dim::Known(n),
                Err(_) => Dim::Sym(d.trim().to_string()),
            })
            .collect();
        TensorType { shape, dtype }
    }

    /// The rule of operator `op` (attributes `attrs`) for inputs given as (shape text,
    /// batch axis); inference must accept the inputs.
    pub fn rule(
        op: &str,
        attrs: Value,
        inputs: &[(&str, Option<usize>)],
    ) -> Result<Vec<Option<usize>>, String> {
        let attrs = attrs.as_object().cloned().unwrap_or_default();
        let op = parse(op, &attrs).expect("attributes parse");
        let types: Vec<TensorType> = inputs.iter().map(|(t, _)| tensor(t)).collect();
        let axes: Vec<Option<usize>> = inputs.iter().map(|(_, a)| *a).collect();
        let outputs = op.infer(&types).expect("inference accepts the inputs");
        op.batch(&types, &axes, &outputs)
    }

    /// Asserts that the rule couples and that its reason mentions every one of `words`.
    pub fn couples(result: Result<Vec<Option<usize>>, String>, words: &[&str]) {
        match result {
            Err(reason) => {
                for w in words {
                    assert!(reason.contains(w), "'{reason}' does not mention '{w}'");
                }
            }
            Ok(axes) => panic!("expected a coupling, got axes {axes:?}"),
        }
    }
}
