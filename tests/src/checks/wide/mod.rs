//! The f64 rows: every primitive with an `f64` form, on `f64` operands. The CPU reference is
//! held to sums and dot products computed in double-double (error-free transformations, so
//! exact to about 2^-106) and to the IEEE result of the correctly rounded operations; other
//! backends are held to the CPU. A backend that does not run a primitive in `f64`
//! (`Capabilities::f64`) must refuse it with `UnsupportedDType`: the row then counts the
//! refusal, and the report's notes say what was refused and why.

use super::*;

mod elementwise;
mod others;
mod programs;
mod sums;

use elementwise::{fill_copy, unary_binary_ternary};
use others::{arg_reduce, images, sgd};
use programs::{math, programs};
use sums::{indexing, products, reduce};

const U64: f64 = f64::EPSILON / 2.0;

/// `a + b` as a double-double: the rounded sum and its exact error (Knuth's TwoSum).
fn two_sum(a: f64, b: f64) -> (f64, f64) {
    let s = a + b;
    let bb = s - a;
    (s, (a - (s - bb)) + (b - bb))
}

/// A double-double accumulator: sums and dot products to about 2^-106 relative.
#[derive(Clone, Copy, Default)]
struct Dd(f64, f64);

impl Dd {
    fn add(self, v: f64) -> Dd {
        let (s, e) = two_sum(self.0, v);
        let (hi, lo) = two_sum(s, e + self.1);
        Dd(hi, lo)
    }
    /// Adds `a * b` exactly (TwoProduct by fma).
    fn add_product(self, a: f64, b: f64) -> Dd {
        let p = a * b;
        let err = a.mul_add(b, -p);
        self.add(p).add(err)
    }
    fn value(self) -> f64 {
        self.0 + self.1
    }
}

/// Random f64 values of magnitude up to `scale` with all 53 bits random.
fn values(s: &mut Suite<'_, impl Backend>, n: usize, scale: f64) -> Vec<f64> {
    (0..n)
        .map(|_| {
            let r = s.rng();
            let bits = ((r.next_u64() >> 11) as f64) * 2f64.powi(-53);
            scale * (2.0 * bits - 1.0)
        })
        .collect()
}

/// Special values an f64 row must carry through: signed zeros, infinities, NaN, the smallest
/// subnormal, numbers near overflow.
const SPECIAL: [f64; 9] = [
    0.0,
    -0.0,
    f64::INFINITY,
    f64::NEG_INFINITY,
    f64::NAN,
    5e-324,
    -2.2250738585072014e-308,
    1.7e308,
    -1e300,
];

/// A view of `n` elements every other element of a buffer of `2n + 3`, from offset 3 (the
/// strided case), or contiguous.
fn layout_of(n: usize, strided: bool) -> (Layout, usize) {
    if strided {
        (Layout::strided(&[n], &[2], 3).expect("valid"), 2 * n + 3)
    } else {
        (Layout::contiguous(&[n]), n)
    }
}

/// Puts `v` into a backing buffer for `layout` (other elements: a marker value).
fn backing(v: &[f64], layout: &Layout, len: usize) -> Vec<f64> {
    let mut out = vec![-7.25; len.max(1)];
    for (i, &x) in v.iter().enumerate() {
        out[layout.index_of(&[i])] = x;
    }
    out
}

fn read_at<B: Backend>(b: &B, buf: &B::Buffer, layout: &Layout) -> Result<Vec<f64>> {
    let all = b.read_f64(buf)?;
    Ok((0..layout.numel())
        .map(|i| all[layout.index_of(&unravel(i, &layout.shape))])
        .collect())
}

/// Whether `target` must run `op` in f64; when it need not, runs `attempt` on it and checks
/// the refusal. `true` when the row's comparison should go on.
fn offered<B: Backend>(
    s: &mut Suite<'_, B>,
    row: &'static str,
    op: &'static str,
    attempt: impl FnOnce(&B) -> Result<Vec<f64>>,
) -> bool {
    if s.target_is_reference || s.target.capabilities().f64.primitive(op) {
        return true;
    }
    match attempt(s.target) {
        Err(hal::Error::UnsupportedDType { detail, .. }) => {
            s.pass(row);
            let note = format!("{row}: refused ({})", detail.trim_start_matches(" here: "));
            if !s.notes.contains(&note) {
                s.notes.push(note);
            }
        }
        other => s.fail(
            row,
            format!("not offered in f64, yet not refused with UnsupportedDType: {other:?}"),
        ),
    }
    false
}

