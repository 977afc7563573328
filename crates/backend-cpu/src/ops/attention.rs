//! Scaled dot-product attention, the reference: each batch-head's rows in order, in the
//! operands' width (f32 or f64), one thread per batch-head. Also the width-generic pieces
//! `norm.rs` shares: the [`Real`] arithmetic and dense copies in and out of views.

use crate::storage::{CpuBuffer, Dst, Scratch, Src};
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
    ($t:ty, $exp:expr) => {
        impl Real for $t {
            const ZERO: $t = 0.0;
            const NEG_INF: $t = <$t>::NEG_INFINITY;
            fn of(v: f32) -> $t {
                v as $t
            }
            #[inline(always)]
            fn exp(self) -> $t {
                $exp(self)
            }
            fn ln(self) -> $t {
                <$t>::ln(self)
            }
            #[inline(always)]
            fn madd(self, a: $t, b: $t) -> $t {
                self * a + b
            }
            fn sqrt(self) -> $t {
                <$t>::sqrt(self)
            }
        }
    };
}
// f32's exponential vectorises (`math::exp_f32`, within 2 ulp); f64's is libm's.
real!(f32, crate::math::exp_f32);
real!(f64, f64::exp);

/// A view's elements in row-major order as `T`.
pub(crate) fn dense<T: Real>(v: View<'_, CpuBuffer>) -> Scratch<T> {
    dense_layout(v.buffer.src(), v.layout)
}

fn dense_layout<T: Real>(src: Src, layout: &Layout) -> Scratch<T> {
    let mut out = Scratch::<T>::zeroed(layout.numel());
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

/// `sum a_k b_k` in eight running partial sums (element `k` into sum `k % 8`), added in a
/// fixed tree at the end: the same order on every machine, and loops of eight the compiler
/// turns into one or two vector operations. (A head's width is often 16 or 64; a loop
/// of unknown length that short stays scalar, its vector body being wider than the loop.)
#[inline(always)]
fn dot<T: Real>(a: &[T], b: &[T]) -> T {
    let n = a.len().min(b.len());
    let split = n / 8 * 8;
    let mut acc = [T::ZERO; 8];
    for (x, y) in a[..split].chunks_exact(8).zip(b[..split].chunks_exact(8)) {
        let (x, y): (&[T; 8], &[T; 8]) = (x.try_into().unwrap(), y.try_into().unwrap());
        for k in 0..8 {
            acc[k] = x[k].madd(y[k], acc[k]);
        }
    }
    for k in split..n {
        acc[k - split] = a[k].madd(b[k], acc[k - split]);
    }
    tree(acc, |x, y| x + y)
}

/// Eight lanes combined by `f` in a fixed tree: `((0 4) (2 6)) ((1 5) (3 7))`.
#[inline(always)]
pub(crate) fn tree<T: Copy>(acc: [T; 8], f: impl Fn(T, T) -> T) -> T {
    f(
        f(f(acc[0], acc[4]), f(acc[2], acc[6])),
        f(f(acc[1], acc[5]), f(acc[3], acc[7])),
    )
}

/// `y += a x`, eight elements at a time (see [`dot`]).
#[inline(always)]
fn axpy<T: Real>(a: T, x: &[T], y: &mut [T]) {
    let n = x.len().min(y.len());
    let split = n / 8 * 8;
    let (y8, tail) = y[..n].split_at_mut(split);
    for (yc, xc) in y8.chunks_exact_mut(8).zip(x[..split].chunks_exact(8)) {
        // Eight lanes as arrays, by value in and out: the form the compiler turns into one
        // vector operation. (Loops, not `array::from_fn`, which is not always inlined.)
        let (yc, xc): (&mut [T; 8], &[T; 8]) = (yc.try_into().unwrap(), xc.try_into().unwrap());
        let (xv, mut yv) = (*xc, *yc);
        for k in 0..8 {
            yv[k] = a.madd(xv[k], yv[k]);
        }
        *yc = yv;
    }
    for (yc, &xc) in tail.iter_mut().zip(&x[split..n]) {
        *yc = a.madd(xc, *yc);
    }
}

/// `out[j] += sum_c x[c] t[c * stride + j]` for the `j < out.len()`, the terms added in
/// order of `c`: a row vector times a transposed matrix, one vectorised pass per `c`.
#[inline(always)]
fn product_row<T: Real>(x: &[T], t: &[T], stride: usize, out: &mut [T]) {
    let n = out.len();
    for (c, &xc) in x.iter().enumerate() {
        axpy(xc, &t[c * stride..c * stride + n], out);
    }
}

/// One batch-head's operands, row-major.
struct Head<'a, T> {
    q: &'a [T],
    /// Keys and values transposed (`d x tk`, `dv x tk`): a row of scores is then `d` loops over
    /// the keys, which vectorise, rather than `tk` dot products of `d` terms each.
    kt: &'a [T],
    vt: &'a [T],
    mask: Option<&'a [T]>,
    /// This head's first weight's position in the dropout stream.
    first: u64,
}

