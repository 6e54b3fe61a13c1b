//! Attention family: `attention` (ONNX `Attention`, opset 23: multi-head scaled dot-product
//! attention with grouped-query heads, causal and additive or boolean masks, softcap) and
//! `attention_probs` (its attention weights, what its gradient rule reads). Kernels:
//! `shaders/attention.wgsl`.
//!
//! Semantics follow ONNX's reference: scores `S = scale·Q·Kᵀ` per head, then
//! `softcap·tanh(S/softcap)` when softcap > 0, then the mask (added when float, where it is
//! false masked out when bool; a mask shorter than the keys masks the keys past its end;
//! `is_causal` masks keys after the query, top-left aligned, and the opset-25 windows
//! `left_window_size`/`right_window_size` keys farther before or after it), then a softmax over the keys
//! and `Y = P·V`. A key masked out (bool false, causal, past the mask, or an additive −∞)
//! gets weight 0; a query whose every key is masked out gets weights 0 and output 0.
//! `nonpad_kv_seqlen` (i32 [B], opset 24) masks each sample's keys from its length on and
//! places its queries at the end of its keys (query i at position i + length − S_q) for
//! causal order and windows. Optional inputs left out before a given one are
//! zero-element tensors (shape [0]). KV-cache inputs and outputs (`past_key`,
//! `past_value`, `present_*`) and the `qk_matmul_output` output are not supported.

use super::attrs::{optional, AttrKind, AttrReader, AttrSpec, MAX_SIZE};
use super::backward::{GradContext, Ref};
use super::{Arity, OpSchema, TensorType};
use crate::dtype::DType;
use crate::shape::{show, Dim, Shape};
use serde_json::json;

/// Family tag.
pub const FAMILY: &str = "attention";

const ATTRS: &[AttrSpec] = &[
    optional(
        "is_causal",
        AttrKind::Int,
        "0",
        "1: query i attends only keys j ≤ i (top-left aligned).",
    ),
    optional(
        "q_num_heads",
        AttrKind::Int,
        "null",
        "Query heads; required for 3-D inputs [B, S, heads·head_size].",
    ),
    optional(
        "kv_num_heads",
        AttrKind::Int,
        "null",
        "Key/value heads (dividing q_num_heads: grouped-query attention); required for 3-D inputs.",
    ),
    optional(
        "qk_matmul_output_mode",
        AttrKind::Int,
        "0",
        "Only 0: the qk_matmul_output output is not supported.",
    ),
    optional(
        "scale",
        AttrKind::Float,
        "null",
        "Score scale; default 1/√head_size.",
    ),
    optional(
        "softcap",
        AttrKind::Float,
        "0",
        "When > 0, scores become softcap·tanh(score/softcap) before the mask.",
    ),
    optional(
        "left_window_size",
        AttrKind::Int,
        "-1",
        "≥ 0: query i attends only keys j ≥ i − left_window_size (opset 25); -1: unbounded.",
    ),
    optional(
        "right_window_size",
        AttrKind::Int,
        "-1",
        "≥ 0: query i attends only keys j ≤ i + right_window_size (opset 25); -1: unbounded.",
    ),
    optional(
        "softmax_precision",
        AttrKind::Int,
        "null",
        "ONNX element type of the softmax (1, 10, 11 or 16); computed in f32 here.",
    ),
];

/// Schemas of the family.
pub const SCHEMAS: &[OpSchema] = &[
    OpSchema {
        name: "attention",
        family: FAMILY,
        doc: "Multi-head scaled dot-product attention (ONNX Attention): softmax(scale·QKᵀ + mask)·V, 4-D [B, heads, S, head_size] or 3-D [B, S, hidden] inputs, optional attn_mask and nonpad_kv_seqlen (past_key, past_value left out).",
        inputs: Arity::Variadic(3),
        outputs: &["y"],
        attrs: ATTRS,
        params: &[],
    },
    OpSchema {
        name: "attention_probs",
        family: FAMILY,
        doc: "The attention weights of `attention` for Q, K and the optional attn_mask and nonpad_kv_seqlen: [B, q_num_heads, S_q, S_kv].",
        inputs: Arity::Variadic(2),
        outputs: &["probs"],
        attrs: ATTRS,
        params: &[],
    },
];