fn random_on<B: Backend>(b: &B, dist: Distribution, n: usize) -> Result<Vec<f64>> {
    let out = b.alloc(DType::F64, n)?;
    b.random(View::new(&out, &Layout::contiguous(&[n])), dist, 0x5eed, 11)?;
    b.read_f64(&out)
}

fn adam_on<B: Backend>(b: &B, p: &[f64], g: &[f64], h: &AdamParams) -> Result<Vec<f64>> {
    let [pb, gb] = [b.upload(p)?, b.upload(g)?];
    let [mb, vb] = [b.alloc(DType::F64, p.len())?, b.alloc(DType::F64, p.len())?];
    for step in 1..=3 {
        b.adam_step(&pb, &gb, &mb, &vb, &AdamParams { step, ..*h })?;
    }
    b.read_f64(&pb)
}

/// The counter-based stream in f64 (53-bit uniforms), and Adam's update in f64.
fn random_and_optimizers<B: Backend>(s: &mut Suite<'_, B>) {
    let attempt = |b: &B| {
        random_on(
            b,
            Distribution::Uniform {
                low: 0.0,
                high: 1.0,
            },
            1,
        )
    };
    if offered(s, "f64 random", "random", attempt) {
        let n = 4099;
        for dist in [
            Distribution::Uniform {
                low: -2.0,
                high: 3.0,
            },
            Distribution::Normal {
                mean: 1.0,
                std: 0.5,
            },
        ] {
            let want: Vec<f64> = (0..n as u64)
                .map(|i| hal::random::random_value_f64(dist, 0x5eed, 11 + i))
                .collect();
            let exact = matches!(dist, Distribution::Uniform { .. });
            match both!(s, random_on(dist, n)) {
                Ok((c, t)) => s.judge(
                    "f64 random",
                    &format!("{dist:?}"),
                    &c,
                    t.as_deref(),
                    &want,
                    &|_, w| {
                        if exact {
                            0.0
                        } else {
                            8.0 * U64 * w.abs().max(1.0)
                        }
                    },
                ),
                Err(e) => s.fail("f64 random", e),
            }
        }
    }
    let h = AdamParams {
        lr: 1e-2,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.01,
        step: 1,
        decoupled_weight_decay: true,
    };
    let attempt = |b: &B| adam_on(b, &[1.0], &[1.0], &h);
    if offered(s, "f64 adam_step", "adam_step", attempt) {
        let p = values(s, 1025, 2.0);
        let g = values(s, 1025, 1.0);
        // The update in f64, as the CPU computes it (three steps).
        let mut want = p.clone();
        let (mut m, mut v) = (vec![0.0; p.len()], vec![0.0; p.len()]);
        for step in 1..=3 {
            let (b1, b2) = (h.beta1 as f64, h.beta2 as f64);
            let (bc1, bc2) = (1.0 - b1.powi(step), 1.0 - b2.powi(step));
            for i in 0..p.len() {
                want[i] *= 1.0 - h.lr as f64 * h.weight_decay as f64;
                m[i] = b1 * m[i] + (1.0 - b1) * g[i];
                v[i] = b2 * v[i] + (1.0 - b2) * g[i] * g[i];
                want[i] -= h.lr as f64 * (m[i] / bc1) / ((v[i] / bc2).sqrt() + h.eps as f64);
            }
        }
        match both!(s, adam_on(&p, &g, &h)) {
            Ok((c, t)) => s.judge(
                "f64 adam_step",
                "three steps",
                &c,
                t.as_deref(),
                &want,
                &|_, w| 16.0 * U64 * w.abs().max(1.0),
            ),
            Err(e) => s.fail("f64 adam_step", e),
        }
    }
}

/// Every f64 row.
pub(super) fn all<B: Backend>(s: &mut Suite<'_, B>) {
    fill_copy(s);
    unary_binary_ternary(s);
    reduce(s);
    arg_reduce(s);
    images(s);
    sgd(s);
    products(s);
    indexing(s);
    random_and_optimizers(s);
    programs(s);
    math(s);
}

/// The rows `all` produces on every backend (compared, or refused).
pub(super) const ROWS: [&str; 16] = [
    "f64 arg_reduce",
    "f64 im2col, col2im",
    "f64 sgd_step",
    "f64 fill, copy",
    "f64 unary",
    "f64 binary",
    "f64 ternary",
    "f64 reduce",
    "f64 matmul",
    "f64 spmv_csr",
    "f64 gather, scatter_add",
    "f64 segment_sum",
    "f64 random",
    "f64 adam_step",
    "f64 ir program",
    "f64 ir math",
];
