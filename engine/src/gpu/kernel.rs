//! What lowering a plan step produces: WGSL kernels with their bindings, parameter words
//! and dispatch size, plus the template step that fills `shaders/*.wgsl`.

use crate::dtype::DType;
pub use crate::storage::Storage;

/// A value with a concrete shape, as lowering sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Concrete {
    /// Concrete shape.
    pub shape: Vec<usize>,
    /// Element type.
    pub dtype: DType,
    /// How its elements are stored on the device.
    pub storage: Storage,
}

/// The WGSL element type of a storage.
pub trait WgslType {
    /// The WGSL array element type.
    fn wgsl(self) -> &'static str;
}

impl WgslType for Storage {
    fn wgsl(self) -> &'static str {
        match self {
            Storage::F32 => "f32",
            Storage::F16 => "f16",
            Storage::Packed | Storage::Bool => "u32",
            Storage::I32 => "i32",
        }
    }
}

/// Declares the bindings of a generated kernel and the functions that read and write them
/// whatever their storage: `ld_NAME(i) -> f32` for every float binding and, for the output,
/// `st_dst(i, v)` (not for packed outputs, which are written in pairs).
#[derive(Debug, Default)]
pub struct Bindings {
    decls: String,
    slots: Vec<Slot>,
    half: bool,
}

impl Bindings {
    /// Starts with binding 0 (the info words) declared.
    pub fn new() -> Bindings {
        Bindings {
            decls: "@group(0) @binding(0) var<storage, read> info: array<u32>;\n".into(),
            ..Default::default()
        }
    }

    /// Declares the next binding.
    pub fn add(&mut self, name: &str, slot: Slot, storage: Storage, write: bool) {
        let binding = self.slots.len() + 1;
        let access = if write { "read_write" } else { "read" };
        self.decls.push_str(&format!(
            "@group(0) @binding({binding}) var<storage, {access}> {name}: array<{}>;\n",
            storage.wgsl()
        ));
        self.half |= storage == Storage::F16;
        if write && storage == Storage::Packed && !self.decls.contains("fn sl_pack2") {
            self.decls.push_str(PACK_HALF);
        }
        let load = match storage {
            Storage::F32 => format!("return {name}[i];"),
            Storage::F16 => format!("return f32({name}[i]);"),
            Storage::Packed => format!("return unpack2x16float({name}[i >> 1u])[i & 1u];"),
            Storage::I32 => format!("return f32({name}[i]);"),
            Storage::Bool => format!("return f32({name}[i]);"),
        };
        self.decls
            .push_str(&format!("fn ld_{name}(i: u32) -> f32 {{\n    {load}\n}}\n"));
        if write && storage != Storage::Packed {
            let store = match storage {
                Storage::F16 => format!("{name}[i] = f16(v);"),
                Storage::I32 => format!("{name}[i] = i32(v);"),
                Storage::Bool => format!("{name}[i] = u32(v != 0.0);"),
                _ => format!("{name}[i] = v;"),
            };
            self.decls.push_str(&format!(
                "fn st_{name}(i: u32, v: f32) {{\n    {store}\n}}\n"
            ));
        }
        self.slots.push(slot);
    }

    /// Whether a binding uses WGSL `f16` (the module needs `enable f16;`).
    pub fn needs_f16(&self) -> bool {
        self.half
    }

    /// `enable f16;` when needed, then the declarations.
    pub fn wgsl(&self) -> String {
        let enable = if self.half { "enable f16;\n" } else { "" };
        format!("{enable}{}", self.decls)
    }

    /// The slots, in binding order from 1.
    pub fn slots(&self) -> Vec<Slot> {
        self.slots.clone()
    }
}

/// `sl_pack2(v)`: `pack2x16float` with IEEE overflow. WGSL leaves packing a value outside
/// f16's range indeterminate (lavapipe writes a finite value), so values are packed
/// clamped and then patched: |v| ≥ 65520 (what rounds past 65504) becomes ±∞ and NaN
/// stays NaN (tested on its bits: compilers may fold `x != x`), as the CPU reference's
/// rounding gives. Every packed store goes through it.
pub const PACK_HALF: &str = "fn sl_half_bits(x: f32, bits: u32) -> u32 {
    let b = bitcast<u32>(x);
    if ((b & 0x7fffffffu) > 0x7f800000u) {
        return 0x7e00u | ((b >> 16u) & 0x8000u);
    }
    if (abs(x) >= 65520.0) {
        return select(0x7c00u, 0xfc00u, x < 0.0);
    }
    return bits;
}
fn sl_pack2(v: vec2<f32>) -> u32 {
    let p = pack2x16float(clamp(v, vec2<f32>(-65504.0), vec2<f32>(65504.0)));
    return sl_half_bits(v.x, p & 0xffffu) | (sl_half_bits(v.y, p >> 16u) << 16u);
}
";

/// The entry point of a kernel computing one output element per index with
/// `fn value(i: u32) -> f32` (which the caller defines): one invocation per element, or per
/// pair of elements for packed 16-bit outputs (which must be written a whole `u32` at a
/// time). Returns the WGSL and the number of invocations.
pub fn per_element_main(out: Storage, n: usize) -> (String, usize) {
    if out == Storage::Packed {
        let main = format!(
            "@compute @workgroup_size({WG})
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {{
    let t = gid.x + gid.y * nwg.x * {WG}u;
    let n = {n}u;
    _ = info[0];
    if (2u * t >= n) {{
        return;
    }}
    let a = value(2u * t);
    var b = 0.0;
    if (2u * t + 1u < n) {{
        b = value(2u * t + 1u);
    }}
    dst[t] = sl_pack2(vec2<f32>(a, b));
}}
"
        );
        (main, n.div_ceil(2))
    } else {
        let main = format!(
            "@compute @workgroup_size({WG})
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {{
    let i = gid.x + gid.y * nwg.x * {WG}u;
    _ = info[0];
    if (i >= {n}u) {{
        return;
    }}
    st_dst(i, value(i));
}}
"
        );
        (main, n)
    }
}

