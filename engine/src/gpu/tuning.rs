//! The kernel choices lowering follows: the matmul kernel variants, and which
//! [`MatmulVariant`] each class of matmul problem gets. Pure: the autotuner
//! (`super::variant_timing`, `super::autotune`) measures and fills it on a device; without
//! it every problem gets [`MatmulVariant::DEFAULT`].

use crate::ops::matmul::Problem;
use crate::storage::Storage;
use std::cell::RefCell;
use std::collections::HashMap;

/// The types a matmul kernel works with: storages of A, B, C and the bias, and the
/// accumulator type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MatmulTypes {
    /// A.
    pub a: Storage,
    /// B.
    pub b: Storage,
    /// C.
    pub c: Storage,
    /// The bias (if any).
    pub bias: Storage,
    /// Accumulate in f16 (f16 precision mode) instead of f32.
    pub f16_accumulate: bool,
}

/// How a matmul kernel with vec4 loads (K and N multiples of 4) shares out C: register
/// blocks of `rows` × `cols` vec4 columns per invocation in `wx` × `wy` workgroups, or
/// 64×64 tiles staged in workgroup memory. The autotuner picks
/// one per adapter and problem class; all give the same bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MatmulVariant {
    /// Register-blocked, no workgroup memory.
    Blocked {
        /// Rows of C per invocation.
        rows: u32,
        /// vec4 columns of C per invocation.
        cols: u32,
        /// Workgroup width (along columns).
        wx: u32,
        /// Workgroup height (along rows).
        wy: u32,
    },
    /// 64×64 tiles of C per 16×16 workgroup through workgroup memory.
    Tiled,
    /// Register-blocked like [`MatmulVariant::Blocked`], reading A and B from textures
    /// that two pack passes fill first (one batch, sides within [`TEXTURE_SIDE`]).
    Textured {
        /// Rows of C per invocation.
        rows: u32,
        /// vec4 columns of C per invocation.
        cols: u32,
        /// Workgroup width (along columns).
        wx: u32,
        /// Workgroup height (along rows).
        wy: u32,
    },
    /// Like [`MatmulVariant::Textured`], with each subgroup of `lanes` lanes sharing its
    /// rows of A: a lane fetches `rows / lanes` texels of A per step and subgroup
    /// broadcasts hand every row to every lane. Needs subgroups of exactly `lanes` lanes
    /// (see [`MatmulVariant::runs_on`]); each subgroup is one row of the workgroup.
    Subgroup {
        /// Rows of C per invocation (a multiple of `lanes`).
        rows: u32,
        /// vec4 columns of C per invocation.
        cols: u32,
        /// Lanes per subgroup, the workgroup's width.
        lanes: u32,
        /// Subgroups per workgroup, its height.
        wy: u32,
    },
}

impl MatmulVariant {
    /// What runs where nothing was tuned: 4×4 blocks in 8×8 workgroups.
    pub const DEFAULT: MatmulVariant = MatmulVariant::Blocked {
        rows: 4,
        cols: 1,
        wx: 8,
        wy: 8,
    };

    /// Every variant the autotuner tries.
    pub const ALL: [MatmulVariant; 14] = [
        MatmulVariant::DEFAULT,
        MatmulVariant::Blocked {
            rows: 8,
            cols: 1,
            wx: 8,
            wy: 8,
        },
        MatmulVariant::Blocked {
            rows: 4,
            cols: 2,
            wx: 8,
            wy: 8,
        },
        MatmulVariant::Blocked {
            rows: 8,
            cols: 2,
            wx: 8,
            wy: 8,
        },
        MatmulVariant::Blocked {
            rows: 4,
            cols: 1,
            wx: 16,
            wy: 16,
        },
        MatmulVariant::Blocked {
            rows: 2,
            cols: 1,
            wx: 16,
            wy: 4,
        },
        MatmulVariant::Tiled,
        MatmulVariant::Textured {
            rows: 8,
            cols: 2,
            wx: 8,
            wy: 8,
        },
        MatmulVariant::Textured {
            rows: 8,
            cols: 4,
            wx: 8,
            wy: 8,
        },
        MatmulVariant::Textured {
            rows: 16,
            cols: 2,
            wx: 8,
            wy: 8,
        },
        MatmulVariant::Textured {
            rows: 16,
            cols: 4,
            wx: 8,
            wy: 8,
        },
        MatmulVariant::Textured {
            rows: 8,
            cols: 8,
            wx: 8,
            wy: 8,
        },
        MatmulVariant::Subgroup {
            rows: 16,
            cols: 4,
            lanes: 8,
            wy: 8,
        },
        MatmulVariant::Subgroup {
            rows: 32,
            cols: 4,
            lanes: 8,
            wy: 8,
        },
    ];

