//! A plan lowered for the wgpu backend: every step becomes one or more WGSL passes with
//! their bindings (plan values or scratch buffers private to the backend). Pure: it is
//! what the executable compiles, what `sluice plan --kernels` prints and what the shader
//! tests validate, without a device.

use super::kernel::{f32_literal, Epilogue, Kernel, Lanes4, LowerCtx, Lowering, Prologue, Slot};
use super::lower::elementwise::elementwise_kernel;
use super::lower::{lower_op, pointwise_wgsl};
use super::tuning::Tuning;
use crate::error::RunError;
use crate::plan::expr::{Expr, Operand, Term};
use crate::plan::{Plan, Precision, Step, Work};
use crate::storage::Storage;
use serde::Serialize;

pub use super::kernel::Concrete;

/// What a binding of a pass refers to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Buffer {
    /// A value of the plan (its buffer).
    Value(usize),
    /// A scratch buffer of the program.
    Scratch(usize),
    /// A texture of the program (see [`Program::textures`]).
    Texture(usize),
}

/// One compute pass.
#[derive(Debug, Clone, Serialize)]
pub struct Pass {
    /// The plan step it belongs to.
    pub step: usize,
    /// The step's label (node, or fused nodes), for events.
    pub label: String,
    /// The kernel.
    pub kernel: Kernel,
    /// What binding i+1 of the kernel refers to.
    pub buffers: Vec<Buffer>,
}

/// A plan as WGSL passes.
#[derive(Debug, Clone, Serialize)]
pub struct Program {
    /// Passes in execution order.
    pub passes: Vec<Pass>,
    /// Bytes of each scratch buffer.
    pub scratch: Vec<u64>,
    /// Width and height in texels of each rgba32float texture.
    pub textures: Vec<[u32; 2]>,
}

fn concrete(plan: &Plan, v: usize) -> Concrete {
    let value = &plan.values[v];
    Concrete {
        shape: value.shape.clone(),
        dtype: value.dtype,
        storage: value.layout,
    }
}

/// The WGSL of one term: its operator applied to its operands, with `input` naming each
/// input and `earlier` each earlier term.
fn term_wgsl(
    term: &Term,
    input: &dyn Fn(usize) -> String,
    earlier: &dyn Fn(usize) -> String,
) -> Result<String, String> {
    let args: Vec<String> = term
        .args
        .iter()
        .map(|a| match *a {
            Operand::Input(k) => input(k),
            Operand::Term(i) => earlier(i),
            Operand::Scalar(v) => f32_literal(v),
            Operand::Anchor => "x".into(),
        })
        .collect();
    pointwise_wgsl(&term.op, &args)
}

/// WGSL statements `let tJ = ...;` for the terms of an expression, with `operand` naming
/// each input, and the name of the result.
fn statements(expr: &Expr, operand: &dyn Fn(usize) -> String) -> Result<(String, String), String> {
    let mut stmts = String::new();
    for (j, term) in expr.terms.iter().enumerate() {
        let value = term_wgsl(term, operand, &|i| format!("t{i}"))?;
        stmts.push_str(&format!("    let t{j} = {value};\n"));
    }
    let result = match expr.terms.len() {
        0 => "x".to_string(),
        n => format!("t{}", n - 1),
    };
    Ok((stmts, result))
}

/// [`statements`] for four neighbouring elements (see [`Lanes4`]) of an expression without
/// an anchor.
fn statements4(expr: &Expr) -> Result<Lanes4, String> {
    const LANES: [&str; 4] = ["x", "y", "z", "w"];
    let last = expr
        .terms
        .len()
        .checked_sub(1)
        .ok_or("internal: a vec4 expression without terms")?;
    let mut stmts = String::new();
    for (j, term) in expr.terms.iter().enumerate() {
        if term.args.contains(&Operand::Anchor) {
            return Err("internal: a vec4 expression with an anchor".into());
        }
        for c in LANES {
            let value = term_wgsl(term, &|k| format!("v{k}.{c}"), &|i| format!("t{i}_{c}"))?;
            stmts.push_str(&format!("    let t{j}_{c} = {value};\n"));
        }
    }
    Ok(Lanes4 {
        stmts,
        results: LANES.map(|c| format!("t{last}_{c}")),
    })
}

