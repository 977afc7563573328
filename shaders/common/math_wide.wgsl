// f64 arithmetic and mathematics for IR programs on adapters with shader-f64 (`_wide`: f64
// values). Vulkan's GLSL.std.450 defines exp, log, pow, the trigonometric functions and
// atan2 for 16- and 32-bit floats only, and drivers approximate f64 division and square
// root, so everything here is built from +, -, *, comparisons, floor and ldexp:
//
// - conversions to integers that truncate toward zero and saturate (NaN to 0), as Rust's;
// - fma_f64, exact (Dekker's product; some drivers' f64 fma() rounds twice), and division
//   and square root refined by one Newton step on their exact residual: correctly rounded
//   or within one unit in the last place (ulp);
// - exp, exp2, expm1, log, log2, pow, sin, cos, tan, tanh, atan, atan2 and fmod, with
//   C's special values (IEEE 754's table for pow and atan2). Measured against 120-bit
//   references on 20,000 arguments each: within 1 ulp for exp, log, log2, atan, atan2; 2 for
//   pow, expm1, tanh and sin and cos beyond 1e5; 3 for tan. fmod is exact. sin, cos and tan
//   reduce their argument by pi/2 exactly enough at every magnitude (Payne and Hanek's
//   method beyond 1.6e6, with 2/pi to 1,344 bits).
//
// Reduction constants are fdlibm's (Sun Microsystems, 1993); the polynomials are the Taylor
// series, evaluated by Horner's rule, with enough terms that the first omitted one is below
// 2^-56 relative.

fn d2i(v: f64) -> i32 { if (!(v == v)) { return 0; } if (v >= 2147483647.0lf) { return 2147483647; } if (v <= -2147483648.0lf) { return -2147483647 - 1; } return i32(v); }
fn d2u(v: f64) -> u32 { if (!(v == v) || v <= 0.0lf) { return 0u; } if (v >= 4294967295.0lf) { return 4294967295u; } return u32(v); }
// An optimisation barrier for the error-free transformations below: compilers rewrite
// `t - (t - a)` to `a`, `(s - a) - b` to 0 (Mesa's NIR) and `(x - k c1) - k c2` to
// `x - k (c1 + c2)` (NVIDIA's) unless an instruction is marked exact, which WGSL cannot say
// (see keep.wgsl). An XOR of the bits with a run-time zero (scalar 15 is 0 in every IR
// program launch) is opaque to every such rule. (A select on a run-time condition was not:
// NVIDIA's compiler unswitched it, and a product with a run-time 1 NIR factored out.)
fn keep_f64(x: f64) -> f64 { return bitcast<f64>(bitcast<u64>(x) ^ u64(s(15u))); }

fn split_f64(a: f64) -> vec2<f64> {
    let t = keep_f64(134217729.0lf * a);
    let hi = keep_f64(t - keep_f64(t - a));
    return vec2<f64>(hi, keep_f64(a - hi));
}
fn fma_f64(a: f64, b: f64, c: f64) -> f64 {
    let p = keep_f64(a * b);
    if (!(abs(p) < 1e300lf) || abs(p) < 1e-280lf || !(abs(c) < 1e300lf)) { return p + c; }
    let x = split_f64(a); let y = split_f64(b);
    let e = keep_f64(keep_f64(keep_f64(keep_f64(x.x * y.x) - p) + keep_f64(x.x * y.y)) + keep_f64(x.y * y.x)) + keep_f64(x.y * y.y);
    let t = two_sum_f64(p, c);
    return t.x + keep_f64(t.y + e);
}
fn div_f64(x: f64, y: f64) -> f64 { let q = keep_f64(x / y); if (!(abs(q) < 1e295lf) || abs(q) < 1e-290lf) { return q; } return q + fma_f64(-q, y, x) / y; }
fn sqrt_f64(a: f64) -> f64 { let s = keep_f64(sqrt(a)); if (!(s > 1e-150lf) || !(s < 1e150lf)) { return s; } return s + fma_f64(-s, s, a) / (2.0lf * s); }

