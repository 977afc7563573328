//! `Index::search_batch` (matrix products for the coarse step and the query tables) and the
//! device search (`Index::device_search`: every step a backend primitive) against
//! `Index::search` (one query at a time): the same hits, distances equal up to f32 rounding,
//! for every metric, subspaces of two widths, more results than vectors and more probes than
//! lists, and queries in more than one round of products.

use vlc_anneal::{Config, Index, Matrix, Metric, compress};

fn agree(index: &Index, queries: &Matrix, k: usize, nprobe: usize) {
    let cpu = backend_cpu::CpuBackend::new();
    let many = index.search_batch(&cpu, queries, k, nprobe).unwrap();
    same_hits(index, queries, k, nprobe, &many);
    let device = index
        .device_search(&cpu)
        .unwrap()
        .expect("codes and tables");
    let found = device.search(index, queries, k, nprobe).unwrap();
    same_hits(index, queries, k, nprobe, &found);
}

/// `many` against `Index::search`'s results.
fn same_hits(index: &Index, queries: &Matrix, k: usize, nprobe: usize, many: &[Vec<(u32, f32)>]) {
    let one = index.search(queries, k, nprobe).unwrap();
    assert_eq!(one.len(), many.len());
    let (mut same, mut total) = (0usize, 0usize);
    for (a, b) in one.iter().zip(many) {
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(b) {
            let scale = x.1.abs().max(1.0);
            assert!((x.1 - y.1).abs() <= 1e-4 * scale, "{x:?} vs {y:?}");
            same += usize::from(x.0 == y.0);
            total += 1;
        }
    }
    // Ids differ only where two distances tie within rounding.
    assert!(
        same as f64 >= 0.99 * total as f64,
        "{same} of {total} ids agree"
    );
}

#[test]
fn batched_search_matches_one_query_at_a_time() {
    let cpu = backend_cpu::CpuBackend::new();
    // 30 dimensions in 8 subspaces: widths 4 and 3.
    let data = vlc_anneal::synthetic::gaussian_mixture(3000, 30, 25, 0.3, 5);
    let queries = vlc_anneal::synthetic::gaussian_mixture(300, 30, 25, 0.3, 6);
    for metric in [Metric::L2, Metric::Cosine, Metric::InnerProduct] {
        let mut cfg = Config::new(24);
        cfg.pq_bytes = 8;
        cfg.metric = metric;
        cfg.iterations = 8;
        let index = compress(&cpu, &data, &cfg, &mut |_| {}).unwrap().index;
        agree(&index, &queries, 10, 3);
        agree(&index, &queries, 10, 24);
        // More results than the probed lists hold, and more probes than lists.
        agree(&index, &queries.head(7), 5000, 40);
    }
}

#[test]
fn batched_search_spans_rounds_and_checks_its_input() {
    let cpu = backend_cpu::CpuBackend::new();
    let data = vlc_anneal::synthetic::gaussian_mixture(2000, 16, 10, 0.2, 8);
    let mut cfg = Config::new(12);
    cfg.pq_bytes = 4;
    cfg.iterations = 5;
    let index = compress(&cpu, &data, &cfg, &mut |_| {}).unwrap().index;
    // 4,500 queries: two rounds of products (4,096 a round).
    let queries = vlc_anneal::synthetic::gaussian_mixture(4500, 16, 10, 0.2, 9);
    agree(&index, &queries, 4, 2);
    let wrong = Matrix::new(1, 15, vec![0.0; 15]).unwrap();
    let e = index
        .search_batch(&cpu, &wrong, 4, 2)
        .unwrap_err()
        .to_string();
    assert!(e.contains("dimension"), "{e}");
    let e = index
        .search_batch(&cpu, &queries, 4, 0)
        .unwrap_err()
        .to_string();
    assert!(e.contains("nprobe"), "{e}");
    let huge = Matrix::new(1, 16, vec![1e30; 16]).unwrap();
    assert!(index.search_batch(&cpu, &huge, 4, 2).is_err());
    // The device search: the same checks, and a search structure of another index refused.
    let device = index.device_search(&cpu).unwrap().unwrap();
    for bad in [&wrong, &huge] {
        assert!(device.search(&index, bad, 4, 2).is_err());
    }
    assert!(device.search(&index, &queries, 4, 0).is_err());
    let mut other_cfg = Config::new(12);
    other_cfg.pq_bytes = 4;
    let other = compress(&cpu, &data.head(500), &other_cfg, &mut |_| {})
        .unwrap()
        .index;
    let e = device
        .search(&other, &queries, 4, 2)
        .unwrap_err()
        .to_string();
    assert!(e.contains("another index"), "{e}");
}
