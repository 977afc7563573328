//! Scaled dot-product attention, the reference: each batch-head on one thread, its query
//! rows a block of [`ROWS`] at a time, in the operands' width (f32 or f64). A block's scores
//! are one matrix product with the keys, its softmax runs row by row, and its outputs are one
//! product of the weights with the values (the backward pass: four products a block), so the
//! arithmetic runs in faer's matrix kernels rather than one query row at a time. Also the
//! width-generic pieces `norm.rs` shares: the [`Real`] arithmetic and dense copies in and out
//! of views.

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
    /// `c = alpha a b`, or `c += alpha a b` where `add`: `c` row-major (`a`'s rows x `b`'s
    /// columns, its first that many elements), on the calling thread.
    fn gemm(c: &mut [Self], a: Mat<'_, Self>, b: Mat<'_, Self>, alpha: Self, add: bool);
}

/// A dense row-major `rows x cols` matrix (`data` holds exactly that), taken as it is or
/// transposed.
#[derive(Clone, Copy)]
pub(crate) struct Mat<'a, T> {
    data: &'a [T],
    rows: usize,
    cols: usize,
    transposed: bool,
}

impl<'a, T> Mat<'a, T> {
    fn new(data: &'a [T], rows: usize, cols: usize) -> Self {
        Self {
            data: &data[..rows * cols],
            rows,
            cols,
            transposed: false,
        }
    }
    fn t(self) -> Self {
        Self {
            transposed: !self.transposed,
            ..self
        }
    }
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
            fn gemm(c: &mut [$t], a: Mat<'_, $t>, b: Mat<'_, $t>, alpha: $t, add: bool) {
                fn view<'m>(m: Mat<'m, $t>) -> faer::MatRef<'m, $t> {
                    let r = faer::MatRef::from_row_major_slice(m.data, m.rows, m.cols);
                    if m.transposed { r.transpose() } else { r }
                }
                let (a, b) = (view(a), view(b));
                let (m, n, k) = (a.nrows(), b.ncols(), a.ncols());
                debug_assert_eq!(k, b.nrows());
                let c = &mut c[..m * n];
                if m == 0 || n == 0 {
                    return;
                }
                if k == 0 {
                    // An empty sum (faer is not asked for one).
                    if !add {
                        c.fill(0.0);
                    }
                    return;
                }
                faer::linalg::matmul::matmul(
                    faer::MatMut::from_row_major_slice_mut(c, m, n),
                    if add {
                        faer::Accum::Add
                    } else {
                        faer::Accum::Replace
                    },
                    a,
                    b,
                    alpha,
                    faer::Par::Seq,
                );
                crate::math::clear_upper();
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

