// Shared by every kernel (appended by the backend to each kernel file).
//
// `pw(i)` reads word `i` of the launch parameters: word 0 the number of threads, words 1..17
// sixteen scalar slots (`s(i)`, `sf(i)`, `si(i)`), words 17..25 the start of up to eight
// layout blocks, then the blocks, each `[rank, offset, shape.., strides..]`.
//
// Data buffers are bound as `array<u32>`: 32-bit elements one per word, f16/bf16 two per word
// (element `i` is the low half of word `i / 2` when `i` is even). The backend generates each
// binding's typed accessors (`ld1`, `st2`, ...) per dtype; see `wgsl.rs`.

// Launch parameters in a storage buffer; where the device has immediates (push constants),
// the backend replaces this slot with an immediate block of the same words, which costs no
// buffer write per launch.
// @slot params
@group(0) @binding(0) var<storage, read> P: array<u32>;
fn pw(i: u32) -> u32 { return P[i]; }
// @end

fn s(i: u32) -> u32 { return pw(1u + i); }
fn sf(i: u32) -> f32 { return bitcast<f32>(pw(1u + i)); }
fn si(i: u32) -> i32 { return bitcast<i32>(pw(1u + i)); }

fn offset_in(base: u32, lin: u32) -> i32 {
    let r = pw(base);
    var rem = lin;
    var o = bitcast<i32>(pw(base + 1u));
    var d = r;
    loop {
        if (d == 0u) { break; }
        d = d - 1u;
        let n = pw(base + 2u + d);
        let i = rem % n;
        rem = rem / n;
        o = o + i32(i) * bitcast<i32>(pw(base + 2u + r + d));
    }
    return o;
}
// Layout block `k`'s rank, offset, and stride along dimension `d`: for kernels that know their
// operands' ranks and index them by coordinates (no division per dimension, as `off` needs).
fn block_rank(k: u32) -> u32 { return pw(pw(17u + k)); }
fn block_offset(k: u32) -> i32 { return bitcast<i32>(pw(pw(17u + k) + 1u)); }
fn block_stride(k: u32, d: u32) -> i32 {
    let base = pw(17u + k);
    return bitcast<i32>(pw(base + 2u + pw(base) + d));
}
// The element at coordinates (i0, i1, i2[, i3]) of rank-3 (rank-4) layout block `k`.
fn at3(k: u32, i0: u32, i1: u32, i2: u32) -> i32 {
    return block_offset(k) + i32(i0) * block_stride(k, 0u) + i32(i1) * block_stride(k, 1u)
        + i32(i2) * block_stride(k, 2u);
}
fn at4(k: u32, i0: u32, i1: u32, i2: u32, i3: u32) -> i32 {
    return at3(k, i0, i1, i2) + i32(i3) * block_stride(k, 3u);
}

// The element offset of row-major position `lin` in layout block `k`. Elementwise kernels
// whose every operand is contiguous replace this with a base-plus-index version.
// @slot off
fn off(k: u32, lin: u32) -> i32 { return offset_in(pw(17u + k), lin); }
// @end

// An f32 from its bits, at run time. WGSL makes a constant expression whose value is infinite
// or NaN a shader-creation error (browsers' compilers refuse `bitcast<f32>(0x7f800000u)`;
// naga lets it through): special values come through this, since a call of a user function is
// never a constant expression.
fn f32_bits(b: u32) -> f32 { return bitcast<f32>(b); }
fn is_nan(v: f32) -> bool { return (bitcast<u32>(v) & 0x7fffffffu) > 0x7f800000u; }
fn nan() -> f32 { return f32_bits(0x7fc00000u); }
// Special values are tested on the bits: a WGSL compiler may assume arithmetic meets none.
fn is_inf(v: f32) -> bool { return (bitcast<u32>(v) & 0x7fffffffu) == 0x7f800000u; }
fn inf() -> f32 { return f32_bits(0x7f800000u); }
// `r`, or `v` where `v` is NaN: what hal's ops give for NaN, kept through builtins a WGSL
// compiler may evaluate as if no NaN reached them.
fn keep_nan(r: f32, v: f32) -> f32 { return select(r, v, is_nan(v)); }
// exp and exp2 that keep NaN (Chromium's WebGPU on SwiftShader gives exp(NaN) = inf): what
// the elementwise ops and IR programs both call.
fn exp_ref(v: f32) -> f32 { return keep_nan(exp(v), v); }
fn exp2_ref(v: f32) -> f32 { return keep_nan(exp2(v), v); }
fn sign_bit(v: f32) -> bool { return (bitcast<u32>(v) & 0x80000000u) != 0u; }

