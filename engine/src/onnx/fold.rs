//! Folding the shape arithmetic models carry (`Shape → Gather → Concat → Reshape` and the
//! like) at import: values known when the model is loaded are computed on the host, and
//! integer vectors whose entries are a model's symbolic dimensions keep those entries as
//! symbols, so a reshape target built from `Shape(x)` becomes a plain `reshape` attribute
//! with the batch copied from the input.

use super::tensor::{Elements, HostTensor};
use crate::shape::{Dim, Product};

/// One entry of a folded integer vector: a number, or a symbolic dimension of a value.
#[derive(Debug, Clone, PartialEq)]
pub enum SymInt {
    /// Known when the model is loaded.
    Known(i64),
    /// A symbolic dimension (the batch), known only at run time.
    Dim(Dim),
}

/// An integer tensor of rank 0 or 1 with symbolic entries.
#[derive(Debug, Clone, PartialEq)]
pub struct SymInts {
    /// Rank 0 (one entry) or 1.
    pub scalar: bool,
    /// The entries.
    pub items: Vec<SymInt>,
}

impl SymInts {
    /// From a known tensor of rank 0 or 1 (`None` for another rank or a float tensor).
    pub fn from_host(t: &HostTensor) -> Option<SymInts> {
        if t.dims.len() > 1 || matches!(t.elements, Elements::F32(_)) {
            return None;
        }
        Some(SymInts {
            scalar: t.dims.is_empty(),
            items: t.as_i64().into_iter().map(SymInt::Known).collect(),
        })
    }

    /// The known tensor, when no entry is symbolic.
    pub fn to_host(&self) -> Option<HostTensor> {
        let values: Option<Vec<i64>> = self
            .items
            .iter()
            .map(|s| match s {
                SymInt::Known(v) => Some(*v),
                SymInt::Dim(_) => None,
            })
            .collect();
        let values = values?;
        let dims = if self.scalar {
            vec![]
        } else {
            vec![values.len()]
        };
        Some(HostTensor::ints(dims, values))
    }
}

/// The shape of a value as a folded vector (`Shape(x)` with ONNX's `start`/`end`).
pub fn shape_of(shape: &[Dim], start: i64, end: Option<i64>) -> SymInts {
    let rank = shape.len() as i64;
    let clamp = |v: i64| (if v < 0 { v + rank } else { v }).clamp(0, rank) as usize;
    let (s, e) = (clamp(start), clamp(end.unwrap_or(rank)));
    let items = shape[s..e.max(s)]
        .iter()
        .map(|d| match d {
            Dim::Known(v) => SymInt::Known(*v as i64),
            Dim::Sym(_) => SymInt::Dim(d.clone()),
        })
        .collect();
    SymInts {
        scalar: false,
        items,
    }
}

/// `Gather(data, indices)` along axis 0 of a vector, indices known.
pub fn gather(data: &SymInts, indices: &HostTensor) -> Result<SymInts, String> {
    if data.scalar || indices.dims.len() > 1 {
        return Err("only gathers from a vector with a scalar or vector of indices fold".into());
    }
    let n = data.items.len() as i64;
    let items = indices
        .as_i64()
        .into_iter()
        .map(|i| {
            let k = if i < 0 { i + n } else { i };
            usize::try_from(k)
                .ok()
                .and_then(|k| data.items.get(k).cloned())
                .ok_or_else(|| format!("index {i} is out of range for {n} entries"))
        })
        .collect::<Result<_, _>>()?;
    Ok(SymInts {
        scalar: indices.dims.is_empty(),
        items,
    })
}

/// `Concat` of vectors.
pub fn concat(parts: &[SymInts]) -> SymInts {
    SymInts {
        scalar: false,
        items: parts.iter().flat_map(|p| p.items.clone()).collect(),
    }
}