/// A parsed attention operator.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct AttentionOp {
    /// `attention_probs`: the weights instead of the output (inputs q, k, [mask]).
    pub probs: bool,
    /// Causal masking.
    pub is_causal: bool,
    /// Query heads (required for 3-D inputs).
    pub q_num_heads: Option<usize>,
    /// Key/value heads (required for 3-D inputs).
    pub kv_num_heads: Option<usize>,
    /// Score scale (default 1/√head_size).
    pub scale: Option<f32>,
    /// Softcap (0: none).
    pub softcap: f32,
    /// Keys before the query farther than this are masked out (opset 25).
    pub left_window: Option<usize>,
    /// Keys after the query farther than this are masked out (opset 25).
    pub right_window: Option<usize>,
}

impl AttentionOp {
    /// Whether the query at position `p` (its row, plus the sample's offset when
    /// `nonpad_kv_seqlen` is given) may attend key j: causal order and the local windows.
    pub fn allowed(&self, p: i64, j: usize) -> bool {
        let j = i64::try_from(j).unwrap_or(i64::MAX);
        let window = |w: Option<usize>| w.map(|w| i64::try_from(w).unwrap_or(i64::MAX));
        !(self.is_causal && j > p
            || window(self.left_window).is_some_and(|l| j.saturating_add(l) < p)
            || window(self.right_window).is_some_and(|r| j > p.saturating_add(r)))
    }

    /// The positions of the optional inputs: (attn_mask, nonpad_kv_seqlen), and for
    /// `attention` the KV-cache inputs between them.
    pub fn optional_inputs(&self) -> (usize, usize) {
        if self.probs {
            (2, 3)
        } else {
            (3, 6)
        }
    }

    /// The attn_mask and nonpad_kv_seqlen among the inputs, when given (a zero-element
    /// tensor stands for an input left out).
    pub fn mask_and_lengths<'a, T>(
        &self,
        inputs: &'a [T],
        shape: impl Fn(&T) -> &[usize],
    ) -> (Option<&'a T>, Option<&'a T>) {
        let (m, n) = self.optional_inputs();
        let given = |k: usize| inputs.get(k).filter(|t| shape(t) != [0]);
        (given(m), given(n))
    }
}

/// Whether an input is one left out (a zero-element 1-D tensor stands for it).
fn absent(t: &TensorType) -> bool {
    t.shape == [Dim::Known(0)]
}

/// Parses attributes; `None` for a name outside the family.
pub fn parse(name: &str, r: &mut AttrReader) -> Option<AttentionOp> {
    let probs = match name {
        "attention" => false,
        "attention_probs" => true,
        _ => return None,
    };
    let is_causal = match r.int("is_causal") {
        0 => false,
        1 => true,
        v => {
            r.reject("is_causal", format!("is_causal must be 0 or 1, got {v}"));
            false
        }
    };
    let heads = |r: &mut AttrReader, name: &str| match r.opt_int(name) {
        None => None,
        Some(v) if (1..=MAX_SIZE).contains(&v) => usize::try_from(v).ok(),
        Some(v) => {
            r.reject(name, format!("{name} must be in 1..={MAX_SIZE}, got {v}"));
            None
        }
    };
    let q_num_heads = heads(r, "q_num_heads");
    let kv_num_heads = heads(r, "kv_num_heads");
    let mode = r.int("qk_matmul_output_mode");
    if mode != 0 {
        r.reject(
            "qk_matmul_output_mode",
            format!("qk_matmul_output_mode {mode} is not supported: only 0, since the qk_matmul_output output is not"),
        );
    }
    let scale = r.opt_float("scale");
    if let Some(s) = scale {
        if !s.is_finite() {
            r.reject("scale", format!("scale must be finite, got {s}"));
        }
    }
    let softcap = r.float("softcap");
    if !(softcap.is_finite() && softcap >= 0.0) {
        r.reject(
            "softcap",
            format!("softcap must be finite and ≥ 0, got {softcap}"),
        );
    }
    if let Some(p) = r.opt_int("softmax_precision") {
        if ![1, 10, 11, 16].contains(&p) {
            r.reject(
                "softmax_precision",
                format!("softmax_precision must be a float type (1, 10, 11 or 16), got {p}"),
            );
        }
    }
    let window = |r: &mut AttrReader, name: &str| match r.int(name) {
        -1 => None,
        v if (0..=MAX_SIZE).contains(&v) => usize::try_from(v).ok(),
        v => {
            r.reject(
                name,
                format!("{name} must be -1 (unbounded) or in 0..={MAX_SIZE}, got {v}"),
            );
            None
        }
    };
    let left_window = window(r, "left_window_size");
    let right_window = window(r, "right_window_size");
    Some(AttentionOp {
        left_window,
        right_window,
        probs,
        is_causal,
        q_num_heads,
        kv_num_heads,
        scale,
        softcap,
    })
}

