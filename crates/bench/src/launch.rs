//! The `launch` and `memory` suites: launch overhead, recorded replays, memory over time.

use crate::cli::Args;
use crate::{Hooks, time_it};
use hal::{Backend, BackendExt, BinaryOp, DType, Distribution, Layout, View};
use std::time::Instant;

/// Launch overhead: an empty kernel launched back to back (where the backend exposes one),
/// and a sequence of 50 small kernels (1024-element adds) launched one by one against the
/// same sequence recorded once and replayed, each waited for.
pub(crate) fn launch<B: Backend>(b: &B, args: &Args, hooks: &Hooks<'_, B>) -> hal::Result<()> {
    let reps = args.reps.max(101);
    if let Some(empty) = hooks.empty_launch {
        empty()?;
        b.synchronize()?;
        let per = time_it(
            reps,
            |_| {},
            || {
                for _ in 0..1000 {
                    empty().expect("launch");
                }
                b.synchronize().expect("sync");
            },
        ) / 1000.0;
        let trip = time_it(
            reps,
            |_| {},
            || {
                empty().expect("launch");
                b.synchronize().expect("sync");
            },
        );
        println!(
            "empty kernel: {:.2} us per launch (1000 back to back, one wait); launch + wait {:.2} us",
            per * 1e6,
            trip * 1e6
        );
    }
    let l = Layout::contiguous(&[1024]);
    let (x, y) = (b.alloc(DType::F32, 1024)?, b.alloc(DType::F32, 1024)?);
    b.fill(View::new(&x, &l), 1.0)?;
    let steps = {
        let (x, y, l) = (x.clone(), y.clone(), l.clone());
        move |b: &B| -> hal::Result<()> {
            for _ in 0..50 {
                b.binary(
                    BinaryOp::Add,
                    View::new(&x, &l),
                    View::new(&y, &l),
                    View::new(&y, &l),
                )?;
            }
            Ok(())
        }
    };
    let graph = b.record(std::sync::Arc::new(steps.clone()))?;
    b.fill(View::new(&y, &l), 0.0)?;
    b.replay(&graph)?;
    let got = b.read::<f32>(&y)?;
    if got.iter().any(|&v| v != 50.0) {
        return Err(hal::Error::Backend {
            backend: "bench",
            detail: format!("replayed sequence gave {} instead of 50", got[0]),
        });
    }
    let one_by_one = time_it(
        reps,
        |_| {},
        || {
            steps(b).expect("steps");
            b.synchronize().expect("sync");
        },
    );
    let replayed = time_it(
        reps,
        |_| {},
        || {
            b.replay(&graph).expect("replay");
            b.synchronize().expect("sync");
        },
    );
    let back_to_back = time_it(
        reps,
        |_| {},
        || {
            for _ in 0..10 {
                b.replay(&graph).expect("replay");
            }
            b.synchronize().expect("sync");
        },
    ) / 10.0;
    println!(
        "50 small kernels (1024-element adds), waited for: {:.1} us launched one by one, {:.1} us replayed from a recording ({}; checked); {:.1} us per replay with 10 back to back",
        one_by_one * 1e6,
        replayed * 1e6,
        if b.capabilities().graph_capture {
            "captured launches"
        } else {
            "steps run again"
        },
        back_to_back * 1e6
    );
    Ok(())
}

/// Device memory across 10,000 iterations of a loop of primitives that allocate temporaries
/// (elementwise, reduction, small matmul, nearest-centroid search, segment sums, gather).
pub(crate) fn memory<B: Backend>(b: &B, hooks: &Hooks<'_, B>) -> hal::Result<()> {
    let (n, d, m) = (4096usize, 32usize, 64usize);
    let (xl, cl) = (Layout::contiguous(&[n, d]), Layout::contiguous(&[m, d]));
    let x = b.alloc(DType::F32, n * d)?;
    let c = b.alloc(DType::F32, m * d)?;
    let u = Distribution::Uniform {
        low: -1.0,
        high: 1.0,
    };
    b.random(View::new(&x, &xl), u, 3, 0)?;
    b.random(View::new(&c, &cl), u, 3, (n * d) as u64)?;
    let iteration = || -> hal::Result<()> {
        let idx = b.alloc(DType::U32, n)?;
        let dist = b.alloc(DType::F32, n)?;
        let nl = Layout::contiguous(&[n]);
        b.nearest_centroid(
            View::new(&x, &xl),
            View::new(&c, &cl),
            View::new(&idx, &nl),
            View::new(&dist, &nl),
        )?;
        let sums = b.alloc(DType::F32, m * d)?;
        let counts = b.alloc(DType::F32, m)?;
        b.segment_sum(
            View::new(&x, &xl),
            View::new(&idx, &nl),
            None,
            View::new(&sums, &cl),
            View::new(&counts, &Layout::contiguous(&[m])),
        )?;
        let sq = b.alloc(DType::F32, n * d)?;
        b.binary(
            BinaryOp::Mul,
            View::new(&x, &xl),
            View::new(&x, &xl),
            View::new(&sq, &xl),
        )?;
        let total = b.alloc(DType::F32, n)?;
        b.reduce(
            hal::ReduceOp::Sum,
            View::new(&sq, &xl),
            &[1],
            View::new(&total, &Layout::contiguous(&[n, 1])),
        )?;
        let prod = b.alloc(DType::F32, m * m)?;
        b.matmul(
            View::new(&c, &cl),
            View::new(&c, &cl.transpose(0, 1)?),
            View::new(&prod, &Layout::contiguous(&[m, m])),
            1.0,
            0.0,
        )?;
        let picked = b.alloc(DType::F32, n * d)?;
        let il = Layout::contiguous(&[n, 1]).broadcast_to(&[n, d])?;
        b.gather(
            View::new(&c, &cl),
            0,
            View::new(&idx, &il),
            View::new(&picked, &xl),
        )?;
        Ok(())
    };
    let describe = |when: &str| println!("memory {when}: {}", memory_report(b, hooks.memory));
    // One iteration first so the pool holds what the loop needs, then 10,000 more.
    iteration()?;
    b.synchronize()?;
    describe("after 1 iteration");
    let t = Instant::now();
    for _ in 0..10_000 {
        iteration()?;
    }
    b.synchronize()?;
    describe("after 10,001 iterations");
    println!(
        "memory loop: 10,000 iterations of 6 primitives with temporaries in {:.2} s",
        t.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Device memory in use as the backend's hook describes it, else the bytes it reports free.
pub(crate) fn memory_report<B: Backend>(b: &B, memory: Option<&dyn Fn() -> String>) -> String {
    match memory {
        Some(f) => f(),
        None => format!("{} bytes available", b.info().memory_available),
    }
}
