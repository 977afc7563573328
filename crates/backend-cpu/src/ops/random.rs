//! The counter-based random fill.

use crate::storage::Dst;
use crate::walk::Walk;
use hal::random::{random_value, random_value_f64};
use hal::{DType, Distribution, Layout};

pub(crate) fn random(out: Dst, l: &Layout, dist: Distribution, seed: u64, offset: u64) {
    let walk = Walk::new(&l.shape, [l]);
    if out.dtype == DType::F64 {
        walk.par_runs(|lin, [o], [s], len| {
            for j in 0..len {
                let v = random_value_f64(dist, seed, offset.wrapping_add((lin + j) as u64));
                // SAFETY: view checked by the caller; positions are disjoint.
                unsafe { out.store_f64(o + j as isize * s, v) };
            }
        });
        return;
    }
    walk.par_runs(|lin, [o], [s], len| {
        for j in 0..len {
            let v = random_value(dist, seed, offset.wrapping_add((lin + j) as u64));
            // SAFETY: view checked by the caller; positions are disjoint.
            unsafe { out.store(o + j as isize * s, v) };
        }
    });
}
