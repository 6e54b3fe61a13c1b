//! Checking plans that come from elsewhere (a server sending a worker its stage, a cache)
//! before a device sees them: every index in range, every size countable, every step's
//! operator valid and its values exactly what inference gives for its inputs, fused
//! expressions well formed, weights and constants filling their values. A plan that
//! passes cannot make a backend index outside a value or allocate a size nobody counted.
//! [`Plan::check_limits`] adds the configured limits (each value's elements and rank, the
//! plan's bytes on its device).

use super::expr::{Expr, Operand};
use super::{storage_for, Plan, ValueKind, Work};
use crate::dtype::DType;
use crate::error::RunError;
use crate::limits::{Limit, Limits};
use crate::ops::{Op, TensorType};
use crate::shape::{self, Shape};
use crate::weights::Weights;

/// Most list entries an operator of a plan may carry (a plan's operators were parsed from
/// a graph within its list limit; this bounds ones that were not).
const MAX_OP_LIST: usize = 1 << 16;

fn invalid(message: impl Into<String>) -> RunError {
    RunError::Plan(message.into())
}

impl Plan {
    /// The type of value `v`, if it exists.
    fn value_type(&self, v: usize) -> Result<TensorType, RunError> {
        let value = self
            .values
            .get(v)
            .ok_or_else(|| invalid(format!("value {v} does not exist")))?;
        Ok(TensorType {
            shape: shape::known(&value.shape),
            dtype: value.dtype,
        })
    }

    /// Checks that the plan is consistent: what every device checks before compiling it.
    pub fn validate(&self) -> Result<(), RunError> {
        let buffers = self.buffers.len();
        let mut storage_elements: Vec<Option<(usize, DType)>> = vec![None; self.values.len()];
        for value in &self.values {
            let n = shape::numel(&value.shape)
                .map_err(|m| invalid(format!("value '{}': {m}", value.name)))?;
            let kept = value.layout == crate::storage::Storage::of(value.dtype)
                && self.kept_f32.contains(&value.name);
            if value.layout != storage_for(value.dtype, &self.options) && !kept {
                return Err(invalid(format!(
                    "value '{}' is stored as {:?}, not as its dtype {} is under the plan's options",
                    value.name, value.layout, value.dtype
                )));
            }
            let size = self.buffers.get(value.buffer).copied();
            if value.buffer >= buffers || size.is_some_and(|b| b < value.layout.bytes(n)) {
                return Err(invalid(format!(
                    "value '{}' does not fit its buffer {}",
                    value.name, value.buffer
                )));
            }
            // Values sharing a storage (views) hold the same elements.
            let slot = storage_elements
                .get_mut(value.storage)
                .ok_or_else(|| invalid(format!("value '{}' has no storage", value.name)))?;
            match slot {
                Some(other) if *other != (n, value.dtype) => {
                    return Err(invalid(format!(
                        "value '{}' shares a storage with values of another size",
                        value.name
                    )))
                }
                _ => *slot = Some((n, value.dtype)),
            }
        }
        self.buffers
            .iter()
            .try_fold(0u64, |a, &b| a.checked_add(b))
            .ok_or_else(|| invalid("the buffers' sizes overflow"))?;
        // Inputs and weights name values of their kind; outputs may be any value.
        let kinds = [
            (&self.inputs, Some(ValueKind::Input)),
            (&self.params, Some(ValueKind::Param)),
            (&self.outputs, None),
        ];
        for (list, kind) in kinds {
            let mut names = std::collections::HashSet::new();
            for (name, v) in list {
                if !names.insert(name.as_str()) {
                    return Err(invalid(format!("'{name}' is listed twice")));
                }
                let value = self
                    .values
                    .get(*v)
                    .ok_or_else(|| invalid(format!("'{name}' names no value")))?;
                if kind.is_some_and(|k| k != value.kind) {
                    return Err(invalid(format!("'{name}' is not a {:?} value", value.kind)));
                }
            }
        }
        for (v, t) in &self.constants {
            let value = self
                .values
                .get(*v)
                .ok_or_else(|| invalid(format!("constant {v} names no value")))?;
            t.check()
                .map_err(|m| invalid(format!("constant '{}': {m}", value.name)))?;
            if value.kind != ValueKind::Constant
                || t.shape != value.shape
                || t.dtype() != value.dtype
            {
                return Err(invalid(format!(
                    "constant '{}' does not match its value",
                    value.name
                )));
            }
        }
        for check in &self.index_checks {
            if !self.inputs.iter().any(|(n, _)| *n == check.input) {
                return Err(invalid(format!(
                    "index check of unknown input '{}'",
                    check.input
                )));
            }
        }
        for step in &self.steps {
            self.validate_step(step)
                .map_err(|m| invalid(format!("step '{}': {m}", step.label())))?;
        }
        Ok(())
    }

