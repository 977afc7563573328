//! `join_rayon_pool` in a process of its own (rayon's global pool is built once).

use hal::{Backend, BackendExt, BinaryOp, Layout, View};

#[test]
fn the_calling_thread_becomes_the_pools_first_and_a_second_call_is_refused() {
    backend_cpu::join_rayon_pool(2).expect("the first call builds the pool");
    assert_eq!(rayon::current_thread_index(), Some(0));
    assert_eq!(rayon::current_num_threads(), 2);
    // The backend works from the joined thread, across chunks split over both threads.
    let cpu = backend_cpu::CpuBackend::new();
    let n = 1 << 20;
    let x: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let a = cpu.upload(&x).unwrap();
    let out = cpu.alloc(hal::DType::F32, n).unwrap();
    let l = Layout::contiguous(&[n]);
    let (va, vo) = (View::new(&a, &l), View::new(&out, &l));
    cpu.binary(BinaryOp::Add, va, va, vo).unwrap();
    let y = cpu.read::<f32>(&out).unwrap();
    assert!(y.iter().enumerate().all(|(i, &v)| v == 2.0 * i as f32));
    let again = backend_cpu::join_rayon_pool(2).unwrap_err().to_string();
    assert!(again.contains("before anything uses"), "{again}");
}
