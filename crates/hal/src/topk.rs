//! Selection: the `k` smallest (or largest) values of each row ([`crate::Backend::top_k`]),
//! the inverted-list scan of product-quantised vectors that keeps each query's `k` nearest
//! ([`crate::Backend::ivf_scan`]), with the order both select by, and the exact scores of
//! each query's candidates that a re-ranking selects from
//! ([`crate::Backend::candidate_scores`]).
//!
//! **Order.** Values are compared by IEEE 754's totalOrder ([`f32::total_cmp`]: `-NaN < -inf <
//! ... < -0 < +0 < ... < +inf < +NaN`), ties by the lower index (`top_k`) or id (`ivf_scan`).
//! So the selection is a function of the values: every backend returns the same indices, in
//! the same order, for the same input. [`order_key`] maps a value to an unsigned integer with
//! that order, as the GPU kernels compare them.
//!
//! **The scan.** For query `q` and each of its probes `p` (list `a = probes[q, p]`), every
//! member `i` of list `a` (positions `offsets[a] .. offsets[a + 1]` of `codes` and `ids`) is a
//! candidate at distance
//!
//! `bases[q, p] + sum_{j < bytes} t(j, c_ij)`, summed in f32 in order of `j`, where
//! `t(j, c) = list_tables[a, j, c] + tables[q, j, c]` (one f32 addition; `tables[q, j, c]`
//! alone without list tables) and `c_ij` is byte `j` of member `i`'s code (byte `j % 4` of word
//! `j / 4`, least significant first, of `codes[i]`).
//!
//! This is IVF-PQ search's fine step in FAISS's formulation: with `bases` the squared distance
//! `|q - a|^2` from the query to the probed anchor, list tables `|c|^2 + 2 a_j.c` and query
//! tables `-2 q_j.c`, the sum is `|q - a - c|^2`; for inner products, `bases = -q.a` and
//! tables `-q_j.c`. Each query's `k` best candidates by
//! `(distance, id)` are written nearest first; where fewer than `k` exist the rest of the row is
//! `+inf` with id `u32::MAX`. Every backend sums the same terms in the same order with no fused
//! operation, so the distances are identical everywhere (the tolerance is zero).
//!
//! **Candidate scores.** For query `r` and each of its candidates `l = labels[r, c]` (a row of
//! `vectors`, or [`NO_CANDIDATE`]), `scores[r, c] = (query_bias[r] + vector_bias[l]) + alpha *
//! (queries[r] . vectors[l])`, the dot product in f32 (any order), a missing bias counting 0,
//! f16 vectors read exactly; `+inf` for [`NO_CANDIDATE`]. With the biases `|q|^2` and `|v|^2`
//! and `alpha = -2` this is the squared distance `|q - v|^2` of an IVF search's candidates to
//! the query, which `top_k` then orders: FAISS's re-ranking (`IndexRefineFlat`) in one pass
//! over the candidates' vectors, with no gathered copy of them.

use crate::View;

/// `k` above which a GPU backend may refuse [`crate::Backend::top_k`] and
/// [`crate::Backend::ivf_scan`] with [`crate::Error::Unsupported`] (their kernels keep a row's
/// candidates in on-chip memory).
pub const GPU_MAX_K: usize = 1024;

/// The refusal of `k` above [`GPU_MAX_K`] a GPU backend (named `backend`) gives.
pub fn check_gpu_k(op: &'static str, k: usize, backend: &str) -> crate::Result<()> {
    if k > GPU_MAX_K {
        return Err(crate::Error::Unsupported {
            op,
            detail: format!(
                "k = {k}: the {backend} kernels keep at most {GPU_MAX_K} results a row on chip"
            ),
        });
    }
    Ok(())
}

/// Codewords per subspace at most: a code is one byte.
pub const MAX_CODEWORDS: usize = 256;

/// An unsigned key whose order is `total_cmp`'s on the values: the sign bit flipped for
/// positive values, every bit for negative ones.
pub fn order_key(v: f32) -> u32 {
    let b = v.to_bits();
    if b >> 31 == 1 { !b } else { b | 0x8000_0000 }
}

