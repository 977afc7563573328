//! Layers, optimisers, data loading, parameter files and error reporting.

mod common;

use backend_cpu::CpuBackend;
use common::{Rng, seed};
use std::sync::Arc;
use tensor_autograd::data::{DataLoader, Dataset};
use tensor_autograd::models::{digits_cnn, mlp};
use tensor_autograd::nn::{Init, Linear, Module, ModuleExt, copy_state};
use tensor_autograd::optim::{Adam, Cosine, Optimizer, Schedule, Sgd, clip_grad_norm};
use tensor_autograd::{Error, Tensor};

type T = Tensor<CpuBackend>;

fn tmp(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("tensor-autograd-{}-{name}", std::process::id()))
}

#[test]
fn op_shape_errors_name_both_shapes() {
    let dev = CpuBackend::new();
    let a = T::zeros(&dev, &[2, 3], hal::DType::F32).unwrap();
    let b = T::zeros(&dev, &[4, 3], hal::DType::F32).unwrap();
    let msg = a.add(&b).unwrap_err().to_string();
    assert!(msg.contains("[2, 3]") && msg.contains("[4, 3]"), "{msg}");
    let msg = a.matmul(&b).unwrap_err().to_string();
    assert!(msg.contains("[2, 3]") && msg.contains("[4, 3]"), "{msg}");
    let msg = T::cat(&[&a, &b.t().unwrap()], 0).unwrap_err().to_string();
    assert!(msg.contains("[2, 3]") && msg.contains("[3, 4]"), "{msg}");
    let x = a.requires_grad().exp().unwrap();
    let msg = x.backward().unwrap_err().to_string();
    assert!(
        msg.contains("one-element") && msg.contains("[2, 3]"),
        "{msg}"
    );
    assert!(matches!(
        T::from_slice(&dev, &[1.0; 5], &[2, 3]),
        Err(Error::InvalidArgument { .. })
    ));
}

#[test]
fn parameters_save_and_load_with_clear_errors() {
    let dev = CpuBackend::new();
    let mut init = Init::new(&dev, seed());
    let model = digits_cnn(&mut init).unwrap();
    let path = tmp("cnn.safetensors");
    model.save(&path).unwrap();
    let mut other_init = Init::new(&dev, 99);
    let other = digits_cnn(&mut other_init).unwrap();
    other.load(&path).unwrap();
    for ((n1, a), (n2, b)) in model.named_tensors().iter().zip(other.named_tensors()) {
        assert_eq!(n1, &n2);
        assert_eq!(a.to_vec().unwrap(), b.to_vec().unwrap(), "{n1}");
    }
    let names: Vec<String> = model.named_tensors().into_iter().map(|(n, _)| n).collect();
    assert!(
        names.contains(&"0.weight".to_string()) && names.contains(&"1.running_var".to_string()),
        "{names:?}"
    );

    // A file missing a tensor, and one with a tensor of the wrong shape: errors that name the
    // tensor, and the model is untouched.
    let small = mlp(&mut Init::new(&dev, 1), &[4, 3, 2]).unwrap();
    let before: Vec<Vec<f32>> = small
        .parameters()
        .iter()
        .map(|p| p.to_vec().unwrap())
        .collect();
    let wrong = mlp(&mut Init::new(&dev, 2), &[4, 5, 2]).unwrap();
    let wrong_path = tmp("wrong.safetensors");
    wrong.save(&wrong_path).unwrap();
    let msg = small.load(&wrong_path).unwrap_err().to_string();
    assert!(
        msg.contains("1.weight") && msg.contains("[5, 4]") && msg.contains("[3, 4]"),
        "{msg}"
    );
    let partial = Linear::new(&mut Init::new(&dev, 3), 4, 3).unwrap();
    let partial_path = tmp("partial.safetensors");
    partial.save(&partial_path).unwrap();
    let msg = small.load(&partial_path).unwrap_err().to_string();
    assert!(msg.contains("no tensor `1.weight`"), "{msg}");
    let after: Vec<Vec<f32>> = small
        .parameters()
        .iter()
        .map(|p| p.to_vec().unwrap())
        .collect();
    assert_eq!(before, after);
    std::fs::write(&partial_path, b"\x10\0\0\0\0\0\0\0{not json").unwrap();
    assert!(
        small
            .load(&partial_path)
            .unwrap_err()
            .to_string()
            .contains("not a valid safetensors")
    );
    assert!(matches!(
        small.load(tmp("absent.safetensors")),
        Err(Error::Io { .. })
    ));
    for p in [path, wrong_path, partial_path] {
        let _ = std::fs::remove_file(p);
    }
}