fn nan_f64() -> f64 { return f64(nan()); }
fn inf_f64() -> f64 { return f64(inf()); }
fn is_nan_f64(v: f64) -> bool { return !(v == v); }
fn is_inf_f64(v: f64) -> bool { return abs(v) > 1.7976931348623157e308lf; }
// The sign bit, also of -0 (narrowing to f32 keeps it); false for NaN.
fn sign_bit_f64(v: f64) -> bool {
    if (v == 0.0lf) { return (bitcast<u32>(f32(v)) & 0x80000000u) != 0u; }
    return v < 0.0lf;
}
fn copysign_f64(m: f64, s: f64) -> f64 { return select(abs(m), -abs(m), sign_bit_f64(s)); }
// m 2^k in two steps, so neither overflows where the product does not.
fn scale_f64(m: f64, k: i32) -> f64 { let h = k / 2; return ldexp(ldexp(m, h), k - h); }
// (s, e) with a + b = s + e exactly.
fn two_sum_f64(a: f64, b: f64) -> vec2<f64> {
    let s = keep_f64(a + b);
    let bb = keep_f64(s - a);
    return vec2<f64>(s, keep_f64(keep_f64(a - keep_f64(s - bb)) + keep_f64(b - bb)));
}

// exp(r) for |r| <= ln(2)/2 + 2^-40.
fn exp_reduced_f64(r: f64) -> f64 {
    var p = 1.6059043836821613e-10lf;
    p = p * r + 2.08767569878681e-09lf;
    p = p * r + 2.505210838544172e-08lf;
    p = p * r + 2.755731922398589e-07lf;
    p = p * r + 2.7557319223985893e-06lf;
    p = p * r + 2.48015873015873e-05lf;
    p = p * r + 0.0001984126984126984lf;
    p = p * r + 0.001388888888888889lf;
    p = p * r + 0.008333333333333333lf;
    p = p * r + 0.041666666666666664lf;
    p = p * r + 0.16666666666666666lf;
    p = p * r + 0.5lf;
    p = p * r + 1.0lf;
    return p * r + 1.0lf;
}

// exp(x + lo) for x in [-745.2, 709.8] and |lo| <= 2^-40 |x|: x = k ln2 + r, ln2 in two
// parts (k ln2_hi is exact), then 2^k exp(r).
fn exp_core_f64(x: f64, lo: f64) -> f64 {
    let k = floor(x * 1.4426950408889634lf + 0.5lf);
    let r = keep_f64(keep_f64(x - keep_f64(k * 0.6931471803691238lf)) - keep_f64(k * 1.9082149292705877e-10lf)) + lo;
    return scale_f64(exp_reduced_f64(r), i32(k));
}

fn exp_f64(x: f64) -> f64 {
    if (is_nan_f64(x)) { return x; }
    if (x > 709.782712893384lf) { return inf_f64(); }
    if (x < -745.1332191019412lf) { return 0.0lf; }
    return exp_core_f64(x, 0.0lf);
}

fn exp2_f64(x: f64) -> f64 {
    if (is_nan_f64(x)) { return x; }
    if (x >= 1024.0lf) { return inf_f64(); }
    if (x < -1075.0lf) { return 0.0lf; }
    let k = floor(x + 0.5lf);
    let t = x - k;
    let hi = keep_f64(t * 0.6931471805599453lf);
    let lo = fma_f64(t, 0.6931471805599453lf, -hi) + t * 2.3190468138462996e-17lf;
    return scale_f64(exp_reduced_f64(hi + lo), i32(k));
}

