//! Scaled dot-product attention, the reference: each batch-head's rows in order, in the
//! operands' width (f32 or f64), one thread per batch-head. Also the width-generic pieces
//! `norm.rs` shares: the [`Real`] arithmetic and dense copies in and out of views.

use crate::storage::{CpuBuffer, Dst, Src};
use hal::attention::keeps;
use hal::validate::AttentionShape;
use hal::{AttentionGrads, AttentionInputs, AttentionParams, Element, Layout, View};
use rayon::prelude::*;
use std::ops::{Add, Mul, Sub};

/// The arithmetic the attention and layer-norm passes need, in f32 or f64.
pub(crate) trait Real:
    Element
    + Default
    + Send
    + Sync
    + std::ops::Div<Output = Self>
    + PartialOrd
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
{
    const ZERO: Self;
    const NEG_INF: Self;
    fn of(v: f32) -> Self;
    fn exp(self) -> Self;
    fn ln(self) -> Self;
    /// `self * a + b`, rounded twice: the build targets no fma instruction, and a library
    /// `fmaf` call (software where the CPU lacks FMA) cost more than the rest of a GPT step.
    fn madd(self, a: Self, b: Self) -> Self;
    fn sqrt(self) -> Self;
}

macro_rules! real {
    ($t:ty) => {
        impl Real for $t {
            const ZERO: $t = 0.0;
            const NEG_INF: $t = <$t>::NEG_INFINITY;
            fn of(v: f32) -> $t {
                v as $t
            }
            fn exp(self) -> $t {
                <$t>::exp(self)
            }
            fn ln(self) -> $t {
                <$t>::ln(self)
            }
            fn madd(self, a: $t, b: $t) -> $t {
                self * a + b
            }
            fn sqrt(self) -> $t {
                <$t>::sqrt(self)
            }
        }
    };
}
real!(f32);
real!(f64);

/// A view's elements in row-major order as `T`.
pub(crate) fn dense<T: Real>(v: View<'_, CpuBuffer>) -> Vec<T> {
    dense_layout(v.buffer.src(), v.layout)
}

fn dense_layout<T: Real>(src: Src, layout: &Layout) -> Vec<T> {
    let mut out = vec![T::default(); layout.numel()];
    let dst = Dst {
        ptr: out.as_mut_ptr() as *mut u8,
        dtype: T::DTYPE,
    };
    crate::ops::elementwise::copy(src, layout, dst, &Layout::contiguous(&layout.shape));
    out
}

/// Writes row-major `data` into the view.
pub(crate) fn store<T: Real>(data: &[T], out: View<'_, CpuBuffer>) {
    let src = Src {
        ptr: data.as_ptr() as *const u8,
        dtype: T::DTYPE,
    };
    crate::ops::elementwise::copy(
        src,
        &Layout::contiguous(&out.layout.shape),
        out.buffer.dst(),
        out.layout,
    );
}

fn dot<T: Real>(a: &[T], b: &[T]) -> T {
    a.iter()
        .zip(b)
        .fold(T::ZERO, |acc, (&x, &y)| x.madd(y, acc))
}

/// One batch-head's operands, row-major.
struct Head<'a, T> {
    q: &'a [T],
    k: &'a [T],
    v: &'a [T],
    mask: Option<&'a [T]>,
    /// This head's first weight's position in the dropout stream.
    first: u64,
}

impl<T: Real> Head<'_, T> {
    /// Row `i`'s scores (`-inf` where masked).
    fn scores(&self, s: &AttentionShape, p: &AttentionParams, i: usize, row: &mut [T]) {
        let qi = &self.q[i * s.d..(i + 1) * s.d];
        for (j, out) in row.iter_mut().enumerate() {
            *out = if p.causal && j > i {
                T::NEG_INF
            } else {
                let raw = T::of(p.scale) * dot(qi, &self.k[j * s.d..(j + 1) * s.d]);
                match self.mask {
                    Some(m) => raw + m[i * s.tk + j],
                    None => raw,
                }
            };
        }
    }

    /// The dropout factor of weight `(i, j)`: `1 / (1 - dropout)` or 0.
    fn factor(&self, s: &AttentionShape, p: &AttentionParams, i: usize, j: usize) -> T {
        if p.dropout == 0.0 {
            T::of(1.0)
        } else if keeps(p, self.first + (i * s.tk + j) as u64) {
            T::of(p.keep_scale())
        } else {
            T::ZERO
        }
    }
}

/// Weights `exp(s - lse)`, 0 where `lse` is `-inf` (a row with nothing to attend to).
fn weight<T: Real>(score: T, lse: T) -> T {
    if lse == T::NEG_INF {
        T::ZERO
    } else {
        (score - lse).exp()
    }
}

/// Each batch-head's slices of the dense operands, and its mask (materialised broadcast).
fn heads<'a, T: Real>(
    s: &AttentionShape,
    p: &AttentionParams,
    q: &'a [T],
    k: &'a [T],
    v: &'a [T],
    mask: Option<&'a [T]>,
) -> Vec<Head<'a, T>> {
    (0..s.batch * s.heads)
        .map(|bh| Head {
            q: &q[bh * s.tq * s.d..(bh + 1) * s.tq * s.d],
            k: &k[bh * s.tk * s.d..(bh + 1) * s.tk * s.d],
            v: &v[bh * s.tk * s.dv..(bh + 1) * s.tk * s.dv],
            mask: mask.map(|m| &m[bh * s.tq * s.tk..(bh + 1) * s.tq * s.tk]),
            first: p.offset + (bh * s.tq * s.tk) as u64,
        })
        .collect()
}

