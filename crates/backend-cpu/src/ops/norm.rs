//! Layer normalisation, the reference: each row in order in the operands' width, rows in
//! parallel; the parameter gradients sum rows in order per column.

use crate::ops::attention::{Real, dense, store};
use crate::storage::CpuBuffer;
use hal::{NormGrads, NormInputs, View};
use rayon::prelude::*;

/// The affine parameters as dense vectors (1 and 0 where absent).
fn affine<T: Real>(x: &NormInputs<'_, CpuBuffer>, n: usize) -> (Vec<T>, Vec<T>) {
    (
        x.weight.map_or_else(|| vec![T::of(1.0); n], dense),
        x.bias.map_or_else(|| vec![T::ZERO; n], dense),
    )
}

pub(crate) fn forward<T: Real>(
    x: NormInputs<'_, CpuBuffer>,
    (rows, n): (usize, usize),
    out: View<'_, CpuBuffer>,
    mean: View<'_, CpuBuffer>,
    rstd: View<'_, CpuBuffer>,
    eps: f32,
) {
    let xs = dense::<T>(x.x);
    let (w, b) = affine::<T>(&x, n);
    let inv_n = T::of(1.0) / T::of(n as f32);
    let stats: Vec<(T, T, Vec<T>)> = (0..rows)
        .into_par_iter()
        .map(|r| {
            let row = &xs[r * n..(r + 1) * n];
            let m = pairwise(row, &|v| v) * inv_n;
            let var = pairwise(row, &|v| (v - m) * (v - m)) * inv_n;
            let rs = T::of(1.0) / (var + T::of(eps)).sqrt();
            let y = row
                .iter()
                .zip(w.iter().zip(&b))
                .map(|(&v, (&wc, &bc))| ((v - m) * rs).madd(wc, bc))
                .collect();
            (m, rs, y)
        })
        .collect();
    let y: Vec<T> = stats.iter().flat_map(|s| s.2.iter().copied()).collect();
    store(&y, out);
    store(&stats.iter().map(|s| s.0).collect::<Vec<T>>(), mean);
    store(&stats.iter().map(|s| s.1).collect::<Vec<T>>(), rstd);
}

/// `sum f(x_i)` by halves (eight terms summed in order at the leaves): a rounding error that
/// grows with `log2 n`, as the contract's tolerance assumes, where a running sum's grows with
/// `n` (a long row far from zero drifted past it).
fn pairwise<T: Real>(xs: &[T], f: &dyn Fn(T) -> T) -> T {
    if xs.len() <= 8 {
        return xs.iter().fold(T::ZERO, |a, &v| a + f(v));
    }
    let (lo, hi) = xs.split_at(xs.len() / 2);
    pairwise(lo, f) + pairwise(hi, f)
}

pub(crate) fn backward<T: Real>(
    x: NormInputs<'_, CpuBuffer>,
    (rows, n): (usize, usize),
    mean: View<'_, CpuBuffer>,
    rstd: View<'_, CpuBuffer>,
    dout: View<'_, CpuBuffer>,
    g: NormGrads<'_, CpuBuffer>,
) {
    let xs = dense::<T>(x.x);
    let gs = dense::<T>(dout);
    let (ms, rs) = (dense::<T>(mean), dense::<T>(rstd));
    let (w, _) = affine::<T>(&x, n);
    let inv_n = T::of(1.0) / T::of(n.max(1) as f32);
    let (xs, gs, ms, rs, w) = (&xs, &gs, &ms, &rs, &w);
    let xhat = move |r: usize, c: usize| (xs[r * n + c] - ms[r]) * rs[r];
    let dx: Vec<T> = (0..rows)
        .into_par_iter()
        .flat_map_iter(|r| {
            let (mut a, mut bsum) = (T::ZERO, T::ZERO);
            for c in 0..n {
                let gw = gs[r * n + c] * w[c];
                a = a + gw;
                bsum = gw.madd(xhat(r, c), bsum);
            }
            let (a, bsum) = (a * inv_n, bsum * inv_n);
            (0..n)
                .map(move |c| rs[r] * (gs[r * n + c] * w[c] - a - xhat(r, c) * bsum))
                .collect::<Vec<T>>()
        })
        .collect();
    store(&dx, g.dx);
    let column = |f: &(dyn Fn(usize, usize) -> T + Sync)| -> Vec<T> {
        (0..n)
            .into_par_iter()
            .map(|c| (0..rows).fold(T::ZERO, |acc, r| acc + f(r, c)))
            .collect()
    };
    if let Some(dw) = g.dweight {
        store(&column(&|r, c| gs[r * n + c] * xhat(r, c)), dw);
    }
    if let Some(db) = g.dbias {
        store(&column(&|r, c| gs[r * n + c]), db);
    }
}

/// Which width both passes compute in.
pub(crate) fn is_wide(x: &NormInputs<'_, CpuBuffer>) -> bool {
    x.x.dtype() == hal::DType::F64
}
