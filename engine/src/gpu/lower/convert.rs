//! GPU lowering of the convert family.

use super::Lower;
use crate::dtype::DType;
use crate::gpu::kernel::*;
use crate::ops::convert::*;
use crate::shape::broadcast_strides;

const SHADER: &str = include_str!("../../../../shaders/convert.wgsl");

/// The WGSL reading element `index` of binding `name` holding `t`: an f32 for float
/// storages, the i32 itself for i32, and the u32 0/1 for bool.
fn read(name: &str, t: &Concrete, index: &str) -> String {
    match t.storage {
        Storage::I32 | Storage::Bool => format!("{name}[{index}]"),
        _ => format!("ld_{name}({index})"),
    }
}

impl Lower for ConvertOp {
    /// GPU kernel.
    fn lower(&self, ctx: &LowerCtx) -> Result<Lowering, String> {
        let (input, out) = (&ctx.inputs[0], &ctx.outputs[0]);
        let n = out.numel();
        let mut b = Bindings::new();
        b.add("dst", Slot::Output(0), out.storage, true);
        let mut info = vec![word(n)?];
        let common = variant(SHADER, "common");
        let body = match self {
            ConvertOp::Compare(_) | ConvertOp::Logic(_) => {
                info.push(word(out.shape.len())?);
                for &d in &out.shape {
                    info.push(word(d)?);
                }
                let mut args = Vec::new();
                for (k, t) in ctx.inputs.iter().enumerate() {
                    for s in broadcast_strides(&t.shape, &out.shape)? {
                        info.push(word(s)?);
                    }
                    let name = format!("src{k}");
                    b.add(&name, Slot::Input(k), t.storage, false);
                    args.push(read(&name, t, &format!("sl_offset(i, {k}u)")));
                }
                let arg = |k: usize| -> Result<String, String> {
                    args.get(k)
                        .cloned()
                        .ok_or_else(|| "internal: an operand is missing".to_string())
                };
                let word_fn = match self {
                    ConvertOp::Compare(c) => {
                        let op = match c {
                            Comparison::Equal => "==",
                            Comparison::Less => "<",
                            Comparison::Greater => ">",
                            Comparison::LessOrEqual => "<=",
                            Comparison::GreaterOrEqual => ">=",
                        };
                        fill(
                            variant(SHADER, "compare"),
                            &[("A", arg(0)?), ("B", arg(1)?), ("OP", op.into())],
                        )
                    }
                    ConvertOp::Logic(l) => {
                        if ctx.inputs.iter().any(|t| t.storage != Storage::Bool) {
                            return Err(format!("internal: '{}' needs bool operands", l.name()));
                        }
                        let bit = |k: usize| -> Result<String, String> {
                            Ok(format!("({} != 0u)", arg(k)?))
                        };
                        let expr = match l {
                            Logic::Not => format!("!{}", bit(0)?),
                            Logic::And => format!("{} && {}", bit(0)?, bit(1)?),
                            Logic::Or => format!("{} || {}", bit(0)?, bit(1)?),
                            Logic::Xor => format!("{} != {}", bit(0)?, bit(1)?),
                        };
                        fill(variant(SHADER, "logic"), &[("EXPR", expr)])
                    }
                    _ => return Err("internal: not a comparison".into()),
                };
                format!("{}\n{word_fn}\n{}", variant(SHADER, "offset"), words_main())
            }
            ConvertOp::Cast { to, round_to } => {
                b.add("src", Slot::Input(0), input.storage, false);
                let x = read("src", input, "i");
                let (name, expr) = match (input.dtype, to) {
                    (DType::F32, DType::I32) => ("to_i32", format!("sl_to_i32({x})")),
                    (DType::I32, DType::I32) => ("to_i32", x),
                    (DType::Bool, DType::I32) => ("to_i32", format!("i32({x})")),
                    (DType::F32, DType::Bool) => (
                        "to_bool",
                        format!("select(0u, 1u, sl_isnan({x}) || {x} != 0.0)"),
                    ),
                    (DType::I32, DType::Bool) => ("to_bool", format!("select(0u, 1u, {x} != 0)")),
                    (DType::Bool, DType::Bool) => ("to_bool", format!("select(0u, 1u, {x} != 0u)")),
                    (DType::F32, DType::F32) => ("to_f32", x),
                    (_, DType::F32) => ("to_f32", format!("f32({x})")),
                };
                let f = match round_to {
                    // The value rounded to the 16-bit float on its bits, then kept as f32.
                    Some(half) => {
                        let rounded = match half {
                            HalfFormat::F16 => format!("sl_round_f16({expr})"),
                            HalfFormat::Bf16 => format!("sl_round_bf16({expr})"),
                        };
                        let f = fill(variant(SHADER, name), &[("EXPR", rounded)]);
                        format!("{}\n{f}", variant(SHADER, "round_half"))
                    }
                    None => fill(variant(SHADER, name), &[("EXPR", expr)]),
                };
                if *to == DType::F32 {
                    per_element(&f, out.storage, n)?
                } else {
                    format!("{f}\n{}", words_main())
                }
            }
            ConvertOp::OneHot { depth } => {
                if input.storage != Storage::I32 {
                    return Err(format!(
                        "one_hot needs i32 indices, got {:?}",
                        input.storage
                    ));
                }
                b.add("src", Slot::Input(0), input.storage, false);
                info.push(word(*depth)?);
                per_element(variant(SHADER, "one_hot"), out.storage, n)?
            }
            ConvertOp::DropoutTrain { ratio, seed } => {
                let stream = ctx
                    .inputs
                    .get(1)
                    .ok_or("dropout_train needs its stream input")?;
                if stream.storage != Storage::I32 {
                    return Err(format!(
                        "dropout_train needs an i32 stream, got {:?}",
                        stream.storage
                    ));
                }
                b.add("src", Slot::Input(0), input.storage, false);
                b.add("stream", Slot::Input(1), stream.storage, false);
                info.extend([
                    *seed,
                    dropout_threshold(*ratio),
                    dropout_scale(*ratio).to_bits(),
                ]);
                per_element(variant(SHADER, "dropout_train"), out.storage, n)?
            }
        };
        let workgroups = if out.storage == Storage::Packed {
            dispatch_1d(n.div_ceil(2), WG)?
        } else {
            dispatch_1d(n, WG)?
        };
        Ok(Lowering::Kernels(vec![Kernel {
            label: self.name().to_string(),
            source: format!("{}\n{common}\n{body}", b.wgsl()),
            slots: b.slots(),
            info,
            workgroups,
        }]))
    }
}

/// The entry point writing `word(i)` to every element of an i32 or bool output.
fn words_main() -> String {
    fill(variant(SHADER, "words"), &[("WG", WG.to_string())])
}

/// `value` and the generated entry point for a float output in `storage`.
fn per_element(value: &str, storage: Storage, n: usize) -> Result<String, String> {
    if !matches!(storage, Storage::F32 | Storage::F16 | Storage::Packed) {
        return Err(format!("internal: a float output stored as {storage:?}"));
    }
    let (main, _) = per_element_main(storage, n);
    Ok(format!("{value}\n{main}"))
}
