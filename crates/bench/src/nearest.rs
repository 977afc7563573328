//! The `nearest` suite: nearest-centroid search at every precision.

use crate::cli::Args;
use crate::time_it;
use hal::{Backend, BackendExt, DType, Distribution, Layout, View};

/// Nearest-centroid search: `points` x `dim` against `centroids`, fresh uniform data each run.
/// Checked first on sampled rows against a float64 brute force (the chosen centroid must be
/// within the hal tolerance of the best, the distance within it of the exact one).
pub(crate) fn nearest<B: Backend>(b: &B, args: &Args) -> hal::Result<()> {
    let (n, m, d) = (args.points, args.centroids, args.dim);
    let (xl, cl, ol) = (
        Layout::contiguous(&[n, d]),
        Layout::contiguous(&[m, d]),
        Layout::contiguous(&[n]),
    );
    let (x, c) = (b.alloc(DType::F32, n * d)?, b.alloc(DType::F32, m * d)?);
    let (idx, dist) = (b.alloc(DType::U32, n)?, b.alloc(DType::F32, n)?);
    let uniform = Distribution::Uniform {
        low: -1.0,
        high: 1.0,
    };
    let fresh = |i: usize| {
        let base = (i * (n + m) * d) as u64;
        b.random(View::new(&x, &xl), uniform, 5, base)
            .expect("random");
        b.random(View::new(&c, &cl), uniform, 5, base + (n * d) as u64)
            .expect("random");
        b.fill(View::new(&dist, &ol), f64::NAN).expect("fill");
        b.synchronize().expect("sync");
    };
    let search = || {
        b.nearest_centroid(
            View::new(&x, &xl),
            View::new(&c, &cl),
            View::new(&idx, &ol),
            View::new(&dist, &ol),
        )
    };
    fresh(0);
    search()?;
    let (xs, cs) = (b.read::<f32>(&x)?, b.read::<f32>(&c)?);
    let (is, ds) = (b.read::<u32>(&idx)?, b.read::<f32>(&dist)?);
    let exact = |i: usize, j: usize| -> f64 {
        (0..d)
            .map(|k| (xs[i * d + k] as f64 - cs[j * d + k] as f64).powi(2))
            .sum()
    };
    let norm = |v: &[f32], i: usize| -> f64 { (0..d).map(|k| (v[i * d + k] as f64).powi(2)).sum() };
    let cmax = (0..m).map(|j| norm(&cs, j)).fold(0.0, f64::max);
    let mut worst = 0f64;
    for s in 0..256.min(n) {
        let i = (s * 7919 + 17) % n;
        let best = (0..m).map(|j| exact(i, j)).fold(f64::INFINITY, f64::min);
        let j = is[i] as usize;
        let chosen = if j < m { exact(i, j) } else { f64::INFINITY };
        let tol = 2f64.powi(-16) * (norm(&xs, i) + cmax);
        worst = worst.max((chosen - best).max((ds[i] as f64 - chosen).abs()) / tol);
    }
    if worst > 1.0 || ds.iter().any(|v| v.is_nan()) {
        return Err(hal::Error::Backend {
            backend: "bench",
            detail: format!(
                "nearest-centroid check failed: worst {worst:.2} of the tolerance, or unwritten output"
            ),
        });
    }
    drop((xs, cs, is, ds));
    let t = time_it(args.reps, fresh, || {
        search().expect("nearest_centroid");
        b.synchronize().expect("sync");
    });
    println!(
        "nearest centroid {n} x {d} vs {m}: {:.2} ms, {:.1} GFLOP/s of distance work (checked 256 rows: worst {worst:.2} of the tolerance)",
        t * 1e3,
        2.0 * (n * m * d) as f64 / t / 1e9
    );
    if b.capabilities().fast_precision {
        let fast = b.with_precision(hal::Precision::Fast);
        let search_fast = || {
            fast.nearest_centroid(
                View::new(&x, &xl),
                View::new(&c, &cl),
                View::new(&idx, &ol),
                View::new(&dist, &ol),
            )
        };
        // Agreement with the exact assignments on the same data.
        fresh(1);
        search()?;
        let exact_idx = b.read::<u32>(&idx)?;
        search_fast()?;
        let fast_idx = b.read::<u32>(&idx)?;
        let same = exact_idx
            .iter()
            .zip(&fast_idx)
            .filter(|(a, b)| a == b)
            .count();
        let t_fast = time_it(args.reps, fresh, || {
            search_fast().expect("nearest_centroid");
            b.synchronize().expect("sync");
        });
        println!(
            "nearest centroid {n} x {d} vs {m}, Precision::Fast: {:.2} ms, {:.1} GFLOP/s; assignments equal to exact mode on {:.4}% of points",
            t_fast * 1e3,
            2.0 * (n * m * d) as f64 / t_fast / 1e9,
            100.0 * same as f64 / n as f64
        );
    }
    Ok(())
}
