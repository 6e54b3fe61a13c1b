//! GPU lowering of the indexing family: one invocation per output element. f32 and i32
//! data are read and stored as their own WGSL type (i32 results stay exact); 16-bit
//! storages go through f32 and the generated 16-bit entry point.

use super::Lower;
use crate::dtype::DType;
use crate::gpu::kernel::*;
use crate::ops::indexing::{range_len, shape_axes, IndexingOp, Reduction};
use crate::shape;

const SHADER: &str = include_str!("../../../../shaders/indexing.wgsl");

/// An input of a kernel: its WGSL name, slot and storage.
struct In {
    name: &'static str,
    slot: Slot,
    storage: Storage,
}

/// One kernel computing `value_t` (variant `body`, filled with `fills`) for every element
/// of output 0. Data inputs get `get_NAME` loaders of the element type; `idx` is read as
/// raw i32.
fn kernel(
    label: &str,
    output: &Concrete,
    inputs: &[In],
    body: &str,
    fills: &[(&str, String)],
    info: Vec<u32>,
) -> Result<Kernel, String> {
    let n = output.numel();
    let words = matches!(output.storage, Storage::F32 | Storage::I32);
    let t = if output.storage == Storage::I32 {
        "i32"
    } else {
        "f32"
    };
    let mut b = Bindings::new();
    b.add("dst", Slot::Output(0), output.storage, true);
    let mut loaders = String::new();
    for i in inputs {
        b.add(i.name, i.slot, i.storage, false);
        if i.name == "idx" {
            continue;
        }
        let load = if matches!(i.storage, Storage::F32 | Storage::I32) {
            format!("{}[i]", i.name)
        } else {
            format!("{t}(ld_{}(i))", i.name)
        };
        loaders.push_str(&format!(
            "fn get_{}(i: u32) -> {t} {{\n    return {load};\n}}\n",
            i.name
        ));
    }
    let mut pairs = vec![("T", t.to_string()), ("WG", WG.to_string())];
    pairs.extend(fills.iter().cloned());
    let body = fill(variant(SHADER, body), &pairs);
    let resolve = variant(SHADER, "resolve");
    let combine = if fills.iter().any(|(k, _)| *k == "COMBINE") {
        fill(variant(SHADER, "combine"), &pairs)
    } else {
        String::new()
    };
    let (main, threads) = if words {
        (fill(variant(SHADER, "main_words"), &pairs), n)
    } else {
        let (main, threads) = per_element_main(output.storage, n);
        (format!("{}\n{main}", variant(SHADER, "main_half")), threads)
    };
    let mut info = info;
    info[0] = word(n)?;
    Ok(Kernel {
        label: label.into(),
        source: format!(
            "{}\n{loaders}\n{resolve}\n{combine}\n{body}\n{main}",
            b.wgsl()
        ),
        slots: b.slots(),
        info,
        workgroups: dispatch_1d(threads, WG)?,
    })
}

fn words(v: &[usize]) -> Result<Vec<u32>, String> {
    v.iter().map(|&d| word(d)).collect()
}

fn combine(r: Reduction) -> String {
    match r {
        Reduction::None => "b",
        Reduction::Add => "a + b",
        Reduction::Mul => "a * b",
        Reduction::Max => "max(a, b)",
        Reduction::Min => "min(a, b)",
    }
    .into()
}

fn reduction_label(r: Reduction) -> &'static str {
    match r {
        Reduction::None => "none",
        Reduction::Add => "add",
        Reduction::Mul => "mul",
        Reduction::Max => "max",
        Reduction::Min => "min",
    }
}