/// `Slice` of a vector with known starts, ends and steps (one axis).
pub fn slice(data: &SymInts, start: i64, end: i64, step: i64) -> Result<SymInts, String> {
    if step == 0 {
        return Err("slice step 0".into());
    }
    let n = data.items.len() as i64;
    let norm = |v: i64, lo: i64, hi: i64| (if v < 0 { v + n } else { v }).clamp(lo, hi);
    let mut items = Vec::new();
    if step > 0 {
        let (mut i, e) = (norm(start, 0, n), norm(end, 0, n));
        while i < e {
            items.push(data.items[i as usize].clone());
            i = i.saturating_add(step);
        }
    } else {
        let (mut i, e) = (norm(start, -1, n - 1), norm(end, -1, n - 1));
        while i > e {
            items.push(data.items[i as usize].clone());
            i = i.saturating_add(step);
        }
    }
    Ok(SymInts {
        scalar: false,
        items,
    })
}

/// Elementwise integer arithmetic with broadcasting of a one-entry side; symbolic entries
/// survive products (`N * 4`, `N * M`), exact quotients (`N*4 / 4`), `x + 0` and `x - 0`.
pub fn arithmetic(op: &str, a: &SymInts, b: &SymInts) -> Result<SymInts, String> {
    let n = a.items.len().max(b.items.len());
    let pick = |s: &SymInts, i: usize| -> Result<SymInt, String> {
        match s.items.len() {
            1 => Ok(s.items[0].clone()),
            m if m == n => Ok(s.items[i].clone()),
            m => Err(format!("cannot broadcast {m} entries to {n}")),
        }
    };
    let mut items = Vec::with_capacity(n);
    for i in 0..n {
        let (x, y) = (pick(a, i)?, pick(b, i)?);
        items.push(match (op, x, y) {
            (_, SymInt::Known(x), SymInt::Known(y)) => SymInt::Known(known(op, x, y)?),
            ("Add" | "Sub", d @ SymInt::Dim(_), SymInt::Known(0))
            | ("Add", SymInt::Known(0), d @ SymInt::Dim(_)) => d,
            ("Mul", x, y) => product(&x, &y)?,
            ("Div", x, y) => quotient(&x, &y)?,
            _ => {
                return Err(format!(
                    "{op} of a symbolic dimension (the batch) is not folded"
                ))
            }
        });
    }
    Ok(SymInts {
        scalar: a.scalar && b.scalar,
        items,
    })
}

/// A symbolic entry as a dimension (a known one must be a size).
fn as_dim(s: &SymInt) -> Result<Dim, String> {
    match s {
        SymInt::Dim(d) => Ok(d.clone()),
        SymInt::Known(v) => usize::try_from(*v)
            .map(Dim::Known)
            .map_err(|_| format!("{v} times a symbolic dimension is not a size")),
    }
}

fn from_dim(d: Dim) -> SymInt {
    match d {
        Dim::Known(v) => SymInt::Known(v as i64),
        d => SymInt::Dim(d),
    }
}

fn product(x: &SymInt, y: &SymInt) -> Result<SymInt, String> {
    let p = Product::of(&[as_dim(x)?, as_dim(y)?]).ok_or("a product of dimensions overflows")?;
    Ok(from_dim(p.to_dim()))
}

fn quotient(x: &SymInt, y: &SymInt) -> Result<SymInt, String> {
    let (a, b) = (
        Product::of(&[as_dim(x)?]).ok_or("overflow")?,
        Product::of(&[as_dim(y)?]).ok_or("overflow")?,
    );
    let q = a
        .divide(&b)
        .ok_or_else(|| format!("{} / {} does not divide exactly", a.to_dim(), b.to_dim()))?;
    Ok(from_dim(q.to_dim()))
}

