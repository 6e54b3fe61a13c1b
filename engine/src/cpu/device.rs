//! The CPU behind the execution seam: a plan's steps evaluated with the reference
//! operators ([`super::eval`]), fused units term by term, so the CPU goes through the same
//! planning, batching, micro-batching and pipelines as a GPU. Values in 16-bit storage are
//! rounded to f16 where the plan stores them, as a device would.
//!
//! Two devices share this executor: the reference ([`CpuDevice::new`], `--device
//! reference`, the oracle every other device is tested against) and the fast CPU
//! ([`CpuDevice::fast`], `--device cpu`), which runs matrix products and fused units
//! through [`super::fast`]'s kernels and every other step as the reference does.

use super::eval;
use crate::error::RunError;
use crate::exec::dataset::{check_kept_inputs, check_plan_inputs};
use crate::exec::device::{CompileStats, Device, Executable, TraceContext, Values};
use crate::exec::input::{Input, Inputs};
use crate::plan::cost::Rates;
use crate::plan::expr::{Expr, Operand};
use crate::plan::{HalfStorage, Plan, Work};
use crate::storage::Storage;
use crate::telemetry::{now_ns, Event, EventKind, TimingSource};
use crate::tensor::{Tensor, TensorData};
use crate::weights::Weights;
use futures_util::future::LocalBoxFuture;
use std::collections::{BTreeSet, HashMap, VecDeque};

/// Rounds a float tensor to f16 precision when its storage is 16-bit.
fn stored(t: Tensor, storage: Storage) -> Tensor {
    match (storage.is_half(), t.data) {
        (true, TensorData::F32(v)) => Tensor {
            shape: t.shape,
            data: TensorData::F32(
                v.into_iter()
                    .map(|x| half::f16::from_f32(x).to_f32())
                    .collect(),
            ),
        },
        (_, data) => Tensor {
            shape: t.shape,
            data,
        },
    }
}

/// The CPU as an execution device.
#[derive(Debug, Clone, Default)]
pub struct CpuDevice {
    /// Measured rates, when calibrated.
    pub rates: Option<Rates>,
    /// Whether matrix products and fused units use the fast kernels.
    fast: bool,
}

impl CpuDevice {
    /// The CPU reference device.
    pub fn new() -> CpuDevice {
        CpuDevice::default()
    }

    /// The fast CPU device: multi-threaded GEMM and fused units, the reference elsewhere.
    #[cfg(feature = "native")]
    pub fn fast() -> CpuDevice {
        CpuDevice {
            rates: None,
            fast: true,
        }
    }

    /// The device's name in reports.
    fn label(fast: bool) -> String {
        if fast { "cpu" } else { "cpu (reference)" }.into()
    }
}

/// Rates assumed for the reference interpreter (written for clarity, not speed).
const CPU_RATES: Rates = Rates {
    flops_per_s: 5e8,
    bytes_per_s: 2e9,
    transfer_bytes_per_s: 1e10,
    pass_overhead_s: 0.0,
};

/// Rates assumed for the fast CPU device (a few cores' GEMM) until it is calibrated.
const FAST_CPU_RATES: Rates = Rates {
    flops_per_s: 2e10,
    bytes_per_s: 5e9,
    transfer_bytes_per_s: 1e10,
    pass_overhead_s: 0.0,
};

/// Compiles a session on one CPU reference device per stage, blocking until done.
#[cfg(all(feature = "native", not(target_arch = "wasm32")))]
pub fn session(
    graph: &crate::graph::Graph,
    weights: &Weights,
    config: &crate::exec::RunConfig,
) -> Result<crate::exec::Session, RunError> {
    let devices = (0..config.stages)
        .map(|_| Box::new(CpuDevice::new()) as Box<dyn Device>)
        .collect();
    crate::exec::Session::compile_blocking(graph, weights, config, devices)
}

impl Device for CpuDevice {
    fn name(&self) -> String {
        Self::label(self.fast)
    }

