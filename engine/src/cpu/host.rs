//! What the reference computes on: a float type ([`Float`]: f32 or f64) and a host tensor
//! of it ([`Host`]: [`Tensor`] or [`Tensor64`]). Every family is written once against
//! these; in f32 each operation is the one the reference always did (the f64 steps some
//! families take inside stay f64), so f32 results are unchanged, and in f64 the same
//! formulas run with f64 rounding, which is what gradient checks difference.

use crate::dtype::DType;
use crate::tensor::{Tensor, Tensor64, TensorData, TensorData64};
use std::fmt::Debug;
use std::ops::{Add, AddAssign, Div, Mul, Neg, Sub};

/// A float type the reference computes in. Literal constants of the formulas come from
/// their f32 spelling ([`Float::from_f32`]), so both types compute the same function.
pub trait Float:
    Copy
    + PartialOrd
    + Debug
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + Neg<Output = Self>
    + AddAssign
    + 'static
{
    /// 0.
    const ZERO: Self;
    /// 1.
    const ONE: Self;
    /// −∞.
    const NEG_INFINITY: Self;
    /// √2.
    const SQRT_2: Self;
    /// 2/√π.
    const FRAC_2_SQRT_PI: Self;
    /// An f32 value (exact).
    fn from_f32(x: f32) -> Self;
    /// An f64 value, rounded to nearest.
    fn from_f64(x: f64) -> Self;
    /// As f64 (exact).
    fn to_f64(self) -> f64;
    /// An integer, rounded to nearest.
    fn from_i32(x: i32) -> Self;
    /// Truncated toward zero, saturating, NaN to 0 (Rust's `as`).
    fn to_i32(self) -> i32;
    /// eˣ.
    fn exp(self) -> Self;
    /// Natural logarithm.
    fn ln(self) -> Self;
    /// ln(1 + x), accurate near 0.
    fn ln_1p(self) -> Self;
    /// Hyperbolic tangent.
    fn tanh(self) -> Self;
    /// Square root.
    fn sqrt(self) -> Self;
    /// `self` to the power `y`, with C99's special cases (Annex F.9.4.4: `pow(x, ±0)` is
    /// 1 even for NaN x, `pow(±0, y < 0)` is ±∞, a negative base needs an integer
    /// exponent, ...), which Rust's `powf` follows.
    fn powf(self, y: Self) -> Self;
    /// The larger (a NaN operand gives the other).
    fn max(self, y: Self) -> Self;
    /// The smaller (a NaN operand gives the other).
    fn min(self, y: Self) -> Self;
    /// The larger, NaN when either is (IEEE 754-2019 `maximum`, PyTorch's `maximum`):
    /// what every operator built on a maximum computes.
    fn maximum(self, y: Self) -> Self {
        if self.is_nan() {
            self
        } else if y.is_nan() {
            y
        } else {
            self.max(y)
        }
    }
    /// The smaller, NaN when either is (IEEE 754-2019 `minimum`).
    fn minimum(self, y: Self) -> Self {
        if self.is_nan() {
            self
        } else if y.is_nan() {
            y
        } else {
            self.min(y)
        }
    }
    /// Whether this is NaN.
    fn is_nan(self) -> bool;
    /// |x|.
    fn abs(self) -> Self;
    /// Largest integer not above x.
    fn floor(self) -> Self;
    /// Smallest integer not below x.
    fn ceil(self) -> Self;
    /// Nearest integer, halves to even.
    fn round_even(self) -> Self;
    /// Sine.
    fn sin(self) -> Self;
    /// Cosine.
    fn cos(self) -> Self;
    /// The remainder of truncated division (C's fmod: the sign of `self`).
    fn fmod(self, y: Self) -> Self;
}

macro_rules! float {
    ($t:ident) => {
        impl Float for $t {
            const ZERO: $t = 0.0;
            const ONE: $t = 1.0;
            const NEG_INFINITY: $t = $t::NEG_INFINITY;
            const SQRT_2: $t = std::$t::consts::SQRT_2;
            const FRAC_2_SQRT_PI: $t = std::$t::consts::FRAC_2_SQRT_PI;
            fn from_f32(x: f32) -> $t {
                x.into()
            }
            fn from_f64(x: f64) -> $t {
                x as $t
            }
            fn to_f64(self) -> f64 {
                self.into()
            }
            fn from_i32(x: i32) -> $t {
                x as $t
            }
            fn to_i32(self) -> i32 {
                self as i32
            }
            fn exp(self) -> $t {
                $t::exp(self)
            }
            fn ln(self) -> $t {
                $t::ln(self)
            }
            fn ln_1p(self) -> $t {
                $t::ln_1p(self)
            }
            fn tanh(self) -> $t {
                $t::tanh(self)
            }
            fn sqrt(self) -> $t {
                $t::sqrt(self)
            }
            fn powf(self, y: $t) -> $t {
                $t::powf(self, y)
            }
            fn max(self, y: $t) -> $t {
                $t::max(self, y)
            }
            fn min(self, y: $t) -> $t {
                $t::min(self, y)
            }
            fn is_nan(self) -> bool {
                $t::is_nan(self)
            }
            fn abs(self) -> $t {
                $t::abs(self)
            }
            fn floor(self) -> $t {
                $t::floor(self)
            }
            fn ceil(self) -> $t {
                $t::ceil(self)
            }
            fn round_even(self) -> $t {
                $t::round_ties_even(self)
            }
            fn sin(self) -> $t {
                $t::sin(self)
            }
            fn cos(self) -> $t {
                $t::cos(self)
            }
            fn fmod(self, y: $t) -> $t {
                self % y
            }
        }
    };
}
float!(f32);
float!(f64);

