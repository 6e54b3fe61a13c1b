//! GPU lowering of the reduce family.

use super::Lower;
use crate::gpu::kernel::*;
use crate::ops::reduce::*;
use crate::shape;

const SHADER: &str = include_str!("../../../../shaders/reduce.wgsl");

impl Lower for ReduceOp {
    /// GPU kernel.
    fn lower(&self, ctx: &LowerCtx) -> Result<Lowering, String> {
        let axes = self.axes(ctx.inputs[0].shape.len())?;
        Ok(Lowering::Kernels(vec![reduce_kernel(
            self.name(),
            &ctx.inputs[0],
            &ctx.outputs[0],
            &axes,
            self.kind,
            ctx.f16_compute,
        )?]))
    }
}

/// A kernel reducing `input` over `axes` (sorted) into `output` as `kind` says: sums
/// accumulate in f16 when `f16_compute`, maxima and argmax always compare in f32.
pub fn reduce_kernel(
    label: &str,
    input: &Concrete,
    output: &Concrete,
    axes: &[usize],
    kind: ReduceKind,
    f16_compute: bool,
) -> Result<Kernel, String> {
    let x = &input.shape;
    let strides = shape::strides(x)?;
    let kept: Vec<usize> = (0..x.len()).filter(|i| !axes.contains(i)).collect();
    let n_out: usize = kept.iter().map(|&i| x[i]).product();
    let count: usize = axes.iter().map(|&i| x[i]).product();
    // The reduced elements are contiguous when the axes are the trailing ones.
    let contiguous = axes
        .iter()
        .enumerate()
        .all(|(k, &a)| a == x.len() - axes.len() + k);
    let scale = if kind == ReduceKind::Mean && count > 0 {
        1.0 / count as f32
    } else {
        1.0
    };
    let mut info = vec![
        word(n_out)?,
        word(count)?,
        word(kept.len())?,
        word(axes.len())?,
        u32::from(contiguous),
        scale.to_bits(),
    ];
    for &i in &kept {
        info.push(word(x[i])?);
    }
    for &i in &kept {
        info.push(word(strides[i])?);
    }
    for &i in axes {
        info.push(word(x[i])?);
    }
    for &i in axes {
        info.push(word(strides[i])?);
    }
    let mut b = Bindings::new();
    b.add("dst", Slot::Output(0), output.storage, true);
    b.add("src", Slot::Input(0), input.storage, false);
    let common = variant(SHADER, "common");
    if kind == ReduceKind::ArgMax {
        if output.storage != Storage::I32 || count == 0 {
            return Err(format!(
                "argmax needs an i32 output and a non-empty axis, got {:?} over {count}",
                output.storage
            ));
        }
        let body = fill(variant(SHADER, "argmax"), &[("WG", WG.to_string())]);
        return Ok(Kernel {
            label: format!("{label} argmax"),
            source: format!("{}\n{common}\n{body}", b.wgsl()),
            slots: b.slots(),
            info,
            workgroups: dispatch_1d(n_out, WG)?,
        });
    }
    let (acc, combine, init) = match kind {
        ReduceKind::Max if count == 0 => {
            return Err(format!("{label} over an empty axis has no value"));
        }
        ReduceKind::Max => ("f32", "max", "ld_src(base + red_offset(0u))"),
        _ if f16_compute => ("f16", "sum", "f16(0.0)"),
        _ => ("f32", "sum", "f32(0.0)"),
    };
    let combine = fill(variant(SHADER, combine), &[("ACC", acc.into())]);
    let group = count >= WG as usize && n_out <= (MAX_GROUPS as usize) * (MAX_GROUPS as usize);
    let (name, body, workgroups) = if group {
        let packed = output.storage == Storage::Packed;
        let per = if packed { 2 } else { 1 };
        let store = if packed {
            "        dst[g] = sl_pack2(results);".to_string()
        } else {
            "        st_dst(g, results.x);".to_string()
        };
        let body = fill(
            variant(SHADER, "group"),
            &[
                ("WG", WG.to_string()),
                ("ACC", acc.into()),
                ("INIT", init.into()),
                ("PER_GROUP", per.to_string()),
                ("STORE", store),
            ],
        );
        ("group", body, dispatch_1d(n_out.div_ceil(per), 1)?)
    } else {
        let value = fill(
            variant(SHADER, "thread"),
            &[("ACC", acc.into()), ("INIT", init.into())],
        );
        let (main, threads) = per_element_main(output.storage, n_out);
        (
            "thread",
            format!("{value}\n{main}"),
            dispatch_1d(threads, WG)?,
        )
    };
    Ok(Kernel {
        label: format!("{label} {name}"),
        source: format!("{}\n{common}\n{combine}\n{body}", b.wgsl()),
        slots: b.slots(),
        info,
        workgroups,
    })
}
