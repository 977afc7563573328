//! WGSL assembly: the kernel files of `shaders/` (embedded), their specialisation slots, the
//! per-dtype binding accessors, and the entry points of one-thread-per-element kernels.
//!
//! A kernel file is valid WGSL on its own once the prelude (and any file it names with
//! `// @include FILE`) is appended, which is how `cargo xtask wgsl` validates it. Regions
//! between `// @slot NAME` and `// @end` hold a default that the backend replaces per
//! instantiation: `bindings` (the typed accessors for the call's dtypes), an op's expression, a
//! dtype conversion. A file either has its own `@compute` entry point or defines
//! `fn kernel(t: u32)`, one thread's work, and gets a generated entry: strided (one element
//! per thread) or contiguous (several elements per thread, offsets hoisted).
//!
//! Every kernel reads its launch parameters through `pw(i)`: word 0 the number of threads,
//! words 1..17 sixteen scalar slots (`s(i)`), words 17..25 the start of up to eight *layout
//! blocks*, then the blocks. They live in binding 0 (`P: array<u32>`) or, where the device has
//! immediates (Vulkan push constants), in an immediate block ([`immediate_params`]). A block is `[rank, offset, shape..,
//! strides..]` and `off(k, i)` is the element offset of row-major position `i` in block `k`.
//! Buffers are bound as `array<u32>`: 32-bit elements one per word, f16/bf16 two per word
//! (element `i` is the low half of word `i/2` when `i` is even). A writable 16-bit buffer is
//! `array<atomic<u32>>`, so two threads writing the two halves of one word cannot lose either.

mod ops;
mod variants;

pub use variants::{Variant, default_modules};

pub use ops::{
    binary_expr, binary_vec4_expr, dot_epilogue_slot, gate_expr, gate_load_slot, ones_column_slot,
    row_sums_slot, unary_expr,
};

use hal::DType;

pub use crate::pipeline::{LAUNCH_PARAMS, ParamsLayout};

pub const WORKGROUP: u32 = 256;

/// How a kernel uses a buffer binding.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Access {
    Read,
    /// Written (and perhaps read back) by the kernel.
    Write,
    /// Target of IR atomic adds: every 32-bit access goes through atomics.
    Atomic,
}

/// The prelude every kernel ends with (`shaders/common/prelude.wgsl`).
pub const PRELUDE: &str = include_str!("../../../../shaders/common/prelude.wgsl");

/// The `params` slot for launch parameters passed as `words` immediates (a multiple of 4)
/// instead of binding 0: no buffer is written per launch.
pub fn immediate_params(words: u32) -> (&'static str, String) {
    (
        "params",
        format!(
            "var<immediate> P: array<vec4<u32>, {}>;\nfn pw(i: u32) -> u32 {{ return P[i >> 2u][i & 3u]; }}\n",
            words / 4
        ),
    )
}

/// The enable directives that `declarations` (from [`binding`]) need, to go at the very top
/// of the module.
pub fn enable_directives(declarations: &str) -> &'static str {
    if declarations.contains("array<f16>") {
        "enable f16;\n"
    } else {
        ""
    }
}

/// The prelude with its slots filled (for generated modules such as IR programs).
pub fn prelude(slots: &[(&str, String)]) -> String {
    fill_slots(PRELUDE, slots)
}

/// The optional device features a module is composed for (see `WgpuOptions`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Features {
    /// Launch parameters as this many immediate words (0: binding 0).
    pub immediate_words: u32,
    /// f16 buffers as `array<f16>` (`enable f16;`).
    pub native_f16: bool,
    /// Subgroup operations allowed: the backend picks `*_subgroups.wgsl` kernels.
    pub subgroups: bool,
    /// Cooperative matrices (`enable wgpu_cooperative_matrix;`) allowed: `*_coop.wgsl`.
    pub cooperative_matrix: bool,
    /// Whether the device's `fma()` is fused, once probed: `fma_exact.wgsl`'s `fma_exact` is
    /// then `fma()` alone (`Some(true)`) or the emulation alone (`Some(false)`); `None`
    /// decides at run time from scalar 11.
    pub fused_fma: Option<bool>,
    /// `f64` in shaders (`shader-f64`, with `shader-int64` for math_wide.wgsl's barrier):
    /// `f64` buffers and values in IR programs.
    pub f64: bool,
}

