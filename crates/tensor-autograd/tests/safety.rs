//! The safety issue's reproducers for tensors, each an assertion that fails without its fix:
//! sizes that wrap, gradients lost between threads, a tied weight stepped twice, and the
//! gradients special points get wrong (checked against the exact derivative).

use backend_cpu::CpuBackend;
use hal::{Backend, DType};
use tensor_autograd::Tensor;
use tensor_autograd::optim::{Adam, Optimizer, Sgd};

fn wgpu() -> backend_wgpu::WgpuBackend {
    backend_wgpu::WgpuBackend::new()
        .expect("the wgpu backend is required here (install mesa-vulkan-drivers for lavapipe)")
}

#[test]
fn sizes_that_wrap_are_errors_not_small_tensors() {
    let cpu = CpuBackend::new();
    // (2^62 + 1) x 4 elements wrap to 4 in usize arithmetic.
    let err = Tensor::full(&cpu, &[(1 << 62) + 1, 4], 7.0, DType::F32).unwrap_err();
    assert!(err.to_string().contains("overflow"), "{err}");
    // 2^32 x 2^32 wraps to 0.
    let err = Tensor::zeros(&cpu, &[1 << 32, 1 << 32], DType::F32).unwrap_err();
    assert!(err.to_string().contains("overflow"), "{err}");
    assert!(Tensor::zeros(&cpu, &[usize::MAX, 2], DType::F32).is_err());
    // A zero dimension keeps a huge shape empty (and legal), as in NumPy.
    let empty = Tensor::zeros(&cpu, &[1 << 40, 0], DType::F32).unwrap();
    assert_eq!(empty.numel(), 0);
    assert_eq!(
        empty.sum(&[0], false).unwrap().to_vec().unwrap(),
        Vec::<f32>::new()
    );
}

/// Four threads, fifty backward passes each, into one shared leaf: every gradient lands.
fn threaded_backward<B: Backend>(dev: &B) {
    let w = Tensor::from_slice(dev, &[1.0, 2.0, 3.0], &[3])
        .unwrap()
        .requires_grad();
    let k = Tensor::from_slice(dev, &[1.0, 1.0, 2.5], &[3]).unwrap();
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                for _ in 0..50 {
                    w.mul(&k).unwrap().sum_all().unwrap().backward().unwrap();
                }
            });
        }
    });
    let g = w.grad().expect("a gradient").to_vec().unwrap();
    assert_eq!(g, vec![200.0, 200.0, 500.0], "{}", dev.info().backend);
}

#[test]
fn backward_on_several_threads_loses_no_gradient_on_the_cpu() {
    for _ in 0..3 {
        threaded_backward(&CpuBackend::new());
    }
}

#[test]
fn backward_on_several_threads_loses_no_gradient_on_wgpu() {
    threaded_backward(&wgpu());
}

#[test]
fn a_parameter_listed_twice_is_stepped_once() {
    let cpu = CpuBackend::new();
    for twice in [false, true] {
        let step = |opt: &mut dyn Optimizer<CpuBackend>| {
            let w = Tensor::from_slice(&cpu, &[1.0, -2.0], &[2])
                .unwrap()
                .requires_grad();
            w.square().unwrap().sum_all().unwrap().backward().unwrap();
            let params = match twice {
                true => vec![w.clone(), w.clone()],
                false => vec![w.clone()],
            };
            opt.step(&params).unwrap();
            w.to_vec().unwrap()
        };
        // Adam's first step moves each element by lr, whatever the gradient's scale.
        assert_eq!(step(&mut Adam::new(0.5)), vec![0.5, -1.5], "twice: {twice}");
        // SGD: w - lr * 2w.
        assert_eq!(step(&mut Sgd::new(0.25)), vec![0.5, -1.0], "twice: {twice}");
    }
}

/// d/dx of `f` at `x` by central differences in f64 (of an f64 formula).
fn numeric(f: impl Fn(f64) -> f64, x: f64) -> f64 {
    let h = 1e-6;
    (f(x + h) - f(x - h)) / (2.0 * h)
}

#[test]
fn bce_with_logits_has_the_exact_gradient_at_zero() {
    let cpu = CpuBackend::new();
    let x = Tensor::from_slice(&cpu, &[0.0, 0.0, 2.0, -3.0], &[4])
        .unwrap()
        .requires_grad();
    let t = Tensor::from_slice(&cpu, &[0.0, 1.0, 0.25, 1.0], &[4]).unwrap();
    let loss = x.bce_with_logits(&t).unwrap();
    loss.backward().unwrap();
    let g = x.grad().unwrap().to_vec().unwrap();
    let xs = [0.0f64, 0.0, 2.0, -3.0];
    let ts = [0.0f64, 1.0, 0.25, 1.0];
    for i in 0..4 {
        let bce = |v: f64| (v.max(0.0) - v * ts[i] + (1.0 + (-v.abs()).exp()).ln()) / 4.0;
        let want = numeric(bce, xs[i]);
        approx::assert_abs_diff_eq!(g[i] as f64, want, epsilon = 1e-6);
    }
    // The case: x = [0, 0], t = [0, 1] gives [0.25, -0.25].
    approx::assert_abs_diff_eq!(g[0], 0.125, epsilon = 1e-7);
    approx::assert_abs_diff_eq!(g[1], -0.125, epsilon = 1e-7);
}

