//! Einsum family: `einsum` (ONNX `Einsum`) over one or two operands: transposes, sums,
//! batched contractions and outer products written as an equation such as `bij,bjk->bik`,
//! with `...` for broadcast leading axes and numpy's implicit output (no `->`: the
//! ellipsis axes, then the indices that appear once, alphabetically). Kernel:
//! `shaders/einsum.wgsl`.
//!
//! Refused with the reason: more than two operands, an index repeated within one operand
//! or in the output (diagonals), an output index no operand has.

use super::attrs::{required, AttrKind, AttrReader, AttrSpec};
use super::backward::GradContext;
use super::{Arity, OpSchema, TensorType};
use crate::dtype::DType;
use crate::shape::{show, Dim, Shape};
use serde_json::json;

/// Family tag.
pub const FAMILY: &str = "einsum";

/// Most distinct indices (ellipsis axes included) one einsum may have.
pub const MAX_INDICES: usize = 12;

const ATTRS: &[AttrSpec] = &[required(
    "equation",
    AttrKind::Text,
    "Einstein summation, e.g. \"bij,bjk->bik\", \"ij->ji\", \"i,i->\", \"...ij,...jk\".",
)];

/// Schemas of the family.
pub const SCHEMAS: &[OpSchema] = &[OpSchema {
    name: "einsum",
    family: FAMILY,
    doc: "Einstein summation over one or two operands (ONNX Einsum): transposes, sums, contractions, outer products, with ... and implicit output.",
    inputs: Arity::Variadic(1),
    outputs: &["y"],
    attrs: ATTRS,
    params: &[],
}];

/// One side of an equation: its letters, and where `...` stands among them.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Term {
    /// The index letters, in order, without the ellipsis.
    pub letters: Vec<char>,
    /// The position of `...` among the letters, when present.
    pub ellipsis: Option<usize>,
}

/// A parsed einsum.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct EinsumOp {
    /// The equation as written.
    pub equation: String,
    /// The operands' terms.
    pub inputs: Vec<Term>,
    /// The output term (`None`: implicit).
    pub output: Option<Term>,
}

/// An equation resolved against concrete or symbolic ranks: every axis labelled
/// (letters by their code point, ellipsis axes by 1000 + their position from the left of
/// the widest ellipsis).
#[derive(Debug, Clone, PartialEq)]
pub struct Resolved {
    /// Labels of each operand's axes.
    pub inputs: Vec<Vec<u32>>,
    /// Labels of the output's axes.
    pub output: Vec<u32>,
    /// Labels summed over (in no output axis), in first-appearance order.
    pub summed: Vec<u32>,
}

const ELLIPSIS_LABEL: u32 = 1000;

fn term(text: &str) -> Result<Term, String> {
    let mut letters = Vec::new();
    let mut ellipsis = None;
    let mut rest = text.trim();
    while let Some(c) = rest.chars().next() {
        if rest.starts_with("...") {
            if ellipsis.is_some() {
                return Err(format!("'{text}' has two ellipses"));
            }
            ellipsis = Some(letters.len());
            rest = &rest[3..];
            continue;
        }
        if !c.is_ascii_alphabetic() {
            return Err(format!("'{text}' has '{c}', not a letter or ..."));
        }
        if letters.contains(&c) {
            return Err(format!(
                "'{text}' repeats index '{c}' (diagonals are not supported)"
            ));
        }
        letters.push(c);
        rest = &rest[1..];
    }
    Ok(Term { letters, ellipsis })
}

