//! The algorithm on the CPU backend: determinism, robustness, search quality.

use vlc_anneal::{Config, Matrix, anneal, compress, exact_knn, recall_at};

#[test]
fn a_seed_gives_the_same_result_twice_and_the_energy_falls() {
    let cpu = backend_cpu::CpuBackend::new();
    let data = vlc_anneal::synthetic::gaussian_mixture(3000, 24, 40, 0.2, 5);
    let cfg = Config::new(48);
    let a = anneal(&cpu, &data, &cfg, &mut |_| {}).unwrap();
    let b = anneal(&cpu, &data, &cfg, &mut |_| {}).unwrap();
    assert_eq!(a.assignments, b.assignments);
    assert_eq!(a.anchors, b.anchors);
    let first = a.history[0].energy;
    assert!(
        a.energy < 0.8 * first,
        "energy {} after seeding {first}",
        a.energy
    );
    // Assignments are consistent with the anchors returned.
    for i in (0..data.rows).step_by(97) {
        let d = |j: usize| -> f32 {
            data.row(i)
                .iter()
                .zip(a.anchors.row(j))
                .map(|(x, c)| (x - c) * (x - c))
                .sum()
        };
        let best = (0..48).map(d).fold(f32::INFINITY, f32::min);
        assert!(d(a.assignments[i] as usize) <= best * (1.0 + 1e-5) + 1e-6);
    }
    let mut other = cfg.clone();
    other.seed = 99;
    let c = anneal(&cpu, &data, &other, &mut |_| {}).unwrap();
    assert_ne!(
        c.anchors, a.anchors,
        "a different seed gives different anchors"
    );
}

#[test]
fn huber_weights_keep_an_anchor_away_from_outliers() {
    // One anchor; 990 points near the origin and 10 far out along x. The plain mean moves 1.0
    // toward the outliers; the Huber-weighted one much less.
    let mut data = Vec::new();
    for i in 0..1000 {
        let far = i % 100 == 0;
        let jitter = ((i * 37) % 11) as f32 * 0.01 - 0.05;
        data.extend_from_slice(&[if far { 100.0 } else { jitter }, jitter, -jitter]);
    }
    let data = Matrix::new(1000, 3, data).unwrap();
    let cpu = backend_cpu::CpuBackend::new();
    let mut cfg = Config::new(1);
    cfg.iterations = 30;
    cfg.maintain_every = 0;
    cfg.temperature = (1.0, 1.0);
    cfg.momentum = 0.0;
    cfg.polish_huber = cfg.huber;
    let robust = anneal(&cpu, &data, &cfg, &mut |_| {}).unwrap();
    cfg.huber = 1e6;
    cfg.polish_huber = 1e6;
    let plain = anneal(&cpu, &data, &cfg, &mut |_| {}).unwrap();
    let (rx, px) = (robust.anchors.data[0], plain.anchors.data[0]);
    assert!((px - 1.0).abs() < 0.01, "plain mean x {px}");
    assert!(rx < 0.5, "Huber-weighted x {rx}");
}

#[test]
fn search_finds_most_true_neighbours() {
    let cpu = backend_cpu::CpuBackend::new();
    let data = vlc_anneal::synthetic::gaussian_mixture(4000, 32, 30, 0.3, 8);
    let mut cfg = Config::new(64);
    cfg.pq_bytes = 16;
    let out = compress(&cpu, &data, &cfg, &mut |_| {}).unwrap();
    let queries = data.head(100);
    let truth = exact_knn(&data, &queries, 10);
    // Each query is in the data: its own index comes first in the truth.
    assert!(truth.iter().enumerate().all(|(i, t)| t[0] == i as u32));
    let all_lists = out.index.search(&queries, 10, 64).unwrap();
    let recall = recall_at(&truth, &all_lists, 10);
    assert!(recall > 0.6, "recall@10 {recall} probing every anchor");
    let few = recall_at(&truth, &out.index.search(&queries, 10, 4).unwrap(), 10);
    assert!(
        few <= recall + 1e-9 && few > 0.3,
        "recall@10 {few} with 4 probes"
    );
    assert!(
        out.index
            .search(&Matrix::new(1, 3, vec![0.0; 3]).unwrap(), 10, 4)
            .is_err()
    );
}

