//! WGSL generation: the shared prelude, per-binding typed loads and stores, and one kernel
//! body per primitive family.
//!
//! Every kernel reads its launch parameters from binding 0, `P: array<u32>`:
//! `P[0]` the number of threads, `P[1..17]` sixteen scalar slots (`s(i)`), `P[17..25]` the
//! start of up to eight *layout blocks*, then the blocks. A block is `[rank, offset, shape..,
//! strides..]` and `off(k, i)` is the element offset of row-major position `i` in block `k`.
//! Buffers are bound as `array<u32>`: 32-bit elements one per word, f16/bf16 two per word
//! (element `i` is the low half of word `i/2` when `i` is even). A writable 16-bit buffer is
//! `array<atomic<u32>>`, so two threads writing the two halves of one word cannot lose either.

use hal::DType;

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

pub const PRELUDE: &str = r#"
@group(0) @binding(0) var<storage, read> P: array<u32>;

fn s(i: u32) -> u32 { return P[1u + i]; }
fn sf(i: u32) -> f32 { return bitcast<f32>(P[1u + i]); }
fn si(i: u32) -> i32 { return bitcast<i32>(P[1u + i]); }

fn offset_in(base: u32, lin: u32) -> i32 {
    let r = P[base];
    var rem = lin;
    var o = bitcast<i32>(P[base + 1u]);
    var d = r;
    loop {
        if (d == 0u) { break; }
        d = d - 1u;
        let n = P[base + 2u + d];
        let i = rem % n;
        rem = rem / n;
        o = o + i32(i) * bitcast<i32>(P[base + 2u + r + d]);
    }
    return o;
}
fn off(k: u32, lin: u32) -> i32 { return offset_in(P[17u + k], lin); }

fn is_nan(v: f32) -> bool { return (bitcast<u32>(v) & 0x7fffffffu) > 0x7f800000u; }
fn nan() -> f32 { return bitcast<f32>(0x7fc00000u); }
fn f2i(v: f32) -> i32 {
    if (is_nan(v)) { return 0; }
    if (v >= 2147483647.0) { return 2147483647; }
    if (v <= -2147483648.0) { return -2147483647 - 1; }
    return i32(v);
}
fn f2u(v: f32) -> u32 {
    if (is_nan(v) || v <= 0.0) { return 0u; }
    if (v >= 4294967295.0) { return 4294967295u; }
    return u32(v);
}
fn f16_to_f32(h: u32) -> f32 { return unpack2x16float(h).x; }
// Round to nearest even, as the `half` crate does on the CPU.
fn f32_to_f16(v: f32) -> u32 {
    let x = bitcast<u32>(v);
    let sign = (x >> 16u) & 0x8000u;
    let e = i32((x >> 23u) & 0xffu);
    let m = x & 0x7fffffu;
    if (e == 255) {
        if (m != 0u) { return sign | 0x7e00u | (m >> 13u); }
        return sign | 0x7c00u;
    }
    let ne = e - 112;
    if (ne >= 31) { return sign | 0x7c00u; }
    if (ne <= 0) {
        if (ne < -10) { return sign; }
        let mm = m | 0x800000u;
        let shift = u32(14 - ne);
        let half = 1u << (shift - 1u);
        let rest = mm & ((1u << shift) - 1u);
        var r = mm >> shift;
        if (rest > half || (rest == half && (r & 1u) == 1u)) { r = r + 1u; }
        return sign | r;
    }
    var r = (u32(ne) << 10u) | (m >> 13u);
    let rest = m & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (r & 1u) == 1u)) { r = r + 1u; }
    return sign | r;
}
fn bf16_to_f32(h: u32) -> f32 { return bitcast<f32>(h << 16u); }
fn f32_to_bf16(v: f32) -> u32 {
    let b = bitcast<u32>(v);
    if (is_nan(v)) { return (b >> 16u) | 0x40u; }
    return (b + 0x7fffu + ((b >> 16u) & 1u)) >> 16u;
}
fn half_of(word: u32, i: i32) -> u32 { return (word >> (16u * (u32(i) & 1u))) & 0xffffu; }

fn thread_id(wg: vec3<u32>, nwg: vec3<u32>, lid: u32) -> u32 { return (wg.y * nwg.x + wg.x) * 256u + lid; }