// exp(x) - 1 without the cancellation near 0 (|x| < 56 ln 2; larger arguments go through exp).
fn expm1_small_f64(x: f64) -> f64 {
    var p = 7.647163731819816e-13lf;
    p = p * x + 1.1470745597729725e-11lf;
    p = p * x + 1.6059043836821613e-10lf;
    p = p * x + 2.08767569878681e-09lf;
    p = p * x + 2.505210838544172e-08lf;
    p = p * x + 2.755731922398589e-07lf;
    p = p * x + 2.7557319223985893e-06lf;
    p = p * x + 2.48015873015873e-05lf;
    p = p * x + 0.0001984126984126984lf;
    p = p * x + 0.001388888888888889lf;
    p = p * x + 0.008333333333333333lf;
    p = p * x + 0.041666666666666664lf;
    p = p * x + 0.16666666666666666lf;
    p = p * x + 0.5lf;
    return x + x * x * p;
}
fn expm1_f64(x: f64) -> f64 {
    if (is_nan_f64(x)) { return x; }
    if (abs(x) < 0.34657359027997264lf) { return expm1_small_f64(x); }
    if (x > 38.0lf) { return exp_f64(x) - 1.0lf; }
    if (x < -38.0lf) { return -1.0lf; }
    let k = floor(x * 1.4426950408889634lf + 0.5lf);
    let r = keep_f64(x - keep_f64(k * 0.6931471803691238lf)) - keep_f64(k * 1.9082149292705877e-10lf);
    let ki = i32(k);
    return ldexp(expm1_small_f64(r), ki) + (ldexp(1.0lf, ki) - 1.0lf);
}

// log of a finite x > 0 as (e, hi, lo): log x = e ln2 + hi + lo, with hi + lo = log f for
// x = f 2^e, f in [sqrt(1/2), sqrt(2)), carried to about 2^-64 absolute (what pow needs):
// log f = 2 atanh(s), s = (f - 1) / (f + 1), with s itself in two parts.
fn log_parts_f64(x: f64) -> vec3<f64> {
    let e0 = exponent_f64(x);
    var f = scale_f64(x, -e0);
    var e = e0;
    if (f < 0.7071067811865476lf) { f = f * 2.0lf; e = e - 1; }
    let g = f - 1.0lf;
    let d = keep_f64(2.0lf + g);
    let d_lo = keep_f64(g - keep_f64(d - 2.0lf));
    let s = div_f64(g, d);
    let t = keep_f64(s * d);
    let t_err = fma_f64(s, d, -t);
    let s_lo = div_f64(keep_f64(keep_f64(g - t) - t_err) - s * d_lo, d);
    // atanh(s) - s = s^3/3 + s^5/5 + ...: the first term to about 2^-106 (s^3 from exact
    // products, the division by 3 with its remainder), the rest, below 2^-10 of it, plainly.
    let z = keep_f64(s * s);
    let z_err = fma_f64(s, s, -z);
    let c = keep_f64(s * z);
    let c_err = fma_f64(s, z, -c) + s * z_err;
    let q = div_f64(c, 3.0lf);
    let q_lo = (fma_f64(-q, 3.0lf, c) + c_err) * 0.3333333333333333lf;
    var w = 0.04lf;
    w = w * z + 0.043478260869565216lf;
    w = w * z + 0.047619047619047616lf;
    w = w * z + 0.05263157894736842lf;
    w = w * z + 0.058823529411764705lf;
    w = w * z + 0.06666666666666667lf;
    w = w * z + 0.07692307692307693lf;
    w = w * z + 0.09090909090909091lf;
    w = w * z + 0.1111111111111111lf;
    w = w * z + 0.14285714285714285lf;
    w = w * z + 0.2lf;
    let tail = c * z * w;
    // log f = 2 (s + s_lo) + 2 (atanh(s) - s), the derivative of s^3/3 carrying s_lo too.
    let head = two_sum_f64(2.0lf * s, 2.0lf * q);
    return vec3<f64>(f64(e), head.x, head.y + 2.0lf * (s_lo + q_lo + tail + z * s_lo));
}

// log x in two parts (hi, lo) for a finite x > 0.
fn log_dd_f64(x: f64) -> vec2<f64> {
    let p = log_parts_f64(x);
    let a = two_sum_f64(p.x * 0.6931471803691238lf, p.y);
    let l = keep_f64(a.y + (p.x * 1.9082149292705877e-10lf + p.z));
    let h = keep_f64(a.x + l);
    return vec2<f64>(h, keep_f64(l - keep_f64(h - a.x)));
}

// C's log for the special values: NaN and negative give NaN, +-0 gives -inf, +inf itself.
fn log_special_f64(x: f64) -> f64 {
    if (is_nan_f64(x) || x < 0.0lf) { return nan_f64(); }
    if (x == 0.0lf) { return -inf_f64(); }
    return x;
}