/// The `short_shape` slot of `nearest_short.wgsl` for rows of up to 32 values: tiles of 128
/// centroids (the file's default: 256 of up to 16 values).
pub fn nearest_short_wide_slot() -> (&'static str, String) {
    (
        "short_shape",
        "const SHORT_TILE: u32 = 128u;\nconst SHORT_D: u32 = 32u;\n".into(),
    )
}

/// The `fma_choice` slot of `fma_exact.wgsl` for a probed device (`None`: the file's own
/// run-time test).
fn fma_choice(fused: Option<bool>) -> Option<(&'static str, String)> {
    let body = match fused? {
        true => "fma(a, b, c)",
        false => "fma_emulated(a, b, c)",
    };
    Some((
        "fma_choice",
        format!("fn fma_exact(a: f32, b: f32, c: f32) -> f32 {{ return {body}; }}\n"),
    ))
}

/// Whether kernel file `name` includes `fma_exact.wgsl` (its modules depend on
/// [`Features::fused_fma`]).
pub fn uses_fma_exact(name: &str) -> bool {
    includes(file(name).text).any(|inc| inc == "fma_exact.wgsl")
}

/// Declares binding `b` and its typed accessors `ld{b}` (as f32), `ldi{b}` (as i32, for
/// indices), `bits{b}` (raw element bits), and for writable bindings `st{b}` (from f32,
/// rounding / saturating) and `stbits{b}` (raw element bits). With `native_f16`, an f16
/// binding that is not an atomic target is `array<f16>`: one 16-bit load or store per element
/// instead of a word and, for stores, two atomic read-modify-writes. Rounding stays the
/// prelude's exact round-to-nearest-even; the hardware only converts values that are exactly
/// representable.
pub fn binding(b: u32, dtype: DType, access: Access, native_f16: bool) -> String {
    if dtype == DType::F64 {
        // Plain `array<f64>` (no atomics: WGSL has no 64-bit ones, and programs that would
        // need them are refused before this).
        let mode = if access == Access::Read {
            "read"
        } else {
            "read_write"
        };
        let mut s = format!(
            "@group(0) @binding({b}) var<storage, {mode}> B{b}: array<f64>;\n\
             fn ld{b}(i: i32) -> f64 {{ return B{b}[i]; }}\n"
        );
        if access != Access::Read {
            s += &format!("fn st{b}(i: i32, v: f64) {{ B{b}[i] = v; }}\n");
        }
        return s;
    }
    if native_f16 && dtype == DType::F16 && access != Access::Atomic {
        let mode = if access == Access::Read {
            "read"
        } else {
            "read_write"
        };
        // naga has no bitcast between u32 and vec2<f16>, so bits pass through exact values:
        // f32(h) is exact for every f16, and an f32 that is exactly an f16 converts back
        // unchanged (NaN payloads aside).
        let mut s = format!(
            "@group(0) @binding({b}) var<storage, {mode}> B{b}: array<f16>;\n\
             fn ld{b}(i: i32) -> f32 {{ return f32(B{b}[i]); }}\n\
             fn bits{b}(i: i32) -> u32 {{ return f32_to_f16(ld{b}(i)); }}\n\
             fn ldi{b}(i: i32) -> i32 {{ return f2i(ld{b}(i)); }}\n"
        );
        if access != Access::Read {
            s += &format!(
                "fn stbits{b}(i: i32, v: u32) {{ B{b}[i] = f16(f16_to_f32(v)); }}\n\
                 fn st{b}(i: i32, v: f32) {{ stbits{b}(i, f32_to_f16(v)); }}\n"
            );
        }
        return s;
    }
    let sixteen = dtype.size_in_bytes() == 2;
    let atomic = access == Access::Atomic || (access == Access::Write && sixteen);
    let mut s = String::new();
    let (mode, ty) = match access {
        Access::Read => ("read", "array<u32>"),
        _ if atomic => ("read_write", "array<atomic<u32>>"),
        _ => ("read_write", "array<u32>"),
    };
    s += &format!("@group(0) @binding({b}) var<storage, {mode}> B{b}: {ty};\n");
    let word = |idx: &str| {
        if atomic {
            format!("atomicLoad(&B{b}[{idx}])")
        } else {
            format!("B{b}[{idx}]")
        }
    };
    // raw element bits
    if sixteen {
        s += &format!(
            "fn bits{b}(i: i32) -> u32 {{ return half_of({}, i); }}\n",
            word("u32(i) >> 1u")
        );
    } else {
        s += &format!("fn bits{b}(i: i32) -> u32 {{ return {}; }}\n", word("i"));
    }
    let to_f32 = match dtype {
        DType::F32 => "bitcast<f32>(w)",
        DType::F16 => "f16_to_f32(w)",
        DType::BF16 => "bf16_to_f32(w)",
        DType::I32 => "f32(bitcast<i32>(w))",
        DType::U32 => "f32(w)",
        DType::F64 => unreachable!("f64 bindings are made above"),
    };
    s += &format!("fn ld{b}(i: i32) -> f32 {{ let w = bits{b}(i); return {to_f32}; }}\n");
    let to_i32 = match dtype {
        DType::I32 => "bitcast<i32>(w)".to_string(),
        DType::U32 => "i32(min(w, 0x7fffffffu))".to_string(),
        _ => format!("f2i(ld{b}(i))"),
    };
    s += &format!("fn ldi{b}(i: i32) -> i32 {{ let w = bits{b}(i); return {to_i32}; }}\n");
    if access == Access::Read {
        return s;
    }
    if sixteen {
        s += &format!(
            "fn stbits{b}(i: i32, v: u32) {{ let w = u32(i) >> 1u; let sh = 16u * (u32(i) & 1u); \
             atomicAnd(&B{b}[w], ~(0xffffu << sh)); atomicOr(&B{b}[w], (v & 0xffffu) << sh); }}\n"
        );
    } else if atomic {
        s += &format!("fn stbits{b}(i: i32, v: u32) {{ atomicStore(&B{b}[i], v); }}\n");
    } else {
        s += &format!("fn stbits{b}(i: i32, v: u32) {{ B{b}[i] = v; }}\n");
    }
    let from_f32 = match dtype {
        DType::F32 => "bitcast<u32>(v)",
        DType::F16 => "f32_to_f16(v)",
        DType::BF16 => "f32_to_bf16(v)",
        DType::I32 => "bitcast<u32>(f2i(v))",
        DType::U32 => "f2u(v)",
        DType::F64 => unreachable!("f64 bindings are made above"),
    };
    s += &format!("fn st{b}(i: i32, v: f32) {{ stbits{b}(i, {from_f32}); }}\n");
    s
}