impl<T: Real> Head<'_, T> {
    /// The keys row `i` may attend to: `0..min(i + 1, tk)` when causal, else all.
    #[inline(always)]
    fn reach(&self, s: &AttentionShape, p: &AttentionParams, i: usize) -> usize {
        if p.causal { (i + 1).min(s.tk) } else { s.tk }
    }

    /// Row `i`'s scores (`-inf` where masked). Each is `scale (q_i . k_j)`, the dot product
    /// summed in order over the head's columns.
    #[inline(always)]
    fn scores(&self, s: &AttentionShape, p: &AttentionParams, i: usize, row: &mut [T]) {
        let reach = self.reach(s, p, i);
        let (live, masked) = row.split_at_mut(reach);
        live.fill(T::ZERO);
        masked.fill(T::NEG_INF);
        product_row(&self.q[i * s.d..(i + 1) * s.d], self.kt, s.tk, live);
        let scale = T::of(p.scale);
        match self.mask {
            Some(m) => {
                for (x, &mv) in live.iter_mut().zip(&m[i * s.tk..i * s.tk + reach]) {
                    *x = scale * *x + mv;
                }
            }
            None => live.iter_mut().for_each(|x| *x = scale * *x),
        }
    }

    /// The dropout factor of weight `(i, j)`: `1 / (1 - dropout)` or 0.
    #[inline(always)]
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

/// Each head's `tk x width` block of `x` transposed to `width x tk`.
fn transposed<T: Real>(x: &[T], heads: usize, tk: usize, width: usize) -> Scratch<T> {
    let mut t = Scratch::<T>::zeroed(heads * tk * width);
    t.par_chunks_mut((tk * width).max(1))
        .zip(x.par_chunks((tk * width).max(1)))
        .for_each(|(t, x)| {
            for (j, row) in x.chunks_exact(width.max(1)).enumerate() {
                for (c, &v) in row.iter().enumerate() {
                    t[c * tk + j] = v;
                }
            }
        });
    t
}

/// The operands both passes read: q dense, k and v dense and transposed per head, the mask
/// materialised (broadcast over batch and heads).
struct Operands<T: Real> {
    q: Scratch<T>,
    kt: Scratch<T>,
    vt: Scratch<T>,
    mask: Option<Scratch<T>>,
}

impl<T: Real> Operands<T> {
    fn new(
        s: &AttentionShape,
        mask_layout: Option<&Layout>,
        x: &AttentionInputs<'_, CpuBuffer>,
    ) -> Self {
        let bh = s.batch * s.heads;
        Self {
            q: dense(x.q),
            kt: transposed(&dense(x.k), bh, s.tk, s.d),
            vt: transposed(&dense(x.v), bh, s.tk, s.dv),
            mask: x
                .mask
                .zip(mask_layout)
                .map(|(m, l)| dense_layout(m.buffer.src(), l)),
        }
    }

    /// Each batch-head's slices.
    fn heads(&self, s: &AttentionShape, p: &AttentionParams) -> Vec<Head<'_, T>> {
        (0..s.batch * s.heads)
            .map(|bh| Head {
                q: &self.q[bh * s.tq * s.d..(bh + 1) * s.tq * s.d],
                kt: &self.kt[bh * s.tk * s.d..(bh + 1) * s.tk * s.d],
                vt: &self.vt[bh * s.tk * s.dv..(bh + 1) * s.tk * s.dv],
                mask: self
                    .mask
                    .as_deref()
                    .map(|m| &m[bh * s.tq * s.tk..(bh + 1) * s.tq * s.tk]),
                first: p.offset + (bh * s.tq * s.tk) as u64,
            })
            .collect()
    }
}

