//! Recurrent family: `lstm` and `gru`, as ONNX `LSTM` and `GRU` define them with their
//! default activations (sigmoid, tanh, tanh). Kernels: `shaders/recurrent.wgsl`.
//!
//! Inputs are ONNX's, in ONNX's order: `x`, `w`, `r` (weights are inputs, so an ONNX
//! initializer becomes a `param` or `constant` feeding them), then the optional `b`,
//! `sequence_lens` (i32), `initial_h`, and for `lstm` `initial_c` and the peepholes `p`.
//! Trailing optional inputs may be left out; one left out before a given one is written as
//! a zero-element tensor (shape [0], any dtype, e.g. a `constant` with no values), which
//! means absent. Absent `b`, `initial_h`, `initial_c`, `p` are zeros; absent
//! `sequence_lens` is every sequence's full length. Lengths are clamped to [0, seq]; past
//! a sequence's length, `y` is 0 and the state stops (`y_h`, `y_c` are the state after its
//! last step; a reverse direction starts at its last element).

use super::attrs::{optional, required, AttrKind, AttrReader, AttrSpec};
use super::{Arity, OpSchema, TensorType};
use crate::dtype::DType;
use crate::shape::{show, Dim};

/// Family tag.
pub const FAMILY: &str = "recurrent";

const DIRECTIONS: &[&str] = &["forward", "reverse", "bidirectional"];

const LSTM_ATTRS: &[AttrSpec] = &[
    required("hidden_size", AttrKind::Int, "Hidden units H."),
    optional(
        "direction",
        AttrKind::Choice(DIRECTIONS),
        "\"forward\"",
        "forward, reverse or bidirectional (two directions, outputs stacked on the direction axis).",
    ),
    optional(
        "layout",
        AttrKind::Int,
        "0",
        "0: x [seq, batch, input], y [seq, dirs, batch, H]; 1: batch first, x [batch, seq, input], y [batch, seq, dirs, H].",
    ),
    optional(
        "clip",
        AttrKind::Float,
        "null",
        "Not supported (cell clipping): refused when given.",
    ),
    optional(
        "input_forget",
        AttrKind::Int,
        "0",
        "Only 0: coupled input and forget gates are not supported.",
    ),
];

const GRU_ATTRS: &[AttrSpec] = &[
    required("hidden_size", AttrKind::Int, "Hidden units H."),
    optional(
        "direction",
        AttrKind::Choice(DIRECTIONS),
        "\"forward\"",
        "forward, reverse or bidirectional (two directions, outputs stacked on the direction axis).",
    ),
    optional(
        "layout",
        AttrKind::Int,
        "0",
        "0: x [seq, batch, input], y [seq, dirs, batch, H]; 1: batch first, x [batch, seq, input], y [batch, seq, dirs, H].",
    ),
    optional(
        "linear_before_reset",
        AttrKind::Int,
        "0",
        "1: the reset gate multiplies (R_h·h + Rb_h) instead of h.",
    ),
    optional(
        "clip",
        AttrKind::Float,
        "null",
        "Not supported (clipping): refused when given.",
    ),
];

/// Schemas of the family.
pub const SCHEMAS: &[OpSchema] = &[
    OpSchema {
        name: "lstm",
        family: FAMILY,
        doc: "ONNX LSTM (gates i, o, f, c; default activations): inputs x, w [dirs, 4H, input], r [dirs, 4H, H], optional b [dirs, 8H], sequence_lens, initial_h, initial_c, p [dirs, 3H].",
        inputs: Arity::Variadic(3),
        outputs: &["y", "y_h", "y_c"],
        attrs: LSTM_ATTRS,
        params: &[],
    },
    OpSchema {
        name: "gru",
        family: FAMILY,
        doc: "ONNX GRU (gates z, r, h; default activations): inputs x, w [dirs, 3H, input], r [dirs, 3H, H], optional b [dirs, 6H], sequence_lens, initial_h.",
        inputs: Arity::Variadic(3),
        outputs: &["y", "y_h"],
        attrs: GRU_ATTRS,
        params: &[],
    },
];

/// Which cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Cell {
    /// LSTM.
    Lstm,
    /// GRU, with `linear_before_reset`.
    Gru {
        /// The reset gate multiplies (R_h·h + Rb_h).
        linear_before_reset: bool,
    },
}

