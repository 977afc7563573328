//! Checks of attention and attention_backward: odd sizes, strided views (q and the output
//! inside a packed `[b, t, h, d]` buffer, v transposed), causal and additive masks (one row
//! masked whole), dropout, against a float64 host reference that recomputes each weight.

use super::*;
use crate::host::bytes_of;
use hal::attention::keeps;
use hal::{AttentionGrads, AttentionInputs, AttentionParams};

/// One drawn case: sizes, parameters and data (row-major `[b, h, t, c]` logical values).
#[derive(Clone, Debug)]
struct Case {
    b: usize,
    h: usize,
    tq: usize,
    tk: usize,
    d: usize,
    dv: usize,
    p: AttentionParams,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    /// Additive `[tq, tk]`, broadcast over batch and heads (f32 whatever `dtype` is).
    mask: Option<Vec<f32>>,
    dout: Vec<f32>,
    /// The dtype of q, k, v, dout and the results (lse is f32 for the 16-bit ones); the
    /// values above are already rounded to it.
    dtype: DType,
}

/// The device operands: q and out live permuted inside `[b, t, h, c]` buffers, v is stored
/// `[b, h, dv, tk]` and viewed transposed, k is contiguous.
struct Operands<B: Backend> {
    buffers: Vec<B::Buffer>,
    layouts: Vec<Layout>,
}

const Q: usize = 0;
const K: usize = 1;
const V: usize = 2;
const MASK: usize = 3;
const OUT: usize = 4;
const LSE: usize = 5;
const DOUT: usize = 6;
const DQ: usize = 7;
const DK: usize = 8;
const DV: usize = 9;

fn packed(b: usize, h: usize, t: usize, c: usize) -> Layout {
    Layout::contiguous(&[b, t, h, c])
        .permute(&[0, 2, 1, 3])
        .expect("rank 4")
}

/// Row-major `[b, h, t, c]` values laid out for `layout` in a buffer of `len` elements.
fn scatter(values: &[f32], layout: &Layout, len: usize) -> Vec<f32> {
    let mut buf = vec![0f32; len.max(1)];
    for (lin, &x) in values.iter().enumerate() {
        let idx = unravel(lin, &layout.shape);
        buf[layout.index_of(&idx)] = x;
    }
    buf
}

fn operands<B: Backend>(bk: &B, c: &Case) -> Result<Operands<B>> {
    let (b, h) = (c.b, c.h);
    let vt = Layout::contiguous(&[b, h, c.dv, c.tk])
        .transpose(2, 3)
        .expect("rank 4");
    let mask_l = Layout::contiguous(&[1, 1, c.tq, c.tk]);
    let layouts = vec![
        packed(b, h, c.tq, c.d),
        Layout::contiguous(&[b, h, c.tk, c.d]),
        vt,
        mask_l,
        packed(b, h, c.tq, c.dv),
        Layout::contiguous(&[b, h, c.tq]),
        Layout::contiguous(&[b, h, c.tq, c.dv]),
        packed(b, h, c.tq, c.d),
        Layout::contiguous(&[b, h, c.tk, c.d]),
        Layout::contiguous(&[b, h, c.tk, c.dv]),
    ];
    let n = |l: &Layout| l.shape.iter().product::<usize>();
    let data: [Option<&[f32]>; 10] = [
        Some(&c.q),
        Some(&c.k),
        Some(&c.v),
        c.mask.as_deref(),
        None,
        None,
        Some(&c.dout),
        None,
        None,
        None,
    ];
    let mut buffers = Vec::new();
    for (i, (l, d)) in layouts.iter().zip(data).enumerate() {
        let host = match d {
            Some(values) => scatter(values, l, n(l)),
            // Outputs start as NaN: an element a backend fails to write shows.
            None => vec![f32::NAN; n(l).max(1)],
        };
        let dtype = match i {
            MASK => DType::F32,
            LSE => hal::validate::lse_dtype(c.dtype),
            _ => c.dtype,
        };
        buffers.push(bk.upload_bytes(dtype, &bytes_of(dtype, &host))?);
    }
    Ok(Operands { buffers, layouts })
}

impl<B: Backend> Operands<B> {
    fn view(&self, i: usize) -> View<'_, B::Buffer> {
        View::new(&self.buffers[i], &self.layouts[i])
    }
    fn inputs(&self, masked: bool) -> AttentionInputs<'_, B::Buffer> {
        AttentionInputs {
            q: self.view(Q),
            k: self.view(K),
            v: self.view(V),
            mask: masked.then(|| self.view(MASK)),
        }
    }
    fn read(&self, bk: &B, i: usize) -> Result<Vec<f64>> {
        read_view(bk, &self.buffers[i], &self.layouts[i])
    }
}

