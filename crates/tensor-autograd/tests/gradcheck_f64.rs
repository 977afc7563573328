//! `gradcheck` on f64 tensors (CPU backend): autograd's gradients of the operations against
//! central differences in f64, to tolerances far tighter than PyTorch's defaults
//! (`atol 1e-8`, `rtol 1e-6`): an operation that computed anywhere in f32 would miss them by
//! orders of magnitude. Fresh random inputs each run (the seed is printed). The operations
//! whose backward is a fused IR kernel (the math functions, pow, atan2, var, softmax, ...) have no f64
//! form yet: the `FUSED` cases check that they are refused, with the reason.

use backend_cpu::CpuBackend;
use hal::DType;
use tensor_autograd::{GradcheckOptions, Result, Tensor, gradcheck};

type T = Tensor<CpuBackend>;

const TIGHT: GradcheckOptions = GradcheckOptions {
    eps: 1e-6,
    atol: 1e-8,
    rtol: 1e-6,
};

fn seed() -> u64 {
    hal_parity::fresh_seed("GRADCHECK_SEED")
}

/// An f64 tensor of `shape` with values in `[lo, hi)` from a SplitMix64 stream.
fn input(dev: &CpuBackend, state: &mut u64, shape: &[usize], lo: f64, hi: f64) -> T {
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

type Op = Box<dyn Fn(&[T]) -> Result<T>>;

#[test]
fn gradients_in_f64_match_central_differences() {
    let dev = CpuBackend::new();
    let mut s = seed();
    let ops: Vec<(&str, Vec<T>, Op)> = vec![
        (
            "add, sub, mul, div with broadcasting",
            vec![
                input(&dev, &mut s, &[3, 4], -2.0, 2.0),
                input(&dev, &mut s, &[4], 0.5, 2.0),
            ],
            Box::new(|x| x[0].add(&x[1])?.mul(&x[0])?.sub(&x[1])?.div(&x[1])),
        ),
        (
            "FUSED exp, log, sqrt, tanh, sigmoid, gelu, sin, cos",
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
            "FUSED pow and atan2",
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
            "FUSED var",
            vec![input(&dev, &mut s, &[3, 4, 5], -1.0, 1.0)],
            Box::new(|x| x[0].var(&[1], 1, false)),
        ),
        (
            "FUSED softmax, log_softmax, logsumexp",
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
            "views: transpose, reshape, narrow, flip",
            vec![input(&dev, &mut s, &[4, 6], -1.0, 1.0)],
            Box::new(|x| {
                let v = x[0].transpose(0, 1)?.reshape(&[3, 8])?;
                let w = v.narrow(1, 2, 5)?.flip(0)?;
                w.mul(&w)
            }),
        ),
    ];
    let mut failures = Vec::new();
    for (name, inputs, f) in ops {
        let result = gradcheck(&inputs, |x| f(x), TIGHT);
        if name.starts_with("FUSED") {
            // The fused backward kernels are f32 only: refused, with the reason.
            match result {
                Err(e) if e.to_string().contains("no f64 form yet") => continue,
                other => {
                    failures.push(format!("{name}: expected a refusal, got {other:?}"));
                    continue;
                }
            }
        }
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
