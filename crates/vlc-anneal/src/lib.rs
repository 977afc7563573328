//! # vlc-anneal: compressed embedding indexes by annealed, robust k-means
//!
//! Compresses a set of embedding vectors into an index of
//! - **anchors** (`m` cluster centres, stored as f16), found by k-means++ seeding and an
//!   annealing loop with Huber-weighted (outlier-robust) updates, momentum, a cooling
//!   temperature, and maintenance (merging close anchors, splitting overloaded ones along
//!   their principal direction, re-seeding empty ones) — see [`anneal()`];
//! - **assignments**: each vector's anchor, bit-packed in `ceil(log2 m)` bits;
//! - **residual codes**: the vector minus its anchor, product-quantised into a configurable
//!   number of bytes ([`pq`]);
//!
//! [`compress_sharded`] does the same with the vectors split over the devices of a
//! [`hal::Communicator`] (`sharded.rs`; the loop's part in `anneal/sharded.rs`),
//! so that every vector can be reconstructed, and searched without decompression
//! ([`Index::search`]: probe the nearest anchors, score their members by asymmetric distance).
//! The index file format is documented in [`index`]; it is memory-mapped on load.
//!
//! Every per-point step runs on a [`hal::Backend`]; the crate depends on `hal` only (the `vlc`
//! binary in `crates/vlc-cli` picks the backend). [`Mode::Exact`] gives identical results on
//! CPU, wgpu and CUDA (on a wgpu adapter with `shader-f64`: the k-means++ race keys are
//! computed in f64 so that backends' f32 logarithms cannot split a near-tie; see
//! [`hal::Backend::kmeans_pp`]).
//!
//! ```
//! use vlc_anneal::{Config, Matrix, compress};
//! let backend = backend_cpu::CpuBackend::new();
//! let data = vlc_anneal::synthetic::gaussian_mixture(2000, 16, 20, 0.1, 7);
//! let mut cfg = Config::new(32);
//! cfg.pq_bytes = 4;
//! let out = compress(&backend, &data, &cfg, &mut |_| {}).unwrap();
//! assert!(out.index.reconstruction_mse(&data) < out.clustering.energy);
//! let hits = out.index.search(&data.head(3), 5, 4).unwrap();
//! assert_eq!(hits[0].len(), 5);
//! ```

pub mod anneal;
mod error;
pub mod index;
pub mod metric;
pub mod pq;
mod sharded;
pub mod synthetic;
pub mod vectors;

pub use anneal::{Clustering, Config, IterationReport, Mode, anneal, anneal_sharded};
pub use error::{Error, Result};
pub use index::{Header, Index, IndexParts, exact_knn, exact_knn_by, recall_at};
pub use metric::Metric;
pub use sharded::{compress_sharded, search_sharded};
pub use vectors::{Matrix, MatrixRef};

use hal::{Backend, BackendExt};
use std::time::Instant;

/// A compression's products and timings.
pub struct Compressed {
    pub index: Index,
    pub clustering: Clustering,
    /// Seconds: seeding, annealing (after seeding), residual coding, total.
    pub seconds: Timings,
}

#[derive(Clone, Copy, Debug, Default)]
pub struct Timings {
    pub seeding: f64,
    pub annealing: f64,
    pub coding: f64,
    pub total: f64,
}

/// What [`compress`] reports as it goes: each phase as it begins (`seeding`, `annealing`,
/// `coding`) with its number of steps (0 where it is one step, as seeding is), each annealing
/// iteration (as [`Config::report_each_iteration`] asks: live, or in batches), and the
/// coding's steps as they finish.
#[derive(Clone, Copy, Debug)]
pub enum Progress<'a> {
    Phase {
        name: &'static str,
        steps: usize,
    },
    Iteration(&'a IterationReport),
    /// Steps of the current phase done so far.
    Step(usize),
}