/// The bindings of the common kernel shape: read-only inputs, then one written output.
pub fn io(reads: &[DType], write: DType) -> Vec<(DType, Access)> {
    reads
        .iter()
        .map(|&d| (d, Access::Read))
        .chain([(write, Access::Write)])
        .collect()
}

/// A compute entry point around `body`, which sees `t` (the thread index, already checked
/// against word 0 of the parameters).
pub fn entry(body: &str) -> String {
    format!(
        "@compute @workgroup_size({WORKGROUP})\nfn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {{\n    let t = thread_id(wg, nwg, lid);\n    if (t >= pw(0u)) {{ return; }}\n{body}\n}}\n"
    )
}

/// Statements that use bindings `1..=n`: wgpu derives the bind-group layout from what the
/// shader uses, and a binding the body happens not to touch would then be refused.
pub fn touch(n: usize) -> String {
    (1..=n)
        .map(|b| format!("    _ = arrayLength(&B{b});\n"))
        .collect()
}

/// One file of `shaders/`, as embedded in the binary.
#[derive(Clone, Copy, Debug)]
pub struct ShaderFile {
    /// The file name, which kernels and `// @include` lines refer to it by.
    pub name: &'static str,
    /// Its folder in `shaders/`: the primitive family (as `hal` names it), or `common`.
    pub family: &'static str,
    pub text: &'static str,
}

impl ShaderFile {
    /// Its path under `shaders/`.
    pub fn path(&self) -> String {
        format!("{}/{}", self.family, self.name)
    }
}

impl ShaderFile {
    /// Has its own `@compute` entry point (GEMM, nearest centroid).
    pub fn has_own_entry(&self) -> bool {
        self.text.contains("@compute")
    }
    /// A kernel (own entry or `fn kernel(t)`), not a library file like the prelude or
    /// `tile.wgsl`.
    pub fn is_kernel(&self) -> bool {
        self.has_own_entry() || self.text.contains("fn kernel(")
    }
}