fn log_f64(x: f64) -> f64 {
    if (!(x > 0.0lf) || is_inf_f64(x)) { return log_special_f64(x); }
    let l = log_dd_f64(x);
    return l.x + l.y;
}

fn log2_f64(x: f64) -> f64 {
    if (!(x > 0.0lf) || is_inf_f64(x)) { return log_special_f64(x); }
    let p = log_parts_f64(x);
    // e + (hi + lo) / ln 2, 1 / ln 2 in two parts: exact where x is a power of two.
    let q = keep_f64(p.y * 1.4426950408889634lf);
    let q_err = fma_f64(p.y, 1.4426950408889634lf, -q);
    return p.x + (q + (q_err + p.y * 2.0355273740931033e-17lf + p.z * 1.4426950408889634lf));
}

// m^b for a finite m > 0 and a finite b != 0: exp(b log m), the product carried in two parts.
fn pow_magnitude_f64(m: f64, b: f64) -> f64 {
    let l = log_dd_f64(m);
    let p = keep_f64(b * l.x);
    let p_err = fma_f64(b, l.x, -p) + b * l.y;
    if (p > 709.8lf) { return inf_f64(); }
    if (p < -745.2lf) { return 0.0lf; }
    return exp_core_f64(p, p_err);
}

// C's pow: pow(x, +-0) = 1 and pow(1, y) = 1 even for NaN; pow(-1, +-inf) = 1; a negative
// base takes an integer exponent (odd: the sign stays) or gives NaN; zero and infinite bases
// and infinite exponents by C's table.
fn pow_f64(a: f64, b: f64) -> f64 {
    if (b == 0.0lf || a == 1.0lf) { return 1.0lf; }
    if (b == 1.0lf) { return a; }
    if (is_nan_f64(a) || is_nan_f64(b)) { return nan_f64(); }
    let m = abs(a);
    if (is_inf_f64(b)) {
        if (m == 1.0lf) { return 1.0lf; }
        return select(0.0lf, inf_f64(), (m > 1.0lf) == (b > 0.0lf));
    }
    var r: f64;
    if (m == 0.0lf) {
        r = select(0.0lf, inf_f64(), b < 0.0lf);
    } else if (is_inf_f64(m)) {
        r = select(inf_f64(), 0.0lf, b < 0.0lf);
    } else {
        r = pow_magnitude_f64(m, b);
    }
    if (!sign_bit_f64(a)) { return r; }
    let integer = floor(b) == b;
    if (!integer) { return select(nan_f64(), r, m == 0.0lf || is_inf_f64(m)); }
    let half = b * 0.5lf;
    let odd = abs(b) < 9007199254740992.0lf && floor(half) != half;
    return select(r, -r, odd);
}

// x - k pi/2 for the nearest integer k, and k mod 4: pi/2 in three 33-bit parts (exact for
// |x| < 2^20 pi/2), beyond that Payne and Hanek's reduction.
struct Reduced { r: f64, quadrant: u32 }
fn reduce_half_pi_f64(x: f64) -> Reduced {
    if (abs(x) >= 1647099.0lf) {
        let a = reduce_large_f64(abs(x));
        if (x > 0.0lf) { return a; }
        return Reduced(-a.r, (4u - a.quadrant) & 3u);
    }
    let k = floor(x * 0.6366197723675814lf + 0.5lf);
    let r1 = keep_f64(x - keep_f64(k * 1.5707963267341256lf));
    let r = keep_f64(r1 - keep_f64(k * 6.077100506303966e-11lf)) - k * 2.0222662487111665e-21lf;
    let q = k - 4.0lf * floor(k * 0.25lf);
    return Reduced(r, u32(q));
}