pub(crate) fn forward<T: Real>(
    s: &AttentionShape,
    mask_layout: Option<&Layout>,
    x: AttentionInputs<'_, CpuBuffer>,
    out: View<'_, CpuBuffer>,
    lse: View<'_, CpuBuffer>,
    p: &AttentionParams,
) {
    let (q, k, v) = (dense::<T>(x.q), dense::<T>(x.k), dense::<T>(x.v));
    let mask = x
        .mask
        .zip(mask_layout)
        .map(|(m, l)| dense_layout::<T>(m.buffer.src(), l));
    let hs = heads(s, p, &q, &k, &v, mask.as_deref());
    let parts: Vec<(Vec<T>, Vec<T>)> = hs
        .par_iter()
        .map(|h| {
            let mut o = vec![T::ZERO; s.tq * s.dv];
            let mut l = vec![T::ZERO; s.tq];
            let mut row = vec![T::ZERO; s.tk];
            for i in 0..s.tq {
                h.scores(s, p, i, &mut row);
                let max = row
                    .iter()
                    .fold(T::NEG_INF, |m, &x| if x > m { x } else { m });
                let oi = &mut o[i * s.dv..(i + 1) * s.dv];
                if max == T::NEG_INF {
                    l[i] = T::NEG_INF;
                    continue;
                }
                // Each exponential once: the row holds exp(s - max), the weights are those over
                // their sum.
                let mut sum = T::ZERO;
                for x in row.iter_mut() {
                    *x = (*x - max).exp();
                    sum = sum + *x;
                }
                l[i] = max + sum.ln();
                let inv = T::of(1.0) / sum;
                for (j, &e) in row.iter().enumerate() {
                    if e == T::ZERO {
                        continue;
                    }
                    let w = e * inv * h.factor(s, p, i, j);
                    for (oc, &vc) in oi.iter_mut().zip(&h.v[j * s.dv..(j + 1) * s.dv]) {
                        *oc = w.madd(vc, *oc);
                    }
                }
            }
            (o, l)
        })
        .collect();
    let o: Vec<T> = parts.iter().flat_map(|(o, _)| o.iter().copied()).collect();
    let l: Vec<T> = parts.iter().flat_map(|(_, l)| l.iter().copied()).collect();
    store(&o, out);
    store(&l, lse);
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn backward<T: Real>(
    s: &AttentionShape,
    mask_layout: Option<&Layout>,
    x: AttentionInputs<'_, CpuBuffer>,
    out: View<'_, CpuBuffer>,
    lse: View<'_, CpuBuffer>,
    dout: View<'_, CpuBuffer>,
    g: AttentionGrads<'_, CpuBuffer>,
    p: &AttentionParams,
) {
    let (q, k, v) = (dense::<T>(x.q), dense::<T>(x.k), dense::<T>(x.v));
    let (o, l, dout) = (dense::<T>(out), dense::<T>(lse), dense::<T>(dout));
    let mask = x
        .mask
        .zip(mask_layout)
        .map(|(m, l)| dense_layout::<T>(m.buffer.src(), l));
    let hs = heads(s, p, &q, &k, &v, mask.as_deref());
    let scale = T::of(p.scale);
    let parts: Vec<[Vec<T>; 3]> = hs
        .par_iter()
        .enumerate()
        .map(|(bh, h)| {
            let mut dq = vec![T::ZERO; s.tq * s.d];
            let mut dk = vec![T::ZERO; s.tk * s.d];
            let mut dv = vec![T::ZERO; s.tk * s.dv];
            let mut row = vec![T::ZERO; s.tk];
            for i in 0..s.tq {
                let r = bh * s.tq + i;
                let (li, doi) = (l[r], &dout[r * s.dv..(r + 1) * s.dv]);
                if li == T::NEG_INF {
                    continue;
                }
                let delta = dot(doi, &o[r * s.dv..(r + 1) * s.dv]);
                h.scores(s, p, i, &mut row);
                let qi = &h.q[i * s.d..(i + 1) * s.d];
                for (j, &sj) in row.iter().enumerate() {
                    let w = weight(sj, li);
                    if w == T::ZERO {
                        continue;
                    }
                    let z = h.factor(s, p, i, j);
                    for (dvc, &g) in dv[j * s.dv..(j + 1) * s.dv].iter_mut().zip(doi) {
                        *dvc = (w * z).madd(g, *dvc);
                    }
                    let dp = z * dot(doi, &h.v[j * s.dv..(j + 1) * s.dv]);
                    let ds = scale * (w * (dp - delta));
                    let kj = &h.k[j * s.d..(j + 1) * s.d];
                    for (dqc, &kc) in dq[i * s.d..(i + 1) * s.d].iter_mut().zip(kj) {
                        *dqc = ds.madd(kc, *dqc);
                    }
                    for (dkc, &qc) in dk[j * s.d..(j + 1) * s.d].iter_mut().zip(qi) {
                        *dkc = ds.madd(qc, *dkc);
                    }
                }
            }
            [dq, dk, dv]
        })
        .collect();
    let cat = |n: usize| -> Vec<T> { parts.iter().flat_map(|p| p[n].iter().copied()).collect() };
    let (dq, dk, dv) = (cat(0), cat(1), cat(2));
    store(&dq, g.dq);
    store(&dk, g.dk);
    store(&dv, g.dv);
}
