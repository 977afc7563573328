//! `gradcheck` on f64 tensors (CPU backend): autograd's gradients of the operations against
//! central differences in f64, to tolerances far tighter than PyTorch's defaults
//! (`atol 1e-8`, `rtol 1e-6`): an operation that computed anywhere in f32 would miss them by
//! orders of magnitude. Fresh random inputs each run (the seed is printed), every operation
//! whose backward is a fused IR kernel (the math functions, pow, atan2, max, var, softmax,
//! ...) among them: those kernels run in f64 on f64 tensors.

use backend_cpu::CpuBackend;
use hal::{Backend, DType};
use tensor_autograd::{
    AttentionOptions, Conv2dOptions, GradcheckOptions, Result, Tensor, gradcheck,
};

const TIGHT: GradcheckOptions = GradcheckOptions {
    eps: 1e-6,
    atol: 1e-8,
    rtol: 1e-6,
};

fn seed() -> u64 {
    hal_parity::fresh_seed("GRADCHECK_SEED")
}

/// An f64 tensor of `shape` with values in `[lo, hi)` from a SplitMix64 stream.
fn input<B: Backend>(dev: &B, state: &mut u64, shape: &[usize], lo: f64, hi: f64) -> Tensor<B> {
    let n: usize = shape.iter().product();
    let v: Vec<f64> = (0..n)
        .map(|_| {
            *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = *state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            lo + (hi - lo) * (((z ^ (z >> 31)) >> 11) as f64 * 2f64.powi(-53))
        })
        .collect();
    Tensor::from_elements(dev, &v, shape).unwrap()
}