// Philox 4x32-10 (hal::random): 32x32 -> 64-bit products from 16-bit halves.
fn mulhilo(a: u32, b: u32) -> vec2<u32> {
    let al = a & 0xffffu; let ah = a >> 16u; let bl = b & 0xffffu; let bh = b >> 16u;
    let ll = al * bl; let lh = al * bh; let hl = ah * bl; let hh = ah * bh;
    let mid = (ll >> 16u) + (lh & 0xffffu) + (hl & 0xffffu);
    return vec2<u32>(hh + (lh >> 16u) + (hl >> 16u) + (mid >> 16u), a * b);
}
fn philox(ctr: vec4<u32>, key: vec2<u32>) -> vec4<u32> {
    var c = ctr; var k = key;
    for (var round = 0u; round < 10u; round = round + 1u) {
        if (round > 0u) { k = k + vec2<u32>(0x9E3779B9u, 0xBB67AE85u); }
        let p0 = mulhilo(0xD2511F53u, c.x);
        let p1 = mulhilo(0xCD9E8D57u, c.z);
        c = vec4<u32>(p1.x ^ c.y ^ k.x, p1.y, p0.x ^ c.w ^ k.y, p0.y);
    }
    return c;
}
// C's fmod. WGSL's `%` is a - b * trunc(a / b) with an approximate division: when a / b is
// (nearly) an integer the truncated quotient can be one off, leaving a remainder of b, or one
// of the wrong sign. Two fix-ups bring it back into (-|b|, |b|) with the sign of a.
fn fmod(a: f32, b: f32) -> f32 {
    var r = a - b * trunc(a / b);
    let m = abs(b);
    if (abs(r) >= m) { r = r - select(m, -m, r < 0.0); }
    if (r != 0.0 && ((r < 0.0) != (a < 0.0))) { r = r + select(m, -m, a < 0.0); }
    return r;
}
fn erf_approx(x: f32) -> f32 {
    let t = 1.0 / (1.0 + 0.3275911 * abs(x));
    let poly = t * (0.2548296 + t * (-0.28449674 + t * (1.4214137 + t * (-1.4531521 + t * 1.0614054))));
    let r = 1.0 - poly * exp(-x * x);
    return select(r, -r, x < 0.0);
}
"#;

