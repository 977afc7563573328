//! The precision policies a backend may run under: what each trades, and the tolerances
//! it then keeps.

/// How a backend may trade accuracy for speed in `matmul` and `nearest_centroid`, or speed for
/// cross-backend reproducibility in `nearest_centroid` and `segment_sum`
/// ([`Backend::with_precision`](crate::Backend::with_precision)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Precision {
    /// f32 arithmetic throughout, within the tolerances each primitive states.
    #[default]
    Exact,
    /// Matrix units on reduced-precision inputs (TF32, bf16 or f16, per backend) with f32
    /// accumulation. `matmul` may then differ from the reference by
    /// `2^-10 * k * (|a| @ |b|)` elementwise, plus `u|ref|`. `nearest_centroid` ranks the
    /// centroids with the fast distances and re-checks the best candidates in f32: the
    /// returned distance is an f32 distance to the returned centroid (within the exact mode's
    /// bound), and that centroid's reference distance is within `2^-9 (|x|^2 + |c|^2)` of the
    /// reference's minimum.
    Fast,
    /// Bit-identical results on every backend, for users who must reproduce a computation on
    /// another machine, at some cost in speed. `nearest_centroid` computes each distance from
    /// f32 loads as `acc = fma(t, t, acc)` with `t = x_k - c_k`, in order of `k` from
    /// `acc = 0`, and keeps the first strictly smaller distance (lowest index on ties), exactly
    /// as the CPU reference does. `segment_sum` adds each segment's rows in ascending row order
    /// in f32: `sums[s, k] = fma(w_i, x[i, k], sums[s, k])` and `counts[s] += w_i`, from 0.
    /// Other primitives behave as under [`Precision::Exact`].
    Reproducible,
    /// f32 products on matrix units of a narrower type with near-f32 accuracy: each operand
    /// split into a high part and a low part (`a = a_hi + a_lo`), three products
    /// (`a_hi b_hi + a_hi b_lo + a_lo b_hi`, about 22 significant bits per term) accumulated
    /// in f32. `matmul` stays within [`Precision::Exact`]'s tolerance for operands whose
    /// nonzero magnitudes lie in `[2^-14, 65504]`; smaller magnitudes may add `2^-35 |b|` per
    /// term, and operands with larger or non-finite values are multiplied exactly. Where a
    /// backend has no such path ([`Capabilities::compensated_precision`](crate::Capabilities)),
    /// and for every other primitive, it is [`Precision::Exact`].
    Compensated,
}
