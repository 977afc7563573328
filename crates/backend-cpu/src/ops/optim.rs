//! Fused optimiser steps: SGD and Adam.

use crate::walk::CHUNK;
use hal::{AdamParams, SgdParams};
use rayon::prelude::*;

/// A raw `f32` slice shared by threads that touch disjoint ranges of it.
#[derive(Clone, Copy)]
pub(crate) struct Shared(pub *mut f32);
// SAFETY: the optimiser steps give each thread a disjoint range of indices below the
// buffers' common length (validate::sgd_step / adam_step check the lengths).
unsafe impl Send for Shared {}
unsafe impl Sync for Shared {}

impl Shared {
    /// Element `i`'s address. (A method, so closures capture the whole `Send` wrapper.)
    #[inline(always)]
    pub unsafe fn at(self, i: usize) -> *mut f32 {
        // SAFETY: callers pass `i` below the buffer's length (see the impls above).
        unsafe { self.0.add(i) }
    }
}

fn par_ranges(n: usize, f: impl Fn(std::ops::Range<usize>) + Sync) {
    (0..n.div_ceil(CHUNK))
        .into_par_iter()
        .for_each(|c| f(c * CHUNK..((c + 1) * CHUNK).min(n)));
}

pub(crate) fn sgd(n: usize, p: Shared, g: Shared, buf: Option<Shared>, h: &SgdParams) {
    par_ranges(n, |r| {
        for i in r {
            // SAFETY: lengths checked by the caller; ranges are disjoint.
            unsafe {
                let pi = p.at(i);
                let mut gi = *g.at(i) + h.weight_decay * *pi;
                if let Some(b) = buf {
                    let bi = b.at(i);
                    *bi = if h.step <= 1 {
                        gi
                    } else {
                        h.momentum * *bi + (1.0 - h.dampening) * gi
                    };
                    gi = if h.nesterov {
                        gi + h.momentum * *bi
                    } else {
                        *bi
                    };
                }
                *pi -= h.lr * gi;
            }
        }
    });
}

pub(crate) fn adam(n: usize, p: Shared, g: Shared, m: Shared, v: Shared, h: &AdamParams) {
    let t = h.step.max(1) as i32;
    let bc1 = 1.0 - h.beta1.powi(t);
    let bc2 = 1.0 - h.beta2.powi(t);
    let buffers = [p.0, g.0, m.0, v.0];
    let distinct = (0..4).all(|i| (i + 1..4).all(|j| buffers[i] != buffers[j]));
    #[cfg(target_arch = "x86_64")]
    let avx2 = crate::has_avx2_fma();
    par_ranges(n, |r| {
        if !distinct {
            // The same buffer passed twice: element by element through the pointers.
            for i in r {
                // SAFETY: lengths checked by the caller; ranges are disjoint.
                unsafe {
                    let (pi, mi, vi) = (p.at(i), m.at(i), v.at(i));
                    let (mut pv, mut mv, mut vv) = ([*pi], [*mi], [*vi]);
                    adam_slices(&mut pv, &[*g.at(i)], &mut mv, &mut vv, h, bc1, bc2);
                    (*pi, *mi, *vi) = (pv[0], mv[0], vv[0]);
                }
            }
            return;
        }
        // SAFETY: four distinct buffers of at least `n` elements (checked by the caller), and
        // this range is touched by this task only.
        let (ps, gs, ms, vs) = unsafe {
            let len = r.len();
            (
                std::slice::from_raw_parts_mut(p.at(r.start), len),
                std::slice::from_raw_parts(g.at(r.start) as *const f32, len),
                std::slice::from_raw_parts_mut(m.at(r.start), len),
                std::slice::from_raw_parts_mut(v.at(r.start), len),
            )
        };
        #[cfg(target_arch = "x86_64")]
        if avx2 {
            // SAFETY: the CPU has AVX2 (checked above).
            unsafe { adam_slices_avx2(ps, gs, ms, vs, h, bc1, bc2) };
            return;
        }
        adam_slices(ps, gs, ms, vs, h, bc1, bc2);
    });
}