    fn compile<'a>(
        &'a self,
        plan: Plan,
        weights: &'a Weights,
        _prefetch: usize,
    ) -> LocalBoxFuture<'a, Result<Box<dyn Executable>, RunError>> {
        Box::pin(async move {
            let mut exe = CpuExecutable::new(plan, weights)?;
            exe.fast = self.fast;
            Ok(Box::new(exe) as Box<dyn Executable>)
        })
    }

    fn native_f16(&self) -> bool {
        true
    }

    fn faster_half(&self) -> LocalBoxFuture<'_, Result<HalfStorage, RunError>> {
        Box::pin(async { Ok(HalfStorage::Packed) })
    }

    fn rates(&self) -> Rates {
        self.rates
            .unwrap_or(if self.fast { FAST_CPU_RATES } else { CPU_RATES })
    }
}

/// A plan ready to run on the CPU.
pub struct CpuExecutable {
    plan: Plan,
    /// Weights and constants, by storage.
    resident: HashMap<usize, Tensor>,
    /// Inputs kept for later micro-batches ([`Executable::keep_inputs`]); their values
    /// are in `resident`, read in place.
    kept: BTreeSet<String>,
    /// Finished micro-batches not yet collected.
    done: VecDeque<(usize, Values)>,
    stats: CompileStats,
    /// Whether matrix products and fused units use the fast kernels.
    fast: bool,
}

impl CpuExecutable {
    /// Checks the plan ([`Plan::validate`]) and the weights against it, and keeps them
    /// (rounded to their storage).
    pub fn new(plan: Plan, weights: &Weights) -> Result<CpuExecutable, RunError> {
        let started = now_ns();
        plan.validate()?;
        plan.check_weights(weights)?;
        let mut resident = HashMap::new();
        keep_weights(&plan, &mut resident, weights)?;
        for (v, t) in &plan.constants {
            let value = &plan.values[*v];
            resident.insert(value.storage, stored(t.clone(), value.layout));
        }
        let stats = CompileStats {
            pipelines_created: 0,
            passes: plan.steps.len(),
            millis: now_ns().saturating_sub(started) as f64 / 1e6,
        };
        Ok(CpuExecutable {
            plan,
            resident,
            kept: BTreeSet::new(),
            done: VecDeque::new(),
            stats,
            fast: false,
        })
    }

    /// Keeps checked inputs resident, by their plan values' storages, for the micro-batches
    /// after.
    fn keep(&mut self, inputs: Values) {
        for (name, t) in inputs {
            if let Some((_, v)) = self.plan.inputs.iter().find(|(n, _)| *n == name) {
                let value = &self.plan.values[*v];
                self.resident.insert(value.storage, stored(t, value.layout));
                self.kept.insert(name);
            }
        }
    }

    /// A storage's tensor taken as value `v` (a view reshapes its source), checked.
    fn reshaped(&self, t: Tensor, v: usize) -> Result<Tensor, RunError> {
        let value = self
            .plan
            .values
            .get(v)
            .ok_or_else(|| RunError::Internal(format!("value {v} does not exist")))?;
        let t = Tensor {
            shape: value.shape.clone(),
            data: t.data,
        };
        t.check()
            .map_err(|m| RunError::Internal(format!("value '{}': {m}", value.name)))?;
        Ok(t)
    }

    /// The tensor of value `v` among a micro-batch's storages (views reshape their
    /// source), copied out.
    fn value(&self, storages: &Storages<'_>, v: usize) -> Result<Tensor, RunError> {
        let value = self
            .plan
            .values
            .get(v)
            .ok_or_else(|| RunError::Internal(format!("value {v} does not exist")))?;
        let t = match storages.find(&self.resident, value.storage) {
            Some(Found::Tensor(t)) => t.clone(),
            Some(Found::InPlace(data)) => Tensor::f32(value.shape.clone(), data.to_vec()),
            None => {
                return Err(RunError::Internal(format!(
                    "value '{}' not computed",
                    value.name
                )))
            }
        };
        self.reshaped(t, v)
    }