/// The kernels of one step and the private resources they use.
struct StepKernels {
    kernels: Vec<Kernel>,
    /// f32 element counts of the scratch buffers.
    scratch: Vec<usize>,
    /// Sizes of the textures.
    textures: Vec<[u32; 2]>,
}

/// The kernels of one step.
fn step_kernels(plan: &Plan, step: &Step, tuning: &Tuning) -> Result<StepKernels, String> {
    let inputs: Vec<Concrete> = step.inputs.iter().map(|&v| concrete(plan, v)).collect();
    let outputs: Vec<Concrete> = step.outputs.iter().map(|&v| concrete(plan, v)).collect();
    let params: Vec<Concrete> = step.params.iter().map(|&v| concrete(plan, v)).collect();
    let f16_compute = plan.options.precision == Precision::F16;
    let out = outputs.first().ok_or("internal: a step without outputs")?;
    let pointwise = |label: &str, body: (&str, &str), lanes4| -> Result<Kernel, String> {
        elementwise_kernel(
            label,
            body,
            lanes4,
            &inputs,
            &out.shape,
            out.storage,
            step.in_place,
        )
    };
    let lowering = match &step.work {
        Work::Op(op) if step.in_place.is_some() => {
            let args: Vec<String> = (0..inputs.len()).map(|i| format!("x{i}")).collect();
            let expr = pointwise_wgsl(op, &args)?;
            Lowering::Kernels(vec![pointwise(op.name(), ("", &expr), None)?])
        }
        Work::Op(op) => lower_op(
            op,
            &LowerCtx {
                inputs: &inputs,
                outputs: &outputs,
                params: &params,
                epilogue: &Epilogue::identity(),
                prologue: None,
                f16_compute,
                tuning,
            },
        )?,
        Work::Prologue { reducer, expr } => {
            let (stmts, result) = statements(expr, &|k| format!("x{k}"))?;
            let prologue = Prologue {
                stmts,
                result,
                lanes4: statements4(expr)?,
                fused: expr.op_names().iter().map(|s| s.to_string()).collect(),
            };
            lower_op(
                reducer,
                &LowerCtx {
                    inputs: &inputs,
                    outputs: &outputs,
                    params: &params,
                    epilogue: &Epilogue::identity(),
                    prologue: Some(&prologue),
                    f16_compute,
                    tuning,
                },
            )?
        }
        Work::Fused(expr) => {
            let (stmts, result) = statements(expr, &|k| format!("x{k}"))?;
            let lanes4 = statements4(expr)?;
            let label = format!("fused {}", step.nodes.join("+"));
            Lowering::Kernels(vec![pointwise(&label, (&stmts, &result), Some(&lanes4))?])
        }
        Work::Epilogue {
            anchor,
            anchor_inputs,
            expr,
        } => {
            let first = *anchor_inputs;
            let (stmts, result) = statements(expr, &|k| format!("ld_e{}(col)", k - first))?;
            let extras = first..inputs.len();
            let epilogue = Epilogue {
                stmts,
                result,
                extra_slots: extras.clone().map(Slot::Input).collect(),
                extra_storages: extras.map(|k| inputs[k].storage).collect(),
                fused: expr.op_names().iter().map(|s| s.to_string()).collect(),
            };
            lower_op(
                anchor,
                &LowerCtx {
                    inputs: &inputs[..first],
                    outputs: &outputs,
                    params: &params,
                    epilogue: &epilogue,
                    prologue: None,
                    f16_compute,
                    tuning,
                },
            )?
        }
    };
    let (kernels, scratch, textures) = match lowering {
        Lowering::Kernels(k) => (k, Vec::new(), Vec::new()),
        Lowering::KernelsWithScratch(k, s) => (k, s, Vec::new()),
        Lowering::KernelsWithTextures(k, t) => (k, Vec::new(), t),
    };
    Ok(StepKernels {
        kernels,
        scratch,
        textures,
    })
}

/// Lowers every step of a plan to WGSL passes with the default kernel choices. Passes with
/// nothing to do (empty tensors) are left out.
pub fn lower_plan(plan: &Plan) -> Result<Program, RunError> {
    lower_plan_tuned(plan, &Tuning::none())
}