pub(crate) fn forward<T: Real>(
    s: &AttentionShape,
    mask_layout: Option<&Layout>,
    x: AttentionInputs<'_, CpuBuffer>,
    out: View<'_, CpuBuffer>,
    lse: View<'_, CpuBuffer>,
    p: &AttentionParams,
) {
    let operands = Operands::<T>::new(s, mask_layout, &x);
    let hs = operands.heads(s, p);
    let (mut o, o_each) = Scratch::<T>::chunked(hs.len(), s.tq * s.dv);
    let (mut l, l_each) = Scratch::<T>::chunked(hs.len(), s.tq);
    o.par_chunks_mut(o_each)
        .zip(l.par_chunks_mut(l_each))
        .zip(&hs)
        .for_each(|((o, l), h)| {
            #[cfg(target_arch = "x86_64")]
            if crate::has_avx2_fma() {
                // SAFETY: the CPU has AVX2 and FMA (just checked).
                return unsafe { forward_head_avx2(s, p, h, o, l) };
            }
            forward_head(s, p, h, o, l)
        });
    store(&o[..hs.len() * s.tq * s.dv], out);
    store(&l[..hs.len() * s.tq], lse);
}

/// [`forward_head`] compiled for AVX2 and FMA (the lane loops over `d` and `dv` vectorise;
/// the arithmetic is the same, multiplies and adds rounded separately).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn forward_head_avx2<T: Real>(
    s: &AttentionShape,
    p: &AttentionParams,
    h: &Head<'_, T>,
    o: &mut [T],
    l: &mut [T],
) {
    forward_head(s, p, h, o, l)
}

/// One batch-head's output rows `o` (zeroed) and log-sum-exps `l`.
#[inline(always)]
fn forward_head<T: Real>(
    s: &AttentionShape,
    p: &AttentionParams,
    h: &Head<'_, T>,
    o: &mut [T],
    l: &mut [T],
) {
    let mut row = vec![T::ZERO; s.tk];
    for i in 0..s.tq {
        h.scores(s, p, i, &mut row);
        let reach = h.reach(s, p, i);
        let max = lanes(&row[..reach], T::NEG_INF, |m, x| if x > m { x } else { m });
        let oi = &mut o[i * s.dv..(i + 1) * s.dv];
        if max == T::NEG_INF {
            l[i] = T::NEG_INF;
            continue;
        }
        // Each exponential once: the row holds exp(s - max), the weights are those over
        // their sum, each loop over the keys vectorised.
        let live = &mut row[..reach];
        for x in live.iter_mut() {
            *x = (*x - max).exp();
        }
        let sum = lanes(live, T::ZERO, |a, e| a + e);
        l[i] = max + sum.ln();
        let inv = T::of(1.0) / sum;
        for (j, x) in live.iter_mut().enumerate() {
            *x = *x * inv * h.factor(s, p, i, j);
        }
        // o_i[c] = sum_j w_j v[j][c]: a dot product over the keys per column, from the
        // transposed values (no chain of updates to one output row).
        for (c, oc) in oi.iter_mut().enumerate() {
            *oc = dot(live, &h.vt[c * s.tk..c * s.tk + reach]);
        }
    }
}