#[test]
fn state_moves_between_backends() {
    let cpu = CpuBackend::new();
    let wgpu = backend_wgpu::WgpuBackend::new().expect("the wgpu backend is required here");
    let a = digits_cnn(&mut Init::new(&cpu, 4)).unwrap();
    let mut b = digits_cnn(&mut Init::new(&wgpu, 5)).unwrap();
    copy_state(&a, &b).unwrap();
    b.eval();
    let mut a = a;
    a.eval();
    let x: Vec<f32> = Rng::new(seed())
        .vec(3 * 64, 0.0, 1.0)
        .iter()
        .map(|&v| v as f32)
        .collect();
    let ya = a
        .forward(&T::from_slice(&cpu, &x, &[3, 1, 8, 8]).unwrap())
        .unwrap()
        .to_vec()
        .unwrap();
    let yb = b
        .forward(&Tensor::from_slice(&wgpu, &x, &[3, 1, 8, 8]).unwrap())
        .unwrap()
        .to_vec()
        .unwrap();
    for (p, q) in ya.iter().zip(&yb) {
        assert!((p - q).abs() <= 1e-4 * (1.0 + p.abs()), "{p} vs {q}");
    }
    // Same-type move (another handle), optimiser state included.
    let mut m = mlp(&mut Init::new(&cpu, 6), &[3, 2]).unwrap();
    let mut opt = Adam::new(0.1);
    let x = T::from_slice(&cpu, &[1.0, 2.0, 3.0], &[1, 3]).unwrap();
    m.forward(&x)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    opt.step(&m.parameters()).unwrap();
    let other = CpuBackend::new();
    m.to_device(&other).unwrap();
    opt.to_device(&other).unwrap();
    assert!(
        m.parameters()
            .iter()
            .all(|p| p.requires_grad_flag() && p.grad().is_none())
    );
    m.forward(&x.to_device(&other).unwrap())
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    opt.step(&m.parameters()).unwrap();
}

#[test]
fn sgd_and_adam_follow_pytorch_formulas() {
    let dev = CpuBackend::new();
    let mut rng = Rng::new(seed());
    let p0: Vec<f32> = rng.vec(5, -1.0, 1.0).iter().map(|&v| v as f32).collect();
    let target: Vec<f32> = rng.vec(5, -1.0, 1.0).iter().map(|&v| v as f32).collect();
    let t = T::from_slice(&dev, &target, &[5]).unwrap();
    // SGD with momentum 0.9, Nesterov, weight decay 0.01, lr 0.1 on 0.5 |p - t|^2.
    let p = T::from_slice(&dev, &p0, &[5]).unwrap().requires_grad();
    let mut sgd = Sgd::new(0.1).momentum(0.9, true).weight_decay(0.01);
    let (mut host, mut buf) = (
        p0.iter().map(|&v| v as f64).collect::<Vec<_>>(),
        vec![0f64; 5],
    );
    // Fresh gradients of scale * |p - t|^2.
    let gradients = |p: &T, scale: f32| {
        p.zero_grad();
        p.sub(&t)
            .unwrap()
            .square()
            .unwrap()
            .sum_all()
            .unwrap()
            .mul_scalar(scale)
            .unwrap()
            .backward()
            .unwrap();
    };
    for step in 0..3 {
        gradients(&p, 0.5);
        sgd.step(std::slice::from_ref(&p)).unwrap();
        for i in 0..5 {
            let g = (host[i] - target[i] as f64) + 0.01 * host[i];
            buf[i] = if step == 0 { g } else { 0.9 * buf[i] + g };
            host[i] -= 0.1 * (g + 0.9 * buf[i]);
        }
    }
    for (a, b) in p.to_vec().unwrap().iter().zip(&host) {
        assert!((*a as f64 - b).abs() < 1e-5, "sgd {a} vs {b}");
    }
    // Adam, two steps.
    let p = T::from_slice(&dev, &p0, &[5]).unwrap().requires_grad();
    let mut adam = Adam::new(0.05);
    let (mut host, mut m, mut v) = (
        p0.iter().map(|&v| v as f64).collect::<Vec<_>>(),
        vec![0f64; 5],
        vec![0f64; 5],
    );
    for step in 1..=2 {
        gradients(&p, 1.0);
        adam.step(std::slice::from_ref(&p)).unwrap();
        for i in 0..5 {
            let g = 2.0 * (host[i] - target[i] as f64);
            m[i] = 0.9 * m[i] + 0.1 * g;
            v[i] = 0.999 * v[i] + 0.001 * g * g;
            let mh = m[i] / (1.0 - 0.9f64.powi(step));
            let vh = v[i] / (1.0 - 0.999f64.powi(step));
            host[i] -= 0.05 * mh / (vh.sqrt() + 1e-8);
        }
    }
    for (a, b) in p.to_vec().unwrap().iter().zip(&host) {
        assert!((*a as f64 - b).abs() < 1e-5, "adam {a} vs {b}");
    }
}

