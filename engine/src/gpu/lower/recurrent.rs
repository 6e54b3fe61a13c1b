//! GPU lowering of the recurrent family.

use super::Lower;
use crate::gpu::kernel::*;
use crate::ops::recurrent::*;

const SHADER: &str = include_str!("../../../../shaders/recurrent.wgsl");

/// `fn NAME(k: u32) -> f32` reading binding `binding`, or giving 0 (ONNX's default) when
/// the optional input is absent.
fn accessor(name: &str, binding: Option<&str>) -> String {
    let body = binding.map_or("0.0".to_string(), |b| format!("ld_{b}(k)"));
    format!("fn {name}(k: u32) -> f32 {{\n    return {body};\n}}\n")
}

impl Lower for RecurrentOp {
    /// One pass writing the initial states into f32 scratch, then per time step one pass
    /// (LSTM) or two (GRU: the gates, then the state) over every direction, sample and
    /// hidden unit, then one pass per output (packed 16-bit stores included).
    fn lower(&self, ctx: &LowerCtx) -> Result<Lowering, String> {
        let xs = &ctx.inputs[0].shape;
        let (seq, batch, input) = match xs.as_slice() {
            [a, b, i] if self.batch_first => (*b, *a, *i),
            [a, b, i] => (*a, *b, *i),
            _ => return Err(format!("{}: x must have rank 3", self.name())),
        };
        let (h, dirs) = (self.hidden_size, self.dirs());
        let lstm = self.cell == Cell::Lstm;
        let present = |k: usize| ctx.inputs.get(k).filter(|c| c.shape != [0]);
        let units = dirs
            .checked_mul(batch)
            .and_then(|n| n.checked_mul(h))
            .ok_or("recurrent: too many units")?;
        let states = units
            .checked_mul(seq + 1)
            .ok_or("recurrent: too many states")?;
        let gates_len = units.checked_mul(2).ok_or("recurrent: too many gates")?;
        let direction = match self.direction {
            Direction::Forward => 0,
            Direction::Reverse => 1,
            Direction::Bidirectional => 2,
        };
        let lbr = matches!(
            self.cell,
            Cell::Gru {
                linear_before_reset: true
            }
        );
        let info = vec![
            word(seq)?,
            word(dirs)?,
            word(batch)?,
            word(h)?,
            word(input)?,
            u32::from(self.batch_first),
            direction,
            0,
            u32::from(lbr),
            word(self.gates())?,
        ];
        let len_fn = if present(SEQ_LENS).is_some() {
            "fn len_of(b: u32) -> u32 {\n    return u32(clamp(ld_lens(b), 0.0, f32(info[0])));\n}\n"
        } else {
            "fn len_of(b: u32) -> u32 {\n    return info[0];\n}\n"
        };
        let index = variant(SHADER, "recurrent_index");
        let wg = || ("WG", WG.to_string());
        let optional = |b: &mut Bindings, k: usize, name: &str| -> Option<String> {
            present(k).map(|c| {
                b.add(name, Slot::Input(k), c.storage, false);
                name.to_string()
            })
        };
        // Bindings and helpers of the step kernels.
        let step_bindings = |gates_write: bool| -> (Bindings, String) {
            let mut b = Bindings::new();
            for (k, name) in ["x", "w", "r"].iter().enumerate() {
                b.add(name, Slot::Input(k), ctx.inputs[k].storage, false);
            }
            let bias = optional(&mut b, B, "b");
            optional(&mut b, SEQ_LENS, "lens");
            let peep = if lstm { optional(&mut b, P, "p") } else { None };
            b.add("hs", Slot::Scratch(0), Storage::F32, true);
            if lstm {
                b.add("cs", Slot::Scratch(1), Storage::F32, true);
            } else {
                b.add("gs", Slot::Scratch(1), Storage::F32, gates_write);
            }
            let mut helpers = format!("{index}\n{len_fn}{}", accessor("bias_at", bias.as_deref()));
            if lstm {
                helpers.push_str(&accessor("peep_at", peep.as_deref()));
            }
            helpers.push_str(variant(SHADER, "recurrent_products"));
            (b, helpers)
        };
        let step_kernel = |label: &str, name: &str, gates_write: bool, s: usize| {
            let (b, helpers) = step_bindings(gates_write);
            let mut info = info.clone();
            info[7] = word(s)?;
            Ok::<Kernel, String>(Kernel {
                label: label.into(),
                source: format!(
                    "{}\n{helpers}\n{}",
                    b.wgsl(),
                    fill(variant(SHADER, name), &[wg()])
                ),
                slots: b.slots(),
                info,
                workgroups: dispatch_1d(units, WG)?,
            })
        };

        let mut kernels = Vec::new();
        let mut ib = Bindings::new();
        let h0 = optional(&mut ib, INITIAL_H, "h0");
        let c0 = if lstm {
            optional(&mut ib, INITIAL_C, "c0")
        } else {
            None
        };
        ib.add("hs", Slot::Scratch(0), Storage::F32, true);
        let init_c = if lstm {
            ib.add("cs", Slot::Scratch(1), Storage::F32, true);
            "cs[state_at(0u, d, b, j)] = c0_at(io_state(d, b, j));"
        } else {
            ""
        };
        let mut init_helpers = accessor("h0_at", h0.as_deref());
        if lstm {
            init_helpers.push_str(&accessor("c0_at", c0.as_deref()));
        }
        kernels.push(Kernel {
            label: "recurrent init".into(),
            source: format!(
                "{}\n{index}\n{init_helpers}\n{}",
                ib.wgsl(),
                fill(
                    variant(SHADER, "recurrent_init"),
                    &[wg(), ("INIT_C", init_c.into())]
                )
            ),
            slots: ib.slots(),
            info: info.clone(),
            workgroups: dispatch_1d(units, WG)?,
        });
        for s in 0..seq {
            if lstm {
                kernels.push(step_kernel("lstm step", "lstm_step", false, s)?);
            } else {
                kernels.push(step_kernel("gru gates", "gru_gates", true, s)?);
                kernels.push(step_kernel("gru step", "gru_step", false, s)?);
            }
        }
        let outputs: &[(&str, &str, usize)] = if lstm {
            &[
                ("recurrent y", "hs", 0),
                ("recurrent y_h", "states", 0),
                ("recurrent y_c", "states", 1),
            ]
        } else {
            &[("recurrent y", "hs", 0), ("recurrent y_h", "states", 0)]
        };
        for (k, (label, scratch, slot)) in outputs.iter().enumerate() {
            let out = &ctx.outputs[k];
            let mut b = Bindings::new();
            b.add("dst", Slot::Output(k), out.storage, true);
            optional(&mut b, SEQ_LENS, "lens");
            b.add(scratch, Slot::Scratch(*slot), Storage::F32, false);
            let value = if k == 0 {
                "recurrent_y"
            } else {
                "recurrent_last"
            };
            let (main, threads) = per_element_main(out.storage, out.numel());
            kernels.push(Kernel {
                label: (*label).into(),
                source: format!(
                    "{}\n{index}\n{len_fn}\n{}\n{main}",
                    b.wgsl(),
                    variant(SHADER, value)
                ),
                slots: b.slots(),
                info: info.clone(),
                workgroups: dispatch_1d(threads, WG)?,
            });
        }
        let second = if lstm { states } else { gates_len };
        Ok(Lowering::KernelsWithScratch(kernels, vec![states, second]))
    }
}