/// The concrete sizes of one attention application.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Geometry {
    /// Batch.
    pub batch: usize,
    /// Query heads.
    pub q_heads: usize,
    /// Key/value heads (dividing `q_heads`).
    pub kv_heads: usize,
    /// Query positions.
    pub sq: usize,
    /// Key/value positions.
    pub skv: usize,
    /// Query/key head size.
    pub d: usize,
    /// Value head size (0 for `attention_probs`).
    pub dv: usize,
    /// Inputs and output are 3-D [B, S, heads·size].
    pub three_d: bool,
    /// The score scale.
    pub scale: f32,
}

impl Geometry {
    /// Query heads per key/value head.
    pub fn group(&self) -> usize {
        self.q_heads / self.kv_heads.max(1)
    }

    /// Element strides (batch, head, position) of a Q, K or V of `heads` heads of `size`
    /// elements over `seq` positions; the head's elements are contiguous.
    pub fn strides(&self, heads: usize, seq: usize, size: usize) -> [usize; 3] {
        if self.three_d {
            [seq * heads * size, size, heads * size]
        } else {
            [heads * seq * size, seq * size, size]
        }
    }
}

/// The mask's element strides along [B, q heads, S_q, S_kv] (0 where it broadcasts) and its
/// last dimension (keys from there on are masked out).
pub fn mask_layout(mask: &[usize], g: &Geometry) -> Result<([usize; 4], usize), String> {
    if mask.is_empty() || mask.len() > 4 {
        return Err(format!(
            "attn_mask must have rank 1 to 4, got {}",
            mask.len()
        ));
    }
    let own = crate::shape::strides(mask)?;
    let offset = 4 - mask.len();
    let mut strides = [0usize; 4];
    for (i, s) in strides.iter_mut().enumerate() {
        if let Some(j) = i.checked_sub(offset) {
            *s = if i < 3 && mask[j] == 1 { 0 } else { own[j] };
        }
    }
    let len = mask[mask.len() - 1];
    Ok((strides, len.min(g.skv)))
}

