//! The `gemm` and `skinny` suites: matrix products against numpy and at every precision.

use crate::cli::Args;
use crate::{json_field, run_peer, time_it};
use hal::{Backend, BackendExt, DType, Distribution, Layout, View};

/// numpy's matmul timed by python3 on this machine, or why it could not run.
pub(crate) fn numpy_gemm(n: usize, reps: usize) -> Result<(f64, String), String> {
    const SCRIPT: &str = r#"
import json, sys, time
import numpy as np
n, reps = int(sys.argv[1]), int(sys.argv[2])
rng = np.random.default_rng()
times = []
for i in range(reps + 2):
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    t = time.perf_counter(); c = a @ b; t = time.perf_counter() - t
    if i >= 2: times.append(t)
times.sort()
blas = "unknown BLAS"
try:
    cfg = np.show_config(mode="dicts")
    blas = cfg["Build Dependencies"]["blas"]["name"] + " " + str(cfg["Build Dependencies"]["blas"].get("version", ""))
except Exception:
    pass
print(json.dumps({"median": times[len(times) // 2], "what": "numpy " + np.__version__ + " (" + blas + ")"}))
"#;
    let text = run_peer(SCRIPT, &[n.to_string(), reps.to_string()], "numpy")?;
    let field = |k: &str| json_field(&text, k);
    let median = field("median")
        .and_then(|m| m.parse::<f64>().ok())
        .ok_or(format!("unreadable output: {text}"))?;
    Ok((median, field("what").unwrap_or_default()))
}

pub(crate) fn gemm<B: Backend>(
    b: &B,
    args: &Args,
    coop_tiles: Option<&dyn Fn(&str) -> bool>,
) -> hal::Result<()> {
    gemm_at(b, args, "f32", DType::F32, 1e-5)?;
    match numpy_gemm(args.gemm_size, args.reps) {
        Ok((tp, what)) => {
            let n = args.gemm_size;
            println!(
                "gemm f32 {n}^3: peer {what}: {:.2} ms, {:.1} GFLOP/s",
                tp * 1e3,
                2.0 * (n as f64).powi(3) / tp / 1e9,
            )
        }
        Err(why) => println!("gemm f32 {}^3: peer numpy not run: {why}", args.gemm_size),
    }
    let caps = b.capabilities();
    // Precision::Fast's stated bound is 2^-10 k |a||b|; the check is tighter: 2^-10 |a||b|.
    // Compensated is held to the f32 check.
    for (policy, present, tol) in [
        (hal::Precision::Fast, caps.fast_precision, 2f64.powi(-10)),
        (
            hal::Precision::Compensated,
            caps.compensated_precision,
            1e-5,
        ),
    ] {
        if present {
            let label = format!("f32 in Precision::{policy:?}");
            gemm_at(&b.with_precision(policy), args, &label, DType::F32, tol)?;
        }
    }
    if caps.f64.primitive("matmul") && caps.f64.primitive("copy") {
        // f64 in, f64 out: held to f64's bound, k u |a||b| (the check's own f64 sums err
        // as much).
        let bound = 2.0 * args.gemm_size as f64 * f64::EPSILON;
        gemm_at(b, args, "f64", DType::F64, bound)?;
    } else {
        println!("gemm f64: not run: {} runs no f64 matmul", b.info().backend);
    }
    if caps.matrix_units {
        // f16 inputs are exact in f32, so the f32 product's bound applies.
        gemm_at(b, args, "f16 inputs, f32 accumulation", DType::F16, 1e-5)?;
        for name in &args.coop_tiles {
            match coop_tiles {
                Some(set) if set(name) => gemm_at(
                    b,
                    args,
                    &format!("f16 inputs, cooperative tiles {name}"),
                    DType::F16,
                    1e-5,
                )?,
                _ => println!("gemm: tiling {name} not applicable on this backend"),
            }
        }
    }
    Ok(())
}

/// Times an `n^3` GEMM of `dtype` inputs into f32 (f64 for f64 inputs) on `b`, checked first on sampled entries
/// against float64 to `tol` of `|a| @ |b|`; prints also the normwise relative error of the
/// sampled entries.
pub(crate) fn gemm_at<B: Backend>(
    b: &B,
    args: &Args,
    label: &str,
    dtype: DType,
    tol: f64,
) -> hal::Result<()> {
    let n = args.gemm_size;
    let l = Layout::contiguous(&[n, n]);
    let out_dtype = if dtype == DType::F64 {
        DType::F64
    } else {
        DType::F32
    };
    let (x, y, out) = (
        b.alloc(dtype, n * n)?,
        b.alloc(dtype, n * n)?,
        b.alloc(out_dtype, n * n)?,
    );
    let normal = Distribution::Normal {
        mean: 0.0,
        std: 1.0,
    };
    // f64 inputs are drawn in f32 and widened (not every backend draws f64 numbers).
    let draw = if dtype == DType::F64 {
        Some(b.alloc(DType::F32, n * n)?)
    } else {
        None
    };
    let fill_random = |target: &B::Buffer, offset: u64| {
        match &draw {
            Some(tmp) => {
                b.random(View::new(tmp, &l), normal, 11, offset)
                    .expect("random");
                b.copy(View::new(tmp, &l), View::new(target, &l))
                    .expect("copy");
            }
            None => b
                .random(View::new(target, &l), normal, 11, offset)
                .expect("random"),
        };
    };
    let fresh = |i: usize| {
        fill_random(&x, (2 * i * n * n) as u64);
        fill_random(&y, ((2 * i + 1) * n * n) as u64);
        b.fill(View::new(&out, &l), f64::NAN).expect("fill"); // poison: every element must be written
        b.synchronize().expect("sync");
    };
    // Correct first: sampled entries against float64.
    fresh(0);
    b.matmul(
        View::new(&x, &l),
        View::new(&y, &l),
        View::new(&out, &l),
        1.0,
        0.0,
    )?;
    let (xs, ys, os) = (b.read_f64(&x)?, b.read_f64(&y)?, b.read_f64(&out)?);
    let mut worst = 0f64;
    let (mut err2, mut ref2) = (0f64, 0f64);
    for s in 0..256 {
        let (i, j) = ((s * 7919) % n, (s * 104_729 + 13) % n);
        let want: f64 = (0..n).map(|k| xs[i * n + k] * ys[k * n + j]).sum();
        let scale: f64 = (0..n).map(|k| (xs[i * n + k] * ys[k * n + j]).abs()).sum();
        let e = os[i * n + j] - want;
        worst = worst.max(e.abs() / scale);
        err2 += e * e;
        ref2 += want * want;
    }
    let relative = (err2 / ref2).sqrt();
    if os.iter().any(|v| v.is_nan()) || worst > tol {
        return Err(hal::Error::Backend {
            backend: "bench",
            detail: format!(
                "GEMM check failed: worst error {worst:.2e} of |a||b|, or unwritten output"
            ),
        });
    }
    let t = time_it(args.reps, fresh, || {
        b.matmul(
            View::new(&x, &l),
            View::new(&y, &l),
            View::new(&out, &l),
            1.0,
            0.0,
        )
        .expect("matmul");
        b.synchronize().expect("sync");
    });
    let flops = 2.0 * (n as f64).powi(3);
    println!(
        "gemm {label} {n}^3: {:.2} ms, {:.1} GFLOP/s (checked: worst sampled error {worst:.1e} of |a||b|; relative error {relative:.1e} against f64 on 256 sampled entries)",
        t * 1e3,
        flops / t / 1e9
    );
    Ok(())
}

/// Matrix products with few outputs and a long k (the dot-product kernel on wgpu): a
/// 4096 x 4096 matrix times a vector (bandwidth-bound: the matrix is read once), and a 64 x 64
/// output with k = 262144 (b viewed transposed, so both k strides are 1). Checked first on
/// sampled outputs against float64.
pub(crate) fn skinny<B: Backend>(b: &B, args: &Args) -> hal::Result<()> {
    for (m, n, k, what) in [
        (4096usize, 1usize, 4096usize, "matrix-vector 4096 x 4096"),
        (64, 64, 262_144, "64 x 64 output, k = 262144"),
    ] {
        let la = Layout::contiguous(&[m, k]);
        let lb = Layout::contiguous(&[n, k]).permute(&[1, 0])?;
        let lo = Layout::contiguous(&[m, n]);
        let (a, bt, out) = (
            b.alloc(DType::F32, m * k)?,
            b.alloc(DType::F32, n * k)?,
            b.alloc(DType::F32, m * n)?,
        );
        let u = Distribution::Uniform {
            low: -1.0,
            high: 1.0,
        };
        let fresh = |i: usize| {
            let base = (i * (m + n) * k) as u64;
            b.random(View::new(&a, &la), u, 11, base).expect("random");
            b.random(
                View::new(&bt, &Layout::contiguous(&[n, k])),
                u,
                11,
                base + (m * k) as u64,
            )
            .expect("random");
            b.synchronize().expect("sync");
        };
        let product = || {
            b.matmul(
                View::new(&a, &la),
                View::new(&bt, &lb),
                View::new(&out, &lo),
                1.0,
                0.0,
            )
            .expect("matmul")
        };
        fresh(0);
        product();
        let (av, bv, ov) = (
            b.read::<f32>(&a)?,
            b.read::<f32>(&bt)?,
            b.read::<f32>(&out)?,
        );
        for o in (0..m * n).step_by((m * n / 61).max(1)) {
            let (r, c) = (o / n, o % n);
            let (mut exact, mut size) = (0f64, 0f64);
            for j in 0..k {
                let t = av[r * k + j] as f64 * bv[c * k + j] as f64;
                exact += t;
                size += t.abs();
            }
            // hal's tolerance, 2^-18 k (|a| @ |b|), is loose for k this long; this is 2^-18 of
            // the sum of |terms|, tighter, and still what f32 accumulation in 32 parts meets.
            let bound = 2f64.powi(-18) * size + 2f64.powi(-24) * exact.abs();
            if (ov[o] as f64 - exact).abs() > bound {
                return Err(hal::Error::Backend {
                    backend: "bench",
                    detail: format!("{what}: output {o} is {} but float64 gives {exact}", ov[o]),
                });
            }
        }
        drop((av, bv, ov));
        let t = time_it(args.reps, fresh, || {
            product();
            b.synchronize().expect("sync");
        });
        let flops = 2.0 * (m * n * k) as f64;
        let bytes = 4.0 * ((m + n) * k + m * n) as f64;
        println!(
            "matmul f32 {what}: {:.3} ms, {:.1} GFLOP/s, {:.1} GB/s of operands (checked against float64)",
            t * 1e3,
            flops / t / 1e9,
            bytes / t / 1e9
        );
    }
    Ok(())
}
