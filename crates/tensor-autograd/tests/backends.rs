//! Forward and backward parity: the same operations on the same fresh random inputs (odd
//! sizes, transposed storage, broadcasting) on the CPU backend and on the GPU backends. wgpu is
//! required (lavapipe in CI: the test fails, not skips, without a Vulkan driver); CUDA runs
//! with `--ignored` on a GPU host.

mod common;

use backend_cpu::CpuBackend;
use common::{Forward, Rng, Storage, leaf, seed};
use hal::{Backend, DType};
use tensor_autograd::nn::{BatchNorm2d, Init, LayerNorm, Module};
use tensor_autograd::{Conv2dOptions, Tensor};

/// Runs cases on one device: each draws its leaves and the output's weights from `rng`.
struct Cases<'d, B: Backend> {
    dev: &'d B,
    rng: Rng,
    results: Vec<(String, Vec<f32>)>,
}

impl<B: Backend> Cases<'_, B> {
    /// Case `name`: leaves of `shapes` (fresh values in [-1, 1), stored as given), `f` of
    /// them, and the gradients of a random weighting of its output's sum.
    fn run(&mut self, name: &str, shapes: &[(&[usize], Storage)], f: &Forward<'_, B>) {
        let leaves: Vec<Tensor<B>> = shapes
            .iter()
            .map(|(s, st)| {
                let n: usize = s.iter().product();
                leaf(self.dev, &self.rng.vec(n, -1.0, 1.0), s, *st)
            })
            .collect();
        let y = f(&leaves).unwrap_or_else(|e| panic!("{name}: {e}"));
        let w: Vec<f32> = self
            .rng
            .vec(y.numel(), -1.0, 1.0)
            .iter()
            .map(|&v| v as f32)
            .collect();
        let wt = Tensor::from_slice(self.dev, &w, y.shape()).unwrap();
        y.to_dtype(DType::F32)
            .unwrap()
            .mul(&wt)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        self.results
            .push((format!("{name}: output"), y.to_vec().unwrap()));
        for (k, l) in leaves.iter().enumerate() {
            if let Some(g) = l.grad() {
                self.results
                    .push((format!("{name}: gradient {k}"), g.to_vec().unwrap()));
            }
        }
    }
}

use Storage::{Contiguous as C, Transposed as Tr};

/// Every case's output and input gradients, by name.
fn suite<B: Backend>(dev: &B, seed: u64) -> Vec<(String, Vec<f32>)> {
    let mut rng = Rng::new(seed);
    let index: Vec<u32> = (0..9).map(|_| rng.below(6) as u32).collect();
    let classes: Vec<u32> = (0..9).map(|_| rng.below(5) as u32).collect();
    let mut cases = Cases {
        dev,
        rng,
        results: Vec::new(),
    };
    elementwise_cases(&mut cases);
    product_cases(&mut cases);
    let it = Tensor::from_elements(dev, &index, &[9]).unwrap();
    let ct = Tensor::from_elements(dev, &classes, &[9]).unwrap();
    cases.run(
        "index_select + cross_entropy",
        &[(&[6, 5], Tr)],
        &move |v| v[0].index_select(0, &it)?.cross_entropy(&ct),
    );
    let wide: Vec<u32> = (0..9).map(|k| (k * 7 % 40) as u32).collect();
    let wt = Tensor::from_elements(dev, &wide, &[9]).unwrap();
    cases.run(
        "cross_entropy over 40 classes",
        &[(&[9, 40], Tr)],
        &move |v| v[0].mul_scalar(4.0)?.cross_entropy(&wt),
    );
    cases.run("losses", &[(&[7, 4], Tr), (&[7, 4], C)], &|v| {
        let p = v[1].sigmoid()?.detach();
        v[0].mse_loss(&v[1])?.add(&v[0].bce_with_logits(&p)?)
    });
    cases.run("dropout", &[(&[33, 7], Tr)], &|v| v[0].dropout(0.25, 11, 5));
    cases.run("dropout_add", &[(&[33, 7], Tr), (&[33, 7], C)], &|v| {
        v[0].dropout_add(&v[1], 0.25, 11, 5)
    });
    // Three gradients written into one buffer; heads read where they lie.
    cases.run("packed qkv attention", &[(&[2, 7, 24], C)], &|v| {
        let options = tensor_autograd::AttentionOptions {
            causal: true,
            dropout: 0.2,
            seed: 3,
            ..Default::default()
        };
        v[0].qkv_attention(2, &options)
    });
    let mut init = Init::new(dev, 5);
    let ln = LayerNorm::new(&mut init, 7).unwrap();
    let bn = BatchNorm2d::new(&mut init, 3).unwrap();
    cases.run("layer norm", &[(&[5, 7], Tr)], &|v| ln.forward(&v[0]));
    cases.run("batch norm", &[(&[4, 3, 3, 5], Tr)], &|v| bn.forward(&v[0]));
    cases.run("f16 storage", &[(&[9, 5], Tr)], &|v| {
        v[0].to_dtype(DType::F16)?
            .exp()?
            .mul(&v[0].to_dtype(DType::F16)?)
    });
    // Mixed precision: bf16 products (their rounding differs between devices by an ulp of
    // bf16), f32 norm, attention and loss.
    let labels: Vec<u32> = (0..14).map(|k| (k * 5 % 11) as u32).collect();
    let lt = Tensor::from_elements(dev, &labels, &[14]).unwrap();
    cases.run(
        "bf16 autocast block",
        &[
            (&[2, 7, 12], C),
            (&[36, 12], Tr),
            (&[12], C),
            (&[11, 12], C),
        ],
        &move |v| {
            tensor_autograd::autocast(DType::BF16, || {
                let qkv = v[0]
                    .layer_norm(1, Some(&v[2]), None, 1e-5)?
                    .linear(&v[1], None)?;
                let a = qkv.qkv_attention(3, &Default::default())?.gelu()?;
                let logits = v[0].add(&a)?.linear(&v[3], None)?.reshape(&[14, 11])?;
                logits.cross_entropy(&lt)
            })?
        },
    );
    cases.results
}

