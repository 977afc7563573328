//! The counter-based random stream every backend reproduces: Philox 4x32-10 (Salmon et al.,
//! "Parallel random numbers: as easy as 1, 2, 3", SC 2011).
//!
//! Element `i` of a [`Backend::random`](crate::Backend::random) call with `seed` and `offset`
//! is a pure function of `(seed, offset + i)`, so any backend, any thread count and any split of
//! a tensor into calls give the same numbers. The integer stream and the uniform values are
//! bit-exact across backends; normal values go through `ln`, `sqrt` and `cos`, whose last bits
//! differ between math libraries, so they agree within the tolerance stated there.

use crate::Distribution;

const M0: u32 = 0xD251_1F53;
const M1: u32 = 0xCD9E_8D57;
const W0: u32 = 0x9E37_79B9;
const W1: u32 = 0xBB67_AE85;

/// Ten rounds of Philox 4x32 on `counter` with `key`.
#[inline]
pub fn philox4x32_10(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let [mut c0, mut c1, mut c2, mut c3] = counter;
    let [mut k0, mut k1] = key;
    for round in 0..10 {
        if round > 0 {
            k0 = k0.wrapping_add(W0);
            k1 = k1.wrapping_add(W1);
        }
        let p0 = (M0 as u64) * (c0 as u64);
        let p1 = (M1 as u64) * (c2 as u64);
        let (hi0, lo0) = ((p0 >> 32) as u32, p0 as u32);
        let (hi1, lo1) = ((p1 >> 32) as u32, p1 as u32);
        (c0, c1, c2, c3) = (hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0);
    }
    [c0, c1, c2, c3]
}

/// The four 32-bit words for stream position `index` under `seed`.
#[inline]
pub fn philox_words(seed: u64, index: u64) -> [u32; 4] {
    philox4x32_10(
        [index as u32, (index >> 32) as u32, 0, 0],
        [seed as u32, (seed >> 32) as u32],
    )
}

/// A uniform value in `[0, 1)` with 24 random bits: `(word >> 8) * 2^-24`.
#[inline]
pub fn unit_uniform(word: u32) -> f32 {
    (word >> 8) as f32 * (1.0 / 16_777_216.0)
}

/// Dropout's keep rule: a word `w` survives dropout `p` where `(w >> 8) >= keep_threshold(p)`,
/// which is `unit_uniform(w) >= p` in integers (`ceil(p 2^24)`). Tensor dropout and the fused
/// attention's both decide by it, so a composed attention drops the fused one's weights.
#[inline]
pub fn keep_threshold(p: f32) -> u32 {
    (p as f64 * 16_777_216.0).ceil() as u32
}

/// The value at stream position `index` for `dist` under `seed`.
///
/// Uniform: `low + (high - low) * u` with `u = unit_uniform(w0)`.
/// Normal (Box–Muller, cosine branch): `u1 = (w0 >> 8 + 1) * 2^-24` in `(0, 1]`,
/// `u2 = unit_uniform(w1)`, `z = sqrt(-2 ln u1) cos(2 pi u2)`, value `mean + std * z`.
#[inline]
pub fn random_value(dist: Distribution, seed: u64, index: u64) -> f32 {
    let w = philox_words(seed, index);
    match dist {
        Distribution::Uniform { low, high } => (high - low).mul_add(unit_uniform(w[0]), low),
        Distribution::Normal { mean, std } => {
            let u1 = ((w[0] >> 8) + 1) as f32 * (1.0 / 16_777_216.0);
            let u2 = unit_uniform(w[1]);
            let z = (-2.0 * u1.ln()).sqrt() * (std::f32::consts::TAU * u2).cos();
            std.mul_add(z, mean)
        }
    }
}

/// A uniform value in `[0, 1)` with 53 random bits from two words: `(hi << 21 | lo >> 11) *
/// 2^-53`.
#[inline]
pub fn unit_uniform_f64(hi: u32, lo: u32) -> f64 {
    (((hi as u64) << 21) | (lo >> 11) as u64) as f64 * (1.0 / 9_007_199_254_740_992.0)
}

