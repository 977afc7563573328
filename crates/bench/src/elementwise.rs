//! The `elementwise` suite: add and f16 traffic against memcpy and a device copy.

use crate::cli::Args;
use crate::{DeviceCopy, time_it};
use hal::{Backend, BackendExt, BinaryOp, DType, Distribution, Layout, View};
use std::time::Instant;

pub(crate) fn elementwise<B: Backend>(
    b: &B,
    args: &Args,
    device_copy: DeviceCopy<'_, B>,
) -> hal::Result<()> {
    let n = args.elements;
    let bytes = (n * 4) as f64;
    let (copy_bw, par_bw, threads) = memcpy_bounds(n, args.reps);

    let ops = AddOperands::new(b, DType::F32, n, 5)?;
    let (x, y, out, l) = (&ops.x, &ops.y, &ops.out, &ops.l);
    ops.fresh(0);
    b.fill(View::new(out, l), f64::NAN)?;
    ops.add();
    let (xs, ys, os) = (b.read::<f32>(x)?, b.read::<f32>(y)?, b.read::<f32>(out)?);
    if (0..n).any(|i| os[i] != xs[i] + ys[i]) {
        return Err(hal::Error::Backend {
            backend: "bench",
            detail: "elementwise add check failed".into(),
        });
    }
    drop((xs, ys, os));
    let t = time_it(
        args.reps,
        |i| ops.fresh(i),
        || {
            ops.add();
            b.synchronize().expect("sync");
        },
    );
    let bw = 3.0 * bytes / t;
    println!(
        "add f32 {}M: {:.2} ms, {:.2} GB/s read+write = {:.0}% of plain memcpy, {:.0}% of {threads}-thread memcpy (checked exactly)",
        n >> 20,
        t * 1e3,
        bw / 1e9,
        100.0 * bw / copy_bw,
        100.0 * bw / par_bw
    );
    let t_batch = ops.back_to_back(args.reps);
    println!(
        "add f32 {}M, 10 back to back, one wait: {:.3} ms each, {:.2} GB/s read+write",
        n >> 20,
        t_batch * 1e3,
        3.0 * bytes / t_batch / 1e9
    );
    elementwise_f16(b, args)?;
    if let Some(copy) = device_copy {
        // For reference: the driver's own buffer-to-buffer copy (read + write counted). Not a
        // bound: on NVIDIA through Vulkan it runs slower than our add kernel.
        copy(x, out)?;
        b.synchronize()?;
        let t_dev = time_it(
            args.reps,
            |_| {},
            || {
                copy(x, out).expect("device copy");
                b.synchronize().expect("sync");
            },
        );
        println!(
            "driver buffer copy {} MiB (reference, not a bound): {:.3} ms, {:.1} GB/s read+write",
            (n * 4) >> 20,
            t_dev * 1e3,
            2.0 * bytes / t_dev / 1e9
        );
    }
    round_trip(b, args.reps)
}

/// The host's copy bandwidth for `n` f32 (read + write counted), as bounds for the add: a
/// plain memcpy, and the same copy split across every hardware thread (the stricter bound).
/// Returns both and the thread count, after printing them.
fn memcpy_bounds(n: usize, reps: usize) -> (f64, f64, usize) {
    let bytes = (n * 4) as f64;
    let src: Vec<f32> = (0..n).map(|i| (i % 1000) as f32).collect();
    let mut dst = vec![0f32; n];
    let t_copy = time_it(reps, |_| {}, || dst.copy_from_slice(&src));
    let threads = std::thread::available_parallelism().map_or(1, |t| t.get());
    let t_par = time_it(
        reps,
        |_| {},
        || {
            let chunk = n.div_ceil(threads);
            std::thread::scope(|sc| {
                for (d, s) in dst.chunks_mut(chunk).zip(src.chunks(chunk)) {
                    sc.spawn(move || d.copy_from_slice(s));
                }
            });
        },
    );
    std::hint::black_box(&dst);
    let copy_bw = 2.0 * bytes / t_copy;
    let par_bw = 2.0 * bytes / t_par;
    println!(
        "memcpy {} MiB (plain, one call): {:.2} ms, {:.2} GB/s read+write",
        (n * 4) >> 20,
        t_copy * 1e3,
        copy_bw / 1e9
    );
    println!(
        "memcpy {} MiB ({threads} threads): {:.2} ms, {:.2} GB/s read+write",
        (n * 4) >> 20,
        t_par * 1e3,
        par_bw / 1e9
    );
    (copy_bw, par_bw, threads)
}