/// Forward: `out` then `lse`, row-major.
fn run_forward<B: Backend>(bk: &B, c: &Case) -> Result<Vec<f64>> {
    let o = operands(bk, c)?;
    bk.attention(o.inputs(c.mask.is_some()), o.view(OUT), o.view(LSE), &c.p)?;
    let mut r = o.read(bk, OUT)?;
    r.extend(o.read(bk, LSE)?);
    Ok(r)
}

/// Backward (after the backend's own forward pass): `dq`, `dk`, `dv`, row-major.
fn run_backward<B: Backend>(bk: &B, c: &Case) -> Result<Vec<f64>> {
    let o = operands(bk, c)?;
    let x = o.inputs(c.mask.is_some());
    bk.attention(x, o.view(OUT), o.view(LSE), &c.p)?;
    let grads = AttentionGrads {
        dq: o.view(DQ),
        dk: o.view(DK),
        dv: o.view(DV),
    };
    bk.attention_backward(x, o.view(OUT), o.view(LSE), o.view(DOUT), grads, &c.p)?;
    let mut r = o.read(bk, DQ)?;
    r.extend(o.read(bk, DK)?);
    r.extend(o.read(bk, DV)?);
    Ok(r)
}

/// The float64 answer and, per element, the sum of its terms' magnitudes (what the
/// tolerance scales).
struct Exact {
    fwd: Vec<f64>,
    fwd_mag: Vec<f64>,
    bwd: Vec<f64>,
    bwd_mag: Vec<f64>,
}

#[allow(clippy::needless_range_loop)] // j indexes p, the scores and the dropout stream
fn exact(c: &Case) -> Exact {
    let (tq, tk, d, dv) = (c.tq, c.tk, c.d, c.dv);
    let bhs = c.b * c.h;
    let at = |x: &[f32], bh: usize, t: usize, w: usize, i: usize, col: usize| {
        x[(bh * t + i) * w + col] as f64
    };
    let scale = c.p.scale as f64;
    let keep = c.p.keep_scale() as f64;
    let mut out = vec![0f64; bhs * tq * dv];
    let mut out_mag = vec![0f64; bhs * tq * dv];
    let mut lse = vec![0f64; bhs * tq];
    let mut lse_mag = vec![0f64; bhs * tq];
    let (mut dq, mut dk, mut dv_) = (
        vec![0f64; bhs * tq * d],
        vec![0f64; bhs * tk * d],
        vec![0f64; bhs * tk * dv],
    );
    let (mut dq_m, mut dk_m, mut dv_m) = (dq.clone(), dk.clone(), dv_.clone());
    for bh in 0..bhs {
        for i in 0..tq {
            let s: Vec<f64> = (0..tk)
                .map(|j| {
                    if c.p.causal && j > i {
                        return f64::NEG_INFINITY;
                    }
                    let dot: f64 = (0..d)
                        .map(|e| at(&c.q, bh, tq, d, i, e) * at(&c.k, bh, tk, d, j, e))
                        .sum();
                    scale * dot + c.mask.as_ref().map_or(0.0, |m| m[i * tk + j] as f64)
                })
                .collect();
            let max = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            // Each score's magnitude sigma_ij (its own rounding moves its weight by about
            // d u sigma_ij) and the row's largest (which moves lse).
            let sigma: Vec<f64> = (0..tk)
                .map(|j| {
                    let dot: f64 = (0..d)
                        .map(|e| (at(&c.q, bh, tq, d, i, e) * at(&c.k, bh, tk, d, j, e)).abs())
                        .sum();
                    let m = c.mask.as_ref().map_or(0.0, |m| m[i * tk + j] as f64);
                    scale * dot + if m.is_finite() { m.abs() } else { 0.0 }
                })
                .collect();
            let row_sigma = (0..tk)
                .filter(|&j| s[j] > f64::NEG_INFINITY)
                .map(|j| sigma[j])
                .fold(0.0, f64::max);
            let moved = |j: usize| 1.0 + sigma[j] + row_sigma;
            let r = bh * tq + i;
            if max == f64::NEG_INFINITY {
                lse[r] = f64::NEG_INFINITY;
                lse_mag[r] = 1.0;
                continue;
            }
            let l = max + s.iter().map(|&x| (x - max).exp()).sum::<f64>().ln();
            lse[r] = l;
            lse_mag[r] = 1.0 + l.abs() + row_sigma;
            let pos = |j: usize| c.p.offset + (r * tk + j) as u64;
            let z = |j: usize| if keeps(&c.p, pos(j)) { keep } else { 0.0 };
            let p: Vec<f64> = s.iter().map(|&x| (x - l).exp()).collect();
            for e in 0..dv {
                for j in 0..tk {
                    let term = p[j] * z(j) * at(&c.v, bh, tk, dv, j, e);
                    out[r * dv + e] += term;
                    out_mag[r * dv + e] += term.abs() * moved(j);
                }
            }
            let g = |e: usize| at(&c.dout, bh, tq, dv, i, e);
            let delta: f64 = (0..dv).map(|e| g(e) * out[r * dv + e]).sum();
            // What moves delta: its terms' magnitudes and the error of the output it is
            // formed from (which can dwarf delta itself where its terms cancel).
            let delta_mag: f64 = (0..dv)
                .map(|e| g(e).abs() * (out[r * dv + e].abs() + out_mag[r * dv + e]))
                .sum();
            for j in 0..tk {
                if p[j] == 0.0 {
                    continue;
                }
                let dp: f64 = (0..dv).map(|e| g(e) * at(&c.v, bh, tk, dv, j, e)).sum();
                let dp_mag: f64 = (0..dv)
                    .map(|e| (g(e) * at(&c.v, bh, tk, dv, j, e)).abs())
                    .sum();
                let ds = scale * p[j] * (z(j) * dp - delta);
                let ds_mag = scale * p[j] * (z(j) * dp_mag + delta_mag) * moved(j);
                let kr = bh * tk + j;
                for e in 0..d {
                    let kv = at(&c.k, bh, tk, d, j, e);
                    let qv = at(&c.q, bh, tq, d, i, e);
                    dq[r * d + e] += ds * kv;
                    dq_m[r * d + e] += ds_mag * kv.abs();
                    dk[kr * d + e] += ds * qv;
                    dk_m[kr * d + e] += ds_mag * qv.abs();
                }
                for e in 0..dv {
                    let t = p[j] * z(j) * g(e);
                    dv_[kr * dv + e] += t;
                    dv_m[kr * dv + e] += t.abs() * moved(j);
                }
            }
        }
    }
    Exact {
        fwd: out.into_iter().chain(lse).collect(),
        fwd_mag: out_mag.into_iter().chain(lse_mag).collect(),
        bwd: dq.into_iter().chain(dk).chain(dv_).collect(),
        bwd_mag: dq_m.into_iter().chain(dk_m).chain(dv_m).collect(),
    }
}