/// [`random_value`] for `f64` buffers, with 53-bit uniforms: `u = unit_uniform_f64(w0, w1)`
/// (uniform: `low + (high - low) * u`, one rounding); normal: `u1 = u + 2^-53` in `(0, 1]`,
/// `u2 = unit_uniform_f64(w2, w3)`, `z = sqrt(-2 ln u1) cos(2 pi u2)`, `mean + std * z`. The
/// distribution's parameters are widened from `f32`.
#[inline]
pub fn random_value_f64(dist: Distribution, seed: u64, index: u64) -> f64 {
    let w = philox_words(seed, index);
    let u = unit_uniform_f64(w[0], w[1]);
    match dist {
        Distribution::Uniform { low, high } => (high as f64 - low as f64).mul_add(u, low as f64),
        Distribution::Normal { mean, std } => {
            let u1 = u + 1.0 / 9_007_199_254_740_992.0;
            let u2 = unit_uniform_f64(w[2], w[3]);
            let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
            (std as f64).mul_add(z, mean as f64)
        }
    }
}

/// A stream `(seed, offset)` as the four words a program reads it from ([`stream_bits`]):
/// `seed`'s low and high words, then `offset`'s.
pub fn stream_words(seed: u64, offset: u64) -> [u32; 4] {
    [
        seed as u32,
        (seed >> 32) as u32,
        offset as u32,
        (offset >> 32) as u32,
    ]
}

/// Emits, into `p`, word 0 of the stream held in `stream` (a `U32` buffer of at least four
/// elements, [`stream_words`]) at position `offset + index` (`index` a `U32` value; the
/// 64-bit sum carries): `philox_words(seed, offset + index)[0]`, as element `index` of a
/// [`Backend::random`](crate::Backend::random) call on that stream draws it.
pub fn stream_bits(
    p: &mut crate::ir::ProgramBuilder,
    stream: crate::ir::BufferId,
    index: crate::ir::Value,
) -> crate::ir::Value {
    use crate::ir::{IrBinary, IrCmp};
    let word = |p: &mut crate::ir::ProgramBuilder, k: u32| {
        let at = p.const_u32(k);
        p.load(stream, at)
    };
    let (k0, k1, o0, o1) = (word(p, 0), word(p, 1), word(p, 2), word(p, 3));
    let lo = p.add(o0, index);
    let carried = p.cmp(IrCmp::Lt, lo, index);
    let (one, zero) = (p.const_u32(1), p.const_u32(0));
    let carry = p.select(carried, one, zero);
    let hi = p.binary(IrBinary::Add, o1, carry);
    p.random_bits([k0, k1], [lo, hi])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn philox_matches_the_published_known_answers() {
        // Known-answer vectors from the Random123 distribution (kat_vectors, philox4x32_10).
        assert_eq!(
            philox4x32_10([0, 0, 0, 0], [0, 0]),
            [0x6627_e8d5, 0xe169_c58d, 0xbc57_ac4c, 0x9b00_dbd8]
        );
        assert_eq!(
            philox4x32_10([u32::MAX; 4], [u32::MAX; 2]),
            [0x408f_276d, 0x41c8_3b0e, 0xa20b_c7c6, 0x6d54_51fd]
        );
        assert_eq!(
            philox4x32_10(
                [0x243f_6a88, 0x85a3_08d3, 0x1319_8a2e, 0x0370_7344],
                [0xa409_3822, 0x299f_31d0]
            ),
            [0xd16c_fe09, 0x94fd_cceb, 0x5001_e420, 0x2412_6ea1]
        );
    }

    #[test]
    fn uniform_and_normal_have_the_right_moments() {
        let n = 200_000u64;
        let (mut su, mut sn, mut sn2) = (0f64, 0f64, 0f64);
        for i in 0..n {
            let u = random_value(
                Distribution::Uniform {
                    low: 0.0,
                    high: 1.0,
                },
                7,
                i,
            ) as f64;
            assert!((0.0..1.0).contains(&u));
            su += u;
            let z = random_value(
                Distribution::Normal {
                    mean: 0.0,
                    std: 1.0,
                },
                7,
                i,
            ) as f64;
            sn += z;
            sn2 += z * z;
        }
        let nf = n as f64;
        assert!((su / nf - 0.5).abs() < 0.005);
        assert!((sn / nf).abs() < 0.01);
        assert!((sn2 / nf - 1.0).abs() < 0.02);
    }
}