/// The direction of the recurrence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Direction {
    /// Forward.
    Forward,
    /// Reverse.
    Reverse,
    /// Both: direction 0 forward, 1 reverse.
    Bidirectional,
}

/// A parsed recurrent operator.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RecurrentOp {
    /// The cell.
    pub cell: Cell,
    /// Hidden units.
    pub hidden_size: usize,
    /// Direction.
    pub direction: Direction,
    /// Batch first (ONNX layout 1).
    pub batch_first: bool,
}

/// Optional inputs by position.
pub const B: usize = 3;
/// `sequence_lens`.
pub const SEQ_LENS: usize = 4;
/// `initial_h`.
pub const INITIAL_H: usize = 5;
/// `initial_c` (lstm).
pub const INITIAL_C: usize = 6;
/// `p` (lstm).
pub const P: usize = 7;

/// Whether an input is an absent optional one (a zero-element 1-D tensor) — by shape.
pub fn absent(shape: &[Dim]) -> bool {
    shape == [Dim::Known(0)]
}

/// Parses attributes; `None` for a name outside the family.
pub fn parse(name: &str, r: &mut AttrReader) -> Option<RecurrentOp> {
    let cell = match name {
        "lstm" => {
            if r.int("input_forget") != 0 {
                r.reject(
                    "input_forget",
                    "input_forget 1 (coupled input and forget gates) is not supported",
                );
            }
            Cell::Lstm
        }
        "gru" => {
            let lbr = r.int("linear_before_reset");
            if lbr != 0 && lbr != 1 {
                r.reject(
                    "linear_before_reset",
                    format!("linear_before_reset must be 0 or 1, got {lbr}"),
                );
            }
            Cell::Gru {
                linear_before_reset: lbr == 1,
            }
        }
        _ => return None,
    };
    if let Some(c) = r.opt_float("clip") {
        r.reject(
            "clip",
            format!("clip {c} is not supported: only the unclipped cell"),
        );
    }
    let layout = r.int("layout");
    if layout != 0 && layout != 1 {
        r.reject("layout", format!("layout must be 0 or 1, got {layout}"));
    }
    let direction = match r.choice("direction").as_str() {
        "reverse" => Direction::Reverse,
        "bidirectional" => Direction::Bidirectional,
        _ => Direction::Forward,
    };
    Some(RecurrentOp {
        cell,
        hidden_size: r.size("hidden_size", 1),
        direction,
        batch_first: layout == 1,
    })
}

