//! Every operation's gradient against central finite differences, on fresh random inputs,
//! including broadcast and non-contiguous (transposed) inputs.
//!
//! Elementwise functions are checked against finite differences of an independent f64 host
//! definition (`h = 1e-6`, all in f64). Everything else (reductions, movement, matmul,
//! convolution, pooling, indexing, losses, layers) is checked against central differences of
//! the library's own f32 forward pass, with the differences and sums formed in f64 (`hal` has
//! no f64 dtype): step and tolerance are set so that f32 rounding stays well inside them,
//! while a wrong factor, sign, transpose or reduction axis is far outside.

mod common;

use backend_cpu::CpuBackend;
use common::{Rng, Storage, gradcheck, leaf, seed};
use hal::UnaryOp;
use tensor_autograd::nn::{BatchNorm2d, Init, LayerNorm, Module};
use tensor_autograd::{Conv2dOptions, Tensor, no_grad};

type T = Tensor<CpuBackend>;

/// Autograd of `sum(op(x) * w)` against f64 central differences of the host definition.
fn check_unary(op: UnaryOp, f: fn(f64) -> f64, lo: f64, hi: f64, rng: &mut Rng) {
    let dev = CpuBackend::new();
    let shape = [7, 5];
    for storage in [Storage::Contiguous, Storage::Transposed] {
        let x = rng.vec(35, lo, hi);
        let w = rng.vec(35, -1.0, 1.0);
        let xt = leaf(&dev, &x, &shape, storage);
        let wt = T::from_slice(
            &dev,
            &w.iter().map(|&v| v as f32).collect::<Vec<_>>(),
            &shape,
        )
        .unwrap();
        xt.unary(op)
            .unwrap()
            .mul(&wt)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        let got = xt.grad().unwrap().to_vec().unwrap();
        let h = 1e-6;
        for i in 0..35 {
            let fd = (f(x[i] + h) - f(x[i] - h)) / (2.0 * h) * w[i];
            let err = (got[i] as f64 - fd).abs();
            assert!(
                err <= 2e-5 + 2e-5 * fd.abs(),
                "{op:?} at x = {}: autograd {} vs f64 finite difference {fd} ({storage:?})",
                x[i],
                got[i]
            );
        }
    }
}

#[test]
fn unary_gradients_match_f64_finite_differences() {
    let mut rng = Rng::new(seed());
    type Case = (UnaryOp, fn(f64) -> f64, f64, f64);
    let cases: Vec<Case> = vec![
        (UnaryOp::Neg, |x| -x, -2.0, 2.0),
        (UnaryOp::Abs, |x| x.abs(), -2.0, 2.0),
        (UnaryOp::Exp, |x| x.exp(), -2.0, 2.0),
        (UnaryOp::Exp2, |x| x.exp2(), -2.0, 2.0),
        (UnaryOp::Log, |x| x.ln(), 0.2, 3.0),
        (UnaryOp::Log2, |x| x.log2(), 0.2, 3.0),
        (UnaryOp::Sqrt, |x| x.sqrt(), 0.2, 3.0),
        (UnaryOp::Rsqrt, |x| 1.0 / x.sqrt(), 0.3, 3.0),
        (UnaryOp::Recip, |x| 1.0 / x, 0.3, 3.0),
        (UnaryOp::Sin, |x| x.sin(), -3.0, 3.0),
        (UnaryOp::Cos, |x| x.cos(), -3.0, 3.0),
        (UnaryOp::Tanh, |x| x.tanh(), -2.0, 2.0),
        (UnaryOp::Sigmoid, |x| 1.0 / (1.0 + (-x).exp()), -3.0, 3.0),
        (UnaryOp::Relu, |x| x.max(0.0), -2.0, 2.0),
        (
            UnaryOp::LeakyRelu { slope: 0.1 },
            |x| if x > 0.0 { x } else { 0.1 * x },
            -2.0,
            2.0,
        ),
        (UnaryOp::Silu, |x| x / (1.0 + (-x).exp()), -3.0, 3.0),
        (UnaryOp::Square, |x| x * x, -2.0, 2.0),
        (
            UnaryOp::Affine {
                scale: 1.5,
                shift: -0.25,
            },
            |x| 1.5 * x - 0.25,
            -2.0,
            2.0,
        ),
        (
            UnaryOp::Clamp { lo: -0.5, hi: 0.75 },
            |x| x.clamp(-0.5, 0.75),
            -2.0,
            2.0,
        ),
        (UnaryOp::Floor, |x| x.floor(), 0.05, 0.95),
        (UnaryOp::Sign, |x| x.signum(), 0.1, 2.0),
        (
            UnaryOp::Gelu,
            |x| {
                let mut sum = 0.0;
                let z = x / std::f64::consts::SQRT_2;
                let mut term = z;
                let mut n = 0.0;
                while n < 80.0 {
                    sum += term / (2.0 * n + 1.0);
                    n += 1.0;
                    term *= -z * z / n;
                }
                0.5 * x * (1.0 + sum * 2.0 / std::f64::consts::PI.sqrt())
            },
            -2.5,
            2.5,
        ),
    ];
    for (op, f, lo, hi) in cases {
        check_unary(op, f, lo, hi, &mut rng);
    }
}

