//! The Moré-Garbow-Hillstrom test problems (J. J. Moré, B. S. Garbow, K. E. Hillstrom,
//! "Testing unconstrained optimization software", ACM TOMS 7(1), 1981), as residual blocks,
//! with the minima the paper publishes. `f` there is the sum of squares; our cost is half
//! of it.

use residual_compile::{Loss, Problem, Var};
use std::f64::consts::PI;

/// One problem: its size, standard start and the published minimum values of `f` it may
/// reach (a local minimum is a solution too: the paper lists them).
pub struct Mgh {
    pub name: &'static str,
    pub x0: Vec<f64>,
    /// Published minima of the sum of squares, with the significant digits the paper gives
    /// (`0.0` exactly for zero-residual problems; a negative digit count marks a value that
    /// is not a strict local minimum: an infimum approached as parameters go to infinity, or
    /// a stationary value a path of lower cost leaves).
    pub minima: &'static [(f64, i32)],
    build: fn(&mut Problem, &[usize]),
}

impl Mgh {
    /// The problem started at `scale` times the standard start (the paper's 1, 10, 100).
    pub fn problem(&self, scale: f64) -> Problem {
        let mut p = Problem::new();
        let x0: Vec<f64> = self.x0.iter().map(|v| v * scale).collect();
        let first = p.add_parameters(&x0);
        let idx: Vec<usize> = (first..first + x0.len()).collect();
        (self.build)(&mut p, &idx);
        p
    }
}

fn block(
    p: &mut Problem,
    name: &str,
    idx: &[usize],
    c: &[f64],
    f: impl for<'t> Fn(&[Var<'t>], &[Var<'t>]) -> Vec<Var<'t>>,
) {
    p.add_residual(name, idx, c, Loss::Trivial, f).unwrap();
}

fn rosenbrock(p: &mut Problem, x: &[usize]) {
    block(p, "rosenbrock", x, &[], |v, _| {
        vec![10.0 * (v[1] - v[0] * v[0]), 1.0 - v[0]]
    });
}

fn freudenstein_roth(p: &mut Problem, x: &[usize]) {
    block(p, "freudenstein_roth", x, &[], |v, _| {
        vec![
            -13.0 + v[0] + ((5.0 - v[1]) * v[1] - 2.0) * v[1],
            -29.0 + v[0] + ((v[1] + 1.0) * v[1] - 14.0) * v[1],
        ]
    });
}

fn powell_badly_scaled(p: &mut Problem, x: &[usize]) {
    block(p, "powell_badly_scaled", x, &[], |v, _| {
        vec![
            1e4 * v[0] * v[1] - 1.0,
            (-v[0]).exp() + (-v[1]).exp() - 1.0001,
        ]
    });
}

fn brown_badly_scaled(p: &mut Problem, x: &[usize]) {
    block(p, "brown_badly_scaled", x, &[], |v, _| {
        vec![v[0] - 1e6, v[1] - 2e-6, v[0] * v[1] - 2.0]
    });
}

fn beale(p: &mut Problem, x: &[usize]) {
    for (i, y) in [1.5, 2.25, 2.625].into_iter().enumerate() {
        block(p, "beale", x, &[y, (i + 1) as f64], |v, c| {
            vec![c[0] - v[0] * (1.0 - v[1].pow(c[1]))]
        });
    }
}

fn jennrich_sampson(p: &mut Problem, x: &[usize]) {
    for i in 1..=10 {
        block(p, "jennrich_sampson", x, &[i as f64], |v, c| {
            vec![2.0 + 2.0 * c[0] - ((c[0] * v[0]).exp() + (c[0] * v[1]).exp())]
        });
    }
}

fn helical_valley(p: &mut Problem, x: &[usize]) {
    block(p, "helical_valley", x, &[], |v, _| {
        let base = (v[1] / v[0]).atan() / (2.0 * PI);
        let theta = v[0].lt(v[0].lit(0.0)).select(base + 0.5, base);
        vec![
            10.0 * (v[2] - 10.0 * theta),
            10.0 * ((v[0] * v[0] + v[1] * v[1]).sqrt() - 1.0),
            v[2] * 1.0,
        ]
    });
}

fn bard(p: &mut Problem, x: &[usize]) {
    let y = [
        0.14, 0.18, 0.22, 0.25, 0.29, 0.32, 0.35, 0.39, 0.37, 0.58, 0.73, 0.96, 1.34, 2.10, 4.39,
    ];
    for (i, y) in y.into_iter().enumerate() {
        let u = (i + 1) as f64;
        let w = 16.0 - u;
        block(p, "bard", x, &[u, w, u.min(w), y], |v, c| {
            vec![c[3] - (v[0] + c[0] / (c[1] * v[1] + c[2] * v[2]))]
        });
    }
}