impl RecurrentOp {
    /// Name in graph files.
    pub fn name(&self) -> &'static str {
        match self.cell {
            Cell::Lstm => "lstm",
            Cell::Gru { .. } => "gru",
        }
    }

    /// Outputs: y, y_h (and y_c for lstm).
    pub fn num_outputs(&self) -> usize {
        match self.cell {
            Cell::Lstm => 3,
            Cell::Gru { .. } => 2,
        }
    }

    /// Gates per hidden unit: 4 (lstm), 3 (gru).
    pub fn gates(&self) -> usize {
        match self.cell {
            Cell::Lstm => 4,
            Cell::Gru { .. } => 3,
        }
    }

    /// Number of directions.
    pub fn dirs(&self) -> usize {
        match self.direction {
            Direction::Bidirectional => 2,
            _ => 1,
        }
    }

    /// Whether direction `d` runs backwards in time.
    pub fn reversed(&self, d: usize) -> bool {
        self.direction == Direction::Reverse || d == 1
    }

    /// Number of inputs the operator takes at most.
    fn max_inputs(&self) -> usize {
        match self.cell {
            Cell::Lstm => 8,
            Cell::Gru { .. } => 6,
        }
    }

    /// Checks what parsing guarantees, for operators that arrive already parsed.
    pub fn validate(&self) -> Result<(), String> {
        let max = usize::try_from(super::attrs::MAX_SIZE).unwrap_or(usize::MAX);
        if self.hidden_size == 0 || self.hidden_size > max {
            return Err(format!(
                "{}: hidden_size {} is out of range",
                self.name(),
                self.hidden_size
            ));
        }
        Ok(())
    }

    /// Output types: y [seq, dirs, batch, H] (batch first: [batch, seq, dirs, H]), y_h and
    /// y_c [dirs, batch, H] (batch first: [batch, dirs, H]).
    pub fn infer(&self, inputs: &[TensorType]) -> Result<Vec<TensorType>, String> {
        let name = self.name();
        if inputs.len() > self.max_inputs() {
            return Err(format!(
                "'{name}' takes at most {} inputs, got {}",
                self.max_inputs(),
                inputs.len()
            ));
        }
        let x = &inputs[0];
        if x.dtype != DType::F32 || x.shape.len() != 3 {
            return Err(format!("'{name}' needs an f32 x of rank 3, got {x}"));
        }
        let (seq, batch, input) = if self.batch_first {
            (&x.shape[1], &x.shape[0], &x.shape[2])
        } else {
            (&x.shape[0], &x.shape[1], &x.shape[2])
        };
        let h = self.hidden_size;
        let dirs = self.dirs();
        let gh = self
            .gates()
            .checked_mul(h)
            .ok_or_else(|| format!("'{name}': hidden_size {h} is too large"))?;
        let known = Dim::Known;
        let state: Vec<Dim> = if self.batch_first {
            vec![batch.clone(), known(dirs), known(h)]
        } else {
            vec![known(dirs), batch.clone(), known(h)]
        };
        let expect = |k: usize, which: &str, want: Vec<Dim>, dtype: DType| -> Result<(), String> {
            let Some(t) = inputs.get(k) else {
                return Ok(());
            };
            if k >= B && absent(&t.shape) {
                return Ok(());
            }
            if t.shape != want || t.dtype != dtype {
                return Err(format!(
                    "'{name}' needs {which} {dtype} {}, got {t}",
                    show(&want)
                ));
            }
            Ok(())
        };
        expect(
            1,
            "w",
            vec![known(dirs), known(gh), input.clone()],
            DType::F32,
        )?;
        expect(2, "r", vec![known(dirs), known(gh), known(h)], DType::F32)?;
        expect(B, "b", vec![known(dirs), known(2 * gh)], DType::F32)?;
        expect(SEQ_LENS, "sequence_lens", vec![batch.clone()], DType::I32)?;
        expect(INITIAL_H, "initial_h", state.clone(), DType::F32)?;
        expect(INITIAL_C, "initial_c", state.clone(), DType::F32)?;
        expect(P, "p", vec![known(dirs), known(3 * h)], DType::F32)?;
        let y = if self.batch_first {
            vec![batch.clone(), seq.clone(), known(dirs), known(h)]
        } else {
            vec![seq.clone(), known(dirs), batch.clone(), known(h)]
        };
        let mut out = vec![TensorType::f32(y), TensorType::f32(state.clone())];
        if self.cell == Cell::Lstm {
            out.push(TensorType::f32(state));
        }
        Ok(out)
    }

    /// Batch rule: the batch is x's batch axis (1, or 0 batch first), sequence_lens' axis
    /// 0 and the initial states' batch axis; the weights must not depend on it. Outputs
    /// keep it on their batch axis. A batch along x's sequence axis couples: the
    /// recurrence carries every step into the next.
    pub fn batch(
        &self,
        _inputs: &[TensorType],
        batch: &[Option<usize>],
        _outputs: &[TensorType],
    ) -> Result<Vec<Option<usize>>, String> {
        let name = self.name();
        let (x_axis, state_axis) = if self.batch_first { (0, 0) } else { (1, 1) };
        let names = [
            "x",
            "w",
            "r",
            "b",
            "sequence_lens",
            "initial_h",
            "initial_c",
            "p",
        ];
        for (k, b) in batch.iter().enumerate() {
            let Some(a) = *b else { continue };
            let want = match k {
                0 => Some(x_axis),
                SEQ_LENS => Some(0),
                INITIAL_H | INITIAL_C => Some(state_axis),
                _ => None,
            };
            if want != Some(a) {
                let which = names.get(k).copied().unwrap_or("an input");
                let seq_axis = usize::from(self.batch_first);
                return Err(if k == 0 && a == seq_axis {
                    format!("{name} recurs along axis {a} of x, the batch axis: each step carries into the next")
                } else if k == 0 {
                    format!("{name} contracts axis {a} of x (its features), the batch axis")
                } else {
                    format!(
                        "{name} shares {which} across samples, but its axis {a} is the batch axis"
                    )
                });
            }
        }
        let y_axis = if self.batch_first { 0 } else { 2 };
        let mut out = vec![Some(y_axis), Some(state_axis)];
        if self.cell == Cell::Lstm {
            out.push(Some(state_axis));
        }
        Ok(out)
    }

    /// Floating-point work: every gate's two products per step and direction.
    pub fn flops(&self, inputs: &[Vec<usize>]) -> u64 {
        let Some(x) = inputs.first() else { return 0 };
        let (seq_batch, input) = match x.as_slice() {
            [a, b, i] => (super::product(&[*a, *b]), super::widen(*i)),
            _ => return 0,
        };
        let h = super::widen(self.hidden_size);
        let per = 2u64
            .saturating_mul(super::widen(self.gates()))
            .saturating_mul(h)
            .saturating_mul(input.saturating_add(h).saturating_add(4));
        seq_batch
            .saturating_mul(super::widen(self.dirs()))
            .saturating_mul(per)
    }
}