#[test]
fn binary_gradients_with_broadcasting_match_f64_finite_differences() {
    let dev = CpuBackend::new();
    let mut rng = Rng::new(seed());
    type F = fn(f64, f64) -> f64;
    type Range = (f64, f64);
    let ops: Vec<(&str, F, Range, Range)> = vec![
        ("add", |a, b| a + b, (-2.0, 2.0), (-2.0, 2.0)),
        ("sub", |a, b| a - b, (-2.0, 2.0), (-2.0, 2.0)),
        ("mul", |a, b| a * b, (-2.0, 2.0), (-2.0, 2.0)),
        ("div", |a, b| a / b, (-2.0, 2.0), (0.5, 2.0)),
        (
            "rem",
            |a, b| a - b * (a / b).floor(),
            (0.1, 0.9),
            (1.0, 2.0),
        ),
        ("pow", |a, b| a.powf(b), (0.5, 2.0), (-1.5, 1.5)),
        ("maximum", |a, b| a.max(b), (-2.0, 2.0), (-2.0, 2.0)),
        ("minimum", |a, b| a.min(b), (-2.0, 2.0), (-2.0, 2.0)),
        ("atan2", |a, b| a.atan2(b), (-2.0, 2.0), (0.3, 2.0)),
    ];
    // a: [3, 4, 5] (transposed storage) against b: [4, 1] (broadcast along two dimensions).
    let (sa, sb, so) = ([3usize, 4, 5], [4usize, 1], [3usize, 4, 5]);
    for (name, f, ra, rb) in ops {
        let a = rng.vec(60, ra.0, ra.1);
        let b = rng.vec(4, rb.0, rb.1);
        let w = rng.vec(60, -1.0, 1.0);
        let at = leaf(&dev, &a, &sa, Storage::Transposed);
        let bt = leaf(&dev, &b, &sb, Storage::Contiguous);
        let wt =
            T::from_slice(&dev, &w.iter().map(|&v| v as f32).collect::<Vec<_>>(), &so).unwrap();
        let y = match name {
            "add" => at.add(&bt),
            "sub" => at.sub(&bt),
            "mul" => at.mul(&bt),
            "div" => at.div(&bt),
            "rem" => at.rem(&bt),
            "pow" => at.pow(&bt),
            "maximum" => at.maximum(&bt),
            "minimum" => at.minimum(&bt),
            _ => at.atan2(&bt),
        }
        .unwrap();
        y.mul(&wt).unwrap().sum_all().unwrap().backward().unwrap();
        let (ga, gb) = (
            at.grad().unwrap().to_vec().unwrap(),
            bt.grad().unwrap().to_vec().unwrap(),
        );
        let h = 1e-6;
        let mut fd_b = [0f64; 4];
        for i in 0..3 {
            for j in 0..4 {
                for k in 0..5 {
                    let p = (i * 4 + j) * 5 + k;
                    let da = (f(a[p] + h, b[j]) - f(a[p] - h, b[j])) / (2.0 * h) * w[p];
                    fd_b[j] += (f(a[p], b[j] + h) - f(a[p], b[j] - h)) / (2.0 * h) * w[p];
                    assert!(
                        (ga[p] as f64 - da).abs() <= 2e-5 + 2e-5 * da.abs(),
                        "{name}: d/da at {p}: autograd {} vs {da}",
                        ga[p]
                    );
                }
            }
        }
        for j in 0..4 {
            assert!(
                (gb[j] as f64 - fd_b[j]).abs() <= 1e-4 + 1e-4 * fd_b[j].abs(),
                "{name}: d/db (broadcast, summed) at {j}: autograd {} vs {}",
                gb[j],
                fd_b[j]
            );
        }
    }
}

