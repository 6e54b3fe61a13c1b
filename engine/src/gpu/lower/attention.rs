//! GPU lowering of the attention family.

use super::Lower;
use crate::gpu::kernel::*;
use crate::ops::attention::*;

const SHADER: &str = include_str!("../../../../shaders/attention.wgsl");

impl Lower for AttentionOp {
    /// Two passes: the weights of every query row into f32 scratch (one invocation per
    /// row), then every output element from them (one invocation per element, or per pair
    /// for packed 16-bit outputs): Y = P·V, or P itself for `attention_probs`.
    fn lower(&self, ctx: &LowerCtx) -> Result<Lowering, String> {
        let shapes: Vec<&[usize]> = ctx.inputs.iter().map(|c| c.shape.as_slice()).collect();
        let g = self.geometry(&shapes)?;
        let output = &ctx.outputs[0];
        let rows = g
            .batch
            .checked_mul(g.q_heads)
            .and_then(|r| r.checked_mul(g.sq))
            .ok_or("attention: too many rows")?;
        let scratch = rows
            .checked_mul(g.skv)
            .ok_or("attention: too many weights")?;
        let (mask, lens) = self.mask_and_lengths(ctx.inputs, |c| c.shape.as_slice());
        let (ms, mask_len) = match mask {
            Some(m) => mask_layout(&m.shape, &g)?,
            None => ([0; 4], g.skv),
        };
        let qs = g.strides(g.q_heads, g.sq, g.d);
        let ks = g.strides(g.kv_heads, g.skv, g.d);
        let vs = g.strides(g.kv_heads, g.skv, g.dv);
        let mut info = vec![
            word(rows)?,
            word(g.sq)?,
            word(g.skv)?,
            word(g.d)?,
            word(g.q_heads)?,
            word(g.group())?,
            g.scale.to_bits(),
            self.softcap.to_bits(),
            u32::from(self.is_causal),
            word(mask_len)?,
        ];
        for s in qs.iter().chain(&ks).chain(&ms).chain(&vs) {
            info.push(word(*s)?);
        }
        info.push(word(g.dv)?);
        info.push(u32::from(g.three_d));
        for w in [self.left_window, self.right_window] {
            // Windows beyond 2^30 bound nothing a checked plan has; smaller words keep
            // the kernel's i32 position arithmetic from overflowing.
            info.push(w.map_or(Ok(u32::MAX), |w| word(w.min(1 << 30)))?);
        }

        let mut wb = Bindings::new();
        wb.add("q", Slot::Input(0), ctx.inputs[0].storage, false);
        wb.add("k", Slot::Input(1), ctx.inputs[1].storage, false);
        let mask_code = match mask {
            None => String::new(),
            Some(m) => {
                let (mask_at, _) = self.optional_inputs();
                wb.add("mask", Slot::Input(mask_at), m.storage, false);
                if m.storage == Storage::Bool {
                    "if (ld_mask(mi) < 0.5) {\n        return vec2<f32>(0.0, 0.0);\n    }".into()
                } else {
                    "let mv = ld_mask(mi);\n    if (mv < -3.4028234e38) {\n        return vec2<f32>(0.0, 0.0);\n    }\n    s = s + mv;".into()
                }
            }
        };
        let lens_code = match lens {
            Some(l) => {
                wb.add(
                    "lens",
                    Slot::Input(self.optional_inputs().1),
                    l.storage,
                    false,
                );
                "let n = i32(ld_lens(b));\n    return vec2<i32>(clamp(n, 0, i32(info[2])), n - i32(info[1]));"
            }
            None => "return vec2<i32>(i32(info[2]), 0);",
        };
        wb.add("probs", Slot::Scratch(0), Storage::F32, true);
        let weights = Kernel {
            label: "attention weights".into(),
            source: format!(
                "{}\n{}\n{}",
                wb.wgsl(),
                fill(
                    variant(SHADER, "attention_common"),
                    &[("MASK", mask_code), ("LENS", lens_code.into())]
                ),
                fill(
                    variant(SHADER, "attention_weights"),
                    &[("WG", WG.to_string())]
                )
            ),
            slots: wb.slots(),
            info: info.clone(),
            workgroups: dispatch_1d(rows, WG)?,
        };

        let mut ob = Bindings::new();
        ob.add("dst", Slot::Output(0), output.storage, true);
        if !self.probs {
            ob.add("v", Slot::Input(2), ctx.inputs[2].storage, false);
        }
        ob.add("probs", Slot::Scratch(0), Storage::F32, false);
        let (main, threads) = per_element_main(output.storage, output.numel());
        let (label, value) = if self.probs {
            ("attention_probs", variant(SHADER, "attention_probs"))
        } else {
            ("attention output", variant(SHADER, "attention_output"))
        };
        let out = Kernel {
            label: label.into(),
            source: format!("{}\n{value}\n{main}", ob.wgsl()),
            slots: ob.slots(),
            info,
            workgroups: dispatch_1d(threads, WG)?,
        };
        Ok(Lowering::KernelsWithScratch(
            vec![weights, out],
            vec![scratch],
        ))
    }
}
