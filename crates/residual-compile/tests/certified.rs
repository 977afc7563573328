//! NIST StRD nonlinear regression problems with short data sets (Misra1a-d, BoxBOD, DanWood,
//! Rat42, Rat43, and MGH09, MGH10 and MGH17, whose data the Moré-Garbow-Hillstrom set shares),
//! from both of NIST's starting points, with the default options (f64, CPU): each certified
//! parameter to a log relative error (LRE) of at least 6, as NIST grades software
//! (https://www.itl.nist.gov/div898/strd/nls/nls_main.shtml; the data and certified values
//! are NIST's, the values to 11 significant digits).

use backend_cpu::CpuBackend;
use hal::Backend;
use residual_compile::{KernelCache, Loss, Problem, SolveOptions, Var, solve};

struct Certified {
    name: &'static str,
    x: &'static [f64],
    y: &'static [f64],
    starts: [&'static [f64]; 2],
    certified: &'static [f64],
    rss: f64,
    model: for<'t> fn(&[Var<'t>], Var<'t>) -> Var<'t>,
}

const MISRA_X: [f64; 14] = [
    77.6, 114.9, 141.1, 190.8, 239.9, 289.0, 332.8, 378.4, 434.8, 477.3, 536.8, 593.1, 689.1, 760.0,
];
const MISRA_Y: [f64; 14] = [
    10.07, 14.73, 17.94, 23.93, 29.61, 35.18, 40.02, 44.82, 50.76, 55.05, 61.01, 66.40, 75.47,
    81.78,
];

const MGH_X: [f64; 11] = [
    4.0, 2.0, 1.0, 0.5, 0.25, 0.167, 0.125, 0.1, 0.0833, 0.0714, 0.0625,
];

/// Every problem: the Misra family and the short fits, then the MGH problems.
fn problems() -> Vec<Certified> {
    let mut all = short_fits();
    all.extend(mgh_fits());
    all
}