const LOOSE: (f64, f64) = (2e-3, 1e-2);

/// Distinct values at least `2 / n` apart in a random order: inputs of max, min and max
/// pooling, whose finite differences only exist away from ties.
fn spaced(rng: &mut Rng, shape: &[usize], storage: Storage) -> (Vec<f64>, Vec<usize>, Storage) {
    let n: usize = shape.iter().product();
    let mut values: Vec<f64> = (0..n).map(|i| -1.0 + 2.0 * i as f64 / n as f64).collect();
    for i in (1..n).rev() {
        values.swap(i, rng.below(i + 1));
    }
    (values, shape.to_vec(), storage)
}

fn input(rng: &mut Rng, shape: &[usize], storage: Storage) -> (Vec<f64>, Vec<usize>, Storage) {
    let n = shape.iter().product();
    (rng.vec(n, -1.0, 1.0), shape.to_vec(), storage)
}

#[test]
fn reduction_gradients() {
    let dev = CpuBackend::new();
    let mut rng = Rng::new(seed());
    let x = |rng: &mut Rng| vec![spaced(rng, &[4, 3, 5], Storage::Transposed)];
    type Fx = Box<dyn Fn(&[T]) -> tensor_autograd::Result<T>>;
    let cases: Vec<(&str, Fx)> = vec![
        ("sum axes", Box::new(|v: &[T]| v[0].sum(&[0, 2], false))),
        ("sum keepdim", Box::new(|v: &[T]| v[0].sum(&[-1], true))),
        ("mean", Box::new(|v: &[T]| v[0].mean(&[1], false))),
        ("mean_all", Box::new(|v: &[T]| v[0].mean_all())),
        ("max", Box::new(|v: &[T]| v[0].max(1, false))),
        ("min", Box::new(|v: &[T]| v[0].min(-1, true))),
        ("max_all", Box::new(|v: &[T]| v[0].max_all())),
        ("var", Box::new(|v: &[T]| v[0].var(&[0, 2], 1, false))),
        ("logsumexp", Box::new(|v: &[T]| v[0].logsumexp(2, false))),
        ("softmax", Box::new(|v: &[T]| v[0].softmax(1))),
        ("log_softmax", Box::new(|v: &[T]| v[0].log_softmax(-1))),
    ];
    for (name, f) in cases {
        println!("{name}");
        let xs = x(&mut rng);
        gradcheck(&dev, &mut rng, &xs, 1e-3, LOOSE, &*f);
    }
}