    fn validate_step(&self, step: &super::Step) -> Result<(), String> {
        let types = |vs: &[usize]| -> Result<Vec<TensorType>, String> {
            vs.iter()
                .map(|&v| self.value_type(v).map_err(|e| e.to_string()))
                .collect()
        };
        let inputs = types(&step.inputs)?;
        let params = types(&step.params)?;
        let outputs = types(&step.outputs)?;
        if outputs.is_empty() {
            return Err("it writes nothing".into());
        }
        if step.in_place.is_some_and(|k| k >= inputs.len()) {
            return Err("its in-place input does not exist".into());
        }
        let typed = |op: &Op, ins: &[TensorType]| -> Result<Vec<TensorType>, String> {
            op.validate(MAX_OP_LIST)?;
            let outs = op.infer(ins)?;
            let specs = op.params(ins)?;
            let declared: Vec<Shape> = specs.iter().map(|p| shape::known(&p.shape)).collect();
            let given: Vec<Shape> = params.iter().map(|t| t.shape.clone()).collect();
            if declared != given || params.iter().any(|t| t.dtype != DType::F32) {
                return Err(format!(
                    "'{}' is given weights of the wrong shapes",
                    op.name()
                ));
            }
            Ok(outs)
        };
        match &step.work {
            Work::Op(op) => {
                if typed(op, &inputs)? != outputs {
                    return Err(format!(
                        "'{}' does not produce its output values",
                        op.name()
                    ));
                }
            }
            Work::Fused(expr) => {
                if !params.is_empty() {
                    return Err("a fused unit reads no weights".into());
                }
                let result = expr_type(expr, &inputs, 0, None, &outputs)?;
                if Some(&result) != outputs.first() || outputs.len() != 1 {
                    return Err("the fused unit does not produce its output value".into());
                }
            }
            Work::Epilogue {
                anchor,
                anchor_inputs,
                expr,
            } => {
                if anchor.capabilities().anchor.is_none() {
                    return Err(format!("'{}' takes no epilogue", anchor.name()));
                }
                let own = inputs
                    .get(..*anchor_inputs)
                    .ok_or("the anchor reads inputs that do not exist")?;
                let anchored = typed(anchor, own)?;
                let [anchored] = anchored.as_slice() else {
                    return Err("the anchor has several outputs".into());
                };
                // The lowering reads every further operand as a scalar or as a row of the
                // anchor's result (what fusion links), never as a whole tensor.
                let row = anchored.shape.last().and_then(|d| d.known());
                for extra in inputs.get(*anchor_inputs..).unwrap_or_default() {
                    let n = shape::concrete(&extra.shape).and_then(|s| shape::numel(&s).ok());
                    let is_row = extra.shape.len() == 1 && row.is_some() && n == row;
                    if n != Some(1) && !is_row {
                        return Err("an epilogue operand is neither a scalar nor a row".into());
                    }
                }
                let result = expr_type(expr, &inputs, *anchor_inputs, Some(anchored), &outputs)?;
                if Some(&result) != outputs.first() || outputs.len() != 1 {
                    return Err("the epilogue does not produce its output value".into());
                }
            }
            Work::Prologue { reducer, expr } => {
                if !reducer.capabilities().prologue {
                    return Err(format!("'{}' takes no prologue", reducer.name()));
                }
                if !params.is_empty() {
                    return Err("a prologue reads no weights".into());
                }
                // The lowering reads element i of every input for element i of the
                // reduction's input: one shape for all, f32.
                let first = inputs.first().ok_or("a prologue reads no tensor")?;
                if inputs.iter().any(|t| t != first || t.dtype != DType::F32) {
                    return Err("the prologue's inputs are not f32 of one shape".into());
                }
                let folded = expr_type(expr, &inputs, 0, None, std::slice::from_ref(first))?;
                if typed(reducer, &[folded])? != outputs {
                    return Err(format!(
                        "'{}' does not produce its output values",
                        reducer.name()
                    ));
                }
            }
        }
        Ok(())
    }

    /// [`Plan::validate`], then the limits: every value's elements and rank, and the
    /// plan's buffers on its device.
    pub fn check_limits(&self, limits: &Limits) -> Result<(), RunError> {
        self.validate()?;
        for value in &self.values {
            let t = TensorType {
                shape: shape::known(&value.shape),
                dtype: value.dtype,
            };
            limits.check_type(&format!("value '{}'", value.name), &t)?;
        }
        let total = self.buffers.iter().try_fold(0u64, |a, &b| a.checked_add(b));
        limits.check(
            Limit::MaxDeviceBytes,
            "the plan's buffers on its device",
            "bytes",
            total,
        )?;
        Ok(())
    }

