//! Fused optimiser steps and the counter-based random fill.

use crate::storage::Dst;
use crate::walk::{CHUNK, Walk};
use hal::{AdamParams, Distribution, Layout, SgdParams, random::random_value};
use rayon::prelude::*;

/// A raw `f32` slice shared by threads that touch disjoint ranges of it.
#[derive(Clone, Copy)]
pub(crate) struct Shared(pub *mut f32);
unsafe impl Send for Shared {}
unsafe impl Sync for Shared {}

impl Shared {
    /// Element `i`'s address. (A method, so closures capture the whole `Send` wrapper.)
    #[inline(always)]
    pub unsafe fn at(self, i: usize) -> *mut f32 {
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
    par_ranges(n, |r| {
        for i in r {
            // SAFETY: lengths checked by the caller; ranges are disjoint.
            unsafe {
                let (pi, mi, vi) = (p.at(i), m.at(i), v.at(i));
                let mut gi = *g.at(i);
                if h.decoupled_weight_decay {
                    *pi *= 1.0 - h.lr * h.weight_decay;
                } else {
                    gi += h.weight_decay * *pi;
                }
                *mi = h.beta1 * *mi + (1.0 - h.beta1) * gi;
                *vi = h.beta2 * *vi + (1.0 - h.beta2) * gi * gi;
                let mhat = *mi / bc1;
                let vhat = *vi / bc2;
                *pi -= h.lr * mhat / (vhat.sqrt() + h.eps);
            }
        }
    });
}

pub(crate) fn random(out: Dst, l: &Layout, dist: Distribution, seed: u64, offset: u64) {
    let walk = Walk::new(&l.shape, [l]);
    walk.par_runs(|lin, [o], [s], len| {
        for j in 0..len {
            let v = random_value(dist, seed, offset.wrapping_add((lin + j) as u64));
            // SAFETY: view checked by the caller; positions are disjoint.
            unsafe { out.store(o + j as isize * s, v) };
        }
    });
}