#[test]
fn movement_gradients() {
    let dev = CpuBackend::new();
    let mut rng = Rng::new(seed());
    type Fx = Box<dyn Fn(&[T]) -> tensor_autograd::Result<T>>;
    let cases: Vec<(&str, Fx)> = vec![
        (
            "reshape of a strided view",
            Box::new(|v: &[T]| v[0].reshape(&[5, 12])),
        ),
        (
            "permute",
            Box::new(|v: &[T]| v[0].permute(&[2, 0, 1])?.square()),
        ),
        ("transpose", Box::new(|v: &[T]| v[0].transpose(0, 2)?.exp())),
        (
            "expand",
            Box::new(|v: &[T]| v[0].narrow(1, 0, 1)?.expand(&[4, 6, 5])?.square()),
        ),
        ("narrow", Box::new(|v: &[T]| v[0].narrow(2, 1, 3)?.square())),
        ("flip", Box::new(|v: &[T]| v[0].flip(1)?.mul(&v[0]))),
        ("step", Box::new(|v: &[T]| v[0].step(2, 2)?.square())),
        (
            "pad",
            Box::new(|v: &[T]| v[0].pad(&[(1, 0), (0, 2), (1, 1)], 0.5)?.square()),
        ),
        (
            "squeeze/unsqueeze",
            Box::new(|v: &[T]| v[0].unsqueeze(1)?.squeeze(1)?.square()),
        ),
        (
            "contiguous",
            Box::new(|v: &[T]| v[0].contiguous()?.square()),
        ),
        ("flatten", Box::new(|v: &[T]| v[0].flatten(1)?.square())),
    ];
    for (name, f) in cases {
        println!("{name}");
        let x = vec![input(&mut rng, &[4, 3, 5], Storage::Transposed)];
        gradcheck(&dev, &mut rng, &x, 1e-2, LOOSE, &*f);
    }
    // cat and stack of two inputs, one transposed.
    let xs = vec![
        input(&mut rng, &[3, 4], Storage::Transposed),
        input(&mut rng, &[2, 4], Storage::Contiguous),
    ];
    gradcheck(&dev, &mut rng, &xs, 1e-2, LOOSE, &|v: &[T]| {
        T::cat(&[&v[0], &v[1], &v[0]], 0)?.square()
    });
    let xs = vec![
        input(&mut rng, &[3, 4], Storage::Transposed),
        input(&mut rng, &[3, 4], Storage::Contiguous),
    ];
    gradcheck(&dev, &mut rng, &xs, 1e-2, LOOSE, &|v: &[T]| {
        T::stack(&[&v[0], &v[1]], 1)?.square()
    });
    // where: the condition (fixed random 0/1, so finite differences never cross a branch)
    // takes no gradient; both branches broadcast.
    let mask: Vec<f32> = (0..12).map(|_| rng.below(2) as f32).collect();
    let cond = T::from_slice(&dev, &mask, &[3, 4]).unwrap();
    let xs = vec![
        input(&mut rng, &[3, 4], Storage::Transposed),
        input(&mut rng, &[4], Storage::Contiguous),
    ];
    gradcheck(&dev, &mut rng, &xs, 1e-2, LOOSE, &move |v: &[T]| {
        cond.where_cond(&v[0].square()?, &v[1])
    });
}

#[test]
fn matmul_gradients() {
    let dev = CpuBackend::new();
    let mut rng = Rng::new(seed());
    let shapes: [(&[usize], &[usize]); 6] = [
        (&[3, 4], &[4, 5]),
        (&[2, 3, 4], &[2, 4, 5]),
        (&[1, 3, 4], &[3, 4, 2]),
        (&[2, 3, 4], &[4, 5]),
        (&[3, 4], &[2, 4, 5]),
        (&[2, 2, 3, 4], &[4, 3]),
    ];
    for (sa, sb) in shapes {
        println!("{sa:?} @ {sb:?}");
        let xs = vec![
            input(&mut rng, sa, Storage::Transposed),
            input(&mut rng, sb, Storage::Transposed),
        ];
        gradcheck(&dev, &mut rng, &xs, 1e-2, LOOSE, &|v: &[T]| {
            v[0].matmul(&v[1])
        });
    }
    let xs = vec![
        input(&mut rng, &[5, 3], Storage::Contiguous),
        input(&mut rng, &[4, 3], Storage::Transposed),
        input(&mut rng, &[4], Storage::Contiguous),
    ];
    gradcheck(&dev, &mut rng, &xs, 1e-2, LOOSE, &|v: &[T]| {
        v[0].linear(&v[1], Some(&v[2]))
    });
    // With the activation after it: one fused operation for sigmoid and tanh (their
    // derivatives come from the output), the separate operations for GELU; with and without
    // a bias. (ReLU, whose kink finite differences straddle, is checked against the separate
    // operations in `linear_activation_matches_the_separate_operations`.)
    for act in [UnaryOp::Sigmoid, UnaryOp::Tanh, UnaryOp::Gelu] {
        println!("linear + {act:?}");
        gradcheck(&dev, &mut rng, &xs, 1e-2, LOOSE, &|v: &[T]| {
            v[0].linear_activation(&v[1], Some(&v[2]), Some(act))
        });
        gradcheck(&dev, &mut rng, &xs[..2], 1e-2, LOOSE, &|v: &[T]| {
            v[0].linear_activation(&v[1], None, Some(act))
        });
    }
}

