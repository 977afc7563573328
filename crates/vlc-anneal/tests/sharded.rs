//! Annealing over points split between the ranks of a group (the CPU reference's threads):
//! every rank ends with the same anchors, the energy is the whole set's, and the run follows
//! one device's on the same points from the same seeds.

use backend_cpu::{CpuBackend, CpuCommunicator};
use vlc_anneal::synthetic::gaussian_mixture;
use vlc_anneal::{
    Config, Matrix, Metric, Mode, anneal, anneal_sharded, compress, compress_sharded,
    search_sharded,
};

fn rows(m: &Matrix, range: std::ops::Range<usize>) -> Matrix {
    Matrix::new(
        range.len(),
        m.cols,
        m.data[range.start * m.cols..range.end * m.cols].to_vec(),
    )
    .unwrap()
}

/// Runs `f(rank, communicator)` on a thread per rank of a CPU group of `size`; the results
/// in rank order.
fn on_ranks<T: Send>(size: usize, f: impl Fn(usize, &CpuCommunicator) -> T + Sync) -> Vec<T> {
    let group = CpuCommunicator::group(size).unwrap();
    let f = &f;
    std::thread::scope(|s| {
        let hs: Vec<_> = group
            .into_iter()
            .enumerate()
            .map(|(rank, comm)| s.spawn(move || f(rank, &comm)))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// The mean squared distance from each point to its nearest anchor, in f64 on the host.
fn energy(data: &Matrix, anchors: &Matrix) -> f64 {
    let d = data.cols;
    let mut total = 0.0;
    for p in data.data.chunks(d) {
        let best = anchors
            .data
            .chunks(d)
            .map(|a| {
                p.iter()
                    .zip(a)
                    .map(|(x, y)| ((x - y) as f64).powi(2))
                    .sum::<f64>()
            })
            .fold(f64::INFINITY, f64::min);
        total += best;
    }
    total / data.rows as f64
}

fn config() -> Config {
    let mut cfg = Config::new(24);
    cfg.iterations = 20;
    cfg.maintain_every = 0;
    cfg
}

#[test]
fn three_ranks_agree_and_cluster_as_well_as_one_device() {
    // More points than the seeding sample (8,192 for 24 anchors): the sample's rows come
    // from every shard.
    let data = gaussian_mixture(9001, 12, 24, 0.05, 5);
    let cuts = [0..4000, 4000..6100, 6100..9001];
    let results = on_ranks(3, |rank, comm| {
        let shard = rows(&data, cuts[rank].clone());
        anneal_sharded(comm, &shard, &config(), &mut |_| {}).unwrap()
    });
    for r in &results[1..] {
        assert_eq!(
            r.anchors.data, results[0].anchors.data,
            "the ranks' anchors differ"
        );
        assert_eq!(r.energy, results[0].energy);
    }
    for (r, range) in results.iter().zip(cuts) {
        assert_eq!(r.assignments.len(), range.len());
    }
    // The reported energy is the whole set's, for the anchors the ranks hold.
    let host = energy(&data, &results[0].anchors);
    assert!(
        (results[0].energy - host).abs() <= 1e-4 * host,
        "reported {} against {host} recomputed",
        results[0].energy
    );
    // From the same seeds (the sample a single device draws), one device reaches the same
    // clustering up to the order of its sums.
    let alone = anneal(&CpuBackend::new(), &data, &config(), &mut |_| {}).unwrap();
    println!("sharded {} alone {}", results[0].energy, alone.energy);
    assert!(
        (results[0].energy - alone.energy).abs() <= 1e-4 * alone.energy,
        "sharded {} against one device's {}",
        results[0].energy,
        alone.energy
    );
    let worst = results[0]
        .anchors
        .data
        .iter()
        .zip(&alone.anchors.data)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(worst < 1e-4, "anchors differ by {worst}");
}

#[test]
fn shards_that_disagree_are_refused() {
    let data = gaussian_mixture(400, 6, 4, 0.1, 1);
    let outcomes = on_ranks(2, |rank, comm| {
        // Rank 1's vectors have another dimension.
        let shard = if rank == 0 {
            rows(&data, 0..200)
        } else {
            Matrix::new(100, 12, vec![0.5; 1200]).unwrap()
        };
        anneal_sharded(comm, &shard, &config(), &mut |_| {}).err()
    });
    for e in outcomes {
        let e = e.expect("a rank accepted shards of different dimensions");
        assert!(e.to_string().contains("dimensions differ"), "{e}");
    }
}

#[test]
fn exact_mode_split_over_ranks_gives_one_devices_anchors_bit_for_bit() {
    // More points than the seeding sample, cut unevenly.
    let data = gaussian_mixture(9001, 12, 24, 0.05, 8);
    let cuts = [0..3000, 3000..3001, 3001..9001];
    let mut cfg = config();
    cfg.mode = Mode::Exact;
    let results = on_ranks(3, |rank, comm| {
        let shard = rows(&data, cuts[rank].clone());
        anneal_sharded(comm, &shard, &cfg, &mut |_| {}).unwrap()
    });
    let alone = anneal(&CpuBackend::new(), &data, &cfg, &mut |_| {}).unwrap();
    for (r, range) in results.iter().zip(cuts) {
        let bits = |m: &Matrix| m.data.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(
            bits(&r.anchors),
            bits(&alone.anchors),
            "anchors differ from one device's"
        );
        assert_eq!(r.energy, alone.energy);
        assert_eq!(r.assignments, alone.assignments[range]);
    }
}

#[test]
fn a_sharded_compression_gives_every_rank_the_whole_index() {
    let data = gaussian_mixture(5003, 16, 30, 0.05, 9);
    let cuts = [0..2600, 2600..5003];
    let mut cfg = config();
    cfg.pq_bytes = 4;
    let outs = on_ranks(2, |rank, comm| {
        let shard = rows(&data, cuts[rank].clone());
        compress_sharded(comm, &shard, &cfg, &mut |_| {}).unwrap()
    });
    let dir = std::env::temp_dir().join(format!("vlc-sharded-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let files: Vec<Vec<u8>> = outs
        .iter()
        .enumerate()
        .map(|(r, o)| {
            let path = dir.join(format!("rank{r}.vlc"));
            o.index.save(&path).unwrap();
            std::fs::read(&path).unwrap()
        })
        .collect();
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(files[0], files[1], "the ranks' indexes differ");
    let index = &outs[0].index;
    assert_eq!(index.header.n, 5003);
    // Rows in rank order: each rank's assignments where its rows are.
    for (out, range) in outs.iter().zip(cuts) {
        let held: Vec<u32> = range.map(|i| index.assignment(i)).collect();
        assert_eq!(held, out.clustering.assignments);
    }
    // The codes belong to their rows: the index's own error is the recount on the data.
    let mse = index.reconstruction_mse(&data);
    assert!(
        (mse - index.header.mse).abs() <= 1e-5 * mse,
        "{mse} against {}",
        index.header.mse
    );
    assert!(
        mse < outs[0].clustering.energy,
        "the codes did not help: {mse}"
    );
    // It searches: each of the first vectors finds itself.
    let hits = index.search(&data.head(5), 1, 8).unwrap();
    for (i, h) in hits.iter().enumerate() {
        assert_eq!(h[0].0, i as u32, "vector {i} found {:?}", h[0]);
    }
}

#[test]
fn an_index_split_over_ranks_searches_as_the_whole_one() {
    let data = gaussian_mixture(6007, 16, 40, 0.05, 3);
    let queries = gaussian_mixture(37, 16, 40, 0.05, 99);
    // Inner products order the other way (largest first): the merge must follow.
    for metric in [Metric::L2, Metric::InnerProduct, Metric::Cosine] {
        let mut cfg = Config::new(40);
        cfg.pq_bytes = 4;
        cfg.metric = metric;
        split_search_matches(&data, &queries, &cfg);
    }
}

fn split_search_matches(data: &Matrix, queries: &Matrix, cfg: &Config) {
    let cpu = CpuBackend::new();
    let whole = compress(&cpu, data, cfg, &mut |_| {}).unwrap().index;
    let whole = whole.with_refine(data).unwrap();
    let device = whole.device_search(&cpu).unwrap().expect("a device search");
    let larger = cfg.metric == Metric::InnerProduct;
    for candidates in [0, 40] {
        let expected = device
            .search_reranked(&whole, queries, 10, 6, candidates)
            .unwrap();
        let results = on_ranks(3, |rank, comm| {
            let shard = whole.shard(rank, 3).unwrap();
            search_sharded(comm, &shard, queries, 10, 6, candidates).unwrap()
        });
        for r in &results {
            assert_eq!(r, &results[0], "the ranks' merged results differ");
        }
        for (q, (got, want)) in results[0].iter().zip(&expected).enumerate() {
            let want: Vec<(u64, f32)> = want.iter().map(|&(i, d)| (i as u64, d)).collect();
            if candidates == 0 {
                assert_eq!(got, &want, "{:?}, query {q}", cfg.metric);
            } else {
                // Each rank re-ranks its own pool: their union holds the whole index's pool,
                // so every rank of the results is at least as near.
                assert_eq!(got.len(), want.len());
                for (j, (g, w)) in got.iter().zip(&want).enumerate() {
                    let as_near = if larger { g.1 >= w.1 } else { g.1 <= w.1 };
                    assert!(
                        as_near,
                        "{:?}, query {q}, result {j}: {g:?} against {w:?}",
                        cfg.metric
                    );
                }
            }
        }
    }
}

#[test]
fn a_rank_with_no_points_takes_part() {
    let data = gaussian_mixture(3001, 8, 10, 0.05, 2);
    let cuts = [0..0, 0..3001];
    for mode in [Mode::Fast, Mode::Exact] {
        let mut cfg = config();
        cfg.mode = mode;
        let results = on_ranks(2, |rank, comm| {
            let shard = rows(&data, cuts[rank].clone());
            anneal_sharded(comm, &shard, &cfg, &mut |_| {})
        });
        let alone = anneal(&CpuBackend::new(), &data, &cfg, &mut |_| {}).unwrap();
        for r in results {
            let r = r.unwrap();
            assert_eq!(r.anchors.data, alone.anchors.data, "{mode:?}");
        }
    }
}

#[test]
fn coding_on_the_device_matches_coding_from_the_host() {
    use hal::BackendExt;
    let cpu = CpuBackend::new();
    let data = gaussian_mixture(3001, 20, 12, 0.1, 6);
    let mut cfg = Config::new(12);
    cfg.pq_bytes = 6;
    let index = compress(&cpu, &data, &cfg, &mut |_| {}).unwrap().index;
    let pq = index.parts().pq;
    // Residuals of the vectors to their anchors, as the coder sees them.
    let mut residuals = data.data.clone();
    for (i, r) in residuals.chunks_mut(20).enumerate() {
        for (v, a) in r.iter_mut().zip(index.anchor(index.assignment(i) as usize)) {
            *v -= a;
        }
    }
    let (host, host_error) = pq.encode(&cpu, &residuals, 3001).unwrap();
    let on_device = cpu.upload(&residuals).unwrap();
    let (device, device_error) = pq.encode_on_device(&cpu, &on_device, 3001).unwrap();
    assert_eq!(host, device);
    assert!((host_error - device_error).abs() <= 1e-6 * host_error);
}