macro_rules! shader_files {
    ($($family:literal: [$($name:literal),* $(,)?]),* $(,)?) => {
        /// Every file of `shaders/`, by family folder.
        pub const FILES: &[ShaderFile] = &[$($(ShaderFile {
            name: $name,
            family: $family,
            text: include_str!(concat!("../../../../shaders/", $family, "/", $name)),
        }),*),*];
    };
}

shader_files!(
    "common": [
        "prelude.wgsl",
        "keep.wgsl",
        "fma_exact.wgsl",
        "workgroup_scan.wgsl",
        "math_wide.wgsl",
    ],
    "attention": [
        "attention_params.wgsl",
        "attention_common.wgsl",
        "attention_kv_tile.wgsl",
        "attention_fwd.wgsl",
        "attention_delta.wgsl",
        "attention_bwd_kv.wgsl",
        "attention_bwd_q.wgsl",
    ],
    "elementwise": [
        "fill.wgsl",
        "copy.wgsl",
        "unary.wgsl",
        "binary.wgsl",
        "binary_vec4.wgsl",
        "binary_rows_vec4.wgsl",
        "ternary.wgsl",
    ],
    "reduce": [
        "reduce.wgsl",
        "reduce_lanes.wgsl",
        "reduce_wide.wgsl",
        "arg_line.wgsl",
        "arg_reduce.wgsl",
    ],
    "matmul": [
        "tile.wgsl",
        "gemm_params.wgsl",
        "gemm.wgsl",
        "coop_tiles.wgsl",
        "gemm_coop.wgsl",
        "gemm_pack.wgsl",
        "gemm_epilogue.wgsl",
        "gemm_sum.wgsl",
        "gemm_dot_body.wgsl",
        "gemm_dot.wgsl",
        "gemm_dot_subgroups.wgsl",
        "spmv.wgsl",
        "check_csr.wgsl",
    ],
    "cluster": [
        "nearest_centroid.wgsl",
        "nearest_coop.wgsl",
        "nearest_recheck_subgroups.wgsl",
        "nearest_ordered.wgsl",
        "nearest_short.wgsl",
        "row_norms.wgsl",
        "kmeans_pp_keys.wgsl",
        "kmeans_pp_pick.wgsl",
    ],
    "segment": [
        "segment_sum.wgsl",
        "segment_term.wgsl",
        "segment_sum_ordered.wgsl",
        "segment_scan.wgsl",
        "segment_count.wgsl",
        "segment_offsets.wgsl",
        "segment_starts.wgsl",
        "segment_place.wgsl",
        "segment_gather.wgsl",
    ],
    "index": [
        "check_index.wgsl",
        "gather.wgsl",
        "scatter_add.wgsl",
    ],
    "conv": [
        "conv_params.wgsl",
        "im2col.wgsl",
        "col2im.wgsl",
    ],
    "norm": [
        "norm_params.wgsl",
        "layer_norm.wgsl",
        "layer_norm_dx.wgsl",
        "layer_norm_partial.wgsl",
        "layer_norm_params.wgsl",
    ],
    "optim": [
        "sgd.wgsl",
        "adam.wgsl",
    ],
    "random": [
        "random.wgsl",
    ],
    "topk": [
        "topk_select.wgsl",
        "top_k.wgsl",
        "ivf_scan.wgsl",
        "candidate_scores.wgsl",
    ],
);

/// The embedded file `name`. Names are compile-time constants of this crate, checked by the
/// unit tests, so a missing one is a bug here, not bad input.
pub fn file(name: &str) -> &'static ShaderFile {
    FILES
        .iter()
        .find(|f| f.name == name)
        .unwrap_or_else(|| panic!("no shader file {name}"))
}

/// One part of a composed module: which file its lines come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Segment {
    /// File name, or `<generated>` for the entry point.
    pub file: &'static str,
    /// First line of the segment in the module (1-based).
    pub first_line: usize,
    pub lines: usize,
}

/// A composed shader module and the files its lines come from.
#[derive(Clone, Debug)]
pub struct Module {
    pub source: String,
    pub segments: Vec<Segment>,
}

impl Module {
    /// A module with no file behind it (a lowered IR program): lines are reported as they are.
    pub fn generated(file: &'static str, source: String) -> Self {
        let lines = source.lines().count();
        Module {
            source,
            segments: vec![Segment {
                file,
                first_line: 1,
                lines,
            }],
        }
    }

