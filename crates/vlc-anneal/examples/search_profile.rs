//! Where a batched device search's time goes: a synthetic 1M x 384 index (intrinsic dimension
//! 16, 1,024 lists, 16 bytes, vectors kept) searched on CUDA by 10,000 queries at several
//! nprobe and pools, the wall time per search (median of 5) beside, under
//! `HAL_CUDA_PROFILE=1`, the GPU time per kernel of one search.
//!
//! ```text
//! cargo run --release -p vlc-anneal --example search_profile [N]
//! HAL_CUDA_PROFILE=1 ./search_profile
//! ```

use std::time::Instant;
use vlc_anneal::{Config, Matrix, compress};

/// `n` points of a 16-d Gaussian mixture mapped linearly into 384-d.
fn data(n: usize, seed: u64) -> Matrix {
    let (r, d) = (16, 384);
    let base = vlc_anneal::synthetic::gaussian_mixture(n, r, 1024, 0.35, seed);
    let lift = vlc_anneal::synthetic::gaussian_mixture(r, d, 1, 1.0, 7);
    let mut out = vec![0f32; n * d];
    for i in 0..n {
        for k in 0..r {
            let v = base.data[i * r + k] / (r as f32).sqrt();
            for (o, l) in out[i * d..(i + 1) * d]
                .iter_mut()
                .zip(&lift.data[k * d..(k + 1) * d])
            {
                *o += v * l;
            }
        }
    }
    Matrix::new(n, d, out).expect("sizes agree")
}

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .map_or(1_000_000, |s| s.parse().expect("N"));
    let b = backend_cuda::CudaBackend::new().expect("CUDA is required");
    let (x, q) = (data(n, 1), data(10_000, 2));
    let mut cfg = Config::new(1024);
    cfg.pq_bytes = 16;
    let t = Instant::now();
    let index = compress(&b, &x, &cfg, &mut |_| {}).expect("compress").index;
    println!("compress {:.2} s", t.elapsed().as_secs_f64());
    let index = index.with_refine(&x).expect("refine");
    let search = index.device_search(&b).expect("upload").expect("codes");
    for (nprobe, pool) in [(1, 0), (16, 0), (1, 64), (16, 256)] {
        let run = || {
            search
                .search_reranked(&index, &q, 10, nprobe, pool)
                .expect("search")
        };
        run();
        let _ = b.take_profile(1);
        run();
        let profile = b.take_profile(1).expect("profile");
        let mut times: Vec<f64> = (0..5)
            .map(|_| {
                let t = Instant::now();
                run();
                t.elapsed().as_secs_f64() * 1e3
            })
            .collect();
        times.sort_by(f64::total_cmp);
        println!(
            "nprobe {nprobe} pool {pool}: {:.2} ms a search of {} ({:.0} queries/s)",
            times[2],
            q.rows,
            q.rows as f64 / times[2] * 1e3
        );
        if let Some(p) = profile {
            println!("{p}");
        }
    }
}
