//! `vlc eval`: energy, reconstruction error, recall@10 against exact neighbours (or ground
//! truth of one's own), compression ratio and search time.

use crate::{Res, err, f32_bytes};
use std::time::Instant;
use vlc_anneal::{Index, Matrix, recall_at};

/// The `eval` report: its text and the two figures the demo checks.
pub(crate) struct Report {
    pub text: String,
    pub mse: f64,
    pub recall: f64,
}

/// Where `eval`'s queries come from.
pub(crate) enum Queries {
    /// This many of the data's vectors, spread evenly.
    Spread(usize),
    /// Queries of their own, with their true neighbours where given.
    Given {
        queries: Matrix,
        truth: Option<Vec<Vec<u32>>>,
    },
}

pub(crate) fn evaluate(
    index: &Index,
    data: &Matrix,
    queries: Queries,
    nprobe: usize,
) -> Res<Report> {
    let h = &index.header;
    if data.rows != h.n || data.cols != h.d {
        return Err(format!(
            "the data is {} x {}, the index was built from {} x {}",
            data.rows, data.cols, h.n, h.d
        ));
    }
    let (qm, given_truth) = match queries {
        Queries::Spread(count) => {
            let q = count.clamp(1, data.rows);
            let step = data.rows / q;
            let picks: Vec<f32> = (0..q).flat_map(|i| data.row(i * step).to_vec()).collect();
            let qm = Matrix {
                rows: q,
                cols: data.cols,
                data: picks,
            };
            (qm, None)
        }
        Queries::Given { queries, truth } => {
            if queries.cols != h.d {
                return Err(format!(
                    "the queries have dimension {}, the index {}",
                    queries.cols, h.d
                ));
            }
            if let Some(t) = &truth {
                check_truth(t, queries.rows, h.n)?;
            }
            (queries, truth)
        }
    };
    let q = qm.rows;
    let t = Instant::now();
    let (truth, exact_s) = match given_truth {
        Some(t) => (t, f64::NAN),
        None => {
            // Exact neighbours by the index's metric.
            let truth = vlc_anneal::exact_knn_by(data, &qm, 10, h.metric).map_err(err)?;
            (truth, t.elapsed().as_secs_f64())
        }
    };
    index.prepare_search();
    let t = Instant::now();
    let found = index.search(&qm, 10, nprobe).map_err(err)?;
    let search_s = t.elapsed().as_secs_f64();
    let recall = recall_at(&truth, &found, 10);
    let mse = index.reconstruction_mse(data);
    let exact = if exact_s.is_nan() {
        "recall against the given ground truth".to_string()
    } else {
        format!("exact search {:.3} ms per query", exact_s * 1e3 / q as f64)
    };
    let text = format!(
        "energy {:.6}\nreconstruction MSE {:.6} (per vector, sum over dimensions)\nrecall@10 {:.4} ({q} queries, nprobe {nprobe})\ncompression ratio {:.2}x ({} bytes against {} bytes of f32)\nsearch {:.3} ms per query ({exact})",
        h.energy,
        mse,
        recall,
        f32_bytes(h) / index.file_size() as f64,
        index.file_size(),
        f32_bytes(h),
        search_s * 1e3 / q as f64,
    );
    Ok(Report { text, mse, recall })
}

/// Ground truth must have a list per query, at least 10 deep, of ids of the data.
pub(crate) fn check_truth(truth: &[Vec<u32>], queries: usize, n: usize) -> Res<()> {
    if truth.len() != queries {
        return Err(format!(
            "the ground truth has {} lists for {queries} queries",
            truth.len()
        ));
    }
    for (q, list) in truth.iter().enumerate() {
        if list.len() < 10 {
            return Err(format!(
                "the ground truth lists {} neighbours for query {q}; recall@10 needs 10",
                list.len()
            ));
        }
        if let Some(&id) = list.iter().find(|&&id| id as usize >= n) {
            return Err(format!(
                "the ground truth names vector {id} for query {q}; the data has {n}"
            ));
        }
    }
    Ok(())
}