#[test]
fn real_embeddings_compress() {
    let cpu = backend_cpu::CpuBackend::new();
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("data");
    let glove = Matrix::load(dir.join("glove-sample.npy")).unwrap();
    let mut cfg = Config::new(64);
    cfg.pq_bytes = 10;
    cfg.iterations = 10;
    let out = compress(&cpu, &glove, &cfg, &mut |_| {}).unwrap();
    let ratio = (glove.rows * glove.cols * 4) as f64 / out.index.file_size() as f64;
    assert!(ratio > 5.0, "ratio {ratio}");
    assert!(out.index.header.mse < out.clustering.energy);
}

#[test]
fn maintenance_frees_and_reseeds_duplicate_anchors() {
    // Eight distinct points, 100 copies each, and ten anchors: k-means++ must put the last two
    // on top of others (every distance is 0 by then), which leaves them empty or coincident;
    // maintenance merges or frees them and re-seeds them, and the run stays consistent.
    let distinct: Vec<[f32; 4]> = (0..8)
        .map(|i| [i as f32, (i * i) as f32 * 0.5, -(i as f32), 1.0])
        .collect();
    let mut data = Vec::new();
    for r in 0..800 {
        data.extend_from_slice(&distinct[r % 8]);
    }
    let data = Matrix::new(800, 4, data).unwrap();
    let cpu = backend_cpu::CpuBackend::new();
    let mut cfg = Config::new(10);
    cfg.iterations = 10;
    cfg.maintain_every = 2;
    let out = anneal(&cpu, &data, &cfg, &mut |_| {}).unwrap();
    let fixed: usize = out
        .history
        .iter()
        .map(|r| r.merged + r.reseeded + r.split)
        .sum();
    assert!(fixed > 0, "no maintenance happened: {:?}", out.history);
    assert!(
        out.energy.is_finite() && out.energy < 1e-9,
        "energy {}",
        out.energy
    );
    assert!(out.assignments.iter().all(|&a| a < 10));
}

/// The exact search (the recall ground truth) returns what a full scan sorted by (distance,
/// index) gives: small-integer vectors make every distance exact and leave ties at the k-th
/// place; also by inner product, with fewer rows than `k`, and with no queries.
#[test]
fn exact_knn_is_a_full_scan_in_index_order() {
    let (d, rows, nq, k) = (24usize, 250usize, 70usize, 10usize);
    let int = |i: usize| (((i * 2_654_435_761) >> 7) % 7) as f32 - 3.0;
    let data = Matrix::new(rows, d, (0..rows * d).map(int).collect()).unwrap();
    let queries = Matrix::new(nq, d, (0..nq * d).map(|i| int(i + 12_345)).collect()).unwrap();
    let reference = |score: &dyn Fn(&[f32], &[f32]) -> f64, data: &Matrix, k: usize| {
        (0..nq)
            .map(|q| {
                let mut all: Vec<(f64, u32)> = (0..data.rows)
                    .map(|i| (score(queries.row(q), data.row(i)), i as u32))
                    .collect();
                all.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
                all.into_iter()
                    .take(k)
                    .map(|(_, i)| i)
                    .collect::<Vec<u32>>()
            })
            .collect::<Vec<_>>()
    };
    let l2 = |a: &[f32], b: &[f32]| -> f64 {
        a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum()
    };
    let ip = |a: &[f32], b: &[f32]| -> f64 {
        -a.iter().zip(b).map(|(x, y)| (x * y) as f64).sum::<f64>()
    };
    let truth = exact_knn(&data, &queries, k);
    assert_eq!(truth, reference(&l2, &data, k));
    // The data exercises the tie order: some query's k-th and next distances are equal.
    let tied = (0..nq).any(|q| {
        let mut dist: Vec<f64> = (0..rows).map(|i| l2(queries.row(q), data.row(i))).collect();
        dist.sort_by(f64::total_cmp);
        dist[k - 1] == dist[k]
    });
    assert!(tied, "no query has a tie at the k-th place");
    let by_ip =
        vlc_anneal::exact_knn_by(&data, &queries, k, vlc_anneal::Metric::InnerProduct).unwrap();
    assert_eq!(by_ip, reference(&ip, &data, k));
    let few = Matrix::new(5, d, data.data[..5 * d].to_vec()).unwrap();
    let short = exact_knn(&few, &queries, k);
    assert!(short.iter().all(|t| t.len() == 5));
    assert_eq!(short, reference(&l2, &few, k));
    let none = Matrix::new(0, d, Vec::new()).unwrap();
    assert!(exact_knn(&data, &none, k).is_empty());
}
