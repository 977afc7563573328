//! Elementary functions written so that loops over them vectorise, and the switch that
//! compiles a loop for AVX2 and FMA where the CPU has them.
//!
//! libm's `expf` is a call per element, which keeps every loop around it scalar: GELU's
//! forward and its gradient program spent most of a small GPT's training step there. The
//! functions here are branch-free (selects, not jumps), so a loop of them becomes SIMD code,
//! and use only plain multiplies and adds (no `mul_add`): the same rounding with and without
//! FMA hardware, so results do not depend on the CPU.

/// `e^x` in `f32`, within 2 ulp of the exact value over the whole range (checked against
/// `f64` in the tests), with `exp(NaN) = NaN`, `exp(+inf) = +inf`, `exp(-inf) = +0`, and
/// overflow to `+inf` and underflow through the subnormals to 0 where `f32` puts them.
///
/// Cody-Waite reduction `x = n ln 2 + r` (`|r| <= ln 2 / 2`, `ln 2` split in two so that
/// `n ln2_hi` is exact), Cephes' degree-7 polynomial for `e^r`, and the scaling by `2^n` as
/// two powers of two, each a normal number, so results in the subnormal range are rounded
/// once, by the last multiply.
#[inline(always)]
pub(crate) fn exp_f32(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 = LN2_HI + LN2_LO; LN2_HI has 9 significant bits, so n * LN2_HI is exact for
    // |n| < 2^15.
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Beyond these, e^x is +inf or rounds to 0 in f32; clamping keeps n in the range where
    // the two scale factors below are normal numbers.
    // `max`/`min`, not `clamp`: they drop a NaN, so `c` is finite and the integer
    // conversion below exact.
    #[allow(clippy::manual_clamp)]
    let c = x.max(-104.0).min(89.0);
    // Rounded to the nearest integer by adding and subtracting 1.5 * 2^23 (|c log2 e| < 2^22):
    // one add each way, where `round_ties_even` is a libm call on baseline x86-64.
    const ROUND: f32 = 12_582_912.0;
    let n = (c * LOG2E + ROUND) - ROUND;
    let r = (c - n * LN2_HI) - n * LN2_LO;
    let r2 = r * r;
    let p = ((((1.987_569_1e-4 * r + 1.398_199_9e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2) * r
        + 1.666_666_5e-1)
        * r
        + 0.5;
    let er = p * r2 + r + 1.0;
    // 2^n as 2^h * 2^(n - h), h = n / 2 rounded toward zero: both halves lie in
    // [-75, 64], where 2^k is a normal f32 built from its exponent bits.
    // SAFETY: n is an integer in [-151, 129] (c is finite and clamped), representable in i32.
    // Unchecked, because the checked conversion (saturating, NaN to 0) keeps the loop scalar.
    let ni: i32 = unsafe { n.to_int_unchecked() };
    let h = ni / 2;
    let pow2 = |k: i32| f32::from_bits(((k + 127) as u32) << 23);
    let y = er * pow2(h) * pow2(ni - h);
    if x.is_nan() { x } else { y }
}

/// The error function by the formula every backend uses ([`hal::erf_f32`]: Abramowitz and
/// Stegun 7.1.26), with [`exp_f32`] for its exponential.
#[inline(always)]
pub(crate) fn erf_f32(x: f32) -> f32 {
    hal::erf_f32_with(x, exp_f32)
}

/// GELU, `x Phi(x) = x (1 + erf(x / sqrt 2)) / 2`, as [`hal::UnaryOp::Gelu`] defines it.
#[inline(always)]
pub(crate) fn gelu_f32(x: f32) -> f32 {
    0.5 * x * (1.0 + erf_f32(x * std::f32::consts::FRAC_1_SQRT_2))
}

/// Runs `body` compiled for AVX2 and FMA where this CPU has them (checked at run time; the
/// build targets baseline x86-64), else as built. `body` must be inlined into the wrapper to
/// gain anything: pass a closure whose hot loop is written inside it or in `#[inline(always)]`
/// functions.
#[inline(always)]
pub(crate) fn with_avx2<R>(body: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    if crate::has_avx2_fma() {
        #[target_feature(enable = "avx2,fma")]
        fn avx2<R>(body: impl FnOnce() -> R) -> R {
            body()
        }
        // SAFETY: the CPU has AVX2 and FMA (just checked).
        return unsafe { avx2(body) };
    }
    body()
}

/// Clears the upper halves of the vector registers (`vzeroupper`) where the CPU has AVX.
/// faer's matrix kernels return with them in use, and until they are cleared every
/// SSE-encoded instruction on that thread (all of this crate's baseline x86-64 code, libm's
/// `exp`) runs many times slower: 66,560 `f64::exp` calls took 8.1 ms after a faer product
/// and 0.34 ms after this, on this project's AMD machine. Call it after each faer call, on
/// the thread that made it.
#[inline]
pub(crate) fn clear_upper() {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx") {
        // SAFETY: the CPU has AVX (just checked).
        unsafe { std::arch::x86_64::_mm256_zeroupper() };
    }
}

/// [`clear_upper`] on this thread and on every thread of rayon's pool: after a faer call that
/// ran on the pool.
pub(crate) fn clear_upper_everywhere() {
    clear_upper();
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx") {
        rayon::broadcast(|_| clear_upper());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use approx::assert_abs_diff_eq;

    /// Distance in units in the last place between `got` and the f32 nearest `want`.
    fn ulps(got: f32, want: f64) -> u32 {
        let w = want as f32;
        if got == w {
            return 0;
        }
        let key = |v: f32| {
            let b = v.to_bits() as i32;
            if b < 0 { i32::MIN - b } else { b }
        };
        key(got).abs_diff(key(w))
    }

    #[test]
    fn exp_within_two_ulp_everywhere() {
        // Every 97th f32 bit pattern in [-110, 95]: normal, subnormal and overflowing results.
        let mut worst = (0, 0.0f32);
        for bits in (0u32..u32::MAX).step_by(97) {
            let x = f32::from_bits(bits);
            if !x.is_finite() || !(-110.0..95.0).contains(&x) {
                continue;
            }
            let u = ulps(exp_f32(x), (x as f64).exp());
            if u > worst.0 {
                worst = (u, x);
            }
        }
        assert!(worst.0 <= 2, "exp({}) off by {} ulp", worst.1, worst.0);
    }

    #[test]
    fn exp_special_values() {
        assert!(exp_f32(f32::NAN).is_nan());
        assert_eq!(exp_f32(f32::INFINITY), f32::INFINITY);
        assert_eq!(exp_f32(f32::NEG_INFINITY).to_bits(), 0);
        assert_eq!(exp_f32(0.0), 1.0);
        assert_eq!(exp_f32(-0.0), 1.0);
        assert_eq!(exp_f32(88.8), f32::INFINITY);
        assert!(ulps(exp_f32(88.72), (88.72f32 as f64).exp()) <= 2);
        assert_eq!(exp_f32(-104.0), 0.0);
        // The smallest subnormal, e^-103.28 (2^-149), and a result in the middle of the range.
        assert_eq!(exp_f32(-103.2), f32::from_bits(1));
        let sub = exp_f32(-95.0);
        assert!(sub > 0.0 && !sub.is_normal());
        assert!(ulps(sub, (-95.0f64).exp()) <= 1);
    }

    #[test]
    fn erf_and_gelu_match_the_shared_formula() {
        for i in -4000..=4000 {
            let x = i as f32 * 2.5e-3 * (1.0 + (i as f32).abs() * 1e-3);
            assert_abs_diff_eq!(erf_f32(x), hal::erf_f32(x), epsilon = 2.0 * f32::EPSILON);
            let g = hal::UnaryOp::Gelu.apply(x);
            let tolerance = 4.0 * f32::EPSILON * g.abs().max(1e-3);
            assert_abs_diff_eq!(gelu_f32(x), g, epsilon = tolerance);
        }
        // As the shared formula (and PyTorch): NaN at -inf (-inf times 0), +inf at +inf.
        for x in [f32::NAN, f32::NEG_INFINITY, f32::INFINITY, -0.0, 0.0] {
            let (ours, shared) = (gelu_f32(x), hal::UnaryOp::Gelu.apply(x));
            assert!(ours.to_bits() == shared.to_bits() || ours.is_nan() && shared.is_nan());
        }
    }
}