    /// Evaluates an expression's terms at the output's shape (pointwise operators commute
    /// with broadcasting), `anchor` standing for the anchor's result.
    fn expr(
        expr: &Expr,
        inputs: &[Tensor],
        anchor: Option<&Tensor>,
        out_shape: &[usize],
    ) -> Result<Option<Tensor>, String> {
        let mut terms: Vec<Tensor> = Vec::new();
        for term in &expr.terms {
            let args: Vec<Tensor> = term
                .args
                .iter()
                .map(|a| match *a {
                    Operand::Input(k) => inputs
                        .get(k)
                        .cloned()
                        .ok_or_else(|| format!("term '{}' reads a missing input", term.node)),
                    Operand::Term(j) => terms
                        .get(j)
                        .cloned()
                        .ok_or_else(|| format!("term '{}' reads a later term", term.node)),
                    Operand::Scalar(v) => Ok(Tensor::f32(Vec::new(), vec![v])),
                    Operand::Anchor => anchor
                        .cloned()
                        .ok_or_else(|| format!("term '{}' reads a missing anchor", term.node)),
                })
                .collect::<Result<_, _>>()?;
            let refs: Vec<&Tensor> = args.iter().collect();
            let mut out = eval(&term.op, &refs, &[], &[out_shape.to_vec()])?;
            terms.push(out.pop().ok_or("a pointwise term produced nothing")?);
        }
        Ok(terms.pop())
    }

    /// A step through the fast kernels, `None` where they do not cover it (the reference
    /// then runs it). Operands are read in place, never copied.
    #[cfg(feature = "native")]
    fn fast_step(
        &self,
        step: &crate::plan::Step,
        storages: &Storages<'_>,
        out_shapes: &[Vec<usize>],
    ) -> Option<Vec<Tensor>> {
        use crate::ops::{grad::GradOp, movement::MovementOp, Op};
        let operand = |v: usize| -> Option<super::fast::Operand32> {
            let value = self.plan.values.get(v)?;
            let data: &[f32] = match storages.find(&self.resident, value.storage)? {
                Found::Tensor(t) => match &t.data {
                    TensorData::F32(data) => data,
                    _ => return None,
                },
                Found::InPlace(data) => data,
            };
            let numel = value
                .shape
                .iter()
                .try_fold(1usize, |acc, &d| acc.checked_mul(d))?;
            (data.len() == numel).then_some((value.shape.as_slice(), data))
        };
        let ins: Vec<_> = step
            .inputs
            .iter()
            .map(|&v| operand(v))
            .collect::<Option<_>>()?;
        let params: Vec<_> = step
            .params
            .iter()
            .map(|&v| operand(v))
            .collect::<Option<_>>()?;
        let [shape] = out_shapes else {
            return None;
        };
        let data = match &step.work {
            Work::Op(Op::MatMul(op)) => super::fast::matmul(op, &ins, &params)?,
            Work::Op(Op::Reduce(op)) => super::fast::reduce(op, *ins.first()?)?,
            Work::Op(Op::Movement(MovementOp::Transpose { perm })) => {
                let x = *ins.first()?;
                let perm = crate::ops::movement::permutation(perm, x.0.len()).ok()?;
                super::fast::transpose(&perm, x)?
            }
            Work::Op(Op::Elementwise(op)) => super::fast::elementwise(op, &ins, shape)?,
            Work::Op(Op::Grad(GradOp::UnaryGrad(u))) => {
                let [x, dy] = ins.as_slice() else {
                    return None;
                };
                super::fast::unary_grad(*u, *x, *dy, shape)?
            }
            Work::Fused(expr) => super::fast::fused(expr, &ins, None, shape)?,
            Work::Epilogue {
                anchor: Op::MatMul(op),
                anchor_inputs,
                expr,
            } => {
                let a = super::fast::matmul(op, ins.get(..*anchor_inputs)?, &params)?;
                super::fast::fused(expr, &ins, Some(&a), shape)?
            }
            Work::Prologue {
                reducer: Op::Reduce(op),
                expr,
            } => super::fast::fused_reduce(op, expr, &ins, ins.first()?.0)?,
            _ => return None,
        };
        let numel: usize = shape.iter().product();
        (data.len() == numel).then(|| vec![Tensor::f32(shape.clone(), data)])
    }

    /// Without the native feature there are no fast kernels.
    #[cfg(not(feature = "native"))]
    fn fast_step(
        &self,
        _step: &crate::plan::Step,
        _storages: &Storages<'_>,
        _out_shapes: &[Vec<usize>],
    ) -> Option<Vec<Tensor>> {
        None
    }