/// Declares binding `b` and its typed accessors `ld{b}` (as f32), `ldi{b}` (as i32, for
/// indices), `bits{b}` (raw element bits), and for writable bindings `st{b}` (from f32,
/// rounding / saturating) and `stbits{b}` (raw element bits).
pub fn binding(b: u32, dtype: DType, access: Access) -> String {
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
/// against `P[0]`).
pub fn entry(body: &str) -> String {
    format!(
        "@compute @workgroup_size({WORKGROUP})\nfn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {{\n    let t = thread_id(wg, nwg, lid);\n    if (t >= P[0]) {{ return; }}\n{body}\n}}\n"
    )
}

/// The prelude's strided `off`, and its replacement when every block is contiguous over the
/// thread index (elementwise kernels on contiguous operands): no index decomposition.
const OFF_STRIDED: &str = "fn off(k: u32, lin: u32) -> i32 { return offset_in(P[17u + k], lin); }";
const OFF_CONTIGUOUS: &str =
    "fn off(k: u32, lin: u32) -> i32 { return bitcast<i32>(P[P[17u + k] + 1u]) + i32(lin); }";

/// [`shader`] for elementwise kernels whose every layout block is contiguous over the
/// thread index.
/// Each invocation handles [`PER_THREAD`] elements, `WORKGROUP` apart, so the parameter reads
/// are amortised and every access stays coalesced.
pub fn shader_contiguous(bindings: &[(DType, Access)], body: &str) -> String {
    let mut s = String::from(PRELUDE).replace(OFF_STRIDED, OFF_CONTIGUOUS);
    for (i, &(d, a)) in bindings.iter().enumerate() {
        s += &binding(i as u32 + 1, d, a);
    }
    // Each block's offset is read once per invocation into a `let` (a scalar, so a register),
    // and the body's `off(k, t)` becomes `base_k + t`.
    let mut bases = String::new();
    let mut body = body.to_string();
    for k in 0..8 {
        let call = format!("off({k}u, t)");
        if body.contains(&call) {
            bases += &format!("    let base{k} = bitcast<i32>(P[P[{}u] + 1u]);\n", 17 + k);
            body = body.replace(&call, &format!("(base{k} + i32(t))"));
        }
    }
    s += &format!(
        "@compute @workgroup_size({WORKGROUP})\nfn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {{\n{}{bases}    let total = P[0];\n    let first = (wg.y * nwg.x + wg.x) * {} + lid;\n    for (var q = 0u; q < {PER_THREAD}u; q = q + 1u) {{\n    let t = first + q * {WORKGROUP}u;\n    if (t >= total) {{ return; }}\n{body}\n    }}\n}}\n",
        touch(bindings.len()),
        WORKGROUP * PER_THREAD
    );
    s
}

/// A kernel over `vec4` words: inputs `V1`, `V2` read-only, output `V3`, each thread one
/// word; `body` sees `t`.
pub fn shader_vec4(body: &str) -> String {
    let mut s = String::from(PRELUDE);
    s += "@group(0) @binding(1) var<storage, read> V1: array<vec4<u32>>;\n";
    s += "@group(0) @binding(2) var<storage, read> V2: array<vec4<u32>>;\n";
    s += "@group(0) @binding(3) var<storage, read_write> V3: array<vec4<u32>>;\n";
    s += &entry(&format!(
        "    _ = arrayLength(&V1); _ = arrayLength(&V2); _ = arrayLength(&V3);\n    {body}"
    ));
    s
}

/// Elements per invocation in contiguous elementwise kernels.
pub const PER_THREAD: u32 = 4;

/// A whole shader: prelude, bindings, entry.
pub fn shader(bindings: &[(DType, Access)], body: &str) -> String {
    let mut s = String::from(PRELUDE);
    for (i, &(d, a)) in bindings.iter().enumerate() {
        s += &binding(i as u32 + 1, d, a);
    }
    s += &entry(&(touch(bindings.len()) + body));
    s
}

/// Statements that use bindings `1..=n`: wgpu derives the bind-group layout from what the
/// shader uses, and a binding the body happens not to touch would then be refused.
pub fn touch(n: usize) -> String {
    (1..=n)
        .map(|b| format!("    _ = arrayLength(&B{b});\n"))
        .collect()
}

/// The WGSL expression of a unary op on `v` (scalar parameters in slots 0 and 1).
pub fn unary_expr(op: hal::UnaryOp) -> &'static str {
    use hal::UnaryOp::*;
    match op {
        Neg => "-v",
        Abs => "abs(v)",
        Exp => "exp(v)",
        Exp2 => "exp2(v)",
        Log => "log(v)",
        Log2 => "log2(v)",
        Sqrt => "sqrt(v)",
        Rsqrt => "1.0 / sqrt(v)",
        Recip => "1.0 / v",
        Sin => "sin(v)",
        Cos => "cos(v)",
        Tanh => "tanh(clamp(v, -15.0, 15.0))",
        Sigmoid => "1.0 / (1.0 + exp(-v))",
        Relu => "select(v, 0.0, v < 0.0)",
        LeakyRelu { .. } => "select(v, sf(0u) * v, v < 0.0)",
        Gelu => "0.5 * v * (1.0 + erf_approx(v * 0.70710678118654752))",
        Silu => "v / (1.0 + exp(-v))",
        Floor => "floor(v)",
        Ceil => "ceil(v)",
        Round => "round(v)",
        Sign => "select(select(v, -1.0, v < 0.0), 1.0, v > 0.0)",
        Square => "v * v",
        Affine { .. } => "fma(sf(0u), v, sf(1u))",
        Clamp { .. } => "select(min(max(v, sf(0u)), sf(1u)), v, is_nan(v))",
    }
}

/// The WGSL expression of a binary op on `a` and `b`.
pub fn binary_expr(op: hal::BinaryOp) -> &'static str {
    use hal::BinaryOp::*;
    match op {
        Add => "a + b",
        Sub => "a - b",
        Mul => "a * b",
        Div => "a / b",
        Rem => "rem_floored(a, b)",
        Pow => "pow(a, b)",
        Max => "select(max(a, b), nan(), is_nan(a) || is_nan(b))",
        Min => "select(min(a, b), nan(), is_nan(a) || is_nan(b))",
        Atan2 => "atan2(a, b)",
        Eq => "select(0.0, 1.0, a == b)",
        Ne => "select(0.0, 1.0, a != b)",
        Lt => "select(0.0, 1.0, a < b)",
        Le => "select(0.0, 1.0, a <= b)",
        Gt => "select(0.0, 1.0, a > b)",
        Ge => "select(0.0, 1.0, a >= b)",
    }
}