/// Unary ops, binary ops with broadcasting, where, reductions and movement.
fn elementwise_cases<B: Backend>(cases: &mut Cases<'_, B>) {
    let u = |op: hal::UnaryOp| move |v: &[Tensor<B>]| v[0].unary(op);
    for op in hal::UnaryOp::all() {
        if !matches!(
            op,
            hal::UnaryOp::Log
                | hal::UnaryOp::Log2
                | hal::UnaryOp::Sqrt
                | hal::UnaryOp::Rsqrt
                | hal::UnaryOp::Recip
        ) {
            cases.run(&format!("{op:?}"), &[(&[7, 13], Tr)], &u(op));
        }
    }
    cases.run("log/sqrt/rsqrt/recip", &[(&[5, 9], Tr)], &|v| {
        let p = v[0].abs()?.add_scalar(0.5)?;
        p.log()?
            .add(&p.sqrt()?)?
            .add(&p.rsqrt()?)?
            .add(&p.recip()?)?
            .add(&p.log2()?)
    });
    cases.run(
        "binary broadcast",
        &[(&[3, 7, 5], Tr), (&[7, 1], C)],
        &|v| {
            let b = v[1].abs()?.add_scalar(0.5)?;
            v[0].add(&v[1])?
                .mul(&v[0].sub(&v[1])?)?
                .div(&b)?
                .add(&v[0].maximum(&v[1])?)?
                .add(&v[0].minimum(&v[1])?)?
                .add(&v[0].atan2(&b)?)?
                .add(&b.pow(&v[0])?)?
                .add(&v[0].rem(&b)?)
        },
    );
    cases.run("where", &[(&[6, 5], Tr), (&[5], C)], &|v| {
        v[0].gt(&v[1].detach())?.where_cond(&v[0].exp()?, &v[1])
    });
    cases.run("reductions", &[(&[4, 6, 5], Tr)], &|v| {
        let x = &v[0];
        let a = x
            .sum(&[0, 2], false)?
            .add(&x.mean(&[0, 2], false)?)?
            .add(&x.max(2, false)?.sum(&[0], false)?)?;
        let b = x
            .var(&[0, 2], 1, false)?
            .add(&x.logsumexp(0, false)?.sum(&[1], false)?)?;
        a.add(&b)?
            .add(&x.softmax(1)?.mul(&x.log_softmax(2)?)?.sum(&[0, 2], false)?)
    });
    cases.run("movement", &[(&[4, 3, 5], Tr), (&[2, 3, 5], C)], &|v| {
        let c = Tensor::cat(&[&v[0], &v[1]], 0)?
            .flip(1)?
            .step(2, 2)?
            .permute(&[2, 0, 1])?;
        let p = v[1].narrow(2, 1, 3)?.pad(&[(1, 0), (0, 2), (1, 1)], 0.25)?;
        c.exp()?
            .sum_all()?
            .add(&p.square()?.sum_all()?)?
            .add(&Tensor::stack(&[&v[1], &v[1]], 1)?.sum_all()?)
    });
}