/// Latency: one tiny dispatch, submitted and waited for; then its two halves.
fn round_trip<B: Backend>(b: &B, reps: usize) -> hal::Result<()> {
    let one = b.alloc(DType::F32, 1)?;
    let l1 = Layout::contiguous(&[1]);
    let samples = |mut f: Box<dyn FnMut() -> f64 + '_>| {
        let mut v: Vec<f64> = (0..reps.max(101) + 5).map(|_| f()).skip(5).collect();
        v.sort_by(f64::total_cmp);
        (v[v.len() / 2], v[0], v[v.len() * 9 / 10])
    };
    let trip = samples(Box::new(|| {
        let t = Instant::now();
        b.fill(View::new(&one, &l1), 1.0).expect("fill");
        b.synchronize().expect("sync");
        t.elapsed().as_secs_f64()
    }));
    let submit = samples(Box::new(|| {
        let t = Instant::now();
        b.fill(View::new(&one, &l1), 1.0).expect("fill");
        let e = t.elapsed().as_secs_f64();
        b.synchronize().expect("sync");
        e
    }));
    let wait = samples(Box::new(|| {
        b.fill(View::new(&one, &l1), 1.0).expect("fill");
        std::thread::sleep(std::time::Duration::from_millis(1));
        let t = Instant::now();
        b.synchronize().expect("sync");
        t.elapsed().as_secs_f64()
    }));
    println!(
        "round trip of a 1-element dispatch (submit + wait): {:.1} us median (min {:.1}, p90 {:.1}); submit alone {:.1} us, wait for finished work {:.1} us",
        trip.0 * 1e6,
        trip.1 * 1e6,
        trip.2 * 1e6,
        submit.0 * 1e6,
        wait.0 * 1e6
    );
    Ok(())
}

/// Elementwise add on f16 storage (f32 arithmetic, one rounding), back to back: the 16-bit
/// load and store path. Checked exactly against f16(f32(x) + f32(y)).
pub(crate) fn elementwise_f16<B: Backend>(b: &B, args: &Args) -> hal::Result<()> {
    let n = args.elements;
    let ops = AddOperands::new(b, DType::F16, n, 7)?;
    ops.fresh(0);
    ops.add();
    let halves = |buf: &B::Buffer| -> hal::Result<Vec<half::f16>> {
        Ok(b.read_bytes(buf)?
            .chunks(2)
            .map(|c| half::f16::from_le_bytes([c[0], c[1]]))
            .collect())
    };
    let (xs, ys, os) = (halves(&ops.x)?, halves(&ops.y)?, halves(&ops.out)?);
    if (0..n).any(|i| os[i] != half::f16::from_f32(xs[i].to_f32() + ys[i].to_f32())) {
        return Err(hal::Error::Backend {
            backend: "bench",
            detail: "f16 add check failed".into(),
        });
    }
    drop((xs, ys, os));
    let t = ops.back_to_back(args.reps);
    println!(
        "add f16 {}M, 10 back to back, one wait: {:.3} ms each, {:.2} GB/s read+write (checked exactly)",
        n >> 20,
        t * 1e3,
        3.0 * 2.0 * n as f64 / t / 1e9
    );
    Ok(())
}

/// The operands of the add benchmarks: `out = x + y` over `n` contiguous elements of one
/// dtype, `x` and `y` drawn afresh (uniform in [-1, 1), seeded) before each timed run.
struct AddOperands<'a, B: Backend> {
    b: &'a B,
    x: B::Buffer,
    y: B::Buffer,
    out: B::Buffer,
    l: Layout,
    seed: u64,
}

impl<'a, B: Backend> AddOperands<'a, B> {
    fn new(b: &'a B, dtype: DType, n: usize, seed: u64) -> hal::Result<Self> {
        Ok(AddOperands {
            b,
            x: b.alloc(dtype, n)?,
            y: b.alloc(dtype, n)?,
            out: b.alloc(dtype, n)?,
            l: Layout::contiguous(&[n]),
            seed,
        })
    }

    /// New random `x` and `y` for run `i`, waited for (outside any timed region).
    fn fresh(&self, i: usize) {
        let (n, u) = (
            self.l.numel(),
            Distribution::Uniform {
                low: -1.0,
                high: 1.0,
            },
        );
        for (k, buf) in [&self.x, &self.y].into_iter().enumerate() {
            let at = ((2 * i + k) * n) as u64;
            self.b
                .random(View::new(buf, &self.l), u, self.seed, at)
                .expect("random");
        }
        self.b.synchronize().expect("sync");
    }

    fn add(&self) {
        let v = |buf| View::new(buf, &self.l);
        self.b
            .binary(BinaryOp::Add, v(&self.x), v(&self.y), v(&self.out))
            .expect("add")
    }

    /// Median seconds per add of ten adds submitted back to back with one wait: the
    /// kernel's own throughput, per-call waiting excluded.
    fn back_to_back(&self, reps: usize) -> f64 {
        time_it(
            reps,
            |i| self.fresh(i),
            || {
                for _ in 0..10 {
                    self.add();
                }
                self.b.synchronize().expect("sync");
            },
        ) / 10.0
    }
}