/// Compresses `data`: anneals the anchors, rounds them to f16, codes each vector's residual
/// to its rounded anchor, and returns the index (in memory; [`Index::save`] writes it).
pub fn compress<B: Backend>(
    backend: &B,
    data: &Matrix,
    cfg: &Config,
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<Compressed> {
    compress_rows(backend, data.view(), cfg, progress)
}

/// [`compress`] of borrowed rows (a caller's array, checked by [`MatrixRef::new`]): the
/// vectors are not copied on the host unless the metric changes them (cosine), so a GPU
/// compression holds the caller's array and the device's copy, not a third.
pub fn compress_rows<B: Backend>(
    backend: &B,
    data: MatrixRef<'_>,
    cfg: &Config,
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<Compressed> {
    cfg.check(data.rows, data.cols)?;
    cfg.check_codes(data.cols)?;
    // A cosine index compresses the unit vectors.
    let unit = cfg.metric.normalised(data)?;
    let data = unit.as_ref().map_or(data, Matrix::view);
    let start = Instant::now();
    let b = anneal::handle_for(backend, cfg.mode);
    progress(Progress::Phase {
        name: "seeding",
        steps: 0,
    });
    let (clustering, state) =
        anneal::anneal_on_device(&b, data, cfg, &mut annealing_reports(cfg, progress))?;
    let annealed = start.elapsed().as_secs_f64();
    let (n, d) = (data.rows, data.cols);
    let anchors16 = round_anchors(&clustering.anchors)?;
    let (pq, codes, squared_error) = if cfg.pq_bytes > 0 {
        // Residuals to the anchors as stored (f16), from the vectors and assignment still on
        // the device.
        let rounded: Vec<f32> = anchors16.iter().map(|v| v.to_f32()).collect();
        let a = b.upload(&rounded)?;
        let src = pq::Residuals {
            x: &state.pass.x,
            anchors: &a,
            assign: &state.pass.assign,
            n,
            d,
        };
        progress(Progress::Phase {
            name: "coding",
            steps: cfg.pq_iterations,
        });
        let (pq, coded) = pq::learn(
            &b,
            &src,
            &clustering.assignments,
            cfg.pq_bytes,
            cfg.pq_iterations,
            cfg.pq_train_rows,
            cfg.seed,
            &mut |done| progress(Progress::Step(done)),
        )?;
        let (codes, squared_error) = match coded {
            Some(coded) => coded,
            None => pq.code_all(&b, &src)?,
        };
        (pq, codes, Some(squared_error))
    } else {
        let pq = pq::ProductQuantizer {
            dim: d,
            codewords: 0,
            bounds: vec![0],
            codebooks: Vec::new(),
        };
        (pq, Vec::new(), None)
    };
    let coded = start.elapsed().as_secs_f64();
    let squared_error = match squared_error {
        Some(e) => e,
        None => reconstruction_error(data, &anchors16, &clustering.assignments),
    };
    let index = assemble(
        cfg,
        (n, d),
        clustering.energy,
        Coded {
            anchors: anchors16,
            assignments: clustering.assignments.clone(),
            pq,
            codes,
            squared_error,
        },
    )?;
    Ok(Compressed::timed(index, clustering, start, annealed, coded))
}

/// The annealing loop's reports as [`Progress`]: the `annealing` phase announced with the
/// first (which follows seeding and, batched, some iterations), then each iteration.
pub(crate) fn annealing_reports<'p>(
    cfg: &Config,
    progress: &'p mut dyn FnMut(Progress<'_>),
) -> impl FnMut(&IterationReport) + 'p {
    let (mut announced, steps) = (false, cfg.iterations);
    move |r| {
        if !announced {
            announced = true;
            progress(Progress::Phase {
                name: "annealing",
                steps,
            });
        }
        progress(Progress::Iteration(r))
    }
}

impl Compressed {
    /// The products, with the phases' times from the marks taken since `start`.
    pub(crate) fn timed(
        index: Index,
        clustering: Clustering,
        start: Instant,
        annealed: f64,
        coded: f64,
    ) -> Compressed {
        Compressed {
            index,
            seconds: Timings {
                seeding: clustering.seeding_seconds,
                annealing: annealed - clustering.seeding_seconds,
                coding: coded - annealed,
                total: start.elapsed().as_secs_f64(),
            },
            clustering,
        }
    }
}