// 2/pi in 24-bit digits: 2/pi = sum of TWO_OVER_PI[j] 2^(-24 (j + 1)) (as fdlibm's ipio2).
var<private> TWO_OVER_PI: array<u32, 56> = array<u32, 56>(
    0xa2f983u, 0x6e4e44u, 0x1529fcu, 0x2757d1u, 0xf534ddu, 0xc0db62u, 0x95993cu, 0x439041u,
    0xfe5163u, 0xabdebbu, 0xc561b7u, 0x246e3au, 0x424dd2u, 0xe00649u, 0x2eea09u, 0xd1921cu,
    0xfe1debu, 0x1cb129u, 0xa73ee8u, 0x8235f5u, 0x2ebb44u, 0x84e99cu, 0x7026b4u, 0x5f7e41u,
    0x3991d6u, 0x398353u, 0x39f49cu, 0x845f8bu, 0xbdf928u, 0x3b1ff8u, 0x97ffdeu, 0x5980fu,
    0xef2f11u, 0x8b5a0au, 0x6d1f6du, 0x367ecfu, 0x27cb09u, 0xb74f46u, 0x3f669eu, 0x5fea2du,
    0x7527bau, 0xc7ebe5u, 0xf17b3du, 0x739f7u, 0x8a5292u, 0xea6bfbu, 0x5fb11fu, 0x8d5d08u,
    0x560330u, 0x46fc7bu, 0x6babf0u, 0xcfbc20u, 0x9af436u, 0x1da9e3u, 0x91615eu, 0xe61b08u
);

// t mod 4 for an exactly representable t >= 0 whose lowest bit is at least 2^-1000.
fn mod4_f64(t: f64) -> f64 { return keep_f64(t - keep_f64(4.0lf * floor(t * 0.25lf))); }

// Payne and Hanek's reduction of a finite x >= 2^20 pi/2: x = (x0 2^48 + x1 2^24 + x2)
// 2^(e-72) with 24-bit integers xi, and x 2/pi mod 4 is summed from the products xi dj of
// the digits that land below 2^2 (each group of at most three is an exact integer below
// 2^50), about 100 bits past the point; the fraction times pi/2 (in two parts) is the
// remainder.
fn reduce_large_f64(x: f64) -> Reduced {
    let e = exponent_f64(x);
    let z = scale_f64(x, -e) * 16777216.0lf;
    let x0 = floor(z);
    let z1 = keep_f64(z - x0) * 16777216.0lf;
    let x1 = floor(z1);
    let x2 = keep_f64(z1 - x1) * 16777216.0lf;
    let s_min = max(0, (e - 50) / 24 + 1);
    var part: array<f64, 8>;
    for (var g = 0; g < 8; g = g + 1) {
        let s = s_min + g;
        var sum = x0 * f64(TWO_OVER_PI[s]);
        if (s >= 1) { sum = sum + x1 * f64(TWO_OVER_PI[s - 1]); }
        if (s >= 2) { sum = sum + x2 * f64(TWO_OVER_PI[s - 2]); }
        part[g] = mod4_f64(scale_f64(sum, e - 48 - 24 * s));
    }
    let head = two_sum_f64(mod4_f64(part[0] + part[1]), part[2]);
    let lo = head.y + ((part[3] + part[4]) + (part[5] + part[6] + part[7]));
    let hi = mod4_f64(head.x);
    let n = floor(hi + 0.5lf);
    let f = two_sum_f64(keep_f64(hi - n), lo);
    let p = keep_f64(f.x * 1.5707963267948966lf);
    let err = fma_f64(f.x, 1.5707963267948966lf, -p);
    let r = p + (err + f.x * 6.123233995736766e-17lf + f.y * 1.5707963267948966lf);
    return Reduced(r, u32(n) & 3u);
}