#[test]
fn special_points_have_pytorchs_gradients() {
    let cpu = CpuBackend::new();
    let leaf = |v: &[f32]| {
        Tensor::from_slice(&cpu, v, &[v.len()])
            .unwrap()
            .requires_grad()
    };
    // pow(0, 0): the base's gradient is 0 (a^0 is 1 for every a), not NaN.
    let (a, b) = (leaf(&[0.0, 2.0]), leaf(&[0.0, 3.0]));
    a.pow(&b).unwrap().sum_all().unwrap().backward().unwrap();
    assert_eq!(a.grad().unwrap().to_vec().unwrap(), vec![0.0, 12.0]);
    // atan2(0, 0): 0 for both operands.
    let (y, x) = (leaf(&[0.0, 1.0]), leaf(&[0.0, 1.0]));
    y.atan2(&x).unwrap().sum_all().unwrap().backward().unwrap();
    assert_eq!(y.grad().unwrap().to_vec().unwrap(), vec![0.0, 0.5]);
    assert_eq!(x.grad().unwrap().to_vec().unwrap(), vec![0.0, -0.5]);
}

#[test]
fn logsumexp_of_negative_infinities_is_negative_infinity() {
    let cpu = CpuBackend::new();
    let x = Tensor::from_slice(
        &cpu,
        &[f32::NEG_INFINITY, f32::NEG_INFINITY, 1.0, f32::INFINITY],
        &[2, 2],
    )
    .unwrap();
    let l = x.logsumexp(1, false).unwrap().to_vec().unwrap();
    assert_eq!(l, vec![f32::NEG_INFINITY, f32::INFINITY]);
}

#[test]
fn tied_maxima_share_the_gradient_evenly() {
    let cpu = CpuBackend::new();
    let x = Tensor::from_slice(&cpu, &[3.0, 1.0, 3.0, 3.0], &[2, 2])
        .unwrap()
        .requires_grad();
    let m = x.max_all().unwrap();
    assert_eq!(m.to_vec().unwrap(), vec![3.0]);
    m.backward().unwrap();
    let third = 1.0 / 3.0;
    assert_eq!(
        x.grad().unwrap().to_vec().unwrap(),
        vec![third, 0.0, third, third]
    );
    let y = Tensor::from_slice(&cpu, &[-1.0, 2.0, -1.0], &[3])
        .unwrap()
        .requires_grad();
    y.min_all().unwrap().backward().unwrap();
    assert_eq!(y.grad().unwrap().to_vec().unwrap(), vec![0.5, 0.0, 0.5]);
}

#[test]
#[ignore = "needs an NVIDIA GPU; run with --ignored on a GPU host"]
fn backward_on_several_threads_loses_no_gradient_on_cuda() {
    threaded_backward(&backend_cuda::CudaBackend::new().expect("the CUDA backend is required"));
}

/// Two checkpoints of 16.8 MB each (4.2M f32), different in every element.
fn checkpoint(version: u32) -> Vec<(String, Tensor<CpuBackend>)> {
    let values: Vec<f32> = (0..4_200_000u32).map(|i| (i ^ version) as f32).collect();
    let t = Tensor::from_slice(&CpuBackend::new(), &values, &[4_200_000]).unwrap();
    vec![("weight".to_string(), t)]
}

/// Run by the test below in a child process: saves the two checkpoints in turn to the path
/// in `TA_KILL_TARGET`, for ever.
#[test]
#[ignore = "a helper: a_checkpoint_killed_mid_save_is_whole runs it in a child"]
fn checkpoint_writer() {
    hal_parity::kill::write_until_killed("TA_KILL_TARGET", &[checkpoint(1), checkpoint(2)], {
        |tensors, path| tensor_autograd::nn::save_safetensors(tensors, path).unwrap()
    });
}

#[test]
fn a_checkpoint_killed_mid_save_is_whole() {
    let dir = std::env::temp_dir().join(format!("ta-kill-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let target = dir.join("model.safetensors");
    let expected: Vec<Vec<f32>> = [1, 2]
        .map(|v| checkpoint(v)[0].1.to_vec().unwrap())
        .to_vec();
    tensor_autograd::nn::save_safetensors(&checkpoint(1), &target).unwrap();
    let into = checkpoint(0);
    hal_parity::kill::kill_rounds(
        "checkpoint_writer",
        "TA_KILL_TARGET",
        &target,
        8,
        500,
        |round| {
            tensor_autograd::nn::load_safetensors(&into, &target)
                .unwrap_or_else(|e| panic!("round {round}: the checkpoint is damaged: {e}"));
            let got = into[0].1.to_vec().unwrap();
            assert!(expected.contains(&got), "round {round}: neither version");
        },
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
