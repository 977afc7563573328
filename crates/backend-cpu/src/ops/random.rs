//! The counter-based random fill.

use crate::storage::Dst;
use crate::walk::Walk;
use hal::{Distribution, Layout, random::random_value};

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