fn sin_reduced_f64(r: f64) -> f64 {
    let z = r * r;
    var p = -8.22063524662433e-18lf;
    p = p * z + 2.8114572543455206e-15lf;
    p = p * z - 7.647163731819816e-13lf;
    p = p * z + 1.6059043836821613e-10lf;
    p = p * z - 2.505210838544172e-08lf;
    p = p * z + 2.7557319223985893e-06lf;
    p = p * z - 0.0001984126984126984lf;
    p = p * z + 0.008333333333333333lf;
    p = p * z - 0.16666666666666666lf;
    return r + r * z * p;
}
fn cos_reduced_f64(r: f64) -> f64 {
    let z = r * r;
    var p = -1.5619206968586225e-16lf;
    p = p * z + 4.779477332387385e-14lf;
    p = p * z - 1.1470745597729725e-11lf;
    p = p * z + 2.08767569878681e-09lf;
    p = p * z - 2.755731922398589e-07lf;
    p = p * z + 2.48015873015873e-05lf;
    p = p * z - 0.001388888888888889lf;
    p = p * z + 0.041666666666666664lf;
    let hz = 0.5lf * z;
    let w = keep_f64(1.0lf - hz);
    return w + (keep_f64(keep_f64(1.0lf - w) - hz) + z * z * p);
}
fn sin_f64(x: f64) -> f64 {
    if (is_nan_f64(x) || is_inf_f64(x)) { return nan_f64(); }
    if (abs(x) < 7.450580596923828e-09lf) { return x; }
    let a = reduce_half_pi_f64(x);
    let v = select(sin_reduced_f64(a.r), cos_reduced_f64(a.r), (a.quadrant & 1u) == 1u);
    return select(v, -v, a.quadrant >= 2u);
}
fn cos_f64(x: f64) -> f64 {
    if (is_nan_f64(x) || is_inf_f64(x)) { return nan_f64(); }
    let a = reduce_half_pi_f64(x);
    let v = select(cos_reduced_f64(a.r), sin_reduced_f64(a.r), (a.quadrant & 1u) == 1u);
    return select(v, -v, a.quadrant == 1u || a.quadrant == 2u);
}
fn tan_f64(x: f64) -> f64 {
    if (is_nan_f64(x) || is_inf_f64(x)) { return nan_f64(); }
    if (abs(x) < 7.450580596923828e-09lf) { return x; }
    let a = reduce_half_pi_f64(x);
    let s = sin_reduced_f64(a.r);
    let c = cos_reduced_f64(a.r);
    return select(div_f64(s, c), -div_f64(c, s), (a.quadrant & 1u) == 1u);
}

fn tanh_f64(x: f64) -> f64 {
    if (is_nan_f64(x)) { return x; }
    let a = abs(x);
    if (a < 3.725290298461914e-09lf) { return x; }
    var y = 1.0lf;
    if (a < 1.0lf) {
        let t = expm1_f64(-2.0lf * a);
        y = -div_f64(t, t + 2.0lf);
    } else if (a < 22.0lf) {
        y = 1.0lf - div_f64(2.0lf, expm1_f64(2.0lf * a) + 2.0lf);
    }
    return copysign_f64(y, x);
}

// atan(t) for a finite t >= 0: t is moved next to 0, 1/2, 1, 3/2 or infinity,
// atan(t) = atan(c) + atan(u), |u| <= 7/16, and atan(c) is carried in two parts (fdlibm's).
fn atan_positive_f64(t: f64) -> f64 {
    var u: f64;
    var hi = 0.0lf;
    var lo = 0.0lf;
    if (t < 0.4375lf) {
        u = t;
    } else if (t < 0.6875lf) {
        u = div_f64(2.0lf * t - 1.0lf, 2.0lf + t);
        hi = 0.4636476090008061lf; lo = 2.2698777452961687e-17lf;
    } else if (t < 1.1875lf) {
        u = div_f64(t - 1.0lf, t + 1.0lf);
        hi = 0.7853981633974483lf; lo = 3.061616997868383e-17lf;
    } else if (t < 2.4375lf) {
        u = div_f64(t - 1.5lf, 1.0lf + 1.5lf * t);
        hi = 0.982793723247329lf; lo = 1.3903311031230998e-17lf;
    } else {
        u = -div_f64(1.0lf, t);
        hi = 1.5707963267948966lf; lo = 6.123233995736766e-17lf;
    }
    let z = u * u;
    var p = 0.022222222222222223lf;
    p = p * z - 0.023255813953488372lf;
    p = p * z + 0.024390243902439025lf;
    p = p * z - 0.02564102564102564lf;
    p = p * z + 0.02702702702702703lf;
    p = p * z - 0.02857142857142857lf;
    p = p * z + 0.030303030303030304lf;
    p = p * z - 0.03225806451612903lf;
    p = p * z + 0.034482758620689655lf;
    p = p * z - 0.037037037037037035lf;
    p = p * z + 0.04lf;
    p = p * z - 0.043478260869565216lf;
    p = p * z + 0.047619047619047616lf;
    p = p * z - 0.05263157894736842lf;
    p = p * z + 0.058823529411764705lf;
    p = p * z - 0.06666666666666667lf;
    p = p * z + 0.07692307692307693lf;
    p = p * z - 0.09090909090909091lf;
    p = p * z + 0.1111111111111111lf;
    p = p * z - 0.14285714285714285lf;
    p = p * z + 0.2lf;
    p = p * z - 0.3333333333333333lf;
    return hi + (u + (u * (z * p) + lo));
}

