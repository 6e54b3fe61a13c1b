//! Shapes with symbolic dimensions, and the shape arithmetic shared by the operators.
//!
//! A dimension is a known size or a symbol (`"N"`, bound at run time to the batch size).
//! Products of dimensions stay symbolic as a coefficient times a sorted list of symbols,
//! so `flatten` of `[N, 16, 4, 4]` is `[N, 256]` and `reshape` with `-1` can cancel symbols.

use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::fmt;

/// One dimension of a shape.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Dim {
    /// A size known when the graph is loaded.
    Known(usize),
    /// A symbolic size such as `"N"` (or a product such as `"N*16"`), bound at run time.
    Sym(String),
}

/// A tensor shape: one [`Dim`] per axis.
pub type Shape = Vec<Dim>;

impl Dim {
    /// The size, if known.
    pub fn known(&self) -> Option<usize> {
        match self {
            Dim::Known(n) => Some(*n),
            Dim::Sym(_) => None,
        }
    }
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dim::Known(n) => write!(f, "{n}"),
            Dim::Sym(s) => f.write_str(s),
        }
    }
}

/// Formats a shape as `[N, 784]`.
pub fn show(shape: &[Dim]) -> String {
    let parts: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    format!("[{}]", parts.join(", "))
}

/// Converts a concrete shape to a [`Shape`].
pub fn known(dims: &[usize]) -> Shape {
    dims.iter().map(|&d| Dim::Known(d)).collect()
}

/// The concrete sizes of a shape, if every dimension is known.
pub fn concrete(shape: &[Dim]) -> Option<Vec<usize>> {
    shape.iter().map(Dim::known).collect()
}

/// Replaces every symbol (and symbolic product) by its bound value.
pub fn bind(shape: &[Dim], bindings: &HashMap<String, usize>) -> Result<Shape, String> {
    shape
        .iter()
        .map(|d| match d {
            Dim::Known(n) => Ok(Dim::Known(*n)),
            Dim::Sym(s) => {
                let mut product = 1usize;
                for factor in s.split('*') {
                    let v = match factor.parse::<usize>() {
                        Ok(v) => v,
                        Err(_) => *bindings
                            .get(factor)
                            .ok_or_else(|| format!("symbolic dimension '{factor}' has no value"))?,
                    };
                    product = product
                        .checked_mul(v)
                        .ok_or_else(|| format!("dimension {s} overflows"))?;
                }
                Ok(Dim::Known(product))
            }
        })
        .collect()
}

/// A product of dimensions: a known coefficient times symbols (sorted, with repeats).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Product {
    /// The known part.
    pub coeff: usize,
    /// The symbolic factors, sorted.
    pub syms: Vec<String>,
}

impl Product {
    /// The product of a list of dimensions; `None` on overflow.
    pub fn of(dims: &[Dim]) -> Option<Product> {
        let mut p = Product {
            coeff: 1,
            syms: Vec::new(),
        };
        for d in dims {
            match d {
                Dim::Known(n) => p.coeff = p.coeff.checked_mul(*n)?,
                Dim::Sym(s) => {
                    for f in s.split('*') {
                        match f.parse::<usize>() {
                            Ok(n) => p.coeff = p.coeff.checked_mul(n)?,
                            Err(_) => p.syms.push(f.to_string()),
                        }
                    }
                }
            }
        }
        p.syms.sort();
        Some(p)
    }

    /// This product as one dimension.
    pub fn to_dim(&self) -> Dim {
        if self.syms.is_empty() {
            return Dim::Known(self.coeff);
        }
        let mut parts = self.syms.clone();
        if self.coeff != 1 {
            parts.push(self.coeff.to_string());
        }
        Dim::Sym(parts.join("*"))
    }

    /// `self / other` when it divides exactly (symbols cancel by name).
    pub fn divide(&self, other: &Product) -> Option<Product> {
        if other.coeff == 0 || !self.coeff.is_multiple_of(other.coeff) {
            return None;
        }
        let mut syms = self.syms.clone();
        for s in &other.syms {
            let pos = syms.iter().position(|x| x == s)?;
            syms.remove(pos);
        }
        Some(Product {
            coeff: self.coeff / other.coeff,
            syms,
        })
    }
}

/// Numpy broadcasting of two shapes; the error names both shapes.
pub fn broadcast(a: &[Dim], b: &[Dim]) -> Result<Shape, String> {
    let rank = a.len().max(b.len());
    let mut out = Vec::with_capacity(rank);
    for i in 0..rank {
        let da = if i + a.len() >= rank {
            Some(&a[i + a.len() - rank])
        } else {
            None
        };
        let db = if i + b.len() >= rank {
            Some(&b[i + b.len() - rank])
        } else {
            None
        };
        let d = match (da, db) {
            (Some(x), None) | (None, Some(x)) => x.clone(),
            (Some(x), Some(y)) if x == y => x.clone(),
            (Some(Dim::Known(1)), Some(y)) => y.clone(),
            (Some(x), Some(Dim::Known(1))) => x.clone(),
            _ => {
                return Err(format!(
                    "shapes {} and {} do not broadcast",
                    show(a),
                    show(b)
                ))
            }
        };
        out.push(d);
    }
    Ok(out)
}