/// The value of an [`order_key`].
pub fn from_order_key(key: u32) -> f32 {
    f32::from_bits(if key >> 31 == 1 {
        key & 0x7fff_ffff
    } else {
        !key
    })
}

/// The operands of [`crate::Backend::ivf_scan`]; every one contiguous (offsets allowed).
/// `q` queries, `p` probes each, `lists` lists, `n` members in all, `bytes` code bytes of
/// `codewords` values each.
#[derive(Debug)]
pub struct IvfScanInputs<'a, Buf> {
    /// `[q, bytes, codewords]` f32: each query's table.
    pub tables: View<'a, Buf>,
    /// `[lists, bytes, codewords]` f32: each list's table, added to the query's; or none.
    pub list_tables: Option<View<'a, Buf>>,
    /// `[q, p]` u32: the lists each query probes (each below `lists`).
    pub probes: View<'a, Buf>,
    /// `[q, p]` f32: each probe's base distance.
    pub bases: View<'a, Buf>,
    /// `[lists + 1]` u32: list `a`'s members are positions `offsets[a] .. offsets[a + 1]`
    /// (starting at 0, never decreasing, ending at most at `n`).
    pub offsets: View<'a, Buf>,
    /// `[n, ceil(bytes / 4)]` u32: each member's code bytes, four to a word (each below
    /// `codewords`).
    pub codes: View<'a, Buf>,
    /// `[n]` u32: each member's id, what the search reports and breaks ties by.
    pub ids: View<'a, Buf>,
}

impl<Buf> Clone for IvfScanInputs<'_, Buf> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<Buf> Copy for IvfScanInputs<'_, Buf> {}

/// The label of no candidate in [`CandidateInputs::labels`] (what `ivf_scan` pads with).
pub const NO_CANDIDATE: u32 = u32::MAX;

/// The operands of [`crate::Backend::candidate_scores`]; every one contiguous (offsets
/// allowed). `q` queries of dimension `d`, `n` vectors, `c` candidates a query.
#[derive(Debug)]
pub struct CandidateInputs<'a, Buf> {
    /// `[q, d]` f32.
    pub queries: View<'a, Buf>,
    /// `[n, d]` f32 or f16.
    pub vectors: View<'a, Buf>,
    /// `[q, c]` u32: each candidate's row of `vectors`, or [`NO_CANDIDATE`].
    pub labels: View<'a, Buf>,
    /// `[q]` f32 added to each of the query's scores, or none.
    pub query_bias: Option<View<'a, Buf>>,
    /// `[n]` f32 added to each score of the vector, or none.
    pub vector_bias: Option<View<'a, Buf>>,
}

impl<Buf> Clone for CandidateInputs<'_, Buf> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<Buf> Copy for CandidateInputs<'_, Buf> {}

/// The sizes [`crate::validate::candidate_scores`] finds in [`CandidateInputs`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CandidateShape {
    pub queries: usize,
    pub candidates: usize,
    pub d: usize,
    pub n: usize,
}

/// The sizes [`crate::validate::ivf_scan`] finds in [`IvfScanInputs`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IvfScanShape {
    pub queries: usize,
    pub probes: usize,
    pub lists: usize,
    pub members: usize,
    pub bytes: usize,
    pub codewords: usize,
    /// Words per code: `ceil(bytes / 4)`.
    pub words: usize,
    pub k: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_order_values_as_total_cmp() {
        let vals = [
            f32::from_bits(0xffc0_0000), // -NaN
            f32::NEG_INFINITY,
            -1.5,
            -f32::from_bits(1),
            -0.0,
            0.0,
            f32::from_bits(1),
            2.0,
            f32::INFINITY,
            f32::NAN,
        ];
        for w in vals.windows(2) {
            assert_eq!(w[0].total_cmp(&w[1]), std::cmp::Ordering::Less);
            assert!(order_key(w[0]) < order_key(w[1]), "{} {}", w[0], w[1]);
        }
        for v in vals {
            assert_eq!(from_order_key(order_key(v)).to_bits(), v.to_bits());
        }
    }
}