fn atan_f64(x: f64) -> f64 {
    if (is_nan_f64(x)) { return x; }
    let a = abs(x);
    if (a < 7.450580596923828e-09lf) { return x; }
    var r = 1.5707963267948966lf;
    if (a < 7.378697629483821e19lf) { r = atan_positive_f64(a); }
    return copysign_f64(r, x);
}

// C's atan2: the signs of zeros and infinities choose the quadrant.
fn atan2_f64(y: f64, x: f64) -> f64 {
    if (is_nan_f64(y) || is_nan_f64(x)) { return nan_f64(); }
    let pi = 3.141592653589793lf;
    let xneg = sign_bit_f64(x);
    if (y == 0.0lf) { return select(y, copysign_f64(pi, y), xneg); }
    if (x == 0.0lf) { return copysign_f64(0.5lf * pi, y); }
    if (is_inf_f64(y)) {
        if (is_inf_f64(x)) { return copysign_f64(select(0.25lf * pi, 0.75lf * pi, xneg), y); }
        return copysign_f64(0.5lf * pi, y);
    }
    if (is_inf_f64(x)) { return copysign_f64(select(0.0lf, pi, xneg), y); }
    let t = div_f64(abs(y), abs(x));
    var a = 1.5707963267948966lf;
    if (!is_inf_f64(t)) { a = atan_positive_f64(t); }
    // pi - a with pi in two parts.
    if (xneg) { a = pi - (a - 1.2246467991473532e-16lf); }
    return copysign_f64(a, y);
}

// frexp's exponent of a finite v > 0 (v = f 2^e, f in [1/2, 1)), subnormal or not. (naga
// types frexp's exponent of an f64 as i64, which needs shader-int64: the exponent is read
// from the f32 nearest to v brought into f32's range by exact steps of 2^120.)
fn exponent_f64(v: f64) -> i32 {
    var y = v;
    var e = 0;
    if (y < 2.2250738585072014e-308lf) { y = y * 18014398509481984.0lf; e = -54; }
    for (var i = 0; i < 9 && y >= 1.329227995784916e36lf; i = i + 1) { y = y * 7.52316384526264e-37lf; e = e + 120; }
    for (var i = 0; i < 9 && y < 7.52316384526264e-37lf; i = i + 1) { y = y * 1.329227995784916e36lf; e = e - 120; }
    var k = i32((bitcast<u32>(f32(y)) >> 23u) & 0xffu) - 126;
    // f32(y) may have rounded up to the next power of two.
    if (ldexp(1.0lf, k - 1) > y) { k = k - 1; }
    return e + k;
}

// C's fmod, exact: |y| 2^j is taken from |x| for falling j (each subtraction is exact).
fn fmod_f64(x: f64, y: f64) -> f64 {
    if (is_nan_f64(x) || is_nan_f64(y) || is_inf_f64(x) || y == 0.0lf) { return nan_f64(); }
    let ay = abs(y);
    var ax = abs(x);
    if (is_inf_f64(y) || ax < ay) { return x; }
    // At most 2,100 steps (the exponent range of f64).
    let ey = exponent_f64(ay);
    for (var i = 0; i < 2200 && ax >= ay; i = i + 1) {
        var j = exponent_f64(ax) - ey;
        var step = scale_f64(ay, j);
        if (step > ax) { j = j - 1; step = scale_f64(ay, j); }
        ax = keep_f64(ax - step);
    }
    return copysign_f64(ax, x);
}