/// `xs` folded by `f` in eight lanes (element `k` into lane `k % 8`, starting from `init`),
/// the lanes then folded in a fixed tree: the same on every CPU, and vectorised. For max and
/// min the result is that of a sequential fold; for sums it differs only by rounding.
#[inline(always)]
fn lanes<T: Real>(xs: &[T], init: T, f: impl Fn(T, T) -> T) -> T {
    let split = xs.len() / 8 * 8;
    let mut acc = [init; 8];
    for chunk in xs[..split].chunks_exact(8) {
        let chunk: &[T; 8] = chunk.try_into().unwrap();
        for k in 0..8 {
            acc[k] = f(acc[k], chunk[k]);
        }
    }
    for (k, &x) in xs[split..].iter().enumerate() {
        acc[k] = f(acc[k], x);
    }
    tree(acc, f)
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
    let operands = Operands::<T>::new(s, mask_layout, &x);
    let (o, l, dout) = (dense::<T>(out), dense::<T>(lse), dense::<T>(dout));
    let hs = operands.heads(s, p);
    let n = hs.len();
    let (mut dq, dq_each) = Scratch::<T>::chunked(n, s.tq * s.d);
    let (mut dk, dk_each) = Scratch::<T>::chunked(n, s.tk * s.d);
    let (mut dv, dv_each) = Scratch::<T>::chunked(n, s.tk * s.dv);
    let rows = Rows {
        o: &o,
        l: &l,
        dout: &dout,
    };
    dq.par_chunks_mut(dq_each)
        .zip(dk.par_chunks_mut(dk_each))
        .zip(dv.par_chunks_mut(dv_each))
        .zip(hs.par_iter().enumerate())
        .for_each(|(((dq, dk), dv), (bh, h))| {
            let grads = [dq, dk, dv];
            #[cfg(target_arch = "x86_64")]
            if crate::has_avx2_fma() {
                // SAFETY: the CPU has AVX2 and FMA (just checked).
                return unsafe { backward_head_avx2(s, p, h, &rows, bh, grads) };
            }
            backward_head(s, p, h, &rows, bh, grads)
        });
    store(&dq[..n * s.tq * s.d], g.dq);
    store(&dk[..n * s.tk * s.d], g.dk);
    store(&dv[..n * s.tk * s.dv], g.dv);
}

/// The forward's outputs and the incoming gradient, row-major over all batch-heads.
struct Rows<'a, T> {
    o: &'a [T],
    l: &'a [T],
    dout: &'a [T],
}

/// [`backward_head`] compiled for AVX2 and FMA (see [`forward_head_avx2`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn backward_head_avx2<T: Real>(
    s: &AttentionShape,
    p: &AttentionParams,
    h: &Head<'_, T>,
    rows: &Rows<'_, T>,
    bh: usize,
    grads: [&mut [T]; 3],
) {
    backward_head(s, p, h, rows, bh, grads)
}