/// The anchors rounded to f16 as the index stores them; an error where one does not fit.
pub(crate) fn round_anchors(anchors: &Matrix) -> Result<Vec<half::f16>> {
    let anchors16: Vec<half::f16> = anchors
        .data
        .iter()
        .map(|&v| half::f16::from_f32(v))
        .collect();
    if anchors16.iter().any(|v| !v.is_finite()) {
        return Err(error::input(
            "an anchor does not fit in f16 (|value| > 65504): scale the vectors down",
        ));
    }
    Ok(anchors16)
}

/// The sum over `data`'s rows of the squared distance to their (f16) anchor: the error of an
/// index without residual codes (each difference in f32, as the index's own count takes it,
/// squared and summed in f64).
pub(crate) fn reconstruction_error(
    data: MatrixRef<'_>,
    anchors: &[half::f16],
    assign: &[u32],
) -> f64 {
    let d = data.cols;
    let anchors: Vec<f32> = anchors.iter().map(|v| v.to_f32()).collect();
    data.data
        .chunks_exact(d.max(1))
        .zip(assign)
        .map(|(x, &a)| {
            let c = &anchors[a as usize * d..(a as usize + 1) * d];
            x.iter()
                .zip(c)
                .map(|(&v, &w)| ((v - w) as f64).powi(2))
                .sum::<f64>()
        })
        .sum()
}

/// What a compression's coding produced, whole: the index's contents but its header.
pub(crate) struct Coded {
    pub anchors: Vec<half::f16>,
    pub assignments: Vec<u32>,
    pub pq: pq::ProductQuantizer,
    pub codes: Vec<u8>,
    /// Summed over the vectors (the header keeps its mean).
    pub squared_error: f64,
}

/// The index of `n x d` vectors compressed as `cfg` says.
pub(crate) fn assemble(
    cfg: &Config,
    (n, d): (usize, usize),
    energy: f64,
    c: Coded,
) -> Result<Index> {
    let m = cfg.anchors;
    let parts = IndexParts {
        header: Header {
            n,
            d,
            m,
            pq_bytes: cfg.pq_bytes,
            codewords: c.pq.codewords,
            assignment_bits: index::assignment_bits(m),
            exact: cfg.mode == Mode::Exact,
            seed: cfg.seed,
            iterations: cfg.iterations as u32,
            energy,
            mse: c.squared_error / n.max(1) as f64,
            metric: cfg.metric,
        },
        anchors: c.anchors,
        assignments: c.assignments,
        pq: c.pq,
        codes: c.codes,
        ids: None,
        refine: None,
    };
    Index::from_bytes(parts.to_bytes(), "(new index)")
}

/// `out[r, ...] = src[index[first + r], ...]`: whole rows (of any rank) picked by a `u32`
/// index buffer, read from `first` on and broadcast along each row; `out`'s shape says how
/// many rows and how much of each.
pub(crate) fn gather_rows<B: Backend>(
    b: &B,
    src: hal::View<'_, B::Buffer>,
    index: &B::Buffer,
    first: usize,
    out: hal::View<'_, B::Buffer>,
) -> Result<()> {
    let shape = out.layout.shape.clone();
    let mut strides = vec![0isize; shape.len()];
    strides[0] = 1;
    let pick = hal::Layout {
        shape,
        strides,
        offset: first,
    };
    Ok(b.gather(src, 0, hal::View::new(index, &pick), out)?)
}

/// The first `k` of a seeded Fisher-Yates shuffle of `0..n`: `k` distinct indices.
pub(crate) fn partial_shuffle(n: usize, k: usize, seed: u64) -> Vec<usize> {
    let k = k.min(n);
    let mut order: Vec<usize> = (0..n).collect();
    let mut state = seed;
    for i in 0..k {
        state = splitmix(state);
        let j = i + (state % (n - i) as u64) as usize;
        order.swap(i, j);
    }
    order.truncate(k);
    order
}

/// SplitMix64: the seeded mixing function behind every host-side random choice.
pub(crate) fn splitmix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}