#[test]
fn clipping_and_schedules() {
    let dev = CpuBackend::new();
    let a = T::from_slice(&dev, &[3.0, 0.0], &[2])
        .unwrap()
        .requires_grad();
    let b = T::from_slice(&dev, &[4.0], &[1]).unwrap().requires_grad();
    // grads: 2a = (6, 0), 2b = 8: norm 10.
    a.square()
        .unwrap()
        .sum_all()
        .unwrap()
        .add(&b.square().unwrap().sum_all().unwrap())
        .unwrap()
        .backward()
        .unwrap();
    let norm = clip_grad_norm(&[a.clone(), b.clone()], 5.0)
        .unwrap()
        .unwrap();
    assert!((norm.item().unwrap() - 10.0).abs() < 1e-5);
    let ga = a.grad().unwrap().to_vec().unwrap();
    assert!((ga[0] - 3.0).abs() < 1e-4 && (b.grad().unwrap().item().unwrap() - 4.0).abs() < 1e-4);
    let c = Cosine {
        base: 1.0,
        min: 0.0,
        warmup: 10,
        total: 110,
    };
    assert!((c.learning_rate(0) - 0.1).abs() < 1e-6);
    assert!((c.learning_rate(60) - 0.5).abs() < 1e-5);
    assert!(c.learning_rate(110).abs() < 1e-6);
}