    /// A step as the reference runs it: every operand copied out, the reference operator.
    fn reference_step(
        &self,
        step: &crate::plan::Step,
        storages: &Storages<'_>,
        out_shapes: &[Vec<usize>],
    ) -> Result<Vec<Tensor>, RunError> {
        let ins: Vec<Tensor> = step
            .inputs
            .iter()
            .map(|&v| self.value(storages, v))
            .collect::<Result<_, _>>()?;
        let params: Vec<Tensor> = step
            .params
            .iter()
            .map(|&v| self.value(storages, v))
            .collect::<Result<_, _>>()?;
        let fail = |message: String| RunError::Op {
            node: step.node.clone(),
            message,
        };
        Ok(match &step.work {
            Work::Op(op) => {
                let refs: Vec<&Tensor> = ins.iter().collect();
                let prefs: Vec<&Tensor> = params.iter().collect();
                eval(op, &refs, &prefs, out_shapes).map_err(fail)?
            }
            Work::Fused(expr) => {
                let shape = out_shapes.first().cloned().unwrap_or_default();
                let t = Self::expr(expr, &ins, None, &shape)
                    .map_err(fail)?
                    .ok_or_else(|| fail("an empty fused unit".into()))?;
                vec![t]
            }
            Work::Epilogue {
                anchor,
                anchor_inputs,
                expr,
            } => {
                let refs: Vec<&Tensor> = ins.iter().take(*anchor_inputs).collect();
                let prefs: Vec<&Tensor> = params.iter().collect();
                let mut a = eval(anchor, &refs, &prefs, out_shapes).map_err(fail)?;
                let a = a
                    .pop()
                    .ok_or_else(|| fail("the anchor produced nothing".into()))?;
                let shape = out_shapes.first().cloned().unwrap_or_default();
                let t = Self::expr(expr, &ins, Some(&a), &shape).map_err(fail)?;
                vec![t.unwrap_or(a)]
            }
            Work::Prologue { reducer, expr } => {
                let folded = ins
                    .first()
                    .map(|t| t.shape.clone())
                    .ok_or_else(|| fail("a prologue without inputs".into()))?;
                let x = Self::expr(expr, &ins, None, &folded)
                    .map_err(fail)?
                    .ok_or_else(|| fail("an empty prologue".into()))?;
                eval(reducer, &[&x], &[], out_shapes).map_err(fail)?
            }
        })
    }

    fn compute(
        &self,
        m: usize,
        mut inputs: Inputs<'_>,
        trace: &TraceContext<'_>,
        events: &mut Vec<Event>,
    ) -> Result<Values, RunError> {
        let mut storages = Storages::default();
        for (name, v) in &self.plan.inputs {
            let t0 = now_ns();
            let value = &self.plan.values[*v];
            let Some(input) = inputs.remove(name) else {
                if self.kept.contains(name) {
                    continue;
                }
                return Err(RunError::Input {
                    name: name.clone(),
                    message: "missing".into(),
                });
            };
            // Samples lying in one piece of the dataset are read where they are (16-bit
            // storage rounds, so it takes a copy).
            let in_place = match &input {
                Input::Rows(rows) if !value.layout.is_half() => rows.contiguous(),
                _ => None,
            };
            match in_place {
                Some(data) => {
                    storages.borrowed.insert(value.storage, data);
                }
                None => {
                    let t = stored(input.into_tensor(), value.layout);
                    storages.computed.insert(value.storage, t);
                }
            }
            let e = trace.event(m, name.clone(), trace.input_kind(name), t0, now_ns());
            trace.record(events, e);
        }
        for step in &self.plan.steps {
            let t0 = now_ns();
            let out_shapes: Vec<Vec<usize>> = step
                .outputs
                .iter()
                .map(|&v| self.plan.values[v].shape.clone())
                .collect();
            let fast = if self.fast {
                self.fast_step(step, &storages, &out_shapes)
            } else {
                None
            };
            let outs = match fast {
                Some(outs) => outs,
                None => self.reference_step(step, &storages, &out_shapes)?,
            };
            for (&v, t) in step.outputs.iter().zip(outs) {
                let value = &self.plan.values[v];
                storages
                    .computed
                    .insert(value.storage, stored(t, value.layout));
            }
            let e = trace.event(m, step.label(), EventKind::Compute, t0, now_ns());
            trace.record(events, e);
        }
        let t0 = now_ns();
        let mut outs = Values::new();
        for (k, (name, v)) in self.plan.outputs.iter().enumerate() {
            // An output whose storage no later output reads moves out uncopied.
            let storage = self.plan.values[*v].storage;
            let last_reader = !self.plan.outputs[k + 1..]
                .iter()
                .any(|(_, w)| self.plan.values[*w].storage == storage);
            let owned = if last_reader {
                storages.computed.remove(&storage)
            } else {
                None
            };
            let t = match owned {
                Some(owned) => self.reshaped(owned, *v)?,
                None => self.value(&storages, *v)?,
            };
            outs.insert(name.clone(), t);
        }
        let kind = trace.output_kind(self.plan.outputs.iter().map(|(n, _)| n.as_str()));
        let e = trace.event(m, "outputs".into(), kind, t0, now_ns().max(t0 + 1));
        trace.record(events, e);
        Ok(outs)
    }
}