impl Concrete {
    /// Number of elements (`usize::MAX` when the count overflows, which a checked plan
    /// never has; [`word`] then refuses it).
    pub fn numel(&self) -> usize {
        crate::shape::numel(&self.shape).unwrap_or(usize::MAX)
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
    /// Scratch buffer `i` of the operator (f32, private to its passes).
    Scratch(usize),
    /// Texture `i` of the operator (rgba32float, private to its passes): written as a
    /// `texture_storage_2d` by one pass, read as a `texture_2d<f32>` by a later one.
    Texture(usize),
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
    /// Passes that also use f32 scratch buffers of these element counts.
    KernelsWithScratch(Vec<Kernel>, Vec<usize>),
    /// Passes that also use rgba32float textures of these sizes (width, height in texels).
    KernelsWithTextures(Vec<Kernel>, Vec<[u32; 2]>),
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
    /// Storage of each row-vector operand.
    pub extra_storages: Vec<Storage>,
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

    /// Declarations of the extra bindings from `first` (read with `ld_e{k}(col)`), and
    /// the `ep` function.
    pub fn wgsl(&self, first: u32) -> String {
        let mut s = String::new();
        for (k, storage) in self.extra_storages.iter().enumerate() {
            let name = format!("e{k}");
            let load = match storage {
                Storage::F16 => format!("f32({name}[i])"),
                Storage::Packed => format!("unpack2x16float({name}[i >> 1u])[i & 1u]"),
                _ => format!("{name}[i]"),
            };
            s.push_str(&format!(
                "@group(0) @binding({}) var<storage, read> {name}: array<{}>;\nfn ld_{name}(i: u32) -> f32 {{\n    return {load};\n}}\n",
                first + k as u32,
                storage.wgsl()
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

    /// Whether an extra operand is stored as WGSL `f16`.
    pub fn needs_f16(&self) -> bool {
        self.extra_storages.contains(&Storage::F16)
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

/// Everything lowering an operator needs besides the operator itself.
#[derive(Debug, Clone, Copy)]
pub struct LowerCtx<'a> {
    /// Input values.
    pub inputs: &'a [Concrete],
    /// Output values.
    pub outputs: &'a [Concrete],
    /// Weights, in `params()` order.
    pub params: &'a [Concrete],
    /// Fused work for operators that take an epilogue.
    pub epilogue: &'a Epilogue,
    /// Pointwise work computing the input of an operator that takes a prologue (the
    /// inputs are then the prologue's operands).
    pub prologue: Option<&'a Prologue>,
    /// Accumulate in f16 (precision `f16`) instead of f32.
    pub f16_compute: bool,
    /// Tuned kernel choices.
    pub tuning: &'a super::tuning::Tuning,
}

/// Pointwise work a reduction computes from its step's inputs (all of the reduced
/// tensor's shape) as it reads each element, instead of reading a stored input:
/// statements over `x0..` ending in `result`.
#[derive(Debug, Clone, PartialEq)]
pub struct Prologue {
    /// Statements (`let t0 = ...;`).
    pub stmts: String,
    /// The final expression.
    pub result: String,
    /// The same for four neighbouring elements, for kernels that read vec4s.
    pub lanes4: Lanes4,
    /// Labels of the fused nodes, for the kernel label.
    pub fused: Vec<String>,
}

/// A pointwise expression over four neighbouring elements: lane `c` (x, y, z, w) of
/// operand k is `v{k}.{c}`, and the four lanes' terms are interleaved term by term, so
/// that SIMD back ends (lavapipe runs each lane's chain as dependent vector instructions)
/// overlap the four independent chains instead of running them one after the other.
/// Every element is computed by the same operations as the one-element form.
#[derive(Debug, Clone, PartialEq)]
pub struct Lanes4 {
    /// Statements (`let t0_x = ...;`).
    pub stmts: String,
    /// The x, y, z and w results.
    pub results: [String; 4],
}

impl Lanes4 {
    /// `fn {name}(v0: vec4<f32>, ..) -> vec4<f32>` over `inputs` operands.
    pub fn wgsl(&self, name: &str, inputs: usize) -> String {
        let params: Vec<String> = (0..inputs).map(|k| format!("v{k}: vec4<f32>")).collect();
        format!(
            "fn {name}({}) -> vec4<f32> {{\n{}    return vec4<f32>({});\n}}\n",
            params.join(", "),
            self.stmts,
            self.results.join(", ")
        )
    }
}

impl Prologue {
    /// `sl_prologue(x0, ..)`: the value of one element from the same element of each of
    /// the `inputs` operands.
    pub fn wgsl(&self, inputs: usize) -> String {
        let params: Vec<String> = (0..inputs).map(|k| format!("x{k}: f32")).collect();
        format!(
            "fn sl_prologue({}) -> f32 {{\n{}    return {};\n}}\n",
            params.join(", "),
            self.stmts,
            self.result
        )
    }

    /// A suffix for kernel labels naming what was fused.
    pub fn label(&self) -> String {
        format!(" of {}", self.fused.join(" + "))
    }
}

/// Puts `enable f16;` in front of a shader that uses `f16` anywhere, once.
pub fn with_f16_enable(source: String) -> String {
    let uses = ["f16>", "f16(", ": f16", "0.0h"]
        .iter()
        .any(|t| source.contains(t));
    if uses && !source.starts_with("enable f16;") {
        format!("enable f16;\n{}", source.replace("enable f16;\n", ""))
    } else {
        source
    }
}