/// Clipping over more parameters than one grouped launch takes (sizes from empty to large,
/// one parameter without a gradient, two whose gradients are one buffer) against a float64
/// reference, on the CPU and on wgpu.
#[test]
fn clipping_many_parameters_matches_a_float64_reference() {
    fn check<B: hal::Backend>(dev: &B) {
        let mut seed = 0x5eedu64;
        let mut next = move || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((seed >> 40) as f64 / (1u64 << 24) as f64) * 2.0 - 1.0
        };
        for shared in [false, true] {
            let sizes = [
                0usize, 1, 7, 300, 5, 4097, 64, 3, 2, 1, 999, 12, 40, 8, 1, 77,
            ];
            let params: Vec<Tensor<B>> = sizes
                .iter()
                .map(|&n| {
                    let v: Vec<f32> = (0..n).map(|_| next() as f32).collect();
                    Tensor::from_slice(dev, &v, &[n]).unwrap().requires_grad()
                })
                .collect();
            let weights: Vec<Vec<f32>> = sizes
                .iter()
                .map(|&n| (0..n).map(|_| (next() * 3.0) as f32).collect())
                .collect();
            // loss = sum_k <w_k, p_k> (gradient w_k), skipping parameter 2; with `shared`,
            // parameters 9 and 14 (one element each) enter only through their sum, so both
            // get one gradient tensor.
            let mut loss = Tensor::from_slice(dev, &[0.0f32], &[]).unwrap();
            for (k, p) in params.iter().enumerate() {
                if k == 2 || (shared && (k == 9 || k == 14)) {
                    continue;
                }
                let w = Tensor::from_slice(dev, &weights[k], &[sizes[k]]).unwrap();
                loss = loss.add(&p.mul(&w).unwrap().sum_all().unwrap()).unwrap();
            }
            if shared {
                let x = params[9].add(&params[14]).unwrap();
                loss = loss.add(&x.sum_all().unwrap()).unwrap();
            }
            loss.backward().unwrap();
            let mut expect: Vec<Vec<f64>> = weights
                .iter()
                .map(|w| w.iter().map(|&x| x as f64).collect())
                .collect();
            expect[2].clear();
            if shared {
                expect[9] = vec![1.0];
                expect[14] = vec![1.0];
            }
            let norm_ref: f64 = expect.iter().flatten().map(|x| x * x).sum::<f64>().sqrt();
            let norm = clip_grad_norm(&params, 4.0)
                .unwrap()
                .unwrap()
                .item()
                .unwrap() as f64;
            assert!(
                (norm - norm_ref).abs() < 1e-5 * norm_ref,
                "{norm} vs {norm_ref}"
            );
            let scale = (4.0 / (norm_ref + 1e-6)).min(1.0);
            for (k, p) in params.iter().enumerate() {
                let Some(g) = p.grad() else {
                    assert_eq!(k, 2, "only parameter 2 has no gradient");
                    continue;
                };
                for (a, e) in g.to_vec().unwrap().iter().zip(&expect[k]) {
                    assert!(
                        ((*a as f64) - e * scale).abs() < 1e-5 * (1.0 + e.abs()),
                        "{k}"
                    );
                }
            }
        }
    }
    check(&CpuBackend::new());
    check(&backend_wgpu::WgpuBackend::new().expect("wgpu is required (lavapipe in CI)"));
}

#[test]
fn loader_covers_every_item_once_and_is_seeded() {
    let dev = CpuBackend::new();
    let n = 103;
    let features: Vec<f32> = (0..n * 2).map(|i| (i / 2) as f32).collect();
    let labels: Vec<u32> = (0..n as u32).collect();
    let data = Arc::new(Dataset::new(features, &[2], labels).unwrap());
    let epoch = |loader: &mut DataLoader<CpuBackend>| -> Vec<u32> {
        let mut seen = Vec::new();
        for batch in loader.epoch() {
            let batch = batch.unwrap();
            let x = batch.x.to_vec().unwrap();
            let y = batch.y.to_vec_u32().unwrap();
            for (k, &label) in y.iter().enumerate() {
                assert_eq!(x[2 * k] as u32, label, "features travel with their label");
            }
            seen.extend(y);
        }
        seen
    };
    let mut l1 = DataLoader::new(&dev, data.clone(), 10).unwrap().shuffle(7);
    let mut l2 = DataLoader::new(&dev, data.clone(), 10).unwrap().shuffle(7);
    let (e1, e2) = (epoch(&mut l1), epoch(&mut l2));
    assert_eq!(e1, e2, "same seed, same order");
    let mut sorted = e1.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..n as u32).collect::<Vec<_>>());
    assert_ne!(e1, epoch(&mut l1), "a new order each epoch");
    assert_ne!(e1, (0..n as u32).collect::<Vec<_>>());
    // Dropping an epoch early stops its thread.
    let mut l3 = DataLoader::new(&dev, data, 10).unwrap().drop_last();
    assert_eq!(l3.num_batches(), 10);
    let mut it = l3.epoch();
    assert!(it.next().is_some());
    drop(it);
    assert!(Dataset::new(vec![f32::NAN, 1.0], &[2], vec![0]).is_err());
}

#[test]
fn recorded_step_matches_eager_steps() {
    common::recorded_step_matches_eager(&CpuBackend::new(), seed());
}