// C's powf (what the CPU reference and CUDA compute): WGSL's `pow` is defined for a positive
// base only. pow(x, +-0) = 1 and pow(1, y) = 1 even for NaN; pow(-1, +-inf) = 1; a negative
// base takes an integer exponent (odd: the sign stays) or gives NaN; zero and infinite bases
// and infinite exponents by C's table.
fn pow_ref(a: f32, b: f32) -> f32 {
    if (b == 0.0 || a == 1.0) { return 1.0; }
    if (b == 1.0) { return a; }
    if (is_nan(a) || is_nan(b)) { return nan(); }
    let m = abs(a);
    if (is_inf(b)) {
        if (m == 1.0) { return 1.0; }
        return select(0.0, inf(), (m > 1.0) == (b > 0.0));
    }
    var r: f32;
    if (m == 0.0) {
        r = select(0.0, inf(), b < 0.0);
    } else if (is_inf(m)) {
        r = select(inf(), 0.0, b < 0.0);
    } else {
        r = pow_magnitude(m, b);
    }
    if (!sign_bit(a)) { return r; }
    let integer = floor(b) == b;
    if (!integer) { return select(nan(), r, m == 0.0 || is_inf(m)); }
    let odd = abs(b) < 16777216.0 && fract(b * 0.5) != 0.0;
    return select(r, -r, odd);
}

// m^b for a finite m > 0 and a finite b != 0, as exp2(b log2 m) with the exponent carried
// apart: m = f 2^e (f in [sqrt(1/2), sqrt(2))), b log2 m = b log2 f + b e, split into an
// integer n and a fraction t in [0, 1), and the result is 2^t scaled by 2^n. Subnormal m and
// results near the overflow threshold come out right, where exp2(b * log2(m)) loses them.
fn pow_magnitude(m: f32, b: f32) -> f32 {
    // A subnormal m is scaled into the normal range first (frexp may not normalise it).
    let tiny = m < 1.17549435e-38;
    let parts = frexp(select(m, m * 16777216.0, tiny));
    let low = parts.fract < 0.70710678;
    let f = select(parts.fract, parts.fract * 2.0, low);
    let e = f32(parts.exp - select(0, 1, low) - select(0, 24, tiny));
    // |log2 m| >= 1/2 here, so beyond |b| = 1024 the result is far out of range.
    if (e != 0.0 && abs(b) > 1024.0) { return select(0.0, inf(), (e > 0.0) == (b > 0.0)); }
    let n0 = floor(b * e);
    let t0 = fma(b, e, -n0) + b * log2(f);
    let k = floor(t0);
    let n = n0 + k;
    if (n > 127.0) { return inf(); }
    if (n < -151.0) { return 0.0; }
    return ldexp(exp2(t0 - k), i32(n));
}

// Logarithms right at hal's special values, which WGSL leaves to the implementation (Chromium's
// WebGPU on SwiftShader gives log(0) = -88), and for subnormal arguments, taken from their bits
// so that a device flushing subnormals to zero still gets them: a positive subnormal is its
// mantissa times 2^-149.
fn log_ref(v: f32) -> f32 {
    let b = bitcast<u32>(v);
    if (b >= 0x00800000u && b < 0x7f800000u) { return log(v); }
    if (b > 0u && b < 0x00800000u) { return log(f32(b)) - 103.278929903431851; }
    return log_edge(b);
}
fn log2_ref(v: f32) -> f32 {
    let b = bitcast<u32>(v);
    if (b >= 0x00800000u && b < 0x7f800000u) { return log2(v); }
    if (b > 0u && b < 0x00800000u) { return log2(f32(b)) - 149.0; }
    return log_edge(b);
}
// A logarithm at ±0 (-inf), +inf (inf), and below zero or NaN (NaN), from the argument's bits.
fn log_edge(b: u32) -> f32 {
    if ((b & 0x7fffffffu) == 0u) { return -inf(); }
    if (b == 0x7f800000u) { return inf(); }
    return nan();
}

// Sine and cosine to about an ulp for |v| up to 8192 (beyond, a value in [-1, 1]): WGSL's
// builtins need only be within 2^-11 (Chromium's WebGPU on SwiftShader is 4e-5 off near 1).
// Cephes's sinf and cosf: v reduced by multiples of pi/4 in three parts, then a polynomial.
fn sin_ref(v: f32) -> f32 { return trig_ref(v, 0u); }
fn cos_ref(v: f32) -> f32 { return trig_ref(v, 2u); }
// `shift` 0 for sine, 2 for cosine (cos v = sin(v + pi/2): two eighths of a turn).
fn trig_ref(v: f32, shift: u32) -> f32 {
    if (is_nan(v) || is_inf(v)) { return nan(); }
    let a = abs(v);
    if (a > 8192.0) {
        // No digit of the reduced argument survives: the builtin, kept in range.
        let b = select(sin(v), cos(v), shift == 2u);
        return select(0.0, b, abs(b) <= 1.0);
    }
    var y = floor(a * 1.27323954473516);
    var j = u32(y);
    if ((j & 1u) == 1u) { j = j + 1u; y = y + 1.0; }
    let r = ((a - y * 0.78515625) - y * 2.4187564849853515625e-4) - y * 3.77489497744594108e-8;
    let z = r * r;
    let s = fma(fma(fma(-1.9515295891e-4, z, 8.3321608736e-3), z, -1.6666654611e-1), z * r, r);
    let c = fma(fma(fma(2.443315711809948e-5, z, -1.388731625493765e-3), z, 4.166664568298827e-2), z * z, fma(-0.5, z, 1.0));
    // Which eighth: j even, 0..6 after the rounding; the sine's sign follows v's.
    let q = ((j & 7u) / 2u + select(0u, 1u, shift == 2u)) & 3u;
    let neg_v = shift == 0u && sign_bit(v);
    let base = select(s, c, (q & 1u) == 1u);
    let flip = (q >= 2u) != neg_v;
    return select(base, -base, flip);
}