    /// The file and line (1-based) of the module's line `line`, for error messages.
    pub fn locate(&self, line: usize) -> (&'static str, usize) {
        for s in &self.segments {
            if line >= s.first_line && line < s.first_line + s.lines {
                return (s.file, line - s.first_line + 1);
            }
        }
        ("<generated>", line)
    }
}

/// Replaces the slot regions of `text` named in `slots`; a slot not named keeps its default
/// text, line for line (so default modules keep the files' line numbers).
fn fill_slots(text: &str, slots: &[(&str, String)]) -> String {
    let mut out = String::with_capacity(text.len());
    let mut skipping = false;
    for line in text.lines() {
        let t = line.trim();
        if let Some(name) = t.strip_prefix("// @slot ") {
            if let Some((_, with)) = slots.iter().find(|(n, _)| *n == name.trim()) {
                out += with;
                if !with.ends_with('\n') {
                    out.push('\n');
                }
                skipping = true;
                continue;
            }
        } else if t == "// @end" && skipping {
            skipping = false;
            continue;
        }
        if !skipping {
            out += line;
            out.push('\n');
        }
    }
    out
}

/// The files a kernel file includes (`// @include NAME` lines).
fn includes(text: &str) -> impl Iterator<Item = &str> {
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("// @include "))
        .map(str::trim)
}

/// How a `fn kernel(t: u32)` file is driven.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Entry {
    /// One thread per element, `t` checked against word 0 of the parameters.
    Strided,
    /// [`PER_THREAD`] elements per thread, `WORKGROUP` apart (coalesced); for kernels whose
    /// every layout block is contiguous over the thread index, so `off(k, t)` is a base plus
    /// `t`, with the base read once per thread.
    Contiguous,
    /// [`Entry::Contiguous`] for a 16-bit output starting on a word and of even length: each
    /// invocation step computes two adjacent elements and stores them as one whole word, with
    /// no atomics (the output binding is `array<u32>`). The thread count is in words.
    ContiguousPairs,
}

/// Elements per invocation under [`Entry::Contiguous`].
pub const PER_THREAD: u32 = 4;