#[test]
fn recorded_step_refuses_what_it_cannot_replay() {
    use tensor_autograd::models::{RecordedStep, digits_mlp};
    let dev = CpuBackend::new();
    let x = Tensor::zeros(&dev, &[4, 3], hal::DType::F32).unwrap();
    let y = Tensor::zeros(&dev, &[4], hal::DType::U32).unwrap();
    let model = || -> Arc<dyn Module<CpuBackend>> {
        Arc::new(mlp(&mut Init::new(&dev, 1), &[3, 5, 2]).unwrap())
    };
    // SGD keeps its learning rate on the host.
    let err = RecordedStep::new(model(), Sgd::new(0.1), &x, &y)
        .err()
        .unwrap();
    assert!(err.to_string().contains("recorded step"), "{err}");
    // A batch of another shape.
    let adam = Adam::new(0.1).device_values_everywhere();
    let step = RecordedStep::new(model(), adam, &x, &y).unwrap();
    let wide = Tensor::zeros(&dev, &[4, 4], hal::DType::F32).unwrap();
    let err = step.run(&wide, &y).err().unwrap();
    assert!(
        err.to_string().contains("[4, 4]") && err.to_string().contains("[4, 3]"),
        "{err}"
    );
    step.run(&x, &y).unwrap();
    assert_eq!(step.optimizer().steps(), 1);
    // Changing a hyperparameter other than the learning rate after recording (which the
    // device values would not follow).
    step.optimizer().hyper.beta1 = 0.5;
    let err = step.run(&x, &y).err().unwrap();
    assert!(err.to_string().contains("record it again"), "{err}");
    // Dropout in training mode would repeat its mask on replay.
    let digits: Arc<dyn Module<CpuBackend>> =
        Arc::new(digits_mlp(&mut Init::new(&dev, 1)).unwrap());
    let x = Tensor::zeros(&dev, &[4, 64], hal::DType::F32).unwrap();
    let step = RecordedStep::new(digits, Adam::new(0.1), &x, &y).unwrap();
    let err = step.run(&x, &y).err().unwrap();
    assert!(err.to_string().contains("dropout"), "{err}");
}

/// The fused cross-entropy against its definition, `nll_loss(log_softmax(x))`, forward and
/// backward (from the loss itself, where the gradient comes from the forward kernel, and from
/// a scaled loss, where the backward kernel makes it), for u32 and i32 labels on transposed
/// logits; a label outside the classes is an error naming it and the class count.
#[test]
fn fused_cross_entropy_matches_its_composition() {
    let dev = CpuBackend::new();
    let mut rng = Rng::new(seed());
    let (n, c) = (37, 11);
    let values: Vec<f32> = rng
        .vec(n * c, -4.0, 4.0)
        .iter()
        .map(|&v| v as f32)
        .collect();
    let labels: Vec<u32> = (0..n).map(|_| rng.below(c) as u32).collect();
    let signed: Vec<i32> = labels.iter().map(|&l| l as i32).collect();
    for target in [
        Tensor::from_elements(&dev, &labels, &[n]).unwrap(),
        Tensor::from_elements(&dev, &signed, &[n]).unwrap(),
    ] {
        // Stored as [C, N] and transposed: a non-contiguous view.
        let run = |fused: bool, scale: Option<f32>| {
            let x = Tensor::from_slice(&dev, &values, &[c, n])
                .unwrap()
                .requires_grad();
            let loss = if fused {
                x.t().unwrap().cross_entropy(&target).unwrap()
            } else {
                x.t()
                    .unwrap()
                    .log_softmax(1)
                    .unwrap()
                    .nll_loss(&target)
                    .unwrap()
            };
            match scale {
                Some(s) => loss.mul_scalar(s).unwrap().backward().unwrap(),
                None => loss.backward().unwrap(),
            }
            (loss.item().unwrap(), x.grad().unwrap().to_vec().unwrap())
        };
        for scale in [Some(1.7), None] {
            let ((a, ga), (b, gb)) = (run(true, scale), run(false, scale));
            assert!(
                (a - b).abs() <= 1e-5 * b.abs(),
                "loss {a} fused, {b} composed"
            );
            for (i, (x, y)) in ga.iter().zip(&gb).enumerate() {
                assert!(
                    (x - y).abs() <= 1e-6,
                    "gradient {i} (scale {scale:?}): {x} fused, {y} composed"
                );
            }
        }
    }
    let x = Tensor::from_slice(&dev, &values, &[n, c]).unwrap();
    let mut bad = labels.clone();
    bad[5] = c as u32 + 2;
    let bad = Tensor::from_elements(&dev, &bad, &[n]).unwrap();
    let err = x.cross_entropy(&bad).and_then(|l| l.item()).err().unwrap();
    assert!(
        err.to_string().contains(&format!("index {}", c + 2))
            && err.to_string().contains(&format!("size {c}")),
        "{err}"
    );
}