/// Parses an equation into its terms.
pub fn parse_equation(equation: &str) -> Result<(Vec<Term>, Option<Term>), String> {
    let (lhs, rhs) = match equation.split_once("->") {
        Some((l, r)) => (l, Some(r)),
        None => (equation, None),
    };
    let inputs: Vec<Term> = lhs.split(',').map(term).collect::<Result<_, _>>()?;
    if inputs.len() > 2 {
        return Err(format!(
            "einsum supports one or two operands, '{equation}' has {}",
            inputs.len()
        ));
    }
    let output = rhs.map(term).transpose()?;
    if let Some(out) = &output {
        for c in &out.letters {
            if !inputs.iter().any(|t| t.letters.contains(c)) {
                return Err(format!(
                    "output index '{c}' of '{equation}' is in no operand"
                ));
            }
        }
        if out.ellipsis.is_some() && inputs.iter().all(|t| t.ellipsis.is_none()) {
            return Err(format!(
                "the output of '{equation}' has ... but no operand does"
            ));
        }
    }
    Ok((inputs, output))
}

/// Parses attributes; `None` for a name outside the family.
pub fn parse(name: &str, r: &mut AttrReader) -> Option<EinsumOp> {
    if name != "einsum" {
        return None;
    }
    let equation = r.text("equation");
    let (inputs, output) = match parse_equation(&equation) {
        Ok(p) => p,
        Err(e) => {
            r.reject("equation", e);
            (Vec::new(), None)
        }
    };
    Some(EinsumOp {
        equation,
        inputs,
        output,
    })
}

/// The labels of a term's axes for an operand of `rank` axes, its ellipsis covering the
/// rightmost `ellipsis` of `widest` ellipsis axes.
fn labels(t: &Term, rank: usize, widest: usize) -> Result<Vec<u32>, String> {
    let n = t.letters.len();
    let code = |c: &char| u32::from(*c);
    match t.ellipsis {
        None if rank == n => Ok(t.letters.iter().map(code).collect()),
        None => Err(format!(
            "{} indices for an operand of rank {rank}",
            t.letters.len()
        )),
        Some(at) => {
            let e = rank
                .checked_sub(n)
                .ok_or_else(|| format!("{n} indices for an operand of rank {rank}"))?;
            let mut out: Vec<u32> = t.letters[..at].iter().map(code).collect();
            out.extend((widest - e..widest).map(|k| ELLIPSIS_LABEL + k as u32));
            out.extend(t.letters[at..].iter().map(code));
            Ok(out)
        }
    }
}