/// Batch-head `bh`'s gradients `[dq, dk, dv]` (zeroed), recomputing its weights.
#[inline(always)]
fn backward_head<T: Real>(
    s: &AttentionShape,
    p: &AttentionParams,
    h: &Head<'_, T>,
    rows: &Rows<'_, T>,
    bh: usize,
    [dq, dk, dv]: [&mut [T]; 3],
) {
    let scale = T::of(p.scale);
    let (mut row, mut dots) = (vec![T::ZERO; s.tk], vec![T::ZERO; s.tk]);
    for i in 0..s.tq {
        let r = bh * s.tq + i;
        let (li, doi) = (rows.l[r], &rows.dout[r * s.dv..(r + 1) * s.dv]);
        if li == T::NEG_INF {
            continue;
        }
        let delta = dot(doi, &rows.o[r * s.dv..(r + 1) * s.dv]);
        h.scores(s, p, i, &mut row);
        let reach = h.reach(s, p, i);
        // The row's weights `exp(s - lse)` (its lse is finite: a row with nothing to attend
        // to was skipped) and `do_i . v_j` first, in loops over the keys that vectorise.
        for x in row[..reach].iter_mut() {
            *x = (*x - li).exp();
        }
        let dots = &mut dots[..reach];
        dots.fill(T::ZERO);
        product_row(doi, h.vt, s.tk, dots);
        let qi = &h.q[i * s.d..(i + 1) * s.d];
        // `dots` becomes the row's score gradients ds_j (0 where the weight is).
        for (j, (&w, dj)) in row[..reach].iter().zip(dots.iter_mut()).enumerate() {
            if w == T::ZERO {
                *dj = T::ZERO;
                continue;
            }
            let z = h.factor(s, p, i, j);
            axpy(w * z, doi, &mut dv[j * s.dv..(j + 1) * s.dv]);
            let dp = z * *dj;
            let ds = scale * (w * (dp - delta));
            *dj = ds;
            axpy(ds, qi, &mut dk[j * s.d..(j + 1) * s.d]);
        }
        // dq_i[c] = sum_j ds_j k[j][c], a dot product over the keys per column.
        for (c, dqc) in dq[i * s.d..(i + 1) * s.d].iter_mut().enumerate() {
            *dqc = dot(dots, &h.kt[c * s.tk..c * s.tk + reach]);
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::CpuBackend;
    use approx::assert_abs_diff_eq;
    use hal::{
        AttentionGrads, AttentionInputs, AttentionParams, Backend, BackendExt, Layout, View,
    };

    /// Heads whose value width (forward) or key width (backward) is 0 still compute what
    /// does not depend on it: the log-sum-exps, and dv. With `d = 0` every score is 0, so a
    /// causal row `i` weighs its keys `1 / (i + 1)` each and `dv_j = sum_{i >= j} do_i / (i + 1)`.
    #[test]
    fn empty_widths_leave_the_other_results_whole() {
        let cpu = CpuBackend::new();
        let (b, h, t) = (1, 2, 5);
        let p = AttentionParams {
            causal: true,
            ..AttentionParams::new(4)
        };
        let up = |shape: &[usize], f: &dyn Fn(usize) -> f32| {
            let n: usize = shape.iter().product();
            let data: Vec<f32> = (0..n).map(f).collect();
            (cpu.upload(&data).unwrap(), Layout::contiguous(shape))
        };
        // q and k: zero columns.
        let (q, lq) = up(&[b, h, t, 0], &|_| 0.0);
        let inputs = |v, lv| AttentionInputs {
            q: View::new(&q, &lq),
            k: View::new(&q, &lq),
            v: View::new(v, lv),
            mask: None,
        };
        // Forward with dv = 0: the lse of row i is ln(i + 1) when d = 0 too.
        let (v0, lv0) = up(&[b, h, t, 0], &|_| 0.0);
        let (out, lo) = up(&[b, h, t, 0], &|_| 0.0);
        let (lse, ll) = up(&[b, h, t], &|_| -7.0);
        let (lse_v, out_v) = (View::new(&lse, &ll), View::new(&out, &lo));
        cpu.attention(inputs(&v0, &lv0), out_v, lse_v, &p).unwrap();
        for (r, &g) in cpu.read::<f32>(&lse).unwrap().iter().enumerate() {
            assert_abs_diff_eq!(g, ((r % t + 1) as f32).ln(), epsilon = 1e-6);
        }
        // Backward with d = 0 and dv = 3: dv is still the weighted sum of do.
        let dv_w = 3;
        let (v, lv) = up(&[b, h, t, dv_w], &|i| i as f32 * 0.25 - 1.0);
        let (o, lo3) = up(&[b, h, t, dv_w], &|_| 0.0);
        let o_v = View::new(&o, &lo3);
        cpu.attention(inputs(&v, &lv), o_v, lse_v, &p).unwrap();
        let (dout, _) = up(&[b, h, t, dv_w], &|i| (i % 7) as f32 - 3.0);
        let (dq, _) = up(&[b, h, t, 0], &|_| 0.0);
        let (dk, _) = up(&[b, h, t, 0], &|_| 0.0);
        let (dv, _) = up(&[b, h, t, dv_w], &|_| 9.0);
        let grads = AttentionGrads {
            dq: View::new(&dq, &lq),
            dk: View::new(&dk, &lq),
            dv: View::new(&dv, &lv),
        };
        let dout_v = View::new(&dout, &lv);
        cpu.attention_backward(inputs(&v, &lv), o_v, lse_v, dout_v, grads, &p)
            .unwrap();
        let (dv, dout) = (
            cpu.read::<f32>(&dv).unwrap(),
            cpu.read::<f32>(&dout).unwrap(),
        );
        for head in 0..h {
            for j in 0..t {
                for c in 0..dv_w {
                    let at = |i: usize| (head * t + i) * dv_w + c;
                    let want: f32 = (j..t).map(|i| dout[at(i)] / (i + 1) as f32).sum();
                    assert_abs_diff_eq!(dv[at(j)], want, epsilon = 1e-5);
                }
            }
        }
    }
}
