//! Cosine indexes: scale-invariant search that finds the nearest vectors by cosine and reports
//! `1 - cos`, the metric kept in the file, and the inputs cosine cannot take.

use vlc_anneal::{Config, Index, Matrix, Metric, compress, exact_knn, recall_at};

/// `n x d` vectors whose directions cluster and whose lengths vary 100-fold.
fn scaled(n: usize, d: usize, seed: u64) -> Matrix {
    let mut m = vlc_anneal::synthetic::gaussian_mixture(n, d, 8, 0.1, seed);
    for (i, row) in m.data.chunks_exact_mut(d).enumerate() {
        let s = 0.1 + 10.0 * ((i * 7919 + seed as usize) % 97) as f32 / 97.0;
        row.iter_mut().for_each(|v| *v *= s);
    }
    m
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum();
    let na: f64 = a.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    dot / (na * nb)
}

fn build(data: &Matrix, metric: Metric) -> Index {
    let mut cfg = Config::new(16);
    cfg.pq_bytes = 8;
    cfg.iterations = 8;
    cfg.metric = metric;
    compress(&backend_cpu::CpuBackend::new(), data, &cfg, &mut |_| {})
        .unwrap()
        .index
}

#[test]
fn cosine_search_is_scale_invariant_and_reports_one_minus_cos() {
    let data = scaled(1500, 16, 3);
    let index = build(&data, Metric::Cosine);
    assert_eq!(index.header.metric, Metric::Cosine);
    // Queries at other lengths: the same results.
    let queries = scaled(40, 16, 11);
    let mut longer = queries.clone();
    longer.data.iter_mut().for_each(|v| *v *= 37.0);
    let found = index.search(&queries, 10, 16).unwrap();
    let again = index.search(&longer, 10, 16).unwrap();
    for (a, b) in found.iter().zip(&again) {
        let ids = |h: &Vec<(u32, f32)>| h.iter().map(|p| p.0).collect::<Vec<_>>();
        assert_eq!(ids(a), ids(b));
        for (x, y) in a.iter().zip(b) {
            assert!((x.1 - y.1).abs() < 1e-5, "{x:?} {y:?}");
        }
    }
    // Nearest by cosine: recall against the exact cosine neighbours.
    let unit = |m: &Matrix| Metric::Cosine.prepare(m).unwrap().into_owned();
    let truth = exact_knn(&unit(&data), &unit(&queries), 10);
    let recall = recall_at(&truth, &found, 10);
    assert!(recall > 0.8, "cosine recall@10 {recall}");
    // An L2 index of the same vectors ranks by length as well: far lower recall.
    let l2 = build(&data, Metric::L2).search(&queries, 10, 16).unwrap();
    assert!(recall_at(&truth, &l2, 10) < recall - 0.2);
    // Distances are half the squared distance from the unit query to the reconstruction:
    // 1 - cos up to the code's error.
    let back = index.decompress().unwrap();
    let unit_queries = unit(&queries);
    for (q, hits) in found.iter().enumerate() {
        for &(i, d) in hits.iter().take(3) {
            let r = back.row(i as usize);
            let half: f64 = unit_queries
                .row(q)
                .iter()
                .zip(r)
                .map(|(a, b)| (*a as f64 - *b as f64).powi(2))
                .sum::<f64>()
                / 2.0;
            assert!(
                (d as f64 - half).abs() < 1e-4,
                "query {q} vector {i}: {d} vs {half}"
            );
            let cos = 1.0 - cosine(queries.row(q), data.row(i as usize));
            assert!(
                (d as f64 - cos).abs() < 0.15,
                "query {q} vector {i}: {d} vs 1 - cos {cos}"
            );
        }
    }
    // Reconstructions are unit vectors, and their error is measured against unit vectors.
    let norm: f64 = back
        .row(5)
        .iter()
        .map(|v| (*v as f64).powi(2))
        .sum::<f64>()
        .sqrt();
    assert!((norm - 1.0).abs() < 0.05, "{norm}");
    let mse = index.reconstruction_mse(&data);
    assert!(
        mse < 0.05 && (mse - index.header.mse).abs() < 1e-3 * (1.0 + mse),
        "{mse}"
    );
}

#[test]
fn the_metric_survives_the_file_and_bad_inputs_are_refused() {
    let data = scaled(400, 8, 5);
    let index = build(&data, Metric::Cosine);
    let dir = std::env::temp_dir().join(format!("vlc-metric-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("c.vlc");
    index.save(&path).unwrap();
    assert_eq!(Index::open(&path).unwrap().header.metric, Metric::Cosine);
    // An unknown metric code (checksum resealed) is a format error.
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[60..64].copy_from_slice(&7u32.to_le_bytes());
    let end = bytes.len();
    let crc = crc32fast::hash(&bytes[..end - 8]);
    bytes[end - 8..end - 4].copy_from_slice(&crc.to_le_bytes());
    let e = Index::from_bytes(bytes, "t")
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(e.contains("metric 7"), "{e}");
    // A zero vector has no direction: refused by name, to compress and as a query.
    let mut zero = data.clone();
    zero.data[3 * 8..4 * 8].iter_mut().for_each(|v| *v = 0.0);
    let mut cfg = Config::new(4);
    cfg.metric = Metric::Cosine;
    let e = compress(&backend_cpu::CpuBackend::new(), &zero, &cfg, &mut |_| {})
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(e.contains("vector 3"), "{e}");
    let e = index.search(&zero.head(5), 3, 2).unwrap_err().to_string();
    assert!(e.contains("vector 3"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// An inner-product index reports `q . reconstruction`, largest first, and finds the largest
/// inner products (recall against the exact ones), which an L2 index of the same vectors
/// (lengths varying 100-fold) does not.
#[test]
fn inner_product_search_finds_the_largest_products() {
    let data = scaled(1500, 16, 7);
    let index = build(&data, Metric::InnerProduct);
    assert_eq!(index.header.metric, Metric::InnerProduct);
    let queries = scaled(40, 16, 13);
    let found = index.search(&queries, 10, 16).unwrap();
    let back = index.decompress().unwrap();
    for (q, hits) in found.iter().enumerate() {
        for pair in hits.windows(2) {
            assert!(
                pair[0].1 >= pair[1].1,
                "query {q}: not largest first {hits:?}"
            );
        }
        for &(i, s) in hits {
            let want: f64 = queries
                .row(q)
                .iter()
                .zip(back.row(i as usize))
                .map(|(a, b)| *a as f64 * *b as f64)
                .sum();
            assert!(
                (s as f64 - want).abs() <= 1e-4 * (1.0 + want.abs()),
                "query {q}: {s} vs {want}"
            );
        }
    }
    let truth = vlc_anneal::exact_knn_by(&data, &queries, 10, Metric::InnerProduct).unwrap();
    let recall = recall_at(&truth, &found, 10);
    assert!(recall > 0.7, "inner-product recall@10 {recall}");
    let l2 = build(&data, Metric::L2).search(&queries, 10, 16).unwrap();
    assert!(
        recall_at(&truth, &l2, 10) < recall - 0.2,
        "L2 ranks the same"
    );
}
