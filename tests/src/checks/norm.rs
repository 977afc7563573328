//! Checks of layer_norm and layer_norm_backward: odd sizes, a transposed x, rows far from
//! zero (a large mean against a small spread), with and without the affine parameters, against
//! a float64 host reference.

use super::*;
use hal::{NormGrads, NormInputs};

#[derive(Clone, Debug)]
struct Case {
    rows: usize,
    n: usize,
    x: Vec<f32>,
    w: Option<Vec<f32>>,
    b: Option<Vec<f32>>,
    dout: Vec<f32>,
    eps: f32,
}

/// x stored `[n, rows]` and viewed transposed; the rest contiguous.
fn run<B: Backend>(bk: &B, c: &Case, backward: bool) -> Result<Vec<f64>> {
    let (rows, n) = (c.rows, c.n);
    let xl = Layout::contiguous(&[n, rows]).transpose(0, 1)?;
    let mut xt = vec![0f32; (rows * n).max(1)];
    for r in 0..rows {
        for k in 0..n {
            xt[k * rows + r] = c.x[r * n + k];
        }
    }
    let xb = bk.upload(&xt)?;
    let pl = Layout::contiguous(&[n]);
    let wb = c.w.as_ref().map(|w| bk.upload(w)).transpose()?;
    let bb = c.b.as_ref().map(|b| bk.upload(b)).transpose()?;
    let x = NormInputs {
        x: View::new(&xb, &xl),
        weight: wb.as_ref().map(|w| View::new(w, &pl)),
        bias: bb.as_ref().map(|b| View::new(b, &pl)),
    };
    let (ml, ol) = (Layout::contiguous(&[rows]), Layout::contiguous(&[rows, n]));
    let nan = |len: usize| bk.upload(&vec![f32::NAN; len.max(1)]);
    let (out, mean, rstd) = (nan(rows * n)?, nan(rows)?, nan(rows)?);
    bk.layer_norm(
        x,
        View::new(&out, &ol),
        View::new(&mean, &ml),
        View::new(&rstd, &ml),
        c.eps,
    )?;
    if !backward {
        let mut r = read_view(bk, &out, &ol)?;
        r.extend(read_view(bk, &mean, &ml)?);
        r.extend(read_view(bk, &rstd, &ml)?);
        return Ok(r);
    }
    let g = bk.upload(&c.dout)?;
    let (dx, dw, db) = (nan(rows * n)?, nan(n)?, nan(n)?);
    bk.layer_norm_backward(
        x,
        View::new(&mean, &ml),
        View::new(&rstd, &ml),
        View::new(&g, &ol),
        NormGrads {
            dx: View::new(&dx, &ol),
            dweight: Some(View::new(&dw, &pl)),
            dbias: Some(View::new(&db, &pl)),
        },
    )?;
    let mut r = read_view(bk, &dx, &ol)?;
    r.extend(read_view(bk, &dw, &pl)?);
    r.extend(read_view(bk, &db, &pl)?);
    Ok(r)
}

fn run_forward<B: Backend>(bk: &B, c: &Case) -> Result<Vec<f64>> {
    run(bk, c, false)
}

fn run_backward<B: Backend>(bk: &B, c: &Case) -> Result<Vec<f64>> {
    run(bk, c, true)
}