/// Misra1a-d, BoxBOD, DanWood, Rat42, Rat43.
fn short_fits() -> Vec<Certified> {
    vec![
        Certified {
            name: "Misra1a",
            x: &MISRA_X,
            y: &MISRA_Y,
            starts: [&[500.0, 1e-4], &[250.0, 5e-4]],
            certified: &[2.3894212918e2, 5.5015643181e-4],
            rss: 1.2455138894e-1,
            model: |b, x| b[0] * (1.0 - (-b[1] * x).exp()),
        },
        Certified {
            name: "Misra1b",
            x: &MISRA_X,
            y: &MISRA_Y,
            starts: [&[500.0, 1e-4], &[300.0, 2e-4]],
            certified: &[3.3799746163e2, 3.9039091287e-4],
            rss: 7.5464681533e-2,
            model: |b, x| {
                let u = 1.0 + b[1] * x * 0.5;
                b[0] * (1.0 - 1.0 / (u * u))
            },
        },
        Certified {
            name: "Misra1c",
            x: &MISRA_X,
            y: &MISRA_Y,
            starts: [&[500.0, 1e-4], &[600.0, 2e-4]],
            certified: &[6.3642725809e2, 2.0813627256e-4],
            rss: 4.0966836971e-2,
            model: |b, x| b[0] * (1.0 - (1.0 + 2.0 * b[1] * x).rsqrt()),
        },
        Certified {
            name: "Misra1d",
            x: &MISRA_X,
            y: &MISRA_Y,
            starts: [&[500.0, 1e-4], &[450.0, 3e-4]],
            certified: &[4.3736970754e2, 3.0227324449e-4],
            rss: 5.6419295283e-2,
            model: |b, x| b[0] * b[1] * x / (1.0 + b[1] * x),
        },
        Certified {
            name: "BoxBOD",
            x: &[1.0, 2.0, 3.0, 5.0, 7.0, 10.0],
            y: &[109.0, 149.0, 149.0, 191.0, 213.0, 224.0],
            starts: [&[1.0, 1.0], &[100.0, 0.75]],
            certified: &[2.1380940889e2, 5.4723748542e-1],
            rss: 1.1680088766e3,
            model: |b, x| b[0] * (1.0 - (-b[1] * x).exp()),
        },
        Certified {
            name: "DanWood",
            x: &[1.309, 1.471, 1.490, 1.565, 1.611, 1.680],
            y: &[2.138, 3.421, 3.597, 4.340, 4.882, 5.660],
            starts: [&[1.0, 5.0], &[0.7, 4.0]],
            certified: &[7.6886226176e-1, 3.8604055871e0],
            rss: 4.3173084083e-3,
            model: |b, x| b[0] * x.pow(b[1]),
        },
        Certified {
            name: "Rat42",
            x: &[9.0, 14.0, 21.0, 28.0, 42.0, 57.0, 63.0, 70.0, 79.0],
            y: &[8.93, 10.8, 18.59, 22.33, 39.35, 56.11, 61.73, 64.62, 67.08],
            starts: [&[100.0, 1.0, 0.1], &[75.0, 2.5, 0.07]],
            certified: &[7.2462237576e1, 2.6180768402e0, 6.7359200066e-2],
            rss: 8.0565229338e0,
            model: |b, x| b[0] / (1.0 + (b[1] - b[2] * x).exp()),
        },
        Certified {
            name: "Rat43",
            x: &[
                1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0,
            ],
            y: &[
                16.08, 33.83, 65.80, 97.20, 191.55, 326.20, 386.87, 520.53, 590.03, 651.92, 724.93,
                699.56, 689.96, 637.56, 717.41,
            ],
            starts: [&[100.0, 10.0, 1.0, 1.0], &[700.0, 5.0, 0.75, 1.3]],
            certified: &[
                6.9964151270e2,
                5.2771253025e0,
                7.5962938329e-1,
                1.2792483859e0,
            ],
            rss: 8.7864049080e3,
            model: |b, x| b[0] / (1.0 + (b[1] - b[2] * x).exp()).pow(1.0 / b[3]),
        },
    ]
}

/// MGH09, MGH10 and MGH17 (data shared with the Moré-Garbow-Hillstrom set).
fn mgh_fits() -> Vec<Certified> {
    vec![
        Certified {
            name: "MGH09",
            x: &MGH_X,
            y: &[
                0.1957, 0.1947, 0.1735, 0.1600, 0.0844, 0.0627, 0.0456, 0.0342, 0.0323, 0.0235,
                0.0246,
            ],
            starts: [&[25.0, 39.0, 41.5, 39.0], &[0.25, 0.39, 0.415, 0.39]],
            certified: &[
                1.9280693458e-1,
                1.9128232873e-1,
                1.2305650693e-1,
                1.3606233068e-1,
            ],
            rss: 3.0750560385e-4,
            model: |b, x| b[0] * (x * x + x * b[1]) / (x * x + x * b[2] + b[3]),
        },
        Certified {
            name: "MGH10",
            x: &[
                50.0, 55.0, 60.0, 65.0, 70.0, 75.0, 80.0, 85.0, 90.0, 95.0, 100.0, 105.0, 110.0,
                115.0, 120.0, 125.0,
            ],
            y: &[
                34780.0, 28610.0, 23650.0, 19630.0, 16370.0, 13720.0, 11540.0, 9744.0, 8261.0,
                7030.0, 6005.0, 5147.0, 4427.0, 3820.0, 3307.0, 2872.0,
            ],
            starts: [&[2.0, 400000.0, 25000.0], &[0.02, 4000.0, 250.0]],
            certified: &[5.6096364710e-3, 6.1813463463e3, 3.4522363462e2],
            rss: 8.7945855171e1,
            model: |b, x| b[0] * (b[1] / (x + b[2])).exp(),
        },
        Certified {
            name: "MGH17",
            x: &[
                0.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 100.0, 110.0, 120.0,
                130.0, 140.0, 150.0, 160.0, 170.0, 180.0, 190.0, 200.0, 210.0, 220.0, 230.0, 240.0,
                250.0, 260.0, 270.0, 280.0, 290.0, 300.0, 310.0, 320.0,
            ],
            y: &[
                0.844, 0.908, 0.932, 0.936, 0.925, 0.908, 0.881, 0.850, 0.818, 0.784, 0.751, 0.718,
                0.685, 0.658, 0.628, 0.603, 0.580, 0.558, 0.538, 0.522, 0.506, 0.490, 0.478, 0.467,
                0.457, 0.448, 0.438, 0.431, 0.424, 0.420, 0.414, 0.411, 0.406,
            ],
            starts: [
                &[50.0, 150.0, -100.0, 1.0, 2.0],
                &[0.5, 1.5, -1.0, 0.01, 0.02],
            ],
            certified: &[
                3.7541005211e-1,
                1.9358469127e0,
                -1.4646871366e0,
                1.2867534640e-2,
                2.2122699662e-2,
            ],
            rss: 5.4648946975e-5,
            model: |b, x| b[0] + b[1] * (-x * b[3]).exp() + b[2] * (-x * b[4]).exp(),
        },
    ]
}