fn gaussian(p: &mut Problem, x: &[usize]) {
    let y = [
        0.0009, 0.0044, 0.0175, 0.0540, 0.1295, 0.2420, 0.3521, 0.3989, 0.3521, 0.2420, 0.1295,
        0.0540, 0.0175, 0.0044, 0.0009,
    ];
    for (i, y) in y.into_iter().enumerate() {
        let t = (7.0 - i as f64) / 2.0;
        block(p, "gaussian", x, &[t, y], |v, c| {
            let d = c[0] - v[2];
            vec![v[0] * (-0.5 * v[1] * d * d).exp() - c[1]]
        });
    }
}

fn meyer(p: &mut Problem, x: &[usize]) {
    let y = [
        34780.0, 28610.0, 23650.0, 19630.0, 16370.0, 13720.0, 11540.0, 9744.0, 8261.0, 7030.0,
        6005.0, 5147.0, 4427.0, 3820.0, 3307.0, 2872.0,
    ];
    for (i, y) in y.into_iter().enumerate() {
        let t = 45.0 + 5.0 * (i + 1) as f64;
        block(p, "meyer", x, &[t, y], |v, c| {
            vec![v[0] * (v[1] / (c[0] + v[2])).exp() - c[1]]
        });
    }
}

fn gulf(p: &mut Problem, x: &[usize]) {
    // m = 10 observations (the paper allows n <= m <= 100).
    for i in 1..=10 {
        let t = i as f64 / 100.0;
        let y = 25.0 + (-50.0 * t.ln()).powf(2.0 / 3.0);
        block(p, "gulf", x, &[t, y], |v, c| {
            vec![(-(c[1] - v[1]).abs().pow(v[2]) / v[0]).exp() - c[0]]
        });
    }
}

fn box_3d(p: &mut Problem, x: &[usize]) {
    for i in 1..=10 {
        let t = 0.1 * i as f64;
        block(
            p,
            "box_3d",
            x,
            &[t, (-t).exp() - (-10.0 * t).exp()],
            |v, c| vec![(-c[0] * v[0]).exp() - (-c[0] * v[1]).exp() - v[2] * c[1]],
        );
    }
}

fn powell_singular(p: &mut Problem, x: &[usize]) {
    block(p, "powell_singular", x, &[], |v, _| {
        let a = v[1] - 2.0 * v[2];
        let b = v[0] - v[3];
        vec![
            v[0] + 10.0 * v[1],
            5f64.sqrt() * (v[2] - v[3]),
            a * a,
            10f64.sqrt() * b * b,
        ]
    });
}

fn wood(p: &mut Problem, x: &[usize]) {
    block(p, "wood", x, &[], |v, _| {
        vec![
            10.0 * (v[1] - v[0] * v[0]),
            1.0 - v[0],
            90f64.sqrt() * (v[3] - v[2] * v[2]),
            1.0 - v[2],
            10f64.sqrt() * (v[1] + v[3] - 2.0),
            (v[1] - v[3]) / 10f64.sqrt(),
        ]
    });
}

fn kowalik_osborne(p: &mut Problem, x: &[usize]) {
    let y = [
        0.1957, 0.1947, 0.1735, 0.1600, 0.0844, 0.0627, 0.0456, 0.0342, 0.0323, 0.0235, 0.0246,
    ];
    let u = [
        4.0, 2.0, 1.0, 0.5, 0.25, 0.167, 0.125, 0.1, 0.0833, 0.0714, 0.0625,
    ];
    for (y, u) in y.into_iter().zip(u) {
        block(p, "kowalik_osborne", x, &[u, y], |v, c| {
            let u = c[0];
            vec![c[1] - v[0] * (u * u + u * v[1]) / (u * u + u * v[2] + v[3])]
        });
    }
}

fn brown_dennis(p: &mut Problem, x: &[usize]) {
    for i in 1..=20 {
        let t = i as f64 / 5.0;
        block(
            p,
            "brown_dennis",
            x,
            &[t, t.exp(), t.sin(), t.cos()],
            |v, c| {
                let a = v[0] + c[0] * v[1] - c[1];
                let b = v[2] + v[3] * c[2] - c[3];
                vec![a * a + b * b]
            },
        );
    }
}

