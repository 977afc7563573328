//! Views near the limits of `usize` and `isize` on every backend present here (the CPU
//! reference and wgpu, which these tests require; CUDA runs the same check through
//! `parity --device-checks` on a GPU host): no crash, no write outside the views, no success
//! on a view whose true size wrapped.

use hal::{Backend, BackendExt, DType, Layout, View};
use hal_parity::{fresh_seed, overflow::hostile_views};

fn run<B: Backend>(b: &B, var: &str, cases: usize) {
    let seed = fresh_seed(var);
    let failures = hostile_views(b, cases, seed).expect("the harness's own calls succeed");
    assert!(
        failures.is_empty(),
        "{} broke a promise (seed {seed}):\n{}",
        b.info().backend,
        failures.join("\n")
    );
}

#[test]
fn hostile_views_on_the_cpu() {
    run(&backend_cpu::CpuBackend::new(), "OVERFLOW_SEED", 400);
}

#[test]
fn hostile_views_on_wgpu() {
    let gpu = backend_wgpu::WgpuBackend::new()
        .unwrap_or_else(|e| panic!("the wgpu backend is required here: {e}"));
    run(&gpu, "OVERFLOW_SEED", 60);
}

/// The reproducer, exactly: a fill through a view whose address range wrapped wrote
/// into the next buffers.
#[test]
fn a_wrapped_fill_touches_no_other_buffer() {
    let cpu = backend_cpu::CpuBackend::new();
    let bufs: Vec<_> = (0..103)
        .map(|_| cpu.alloc(DType::F32, 4).unwrap())
        .collect();
    for stride in [1024isize, 1 << 40] {
        let l = Layout::strided(&[4, (1 << 62) + 1], &[1, stride], 0).unwrap();
        let err = cpu.fill(View::new(&bufs[100], &l), 7.0).unwrap_err();
        assert!(
            matches!(
                err,
                hal::Error::Overflow { .. } | hal::Error::OutOfBounds { .. }
            ),
            "{err}"
        );
        for b in &bufs {
            assert_eq!(cpu.read::<f32>(b).unwrap(), vec![0.0; 4]);
        }
    }
}

/// A reduction over an empty axis reads nothing, so validation bounds none of the view's
/// other strides: offsets along them must not be computed (seed 1795745636335858690 found
/// `2 * 2^62` overflowing in the CPU backend's walk). The result is the empty reduction's.
#[test]
fn an_empty_reduction_under_hostile_strides() {
    let cpu = backend_cpu::CpuBackend::new();
    let x = cpu.alloc(DType::F32, 4).unwrap();
    let out = cpu.alloc(DType::F32, 4).unwrap();
    let xl = Layout::strided(&[2, 2, 0], &[-(1 << 40), 1 << 62, 1], 0).unwrap();
    let ol = Layout::contiguous(&[2, 2, 1]);
    cpu.fill(View::new(&out, &ol), 7.0).unwrap();
    cpu.reduce(
        hal::ReduceOp::Sum,
        View::new(&x, &xl),
        &[2],
        View::new(&out, &ol),
    )
    .unwrap();
    assert_eq!(cpu.read_f32(&out).unwrap(), vec![0.0; 4]);
    cpu.reduce(
        hal::ReduceOp::Mean,
        View::new(&x, &xl),
        &[2],
        View::new(&out, &ol),
    )
    .unwrap();
    assert!(cpu.read_f32(&out).unwrap().iter().all(|v| v.is_nan()));
    // Max of nothing is refused, as anywhere.
    let e = cpu
        .reduce(
            hal::ReduceOp::Max,
            View::new(&x, &xl),
            &[2],
            View::new(&out, &ol),
        )
        .unwrap_err();
    assert!(e.to_string().contains("no elements"), "{e}");
}