/// Sizes `(b, h, tq, tk, d, dv)`: the special ones first (empty, single, odd, widths past
/// 64 and up to 128, heads of width 0), then random ones.
const SIZES: [(usize, usize, usize, usize, usize, usize); 12] = [
    (1, 1, 1, 1, 1, 1),
    (2, 3, 7, 7, 5, 5),
    (1, 2, 65, 65, 64, 64),
    (2, 1, 130, 129, 16, 9),
    (1, 1, 3, 70, 33, 20),
    (1, 2, 0, 5, 8, 8),
    (1, 1, 4, 0, 8, 8),
    (1, 1, 9, 9, 100, 128),
    (3, 2, 257, 257, 64, 64),
    // GPT-2's block: the key loop over 32 tiles, 16 query blocks.
    (1, 2, 1024, 1024, 64, 64),
    // Empty heads: scores of 0 (a uniform softmax over the keys, or over the unmasked
    // ones), and outputs of width 0 whose log-sum-exp is still defined.
    (1, 2, 5, 6, 0, 4),
    (2, 1, 6, 5, 3, 0),
];

pub(super) fn attention<B: Backend>(s: &mut Suite<'_, B>) {
    for dtype in [DType::F32, DType::BF16, DType::F16] {
        attention_in(s, dtype);
    }
}