// C's atan2f: WGSL's `atan2` is undefined at (0, 0) and at infinities.
fn atan2_ref(y: f32, x: f32) -> f32 {
    if (is_nan(y) || is_nan(x)) { return nan(); }
    let pi = 3.14159265358979;
    let sy = select(1.0, -1.0, sign_bit(y));
    let xneg = sign_bit(x);
    if (y == 0.0) { return select(y, sy * pi, xneg); }
    if (x == 0.0) { return sy * (0.5 * pi); }
    if (is_inf(y)) {
        if (is_inf(x)) { return sy * select(0.25 * pi, 0.75 * pi, xneg); }
        return sy * (0.5 * pi);
    }
    if (is_inf(x)) { return select(sy * 0.0, sy * pi, xneg); }
    return atan2(y, x);
}

// max(v, 0) that keeps NaN and -0, decided on the bits: a compiler may otherwise turn the
// select into a max() that drops the NaN (NVIDIA's did).
fn relu_ref(v: f32) -> f32 {
    let m = bitcast<u32>(v) & 0x7fffffffu;
    return select(v, 0.0, sign_bit(v) && m != 0u && m <= 0x7f800000u);
}

// tanh, through a clamp (large arguments overflow some drivers' exp-based tanh) that keeps
// NaN (WGSL's clamp may turn it into a bound).
fn tanh_ref(v: f32) -> f32 {
    return select(tanh(clamp(v, -15.0, 15.0)), v, is_nan(v));
}

// A running reduction of the reduce kernels: a Kahan-compensated sum, the max and min, and
// whether a NaN was seen.
struct Running { sum: f32, comp: f32, mx: f32, mn: f32, seen_nan: bool }
fn running_start() -> Running {
    return Running(0.0, 0.0, -inf(), inf(), false);
}
// Adds `v` to the compensated sum only.
fn running_sum(r: ptr<function, Running>, v: f32) {
    let y = v - (*r).comp;
    let t = (*r).sum + y;
    (*r).comp = (t - (*r).sum) - y;
    (*r).sum = t;
}
fn running_add(r: ptr<function, Running>, v: f32) {
    running_sum(r, v);
    (*r).mx = max((*r).mx, v);
    (*r).mn = min((*r).mn, v);
    (*r).seen_nan = (*r).seen_nan || is_nan(v);
}
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
// Exact, in integer arithmetic (`unpack2x16float` needs a capability some adapters lack).
fn f16_to_f32(h: u32) -> f32 {
    let sign = (h & 0x8000u) << 16u;
    let e = (h >> 10u) & 0x1fu;
    let m = h & 0x3ffu;
    if (e == 0u) {
        let v = f32(m) * 5.9604644775390625e-8;
        return select(v, -v, sign != 0u);
    }
    if (e == 31u) { return bitcast<f32>(sign | 0x7f800000u | (m << 13u)); }
    return bitcast<f32>(sign | ((e + 112u) << 23u) | (m << 13u));
}
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
// Special values as C's: fmod(x, +-inf) = x for finite x; an infinite a, a zero or NaN b
// give NaN.
fn fmod(a: f32, b: f32) -> f32 {
    if (is_nan(a) || is_nan(b) || is_inf(a) || b == 0.0) { return nan(); }
    if (is_inf(b)) { return a; }
    if (abs(a) >= abs(b) * 8388608.0) { return fmod_long(a, b); }
    var r = a - b * trunc(a / b);
    let m = abs(b);
    if (abs(r) >= m) { r = r - select(m, -m, r < 0.0); }
    if (r != 0.0 && ((r < 0.0) != (a < 0.0))) { r = r + select(m, -m, a < 0.0); }
    return r;
}
// fmod for a quotient of 2^23 or more (or one that overflows), exactly: |b| doubled up to
// below |a|, then subtracted where it fits while halving back (each step exact).
fn fmod_long(a: f32, b: f32) -> f32 {
    let m = abs(b);
    var r = abs(a);
    var d = m;
    loop {
        if (d > r * 0.5) { break; }
        d = d * 2.0;
    }
    loop {
        if (r >= d) { r = r - d; }
        if (d <= m) { break; }
        d = d * 0.5;
    }
    return select(r, -r, sign_bit(a));
}
fn erf_approx(x: f32) -> f32 {
    let t = 1.0 / (1.0 + 0.3275911 * abs(x));
    let poly = t * (0.2548296 + t * (-0.28449674 + t * (1.4214137 + t * (-1.4531521 + t * 1.0614054))));
    let r = 1.0 - poly * exp(-x * x);
    return select(r, -r, x < 0.0);
}