/// The fused Linear + activation (what `Sequential` runs for a Linear layer and the
/// activation after it) gives the values and gradients of the separate operations, bit for
/// bit on the CPU backend (which runs the same kernels either way), for every activation,
/// on a transposed weight and an odd batch.
#[test]
fn linear_activation_matches_the_separate_operations() {
    let dev = CpuBackend::new();
    let mut rng = Rng::new(seed());
    let acts = [
        None,
        Some(UnaryOp::Relu),
        Some(UnaryOp::Sigmoid),
        Some(UnaryOp::Tanh),
        Some(UnaryOp::LeakyRelu { slope: 0.1 }),
    ];
    for act in acts {
        let x = rng.vec(7 * 5, -1.0, 1.0);
        let w = rng.vec(6 * 5, -1.0, 1.0);
        let b = rng.vec(6, -1.0, 1.0);
        let up = |v: &[f64], shape: &[usize], storage| leaf(&dev, v, shape, storage);
        let run = |fused: bool| {
            let (xt, wt, bt) = (
                up(&x, &[7, 5], Storage::Contiguous),
                up(&w, &[6, 5], Storage::Transposed),
                up(&b, &[6], Storage::Contiguous),
            );
            let y = if fused {
                xt.linear_activation(&wt, Some(&bt), act).unwrap()
            } else {
                let z = xt.matmul(&wt.t().unwrap()).unwrap().add(&bt).unwrap();
                act.map_or(z.clone(), |op| z.unary(op).unwrap())
            };
            y.square().unwrap().sum_all().unwrap().backward().unwrap();
            let grad = |t: &T| t.grad().unwrap().to_vec().unwrap();
            (y.to_vec().unwrap(), grad(&xt), grad(&wt), grad(&bt))
        };
        assert_eq!(run(true), run(false), "{act:?}");
    }
}

#[test]
fn convolution_and_pooling_gradients() {
    let dev = CpuBackend::new();
    let mut rng = Rng::new(seed());
    let configs = [
        (Conv2dOptions::default(), 2, 3, (3, 3)),
        (
            Conv2dOptions {
                stride: (2, 1),
                padding: (1, 2),
                dilation: (1, 1),
                groups: 1,
                ..Default::default()
            },
            2,
            3,
            (3, 2),
        ),
        (
            Conv2dOptions {
                stride: (1, 1),
                padding: (1, 1),
                dilation: (2, 1),
                groups: 1,
                ..Default::default()
            },
            1,
            2,
            (2, 2),
        ),
        (
            Conv2dOptions {
                stride: (1, 2),
                padding: (0, 1),
                dilation: (1, 1),
                groups: 2,
                ..Default::default()
            },
            4,
            2,
            (2, 3),
        ),
    ];
    for (opt, cin, cout, k) in configs {
        println!("conv2d {opt:?}");
        let xs = vec![
            input(&mut rng, &[2, cin, 6, 5], Storage::Transposed),
            input(
                &mut rng,
                &[cout, cin / opt.groups, k.0, k.1],
                Storage::Contiguous,
            ),
            input(&mut rng, &[cout], Storage::Contiguous),
        ];
        gradcheck(&dev, &mut rng, &xs, 1e-2, LOOSE, &move |v: &[T]| {
            v[0].conv2d(&v[1], Some(&v[2]), opt)
        });
    }
    // Pools. Max pooling needs values apart by more than the step within each window for a
    // finite difference to exist: spaced inputs.
    let xs = vec![spaced(&mut rng, &[2, 3, 7, 6], Storage::Transposed)];
    gradcheck(&dev, &mut rng, &xs, 1e-3, LOOSE, &|v: &[T]| {
        v[0].max_pool2d((2, 2), (2, 2), (0, 0))
    });
    gradcheck(&dev, &mut rng, &xs, 1e-3, LOOSE, &|v: &[T]| {
        v[0].max_pool2d((3, 2), (2, 1), (1, 1))
    });
    gradcheck(&dev, &mut rng, &xs, 1e-2, LOOSE, &|v: &[T]| {
        v[0].avg_pool2d((3, 3), (2, 2), (1, 1))
    });
}