impl Lower for IndexingOp {
    /// GPU kernel.
    fn lower(&self, ctx: &LowerCtx) -> Result<Lowering, String> {
        let out = &ctx.outputs[0];
        if out.numel() == 0 {
            return Ok(Lowering::Kernels(Vec::new()));
        }
        let input = |k: usize, name: &'static str| -> Result<In, String> {
            let c = ctx
                .inputs
                .get(k)
                .ok_or_else(|| format!("{} lacks input {k}", self.name()))?;
            Ok(In {
                name,
                slot: Slot::Input(k),
                storage: c.storage,
            })
        };
        let dims = |k: usize| -> Result<&[usize], String> {
            ctx.inputs
                .get(k)
                .map(|c| c.shape.as_slice())
                .ok_or_else(|| format!("{} lacks input {k}", self.name()))
        };
        let k = match self {
            IndexingOp::GatherElements { axis } => {
                let x = dims(0)?;
                let a = shape::existing_axis(*axis, x.len())?;
                if x[a] == 0 {
                    return Err("gather_elements indexes an empty axis".into());
                }
                let mut info = vec![0, word(x.len())?, word(a)?, word(x[a])?];
                info.extend(words(&out.shape)?);
                info.extend(words(&shape::strides(x)?)?);
                kernel(
                    "gather_elements",
                    out,
                    &[input(0, "src")?, input(1, "idx")?],
                    "gather_elements",
                    &[],
                    info,
                )?
            }
            IndexingOp::ScatterElements { axis, reduction } => {
                let (x, i) = (dims(0)?, dims(1)?);
                let a = shape::existing_axis(*axis, x.len())?;
                let mut info = vec![0, word(x.len())?, word(a)?, word(x[a].max(1))?];
                info.extend(words(x)?);
                info.extend(words(i)?);
                info.extend(words(&shape::strides(i)?)?);
                kernel(
                    &format!("scatter_elements {}", reduction_label(*reduction)),
                    out,
                    &[input(0, "src")?, input(1, "idx")?, input(2, "upd")?],
                    "scatter_elements",
                    &[("COMBINE", combine(*reduction))],
                    info,
                )?
            }
            IndexingOp::GatherNd { batch_dims } => {
                let (x, i) = (dims(0)?, dims(1)?);
                let b = *batch_dims;
                let m = *i.last().ok_or("gather_nd indices have no axes")?;
                let addressed = x.get(b..b + m).ok_or("gather_nd tuples exceed data")?;
                if addressed.contains(&0) {
                    return Err("gather_nd indexes an empty axis".into());
                }
                let strides = shape::strides(x)?;
                let mut info = vec![
                    0,
                    word(m)?,
                    word(shape::numel(&x[b + m..])?.max(1))?,
                    word(shape::numel(&i[b..i.len() - 1])?.max(1))?,
                    word(shape::numel(&x[b..])?)?,
                ];
                info.extend(words(addressed)?);
                info.extend(words(&strides[b..b + m])?);
                kernel(
                    "gather_nd",
                    out,
                    &[input(0, "src")?, input(1, "idx")?],
                    "gather_nd",
                    &[],
                    info,
                )?
            }
            IndexingOp::ScatterNd { reduction } => {
                let (x, i) = (dims(0)?, dims(1)?);
                let m = *i.last().ok_or("scatter_nd indices have no axes")?;
                let addressed = x.get(..m).ok_or("scatter_nd tuples exceed data")?;
                let strides = shape::strides(x)?;
                let mut info = vec![
                    0,
                    word(m)?,
                    word(shape::numel(&x[m..])?.max(1))?,
                    word(shape::numel(&i[..i.len() - 1])?)?,
                ];
                info.extend(words(addressed)?);
                info.extend(words(&strides[..m])?);
                kernel(
                    &format!("scatter_nd {}", reduction_label(*reduction)),
                    out,
                    &[input(0, "src")?, input(1, "idx")?, input(2, "upd")?],
                    "scatter_nd",
                    &[("COMBINE", combine(*reduction))],
                    info,
                )?
            }
            IndexingOp::Tile { .. } => {
                let x = dims(0)?;
                let mut info = vec![0, word(x.len())?];
                info.extend(words(&out.shape)?);
                info.extend(words(x)?);
                info.extend(words(&shape::strides(x)?)?);
                kernel("tile", out, &[input(0, "src")?], "tile", &[], info)?
            }
            IndexingOp::Trilu { upper, k } => {
                let r = out.shape.len();
                let kw = i32::try_from(*k).map_err(|_| format!("trilu k {k} exceeds i32"))?;
                let info = vec![
                    0,
                    word(out.shape[r - 2])?,
                    word(out.shape[r - 1])?,
                    kw as u32,
                    u32::from(*upper),
                ];
                kernel("trilu", out, &[input(0, "src")?], "trilu", &[], info)?
            }
            IndexingOp::Range {
                start,
                limit,
                delta,
                dtype,
            } => {
                range_len(*start, *limit, *delta)?;
                let (s, d) = if *dtype == DType::I32 {
                    // Parsing keeps them integers an i32 holds.
                    ((*start as i32) as u32, (*delta as i32) as u32)
                } else {
                    (start.to_bits(), delta.to_bits())
                };
                kernel("range", out, &[], "range", &[], vec![0, s, d])?
            }
            IndexingOp::Shape { start, end } => {
                let x = dims(0)?;
                let (s, e) = shape_axes(*start, *end, x.len());
                let mut info = vec![0, 1];
                for &d in &x[s..e] {
                    info.push(word(d)?);
                }
                kernel("shape", out, &[], "fill", &[], info)?
            }
            IndexingOp::ConstantOfShape { value, dtype, .. } => {
                let v = if *dtype == DType::I32 {
                    // Parsing keeps an i32 value an integer an i32 holds.
                    (*value as i32) as u32
                } else {
                    value.to_bits()
                };
                kernel("constant_of_shape", out, &[], "fill", &[], vec![0, 0, v])?
            }
        };
        Ok(Lowering::Kernels(vec![k]))
    }
}