fn known(op: &str, x: i64, y: i64) -> Result<i64, String> {
    let r = match op {
        "Add" => x.checked_add(y),
        "Sub" => x.checked_sub(y),
        "Mul" => x.checked_mul(y),
        "Div" => {
            if y == 0 {
                return Err("integer division by zero".into());
            }
            x.checked_div(y)
        }
        "Mod" => {
            if y == 0 {
                return Err("integer modulo by zero".into());
            }
            // ONNX's Mod with fmod=0: the result takes the divisor's sign.
            x.checked_rem(y).map(|r| {
                if r != 0 && (r < 0) != (y < 0) {
                    r + y
                } else {
                    r
                }
            })
        }
        "Max" => Some(x.max(y)),
        "Min" => Some(x.min(y)),
        _ => return Err(format!("{op} is not folded")),
    };
    r.ok_or_else(|| format!("{op} of {x} and {y} overflows"))
}

/// A reshape target with symbolic entries as the attribute Sluice's `reshape` takes: a
/// symbol at the position where the input has the same symbol becomes 0 (copy); when a
/// `-1` and a symbolic entry meet, the `-1` is worked out from the input's size (symbols
/// cancel by name); the one remaining unknown entry becomes -1 (inferred).
pub fn reshape_target(input: &[Dim], target: &SymInts) -> Result<Vec<i64>, String> {
    let mut out: Vec<Option<i64>> = target
        .items
        .iter()
        .enumerate()
        .map(|(i, s)| match s {
            SymInt::Known(v) => Some(*v),
            SymInt::Dim(d) if input.get(i) == Some(d) => Some(0),
            SymInt::Dim(_) => None,
        })
        .collect();
    let symbolic = out.iter().filter(|e| e.is_none()).count();
    if let (Some(minus), true) = (out.iter().position(|e| *e == Some(-1)), symbolic > 0) {
        let mut denom = Vec::new();
        for (i, (e, s)) in out.iter().zip(&target.items).enumerate() {
            match (e, s) {
                (Some(-1), _) => {}
                (Some(0), _) => denom.push(input.get(i).cloned().unwrap_or(Dim::Known(0))),
                (_, SymInt::Dim(d)) => denom.push(d.clone()),
                (_, SymInt::Known(v)) => denom.push(Dim::Known((*v).max(0) as usize)),
            }
        }
        let total = Product::of(input).ok_or("the input's size overflows")?;
        let rest = Product::of(&denom).ok_or("the target's size overflows")?;
        match total.divide(&rest).map(|q| q.to_dim()) {
            Some(Dim::Known(k)) => out[minus] = Some(k as i64),
            _ => {
                return Err(format!(
                    "cannot work out the -1 of reshape target {:?} from the input {}",
                    target.items,
                    crate::shape::show(input)
                ))
            }
        }
    }
    if out.iter().filter(|e| e.is_none()).count() + out.iter().filter(|e| **e == Some(-1)).count()
        > 1
    {
        return Err(format!(
            "reshape target {:?} has more than one size known only at run time",
            target.items
        ));
    }
    Ok(out.into_iter().map(|e| e.unwrap_or(-1)).collect())
}

/// `Equal` of two vectors: a symbolic dimension equals itself and is never negative;
/// anything else about it is unknown (an error).
pub fn equal(a: &SymInts, b: &SymInts) -> Result<Vec<bool>, String> {
    let n = a.items.len().max(b.items.len());
    (0..n)
        .map(|i| {
            let x = &a.items[if a.items.len() == 1 { 0 } else { i }];
            let y = &b.items[if b.items.len() == 1 { 0 } else { i }];
            match (x, y) {
                (SymInt::Known(x), SymInt::Known(y)) => Ok(x == y),
                (SymInt::Dim(_), SymInt::Known(k)) | (SymInt::Known(k), SymInt::Dim(_))
                    if *k < 0 =>
                {
                    Ok(false)
                }
                (SymInt::Dim(x), SymInt::Dim(y)) if x == y => Ok(true),
                _ => Err("comparing a symbolic dimension with a size is not folded".into()),
            }
        })
        .collect()
}

