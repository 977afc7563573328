//! Re-ranking with the vectors an index keeps beside its codes: with every vector as a
//! candidate it is exact search (over the f16 vectors), with a pool it lifts recall past what
//! the codes reach, the vectors travel through files, adds and removals, and misuse is an
//! error.

use backend_cpu::CpuBackend;
use half::f16;
use vlc_anneal::{Config, Index, Matrix, Metric, compress, recall_at};

fn data(n: usize, seed: u64) -> Matrix {
    vlc_anneal::synthetic::gaussian_mixture(n, 24, 16, 0.3, seed)
}

fn built(data: &Matrix, metric: Metric, bytes: usize) -> Index {
    let mut cfg = Config::new(20);
    cfg.pq_bytes = bytes;
    cfg.iterations = 6;
    cfg.metric = metric;
    compress(&CpuBackend::new(), data, &cfg, &mut |_| {})
        .unwrap()
        .index
}

/// `x` as the metric prepares it (unit rows for cosine), each value rounded through f16 when
/// `round` (what the index keeps).
fn prepared(x: &Matrix, metric: Metric, round: bool) -> Matrix {
    let mut p = metric.prepare(x).unwrap().into_owned();
    if round {
        p.data
            .iter_mut()
            .for_each(|v| *v = f16::from_f32(*v).to_f32());
    }
    p
}

/// The metric's score of a query and a vector in f64 (smallest first): the squared distance,
/// or minus the inner product.
fn score(metric: Metric, q: &[f32], v: &[f32]) -> f64 {
    match metric {
        Metric::InnerProduct => -q
            .iter()
            .zip(v)
            .map(|(&a, &b)| a as f64 * b as f64)
            .sum::<f64>(),
        _ => q
            .iter()
            .zip(v)
            .map(|(&a, &b)| (a as f64 - b as f64).powi(2))
            .sum(),
    }
}

/// What search reports for a score.
fn reported(metric: Metric, s: f64) -> f64 {
    match metric {
        Metric::L2 => s,
        Metric::Cosine => 0.5 * s,
        Metric::InnerProduct => -s,
    }
}

/// Brute force over the kept (f16) vectors: each query's `k` best scores, in order.
fn truth(index_data: &Matrix, queries: &Matrix, metric: Metric, k: usize) -> Vec<Vec<f64>> {
    let (v, q) = (
        prepared(index_data, metric, true),
        prepared(queries, metric, false),
    );
    (0..q.rows)
        .map(|i| {
            let mut s: Vec<f64> = (0..v.rows)
                .map(|j| score(metric, q.row(i), v.row(j)))
                .collect();
            s.sort_by(f64::total_cmp);
            s.truncate(k);
            s
        })
        .collect()
}

#[test]
fn reranking_every_vector_is_exact_search() {
    let seed = hal_parity::fresh_seed("VLC_SEED");
    eprintln!("data seed {seed} (VLC_SEED={seed} repeats it)");
    let (x, queries) = (data(1500, seed), data(60, seed + 1));
    for metric in [Metric::L2, Metric::Cosine, Metric::InnerProduct] {
        let index = built(&x, metric, 4).with_refine(&x).unwrap();
        let kept = prepared(&x, metric, true);
        let q = prepared(&queries, metric, false);
        let m = index.header.m;
        let got = index
            .search_reranked(&CpuBackend::new(), &queries, 10, m, x.rows)
            .unwrap();
        let want = truth(&x, &queries, metric, 10);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.len(), 10, "{metric:?} query {i}");
            for (c, (&(v, dist), &best)) in g.iter().zip(w).enumerate() {
                // The hit is (one of) the c-th nearest, and its distance is its own.
                let own = score(metric, q.row(i), kept.row(v as usize));
                let tol = 1e-5 * (1.0 + best.abs());
                assert!(
                    (own - best).abs() <= tol,
                    "{metric:?} query {i} rank {c}: vector {v} scores {own}, the {c}-th best is {best}"
                );
                let rep = reported(metric, own);
                assert!(
                    (dist as f64 - rep).abs() <= 1e-5 * (1.0 + rep.abs()),
                    "{metric:?} query {i}: distance {dist} reported for {rep}"
                );
            }
        }
    }
}