/// `dropout_add` is `residual + dropout(x)` bit for bit, and refuses mismatched shapes.
#[test]
fn dropout_add_is_dropout_then_add() {
    let dev = CpuBackend::new();
    let x = T::from_slice(
        &dev,
        &(0..60).map(|i| i as f32 * 0.37 - 9.0).collect::<Vec<_>>(),
        &[6, 10],
    )
    .unwrap();
    let r = T::from_slice(
        &dev,
        &(0..60).map(|i| (i as f32).sin()).collect::<Vec<_>>(),
        &[6, 10],
    )
    .unwrap();
    let fused = x
        .t()
        .unwrap()
        .dropout_add(&r.t().unwrap(), 0.3, 4, 77)
        .unwrap();
    let composed = r
        .t()
        .unwrap()
        .add(&x.t().unwrap().dropout(0.3, 4, 77).unwrap())
        .unwrap();
    assert_eq!(fused.to_vec().unwrap(), composed.to_vec().unwrap());
    let kept = fused
        .to_vec()
        .unwrap()
        .iter()
        .zip(r.t().unwrap().to_vec().unwrap())
        .filter(|(f, r)| *f != r)
        .count();
    assert!((20..60).contains(&kept), "{kept} of 60 kept");
    assert!(x.dropout_add(&r.t().unwrap(), 0.3, 4, 77).is_err());
}

/// Dropout's stream travels as data: calls with new seeds and offsets (every training step
/// makes them) reuse one compiled program per shape and dtype instead of compiling anew.
#[test]
fn dropout_compiles_once_for_every_stream() {
    let dev = CpuBackend::new();
    let x = T::from_slice(&dev, &[1.0f32; 40], &[5, 8])
        .unwrap()
        .requires_grad();
    let step = |k: u64| {
        let y = x.dropout(0.3, 7 + k, k << 32).unwrap();
        y.dropout_add(&x, 0.1, 9, k)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
    };
    step(0);
    let compiled = dev.cached_kernels();
    for k in 1..6 {
        step(k);
    }
    assert_eq!(
        dev.cached_kernels(),
        compiled,
        "a new stream compiled a new program"
    );
}

/// Cross-entropy over many classes (its wide path) gives the composition's loss bit for bit
/// and its gradient to rounding, with an infinite logit row-maximum and i32 labels; a label
/// out of range is an error.
#[test]
fn wide_cross_entropy_matches_the_composition() {
    let dev = CpuBackend::new();
    let (n, c) = (6usize, 37usize);
    let mut v: Vec<f32> = (0..n * c)
        .map(|i| ((i * 7919) % 113) as f32 * 0.09 - 5.0)
        .collect();
    v[c + 3] = f32::NEG_INFINITY;
    let x = T::from_slice(&dev, &v, &[n, c]).unwrap().requires_grad();
    let labels: Vec<i32> = vec![0, 36, 5, 17, 2, 30];
    let t = T::from_elements(&dev, &labels, &[n]).unwrap();
    let fused = x.cross_entropy(&t).unwrap();
    fused.backward().unwrap();
    let g_fused = x.grad().unwrap().to_vec().unwrap();
    x.zero_grad();
    let composed = x.log_softmax(1).unwrap().nll_loss(&t).unwrap();
    composed.backward().unwrap();
    let g_composed = x.grad().unwrap().to_vec().unwrap();
    assert_eq!(
        fused.item().unwrap().to_bits(),
        composed.item().unwrap().to_bits()
    );
    for (a, b) in g_fused.iter().zip(&g_composed) {
        assert!((a - b).abs() <= 1e-6 * (1.0 + b.abs()), "{a} vs {b}");
    }
    let bad = T::from_elements(&dev, &[0i32, 1, 37, 0, 0, 0], &[n]).unwrap();
    assert!(x.cross_entropy(&bad).is_err());
}
