//! Layer normalisation, the reference: each row in order in the operands' width, rows in
//! parallel; the parameter gradients sum rows in order per column.

use crate::math::with_avx2;
use crate::ops::attention::{Real, dense, store, tree};
use crate::storage::{CpuBuffer, Scratch};
use hal::{NormGrads, NormInputs, View};
use rayon::prelude::*;

/// The affine parameters as dense vectors (1 and 0 where absent).
fn affine<T: Real>(x: &NormInputs<'_, CpuBuffer>, n: usize) -> (Scratch<T>, Scratch<T>) {
    let filled = |v: T| {
        let mut s = Scratch::<T>::zeroed(n);
        s.fill(v);
        s
    };
    (
        x.weight.map_or_else(|| filled(T::of(1.0)), dense),
        x.bias.map_or_else(|| filled(T::ZERO), dense),
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
    // A chunk per row even for empty rows (whose statistics are 0 / 0: NaN).
    let (mut y, each) = Scratch::<T>::chunked(rows, n);
    let (mut ms, mut rs) = (Scratch::<T>::zeroed(rows), Scratch::<T>::zeroed(rows));
    let (xs, w, b) = (&*xs, &*w, &*b);
    y.par_chunks_mut(each)
        .zip(ms.par_iter_mut().zip(rs.par_iter_mut()))
        .enumerate()
        .for_each(|(r, (y, (m_out, rs_out)))| {
            with_avx2(move || {
                let row = &xs[r * n..(r + 1) * n];
                let m = pairwise(row, &|v| v) * inv_n;
                let var = pairwise(row, &|v| (v - m) * (v - m)) * inv_n;
                let rstd = T::of(1.0) / (var + T::of(eps)).sqrt();
                for (c, yc) in y[..n].iter_mut().enumerate() {
                    *yc = ((row[c] - m) * rstd).madd(w[c], b[c]);
                }
                (*m_out, *rs_out) = (m, rstd);
            })
        });
    store(&y[..rows * n], out);
    store(&ms, mean);
    store(&rs, rstd);
}

/// `sum f(x_i)` by halves (eight terms summed in order at the leaves): a rounding error that
/// grows with `log2 n`, as the contract's tolerance assumes, where a running sum's grows with
/// `n` (a long row far from zero drifted past it).
#[inline(always)]
fn pairwise<T: Real>(xs: &[T], f: &impl Fn(T) -> T) -> T {
    if xs.len() <= 8 {
        return xs.iter().fold(T::ZERO, |a, &v| a + f(v));
    }
    let (lo, hi) = xs.split_at(xs.len() / 2);
    halves(lo, f) + halves(hi, f)
}

/// [`pairwise`]'s recursion (a recursive function cannot be inlined into itself).
fn halves<T: Real>(xs: &[T], f: &impl Fn(T) -> T) -> T {
    pairwise(xs, f)
}

/// Columns per task of the parameter gradients' sums.
const COLUMNS: usize = 32;

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
    let (xs, gs, ms, rs, w) = (&*xs, &*gs, &*ms, &*rs, &*w);
    let mut dx = Scratch::<T>::zeroed(rows * n);
    dx.par_chunks_mut(n.max(1)).enumerate().for_each(|(r, dx)| {
        with_avx2(move || {
            let (g_row, x_row) = (&gs[r * n..(r + 1) * n], &xs[r * n..(r + 1) * n]);
            let (m, s) = (ms[r], rs[r]);
            // sum g w and sum g w xhat, in eight lanes each (no chain of dependent adds).
            let (mut a8, mut b8) = ([T::ZERO; 8], [T::ZERO; 8]);
            let split = n / 8 * 8;
            let rows8 = g_row[..split]
                .chunks_exact(8)
                .zip(x_row[..split].chunks_exact(8))
                .zip(w[..split].chunks_exact(8));
            for ((g8, x8), w8) in rows8 {
                let (g8, x8, w8): (&[T; 8], &[T; 8], &[T; 8]) = (
                    g8.try_into().unwrap(),
                    x8.try_into().unwrap(),
                    w8.try_into().unwrap(),
                );
                for k in 0..8 {
                    let gw = g8[k] * w8[k];
                    a8[k] = a8[k] + gw;
                    b8[k] = gw.madd((x8[k] - m) * s, b8[k]);
                }
            }
            for c in split..n {
                let gw = g_row[c] * w[c];
                a8[c - split] = a8[c - split] + gw;
                b8[c - split] = gw.madd((x_row[c] - m) * s, b8[c - split]);
            }
            let add = |x: T, y: T| x + y;
            let (a, bsum) = (tree(a8, add) * inv_n, tree(b8, add) * inv_n);
            for (c, d) in dx.iter_mut().enumerate() {
                *d = s * (g_row[c] * w[c] - a - (x_row[c] - m) * s * bsum);
            }
        })
    });
    store(&dx, g.dx);
    if let Some(dw) = g.dweight {
        let sums = column(rows, n, |r, c0, acc: &mut [T]| {
            let (g, x) = (&gs[r * n + c0..], &xs[r * n + c0..]);
            let (m, s) = (ms[r], rs[r]);
            for ((a, &gv), &xv) in acc.iter_mut().zip(g).zip(x) {
                *a = *a + gv * ((xv - m) * s);
            }
        });
        store(&sums, dw);
    }
    if let Some(db) = g.dbias {
        let sums = column(rows, n, |r, c0, acc: &mut [T]| {
            for (a, &gv) in acc.iter_mut().zip(&gs[r * n + c0..]) {
                *a = *a + gv;
            }
        });
        store(&sums, db);
    }
}

/// Each column's sum over the rows in order: `add(r, c0, acc)` adds row `r`'s terms for
/// columns `c0..c0 + acc.len()` into `acc`. Chunks of columns run in parallel; each column
/// sums its rows in order, as a loop per column would.
fn column<T: Real>(
    rows: usize,
    n: usize,
    add: impl Fn(usize, usize, &mut [T]) + Sync,
) -> Scratch<T> {
    let mut sums = Scratch::<T>::zeroed(n);
    sums.par_chunks_mut(COLUMNS)
        .enumerate()
        .for_each(|(chunk, acc)| {
            with_avx2(|| {
                for r in 0..rows {
                    add(r, chunk * COLUMNS, acc);
                }
            })
        });
    sums
}

/// Which width both passes compute in.
pub(crate) fn is_wide(x: &NormInputs<'_, CpuBuffer>) -> bool {
    x.x.dtype() == hal::DType::F64
}