#[test]
fn reranking_a_pool_lifts_recall_and_matches_the_device_path() {
    let seed = hal_parity::fresh_seed("VLC_SEED");
    eprintln!("data seed {seed} (VLC_SEED={seed} repeats it)");
    let (x, queries) = (data(4000, seed), data(200, seed + 1));
    let cpu = CpuBackend::new();
    let index = built(&x, Metric::L2, 2).with_refine(&x).unwrap();
    let truth = vlc_anneal::exact_knn(&x, &queries, 10);
    let plain = index.search_batch(&cpu, &queries, 10, 10).unwrap();
    let reranked = index.search_reranked(&cpu, &queries, 10, 10, 200).unwrap();
    let (r0, r1) = (
        recall_at(&truth, &plain, 10),
        recall_at(&truth, &reranked, 10),
    );
    eprintln!("recall@10: codes {r0:.3}, re-ranked {r1:.3}");
    assert!(
        r1 >= 0.9 && r1 > r0 + 0.3,
        "re-ranking 200 candidates: recall {r1} (codes alone {r0})"
    );
    // The device path (here the CPU backend's) against the host's.
    let device = index.device_search(&cpu).unwrap().unwrap();
    for (k, pool) in [(10, 200), (10, 10), (5, 1100)] {
        let got = device
            .search_reranked(&index, &queries, k, 10, pool)
            .unwrap();
        let want = index.search_reranked(&cpu, &queries, k, 10, pool).unwrap();
        let mut same = 0;
        for (g, w) in got.iter().zip(&want) {
            assert_eq!(g.len(), w.len());
            for (a, b) in g.iter().zip(w) {
                assert!(
                    (a.1 - b.1).abs() <= 1e-4 * b.1.abs().max(1.0),
                    "{a:?} vs {b:?}"
                );
                same += usize::from(a.0 == b.0);
            }
        }
        assert!(
            same * 100 >= 99 * k * queries.rows,
            "k {k} pool {pool}: {same} agree"
        );
    }
}