/// Products: matmul, Linear layers with their activations, batched products, convolution
/// and pooling.
fn product_cases<B: Backend>(cases: &mut Cases<'_, B>) {
    use hal::UnaryOp::{Relu, Sigmoid, Tanh};
    cases.run("matmul", &[(&[3, 17, 9], Tr), (&[9, 11], Tr)], &|v| {
        v[0].matmul(&v[1])
    });
    // Linear layers with their activations: a batch of 256 whose weight gradient wgpu splits
    // over k (the gate and the bias gradient fused into it), and an odd one it does not.
    for op in [None, Some(Relu), Some(Sigmoid), Some(Tanh)] {
        cases.run(
            &format!("linear {op:?}"),
            &[(&[256, 96], Tr), (&[70, 96], C), (&[70], C)],
            &move |v| v[0].linear_activation(&v[1], Some(&v[2]), op),
        );
    }
    cases.run(
        "linear, odd batch",
        &[(&[33, 20], C), (&[13, 20], Tr)],
        &|v| v[0].linear_activation(&v[1], None, Some(Relu)),
    );
    cases.run(
        "bmm broadcast",
        &[(&[1, 5, 7], Tr), (&[3, 7, 6], C)],
        &|v| v[0].matmul(&v[1]),
    );
    cases.run(
        "conv2d",
        &[(&[2, 4, 9, 7], Tr), (&[6, 2, 3, 2], C), (&[6], C)],
        &|v| {
            v[0].conv2d(
                &v[1],
                Some(&v[2]),
                Conv2dOptions {
                    stride: (2, 1),
                    padding: (1, 1),
                    dilation: (1, 2),
                    groups: 2,
                    precision: hal::Precision::Exact,
                },
            )
        },
    );
    cases.run("pools", &[(&[2, 3, 9, 7], Tr)], &|v| {
        // Overlapping and padded windows (im2col), then tiling ones (the direct kernels).
        v[0].max_pool2d((3, 2), (2, 2), (1, 0))?
            .sum_all()?
            .add(&v[0].avg_pool2d((2, 2), (2, 2), (1, 1))?.sum_all()?)?
            .add(&v[0].max_pool2d((2, 2), (2, 2), (0, 0))?.exp()?.sum_all()?)
    });
}

fn compare(name: &str, reference: &[(String, Vec<f32>)], got: &[(String, Vec<f32>)]) {
    assert_eq!(reference.len(), got.len(), "{name}: different case lists");
    let mut worst = (0.0f64, String::new());
    for ((case, r), (case2, g)) in reference.iter().zip(got) {
        assert_eq!(case, case2);
        assert_eq!(r.len(), g.len(), "{case}: sizes differ");
        // f32 math differs by ulps between devices, and sums are ordered differently; each
        // value must agree within 1e-4 of the case's largest magnitude (1e-2 for f16 storage,
        // 3e-2 for bf16 products).
        let scale = r.iter().fold(1e-3f64, |m, &v| m.max(v.abs() as f64));
        let tol = if case.starts_with("f16") {
            1e-2
        } else if case.starts_with("bf16") {
            3e-2
        } else {
            1e-4
        };
        for (i, (&a, &b)) in r.iter().zip(g).enumerate() {
            let err = (a as f64 - b as f64).abs() / scale;
            assert!(
                err <= tol,
                "{name} {case}[{i}]: cpu {a} vs {b} (scale {scale})"
            );
            if err > worst.0 {
                worst = (err, case.clone());
            }
        }
    }
    println!(
        "{name}: {} results agree; worst {:.2e} (relative to each case's scale) in {}",
        got.len(),
        worst.0,
        worst.1
    );
}

#[test]
fn wgpu_matches_cpu_forward_and_backward() {
    let s = seed();
    let wgpu = backend_wgpu::WgpuBackend::new()
        .expect("the wgpu backend is required here (install mesa-vulkan-drivers for lavapipe)");
    // Results allocated unfilled start as NaN: an element an operation fails to write shows.
    wgpu.poison_for_write(true);
    compare("wgpu", &suite(&CpuBackend::new(), s), &suite(&wgpu, s));
}

#[test]
#[ignore = "needs an NVIDIA GPU; run with --ignored on a GPU host"]
fn cuda_matches_cpu_forward_and_backward() {
    let s = seed();
    let cuda =
        backend_cuda::CudaBackend::new().expect("the CUDA backend is required for this test");
    cuda.poison_for_write(true);
    compare("cuda", &suite(&CpuBackend::new(), s), &suite(&cuda, s));
}

#[test]
fn wgpu_recorded_step_matches_eager_steps() {
    let wgpu = backend_wgpu::WgpuBackend::new()
        .expect("the wgpu backend is required here (install mesa-vulkan-drivers for lavapipe)");
    wgpu.poison_for_write(true);
    common::recorded_step_matches_eager(&wgpu, seed());
}