/// Query rows a block takes: its scores and weights are `ROWS x tk` (twice that backward).
const ROWS: usize = 64;

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
    /// The keys row `i` may attend to: `0..min(i + 1, tk)` when causal, else all.
    #[inline(always)]
    fn reach(&self, s: &AttentionShape, p: &AttentionParams, i: usize) -> usize {
        if p.causal { (i + 1).min(s.tk) } else { s.tk }
    }

    /// The keys any row of the block from row `i0` (`rows` of them) may attend to.
    fn block_keys(&self, s: &AttentionShape, p: &AttentionParams, i0: usize, rows: usize) -> usize {
        self.reach(s, p, i0 + rows.max(1) - 1)
    }

    /// The scores of `rows` query rows from `i0` against the first `keys` keys, row-major
    /// `rows x keys` in `w`: `scale (q_i . k_j) + mask_ij` (one product) up to each row's
    /// reach ([`Head::reach`]); past it the product's values are left for the caller, which
    /// weighs those keys 0.
    fn scores(
        &self,
        s: &AttentionShape,
        p: &AttentionParams,
        [i0, rows, keys]: [usize; 3],
        w: &mut [T],
    ) {
        let q = Mat::new(&self.q[i0 * s.d..], rows, s.d);
        T::gemm(w, q, Mat::new(self.k, keys, s.d).t(), T::of(p.scale), false);
        let Some(m) = self.mask else { return };
        for r in 0..rows {
            let i = i0 + r;
            let reach = self.reach(s, p, i).min(keys);
            let live = &mut w[r * keys..r * keys + reach];
            for (x, &mv) in live.iter_mut().zip(&m[i * s.tk..i * s.tk + reach]) {
                *x = *x + mv;
            }
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

/// The operands both passes read, dense, the mask materialised (broadcast over batch and
/// heads).
struct Operands<T: Real> {
    q: Scratch<T>,
    k: Scratch<T>,
    v: Scratch<T>,
    mask: Option<Scratch<T>>,
}

impl<T: Real> Operands<T> {
    fn new(mask_layout: Option<&Layout>, x: &AttentionInputs<'_, CpuBuffer>) -> Self {
        Self {
            q: dense(x.q),
            k: dense(x.k),
            v: dense(x.v),
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
                k: &self.k[bh * s.tk * s.d..(bh + 1) * s.tk * s.d],
                v: &self.v[bh * s.tk * s.dv..(bh + 1) * s.tk * s.dv],
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
    let operands = Operands::<T>::new(mask_layout, &x);
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

/// [`forward_head`] compiled for AVX2 and FMA: the loops over a row's keys (exponentials,
/// sums, scaling) vectorise 8 wide, their arithmetic unchanged (multiplies and adds rounded
/// separately); the products are faer's, which picks its kernels at run time either way.
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

/// One batch-head's output rows `o` and log-sum-exps `l`, a block of rows at a time.
#[inline(always)]
fn forward_head<T: Real>(
    s: &AttentionShape,
    p: &AttentionParams,
    h: &Head<'_, T>,
    o: &mut [T],
    l: &mut [T],
) {
    let mut w = Scratch::<T>::zeroed(ROWS.min(s.tq) * s.tk);
    for i0 in (0..s.tq).step_by(ROWS) {
        let rows = ROWS.min(s.tq - i0);
        let keys = h.block_keys(s, p, i0, rows);
        let w = &mut w[..rows * keys];
        h.scores(s, p, [i0, rows, keys], w);
        for r in 0..rows {
            let i = i0 + r;
            let reach = h.reach(s, p, i).min(keys);
            let (live, beyond) = w[r * keys..(r + 1) * keys].split_at_mut(reach);
            beyond.fill(T::ZERO);
            let max = lanes(live, T::NEG_INF, |m, x| if x > m { x } else { m });
            if max == T::NEG_INF {
                // Nothing to attend to: no weights, an output row of zeros.
                l[i] = T::NEG_INF;
                live.fill(T::ZERO);
                continue;
            }
            // Each exponential once: the row holds exp(s - max), the weights are those over
            // their sum (times the dropout factors).
            for x in live.iter_mut() {
                *x = (*x - max).exp();
            }
            let sum = lanes(live, T::ZERO, |a, e| a + e);
            l[i] = max + sum.ln();
            let inv = T::of(1.0) / sum;
            for (j, x) in live.iter_mut().enumerate() {
                *x = *x * inv * h.factor(s, p, i, j);
            }
        }
        // The block's outputs: its weights times the values.
        let out = &mut o[i0 * s.dv..(i0 + rows) * s.dv];
        let v = Mat::new(h.v, keys, s.dv);
        T::gemm(out, Mat::new(w, rows, keys), v, T::of(1.0), false);
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
    let operands = Operands::<T>::new(mask_layout, &x);
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

/// Batch-head `bh`'s gradients `[dq, dk, dv]` (`dk` and `dv` zeroed), recomputing its
/// weights `w` a block of rows at a time: per block `dv += (w z)^T do`, `dp = do v^T`,
/// `ds = scale w (z dp - delta)`, `dq = ds k` and `dk += ds^T q`, with `z` the dropout
/// factors and `delta_i = do_i . o_i`; the blocks add into `dk` and `dv` in order.
#[inline(always)]
fn backward_head<T: Real>(
    s: &AttentionShape,
    p: &AttentionParams,
    h: &Head<'_, T>,
    of: &Rows<'_, T>,
    bh: usize,
    [dq, dk, dv]: [&mut [T]; 3],
) {
    let (scale, one) = (T::of(p.scale), T::of(1.0));
    let block = ROWS.min(s.tq) * s.tk;
    let (mut w, mut ds) = (Scratch::<T>::zeroed(block), Scratch::<T>::zeroed(block));
    for i0 in (0..s.tq).step_by(ROWS) {
        let rows = ROWS.min(s.tq - i0);
        let keys = h.block_keys(s, p, i0, rows);
        let (w, ds) = (&mut w[..rows * keys], &mut ds[..rows * keys]);
        let first = bh * s.tq + i0;
        let dout = &of.dout[first * s.dv..(first + rows) * s.dv];
        // The weights `exp(s - lse)`: 0 beyond a row's reach and on a row with nothing to
        // attend to; with dropout, in `ds` for now, the weights times its factors.
        h.scores(s, p, [i0, rows, keys], w);
        for r in 0..rows {
            let i = i0 + r;
            let li = of.l[first + r];
            let reach = h.reach(s, p, i).min(keys);
            let (row, zrow) = (
                &mut w[r * keys..(r + 1) * keys],
                &mut ds[r * keys..(r + 1) * keys],
            );
            if li == T::NEG_INF {
                row.fill(T::ZERO);
                zrow.fill(T::ZERO);
                continue;
            }
            let (live, beyond) = row.split_at_mut(reach);
            beyond.fill(T::ZERO);
            for x in live.iter_mut() {
                *x = (*x - li).exp();
            }
            if p.dropout != 0.0 {
                for (j, (z, &x)) in zrow.iter_mut().zip(row.iter()).enumerate() {
                    *z = x * h.factor(s, p, i, j);
                }
            }
        }
        // Without dropout every factor is 1 and the weights serve as they are.
        let wz = Mat::new(if p.dropout != 0.0 { &*ds } else { &*w }, rows, keys).t();
        T::gemm(
            &mut dv[..keys * s.dv],
            wz,
            Mat::new(dout, rows, s.dv),
            one,
            true,
        );
        // ds = do v^T, then the score gradients in place: 0 wherever the weight is (masked,
        // beyond the reach, a skipped row), whatever the product there.
        let vt = Mat::new(h.v, keys, s.dv).t();
        T::gemm(ds, Mat::new(dout, rows, s.dv), vt, one, false);
        for r in 0..rows {
            let (i, at) = (i0 + r, first + r);
            let delta = dot(
                &dout[r * s.dv..(r + 1) * s.dv],
                &of.o[at * s.dv..(at + 1) * s.dv],
            );
            let (wr, dr) = (
                &w[r * keys..(r + 1) * keys],
                &mut ds[r * keys..(r + 1) * keys],
            );
            for (j, (d, &wj)) in dr.iter_mut().zip(wr).enumerate() {
                *d = if wj == T::ZERO {
                    T::ZERO
                } else {
                    scale * (wj * (h.factor(s, p, i, j) * *d - delta))
                };
            }
        }
        let ds = Mat::new(ds, rows, keys);
        let dq_rows = &mut dq[i0 * s.d..(i0 + rows) * s.d];
        T::gemm(dq_rows, ds, Mat::new(h.k, keys, s.d), one, false);
        let q = Mat::new(&h.q[i0 * s.d..], rows, s.d);
        T::gemm(&mut dk[..keys * s.d], ds.t(), q, one, true);
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