/// A host tensor the reference evaluates on: floats of [`Host::F`], or i32s, or bools.
pub trait Host: Clone {
    /// The float type of its float elements.
    type F: Float;
    /// The concrete shape.
    fn shape(&self) -> &[usize];
    /// The element type the graph sees (floats are `f32`).
    fn dtype(&self) -> DType;
    /// Checks that it holds exactly the elements its shape says.
    fn check(&self) -> Result<(), String>;
    /// The float elements, if it holds floats.
    fn floats(&self) -> Option<&[Self::F]>;
    /// The integers, if it holds i32s.
    fn ints(&self) -> Option<&[i32]>;
    /// The booleans, if it holds bools.
    fn bools(&self) -> Option<&[bool]>;
    /// A float tensor.
    fn from_floats(shape: Vec<usize>, v: Vec<Self::F>) -> Self;
    /// An i32 tensor.
    fn from_ints(shape: Vec<usize>, v: Vec<i32>) -> Self;
    /// A bool tensor.
    fn from_bools(shape: Vec<usize>, v: Vec<bool>) -> Self;
    /// An f32 tensor (a constant) in this representation.
    fn from_tensor(t: &Tensor) -> Self;
    /// The same elements under another shape (a view).
    fn reshaped(&self, shape: Vec<usize>) -> Self;

    /// Every element as a float (integers and booleans converted).
    fn to_floats(&self) -> Vec<Self::F> {
        match (self.floats(), self.ints(), self.bools()) {
            (Some(v), _, _) => v.to_vec(),
            (_, Some(v), _) => v.iter().map(|&x| Self::F::from_i32(x)).collect(),
            (_, _, Some(v)) => v
                .iter()
                .map(|&x| if x { Self::F::ONE } else { Self::F::ZERO })
                .collect(),
            _ => Vec::new(),
        }
    }
}

impl Host for Tensor {
    type F = f32;
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn dtype(&self) -> DType {
        Tensor::dtype(self)
    }
    fn check(&self) -> Result<(), String> {
        Tensor::check(self)
    }
    fn floats(&self) -> Option<&[f32]> {
        self.as_f32()
    }
    fn ints(&self) -> Option<&[i32]> {
        match &self.data {
            TensorData::I32(v) => Some(v),
            _ => None,
        }
    }
    fn bools(&self) -> Option<&[bool]> {
        match &self.data {
            TensorData::Bool(v) => Some(v),
            _ => None,
        }
    }
    fn from_floats(shape: Vec<usize>, v: Vec<f32>) -> Tensor {
        Tensor::f32(shape, v)
    }
    fn from_ints(shape: Vec<usize>, v: Vec<i32>) -> Tensor {
        Tensor {
            shape,
            data: TensorData::I32(v),
        }
    }
    fn from_bools(shape: Vec<usize>, v: Vec<bool>) -> Tensor {
        Tensor {
            shape,
            data: TensorData::Bool(v),
        }
    }
    fn from_tensor(t: &Tensor) -> Tensor {
        t.clone()
    }
    fn reshaped(&self, shape: Vec<usize>) -> Tensor {
        Tensor {
            shape,
            data: self.data.clone(),
        }
    }
}

impl Host for Tensor64 {
    type F = f64;
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn dtype(&self) -> DType {
        Tensor64::dtype(self)
    }
    fn check(&self) -> Result<(), String> {
        Tensor64::check(self)
    }
    fn floats(&self) -> Option<&[f64]> {
        self.as_f64()
    }
    fn ints(&self) -> Option<&[i32]> {
        match &self.data {
            TensorData64::I32(v) => Some(v),
            _ => None,
        }
    }
    fn bools(&self) -> Option<&[bool]> {
        match &self.data {
            TensorData64::Bool(v) => Some(v),
            _ => None,
        }
    }
    fn from_floats(shape: Vec<usize>, v: Vec<f64>) -> Tensor64 {
        Tensor64::f64(shape, v)
    }
    fn from_ints(shape: Vec<usize>, v: Vec<i32>) -> Tensor64 {
        Tensor64 {
            shape,
            data: TensorData64::I32(v),
        }
    }
    fn from_bools(shape: Vec<usize>, v: Vec<bool>) -> Tensor64 {
        Tensor64 {
            shape,
            data: TensorData64::Bool(v),
        }
    }
    fn from_tensor(t: &Tensor) -> Tensor64 {
        t.into()
    }
    fn reshaped(&self, shape: Vec<usize>) -> Tensor64 {
        Tensor64 {
            shape,
            data: self.data.clone(),
        }
    }
}
