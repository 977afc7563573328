//! Every operation's derivative against central finite differences in `f64`, and the compiled
//! kernels (CPU backend, `f32`) against the `f64` reference, on fresh random inputs.

mod common;

use backend_cpu::CpuBackend;
use common::seed;
use hal::BackendExt;
use residual_compile::icosphere::SplitMix64;
use residual_compile::{CompiledProblem, KernelCache, Loss, Precision, Problem, Var, Vec2, Vec3};

type Residual = for<'t> fn(&[Var<'t>], &[Var<'t>]) -> Vec<Var<'t>>;

/// One case per operation (and the vector helpers), each over 3 parameters and 1 constant.
/// Inputs are drawn in `[0.3, 1.7]` (and `c` in `[0.5, 1.5]`) so every function is smooth
/// there; `select`, `min`, `max`, `abs` and `relu` get inputs on both sides of their kinks.
fn cases() -> Vec<(&'static str, Residual)> {
    vec![
        ("add sub", |p, c| {
            vec![p[0] + p[1] - p[2] + c[0], 2.0 - p[0]]
        }),
        ("mul div", |p, c| vec![p[0] * p[1] / p[2], c[0] / p[0]]),
        ("neg", |p, _| vec![-(p[0] * p[1])]),
        ("powi", |p, _| {
            vec![p[0].powi(3), p[1].powi(-2), p[2].powi(0) * p[2]]
        }),
        ("powf pow", |p, c| {
            vec![p[0].powf(2.5), p[1].pow(p[2]), p[2].pow(c[0])]
        }),
        ("sqrt rsqrt", |p, _| {
            vec![(p[0] * p[1]).sqrt(), p[2].rsqrt()]
        }),
        ("exp ln", |p, _| {
            vec![(p[0] - p[1]).exp(), (p[2] * p[0]).ln()]
        }),
        ("sin cos tan", |p, _| {
            vec![p[0].sin() * p[1].cos(), (p[2] * 0.5).tan()]
        }),
        ("atan2", |p, _| {
            vec![(p[0] - 1.0).atan2(p[1] - 1.0), p[2].atan2(p[0])]
        }),
        ("abs", |p, _| vec![(p[0] - 1.0).abs() * p[1]]),
        ("min max", |p, _| {
            vec![p[0].min(p[1]) * p[2], p[0].max(p[2]) - p[1]]
        }),
        ("atan", |p, _| {
            vec![(p[0] * 2.0 - p[1]).atan(), p[2].atan() * p[0]]
        }),
        ("tanh sigmoid", |p, _| {
            vec![(p[0] - p[1]).tanh(), (p[2] * 3.0 - 3.0).sigmoid()]
        }),
        ("relu softplus", |p, _| {
            vec![(p[0] - 1.0).relu() * p[1], (p[2] * 4.0 - 4.0).softplus()]
        }),
        ("select", |p, c| {
            vec![
                p[0].lt(p[1]).select(p[0] * p[2], p[1] * p[1]),
                p[2].ge(c[0]).select(p[2], -p[2]),
            ]
        }),
        ("safe_rsqrt", |p, _| vec![(p[0] * p[1]).safe_rsqrt(1e-12)]),
        ("vec2", |p, c| {
            let a = Vec2::new(p[0], p[1]);
            let b = Vec2::new(p[2], c[0]);
            let n = (a - b).normalize();
            vec![a.dot(b), a.cross(b), (a * p[2]).norm(), n.x, n.y]
        }),
        ("vec3", |p, c| {
            let a = Vec3::new(p[0], p[1], p[2]);
            let b = Vec3::new(p[2], c[0], p[0]);
            let x = a.cross(b);
            let n = (a - b * 0.5).normalize();
            vec![
                a.dot(b),
                x.x,
                x.y,
                x.z,
                a.norm(),
                n.x,
                n.y,
                n.z,
                a.norm_squared(),
            ]
        }),
        ("shared subexpressions", |p, _| {
            let s = p[0] * p[1] + p[2];
            let t = s.sin() * s;
            vec![t * t, t + s.exp(), s]
        }),
    ]
}

fn one_block(f: Residual, x: &[f64], c: &[f64]) -> Problem {
    let mut p = Problem::new();
    p.add_parameters(x);
    p.add_residual("case", &[0, 1, 2], c, Loss::Trivial, f)
        .unwrap();
    p
}

fn draw(rng: &mut SplitMix64) -> (Vec<f64>, Vec<f64>) {
    let x: Vec<f64> = (0..3).map(|_| 0.3 + 1.4 * rng.uniform()).collect();
    (x, vec![0.5 + rng.uniform()])
}

#[test]
fn every_operation_matches_central_differences_in_f64() {
    let mut rng = SplitMix64(seed());
    for (name, f) in cases() {
        for _ in 0..20 {
            let (x, c) = draw(&mut rng);
            let problem = one_block(f, &x, &c);
            let graph = &problem.groups()[0].graph;
            let d = graph.derivatives();
            let jac = d.eval_jacobian(&x, &c);
            let r = graph.outputs.len();
            for k in 0..3 {
                let h = 1e-6 * (1.0 + x[k].abs());
                let (mut xp, mut xm) = (x.clone(), x.clone());
                xp[k] += h;
                xm[k] -= h;
                // The kinks of select/min/max/abs/relu: skip a difference that straddles one
                // (the two sides' branches differ).
                let (fp, fm) = (graph.eval(&xp, &c), graph.eval(&xm, &c));
                for i in 0..r {
                    let fd = (fp[i] - fm[i]) / (2.0 * h);
                    let an = jac[i * 3 + k];
                    let straddles = {
                        let mid = graph.eval(&x, &c)[i];
                        ((fp[i] - mid) - (mid - fm[i])).abs() > 1e-4 * (1.0 + mid.abs())
                    };
                    if straddles {
                        continue;
                    }
                    assert!(
                        (fd - an).abs() <= 1e-6 * (1.0 + an.abs()),
                        "{name}: d r{i} / d x{k} at x = {x:?}, c = {c:?}: symbolic {an}, central difference {fd}"
                    );
                }
            }
        }
    }
}

/// The kernels of every case, in both precisions, against the host's f64 evaluation at the
/// inputs the kernel saw (rounded to f32 in f32; as given in f64, where the kernel's rounding
/// is the only difference left: a few units of f64's roundoff, amplified by the case's own
/// conditioning).
#[test]
fn compiled_kernels_match_the_f64_reference() {
    let cpu = CpuBackend::new();
    let cache = KernelCache::new();
    let mut rng = SplitMix64(seed());
    for precision in [Precision::F64, Precision::F32] {
        let (tol_r, tol_j) = match precision {
            Precision::F64 => (1e-12, 1e-12),
            Precision::F32 => (1e-5, 2e-5),
        };
        for (name, f) in cases() {
            let (x, c) = draw(&mut rng);
            let round = |v: &[f64]| -> Vec<f64> {
                match precision {
                    Precision::F64 => v.to_vec(),
                    Precision::F32 => v.iter().map(|&v| v as f32 as f64).collect(),
                }
            };
            let problem = one_block(f, &x, &c);
            let compiled = CompiledProblem::new(&cpu, &problem, &cache, precision).unwrap();
            let eval = compiled.alloc_evaluation().unwrap();
            let params = compiled.upload_floats(&x).unwrap();
            compiled.evaluate(&params, &eval).unwrap();
            let (res, jac) = (
                cpu.read_f64(&eval.residuals).unwrap(),
                cpu.read_f64(&eval.jacobian).unwrap(),
            );
            let (xr, cr) = (round(&x), round(&c));
            let graph = &problem.groups()[0].graph;
            let want_r = graph.eval(&xr, &cr);
            let want_j = graph.derivatives().eval_jacobian(&xr, &cr);
            for (i, (&g, &w)) in res.iter().zip(&want_r).enumerate() {
                assert!(
                    (g - w).abs() <= tol_r * (1.0 + w.abs()),
                    "{name} in {precision:?}: residual {i}: {g} vs {w}"
                );
            }
            for (i, (&g, &w)) in jac.iter().zip(&want_j).enumerate() {
                assert!(
                    (g - w).abs() <= tol_j * (1.0 + w.abs()),
                    "{name} in {precision:?}: Jacobian entry {i}: {g} vs {w}"
                );
            }
            let cost = cpu.read_f64(&eval.total).unwrap()[0];
            let want = problem.cost_f64(&xr);
            assert!(
                (cost - want).abs() <= tol_r * (1.0 + want),
                "{name} in {precision:?}: cost {cost} vs {want}"
            );
        }
    }
}

/// Data constants reach an f64 kernel exactly as given: a residual `x - c` with `c` one ulp
/// of f64 away from an f32 value evaluates to exactly that difference.
#[test]
fn f64_kernels_keep_data_exact() {
    let cpu = CpuBackend::new();
    let c = 0.1f64 + 1e-12;
    let mut p = Problem::new();
    p.add_parameters(&[0.1]);
    p.add_residual("r", &[0], &[c], Loss::Trivial, |v, k| vec![v[0] - k[0]])
        .unwrap();
    let compiled = CompiledProblem::new(&cpu, &p, &KernelCache::new(), Precision::F64).unwrap();
    let eval = compiled.alloc_evaluation().unwrap();
    compiled
        .evaluate(&compiled.upload_floats(&[0.1]).unwrap(), &eval)
        .unwrap();
    let r = cpu.read::<f64>(&eval.residuals).unwrap()[0];
    assert_eq!(r, 0.1 - c);
}

#[test]
fn robust_losses_scale_residuals_and_rows() {
    let cpu = CpuBackend::new();
    let losses = [
        Loss::Huber(0.5),
        Loss::Cauchy(0.7),
        Loss::SoftLOne(0.9),
        Loss::Tukey(4.0),
        Loss::Tukey(2.0),
    ];
    for loss in losses {
        // The host's scale is sqrt(rho'), against a central difference of rho.
        for s in [0.3, 3.9, 13.0, 17.0] {
            let h = 1e-6;
            let slope = (loss.rho(s + h) - loss.rho(s - h)) / (2.0 * h);
            assert!(
                (loss.scale(s).powi(2) - slope).abs() < 1e-7,
                "{loss:?} at {s}: scale^2 {} vs rho' {slope}",
                loss.scale(s).powi(2)
            );
        }
        let mut p = Problem::new();
        p.add_parameters(&[2.0, -1.0]);
        p.add_residual("r", &[0, 1], &[], loss, |v, _| {
            vec![v[0] * v[1], v[0] + 1.0]
        })
        .unwrap();
        let compiled = CompiledProblem::new(&cpu, &p, &KernelCache::new(), Precision::F32).unwrap();
        let eval = compiled.alloc_evaluation().unwrap();
        compiled
            .evaluate(&cpu.upload(&[2f32, -1.0]).unwrap(), &eval)
            .unwrap();
        let f = [-2.0f64, 3.0];
        let s = f[0] * f[0] + f[1] * f[1];
        let k = loss.scale(s);
        let res = cpu.read::<f32>(&eval.residuals).unwrap();
        let jac = cpu.read::<f32>(&eval.jacobian).unwrap();
        let want_j = [-k, 2.0 * k, k, 0.0];
        for i in 0..2 {
            assert!(
                (res[i] as f64 - f[i] * k).abs() < 1e-5,
                "{loss:?}: residual {i}"
            );
        }
        for i in 0..4 {
            assert!(
                (jac[i] as f64 - want_j[i]).abs() < 1e-5,
                "{loss:?}: Jacobian {i}"
            );
        }
        let cost = cpu.read_f64(&eval.total).unwrap()[0];
        assert!(
            (cost - 0.5 * loss.rho(s)).abs() < 1e-5 * cost,
            "{loss:?}: cost"
        );
    }
}