/// NIST's log relative error of `got` against `want` (11 where they agree to 11 digits).
fn lre(got: f64, want: f64) -> f64 {
    let rel = (got - want).abs() / want.abs();
    if rel == 0.0 {
        11.0
    } else {
        (-rel.log10()).min(11.0)
    }
}

/// BoxBOD from (1, 1) walks onto the plateau b2 -> infinity, where exp(-b2 x) underflows and
/// the model is the constant b1 = 172.5, the mean of the data: the gradient there is exactly
/// zero. C++ Ceres 2.1 ends there too, with these tolerances or its defaults. The test holds
/// that this start, and only it, misses.
const BOXBOD_PLATEAU: (&str, usize) = ("BoxBOD", 1);

#[test]
fn certified_parameters_to_six_digits_from_both_starts() {
    certified_on(&CpuBackend::new());
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored on a GPU host"]
fn certified_on_cuda() {
    certified_on(&backend_cuda::CudaBackend::new().expect("the CUDA backend is required"));
}

fn certified_on<B: Backend>(cpu: &B) {
    let mut failures = Vec::new();
    for c in problems() {
        for (s, start) in c.starts.iter().enumerate() {
            let mut p = Problem::new();
            let b = p.add_parameters(start);
            let idx: Vec<usize> = (b..b + start.len()).collect();
            for (&x, &y) in c.x.iter().zip(c.y) {
                let model = c.model;
                p.add_residual(c.name, &idx, &[x, y], Loss::Trivial, move |b, k| {
                    vec![k[1] - model(b, k[0])]
                })
                .unwrap();
            }
            let summary = solve(cpu, &mut p, &SolveOptions::default(), &KernelCache::new());
            let worst = match &summary {
                Ok(_) => p
                    .parameters()
                    .iter()
                    .zip(c.certified)
                    .map(|(&g, &w)| lre(g, w))
                    .fold(11.0, f64::min),
                Err(_) => 0.0,
            };
            let rss = summary.as_ref().map_or(f64::NAN, |s| 2.0 * s.final_cost);
            println!(
                "{} start {}: parameter LRE {worst:.1}, RSS LRE {:.1} ({:?}, {} iterations)",
                c.name,
                s + 1,
                lre(rss, c.rss),
                summary.as_ref().map(|s| s.termination),
                summary.as_ref().map_or(0, |s| s.iterations)
            );
            let plateau = (c.name, s + 1) == BOXBOD_PLATEAU;
            if (worst < 6.0) != plateau {
                failures.push(format!("{} start {}: LRE {worst:.1}", c.name, s + 1));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:?}");
}