/// Kernel file `name` with `bindings` generated for the call's dtypes (or the file's defaults
/// when `None`), `slots` filled, its includes and the prelude appended, and, for a
/// `fn kernel` file, the entry point of `entry`.
pub fn compose(
    name: &str,
    bindings: Option<&[(DType, Access)]>,
    slots: &[(&str, String)],
    entry: Entry,
    features: Features,
) -> Module {
    let mut slots = slots.to_vec();
    let mut enables = String::new();
    let mut paired_output = None;
    if let Some(b) = bindings {
        let decls: String = b
            .iter()
            .enumerate()
            .map(|(i, &(d, a))| {
                let b = i as u32 + 1;
                if entry == Entry::ContiguousPairs && a == Access::Write && d.size_in_bytes() == 2 {
                    paired_output = Some(b);
                    pair_binding(b, d)
                } else {
                    binding(b, d, a, features.native_f16)
                }
            })
            .collect();
        enables += enable_directives(&decls);
        slots.push(("bindings", decls));
    }
    if features.immediate_words > 0 {
        slots.push(immediate_params(features.immediate_words));
    }
    slots.extend(fma_choice(features.fused_fma));
    let main = file(name);
    let mut parts: Vec<(&'static str, String)> = vec![(main.name, fill_slots(main.text, &slots))];
    for inc in includes(main.text) {
        let f = file(inc);
        parts.push((f.name, fill_slots(f.text, &slots)));
    }
    let own_entry = main.has_own_entry();
    let contiguous = !own_entry && entry != Entry::Strided;
    if contiguous {
        // The kernel's `off(k, t)` becomes a register plus `t`: no index decomposition.
        let mut hoisted = String::new();
        let mut init = String::new();
        for k in 0..8 {
            let call = format!("off({k}u, t)");
            if parts[0].1.contains(&call) {
                parts[0].1 = parts[0]
                    .1
                    .replace(&call, &format!("(contiguous_base{k} + i32(t))"));
                hoisted += &format!("var<private> contiguous_base{k}: i32;\n");
                init += &format!(
                    "    contiguous_base{k} = bitcast<i32>(pw(pw({}u) + 1u));\n",
                    17 + k
                );
            }
        }
        let main = match paired_output {
            Some(b) => entry_pairs(&parts[0].1, &init, b),
            None => entry_contiguous(&parts[0].1, &init),
        };
        parts.push(("<generated>", hoisted + &main));
    }
    parts.push(("prelude.wgsl", fill_slots(PRELUDE, &slots)));
    if !own_entry && !contiguous {
        let body = touch(max_binding(&parts[0].1)) + "    kernel(t);";
        parts.push(("<generated>", self::entry(&body)));
    }
    let mut m = Module {
        source: String::new(),
        segments: Vec::new(),
    };
    if !enables.is_empty() {
        // Enable directives must come first.
        parts.insert(0, ("<generated>", enables));
    }
    for (file, text) in parts {
        let first_line = m.source.lines().count() + 1;
        m.segments.push(Segment {
            file,
            first_line,
            lines: text.lines().count(),
        });
        m.source += &text;
        if !m.source.ends_with('\n') {
            m.source.push('\n');
        }
    }
    m
}

/// The highest data binding a kernel declares (`B1` ..).
fn max_binding(text: &str) -> usize {
    (1..16)
        .rev()
        .find(|b| text.contains(&format!("@binding({b})")))
        .unwrap_or(0)
}

fn entry_contiguous(kernel: &str, init: &str) -> String {
    format!(
        "@compute @workgroup_size({WORKGROUP})\nfn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {{\n{}{init}    let total = pw(0u);\n    let first = (wg.y * nwg.x + wg.x) * {} + lid;\n    for (var q = 0u; q < {PER_THREAD}u; q = q + 1u) {{\n        let t = first + q * {WORKGROUP}u;\n        if (t >= total) {{ return; }}\n        kernel(t);\n    }}\n}}\n",
        touch(max_binding(kernel)),
        WORKGROUP * PER_THREAD
    )
}

impl ShaderFile {
    /// Written for adapters with subgroup operations only (`*_subgroups.wgsl`).
    pub fn needs_subgroups(&self) -> bool {
        self.name.ends_with("_subgroups.wgsl")
    }
    /// Written for adapters with `shader-f64` only (`*_wide.wgsl`: f64 values).
    pub fn needs_f64(&self) -> bool {
        self.name.ends_with("_wide.wgsl")
    }
    /// Written for adapters with cooperative matrices only (`*_coop.wgsl`).
    pub fn needs_cooperative_matrix(&self) -> bool {
        self.name.ends_with("_coop.wgsl")
    }
}

/// The kernel files the backend runs under [`Entry::ContiguousPairs`] (elementwise kernels
/// whose only access to the output is one store per element).
pub const PAIRS_ENTRY_FILES: &[&str] = &[
    "fill.wgsl",
    "copy.wgsl",
    "unary.wgsl",
    "binary.wgsl",
    "ternary.wgsl",
];

/// The output binding of [`Entry::ContiguousPairs`]: stores stash the element's bits in a
/// private word, which the entry writes once both halves are in.
fn pair_binding(b: u32, dtype: DType) -> String {
    let round = if dtype == DType::BF16 {
        "f32_to_bf16"
    } else {
        "f32_to_f16"
    };
    format!(
        "@group(0) @binding({b}) var<storage, read_write> B{b}: array<u32>;\n\
         var<private> pair_word: u32;\n\
         var<private> pair_bits: u32;\n\
         fn stbits{b}(i: i32, v: u32) {{ pair_word = u32(i) >> 1u; pair_bits = pair_bits | ((v & 0xffffu) << (16u * (u32(i) & 1u))); }}\n\
         fn st{b}(i: i32, v: f32) {{ stbits{b}(i, {round}(v)); }}\n"
    )
}

fn entry_pairs(kernel: &str, init: &str, b: u32) -> String {
    format!(
        "@compute @workgroup_size({WORKGROUP})\nfn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {{\n{}{init}    let words = pw(0u);\n    let first = (wg.y * nwg.x + wg.x) * {} + lid;\n    for (var q = 0u; q < {PER_THREAD}u; q = q + 1u) {{\n        let w = first + q * {WORKGROUP}u;\n        if (w >= words) {{ return; }}\n        pair_bits = 0u;\n        kernel(2u * w);\n        kernel(2u * w + 1u);\n        B{b}[pair_word] = pair_bits;\n    }}\n}}\n",
        touch(max_binding(kernel)),
        WORKGROUP * PER_THREAD
    )
}

#[cfg(test)]
mod tests;