type Op<B> = Box<dyn Fn(&[Tensor<B>]) -> Result<Tensor<B>>>;
/// A named case: its f64 inputs and the function of them to check.
type Case<B> = (&'static str, Vec<Tensor<B>>, Op<B>);

#[test]
fn gradients_in_f64_match_central_differences() {
    check_all(&CpuBackend::new());
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored on a GPU host"]
fn gradients_in_f64_on_cuda() {
    check_all(&backend_cuda::CudaBackend::new().expect("the CUDA backend is required"));
}

fn check_all<B: Backend>(dev: &B) {
    let dev = dev.clone();
    let mut s = seed();
    let ops: Vec<Case<B>> = vec![
        (
            "add, sub, mul, div with broadcasting",
            vec![
                input(&dev, &mut s, &[3, 4], -2.0, 2.0),
                input(&dev, &mut s, &[4], 0.5, 2.0),
            ],
            Box::new(|x| x[0].add(&x[1])?.mul(&x[0])?.sub(&x[1])?.div(&x[1])),
        ),
        (
            "exp, log, sqrt, tanh, sigmoid, gelu, sin, cos",
            vec![input(&dev, &mut s, &[2, 5], 0.2, 2.0)],
            Box::new(|x| {
                let v = &x[0];
                v.exp()?
                    .add(&v.log()?)?
                    .add(&v.sqrt()?)?
                    .add(&v.tanh()?)?
                    .add(&v.sigmoid()?)?
                    .add(&v.gelu()?)?
                    .add(&v.sin()?.mul(&v.cos()?)?)
            }),
        ),
        (
            "pow and atan2",
            vec![
                input(&dev, &mut s, &[6], 0.5, 2.0),
                input(&dev, &mut s, &[6], -1.5, 1.5),
            ],
            Box::new(|x| x[0].pow(&x[1])?.add(&x[1].atan2(&x[0])?)),
        ),
        (
            "batched matmul",
            vec![
                input(&dev, &mut s, &[2, 3, 4], -1.0, 1.0),
                input(&dev, &mut s, &[2, 4, 5], -1.0, 1.0),
            ],
            Box::new(|x| x[0].matmul(&x[1])),
        ),
        (
            "sum and mean over axes",
            vec![input(&dev, &mut s, &[3, 4, 5], -1.0, 1.0)],
            Box::new(|x| {
                let v = &x[0];
                v.sum(&[1], false)?.mul(&v.mean(&[1], false)?)
            }),
        ),
        (
            "var",
            vec![input(&dev, &mut s, &[3, 4, 5], -1.0, 1.0)],
            Box::new(|x| x[0].var(&[1], 1, false)),
        ),
        (
            "softmax, log_softmax, logsumexp",
            vec![input(&dev, &mut s, &[4, 7], -3.0, 3.0)],
            Box::new(|x| {
                let v = &x[0];
                v.softmax(-1)?
                    .add(&v.log_softmax(-1)?)?
                    .sum(&[1], false)?
                    .add(&v.logsumexp(-1, false)?)
            }),
        ),
        (
            "gelu across both forms of erf (|x| below and above 2.5)",
            vec![input(&dev, &mut s, &[16], -5.0, 5.0)],
            Box::new(|x| x[0].gelu()),
        ),
        (
            "gelu's tanh form",
            vec![input(&dev, &mut s, &[16], -5.0, 5.0)],
            Box::new(|x| x[0].gelu_tanh()),
        ),
        (
            "relu, silu, square, exp2, log2, rsqrt, recip",
            vec![input(&dev, &mut s, &[2, 5], 0.3, 2.0)],
            Box::new(|x| {
                let v = &x[0];
                v.relu()?
                    .add(&v.silu()?)?
                    .add(&v.square()?)?
                    .add(&v.exp2()?)?
                    .add(&v.log2()?)?
                    .add(&v.rsqrt()?)?
                    .add(&v.recip()?)
            }),
        ),
        (
            "abs, leaky_relu, clamp (away from their kinks)",
            vec![input(&dev, &mut s, &[2, 5], -2.0, -0.3)],
            Box::new(|x| {
                let v = &x[0];
                v.abs()?.add(&v.leaky_relu(0.1)?)?.add(&v.clamp(-1.5, 1.0)?)
            }),
        ),
        (
            "maximum, minimum, rem",
            vec![
                input(&dev, &mut s, &[7], -1.0, 1.0),
                input(&dev, &mut s, &[7], 0.5, 1.5),
            ],
            Box::new(|x| {
                x[0].maximum(&x[1])?
                    .add(&x[0].minimum(&x[1])?)?
                    .add(&x[0].rem(&x[1])?)
            }),
        ),
        (
            "conv2d (stride 2, padding 1), max_pool2d, cross_entropy",
            vec![
                input(&dev, &mut s, &[2, 2, 7, 7], -1.0, 1.0),
                input(&dev, &mut s, &[3, 2, 3, 3], -1.0, 1.0),
                input(&dev, &mut s, &[3], -0.5, 0.5),
            ],
            Box::new(|x| {
                let options = Conv2dOptions {
                    stride: (2, 2),
                    padding: (1, 1),
                    ..Conv2dOptions::default()
                };
                let y = x[0].conv2d(&x[1], Some(&x[2]), options)?;
                let pooled = y.max_pool2d((2, 2), (2, 2), (0, 0))?;
                let logits = pooled.reshape(&[2, 12])?;
                let labels = Tensor::from_elements(x[0].backend(), &[3u32, 10], &[2])?;
                logits.cross_entropy(&labels)
            }),
        ),
        (
            "fused attention: causal, additive mask, dropout, permuted q",
            vec![
                input(&dev, &mut s, &[2, 5, 2, 3], -1.5, 1.5),
                input(&dev, &mut s, &[2, 2, 6, 3], -1.5, 1.5),
                input(&dev, &mut s, &[2, 2, 6, 4], -1.0, 1.0),
            ],
            Box::new(|x| {
                let mask = Tensor::from_elements(
                    x[0].backend(),
                    &(0..30)
                        .map(|i| {
                            if i % 7 == 3 {
                                f64::NEG_INFINITY
                            } else {
                                (i % 5) as f64 * 0.3
                            }
                        })
                        .collect::<Vec<_>>(),
                    &[5, 6],
                )?;
                let options = AttentionOptions {
                    mask: Some(mask),
                    causal: true,
                    dropout: 0.3,
                    seed: 11,
                    ..AttentionOptions::default()
                };
                let q = x[0].permute(&[0, 2, 1, 3])?;
                let y = q.scaled_dot_product_attention(&x[1], &x[2], &options)?;
                y.mul(&y)
            }),
        ),
        (
            "dropout_add against dropout then add, transposed input",
            vec![
                input(&dev, &mut s, &[6, 5], -1.0, 1.0),
                input(&dev, &mut s, &[5, 6], -1.0, 1.0),
            ],
            Box::new(|x| {
                let t = x[0].transpose(0, 1)?;
                let fused = t.dropout_add(&x[1], 0.4, 9, 3)?;
                let composed = x[1].add(&t.dropout(0.4, 9, 3)?)?;
                fused.mul(&fused)?.add(&composed.sin()?)
            }),
        ),
        (
            "packed qkv attention: causal, dropout, two heads",
            vec![input(&dev, &mut s, &[2, 5, 18], -1.5, 1.5)],
            Box::new(|x| {
                let options = AttentionOptions {
                    causal: true,
                    dropout: 0.3,
                    seed: 5,
                    ..AttentionOptions::default()
                };
                let y = x[0].qkv_attention(2, &options)?;
                y.mul(&y)
            }),
        ),
        (
            "fused layer_norm over two trailing dims, transposed input, weight and bias",
            vec![
                input(&dev, &mut s, &[3, 4, 5], -2.0, 2.0),
                input(&dev, &mut s, &[3, 5], 0.5, 1.5),
                input(&dev, &mut s, &[3, 5], -0.5, 0.5),
            ],
            Box::new(|x| {
                let v = x[0].transpose(0, 1)?;
                let y = v.layer_norm(2, Some(&x[1]), Some(&x[2]), 1e-5)?;
                y.mul(&y.sin()?)
            }),
        ),
        (
            "views: transpose, reshape, narrow, flip",
            vec![input(&dev, &mut s, &[4, 6], -1.0, 1.0)],
            Box::new(|x| {
                let v = x[0].transpose(0, 1)?.reshape(&[3, 8])?;
                let w = v.narrow(1, 2, 5)?.flip(0)?;
                // A narrowed tensor split as a view, then merged across the cut (a copy).
                let n = x[0].narrow(1, 1, 4)?.reshape(&[4, 2, 2])?;
                let m = n.reshape(&[2, 8])?;
                w.mul(&w)?
                    .sum_all()?
                    .add(&n.mul(&n)?.sum_all()?)?
                    .add(&m.sin()?.sum_all()?)
            }),
        ),
    ];
    let mut failures = Vec::new();
    for (name, inputs, f) in ops {
        let result = gradcheck(&inputs, |x| f(x), TIGHT);
        let report = match result {
            Ok(r) => r,
            Err(e) => {
                failures.push(format!("{name}: {e}"));
                continue;
            }
        };
        println!(
            "{name}: {} elements, worst {:.3} of the tolerance",
            report.checked, report.worst
        );
        if !report.passed() {
            failures.push(format!("{name}: {:?}", report.failures));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A gradient that is wrong is caught: the check of `f(x) = x * x` against a function that
/// reads `x` three times but lets autograd see it twice fails.
#[test]
fn a_wrong_gradient_fails_the_check() {
    let dev = CpuBackend::new();
    let x = Tensor::from_elements(&dev, &[0.5f64, -1.25, 2.0], &[3]).unwrap();
    let report = gradcheck(
        &[x],
        |v| v[0].mul(&v[0].detach())?.mul(&v[0]),
        GradcheckOptions::default(),
    )
    .unwrap();
    assert!(!report.passed(), "{report:?}");
}

/// Inputs that are not f64 are refused, not checked in f32.
#[test]
fn f32_inputs_are_refused() {
    let dev = CpuBackend::new();
    let x = Tensor::from_slice(&dev, &[1.0, 2.0], &[2]).unwrap();
    assert_eq!(x.dtype(), DType::F32);
    assert!(gradcheck(&[x], |v| v[0].exp(), GradcheckOptions::default()).is_err());
}