#[test]
fn indexing_loss_and_layer_gradients() {
    let dev = CpuBackend::new();
    let mut rng = Rng::new(seed());
    let idx: Vec<u32> = (0..6).map(|_| rng.below(4) as u32).collect();
    let index = Tensor::from_elements(&dev, &idx, &[6]).unwrap();
    let xs = vec![input(&mut rng, &[4, 3], Storage::Transposed)];
    let i2 = index.clone();
    gradcheck(&dev, &mut rng, &xs, 1e-3, LOOSE, &move |v: &[T]| {
        v[0].index_select(0, &i2)
    });
    let g_idx: Vec<u32> = (0..8).map(|_| rng.below(3) as u32).collect();
    let gi = Tensor::from_elements(&dev, &g_idx, &[4, 2]).unwrap();
    gradcheck(&dev, &mut rng, &xs, 1e-3, LOOSE, &move |v: &[T]| {
        v[0].gather(1, &gi)
    });

    let targets: Vec<u32> = (0..5).map(|_| rng.below(4) as u32).collect();
    let tt = Tensor::from_elements(&dev, &targets, &[5]).unwrap();
    let logits = vec![input(&mut rng, &[5, 4], Storage::Transposed)];
    let t1 = tt.clone();
    gradcheck(&dev, &mut rng, &logits, 1e-3, LOOSE, &move |v: &[T]| {
        v[0].cross_entropy(&t1)
    });
    let t2 = tt.clone();
    gradcheck(&dev, &mut rng, &logits, 1e-3, LOOSE, &move |v: &[T]| {
        v[0].log_softmax(1)?.nll_loss(&t2)
    });
    let pair = vec![
        input(&mut rng, &[5, 4], Storage::Transposed),
        input(&mut rng, &[5, 4], Storage::Contiguous),
    ];
    gradcheck(&dev, &mut rng, &pair, 1e-3, LOOSE, &|v: &[T]| {
        v[0].mse_loss(&v[1])
    });
    let probs: Vec<f32> = (0..20).map(|_| rng.uniform(0.0, 1.0) as f32).collect();
    let pt = Tensor::from_slice(&dev, &probs, &[5, 4]).unwrap();
    gradcheck(&dev, &mut rng, &logits, 1e-3, LOOSE, &move |v: &[T]| {
        v[0].bce_with_logits(&pt)
    });

    // Dropout with a fixed stream is a fixed mask times a scale: differentiable.
    gradcheck(&dev, &mut rng, &logits, 1e-3, LOOSE, &|v: &[T]| {
        v[0].dropout(0.3, 7, 0)
    });

    // LayerNorm and BatchNorm2d (training mode, batch statistics) with their parameters.
    let mut init = Init::new(&dev, 3);
    let ln = LayerNorm::new(&mut init, 4).unwrap();
    let w = T::from_slice(&dev, &[0.5, -1.0, 2.0, 1.5], &[4]).unwrap();
    no_grad(|| ln.weight.assign(&w)).unwrap();
    gradcheck(&dev, &mut rng, &logits, 1e-3, LOOSE, &|v: &[T]| {
        ln.forward(&v[0])
    });
    let bn = BatchNorm2d::new(&mut init, 3).unwrap();
    let xs = vec![input(&mut rng, &[2, 3, 2, 3], Storage::Transposed)];
    gradcheck(&dev, &mut rng, &xs, 1e-3, LOOSE, &|v: &[T]| {
        bn.forward(&v[0])
    });
}

#[test]
fn gradients_accumulate_and_respect_no_grad_and_detach() {
    let dev = CpuBackend::new();
    let x = T::from_slice(&dev, &[1.0, -2.0, 3.0], &[3])
        .unwrap()
        .requires_grad();
    let y = x.square().unwrap().sum_all().unwrap();
    y.backward().unwrap();
    y.backward().unwrap();
    assert_eq!(x.grad().unwrap().to_vec().unwrap(), vec![4.0, -8.0, 12.0]);
    x.zero_grad();
    // A path through detach contributes nothing; a tensor used twice gets both paths.
    let z = x
        .mul(&x.detach())
        .unwrap()
        .add(&x)
        .unwrap()
        .sum_all()
        .unwrap();
    z.backward().unwrap();
    assert_eq!(x.grad().unwrap().to_vec().unwrap(), vec![2.0, -1.0, 4.0]);
    let w = no_grad(|| x.square().unwrap());
    assert!(!w.requires_grad_flag());
    assert!(w.sum_all().unwrap().backward().is_err());
}