/// One element's Adam update; the same operations in the same order wherever it runs, so
/// vectorised and scalar runs give the same bits (Rust never fuses a multiply and an add).
#[inline(always)]
fn adam_one<const DECOUPLED: bool>(
    p: &mut f32,
    g: f32,
    m: &mut f32,
    v: &mut f32,
    h: &AdamParams,
    bc1: f32,
    bc2: f32,
) {
    let mut g = g;
    if DECOUPLED {
        *p *= 1.0 - h.lr * h.weight_decay;
    } else {
        g += h.weight_decay * *p;
    }
    *m = h.beta1 * *m + (1.0 - h.beta1) * g;
    *v = h.beta2 * *v + (1.0 - h.beta2) * g * g;
    let mhat = *m / bc1;
    let vhat = *v / bc2;
    *p -= h.lr * mhat / (vhat.sqrt() + h.eps);
}

/// Adam over slices: a loop without aliasing or branches on the data, which the compiler
/// vectorises (the weight-decay choice is hoisted out of it).
#[inline(always)]
fn adam_slices(
    ps: &mut [f32],
    gs: &[f32],
    ms: &mut [f32],
    vs: &mut [f32],
    h: &AdamParams,
    bc1: f32,
    bc2: f32,
) {
    let elements = ps.iter_mut().zip(gs).zip(ms.iter_mut()).zip(vs.iter_mut());
    if h.decoupled_weight_decay {
        elements.for_each(|(((p, &g), m), v)| adam_one::<true>(p, g, m, v, h, bc1, bc2));
    } else {
        elements.for_each(|(((p, &g), m), v)| adam_one::<false>(p, g, m, v, h, bc1, bc2));
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn adam_slices_avx2(
    ps: &mut [f32],
    gs: &[f32],
    ms: &mut [f32],
    vs: &mut [f32],
    h: &AdamParams,
    bc1: f32,
    bc2: f32,
) {
    adam_slices(ps, gs, ms, vs, h, bc1, bc2)
}

/// SGD on `f64` buffers: [`sgd`]'s update with the hyperparameters widened. Through raw
/// pointers, element by element: the buffers may be one and the same.
///
/// # Safety
/// Every pointer addresses `n` elements.
pub(crate) unsafe fn sgd_f64(
    n: usize,
    p: *mut f64,
    g: *const f64,
    buf: Option<*mut f64>,
    h: &SgdParams,
) {
    let (wd, mom, damp, lr) = (
        h.weight_decay as f64,
        h.momentum as f64,
        h.dampening as f64,
        h.lr as f64,
    );
    for i in 0..n {
        // SAFETY: the caller's: `i < n`.
        unsafe {
            let pi = p.add(i);
            let mut gi = *g.add(i) + wd * *pi;
            if let Some(b) = buf {
                let bi = b.add(i);
                *bi = if h.step <= 1 {
                    gi
                } else {
                    mom * *bi + (1.0 - damp) * gi
                };
                gi = if h.nesterov { gi + mom * *bi } else { *bi };
            }
            *pi -= lr * gi;
        }
    }
}

/// Adam on `f64` buffers: [`adam_one`]'s update with the hyperparameters widened, element by
/// element through raw pointers (the buffers may alias).
///
/// # Safety
/// Every pointer addresses `n` elements.
pub(crate) unsafe fn adam_f64(n: usize, [p, g, m, v]: [*mut f64; 4], h: &AdamParams) {
    let t = h.step.max(1) as i32;
    let (b1, b2, lr, wd, eps) = (
        h.beta1 as f64,
        h.beta2 as f64,
        h.lr as f64,
        h.weight_decay as f64,
        h.eps as f64,
    );
    let (bc1, bc2) = (1.0 - b1.powi(t), 1.0 - b2.powi(t));
    for i in 0..n {
        // SAFETY: the caller's: `i < n`.
        unsafe {
            let (pi, mi, vi) = (p.add(i), m.add(i), v.add(i));
            let mut gi = *g.add(i);
            if h.decoupled_weight_decay {
                *pi *= 1.0 - lr * wd;
            } else {
                gi += wd * *pi;
            }
            *mi = b1 * *mi + (1.0 - b1) * gi;
            *vi = b2 * *vi + (1.0 - b2) * gi * gi;
            *pi -= lr * (*mi / bc1) / ((*vi / bc2).sqrt() + eps);
        }
    }
}