impl EinsumOp {
    /// Name in graph files.
    pub fn name(&self) -> &'static str {
        "einsum"
    }

    /// Checks what parsing guarantees, for operators that arrive already parsed.
    pub fn validate(&self) -> Result<(), String> {
        let (inputs, output) = parse_equation(&self.equation)?;
        if inputs != self.inputs || output != self.output {
            return Err(format!(
                "einsum: terms do not match equation '{}'",
                self.equation
            ));
        }
        Ok(())
    }

    /// Labels every axis for operands of these ranks.
    pub fn resolve(&self, ranks: &[usize]) -> Result<Resolved, String> {
        if ranks.len() != self.inputs.len() {
            return Err(format!(
                "einsum '{}' has {} operand{}, got {} inputs",
                self.equation,
                self.inputs.len(),
                if self.inputs.len() == 1 { "" } else { "s" },
                ranks.len()
            ));
        }
        let widths: Vec<usize> = self
            .inputs
            .iter()
            .zip(ranks)
            .map(|(t, &r)| {
                if t.ellipsis.is_some() {
                    r.saturating_sub(t.letters.len())
                } else {
                    0
                }
            })
            .collect();
        let widest = widths.iter().copied().max().unwrap_or(0);
        let inputs: Vec<Vec<u32>> = self
            .inputs
            .iter()
            .zip(ranks)
            .map(|(t, &r)| labels(t, r, widest))
            .collect::<Result<_, _>>()
            .map_err(|e| format!("einsum '{}': {e}", self.equation))?;
        let output = match &self.output {
            Some(t) => labels(t, t.letters.len() + widest, widest)?,
            None => {
                let mut out: Vec<u32> = (0..widest).map(|k| ELLIPSIS_LABEL + k as u32).collect();
                let mut once: Vec<char> = self
                    .inputs
                    .iter()
                    .flat_map(|t| t.letters.iter().copied())
                    .filter(|c| {
                        self.inputs
                            .iter()
                            .map(|t| t.letters.iter().filter(|x| *x == c).count())
                            .sum::<usize>()
                            == 1
                    })
                    .collect();
                once.sort_unstable();
                out.extend(once.iter().map(|c| u32::from(*c)));
                out
            }
        };
        let mut summed = Vec::new();
        for l in inputs.iter().flatten() {
            if !output.contains(l) && !summed.contains(l) {
                summed.push(*l);
            }
        }
        if output.len() + summed.len() > MAX_INDICES {
            return Err(format!(
                "einsum '{}' has {} distinct indices, at most {MAX_INDICES}",
                self.equation,
                output.len() + summed.len()
            ));
        }
        Ok(Resolved {
            inputs,
            output,
            summed,
        })
    }

    /// Output type: the output labels' sizes. A label's size is the same in every operand
    /// having it (an ellipsis axis of size 1 broadcasts).
    pub fn infer(&self, inputs: &[TensorType]) -> Result<Vec<TensorType>, String> {
        for (k, t) in inputs.iter().enumerate() {
            if t.dtype != DType::F32 {
                return Err(format!("einsum needs f32 operands, operand {k} is {t}"));
            }
        }
        let ranks: Vec<usize> = inputs.iter().map(|t| t.shape.len()).collect();
        let res = self.resolve(&ranks)?;
        let size = |l: u32| -> Result<Dim, String> {
            let mut found: Option<Dim> = None;
            for (t, ls) in inputs.iter().zip(&res.inputs) {
                for (d, _) in t.shape.iter().zip(ls).filter(|(_, x)| **x == l) {
                    let broadcasts = l >= ELLIPSIS_LABEL && *d == Dim::Known(1);
                    found = match found {
                        None => Some(d.clone()),
                        Some(f) if f == *d || broadcasts => Some(f),
                        Some(f) if l >= ELLIPSIS_LABEL && f == Dim::Known(1) => Some(d.clone()),
                        Some(f) => {
                            return Err(format!(
                                "einsum '{}': an index has sizes {f} and {d} ({})",
                                self.equation,
                                inputs
                                    .iter()
                                    .map(|t| show(&t.shape))
                                    .collect::<Vec<_>>()
                                    .join(", ")
                            ))
                        }
                    };
                }
            }
            Ok(found.unwrap_or(Dim::Known(1)))
        };
        for l in &res.summed {
            size(*l)?;
        }
        let out: Shape = res
            .output
            .iter()
            .map(|&l| size(l))
            .collect::<Result<_, _>>()?;
        Ok(vec![TensorType::f32(out)])
    }

    /// Concrete sizes of the output labels then the summed ones, and each operand's
    /// element strides along them (0 where it lacks the label or broadcasts it).
    pub fn layout(&self, shapes: &[&[usize]]) -> Result<(Vec<usize>, Vec<Vec<usize>>), String> {
        let ranks: Vec<usize> = shapes.iter().map(|s| s.len()).collect();
        let res = self.resolve(&ranks)?;
        let all: Vec<u32> = res.output.iter().chain(&res.summed).copied().collect();
        let mut sizes = vec![1usize; all.len()];
        let mut strides = vec![vec![0usize; all.len()]; shapes.len()];
        for (k, (shape, ls)) in shapes.iter().zip(&res.inputs).enumerate() {
            let own = crate::shape::strides(shape)?;
            for (axis, l) in ls.iter().enumerate() {
                let Some(p) = all.iter().position(|x| x == l) else {
                    continue;
                };
                if shape[axis] != 1 {
                    sizes[p] = shape[axis];
                    strides[k][p] = own[axis];
                }
            }
        }
        Ok((sizes, strides))
    }

    /// Batch rule: a batch on an index of the output lands on that output axis; a batch
    /// on a summed index couples (the sum runs over samples), and so do two operands
    /// batched on different indices (every sample meets every other).
    pub fn batch(
        &self,
        inputs: &[TensorType],
        batch: &[Option<usize>],
        _outputs: &[TensorType],
    ) -> Result<Vec<Option<usize>>, String> {
        let ranks: Vec<usize> = inputs.iter().map(|t| t.shape.len()).collect();
        let res = self.resolve(&ranks)?;
        let mut found: Option<(usize, u32)> = None;
        for (k, b) in batch.iter().enumerate() {
            let Some(a) = *b else { continue };
            let l = res.inputs[k][a];
            if !res.output.contains(&l) {
                return Err(format!(
                    "einsum '{}' sums over axis {a} of operand {k}, the batch axis",
                    self.equation
                ));
            }
            match found {
                Some((j, m)) if m != l => {
                    return Err(format!(
                        "einsum '{}' pairs the batch of operand {j} with the batch of operand {k} along different indices: every sample meets every other",
                        self.equation
                    ))
                }
                _ => found = Some((k, l)),
            }
        }
        Ok(vec![found.and_then(|(_, l)| {
            res.output.iter().position(|x| *x == l)
        })])
    }

    /// Two flops per output element and summed combination.
    pub fn flops(&self, inputs: &[Vec<usize>]) -> u64 {
        let shapes: Vec<&[usize]> = inputs.iter().map(Vec::as_slice).collect();
        let Ok((sizes, _)) = self.layout(&shapes) else {
            return 0;
        };
        2u64.saturating_mul(super::product(&sizes))
    }

    /// Gradient rule: each operand's gradient is itself an einsum of the output's gradient
    /// with the other operand (its broadcast axes expanded), onto the operand's indices that the output or the other
    /// operand has (at their full size); the operand's other indices — summed inside it
    /// alone, or broadcast from size 1 — are then restored by a reshape (size 1) and an
    /// expand (dA is constant along an index only A has).
    pub(crate) fn grad(&self, g: &mut dyn GradContext) -> Result<(), String> {
        let dy = g.dy()?;
        let n = self.inputs.len();
        let refs: Vec<String> = (0..n).map(|k| g.input(k)).collect::<Result<_, _>>()?;
        let shapes: Vec<Vec<usize>> = refs.iter().map(|r| g.shape(r)).collect::<Result<_, _>>()?;
        let ranks: Vec<usize> = shapes.iter().map(Vec::len).collect();
        let res = self.resolve(&ranks)?;
        let out_shape = g.shape(&dy)?;
        let mut letter = std::collections::HashMap::new();
        let alphabet: Vec<char> = ('a'..='z').chain('A'..='Z').collect();
        for l in res.output.iter().chain(&res.summed) {
            let next = alphabet[letter.len()];
            letter.entry(*l).or_insert(next);
        }
        let word = |ls: &[u32]| -> String { ls.iter().map(|l| letter[l]).collect() };
        for k in 0..n {
            if !g.needs(k) {
                continue;
            }
            let mine = &res.inputs[k];
            let full = |l: u32| -> Option<usize> {
                res.output
                    .iter()
                    .position(|x| *x == l)
                    .map(|p| out_shape[p])
                    .or_else(|| {
                        let o = 1 - k;
                        (n == 2)
                            .then(|| res.inputs[o].iter().position(|x| *x == l))
                            .flatten()
                            .map(|p| shapes[o][p])
                    })
            };
            // Indices of the operand the gradient einsum produces: present elsewhere at
            // the operand's own size.
            let kept: Vec<u32> = mine
                .iter()
                .zip(&shapes[k])
                .filter(|(l, d)| full(**l) == Some(**d))
                .map(|(l, _)| *l)
                .collect();
            let mut terms = vec![word(&res.output)];
            let mut operands = vec![dy.clone()];
            if n == 2 {
                // The other operand with its broadcast (size-1) axes expanded to the
                // output's sizes, so every index has one size in the equation.
                let o = 1 - k;
                let wide: Vec<usize> = res.inputs[o]
                    .iter()
                    .zip(&shapes[o])
                    .map(|(l, &s)| {
                        res.output
                            .iter()
                            .position(|x| x == l)
                            .map_or(s, |p| out_shape[p])
                    })
                    .collect();
                terms.push(word(&res.inputs[o]));
                operands.push(g.expand(&refs[o], &wide)?);
            }
            let operands: Vec<&str> = operands.iter().map(String::as_str).collect();
            let equation = format!("{}->{}", terms.join(","), word(&kept));
            let d = g.emit("einsum", json!({ "equation": equation }), &operands)?;
            let ones: Vec<usize> = mine
                .iter()
                .zip(&shapes[k])
                .map(|(l, &s)| if kept.contains(l) { s } else { 1 })
                .collect();
            let d = g.reshape(&d, &ones)?;
            let d = g.expand(&d, &shapes[k])?;
            g.input_grad(k, d)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::ops::testing::{couples, rule};
    use crate::ops::{parse, TensorType};
    use serde_json::json;

    fn infer(eq: &str, shapes: &[&str]) -> Result<String, String> {
        let op = parse("einsum", json!({ "equation": eq }).as_object().unwrap())
            .map_err(|e| format!("{e:?}"))?;
        let types: Vec<TensorType> = shapes
            .iter()
            .map(|s| crate::ops::testing::tensor(s))
            .collect();
        op.infer(&types).map(|t| t[0].to_string())
    }

    #[test]
    fn equations_infer_numpy_shapes() {
        assert_eq!(
            infer("bij,bjk->bik", &["N,2,3", "N,3,4"]).unwrap(),
            "f32 [N, 2, 4]"
        );
        assert_eq!(infer("ij->ji", &["2,3"]).unwrap(), "f32 [3, 2]");
        assert_eq!(infer("i,i->", &["5", "5"]).unwrap(), "f32 []");
        assert_eq!(infer("ij,jk", &["2,3", "3,4"]).unwrap(), "f32 [2, 4]");
        assert_eq!(infer("ba", &["2,3"]).unwrap(), "f32 [3, 2]");
        assert_eq!(
            infer("...ij,...jk->...ik", &["5,1,2,3", "7,3,4"]).unwrap(),
            "f32 [5, 7, 2, 4]"
        );
        assert_eq!(
            infer("...ij,jk", &["6,2,3", "3,4"]).unwrap(),
            "f32 [6, 2, 4]"
        );
        for (eq, shapes, word) in [
            ("ij,jk,kl->il", &["2,2", "2,2", "2,2"][..], "two operands"),
            ("ii->i", &["2,2"][..], "diagonals"),
            ("ij->k", &["2,2"][..], "in no operand"),
            ("ij,jk->ik", &["2,3", "4,5"][..], "sizes"),
            ("ijk->i", &["2,3"][..], "rank"),
            ("i$->i", &["2,3"][..], "not a letter"),
        ] {
            let e = infer(eq, shapes).unwrap_err();
            assert!(e.contains(word), "{eq}: {e}");
        }
    }

    #[test]
    fn batched_indices_stay_on_the_output_or_couple() {
        let r = |eq: &str, inputs: &[(&str, Option<usize>)]| {
            rule("einsum", json!({ "equation": eq }), inputs)
        };
        assert_eq!(
            r("bij,jk->bik", &[("N,2,3", Some(0)), ("3,4", None)]),
            Ok(vec![Some(0)])
        );
        assert_eq!(
            r("ij,bjk->kbi", &[("2,3", None), ("N,3,4", Some(0))]),
            Ok(vec![Some(1)])
        );
        couples(
            r("bi,bj->ij", &[("N,2", Some(0)), ("N,3", Some(0))]),
            &["sums over axis 0 of operand 0"],
        );
        couples(
            r("i,j->ij", &[("N", Some(0)), ("M", Some(0))]),
            &["every sample meets every other"],
        );
    }
}