    /// Its name in the tuning cache and reports, e.g. `blocked 4x1 8x8`, `tiled 64x64`.
    pub fn name(&self) -> String {
        match *self {
            MatmulVariant::Blocked { rows, cols, wx, wy } => {
                format!("blocked {rows}x{cols} {wx}x{wy}")
            }
            MatmulVariant::Tiled => "tiled 64x64".into(),
            MatmulVariant::Textured { rows, cols, wx, wy } => {
                format!("textured {rows}x{cols} {wx}x{wy}")
            }
            MatmulVariant::Subgroup {
                rows,
                cols,
                lanes,
                wy,
            } => format!("subgroup {rows}x{cols} {lanes}x{wy}"),
        }
    }

    /// The variant a name gives (see [`MatmulVariant::name`]), if any.
    pub fn parse(name: &str) -> Option<MatmulVariant> {
        MatmulVariant::ALL.into_iter().find(|v| v.name() == name)
    }

    /// Workgroup width and height (a subgroup variant's workgroup is one-dimensional in
    /// WGSL, `lanes × wy` invocations, seen as `wy` rows of `lanes`).
    pub fn workgroup(&self) -> (u32, u32) {
        match *self {
            MatmulVariant::Blocked { wx, wy, .. } | MatmulVariant::Textured { wx, wy, .. } => {
                (wx, wy)
            }
            MatmulVariant::Subgroup { lanes, wy, .. } => (lanes, wy),
            MatmulVariant::Tiled => (16, 16),
        }
    }

    /// Invocations per workgroup.
    pub fn invocations(&self) -> u32 {
        let (x, y) = self.workgroup();
        x * y
    }

    /// Whether it reads A and B from textures that pack passes fill first.
    pub fn textured(&self) -> bool {
        matches!(
            self,
            MatmulVariant::Textured { .. } | MatmulVariant::Subgroup { .. }
        )
    }

    /// Whether an adapter whose subgroups have exactly `subgroup_lanes` lanes (`None`:
    /// no subgroup operations, or a size that varies) can run it: only subgroup variants
    /// ask for anything.
    pub fn runs_on(&self, subgroup_lanes: Option<u32>) -> bool {
        match *self {
            MatmulVariant::Subgroup { lanes, .. } => subgroup_lanes == Some(lanes),
            _ => true,
        }
    }
}

/// Whether a problem takes the vec4 kernels (and so a [`MatmulVariant`]): K and N
/// multiples of 4.
pub fn vectorised(p: &Problem) -> bool {
    p.k.is_multiple_of(4) && p.n.is_multiple_of(4) && p.k > 0
}

/// The longest texture side every WebGPU adapter allows (`maxTextureDimension2D`).
pub const TEXTURE_SIDE: usize = 8192;

/// Whether a vec4 problem can take a textured kernel ([`MatmulVariant::textured`]): one batch, and A
/// (K/4 × M texels) and B (N/4 × K texels) within [`TEXTURE_SIDE`].
pub fn textured_fits(p: &Problem) -> bool {
    vectorised(p)
        && p.offsets.len() == 1
        && p.m > 0
        && [p.m, p.k, p.k / 4, p.n / 4]
            .iter()
            .all(|&side| side <= TEXTURE_SIDE)
}

/// Problems with fewer multiply-adds than this (per batch) are never tuned: the kernel
/// choice cannot matter much, and measuring would cost more than it saves.
pub const MIN_TUNED_WORK: usize = 1 << 21;

/// A class of matmul problems that share a tuned variant: each size rounded up to a power
/// of two, whether batched, and the storages and accumulator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MatmulClass {
    /// Rows of C, rounded up to a power of two.
    pub m: usize,
    /// Columns of C, rounded up to a power of two.
    pub n: usize,
    /// Inner dimension, rounded up to a power of two.
    pub k: usize,
    /// More than one batch.
    pub batched: bool,
    /// Storages and accumulator.
    pub types: MatmulTypes,
}

impl MatmulClass {
    /// The class of a problem.
    pub fn of(p: &Problem, types: MatmulTypes) -> MatmulClass {
        MatmulClass {
            m: p.m.next_power_of_two(),
            n: p.n.next_power_of_two(),
            k: p.k.next_power_of_two(),
            batched: p.offsets.len() > 1,
            types,
        }
    }

