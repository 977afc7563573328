//! Checks of sgd_step and adam_step.

use super::*;

pub(super) fn run_sgd<B: Backend>(b: &B, p: &[f32], g: &[f32], h: &SgdParams) -> Result<Vec<f64>> {
    let (pb, gb, mb) = (b.upload(p)?, b.upload(g)?, b.alloc(DType::F32, p.len())?);
    for step in 1..=2 {
        b.sgd_step(&pb, &gb, Some(&mb), &SgdParams { step, ..*h })?;
    }
    Ok(b.read::<f32>(&pb)?.into_iter().map(f64::from).collect())
}

pub(super) fn run_adam<B: Backend>(
    b: &B,
    p: &[f32],
    g: &[f32],
    h: &AdamParams,
) -> Result<Vec<f64>> {
    let (pb, gb) = (b.upload(p)?, b.upload(g)?);
    let (mb, vb) = (b.alloc(DType::F32, p.len())?, b.alloc(DType::F32, p.len())?);
    for step in 1..=3 {
        b.adam_step(&pb, &gb, &mb, &vb, &AdamParams { step, ..*h })?;
    }
    Ok(b.read::<f32>(&pb)?.into_iter().map(f64::from).collect())
}

pub(super) fn optimizers<B: Backend>(s: &mut Suite<'_, B>) {
    let sizes = [0usize, 1, 7, 257, 65537];
    for c in 0..s.cfg.cases + 4 {
        let n = sizes[c % 5];
        let r = s.rng();
        let p: Vec<f32> = (0..n).map(|_| r.range(-1.0, 1.0)).collect();
        let g: Vec<f32> = (0..n).map(|_| r.range(-1.0, 1.0)).collect();
        let h = SgdParams {
            lr: 0.1,
            momentum: [0.0, 0.9][c % 2],
            dampening: [0.0, 0.1][(c / 2) % 2],
            weight_decay: [0.0, 0.01][(c / 3) % 2],
            nesterov: c % 4 == 1,
            step: 1,
        };
        let exact: Vec<f64> = (0..n)
            .map(|i| {
                let (mut pi, gi0) = (p[i] as f64, g[i] as f64);
                let mut buf = 0f64;
                for step in 1..=2 {
                    let mut gi = gi0 + h.weight_decay as f64 * pi;
                    if h.momentum != 0.0 {
                        buf = if step == 1 {
                            gi
                        } else {
                            h.momentum as f64 * buf + (1.0 - h.dampening as f64) * gi
                        };
                        gi = if h.nesterov {
                            gi + h.momentum as f64 * buf
                        } else {
                            buf
                        };
                    }
                    pi -= h.lr as f64 * gi;
                }
                pi
            })
            .collect();
        match both!(s, run_sgd(&p, &g, &h)) {
            Ok((cv, t)) => s.judge(
                "sgd_step",
                &format!("n={n} {h:?}"),
                &cv,
                t.as_deref(),
                &exact,
                &|_, w| 16.0 * U32F * (w.abs() + 1.0),
            ),
            Err(e) => s.fail("sgd_step", format!("n={n}: {e}")),
        }
        let a = AdamParams {
            lr: 0.01,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: [0.0, 0.05][c % 2],
            decoupled_weight_decay: c % 3 == 0,
            step: 1,
        };
        // The float64 result and each element's conditioning: the f32 rounding of the
        // (decayed) gradient, about u (|g| + wd |p|), moves the step m^ / (sqrt(v^) + eps) by
        // that over sqrt(v^) + eps, which is large where weight decay nearly cancels the
        // gradient (v^ tiny): the largest such ratio over the steps.
        let (exact, conditioning): (Vec<f64>, Vec<f64>) = (0..n)
            .map(|i| {
                let (mut pi, gi0) = (p[i] as f64, g[i] as f64);
                let (mut m, mut v, mut worst) = (0f64, 0f64, 0f64);
                for step in 1..=3 {
                    let mut gi = gi0;
                    if a.decoupled_weight_decay {
                        pi *= 1.0 - a.lr as f64 * a.weight_decay as f64;
                    } else {
                        gi += a.weight_decay as f64 * pi;
                    }
                    m = a.beta1 as f64 * m + (1.0 - a.beta1 as f64) * gi;
                    v = a.beta2 as f64 * v + (1.0 - a.beta2 as f64) * gi * gi;
                    let mh = m / (1.0 - (a.beta1 as f64).powi(step));
                    let vh = v / (1.0 - (a.beta2 as f64).powi(step));
                    let rounding = gi0.abs() + (a.weight_decay as f64 * pi).abs();
                    worst = worst.max(rounding / (vh.sqrt() + a.eps as f64));
                    pi -= a.lr as f64 * mh / (vh.sqrt() + a.eps as f64);
                }
                (pi, worst)
            })
            .unzip();
        // Adam's update has magnitude ~lr; allow a relative 2^-14 of it (its sqrt and division
        // in f32 amplify tiny v), plus rounding of the parameter, plus 16 roundings of the
        // gradient carried through the step's conditioning (three steps, each moving m and v).
        match both!(s, run_adam(&p, &g, &a)) {
            Ok((cv, t)) => s.judge(
                "adam_step",
                &format!("n={n} {a:?}"),
                &cv,
                t.as_deref(),
                &exact,
                &|i, w| {
                    16.0 * U32F * w.abs()
                        + 3.0 * a.lr as f64 * 2f64.powi(-14)
                        + 16.0 * U32F * a.lr as f64 * conditioning[i]
                },
            ),
            Err(e) => s.fail("adam_step", format!("n={n}: {e}")),
        }
    }
}
