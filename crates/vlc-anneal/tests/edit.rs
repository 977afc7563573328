//! Indexes changed without retraining: vectors added are coded as compression codes its own,
//! ids travel with their vectors through adds, removals and the file.

use backend_cpu::CpuBackend;
use vlc_anneal::{Config, Index, Matrix, compress};

fn rows(m: &Matrix, r: std::ops::Range<usize>) -> Matrix {
    Matrix::new(
        r.len(),
        m.cols,
        m.data[r.start * m.cols..r.end * m.cols].to_vec(),
    )
    .unwrap()
}

fn built(data: &Matrix) -> Index {
    let mut cfg = Config::new(12);
    cfg.pq_bytes = 4;
    cfg.iterations = 6;
    compress(&CpuBackend::new(), data, &cfg, &mut |_| {})
        .unwrap()
        .index
}

/// Added vectors go to their nearest anchor and take the codes the trained ones would: the
/// vectors of the training set, added again to an index of them, get the same assignments
/// and codes as they have, and the new ones reconstruct as well as the trained ones.
#[test]
fn added_vectors_are_coded_as_compression_codes() {
    let data = vlc_anneal::synthetic::gaussian_mixture(1600, 8, 6, 0.1, 21);
    let (train, extra) = (rows(&data, 0..1200), rows(&data, 1200..1600));
    let index = built(&train);
    let again = index
        .add(&CpuBackend::new(), &rows(&train, 0..300), None)
        .unwrap();
    assert_eq!(again.header.n, 1500);
    let mut same = 0;
    for i in 0..300 {
        if again.assignment(1200 + i) == index.assignment(i)
            && again.code(1200 + i) == index.code(i)
        {
            same += 1;
        }
    }
    // Compression's last pass coded them against these anchors and codebooks too (its anchors
    // were f32 until the end, so a few near ties may fall the other way).
    assert!(same >= 285, "{same} of 300 coded alike");
    let grown = index.add(&CpuBackend::new(), &extra, None).unwrap();
    assert_eq!((grown.header.n, grown.has_ids()), (1600, false));
    let back = grown.decompress().unwrap();
    let err = |r: std::ops::Range<usize>| -> f64 {
        r.clone()
            .map(|i| {
                back.row(i)
                    .iter()
                    .zip(data.row(i))
                    .map(|(a, b)| (*a as f64 - *b as f64).powi(2))
                    .sum::<f64>()
            })
            .sum::<f64>()
            / r.len() as f64
    };
    let (trained, added) = (err(0..1200), err(1200..1600));
    // Codebooks of 256 words fit 1,200 training residuals closely; new vectors see them as
    // unseen data does: the codes must still remove most of what the anchors leave.
    let anchor_only: f64 = (1200..1600)
        .map(|i| {
            let a = grown.anchor(grown.assignment(i) as usize);
            a.iter()
                .zip(data.row(i))
                .map(|(p, q)| (*p as f64 - *q as f64).powi(2))
                .sum::<f64>()
        })
        .sum::<f64>()
        / 400.0;
    assert!(
        added < 0.5 * anchor_only,
        "added vectors' error {added}, anchors alone {anchor_only}"
    );
    assert!(
        (grown.header.mse - (trained * 1200.0 + added * 400.0) / 1600.0).abs()
            < 1e-3 * trained.max(1e-6) + 1e-3 * grown.header.mse
    );
    // Searching for an added vector finds it.
    let hits = grown.search(&rows(&data, 1400..1410), 1, 12).unwrap();
    let found = hits
        .iter()
        .enumerate()
        .filter(|(q, h)| h[0].0 as usize == 1400 + q)
        .count();
    assert!(
        found >= 8,
        "{found} of 10 added vectors found first: {hits:?}"
    );
}

#[test]
fn ids_travel_through_adds_removals_and_the_file() {
    let data = vlc_anneal::synthetic::gaussian_mixture(500, 8, 4, 0.1, 5);
    let index = built(&rows(&data, 0..400));
    let ids: Vec<u64> = (0..400u64).map(|i| 1_000_000 + 7 * i).collect();
    let named = index.with_ids(ids.clone()).unwrap();
    assert_eq!(
        (named.id(0), named.id(399)),
        (1_000_000, 1_000_000 + 7 * 399)
    );
    // Added with ids of their own, then without: the next ids after the largest.
    let more = named
        .add(
            &CpuBackend::new(),
            &rows(&data, 400..450),
            Some(&(5u64..55).collect::<Vec<_>>()),
        )
        .unwrap();
    assert_eq!((more.id(400), more.id(449)), (5, 54));
    let rest = more
        .add(&CpuBackend::new(), &rows(&data, 450..500), None)
        .unwrap();
    assert_eq!(rest.id(450), 1_000_000 + 7 * 399 + 1);
    // Removed by id: gone from search, the others keep theirs.
    let (fewer, removed) = rest.remove(&[5, 6, 1_000_007, 424242]).unwrap();
    assert_eq!((removed, fewer.header.n), (3, 497));
    let left: Vec<u64> = (0..fewer.header.n).map(|i| fewer.id(i)).collect();
    assert!(!left.contains(&5) && !left.contains(&1_000_007) && left.contains(&7));
    assert_eq!(left[0], 1_000_000);
    let hits = fewer.search(&rows(&data, 400..402), 5, 12).unwrap();
    for h in &hits {
        for &(pos, _) in h {
            assert!(![5u64, 6].contains(&fewer.id(pos as usize)));
        }
    }
    // The file keeps them; a positional index removes by position and keeps the rest's.
    let dir = std::env::temp_dir().join(format!("vlc-edit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    fewer.save(dir.join("i.vlc")).unwrap();
    let opened = Index::open(dir.join("i.vlc")).unwrap();
    assert_eq!((0..497).map(|i| opened.id(i)).collect::<Vec<_>>(), left);
    let (p, _) = index.remove(&[0, 2]).unwrap();
    assert_eq!((p.id(0), p.id(1), p.has_ids()), (1, 3, true));
    // Bad ids and removals are refused.
    assert!(index.with_ids(vec![1, 2]).is_err());
    assert!(
        index
            .with_ids(vec![u64::MAX; 400])
            .unwrap_err()
            .to_string()
            .contains("2^63")
    );
    let all: Vec<u64> = (0..400).collect();
    assert!(
        index
            .remove(&all)
            .unwrap_err()
            .to_string()
            .contains("fewer than the 12 anchors")
    );
    assert!(
        index
            .add(
                &CpuBackend::new(),
                &Matrix::new(1, 3, vec![0.0; 3]).unwrap(),
                None
            )
            .is_err()
    );
    let none = Matrix::new(0, 8, Vec::new()).unwrap();
    let e = index.add(&CpuBackend::new(), &none, None).unwrap_err();
    assert!(e.to_string().contains("no vectors"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}