/// The float64 answers of both passes and, per element, the magnitude its tolerance scales.
fn exact(c: &Case) -> [(Vec<f64>, Vec<f64>); 2] {
    let (rows, n) = (c.rows, c.n);
    let w = |k: usize| c.w.as_ref().map_or(1.0, |w| w[k] as f64);
    let b = |k: usize| c.b.as_ref().map_or(0.0, |b| b[k] as f64);
    let (mut out, mut out_m) = (vec![0f64; rows * n], vec![0f64; rows * n]);
    let (mut mean, mut rstd) = (vec![0f64; rows], vec![0f64; rows]);
    let (mut mean_m, mut rstd_m) = (vec![0f64; rows], vec![0f64; rows]);
    let (mut dx, mut dx_m) = (vec![0f64; rows * n], vec![0f64; rows * n]);
    let (mut dw, mut dw_m, mut db, mut db_m) =
        (vec![0f64; n], vec![0f64; n], vec![0f64; n], vec![0f64; n]);
    for r in 0..rows {
        let x: Vec<f64> = c.x[r * n..(r + 1) * n].iter().map(|&v| v as f64).collect();
        let g: Vec<f64> = c.dout[r * n..(r + 1) * n]
            .iter()
            .map(|&v| v as f64)
            .collect();
        let m = x.iter().sum::<f64>() / n as f64;
        let var = x.iter().map(|v| (v - m) * (v - m)).sum::<f64>() / n as f64;
        let rs = 1.0 / (var + c.eps as f64).sqrt();
        // How far the mean's own rounding moves each xhat, relative to u.
        let shift = 1.0 + m.abs() * rs;
        mean[r] = m;
        mean_m[r] = x.iter().map(|v| v.abs()).sum::<f64>() / n as f64;
        rstd[r] = rs;
        rstd_m[r] = rs * shift;
        let xh: Vec<f64> = x.iter().map(|v| (v - m) * rs).collect();
        let (mut a, mut bs, mut a_m) = (0.0, 0.0, 0.0);
        for k in 0..n {
            out[r * n + k] = xh[k] * w(k) + b(k);
            out_m[r * n + k] = (xh[k].abs() + shift) * w(k).abs() + b(k).abs();
            a += g[k] * w(k) / n as f64;
            bs += g[k] * w(k) * xh[k] / n as f64;
            a_m += (g[k] * w(k)).abs() * (1.0 + xh[k].abs()) / n as f64;
            dw[k] += g[k] * xh[k];
            dw_m[k] += (g[k] * xh[k]).abs() + g[k].abs() * shift;
            db[k] += g[k];
            db_m[k] += g[k].abs();
        }
        for k in 0..n {
            dx[r * n + k] = rs * (g[k] * w(k) - a - xh[k] * bs);
            dx_m[r * n + k] = rs * ((g[k] * w(k)).abs() + a_m * (1.0 + xh[k].abs())) * shift;
        }
    }
    let fwd = out.into_iter().chain(mean).chain(rstd).collect();
    let fwd_m = out_m.into_iter().chain(mean_m).chain(rstd_m).collect();
    let bwd = dx.into_iter().chain(dw).chain(db).collect();
    let bwd_m = dx_m.into_iter().chain(dw_m).chain(db_m).collect();
    [(fwd, fwd_m), (bwd, bwd_m)]
}

const SIZES: [(usize, usize); 10] = [
    (0, 5),
    // GPT-2's width, and one past the widest row CUDA's one-pass backward holds (1024).
    (130, 768),
    (9, 1500),
    (1, 1),
    (7, 3),
    (33, 384),
    (5, 1000),
    (300, 7),
    (2, 0),
    (1000, 65),
];

pub(super) fn layer_norm<B: Backend>(s: &mut Suite<'_, B>) {
    for case in 0..SIZES.len() + s.cfg.cases {
        let (rows, n) = SIZES
            .get(case)
            .copied()
            .unwrap_or_else(|| (1 + s.rng().below(200), 1 + s.rng().below(300)));
        let r = s.rng();
        // Every third case sits far from zero: a mean of 300 against a spread of 1.
        let centre = if case % 3 == 2 { 300.0 } else { 0.0 };
        let mut draw = |len: usize, lo: f32, hi: f32| -> Vec<f32> {
            (0..len).map(|_| r.range(lo, hi)).collect()
        };
        let c = Case {
            rows,
            n,
            x: draw(rows * n, centre - 1.0, centre + 1.0),
            w: (case % 4 != 1).then(|| draw(n, 0.5, 1.5)),
            b: (case % 4 == 0).then(|| draw(n, -0.5, 0.5)),
            dout: draw(rows * n, -1.0, 1.0),
            eps: 1e-5,
        };
        let [(fwd, fwd_m), (bwd, bwd_m)] = exact(&c);
        let name = format!(
            "[{rows}, {n}] centre {centre} weight={} bias={}",
            c.w.is_some(),
            c.b.is_some()
        );
        let lg = ((n.max(rows).max(2)) as f64).log2();
        match both!(s, run_forward(&c)) {
            Ok((cv, t)) => s.judge("layer_norm", &name, &cv, t.as_deref(), &fwd, &|i, _| {
                (8.0 + 2.0 * lg) * U32F * fwd_m[i]
            }),
            Err(e) => s.fail("layer_norm", format!("{name}: {e}")),
        }
        match both!(s, run_backward(&c)) {
            Ok((cv, t)) => s.judge(
                "layer_norm_backward",
                &name,
                &cv,
                t.as_deref(),
                &bwd,
                &|i, _| (16.0 + 2.0 * lg) * U32F * bwd_m[i],
            ),
            Err(e) => s.fail("layer_norm_backward", format!("{name}: {e}")),
        }
    }
}