/// Resolves a possibly negative axis against a rank.
pub fn axis(axis: i64, rank: usize) -> Result<usize, String> {
    let r = i64::try_from(rank).map_err(|_| format!("rank {rank} is too large"))?;
    if axis < -r || axis >= r.max(1) && !(rank == 0 && axis == 0) {
        return Err(format!("axis {axis} is out of range for rank {rank}"));
    }
    let a = if axis < 0 { axis + r } else { axis };
    usize::try_from(a).map_err(|_| format!("axis {axis} is out of range for rank {rank}"))
}

/// Resolves an axis that must exist: like [`axis`], except that a tensor of rank 0 has
/// no axis 0 to index.
pub fn existing_axis(axis: i64, rank: usize) -> Result<usize, String> {
    let a = self::axis(axis, rank)?;
    if a >= rank {
        return Err(format!(
            "axis {axis} does not exist in a tensor of rank {rank}"
        ));
    }
    Ok(a)
}

/// The message of a size that does not fit in memory's address space.
fn overflow(dims: &[usize]) -> String {
    format!("shape {dims:?} has more elements than can be addressed")
}

/// Row-major strides of a concrete shape; an error when they overflow.
pub fn strides(dims: &[usize]) -> Result<Vec<usize>, String> {
    let mut s = vec![1usize; dims.len()];
    for i in (0..dims.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1]
            .checked_mul(dims[i + 1])
            .ok_or_else(|| overflow(dims))?;
    }
    Ok(s)
}

/// Strides of `input` read in an output of shape `out` under broadcasting (0 on broadcast
/// axes); an error when `input` has more axes than `out` or the strides overflow.
pub fn broadcast_strides(input: &[usize], out: &[usize]) -> Result<Vec<usize>, String> {
    let own = strides(input)?;
    let offset = out
        .len()
        .checked_sub(input.len())
        .ok_or_else(|| format!("shape {input:?} has more axes than the output {out:?}"))?;
    Ok((0..out.len())
        .map(|i| match i.checked_sub(offset) {
            Some(j) if input[j] != 1 => own[j],
            _ => 0,
        })
        .collect())
}

/// The number of elements of a concrete shape; an error when it overflows.
pub fn numel(dims: &[usize]) -> Result<usize, String> {
    dims.iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| overflow(dims))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(x: &str) -> Dim {
        Dim::Sym(x.into())
    }

    #[test]
    fn broadcasting_follows_numpy() {
        let out = broadcast(&[s("N"), Dim::Known(1), Dim::Known(5)], &known(&[4, 1])).unwrap();
        assert_eq!(out, vec![s("N"), Dim::Known(4), Dim::Known(5)]);
        let err = broadcast(&known(&[3]), &known(&[4])).unwrap_err();
        assert!(err.contains("[3]") && err.contains("[4]"), "{err}");
    }

    #[test]
    fn products_cancel_symbols() {
        let p = Product::of(&[s("N"), Dim::Known(16), Dim::Known(4)]).unwrap();
        assert_eq!(p.to_dim(), s("N*64"));
        let q = p.divide(&Product::of(&[Dim::Known(8)]).unwrap()).unwrap();
        assert_eq!(q.to_dim(), s("N*8"));
        let r = p.divide(&Product::of(&[s("N")]).unwrap()).unwrap();
        assert_eq!(r.to_dim(), Dim::Known(64));
        let bound = bind(&[s("N*8")], &HashMap::from([("N".to_string(), 3)])).unwrap();
        assert_eq!(bound, vec![Dim::Known(24)]);
    }

    #[test]
    fn axes_and_strides() {
        assert_eq!(axis(-1, 3).unwrap(), 2);
        assert!(axis(3, 3).is_err());
        assert_eq!(strides(&[2, 3, 4]).unwrap(), vec![12, 4, 1]);
        assert_eq!(
            broadcast_strides(&[3, 1], &[2, 3, 4]).unwrap(),
            vec![0, 1, 0]
        );
        assert!(axis(i64::MIN, 3).is_err() && axis(i64::MAX, 3).is_err());
    }

    #[test]
    fn sizes_that_overflow_are_errors_not_wraps() {
        let huge = [1usize << 40, 1 << 40];
        assert!(numel(&huge).is_err());
        assert!(strides(&[2, usize::MAX, 2]).is_err());
        assert!(broadcast_strides(&[2, 3], &[3]).is_err());
        assert_eq!(numel(&[]).unwrap(), 1);
        assert!(Product::of(&[Dim::Known(usize::MAX), Dim::Known(2)]).is_none());
        let sym = Dim::Sym(format!("N*{}", usize::MAX));
        assert!(bind(&[sym], &HashMap::from([("N".to_string(), 2)])).is_err());
    }
}
