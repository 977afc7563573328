//! CUDA behaviour beyond the parity suite. These need an NVIDIA GPU, so they are ignored by a
//! plain `cargo test` (CI has no GPU) and run on a GPU host with `--ignored`, where a missing
//! backend fails them:
//! `../shared/tools/gpu-bundle.sh -p hal-parity --test cuda_gpu`, then
//! `bash .gpu/remote.sh cuda_gpu --ignored`.

use backend_cuda::CudaBackend;
use hal::{Backend, BackendExt, BinaryOp, DType, Layout, View};
use std::sync::Arc;

fn gpu() -> CudaBackend {
    CudaBackend::new().expect("these tests need the CUDA backend")
}

#[test]
#[ignore = "needs an NVIDIA GPU; run with --ignored on a GPU host"]
fn bad_indices_are_reported_at_synchronize_and_write_nothing() {
    hal_parity::device_checks::bad_indices_are_reported_at_synchronize(&gpu());
}

#[test]
#[ignore = "needs an NVIDIA GPU; run with --ignored on a GPU host"]
fn host_traffic_inside_a_recording_is_refused_and_the_backend_recovers() {
    let b = gpu();
    let l = Layout::contiguous(&[8]);
    let x = b.upload(&[1.0f32; 8]).unwrap();
    let xs = x.clone();
    let err = b
        .record(Arc::new(move |b: &CudaBackend| {
            b.binary(
                BinaryOp::Add,
                View::new(&xs, &l),
                View::new(&xs, &l),
                View::new(&xs, &l),
            )?;
            b.synchronize()
        }))
        .unwrap_err();
    assert!(
        matches!(
            err,
            hal::Error::InvalidArgument {
                op: "synchronize",
                ..
            }
        ),
        "{err}"
    );
    // Nothing ran, and the stream works again.
    assert_eq!(b.read::<f32>(&x).unwrap(), vec![1.0; 8]);
    let y = b.alloc(DType::F32, 8).unwrap();
    assert_eq!(b.read::<f32>(&y).unwrap(), vec![0.0; 8]);
}

#[test]
#[ignore = "needs an NVIDIA GPU; run with --ignored on a GPU host"]
fn a_steady_state_loop_takes_no_new_device_memory() {
    let b = gpu();
    let l = Layout::contiguous(&[1000]);
    let x = b.upload(&vec![0.5f32; 1000]).unwrap();
    let step = || {
        let t = b.alloc(DType::F32, 1000).unwrap();
        b.binary(
            BinaryOp::Mul,
            View::new(&x, &l),
            View::new(&x, &l),
            View::new(&t, &l),
        )
        .unwrap();
    };
    step();
    b.synchronize().unwrap();
    let before = b.pool_stats();
    for _ in 0..1000 {
        step();
    }
    b.synchronize().unwrap();
    let after = b.pool_stats();
    assert_eq!(before.driver_allocs, after.driver_allocs);
    assert_eq!(before.reserved_bytes, after.reserved_bytes);
}