/// [`lower_plan`] with the kernel choices of `tuning` (which notes the tunable problems
/// it meets).
pub fn lower_plan_tuned(plan: &Plan, tuning: &Tuning) -> Result<Program, RunError> {
    let mut program = Program {
        passes: Vec::new(),
        scratch: Vec::new(),
        textures: Vec::new(),
    };
    for (i, step) in plan.steps.iter().enumerate() {
        let StepKernels {
            kernels,
            scratch,
            textures,
        } = step_kernels(plan, step, tuning).map_err(|message| RunError::Op {
            node: step.node.clone(),
            message,
        })?;
        let base = program.scratch.len();
        program
            .scratch
            .extend(scratch.iter().map(|&n| Storage::F32.bytes(n)));
        let texture_base = program.textures.len();
        program.textures.extend(&textures);
        for kernel in kernels {
            let buffers = kernel
                .slots
                .iter()
                .map(|slot| match *slot {
                    Slot::Input(k) => step.inputs.get(k).copied().map(Buffer::Value),
                    Slot::Output(k) => step.outputs.get(k).copied().map(Buffer::Value),
                    Slot::Param(k) => step.params.get(k).copied().map(Buffer::Value),
                    Slot::Scratch(k) => (k < scratch.len()).then_some(Buffer::Scratch(base + k)),
                    Slot::Texture(k) => {
                        (k < textures.len()).then_some(Buffer::Texture(texture_base + k))
                    }
                })
                .collect::<Option<Vec<Buffer>>>()
                .ok_or_else(|| {
                    RunError::Internal(format!("kernel '{}' binds a missing slot", kernel.label))
                })?;
            if kernel.workgroups.contains(&0) {
                continue;
            }
            program.passes.push(Pass {
                step: i,
                label: step.label(),
                kernel,
                buffers,
            });
        }
    }
    Ok(program)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::elementwise::{Binary, ElementwiseOp, Unary};
    use crate::ops::Op;

    fn term(op: ElementwiseOp, args: Vec<Operand>) -> Term {
        Term {
            node: "n".into(),
            op: Op::Elementwise(op),
            args,
        }
    }

    #[test]
    fn four_lanes_interleave_term_by_term_and_read_each_lane_of_each_operand() {
        // relu(x0 · x1) − 0.5
        let expr = Expr {
            terms: vec![
                term(
                    ElementwiseOp::Binary(Binary::Mul),
                    vec![Operand::Input(0), Operand::Input(1)],
                ),
                term(ElementwiseOp::Unary(Unary::Relu), vec![Operand::Term(0)]),
                term(
                    ElementwiseOp::Binary(Binary::Sub),
                    vec![Operand::Term(1), Operand::Scalar(0.5)],
                ),
            ],
        };
        let four = statements4(&expr).unwrap();
        let names: Vec<&str> = four
            .stmts
            .lines()
            .map(|l| l.trim().split(' ').nth(1).unwrap())
            .collect();
        assert_eq!(
            names,
            [
                "t0_x", "t0_y", "t0_z", "t0_w", "t1_x", "t1_y", "t1_z", "t1_w", "t2_x", "t2_y",
                "t2_z", "t2_w"
            ]
        );
        assert!(
            four.stmts.contains("let t0_z = (v0.z * v1.z);"),
            "{}",
            four.stmts
        );
        assert!(four.stmts.contains("t1_w"), "{}", four.stmts);
        assert_eq!(four.results, ["t2_x", "t2_y", "t2_z", "t2_w"]);
        // Each lane computes what the one-element form computes.
        let (one, result) = statements(&expr, &|k| format!("x{k}")).unwrap();
        let lane_y: String = four
            .stmts
            .lines()
            .filter(|l| l.contains("_y ="))
            .map(|l| {
                format!(
                    "{}\n",
                    l.replace("_y", "").replace(".y", "").replace('v', "x")
                )
            })
            .collect();
        assert_eq!(lane_y, one);
        assert_eq!(result, "t2");
        let anchored = Expr {
            terms: vec![term(
                ElementwiseOp::Unary(Unary::Relu),
                vec![Operand::Anchor],
            )],
        };
        assert!(statements4(&anchored).is_err());
        assert!(statements4(&Expr::default()).is_err());
    }
}
