//! CUDA behaviour beyond the parity suite. These need an NVIDIA GPU, so they are ignored by a
//! plain `cargo test` (CI has no GPU) and run on a GPU host with `--ignored`, where a missing
//! backend fails them:
//! `../shared/tools/gpu-bundle.sh -p hal-parity --test cuda_gpu`, then
//! `bash .gpu/remote.sh cuda_gpu --ignored`.

use backend_cuda::CudaBackend;
use hal::{Backend, BackendExt, BinaryOp, DType, Layout, View};

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
fn bad_selection_inputs_are_errors() {
    hal_parity::device_checks::bad_selection_inputs_are_errors(&gpu(), false);
}

#[test]
#[ignore = "needs an NVIDIA GPU; run with --ignored on a GPU host"]
fn host_traffic_inside_a_recording_is_refused_and_the_backend_recovers() {
    hal_parity::device_checks::host_traffic_inside_a_recording_is_refused(&gpu());
}

#[test]
#[ignore = "needs an NVIDIA GPU; run with --ignored on a GPU host"]
fn captured_recordings_replay_faithfully() {
    hal_parity::device_checks::captured_recordings_replay_faithfully(&gpu());
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

/// The hostile views of `tests/overflow.rs` on CUDA: no crash, no write outside the views.
#[test]
#[ignore = "needs an NVIDIA GPU; run with --ignored on a GPU host"]
fn hostile_views_touch_nothing_outside() {
    let seed = hal_parity::fresh_seed("OVERFLOW_SEED");
    let failures = hal_parity::overflow::hostile_views(&gpu(), 200, seed).unwrap();
    assert!(failures.is_empty(), "seed {seed}:\n{}", failures.join("\n"));
}