fn osborne_1(p: &mut Problem, x: &[usize]) {
    let y = [
        0.844, 0.908, 0.932, 0.936, 0.925, 0.908, 0.881, 0.850, 0.818, 0.784, 0.751, 0.718, 0.685,
        0.658, 0.628, 0.603, 0.580, 0.558, 0.538, 0.522, 0.506, 0.490, 0.478, 0.467, 0.457, 0.448,
        0.438, 0.431, 0.424, 0.420, 0.414, 0.411, 0.406,
    ];
    for (i, y) in y.into_iter().enumerate() {
        let t = 10.0 * i as f64;
        block(p, "osborne_1", x, &[t, y], |v, c| {
            vec![c[1] - (v[0] + v[1] * (-c[0] * v[3]).exp() + v[2] * (-c[0] * v[4]).exp())]
        });
    }
}

fn biggs_exp6(p: &mut Problem, x: &[usize]) {
    for i in 1..=13 {
        let t = 0.1 * i as f64;
        let y = (-t).exp() - 5.0 * (-10.0 * t).exp() + 3.0 * (-4.0 * t).exp();
        block(p, "biggs_exp6", x, &[t, y], |v, c| {
            let t = c[0];
            vec![
                v[2] * (-t * v[0]).exp() - v[3] * (-t * v[1]).exp() + v[5] * (-t * v[4]).exp()
                    - c[1],
            ]
        });
    }
}

fn osborne_2(p: &mut Problem, x: &[usize]) {
    let y = [
        1.366, 1.191, 1.112, 1.013, 0.991, 0.885, 0.831, 0.847, 0.786, 0.725, 0.746, 0.679, 0.608,
        0.655, 0.616, 0.606, 0.602, 0.626, 0.651, 0.724, 0.649, 0.649, 0.694, 0.644, 0.624, 0.661,
        0.612, 0.558, 0.533, 0.495, 0.500, 0.423, 0.395, 0.375, 0.372, 0.391, 0.396, 0.405, 0.428,
        0.429, 0.523, 0.562, 0.607, 0.653, 0.672, 0.708, 0.633, 0.668, 0.645, 0.632, 0.591, 0.559,
        0.597, 0.625, 0.739, 0.710, 0.729, 0.720, 0.636, 0.581, 0.428, 0.292, 0.162, 0.098, 0.054,
    ];
    for (i, y) in y.into_iter().enumerate() {
        let t = i as f64 / 10.0;
        block(p, "osborne_2", x, &[t, y], |v, c| {
            let t = c[0];
            let g = |a: usize, s: usize| (-(t - v[a]) * (t - v[a]) * v[s]).exp();
            vec![
                c[1] - (v[0] * (-t * v[4]).exp()
                    + v[1] * g(8, 5)
                    + v[2] * g(9, 6)
                    + v[3] * g(10, 7)),
            ]
        });
    }
}

fn watson(p: &mut Problem, x: &[usize]) {
    for i in 1..=29 {
        let t = i as f64 / 29.0;
        block(p, "watson", x, &[t], move |v, c| {
            let t = c[0];
            let mut s1 = v[0] * 0.0;
            let mut s2 = v[0] * 1.0;
            let mut tp = t * 0.0 + 1.0;
            for (j, &vj) in v.iter().enumerate().skip(1) {
                s1 = s1 + (j as f64) * vj * tp;
                tp = tp * t;
                s2 = s2 + vj * tp;
            }
            vec![s1 - s2 * s2 - 1.0]
        });
    }
    block(p, "watson_tail", &x[..2], &[], |v, _| {
        vec![v[0] * 1.0, v[1] - v[0] * v[0] - 1.0]
    });
}

fn penalty_1(p: &mut Problem, x: &[usize]) {
    let a = 1e-5f64.sqrt();
    for &xi in x {
        block(p, "penalty_1", &[xi], &[a], |v, c| {
            vec![c[0] * (v[0] - 1.0)]
        });
    }
    block(p, "penalty_1_sum", x, &[], |v, _| {
        let mut s = v[0] * v[0];
        for vj in &v[1..] {
            s = s + *vj * *vj;
        }
        vec![s - 0.25]
    });
}

fn linear_full_rank(p: &mut Problem, x: &[usize], m: usize) {
    let n = x.len();
    for i in 0..m {
        // Row i: x_i - (2/m) sum_j x_j - 1 for i < n; -(2/m) sum_j x_j - 1 after.
        block(p, "linear_full_rank", x, &[2.0 / m as f64], move |v, c| {
            let mut s = v[0] * 1.0;
            for vj in &v[1..] {
                s = s + *vj;
            }
            let r = -c[0] * s - 1.0;
            vec![if i < n { v[i] + r } else { r }]
        });
    }
}

