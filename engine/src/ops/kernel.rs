//! What lowering an operator produces: WGSL kernels with their bindings, parameter words
//! and dispatch size, plus the template step that fills `shaders/*.wgsl`.

use crate::dtype::DType;

/// A value with a concrete shape, as lowering sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Concrete {
    /// Concrete shape.
    pub shape: Vec<usize>,
    /// Element type.
    pub dtype: DType,
}

impl Concrete {
    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// What a binding of a kernel refers to (binding 0 is always the parameter words).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Slot {
    /// The operator's input `i`.
    Input(usize),
    /// The operator's output `i`.
    Output(usize),
    /// The operator's weight `i` (in `params()` order).
    Param(usize),
}

/// One compute pass.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Kernel {
    /// A label for traces and errors, such as `matmul vec4`.
    pub label: String,
    /// The complete WGSL source.
    pub source: String,
    /// Bindings 1.. (binding 0 holds `info`).
    pub slots: Vec<Slot>,
    /// Parameter words the kernel reads at binding 0 (never empty).
    pub info: Vec<u32>,
    /// Workgroups to dispatch.
    pub workgroups: [u32; 3],
}

/// The result of lowering one operator.
#[derive(Debug, Clone, PartialEq)]
pub enum Lowering {
    /// Passes to run, in order.
    Kernels(Vec<Kernel>),
    /// The output is the input's buffer reinterpreted (reshape, squeeze, identity...).
    Alias,
    /// The output is a constant computed on the host and uploaded once.
    Constant,
}

/// Workgroup size of the one-dimensional kernels.
pub const WG: u32 = 64;

/// The largest workgroup count per dimension WebGPU guarantees.
pub const MAX_GROUPS: u32 = 65535;

/// A dispatch covering `threads` invocations of a 1-D kernel of `wg` lanes, folded into two
/// dimensions when it exceeds [`MAX_GROUPS`]. Kernels compute their index as
/// `gid.x + gid.y * nwg.x * wg`.
pub fn dispatch_1d(threads: usize, wg: u32) -> Result<[u32; 3], String> {
    let groups = threads.div_ceil(wg as usize);
    if groups == 0 {
        return Ok([0, 1, 1]);
    }
    let x = groups.min(MAX_GROUPS as usize);
    let y = groups.div_ceil(x);
    if y > MAX_GROUPS as usize {
        return Err(format!(
            "{threads} elements exceed the dispatch limit of one pass"
        ));
    }
    Ok([x as u32, y as u32, 1])
}

/// Fills `{{KEY}}` placeholders of a WGSL template.
pub fn fill(template: &str, pairs: &[(&str, String)]) -> String {
    let mut s = template.to_string();
    for (k, v) in pairs {
        s = s.replace(&format!("{{{{{k}}}}}"), v);
    }
    debug_assert!(!s.contains("{{"), "unfilled placeholder in template:\n{s}");
    s
}

/// A WGSL expression for an f32 constant, exact to the bit.
pub fn f32_literal(v: f32) -> String {
    if v.is_finite() && v == v.trunc() && v.abs() < 1e7 {
        format!("{v:.1}")
    } else {
        format!("bitcast<f32>({}u)", v.to_bits())
    }
}

/// Converts a shape dimension or offset to a kernel word, failing when it exceeds u32.
pub fn word(v: usize) -> Result<u32, String> {
    u32::try_from(v).map_err(|_| format!("size {v} exceeds the 32-bit index range of WGSL"))
}

/// Converts a signed stride to a kernel word (two's complement).
pub fn signed_word(v: i64) -> Result<u32, String> {
    i32::try_from(v)
        .map(|x| x as u32)
        .map_err(|_| format!("stride {v} exceeds the 32-bit index range of WGSL"))
}

/// The section of a shader family file after the line `//! variant NAME`, up to the next
/// variant marker. Every variant is a complete shader.
pub fn variant(file: &'static str, name: &str) -> &'static str {
    let marker = format!("//! variant {name}\n");
    let Some(start) = file.find(&marker) else {
        return "";
    };
    let body = &file[start + marker.len()..];
    match body.find("//! variant ") {
        Some(end) => &body[..end],
        None => body,
    }
}

/// Elementwise work applied to a kernel's result before it is stored (fusion): WGSL
/// statements over `x` (the value) and `col` (its column, for row-vector operands),
/// ending in `result`. Row-vector operands are read as `e{k}[col]` from extra bindings.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Epilogue {
    /// Statements (`let t0 = ...;`).
    pub stmts: String,
    /// The final expression (`x` when there is no work).
    pub result: String,
    /// Slots of the row-vector operands, bound after the kernel's own bindings.
    pub extra_slots: Vec<Slot>,
    /// Labels of the fused nodes, for the kernel label.
    pub fused: Vec<String>,
}

impl Epilogue {
    /// No work: store the value as computed.
    pub fn identity() -> Epilogue {
        Epilogue {
            result: "x".into(),
            ..Default::default()
        }
    }

    /// Declarations of the extra bindings from `first`, and the `ep` function.
    pub fn wgsl(&self, first: u32) -> String {
        let mut s = String::new();
        for k in 0..self.extra_slots.len() {
            s.push_str(&format!(
                "@group(0) @binding({}) var<storage, read> e{k}: array<f32>;\n",
                first + k as u32
            ));
        }
        let col_use = if self.extra_slots.is_empty() {
            "    _ = col;\n"
        } else {
            ""
        };
        s.push_str(&format!(
            "fn ep(x: f32, col: u32) -> f32 {{\n{col_use}{}    return {};\n}}\n",
            self.stmts, self.result
        ));
        s
    }

    /// A suffix for kernel labels naming what was fused.
    pub fn label(&self) -> String {
        if self.fused.is_empty() {
            String::new()
        } else {
            format!(" + {}", self.fused.join(" + "))
        }
    }
}