impl AttentionOp {
    /// Name in graph files.
    pub fn name(&self) -> &'static str {
        if self.probs {
            "attention_probs"
        } else {
            "attention"
        }
    }

    /// Number of tensor inputs before the optional mask.
    fn required_inputs(&self) -> usize {
        if self.probs {
            2
        } else {
            3
        }
    }

    /// Checks what parsing guarantees, for operators that arrive already parsed.
    pub fn validate(&self) -> Result<(), String> {
        let max = usize::try_from(MAX_SIZE).unwrap_or(usize::MAX);
        for h in [self.q_num_heads, self.kv_num_heads].into_iter().flatten() {
            if h == 0 || h > max {
                return Err(format!("{}: {h} heads is out of range", self.name()));
            }
        }
        if !(self.softcap.is_finite() && self.softcap >= 0.0)
            || self.scale.is_some_and(|s| !s.is_finite())
        {
            return Err(format!(
                "{}: softcap {} or scale {:?} out of range",
                self.name(),
                self.softcap,
                self.scale
            ));
        }
        Ok(())
    }

    /// Output types: [B, q heads, S_q, head size of V] (4-D), [B, S_q, q heads·V head
    /// size] (3-D); `attention_probs`: [B, q heads, S_q, S_kv].
    pub fn infer(&self, inputs: &[TensorType]) -> Result<Vec<TensorType>, String> {
        let name = self.name();
        let req = self.required_inputs();
        let (mask_at, lens_at) = self.optional_inputs();
        if inputs.len() > lens_at + 1 {
            return Err(format!(
                "'{name}' takes at most {} inputs, got {}",
                lens_at + 1,
                inputs.len()
            ));
        }
        for k in mask_at + 1..lens_at {
            if inputs.get(k).is_some_and(|t| !absent(t)) {
                return Err(format!(
                    "'{name}': past_key and past_value (the KV cache) are not supported; leave them out (zero-element tensors)"
                ));
            }
        }
        for (t, which) in inputs.iter().zip(["q", "k", "v"]).take(req) {
            if t.dtype != DType::F32 {
                return Err(format!("'{name}' needs an f32 {which}, got {t}"));
            }
        }
        let rank = inputs[0].shape.len();
        if rank != 3 && rank != 4 || inputs[..req].iter().any(|t| t.shape.len() != rank) {
            return Err(format!(
                "'{name}' needs q, k{} all 3-D or all 4-D, got {}",
                if self.probs { "" } else { ", v" },
                inputs[..req]
                    .iter()
                    .map(|t| show(&t.shape))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        let (q, k) = (&inputs[0].shape, &inputs[1].shape);
        let v = (!self.probs).then(|| &inputs[2].shape);
        let same = |a: &Dim, b: &Dim, what: &str| -> Result<(), String> {
            if a == b {
                Ok(())
            } else {
                Err(format!("'{name}': {what} differ ({a} and {b})"))
            }
        };
        same(&q[0], &k[0], "the batch sizes of q and k")?;
        let (q_heads, kv_heads, sq, skv, dv): (Dim, Dim, Dim, Dim, Option<Dim>);
        if rank == 4 {
            same(&q[3], &k[3], "the head sizes of q and k")?;
            if let Some(v) = v {
                same(&q[0], &v[0], "the batch sizes of q and v")?;
                same(&k[1], &v[1], "the head counts of k and v")?;
                same(&k[2], &v[2], "the sequence lengths of k and v")?;
            }
            for (attr, dim) in [(self.q_num_heads, &q[1]), (self.kv_num_heads, &k[1])] {
                if let Some(h) = attr {
                    if dim.known().is_some_and(|d| d != h) {
                        return Err(format!(
                            "'{name}': {h} heads in the attributes, {dim} in the inputs"
                        ));
                    }
                }
            }
            (q_heads, kv_heads, sq, skv) = (q[1].clone(), k[1].clone(), q[2].clone(), k[2].clone());
            dv = v.map(|v| v[3].clone());
        } else {
            let (Some(hq), Some(hkv)) = (self.q_num_heads, self.kv_num_heads) else {
                return Err(format!(
                    "'{name}' with 3-D inputs needs q_num_heads and kv_num_heads"
                ));
            };
            let split = |t: &[Dim], heads: usize, which: &str| -> Result<usize, String> {
                match t[2].known() {
                    Some(h) if h % heads == 0 && h > 0 => Ok(h / heads),
                    _ => Err(format!(
                        "'{name}': the hidden size of {which} {} must be a known multiple of {heads} heads",
                        show(t)
                    )),
                }
            };
            let (dq, dk) = (split(q, hq, "q")?, split(k, hkv, "k")?);
            if dq != dk {
                return Err(format!(
                    "'{name}': head sizes of q ({dq}) and k ({dk}) differ"
                ));
            }
            if let Some(v) = v {
                same(&q[0], &v[0], "the batch sizes of q and v")?;
                same(&k[1], &v[1], "the sequence lengths of k and v")?;
            }
            (q_heads, kv_heads, sq, skv) =
                (Dim::Known(hq), Dim::Known(hkv), q[1].clone(), k[1].clone());
            dv = v.map(|v| split(v, hkv, "v")).transpose()?.map(Dim::Known);
        }
        if let (Some(hq), Some(hkv)) = (q_heads.known(), kv_heads.known()) {
            if hkv == 0 || hq % hkv != 0 {
                return Err(format!(
                    "'{name}': kv heads ({hkv}) must divide q heads ({hq})"
                ));
            }
        } else if q_heads != kv_heads {
            return Err(format!(
                "'{name}': head counts {q_heads} and {kv_heads} must be known to group them"
            ));
        }
        let batch = q[0].clone();
        if let Some(m) = inputs.get(mask_at).filter(|t| !absent(t)) {
            self.check_mask(m, [&batch, &q_heads, &sq, &skv])?;
        }
        if let Some(l) = inputs.get(lens_at).filter(|t| !absent(t)) {
            if l.dtype != DType::I32 || l.shape != [batch.clone()] {
                return Err(format!(
                    "'{name}' needs nonpad_kv_seqlen i32 [{batch}], got {l}"
                ));
            }
        }
        let out: Shape = match dv {
            None => vec![batch, q_heads, sq, skv],
            Some(dv) if rank == 4 => vec![batch, q_heads, sq, dv],
            Some(dv) => {
                let hidden = match (q_heads.known(), dv.known()) {
                    (Some(h), Some(d)) => h.checked_mul(d).map(Dim::Known),
                    _ => None,
                };
                vec![
                    batch,
                    sq,
                    hidden
                        .ok_or_else(|| format!("'{name}': the output's hidden size overflows"))?,
                ]
            }
        };
        Ok(vec![TensorType::f32(out)])
    }

    /// The mask broadcasts to [B, q heads, S_q, S_kv], its last dimension at most S_kv.
    fn check_mask(&self, m: &TensorType, target: [&Dim; 4]) -> Result<(), String> {
        let name = self.name();
        if m.dtype != DType::F32 && m.dtype != DType::Bool {
            return Err(format!("'{name}' needs an f32 or bool attn_mask, got {m}"));
        }
        let r = m.shape.len();
        if r == 0 || r > 4 {
            return Err(format!(
                "'{name}' needs an attn_mask of rank 1 to 4, got {}",
                show(&m.shape)
            ));
        }
        let bad = || {
            format!(
                "'{name}': attn_mask {} does not broadcast to [{}, {}, {}, {}]",
                show(&m.shape),
                target[0],
                target[1],
                target[2],
                target[3]
            )
        };
        for (i, d) in m.shape.iter().enumerate() {
            let t = target[4 - r + i];
            let ok = if i + 1 == r {
                d == t || matches!((d.known(), t.known()), (Some(a), Some(b)) if a <= b)
            } else {
                d == t || *d == Dim::Known(1)
            };
            if !ok {
                return Err(bad());
            }
        }
        Ok(())
    }

    /// The concrete geometry of the inputs (shapes as inference accepted them).
    pub fn geometry(&self, shapes: &[&[usize]]) -> Result<Geometry, String> {
        let (q, k) = (shapes[0], shapes[1]);
        let v = (!self.probs).then(|| shapes.get(2).copied()).flatten();
        let bad = || format!("'{}': inputs of the wrong shapes", self.name());
        let (q_heads, kv_heads, sq, skv, d, dv, three_d) = match (q, k) {
            ([_, hq, sq, d], [_, hkv, skv, _]) => {
                (*hq, *hkv, *sq, *skv, *d, v.map_or(0, |v| v[3]), false)
            }
            ([_, sq, hid], [_, skv, _]) => {
                let (hq, hkv) = (
                    self.q_num_heads.ok_or_else(bad)?,
                    self.kv_num_heads.ok_or_else(bad)?,
                );
                (
                    hq,
                    hkv,
                    *sq,
                    *skv,
                    hid / hq,
                    v.map_or(0, |v| v[2] / hkv),
                    true,
                )
            }
            _ => return Err(bad()),
        };
        if kv_heads == 0 || q_heads % kv_heads != 0 {
            return Err(bad());
        }
        let scale = self
            .scale
            .unwrap_or_else(|| (1.0 / (d.max(1) as f64).sqrt()) as f32);
        Ok(Geometry {
            batch: q[0],
            q_heads,
            kv_heads,
            sq,
            skv,
            d,
            dv,
            three_d,
            scale,
        })
    }

    /// Batch rule: the batch must be axis 0 of every batched input (Q, K, V, a 4-D mask),
    /// and is then axis 0 of the output; anywhere else it couples (a batch along the
    /// positions is attended across, one along the heads is grouped or masked by position).
    pub fn batch(
        &self,
        inputs: &[TensorType],
        batch: &[Option<usize>],
        _outputs: &[TensorType],
    ) -> Result<Vec<Option<usize>>, String> {
        let name = self.name();
        let names = ["q", "k", "v"];
        let req = self.required_inputs();
        let (mask_at, lens_at) = self.optional_inputs();
        for (k, (t, b)) in inputs.iter().zip(batch).enumerate() {
            let Some(a) = *b else { continue };
            let which = match k {
                _ if k < req => names[k],
                _ if k == lens_at => "nonpad_kv_seqlen",
                _ if k == mask_at => "attn_mask",
                _ => "past_key/past_value",
            };
            let ok = a == 0 && (k < req || k == lens_at || k == mask_at && t.shape.len() == 4);
            if !ok {
                return Err(format!(
                    "{name} attends across axis {a} of {which}, the batch axis (only axis 0 of q, k, v and a 4-D mask holds independent samples)"
                ));
            }
        }
        Ok(vec![Some(0)])
    }

    /// Floating-point work: the two products and the softmax.
    pub fn flops(&self, inputs: &[Vec<usize>]) -> u64 {
        let shapes: Vec<&[usize]> = inputs.iter().map(Vec::as_slice).collect();
        let Ok(g) = self.geometry(&shapes) else {
            return 0;
        };
        let rows = super::product(&[g.batch, g.q_heads, g.sq, g.skv]);
        rows.saturating_mul(2 * super::widen(g.d) + 2 * super::widen(g.dv) + 6)
    }

    /// Gradient rule, composed from the weights P (`attention_probs`): with Q, K, V as
    /// [B, heads, S, size] and K, V repeated over each group of query heads,
    /// dV = Pᵀ·dY, dP = dY·Vᵀ, dS = softmax_grad(P, dP) (times 1 − tanh² of the capped
    /// scores when softcap > 0), dQ = scale·dS·K, dK = scale·dSᵀ·Q, with dK and dV summed
    /// over each group and brought back to the inputs' layout. A float mask gets dS (the
    /// keys it covers) summed back to its shape: masked-out keys have weight 0, so their
    /// dS is 0. A bool mask has no gradient.
    pub(crate) fn grad(&self, g: &mut dyn GradContext) -> Result<(), String> {
        if self.probs {
            return Err(
                "attention_probs has no gradient rule (it is what attention's rule reads)".into(),
            );
        }
        let dy = g.dy()?;
        let (q, k, v) = (g.input(0)?, g.input(1)?, g.input(2)?);
        let shapes = [g.shape(&q)?, g.shape(&k)?, g.shape(&v)?];
        let refs: Vec<&[usize]> = shapes.iter().map(Vec::as_slice).collect();
        let geo = self.geometry(&refs)?;
        let (mask_at, lens_at) = self.optional_inputs();
        let mask = g.input(mask_at).ok();
        let lens = g.input(lens_at).ok();
        let mut probs_inputs: Vec<&str> = vec![&q, &k];
        if let Some(m) = &mask {
            probs_inputs.push(m);
        }
        if let Some(l) = &lens {
            probs_inputs.push(l);
        }
        let attrs = self.attrs();
        let p = g.emit("attention_probs", attrs, &probs_inputs)?;
        let (b, hq, hkv, grp) = (geo.batch, geo.q_heads, geo.kv_heads, geo.group());
        let q4 = to_heads(g, &q, &geo, hq, geo.sq, geo.d)?;
        let k4 = to_heads(g, &k, &geo, hkv, geo.skv, geo.d)?;
        let v4 = to_heads(g, &v, &geo, hkv, geo.skv, geo.dv)?;
        let ke = repeat_heads(g, &k4, &[b, hkv, geo.skv, geo.d], grp)?;
        let ve = repeat_heads(g, &v4, &[b, hkv, geo.skv, geo.dv], grp)?;
        let dy4 = to_heads(g, &dy, &geo, hq, geo.sq, geo.dv)?;
        let t = json!({ "perm": [0, 1, 3, 2] });
        if g.needs(2) {
            let pt = g.emit("transpose", t.clone(), &[&p])?;
            let dv = g.emit("matmul", json!({}), &[&pt, &dy4])?;
            let dv = sum_groups(g, &dv, &[b, hkv, grp, geo.skv, geo.dv])?;
            let dv = from_heads(g, &dv, &geo, hkv, geo.skv, geo.dv)?;
            g.input_grad(2, dv)?;
        }
        let mask_grad = g.needs(mask_at);
        if !(g.needs(0) || g.needs(1) || mask_grad) {
            return Ok(());
        }
        let vt = g.emit("transpose", t.clone(), &[&ve])?;
        let dp = g.emit("matmul", json!({}), &[&dy4, &vt])?;
        let ds = g.emit("softmax_grad", json!({ "axis": 3 }), &[&p, &dp])?;
        if mask_grad {
            let m = mask.as_deref().unwrap_or_default();
            let len = g.shape(m)?.last().copied().unwrap_or(geo.skv);
            let dm = if len < geo.skv {
                g.emit(
                    "slice",
                    json!({ "starts": [0], "ends": [len], "axes": [3] }),
                    &[&ds],
                )?
            } else {
                ds.clone()
            };
            g.input_grad_unbroadcast(mask_at, &dm)?;
        }
        let ds = if self.softcap > 0.0 {
            let kt = g.emit("transpose", t.clone(), &[&ke])?;
            let raw = g.emit("matmul", json!({}), &[&q4, &kt])?;
            let raw = g.scale(&raw, geo.scale / self.softcap)?;
            let th = g.emit("tanh", json!({}), &[&raw])?;
            let sq = g.binary("mul", &th, &th)?;
            let one = g.scalar(1.0)?;
            let slope = g.binary("sub", &one, &sq)?;
            g.binary("mul", &ds, &slope)?
        } else {
            ds
        };
        let ds = g.scale(&ds, geo.scale)?;
        if g.needs(0) {
            let dq = g.emit("matmul", json!({}), &[&ds, &ke])?;
            let dq = from_heads(g, &dq, &geo, hq, geo.sq, geo.d)?;
            g.input_grad(0, dq)?;
        }
        if g.needs(1) {
            let dst = g.emit("transpose", t, &[&ds])?;
            let dk = g.emit("matmul", json!({}), &[&dst, &q4])?;
            let dk = sum_groups(g, &dk, &[b, hkv, grp, geo.skv, geo.d])?;
            let dk = from_heads(g, &dk, &geo, hkv, geo.skv, geo.d)?;
            g.input_grad(1, dk)?;
        }
        Ok(())
    }

    /// The attributes as written in graph files (for the backward `attention_probs`).
    fn attrs(&self) -> serde_json::Value {
        let mut a = serde_json::Map::new();
        a.insert("is_causal".into(), json!(i32::from(self.is_causal)));
        if let Some(h) = self.q_num_heads {
            a.insert("q_num_heads".into(), json!(h));
        }
        if let Some(h) = self.kv_num_heads {
            a.insert("kv_num_heads".into(), json!(h));
        }
        if let Some(s) = self.scale {
            a.insert("scale".into(), json!(s));
        }
        a.insert("softcap".into(), json!(self.softcap));
        for (name, w) in [
            ("left_window_size", self.left_window),
            ("right_window_size", self.right_window),
        ] {
            if let Some(w) = w {
                a.insert(name.into(), json!(w));
            }
        }
        serde_json::Value::Object(a)
    }
}

/// A 3-D [B, S, heads·size] value as [B, heads, S, size] (4-D values unchanged).
fn to_heads(
    g: &mut dyn GradContext,
    v: &str,
    geo: &Geometry,
    heads: usize,
    seq: usize,
    size: usize,
) -> Result<Ref, String> {
    if !geo.three_d {
        return Ok(v.to_string());
    }
    let r = g.reshape(v, &[geo.batch, seq, heads, size])?;
    g.emit("transpose", json!({ "perm": [0, 2, 1, 3] }), &[&r])
}

/// The inverse of [`to_heads`].
fn from_heads(
    g: &mut dyn GradContext,
    v: &str,
    geo: &Geometry,
    heads: usize,
    seq: usize,
    size: usize,
) -> Result<Ref, String> {
    if !geo.three_d {
        return Ok(v.to_string());
    }
    let t = g.emit("transpose", json!({ "perm": [0, 2, 1, 3] }), &[v])?;
    let hidden = heads
        .checked_mul(size)
        .ok_or("attention: hidden size overflows")?;
    g.reshape(&t, &[geo.batch, seq, hidden])
}

/// [B, kv heads, S, size] repeated to [B, kv heads·group, S, size], each kv head `group`
/// times in a row (ONNX's interleaved repeat).
fn repeat_heads(
    g: &mut dyn GradContext,
    v: &str,
    shape: &[usize; 4],
    group: usize,
) -> Result<Ref, String> {
    if group == 1 {
        return Ok(v.to_string());
    }
    let [b, h, s, d] = *shape;
    let r = g.reshape(v, &[b, h, 1, s, d])?;
    let e = g.expand(&r, &[b, h, group, s, d])?;
    g.reshape(&e, &[b, h * group, s, d])
}

/// [B, kv heads·group, S, size] summed over each group to [B, kv heads, S, size].
fn sum_groups(g: &mut dyn GradContext, v: &str, split: &[usize; 5]) -> Result<Ref, String> {
    if split[2] == 1 {
        return Ok(v.to_string());
    }
    let r = g.reshape(v, split)?;
    g.sum(&r, &[2], false)
}

#[cfg(test)]
mod tests {
    use crate::ops::testing::{couples, rule};
    use crate::ops::{parse, TensorType};
    use crate::shape::Dim;
    use serde_json::json;

    #[test]
    fn the_batch_is_axis_0_of_q_k_v_and_a_4d_mask() {
        let a = |inputs: &[(&str, Option<usize>)]| rule("attention", json!({}), inputs);
        assert_eq!(
            a(&[
                ("N,2,3,4", Some(0)),
                ("N,1,5,4", Some(0)),
                ("N,1,5,6", Some(0))
            ]),
            Ok(vec![Some(0)])
        );
        assert_eq!(
            a(&[
                ("N,2,3,4", Some(0)),
                ("N,1,5,4", Some(0)),
                ("N,1,5,6", Some(0)),
                ("3,5", None)
            ]),
            Ok(vec![Some(0)])
        );
        assert_eq!(
            a(&[
                ("N,2,3,4", Some(0)),
                ("N,1,5,4", Some(0)),
                ("N,1,5,6", Some(0)),
                ("N,1,3,5", Some(0))
            ]),
            Ok(vec![Some(0)])
        );
        couples(
            a(&[("2,2,N,4", Some(2)), ("2,1,5,4", None), ("2,1,5,6", None)]),
            &["attention", "axis 2 of q"],
        );
        couples(
            a(&[
                ("2,2,3,4", None),
                ("2,1,N,4", Some(2)),
                ("2,1,N,6", Some(2)),
            ]),
            &["axis 2 of k"],
        );
    }

    #[test]
    fn inference_checks_heads_sizes_and_masks() {
        let infer = |attrs: serde_json::Value, shapes: &[&str]| {
            let op = parse("attention", attrs.as_object().unwrap()).expect("parses");
            let types: Vec<TensorType> = shapes
                .iter()
                .map(|s| crate::ops::testing::tensor(s))
                .collect();
            op.infer(&types)
        };
        let y = infer(json!({}), &["N,9,4,8", "N,3,6,8", "N,3,6,10"]).unwrap();
        assert_eq!(
            y[0].shape,
            vec![
                Dim::Sym("N".into()),
                Dim::Known(9),
                Dim::Known(4),
                Dim::Known(10)
            ]
        );
        let three = json!({ "q_num_heads": 9, "kv_num_heads": 3 });
        let y = infer(three.clone(), &["2,4,72", "2,6,24", "2,6,30"]).unwrap();
        assert_eq!(
            y[0].shape,
            vec![Dim::Known(2), Dim::Known(4), Dim::Known(90)]
        );
        let e = infer(json!({}), &["2,4,72", "2,6,24", "2,6,30"]).unwrap_err();
        assert!(e.contains("q_num_heads and kv_num_heads"), "{e}");
        let e = infer(json!({}), &["2,4,4,8", "2,3,6,8", "2,3,6,8"]).unwrap_err();
        assert!(e.contains("must divide"), "{e}");
        let e = infer(json!({}), &["2,3,4,8", "2,3,6,7", "2,3,6,8"]).unwrap_err();
        assert!(e.contains("head sizes"), "{e}");
        assert!(infer(json!({}), &["2,3,4,8", "2,3,6,8", "2,3,6,8", "bool:4,6"]).is_ok());
        assert!(infer(json!({}), &["2,3,4,8", "2,3,6,8", "2,3,6,8", "2,1,4,5"]).is_ok());
        let e = infer(json!({}), &["2,3,4,8", "2,3,6,8", "2,3,6,8", "3,4,7"]).unwrap_err();
        assert!(e.contains("does not broadcast"), "{e}");
        let e = infer(
            json!({}),
            &["2,3,4,8", "2,3,6,8", "2,3,6,8", "4,6", "2,3,1,8"],
        )
        .unwrap_err();
        assert!(e.contains("past_key"), "{e}");
    }

    #[test]
    fn windows_and_causal_order_bound_the_keys() {
        let op = |attrs: serde_json::Value| match parse("attention", attrs.as_object().unwrap()) {
            Ok(crate::ops::Op::Attention(a)) => a,
            other => panic!("{other:?}"),
        };
        let allowed = |a: &super::AttentionOp, i: i64| -> Vec<usize> {
            (0..6).filter(|&j| a.allowed(i, j)).collect()
        };
        let w = op(json!({ "left_window_size": 1, "right_window_size": 2 }));
        assert_eq!(allowed(&w, 2), [1, 2, 3, 4]);
        assert_eq!(allowed(&w, 0), [0, 1, 2]);
        let c = op(json!({ "is_causal": 1, "left_window_size": 2 }));
        assert_eq!(allowed(&c, 4), [2, 3, 4]);
        assert_eq!(allowed(&op(json!({})), 3), [0, 1, 2, 3, 4, 5]);
    }

    #[test]
    fn unsupported_attributes_are_refused_by_name() {
        for (attrs, word) in [
            (
                json!({ "qk_matmul_output_mode": 3 }),
                "qk_matmul_output_mode",
            ),
            (json!({ "is_causal": 2 }), "is_causal"),
            (json!({ "softcap": -1.0 }), "softcap"),
            (json!({ "q_num_heads": 0 }), "q_num_heads"),
            (json!({ "softmax_precision": 6 }), "softmax_precision"),
            (json!({ "left_window_size": -2 }), "left_window_size"),
        ] {
            let e = parse("attention", attrs.as_object().unwrap()).unwrap_err();
            assert!(e.iter().any(|(a, _)| a == word), "{e:?}");
        }
    }
}
