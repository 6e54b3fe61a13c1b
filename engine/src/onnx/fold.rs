//! Folding the shape arithmetic models carry (`Shape → Gather → Concat → Reshape` and the
//! like) at import: values known when the model is loaded are computed on the host, and
//! integer vectors whose entries are a model's symbolic dimensions keep those entries as
//! symbols, so a reshape target built from `Shape(x)` becomes a plain `reshape` attribute
//! with the batch copied from the input.

use super::tensor::{Elements, HostTensor};
use crate::shape::Dim;

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
            i += step;
        }
    } else {
        let (mut i, e) = (norm(start, -1, n - 1), norm(end, -1, n - 1));
        while i > e {
            items.push(data.items[i as usize].clone());
            i += step;
        }
    }
    Ok(SymInts {
        scalar: false,
        items,
    })
}

/// Elementwise integer arithmetic with broadcasting of a one-entry side; symbolic entries
/// survive only `x * 1`, `x + 0`, `x - 0` and `x / 1`.
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
            ("Mul", d @ SymInt::Dim(_), SymInt::Known(1))
            | ("Mul", SymInt::Known(1), d @ SymInt::Dim(_))
            | ("Add" | "Sub", d @ SymInt::Dim(_), SymInt::Known(0))
            | ("Add", SymInt::Known(0), d @ SymInt::Dim(_))
            | ("Div", d @ SymInt::Dim(_), SymInt::Known(1)) => d,
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
        "Max" => Some(x.max(y)),
        "Min" => Some(x.min(y)),
        _ => return Err(format!("{op} is not folded")),
    };
    r.ok_or_else(|| format!("{op} of {x} and {y} overflows"))
}

/// A reshape target with symbolic entries as the attribute Sluice's `reshape` takes: a
/// symbol at the position where the input has the same symbol becomes 0 (copy), one other
/// unknown entry becomes -1 (inferred).
pub fn reshape_target(input: &[Dim], target: &SymInts) -> Result<Vec<i64>, String> {
    let mut inferred = target.items.contains(&SymInt::Known(-1));
    target
        .items
        .iter()
        .enumerate()
        .map(|(i, s)| match s {
            SymInt::Known(v) => Ok(*v),
            SymInt::Dim(d) if input.get(i) == Some(d) => Ok(0),
            SymInt::Dim(d) if !inferred => {
                inferred = true;
                let _ = d;
                Ok(-1)
            }
            SymInt::Dim(d) => Err(format!(
                "the target shape's entry {i} is the symbolic size {} at a new position, with another size already inferred",
                crate::shape::show(std::slice::from_ref(d))
            )),
        })
        .collect()
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
        assert!(arithmetic("Mul", &n, &b).is_err());
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