pub const REM_FLOORED: &str = "fn rem_floored(a: f32, b: f32) -> f32 { let r = fmod(a, b); return select(r, r + b, r != 0.0 && ((r < 0.0) != (b < 0.0))); }\n";

/// Tiled matrix product: a 256-thread workgroup computes a 64 x 64 tile of one batch's output,
/// stepping through k 16 at a time with both operand tiles staged in workgroup memory as
/// `vec4`s; each thread accumulates the 4 x 4 block at rows `4 ty ..`, columns `4 tx ..`, so
/// its fragments of A and B are one `vec4` read each per k (broadcast for A, consecutive for B).
/// A is staged k-fastest (neighbouring threads read neighbouring words of a row-major A), B
/// column-fastest. Operand loads go through the typed, strided `ld1`/`ld2`, so any dtype and
/// any strides work (each staged value is used 64 times). Generated unrolled, so the 16
/// accumulators stay in registers.
///
/// Scalars: 0 m, 1 n, 2 first k, 3 end k, 4 alpha, 5 beta, 7-8 a's row and column strides,
/// 10-11 b's, 13-14 out's. Blocks 0, 1, 2 give a's, b's and out's offset for each batch.
pub fn gemm_tiled(a: DType, b: DType, out: DType) -> String {
    let mut s = String::from(PRELUDE);
    s += &binding(1, a, Access::Read);
    s += &binding(2, b, Access::Read);
    s += &binding(3, out, Access::Write);
    let mut stage = String::new();
    for e in 0..4 {
        stage += &format!(
            "        {{ let idx = li + {e}u * 256u;
          let ar = idx / 16u; let ak = idx % 16u;
          var av = 0.0; if (row0 + ar < m && kk + ak < kend) {{ av = ld1(abase + i32(row0 + ar) * si(7u) + i32(kk + ak) * si(8u)); }}
          As[ak * 16u + ar / 4u][ar % 4u] = av;
          let bk = idx / 64u; let bc = idx % 64u;
          var bv = 0.0; if (col0 + bc < n && kk + bk < kend) {{ bv = ld2(bbase + i32(kk + bk) * si(10u) + i32(col0 + bc) * si(11u)); }}
          Bs[bk * 16u + bc / 4u][bc % 4u] = bv; }}\n"
        );
    }
    let mut decl = String::new();
    let mut fmas =
        String::from("            let a = As[k * 16u + ty]; let b = Bs[k * 16u + tx];\n");
    let mut store = String::new();
    for i in 0..4 {
        for j in 0..4 {
            decl += &format!("    var c{i}{j} = 0.0;\n");
            fmas += &format!("            c{i}{j} = fma(a[{i}], b[{j}], c{i}{j});\n");
            store += &format!(
                "    {{ let r = row0 + 4u * ty + {i}u; let c = col0 + 4u * tx + {j}u;
      if (r < m && c < n) {{ let o = obase + i32(r) * si(13u) + i32(c) * si(14u);
        var v = sf(4u) * c{i}{j}; if (sf(5u) != 0.0) {{ v = v + sf(5u) * ld3(o); }} st3(o, v); }} }}\n"
            );
        }
    }
    s += &format!(
        r#"
var<workgroup> As: array<vec4<f32>, 256>;
var<workgroup> Bs: array<vec4<f32>, 256>;

@compute @workgroup_size(16, 16)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>, @builtin(local_invocation_index) li: u32) {{
    _ = arrayLength(&B1); _ = arrayLength(&B2); _ = arrayLength(&B3);
    let m = s(0u); let n = s(1u); let kend = s(3u);
    let tx = lid.x; let ty = lid.y;
    let row0 = wg.y * 64u; let col0 = wg.x * 64u;
    let abase = off(0u, wg.z); let bbase = off(1u, wg.z); let obase = off(2u, wg.z);
{decl}
    for (var kk = s(2u); kk < kend; kk = kk + 16u) {{
{stage}
        workgroupBarrier();
        for (var k = 0u; k < 16u; k = k + 1u) {{
{fmas}
        }}
        workgroupBarrier();
    }}
{store}
}}
"#
    );
    s
}