/// [`attention`]'s cases with operands of `dtype` (16-bit ones take every other size, their
/// values rounded to the dtype before the reference sees them).
fn attention_in<B: Backend>(s: &mut Suite<'_, B>, dtype: DType) {
    let narrow = dtype != DType::F32;
    // A CPU adapter's loop cap refuses the longest rows (the wgpu backend says so).
    let software = s.target.info().kind == hal::DeviceKind::Software;
    for n in 0..SIZES.len() + s.cfg.cases {
        if narrow && n % 2 == (dtype == DType::F16) as usize {
            continue;
        }
        if software && SIZES.get(n).is_some_and(|z| z.2.max(z.3) > 320) {
            continue;
        }
        let (b, h, tq, tk, d, dv) = match SIZES.get(n) {
            Some(&sz) => sz,
            None => {
                let r = s.rng();
                let t = 1 + r.below(90);
                (
                    1 + r.below(3),
                    1 + r.below(3),
                    t,
                    t,
                    1 + r.below(64),
                    1 + r.below(64),
                )
            }
        };
        let r = s.rng();
        let mut p = AttentionParams::new(d.max(1));
        p.causal = n % 3 == 1 || n == 8;
        let masked = n % 4 == 2 && tq > 0 && tk > 0;
        if n % 5 == 3 {
            p.dropout = 0.25;
            p.seed = 0x5eed + n as u64;
            p.offset = 1 << 33;
        }
        let mut draw = |len: usize, lo: f32, hi: f32| -> Vec<f32> {
            (0..len).map(|_| round_to(dtype, r.range(lo, hi))).collect()
        };
        let mask = masked.then(|| {
            let mut m = draw(tq * tk, -2.0, 2.0);
            for (e, x) in m.iter_mut().enumerate() {
                // Every fifth weight dropped, and the first row whole.
                if e % 5 == 0 || e < tk {
                    *x = f32::NEG_INFINITY;
                }
            }
            m
        });
        let c = Case {
            b,
            h,
            tq,
            tk,
            d,
            dv,
            p,
            q: draw(b * h * tq * d, -2.0, 2.0),
            k: draw(b * h * tk * d, -2.0, 2.0),
            v: draw(b * h * tk * dv, -1.0, 1.0),
            mask,
            dout: draw(b * h * tq * dv, -1.0, 1.0),
            dtype,
        };
        let e = exact(&c);
        let name = format!(
            "[{b}, {h}, {tq}/{tk}, {d}/{dv}] {dtype} causal={} mask={} dropout={}",
            c.p.causal, masked, c.p.dropout
        );
        let lg = (tq.max(tk).max(2) as f64).log2();
        // Under Precision::Fast the products may round to TF32 (10 explicit bits). 16-bit
        // operands are exact in f32 and TF32: the arithmetic's `u` is the policy's, and each
        // result is rounded once more to the dtype (`u16`), as is the output the backward
        // pass reads (its delta moves by about `u16` of its terms: twice that, on the scale);
        // a backend and the reference each round, so twice `u16` on the value.
        let fast = s.policy == hal::Precision::Fast;
        let u = if fast { 2f64.powi(-11) } else { U32F };
        let u16 = if narrow { dtype.unit_roundoff() } else { 0.0 };
        // The spacing of the dtype's subnormals (f16's start at 6.1e-5), where `u16` relative
        // no longer bounds a rounding.
        let tiny = match dtype {
            DType::F16 => 2f64.powi(-24),
            _ => 0.0,
        };
        let rows = match (narrow, fast) {
            (false, false) => ["attention", "attention_backward"],
            (false, true) => [
                "attention (Precision::Fast)",
                "attention_backward (Precision::Fast)",
            ],
            (true, false) => ["attention (16-bit)", "attention_backward (16-bit)"],
            (true, true) => [
                "attention (16-bit, Precision::Fast)",
                "attention_backward (16-bit, Precision::Fast)",
            ],
        };
        // Fast 16-bit kernels may round the weights to the dtype before their product with v
        // (the backward pass's `2 u16` on the terms' magnitudes already covers its own).
        let weights16 = if fast { u16 } else { 0.0 };
        match both!(s, run_forward(&c)) {
            Ok((cv, t)) => s.judge(rows[0], &name, &cv, t.as_deref(), &e.fwd, &|i, w| {
                ((8.0 + lg + d as f64) * u + weights16) * e.fwd_mag[i]
                    + 2.0 * (u16 * w.abs() + tiny)
            }),
            Err(err) => s.fail(rows[0], format!("{name}: {err}")),
        }
        match both!(s, run_backward(&c)) {
            Ok((cv, t)) => s.judge(rows[1], &name, &cv, t.as_deref(), &e.bwd, &|i, w| {
                ((16.0 + 2.0 * lg + (d + dv) as f64) * u + 2.0 * u16) * e.bwd_mag[i]
                    + 2.0 * (u16 * w.abs() + tiny)
            }),
            Err(err) => s.fail(rows[1], format!("{name}: {err}")),
        }
    }
}