    /// Checks weights against the plan before they are uploaded: every weight it reads is
    /// there, f32, of its value's shape and holding its elements.
    pub fn check_weights(&self, weights: &Weights) -> Result<(), RunError> {
        for (key, v) in &self.params {
            let value = self
                .values
                .get(*v)
                .ok_or_else(|| invalid(format!("weight '{key}' names no value")))?;
            let w = weights
                .get(key)
                .ok_or_else(|| RunError::MissingWeight(key.clone()))?;
            let wrong = |message: String| RunError::Input {
                name: key.clone(),
                message,
            };
            if w.shape != value.shape || w.dtype() != DType::F32 {
                return Err(wrong(format!(
                    "weight is {} {:?}, expected f32 {:?}",
                    w.dtype(),
                    w.shape,
                    value.shape
                )));
            }
            w.check().map_err(wrong)?;
        }
        Ok(())
    }
}

/// The type an expression produces: every term pointwise, reading inputs from
/// `first_input` on (the anchor's own inputs are not operands), earlier terms, scalars or
/// (in an epilogue) the anchor's result, each term broadcasting to the step's output.
fn expr_type(
    expr: &Expr,
    inputs: &[TensorType],
    first_input: usize,
    anchor: Option<&TensorType>,
    outputs: &[TensorType],
) -> Result<TensorType, String> {
    let out = outputs.first().ok_or("no output")?;
    let mut terms: Vec<TensorType> = Vec::new();
    for term in &expr.terms {
        if !term.op.capabilities().pointwise {
            return Err(format!("'{}' is not pointwise", term.op.name()));
        }
        let args: Vec<TensorType> = term
            .args
            .iter()
            .map(|a| match *a {
                Operand::Input(k) if k >= first_input => inputs.get(k).cloned(),
                Operand::Input(_) => None,
                Operand::Term(j) => terms.get(j).cloned(),
                Operand::Scalar(_) => Some(TensorType::f32(Vec::new())),
                Operand::Anchor => anchor.cloned(),
            })
            .collect::<Option<_>>()
            .ok_or_else(|| format!("term '{}' reads an operand that does not exist", term.node))?;
        let t = term
            .op
            .infer(&args)?
            .pop()
            .ok_or("a pointwise term produced nothing")?;
        if t.dtype != DType::F32 {
            return Err(format!(
                "term '{}' gives {}: fused units compute f32",
                term.node, t.dtype
            ));
        }
        if shape::broadcast(&t.shape, &out.shape).ok().as_ref() != Some(&out.shape) {
            return Err(format!(
                "term '{}' does not broadcast to the output",
                term.node
            ));
        }
        terms.push(t);
    }
    match (terms.pop(), anchor) {
        (Some(t), _) => Ok(TensorType {
            shape: out.shape.clone(),
            dtype: t.dtype,
        }),
        (None, Some(a)) => Ok(a.clone()),
        (None, None) => Err("an empty fused unit".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::CpuExecutable;
    use crate::graph::load_graph;
    use crate::tensor::Tensor;

    fn plan() -> (Plan, Weights) {
        let g = load_graph(
            r#"{ "format": "sluice/graph@1", "inputs": { "x": { "shape": [2, 3] } },
                 "nodes": [
                   { "id": "fc", "op": "linear", "inputs": ["x"], "attrs": { "out_features": 4 } },
                   { "id": "act", "op": "relu", "inputs": ["fc"] },
                   { "id": "k", "op": "constant", "attrs": { "value": [1, 2, 3, 4] } },
                   { "id": "sum", "op": "add", "inputs": ["act", "k"] },
                   { "id": "out", "op": "tanh", "inputs": ["sum"] }
                 ],
                 "outputs": ["out"] }"#,
        )
        .unwrap();
        let w = crate::weights::init_weights(&g, 1);
        (Plan::new(&g).unwrap(), w)
    }

    /// One way of tampering with a plan, and what it does.
    type Tamper = (&'static str, fn(&mut Plan));

    /// Each way of tampering with a plan, applied to a fresh one: every one is refused
    /// by the check and by the CPU device, and none panics.
    #[test]
    fn tampered_plans_are_refused_not_run() {
        let (good, w) = plan();
        good.validate().unwrap();
        CpuExecutable::new(good.clone(), &w).unwrap();
        let tampers: Vec<Tamper> = vec![
            ("a step reads a value that does not exist", |p| {
                p.steps[0].inputs[0] = 999
            }),
            ("a value's shape changes", |p| {
                p.values[0].shape = vec![7, 7]
            }),
            ("a value outgrows its buffer", |p| {
                let last = p.values.len() - 1;
                p.values[last].shape = vec![1 << 20, 1 << 20];
            }),
            ("a buffer does not exist", |p| p.values[0].buffer = 999),
            ("a storage does not exist", |p| p.values[0].storage = 999),
            ("a constant lies about its elements", |p| {
                p.constants[0].1 = Tensor::f32(vec![4], vec![1.0])
            }),
            ("an in-place input does not exist", |p| {
                p.steps[0].in_place = Some(9)
            }),
            ("the weights change shape", |p| {
                let v = p.params[0].1;
                p.values[v].shape = vec![3, 5];
            }),
            ("an input is a weight", |p| p.inputs[0].1 = p.params[0].1),
            ("a size overflows", |p| {
                p.values[0].shape = vec![usize::MAX, 2]
            }),
            ("a fused term reads a missing input", |p| {
                for step in &mut p.steps {
                    if let Work::Fused(e) | Work::Epilogue { expr: e, .. } = &mut step.work {
                        e.terms[0].args[0] = Operand::Input(99);
                    }
                }
            }),
            ("an operator arrives invalid", |p| {
                for step in &mut p.steps {
                    if let Work::Epilogue { anchor, .. } = &mut step.work {
                        *anchor = Op::MatMul(crate::ops::matmul::MatMulOp::Linear {
                            out_features: 0,
                            bias: true,
                        });
                    }
                }
            }),
        ];
        for (what, tamper) in tampers {
            let mut p = good.clone();
            tamper(&mut p);
            assert!(p.validate().is_err(), "{what}: accepted");
            assert!(CpuExecutable::new(p, &w).is_err(), "{what}: compiled");
        }
    }

    #[test]
    fn tampered_prologues_are_refused() {
        // x·y then relu, summed along the rows: one prologue step over x and y.
        let g = load_graph(
            r#"{ "format": "sluice/graph@1",
                 "inputs": { "x": { "shape": [2, 8] }, "y": { "shape": [2, 8] } },
                 "nodes": [
                   { "id": "m", "op": "mul", "inputs": ["x", "y"] },
                   { "id": "r", "op": "relu", "inputs": ["m"] },
                   { "id": "s", "op": "reduce_sum", "inputs": ["r"], "attrs": { "axes": [1] } }
                 ],
                 "outputs": ["s"] }"#,
        )
        .unwrap();
        let w = Weights::new();
        let good = Plan::new(&g).unwrap();
        assert!(matches!(
            good.steps[..],
            [super::super::Step {
                work: Work::Prologue { .. },
                ..
            }]
        ));
        good.validate().unwrap();
        CpuExecutable::new(good.clone(), &w).unwrap();
        // (what it does, what the refusal says, the tampering)
        type Refused = (&'static str, &'static str, fn(&mut Plan));
        let tampers: [Refused; 4] = [
            ("an index reduction", "takes no prologue", |p| {
                if let Work::Prologue { reducer, .. } = &mut p.steps[0].work {
                    *reducer = crate::ops::parse("argmax", &serde_json::Map::new()).unwrap();
                }
            }),
            ("an operand of another shape", "one shape", |p| {
                let s = p.outputs[0].1;
                p.steps[0].inputs[1] = s;
            }),
            ("a term reading a missing operand", "does not exist", |p| {
                if let Work::Prologue { expr, .. } = &mut p.steps[0].work {
                    expr.terms[0].args[0] = Operand::Input(7);
                }
            }),
            ("a reduction of the wrong size", "output values", |p| {
                let s = p.outputs[0].1;
                p.values[s].shape = vec![1];
            }),
        ];
        for (what, says, tamper) in tampers {
            let mut p = good.clone();
            tamper(&mut p);
            let e = p.validate().map(|_| ()).unwrap_err().to_string();
            assert!(e.contains(says), "{what}: {e}");
            assert!(CpuExecutable::new(p, &w).is_err(), "{what}: compiled");
        }
    }

    #[test]
    fn weights_and_limits_are_checked_before_upload() {
        let (p, mut w) = plan();
        let key = p.params[0].0.clone();
        w.insert(key.clone(), Tensor::f32(vec![3, 4], vec![0.0; 5]));
        assert!(p.check_weights(&w).is_err());
        w.remove(&key);
        assert!(matches!(
            p.check_weights(&w),
            Err(RunError::MissingWeight(_))
        ));
        let tiny = Limits {
            max_device_bytes: 16,
            ..Limits::default()
        };
        let e = p.check_limits(&tiny).unwrap_err().to_string();
        assert!(e.contains("max_device_bytes"), "{e}");
        assert!(p.check_limits(&Limits::default()).is_ok());
    }
}