fn linear_rank_1(p: &mut Problem, x: &[usize], m: usize) {
    for i in 1..=m {
        block(p, "linear_rank_1", x, &[i as f64], |v, c| {
            let mut s = v[0] * 1.0;
            for (j, vj) in v.iter().enumerate().skip(1) {
                s = s + (j + 1) as f64 * *vj;
            }
            vec![c[0] * s - 1.0]
        });
    }
}

/// The problems, in the paper's numbering where it has them.
pub fn problems() -> Vec<Mgh> {
    let m = |name, x0: &[f64], minima, build| Mgh {
        name,
        x0: x0.to_vec(),
        minima,
        build,
    };
    vec![
        m("1 Rosenbrock", &[-1.2, 1.0], &[(0.0, 0)], rosenbrock),
        m(
            "2 Freudenstein and Roth",
            &[0.5, -2.0],
            &[(0.0, 0), (48.9842, 6)],
            freudenstein_roth,
        ),
        m(
            "3 Powell badly scaled",
            &[0.0, 1.0],
            &[(0.0, 0)],
            powell_badly_scaled,
        ),
        m(
            "4 Brown badly scaled",
            &[1.0, 1.0],
            &[(0.0, 0)],
            brown_badly_scaled,
        ),
        m("5 Beale", &[1.0, 1.0], &[(0.0, 0)], beale),
        m(
            "6 Jennrich and Sampson",
            &[0.3, 0.4],
            &[(124.362, 6)],
            jennrich_sampson,
        ),
        m(
            "7 Helical valley",
            &[-1.0, 0.0, 0.0],
            &[(0.0, 0)],
            helical_valley,
        ),
        m(
            "8 Bard",
            &[1.0, 1.0, 1.0],
            &[(8.21487e-3, 6), (17.4286, -6)],
            bard,
        ),
        m("9 Gaussian", &[0.4, 1.0, 0.0], &[(1.12793e-8, 6)], gaussian),
        m("10 Meyer", &[0.02, 4000.0, 250.0], &[(87.9458, 6)], meyer),
        m(
            "11 Gulf research and development",
            &[5.0, 2.5, 0.15],
            &[(0.0, 0)],
            gulf,
        ),
        m(
            "12 Box three-dimensional",
            &[0.0, 10.0, 20.0],
            &[(0.0, 0)],
            box_3d,
        ),
        m(
            "13 Powell singular",
            &[3.0, -1.0, 0.0, 1.0],
            &[(0.0, 0)],
            powell_singular,
        ),
        m("14 Wood", &[-3.0, -1.0, -3.0, -1.0], &[(0.0, 0)], wood),
        m(
            "15 Kowalik and Osborne",
            &[0.25, 0.39, 0.415, 0.39],
            &[(3.07505e-4, 6), (1.02734e-3, -6)],
            kowalik_osborne,
        ),
        m(
            "16 Brown and Dennis",
            &[25.0, 5.0, -5.0, -1.0],
            &[(85822.2, 6)],
            brown_dennis,
        ),
        m(
            "17 Osborne 1",
            &[0.5, 1.5, -1.0, 0.01, 0.02],
            &[(5.46489e-5, 6)],
            osborne_1,
        ),
        m(
            "18 Biggs EXP6",
            &[1.0, 2.0, 1.0, 1.0, 1.0, 1.0],
            // (5.65565e-3 is not a strict minimum: a path of lower cost leaves it.)
            &[(0.0, 0), (5.65565e-3, -6), (3.06366e-1, 6)],
            biggs_exp6,
        ),
        m(
            "19 Osborne 2",
            &[1.3, 0.65, 0.65, 0.7, 0.6, 3.0, 5.0, 7.0, 2.0, 4.5, 5.5],
            &[(4.01377e-2, 6)],
            osborne_2,
        ),
        m("20 Watson (n = 6)", &[0.0; 6], &[(2.28767e-3, 6)], watson),
        m(
            "23 Penalty I (n = 4)",
            &[1.0, 2.0, 3.0, 4.0],
            &[(2.24997e-5, 6)],
            penalty_1,
        ),
        m(
            "32 Linear, full rank (n = 5, m = 10)",
            &[1.0; 5],
            &[(5.0, 15)],
            |p, x| linear_full_rank(p, x, 10),
        ),
        m(
            "33 Linear, rank 1 (n = 5, m = 10)",
            &[1.0; 5],
            // m (m - 1) / (2 (2m + 1)) = 90 / 42.
            &[(90.0 / 42.0, 15)],
            |p, x| linear_rank_1(p, x, 10),
        ),
    ]
}