/// A micro-batch's storages: the tensors its steps computed (and inputs taken as tensors
/// of their own), and inputs read in place from the dataset. Computed ones come first: a
/// storage the memory plan reuses holds its newest value there.
#[derive(Default)]
struct Storages<'d> {
    computed: HashMap<usize, Tensor>,
    borrowed: HashMap<usize, &'d [f32]>,
}

/// Where a storage's value is.
enum Found<'a> {
    /// A tensor computed this micro-batch, or resident (weights, constants, kept inputs).
    Tensor(&'a Tensor),
    /// An input read in place from the dataset.
    InPlace(&'a [f32]),
}

impl Storages<'_> {
    /// Storage `s`: computed this micro-batch, else resident, else read in place.
    fn find<'a>(&'a self, resident: &'a HashMap<usize, Tensor>, s: usize) -> Option<Found<'a>> {
        if let Some(t) = self.computed.get(&s).or_else(|| resident.get(&s)) {
            return Some(Found::Tensor(t));
        }
        self.borrowed.get(&s).map(|data| Found::InPlace(data))
    }
}

/// Keeps every weight of `plan` in `resident`, rounded to its storage.
fn keep_weights(
    plan: &Plan,
    resident: &mut HashMap<usize, Tensor>,
    weights: &Weights,
) -> Result<(), RunError> {
    for (key, v) in &plan.params {
        let value = &plan.values[*v];
        let w = weights
            .get(key)
            .ok_or_else(|| RunError::MissingWeight(key.clone()))?;
        resident.insert(value.storage, stored(w.clone(), value.layout));
    }
    Ok(())
}

impl Executable for CpuExecutable {
    fn plan(&self) -> &Plan {
        &self.plan
    }

    fn capacity(&self) -> usize {
        1
    }

    fn submit(
        &mut self,
        m: usize,
        inputs: Inputs<'_>,
        trace: &TraceContext<'_>,
        events: &mut Vec<Event>,
    ) -> Result<(), RunError> {
        check_plan_inputs(&self.plan, &inputs, &self.kept)?;
        // A kept input given again replaces the kept value (as it does on a GPU).
        let mut inputs = inputs;
        let given_kept: Values = self
            .kept
            .iter()
            .filter_map(|name| inputs.remove_entry(name))
            .map(|(name, input)| (name, input.into_tensor()))
            .collect();
        self.keep(given_kept);
        let outs = self.compute(m, inputs, trace, events)?;
        self.done.push_back((m, outs));
        Ok(())
    }

    fn complete<'a>(
        &'a mut self,
        _trace: &'a TraceContext<'a>,
        _events: &'a mut Vec<Event>,
    ) -> LocalBoxFuture<'a, Result<(usize, Values), RunError>> {
        let next = self
            .done
            .pop_front()
            .ok_or_else(|| RunError::Internal("completion awaited with nothing in flight".into()));
        Box::pin(async move { next })
    }

    fn keep_inputs(&mut self, inputs: &Values) -> Result<(), RunError> {
        check_kept_inputs(&self.plan, inputs)?;
        self.keep(inputs.clone());
        Ok(())
    }

    fn write_weights(&mut self, weights: &Weights) -> Result<(), RunError> {
        self.plan.check_weights(weights)?;
        keep_weights(&self.plan, &mut self.resident, weights)
    }

    fn allocated_bytes(&self) -> u64 {
        self.resident.values().map(|t| 4 * t.len() as u64).sum()
    }

    fn timing(&self) -> TimingSource {
        TimingSource::HostCompletion
    }

    fn device_name(&self) -> String {
        CpuDevice::label(self.fast)
    }

    fn compile_stats(&self) -> CompileStats {
        self.stats
    }
}