    /// Its key in the tuning cache, e.g. `m1024 n1024 k1024 f32·f32→f32 f32`.
    pub fn key(&self) -> String {
        let batched = if self.batched { " batched" } else { "" };
        format!(
            "m{} n{} k{}{batched} {}",
            self.m,
            self.n,
            self.k,
            describe(self.types)
        )
    }
}

fn storage_name(s: Storage) -> &'static str {
    match s {
        Storage::F32 => "f32",
        Storage::F16 => "f16",
        Storage::Packed => "packed-f16",
        Storage::I32 => "i32",
        Storage::Bool => "bool",
    }
}

/// `A·B→C accumulator`, e.g. `f32·f32→f32 f32`.
fn describe(t: MatmulTypes) -> String {
    let acc = if t.f16_accumulate { "f16" } else { "f32" };
    format!(
        "{}·{}→{} {acc}",
        storage_name(t.a),
        storage_name(t.b),
        storage_name(t.c)
    )
}

/// A problem lowering met that the autotuner could measure: its class and the sizes it
/// was met with (what the tuner measures on).
#[derive(Debug, Clone, PartialEq)]
pub struct MatmulTask {
    /// Its class.
    pub class: MatmulClass,
    /// Rows of C.
    pub m: usize,
    /// Columns of C.
    pub n: usize,
    /// Inner dimension.
    pub k: usize,
}

/// The variants lowering uses, by problem class, and the tunable problems it met.
#[derive(Debug, Default)]
pub struct Tuning {
    chosen: HashMap<MatmulClass, MatmulVariant>,
    forced: Option<MatmulVariant>,
    met: RefCell<Vec<MatmulTask>>,
}

impl Tuning {
    /// Every problem gets [`MatmulVariant::DEFAULT`].
    pub fn none() -> Tuning {
        Tuning::default()
    }

    /// Every vec4 problem gets `variant` (for tests and the kernel corpus).
    pub fn forced(variant: MatmulVariant) -> Tuning {
        Tuning {
            forced: Some(variant),
            ..Tuning::default()
        }
    }

    /// The variants chosen by class; other classes get the default.
    pub fn with(chosen: HashMap<MatmulClass, MatmulVariant>) -> Tuning {
        Tuning {
            chosen,
            ..Tuning::default()
        }
    }

    /// The variant of a problem, noting it when it is worth tuning.
    pub fn matmul_variant(&self, p: &Problem, types: MatmulTypes) -> MatmulVariant {
        if !vectorised(p) {
            return MatmulVariant::DEFAULT;
        }
        if let Some(v) = self.forced {
            return v;
        }
        let class = MatmulClass::of(p, types);
        let work = p.m.saturating_mul(p.n).saturating_mul(p.k);
        if work >= MIN_TUNED_WORK {
            let mut met = self.met.borrow_mut();
            if !met.iter().any(|t| t.class == class) {
                met.push(MatmulTask {
                    class,
                    m: p.m,
                    n: p.n,
                    k: p.k,
                });
            }
        }
        self.chosen
            .get(&class)
            .copied()
            .unwrap_or(MatmulVariant::DEFAULT)
    }

    /// The tunable problems lowering met, one per class, in the order met.
    pub fn met(&self) -> Vec<MatmulTask> {
        self.met.borrow().clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_variant_is_found_by_its_name() {
        for v in MatmulVariant::ALL {
            assert_eq!(MatmulVariant::parse(&v.name()), Some(v), "{}", v.name());
        }
        assert_eq!(MatmulVariant::parse("subgroup 16x4 4x8"), None);
    }

    #[test]
    fn only_subgroup_variants_ask_for_subgroups_of_their_lane_count() {
        let sg = MatmulVariant::Subgroup {
            rows: 16,
            cols: 4,
            lanes: 8,
            wy: 8,
        };
        assert!(sg.runs_on(Some(8)));
        assert!(!sg.runs_on(Some(16)));
        assert!(!sg.runs_on(None));
        assert!(sg.textured());
        assert_eq!(sg.invocations(), 64);
        for v in MatmulVariant::ALL
            .into_iter()
            .filter(|v| !matches!(v, MatmulVariant::Subgroup { .. }))
        {
            assert!(v.runs_on(None), "{}", v.name());
        }
    }
}