/// `Where(cond, a, b)` over vectors, `cond` known.
pub fn select(cond: &[bool], a: &SymInts, b: &SymInts) -> Result<SymInts, String> {
    let n = cond.len().max(a.items.len()).max(b.items.len());
    let pick = |s: &SymInts, i: usize| -> Result<SymInt, String> {
        match s.items.len() {
            1 => Ok(s.items[0].clone()),
            m if m == n => Ok(s.items[i].clone()),
            m => Err(format!("cannot broadcast {m} entries to {n}")),
        }
    };
    let items = (0..n)
        .map(|i| {
            let c = cond[if cond.len() == 1 {
                0
            } else {
                i.min(cond.len() - 1)
            }];
            if c {
                pick(a, i)
            } else {
                pick(b, i)
            }
        })
        .collect::<Result<_, _>>()?;
    Ok(SymInts {
        scalar: a.scalar && b.scalar && cond.len() == 1,
        items,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sym(name: &str) -> Dim {
        Dim::Sym(name.into())
    }

    #[test]
    fn shape_gather_concat_reshape_keeps_the_batch() {
        let x = vec![sym("N"), Dim::Known(16), Dim::Known(4), Dim::Known(4)];
        let s = shape_of(&x, 0, None);
        let n = gather(&s, &HostTensor::ints(vec![], vec![0])).unwrap();
        let n = SymInts {
            scalar: false,
            items: n.items,
        };
        let rest = SymInts::from_host(&HostTensor::ints(vec![1], vec![-1])).unwrap();
        let target = concat(&[n, rest]);
        assert_eq!(reshape_target(&x, &target).unwrap(), vec![0, -1]);
        // [N*4, 8] → [N, -1, 8]: the -1 is 4, and N becomes the inferred size.
        let merged = vec![Dim::Sym("N*4".into()), Dim::Known(8)];
        let split = SymInts {
            scalar: false,
            items: vec![SymInt::Dim(sym("N")), SymInt::Known(-1), SymInt::Known(8)],
        };
        assert_eq!(reshape_target(&merged, &split).unwrap(), vec![-1, 4, 8]);
    }

    #[test]
    fn known_arithmetic_folds_and_symbolic_stays_symbolic_only_where_exact() {
        let a = SymInts::from_host(&HostTensor::ints(vec![2], vec![3, 4])).unwrap();
        let b = SymInts::from_host(&HostTensor::ints(vec![], vec![2])).unwrap();
        let m = arithmetic("Mul", &a, &b).unwrap();
        assert_eq!(m.to_host().unwrap().as_i64(), vec![6, 8]);
        let n = SymInts {
            scalar: true,
            items: vec![SymInt::Dim(sym("N"))],
        };
        let n2 = arithmetic("Mul", &n, &b).unwrap();
        assert_eq!(n2.items, vec![SymInt::Dim(Dim::Sym("N*2".into()))]);
        let back = arithmetic("Div", &n2, &b).unwrap();
        assert_eq!(back.items, vec![SymInt::Dim(sym("N"))]);
        assert!(arithmetic("Div", &n, &b).is_err());
        let m = SymInts::from_host(&HostTensor::ints(vec![], vec![-7])).unwrap();
        let three = SymInts::from_host(&HostTensor::ints(vec![], vec![3])).unwrap();
        assert_eq!(
            arithmetic("Mod", &m, &three)
                .unwrap()
                .to_host()
                .unwrap()
                .as_i64(),
            vec![2]
        );
        assert!(arithmetic(
            "Div",
            &a,
            &SymInts::from_host(&HostTensor::ints(vec![], vec![0])).unwrap()
        )
        .is_err());
    }

    #[test]
    fn slices_and_out_of_range_gathers() {
        let a = SymInts::from_host(&HostTensor::ints(vec![4], vec![1, 2, 3, 4])).unwrap();
        let s = slice(&a, -2, i64::MAX, 1).unwrap();
        assert_eq!(s.to_host().unwrap().as_i64(), vec![3, 4]);
        let r = slice(&a, -1, i64::MIN, -1).unwrap();
        assert_eq!(r.to_host().unwrap().as_i64(), vec![4, 3, 2, 1]);
        assert!(gather(&a, &HostTensor::ints(vec![], vec![9])).is_err());
    }
}