#[test]
fn refine_vectors_travel_through_files_adds_and_removals() {
    let x = data(1200, 5);
    let (train, extra) = (
        Matrix::new(1000, x.cols, x.data[..1000 * x.cols].to_vec()).unwrap(),
        Matrix::new(200, x.cols, x.data[1000 * x.cols..].to_vec()).unwrap(),
    );
    let plain = built(&train, Metric::L2, 4);
    let index = plain.with_refine(&train).unwrap();
    assert!(index.has_refine() && !plain.has_refine());
    assert!(index.file_size() >= plain.file_size() + 2 * 1000 * x.cols);
    let dir = std::env::temp_dir().join(format!("vlc_refine_{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("i.vlc");
    index.save(&path).unwrap();
    let loaded = Index::open(&path).unwrap();
    assert!(loaded.has_refine());
    let cpu = CpuBackend::new();
    let m = loaded.header.m;
    // Added vectors are kept too: each is its own nearest, at distance 0 up to f16.
    let grown = loaded.add(&cpu, &extra, None).unwrap();
    assert!(grown.has_refine());
    let hits = grown
        .search_reranked(&cpu, &extra, 1, m, grown.header.n)
        .unwrap();
    for (i, h) in hits.iter().enumerate() {
        assert!(h[0].1 <= 1e-3, "added vector {i}: nearest at {:?}", h[0]);
    }
    // Removed vectors are gone from the results; the rest keep their own vectors.
    let gone: Vec<u64> = (0..600).collect();
    let (shrunk, removed) = grown.remove(&gone).unwrap();
    assert_eq!(removed, 600);
    let again = shrunk
        .search_reranked(&cpu, &extra, 1, m, shrunk.header.n)
        .unwrap();
    for (i, h) in again.iter().enumerate() {
        assert_eq!(shrunk.id(h[0].0 as usize), 1000 + i as u64);
        assert!(h[0].1 <= 1e-3);
    }
    assert!(!grown.without_refine().unwrap().has_refine());
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn misuse_is_an_error() {
    let x = data(800, 9);
    let plain = built(&x, Metric::L2, 4);
    let cpu = CpuBackend::new();
    let q = data(5, 10);
    let err = |r: vlc_anneal::Result<Vec<Vec<(u32, f32)>>>| r.unwrap_err().to_string();
    assert!(err(plain.search_reranked(&cpu, &q, 5, 4, 50)).contains("keeps"));
    let found = plain.search(&q, 5, 4).unwrap();
    assert!(err(plain.rerank(&q, &found, 5)).contains("keeps"));
    let short = Matrix::new(10, x.cols, x.data[..10 * x.cols].to_vec()).unwrap();
    assert!(plain.with_refine(&short).is_err());
    let mut huge = x.clone();
    huge.data[7] = 1e6;
    let e = plain.with_refine(&huge).unwrap_err().to_string();
    assert!(e.contains("f16"), "{e}");
    let index = plain.with_refine(&x).unwrap();
    let beyond = vec![vec![(800u32, 0.0f32)]; 5];
    assert!(err(index.rerank(&q, &beyond, 5)).contains("beyond"));
    assert!(err(index.rerank(&q, &found[..3], 5)).contains("candidate lists"));
    let device = index.device_search(&cpu).unwrap().unwrap();
    assert!(device.search_reranked(&plain, &q, 5, 4, 50).is_err());
    // A damaged refine section is refused when read.
    let mut parts = index.parts();
    parts.refine.as_mut().unwrap()[3] = f16::NAN;
    let e = Index::from_bytes(parts.to_bytes(), "nan")
        .unwrap_err()
        .to_string();
    assert!(e.contains("non-finite"), "{e}");
    parts.refine.as_mut().unwrap().pop();
    let e = Index::from_bytes(parts.to_bytes(), "short")
        .unwrap_err()
        .to_string();
    assert!(e.contains("section 7"), "{e}");
}

/// Edge sizes: k = 0, a pool past the vectors, one query, on the host and the device path.
#[test]
fn edge_sizes_answer_sensibly() {
    let x = data(300, 11);
    let index = built(&x, Metric::L2, 4).with_refine(&x).unwrap();
    let cpu = CpuBackend::new();
    let device = index.device_search(&cpu).unwrap().unwrap();
    let q = data(3, 12);
    for (k, pool) in [(0, 10), (5, 5000), (5, 1)] {
        let host = index.search_reranked(&cpu, &q, k, 4, pool).unwrap();
        let dev = device.search_reranked(&index, &q, k, 4, pool).unwrap();
        assert_eq!(host.len(), 3);
        for (h, d) in host.iter().zip(&dev) {
            assert_eq!(h.len(), d.len(), "k {k} pool {pool}");
            assert!(h.len() <= k);
        }
    }
    let one = Matrix::new(1, x.cols, x.data[..x.cols].to_vec()).unwrap();
    let hit = device.search_reranked(&index, &one, 1, 20, 300).unwrap();
    assert_eq!(hit[0][0].0, 0);
}

/// `search_rows` (queries read in place) gives what `search_reranked` gives, for every metric,
/// and a slice that is not whole rows is an error.
#[test]
fn rows_in_place_search_as_a_matrix_does() {
    let x = data(900, 13);
    let q = data(40, 14);
    let cpu = CpuBackend::new();
    for metric in [Metric::L2, Metric::Cosine, Metric::InnerProduct] {
        let index = built(&x, metric, 4).with_refine(&x).unwrap();
        let device = index.device_search(&cpu).unwrap().unwrap();
        for pool in [0, 50] {
            let a = device.search_reranked(&index, &q, 7, 5, pool).unwrap();
            let b = device.search_rows(&index, &q.data, 7, 5, pool).unwrap();
            assert_eq!(a, b, "{metric:?} pool {pool}");
        }
        assert!(device.search_rows(&index, &q.data[..30], 7, 5, 0).is_err());
        assert_eq!(device.search_rows(&index, &[], 7, 5, 0).unwrap().len(), 0);
        let mut bad = q.data.clone();
        bad[5] = f32::NAN;
        assert!(device.search_rows(&index, &bad, 7, 5, 0).is_err());
        assert!(device.search_rows(&index, &q.data, 7, 0, 0).is_err());
    }
}