#[cfg(test)]
mod tests {
    use crate::ops::testing::{couples, rule};
    use crate::ops::{parse, TensorType};
    use serde_json::json;

    #[test]
    fn the_batch_is_x_axis_1_or_0_batch_first() {
        let w = ("1,12,2", None);
        let r = ("1,12,3", None);
        assert_eq!(
            rule(
                "lstm",
                json!({ "hidden_size": 3 }),
                &[("5,N,2", Some(1)), w, r]
            ),
            Ok(vec![Some(2), Some(1), Some(1)])
        );
        assert_eq!(
            rule(
                "gru",
                json!({ "hidden_size": 4, "layout": 1 }),
                &[("N,5,2", Some(0)), ("1,12,2", None), ("1,12,4", None)]
            ),
            Ok(vec![Some(0), Some(0)])
        );
        couples(
            rule(
                "lstm",
                json!({ "hidden_size": 3 }),
                &[("N,2,2", Some(0)), w, r],
            ),
            &["lstm recurs along axis 0"],
        );
        couples(
            rule(
                "gru",
                json!({ "hidden_size": 4 }),
                &[("5,2,N", Some(2)), ("1,12,N", Some(2)), ("1,12,4", None)],
            ),
            &["contracts axis 2 of x"],
        );
    }

    #[test]
    fn inference_checks_weights_and_optional_inputs() {
        let infer = |op: &str, attrs: serde_json::Value, shapes: &[&str]| {
            let op = parse(op, attrs.as_object().unwrap()).expect("parses");
            let types: Vec<TensorType> = shapes
                .iter()
                .map(|s| crate::ops::testing::tensor(s))
                .collect();
            op.infer(&types)
        };
        let bi = json!({ "hidden_size": 3, "direction": "bidirectional" });
        let out = infer("lstm", bi.clone(), &["5,2,4", "2,12,4", "2,12,3"]).unwrap();
        assert_eq!(out.len(), 3);
        assert_eq!(out[0].to_string(), "f32 [5, 2, 2, 3]");
        assert_eq!(out[1].to_string(), "f32 [2, 2, 3]");
        // An absent b (zero elements) before a given initial_h.
        assert!(infer(
            "lstm",
            bi.clone(),
            &["5,2,4", "2,12,4", "2,12,3", "0", "0", "2,2,3"]
        )
        .is_ok());
        let e = infer("lstm", bi, &["5,2,4", "1,12,4", "2,12,3"]).unwrap_err();
        assert!(e.contains("needs w"), "{e}");
        let e = infer(
            "gru",
            json!({ "hidden_size": 3 }),
            &["5,2,4", "1,9,4", "1,9,3", "1,18", "2"],
        );
        assert!(e.unwrap_err().contains("sequence_lens"));
        for (attrs, word) in [
            (json!({ "hidden_size": 3, "clip": 1.0 }), "clip"),
            (
                json!({ "hidden_size": 3, "input_forget": 1 }),
                "input_forget",
            ),
            (json!({ "hidden_size": 3, "layout": 2 }), "layout"),
            (json!({ "hidden_size": 0 }), "hidden_size"),
        ] {
            let e = parse("lstm", attrs.as_object().unwrap()).unwrap_err();
            assert!(e.iter().any(|(a, _)| a == word), "{e:?}");
        }
    }
}
