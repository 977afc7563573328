//! How an index compares vectors: squared Euclidean distance, cosine distance (most sentence
//! embeddings are compared by cosine), or inner product.
//!
//! A cosine index is an L2 index of the vectors scaled to unit length: for unit vectors
//! `|a - b|^2 = 2 (1 - cos(a, b))`, so the nearest by L2 are the nearest by cosine. Its
//! vectors are normalised before compression, its queries before search, and its search
//! reports the cosine distance `1 - cos`; its reconstructions are unit-length vectors.
//!
//! An inner-product index clusters and codes the vectors as an L2 index does (as FAISS's
//! `IndexIVFPQ` with `METRIC_INNER_PRODUCT`), but probes the anchors with the largest `q . a`
//! and scores each member by `q . (anchor + decoded residual)`: search reports that inner
//! product, largest first.

use crate::error::{Result, input};
use crate::vectors::{Matrix, MatrixRef};
use std::borrow::Cow;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Metric {
    /// Squared Euclidean distance.
    #[default]
    L2,
    /// `1 - cos(a, b)`.
    Cosine,
    /// `a . b`, the larger the nearer.
    InnerProduct,
}

impl Metric {
    /// The code stored in an index header.
    pub fn code(self) -> u32 {
        match self {
            Metric::L2 => 0,
            Metric::Cosine => 1,
            Metric::InnerProduct => 2,
        }
    }

    pub fn from_code(code: u32) -> Option<Self> {
        match code {
            0 => Some(Metric::L2),
            1 => Some(Metric::Cosine),
            2 => Some(Metric::InnerProduct),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Metric::L2 => "l2",
            Metric::Cosine => "cosine",
            Metric::InnerProduct => "ip",
        }
    }

    /// `x` as this metric compares it: unchanged for L2 and inner product (borrowed), each
    /// row scaled to unit length for cosine. A row of zeros has no direction: an error naming
    /// it.
    pub fn prepare(self, x: &Matrix) -> Result<Cow<'_, Matrix>> {
        Ok(match self.normalised(x.view())? {
            Some(unit) => Cow::Owned(unit),
            None => Cow::Borrowed(x),
        })
    }

    /// [`Self::prepare`] of borrowed rows: `None` where the metric takes them as they are,
    /// otherwise the unit vectors.
    pub fn normalised(self, x: MatrixRef<'_>) -> Result<Option<Matrix>> {
        match self {
            Metric::L2 | Metric::InnerProduct => Ok(None),
            Metric::Cosine => {
                let mut out = x.to_matrix();
                for (i, row) in out.data.chunks_exact_mut(x.cols.max(1)).enumerate() {
                    let norm = row.iter().map(|&v| v as f64 * v as f64).sum::<f64>().sqrt();
                    if norm == 0.0 || !norm.is_finite() {
                        return Err(input(format!(
                            "vector {i} has length {norm}: cosine distance needs a direction"
                        )));
                    }
                    row.iter_mut().for_each(|v| *v = (*v as f64 / norm) as f32);
                }
                Ok(Some(out))
            }
        }
    }

    /// What search reports for the score it ranks by (smallest first): a squared L2
    /// distance between prepared vectors, or for inner product its negation.
    pub fn reported(self, score: f32) -> f32 {
        match self {
            Metric::L2 => score,
            Metric::Cosine => 0.5 * score,
            Metric::InnerProduct => -score,
        }
    }

    /// The distance that pads a row of results past the hits found: worse than any reported
    /// (`inf`, or `-inf` for inner product, which reports the largest first).
    pub fn unfound(self) -> f32 {
        match self {
            Metric::InnerProduct => f32::NEG_INFINITY,
            _ => f32::INFINITY,
        }
    }
}

impl std::str::FromStr for Metric {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "l2" => Ok(Metric::L2),
            "cosine" => Ok(Metric::Cosine),
            "ip" => Ok(Metric::InnerProduct),
            other => Err(format!("metric {other}: use l2, cosine or ip")),
        }
    }
}