/// On CUDA the step is captured into a graph: this checks that replays of the capture train
/// exactly as the eager steps do (the per-step values on the device, the batch copied in).
#[test]
#[ignore = "needs an NVIDIA GPU; run with --ignored on a GPU host"]
fn cuda_recorded_step_matches_eager_steps() {
    let cuda =
        backend_cuda::CudaBackend::new().expect("the CUDA backend is required for this test");
    cuda.poison_for_write(true);
    common::recorded_step_matches_eager(&cuda, seed());
}

/// The poisoning the parity cases rely on is live: a fresh unfilled result reads as NaN.
#[test]
fn wgpu_poisoned_results_read_as_nan() {
    let wgpu = backend_wgpu::WgpuBackend::new()
        .expect("the wgpu backend is required here (install mesa-vulkan-drivers for lavapipe)");
    wgpu.poison_for_write(true);
    // Twice: the second comes from the pool, holding the first one's bits.
    for _ in 0..2 {
        let b = wgpu.alloc_for_write(DType::F32, 7).unwrap();
        wgpu.fill(hal::View::new(&b, &hal::Layout::contiguous(&[3])), 1.0)
            .unwrap();
        let got: Vec<f32> = hal::BackendExt::read(&wgpu, &b).unwrap();
        assert_eq!(&got[..3], &[1.0; 3]);
        assert!(got[3..].iter().all(|v| v.is_nan()), "{got:?}");
    }
}

/// Eager AdamW steps over many parameters of odd sizes (CUDA groups them into a few
/// launches) against the CPU's per-parameter steps, on gradients both compute exactly
/// (`loss = sum_k <w_k, p_k>`), with the learning rate changing between steps.
fn adam_matches_cpu<B: Backend>(dev: &B) {
    use tensor_autograd::optim::{Adam, Optimizer};
    let sizes = [
        1usize, 7, 300, 5, 4097, 64, 3, 2, 999, 12, 40, 8, 77, 513, 9, 33, 1, 6,
    ];
    let mut rng = Rng::new(seed());
    let init: Vec<Vec<f64>> = sizes.iter().map(|&n| rng.vec(n, -1.0, 1.0)).collect();
    let weights: Vec<Vec<f64>> = sizes.iter().map(|&n| rng.vec(n, -2.0, 2.0)).collect();
    fn run<D: Backend>(d: &D, init: &[Vec<f64>], weights: &[Vec<f64>]) -> Vec<Vec<f32>> {
        let f = |v: &Vec<f64>| v.iter().map(|&x| x as f32).collect::<Vec<f32>>();
        let params: Vec<Tensor<D>> = init
            .iter()
            .map(|v| {
                Tensor::from_slice(d, &f(v), &[v.len()])
                    .unwrap()
                    .requires_grad()
            })
            .collect();
        let mut opt = Adam::adamw(1e-2).weight_decay(0.1);
        for step in 0..4 {
            for p in &params {
                p.zero_grad();
            }
            let mut loss = Tensor::from_slice(d, &[0.0f32], &[]).unwrap();
            for (p, w) in params.iter().zip(weights) {
                let w = Tensor::from_slice(d, &f(w), &[w.len()]).unwrap();
                loss = loss.add(&p.mul(&w).unwrap().sum_all().unwrap()).unwrap();
            }
            loss.backward().unwrap();
            opt.set_learning_rate(1e-2 * (1.0 + step as f32));
            opt.step(&params).unwrap();
        }
        params.iter().map(|p| p.to_vec().unwrap()).collect()
    }
    let want = run(&CpuBackend::new(), &init, &weights);
    let got = run(dev, &init, &weights);
    for (k, (g, w)) in got.iter().zip(&want).enumerate() {
        for (i, (a, b)) in g.iter().zip(w).enumerate() {
            assert!(
                (a - b).abs() <= 4.0 * f32::EPSILON * b.abs() + 1e-7,
                "parameter {k} element {i}: {a} vs {b}"
            );
        }
    }
}

#[test]
fn wgpu_adam_matches_cpu() {
    let wgpu = backend_wgpu::WgpuBackend::new()
        .expect("the wgpu backend is required here (install mesa-vulkan-drivers for lavapipe)");
    adam_matches_cpu(&wgpu);
}

#[test]
#[ignore = "needs an NVIDIA GPU; run with --ignored on a GPU host"]
fn cuda_adam_matches_cpu() {
    let cuda =
        backend_cuda::CudaBackend::new().expect("the CUDA backend is required for this test");
    adam_matches_cpu(&cuda);
}
