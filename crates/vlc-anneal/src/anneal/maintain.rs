//! Maintenance on the host: merging close anchors, splitting along the principal
//! direction, re-seeding empty ones.

use super::Config;
use super::state::State;
use crate::error::Result;
use crate::vectors::MatrixRef;
use hal::{Backend, BackendExt, Layout, View};

/// Merges, for each live anchor in index order, its nearest later live anchor closer than
/// `merge2` (squared; the lower index on ties) into it, count-weighted; the merged one is
/// marked gone and freed. Returns the number of merges.
///
/// Only anchors whose coordinate `axis` lies within the merge radius can be within it (a
/// squared distance summed in f64 is at least each of its terms), so each anchor's search
/// scans its neighbours in that coordinate's sorted order: the pairs of comparing every two,
/// without the O(m^2 d) cost. An anchor changes only after its own search, when it can no
/// longer be a candidate (candidates come later), so the order stays valid.
pub(crate) fn merge_close(
    anchors: &mut [f32],
    d: usize,
    counts: &mut [f32],
    sse: &mut [f64],
    gone: &mut [bool],
    free: &mut Vec<usize>,
    merge2: f64,
) -> usize {
    let m = counts.len();
    let axis = widest_coordinate(anchors, d, gone);
    let keys: Vec<f64> = (0..m).map(|j| anchors[j * d + axis] as f64).collect();
    let mut order: Vec<usize> = (0..m).filter(|&j| !gone[j]).collect();
    order.sort_by(|&a, &b| keys[a].total_cmp(&keys[b]).then(a.cmp(&b)));
    let mut position = vec![0; m];
    for (p, &j) in order.iter().enumerate() {
        position[j] = p;
    }
    let mut merged = 0;
    for i in 0..m {
        if gone[i] {
            continue;
        }
        let within = |j: &&usize| (keys[**j] - keys[i]) * (keys[**j] - keys[i]) < merge2;
        let below = order[..position[i]].iter().rev().take_while(within);
        let above = order[position[i] + 1..].iter().take_while(within);
        let ai = &anchors[i * d..(i + 1) * d];
        let mut best: Option<(usize, f64)> = None;
        for &j in below.chain(above) {
            if j <= i || gone[j] {
                continue;
            }
            let Some(dj) = sq_dist_below(ai, &anchors[j * d..(j + 1) * d], merge2) else {
                continue;
            };
            let better = best.is_none_or(|(bj, bd)| dj < bd || (dj == bd && j < bj));
            if better {
                best = Some((j, dj));
            }
        }
        if let Some((j, _)) = best {
            let (ci, cj) = (counts[i] as f64, counts[j] as f64);
            for k in 0..d {
                let v =
                    (anchors[i * d + k] as f64 * ci + anchors[j * d + k] as f64 * cj) / (ci + cj);
                anchors[i * d + k] = v as f32;
            }
            counts[i] += counts[j];
            sse[i] += sse[j];
            counts[j] = 0.0;
            gone[j] = true;
            free.push(j);
            merged += 1;
        }
    }
    merged
}

/// The coordinate along which the live anchors spread most (the first on ties).
pub(crate) fn widest_coordinate(anchors: &[f32], d: usize, gone: &[bool]) -> usize {
    let mut lo = vec![f32::INFINITY; d];
    let mut hi = vec![f32::NEG_INFINITY; d];
    for (row, _) in anchors.chunks_exact(d).zip(gone).filter(|(_, g)| !**g) {
        for k in 0..d {
            lo[k] = lo[k].min(row[k]);
            hi[k] = hi[k].max(row[k]);
        }
    }
    (0..d).fold(0, |best, k| {
        if (hi[k] as f64 - lo[k] as f64) > (hi[best] as f64 - lo[best] as f64) {
            k
        } else {
            best
        }
    })
}

/// The squared distance of `a` and `b` (summed in f64, in coordinate order) when it is below
/// `limit`; `None` as soon as a partial sum reaches it. Anchors to be merged are rare and most
/// pairs pass the limit within a few coordinates, so a round's merge search stays short even
/// when the sorted sweep finds nearly every pair within its band (high `d`).
pub(crate) fn sq_dist_below(a: &[f32], b: &[f32], limit: f64) -> Option<f64> {
    let mut sum = 0.0;
    for (ca, cb) in a.chunks(8).zip(b.chunks(8)) {
        for (&x, &y) in ca.iter().zip(cb) {
            let t = x as f64 - y as f64;
            sum += t * t;
        }
        if sum >= limit {
            return None;
        }
    }
    Some(sum)
}

#[cfg(test)]
pub(crate) fn sq_dist(a: &[f32], b: &[f32]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(&x, &y)| {
            let t = x as f64 - y as f64;
            t * t
        })
        .sum()
}

/// The unit principal direction of `members` around `center` (power iteration, a fixed seeded
/// start, 8 rounds, in float64) and the standard deviation of the members along it. At most
/// 64 members take part (every k-th, in order): a direction to split along needs no more, the
/// updates that follow place the two halves, and a round of maintenance may split dozens of
/// anchors. Their offsets from the centre
/// are gathered once, and each projection summed in four interleaved running sums (a fixed
/// order), which keeps the rounds from waiting on one chain of dependent adds.
pub(crate) fn principal_direction(
    data: MatrixRef<'_>,
    members: &[u32],
    center: &[f32],
    seed: u64,
) -> (Vec<f64>, f64) {
    let d = center.len();
    let mut v: Vec<f64> = (0..d)
        .map(|k| {
            let h = crate::splitmix(seed ^ (k as u64).wrapping_mul(0x9e37_79b9));
            (h >> 11) as f64 / (1u64 << 53) as f64 - 0.5
        })
        .collect();
    let norm = |v: &mut Vec<f64>| {
        let n = v.iter().map(|x| x * x).sum::<f64>().sqrt();
        if n > 0.0 {
            v.iter_mut().for_each(|x| *x /= n);
        }
        n
    };
    norm(&mut v);
    let members: Vec<u32> = members
        .iter()
        .copied()
        .step_by(members.len().div_ceil(64).max(1))
        .collect();
    let offsets: Vec<f64> = members
        .iter()
        .flat_map(|&i| {
            data.row(i as usize)
                .iter()
                .zip(center)
                .map(|(&x, &c)| x as f64 - c as f64)
        })
        .collect();
    let mut lambda = 0.0;
    for _ in 0..8 {
        let mut next = vec![0f64; d];
        for row in offsets.chunks_exact(d) {
            let mut lanes = [0f64; 4];
            for (r, w) in row.chunks(4).zip(v.chunks(4)) {
                for ((lane, &a), &b) in lanes.iter_mut().zip(r).zip(w) {
                    *lane += a * b;
                }
            }
            let proj = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
            for (nk, &a) in next.iter_mut().zip(row) {
                *nk += proj * a;
            }
        }
        lambda = norm(&mut next);
        if lambda == 0.0 {
            break;
        }
        v = next;
    }
    (v, (lambda / members.len().max(1) as f64).sqrt())
}

impl<B: Backend> State<'_, B> {
    /// On a GPU, enqueues the check whether a maintenance round on the current assignment and
    /// anchors has work (its verdict comes back with the next energies); false where there is
    /// no check (the round then always reads the state back).
    pub(crate) fn check_maintenance(&self) -> Result<bool> {
        let Some((kernel, flags, limits)) = &self.check else {
            return Ok(false);
        };
        let b = &self.b;
        let one = Layout::contiguous(&[1]);
        b.fill(View::new(flags, &one), 0.0)?;
        b.launch(
            kernel,
            &[
                &self.pass.anchors,
                &self.pass.counts,
                &self.pass.total,
                limits,
                flags,
            ],
            self.pass.m * self.pass.m,
        )?;
        let verdict = Layout {
            shape: vec![1],
            strides: vec![1],
            offset: self.verdict_slot,
        };
        b.copy(
            View::new(flags, &one),
            View::new(&self.pass.totals, &verdict),
        )?;
        Ok(true)
    }

    /// One maintenance round on the read-back assignment (see the module docs). Returns
    /// (merged, split, re-seeded) counts.
    pub(crate) fn maintain(
        &mut self,
        data: MatrixRef<'_>,
        cfg: &Config,
        energy: f64,
    ) -> Result<(usize, usize, usize)> {
        let (d, m) = (self.pass.d, self.pass.m);
        let b = &self.b;
        let mut anchors = b.read::<f32>(&self.pass.anchors)?;
        let mut counts = b.read::<f32>(&self.pass.counts)?;
        let mut sse: Vec<f64> = b
            .read::<f32>(&self.pass.sse)?
            .iter()
            .map(|&v| v as f64)
            .collect();
        let rms2 = energy.max(f64::MIN_POSITIVE);
        let merge2 = (cfg.merge_distance as f64).powi(2) * rms2;
        let mut free: Vec<usize> = (0..m).filter(|&j| counts[j] == 0.0).collect();
        // Merges: for each anchor in order, its nearest later anchor if within the threshold.
        let mut merged = 0;
        let mut gone = vec![false; m];
        for &j in &free {
            gone[j] = true;
        }
        if merge2 > 0.0 && m > 1 {
            merged = merge_close(
                &mut anchors,
                d,
                &mut counts,
                &mut sse,
                &mut gone,
                &mut free,
                merge2,
            );
        }
        if free.is_empty() {
            return Ok((0, 0, 0));
        }
        // The per-point state, needed only now that there are slots to fill.
        let assign = b.read::<u32>(&self.pass.assign)?;
        let dist = b.read::<f32>(&self.pass.dist)?;
        // Members of each anchor (ascending point order).
        let mut members: Vec<Vec<u32>> = vec![Vec::new(); m];
        for (i, &a) in assign.iter().enumerate() {
            members[a as usize].push(i as u32);
        }
        let mean_sse = sse.iter().sum::<f64>() / (m - free.len()).max(1) as f64;
        let mut candidates: Vec<usize> = (0..m)
            .filter(|&j| !gone[j] && members[j].len() >= 2)
            .filter(|&j| sse[j] > cfg.split_factor as f64 * mean_sse)
            .collect();
        candidates.sort_by(|&a, &b| sse[b].total_cmp(&sse[a]).then(a.cmp(&b)));
        let mut split = 0;
        let mut reseeded = 0;
        let mut taken = vec![false; data.rows];
        // Farthest points first, for re-seeding (sorted when first needed).
        let mut far: Vec<u32> = Vec::new();
        let mut far_at = 0;
        for (slot_index, &slot) in free.iter().enumerate() {
            if let Some(&j) = candidates.get(slot_index) {
                let (dir, sigma) =
                    principal_direction(data, &members[j], &anchors[j * d..(j + 1) * d], cfg.seed);
                for k in 0..d {
                    let c = anchors[j * d + k];
                    let off = (sigma * dir[k]) as f32;
                    anchors[slot * d + k] = c + off;
                    anchors[j * d + k] = c - off;
                }
                split += 1;
            } else {
                if far.is_empty() {
                    far = (0..data.rows as u32).collect();
                    far.sort_by(|&a, &b| {
                        dist[b as usize]
                            .total_cmp(&dist[a as usize])
                            .then(a.cmp(&b))
                    });
                }
                while far_at < far.len() && taken[far[far_at] as usize] {
                    far_at += 1;
                }
                let Some(&p) = far.get(far_at) else { break };
                taken[p as usize] = true;
                anchors[slot * d..(slot + 1) * d].copy_from_slice(data.row(p as usize));
                reseeded += 1;
            }
        }
        b.write(&self.pass.anchors, &anchors)?;
        // Momentum restarts after anchors moved by hand.
        b.fill(
            View::new(&self.pass.velocity, &Layout::contiguous(&[m * d])),
            0.0,
        )?;
        Ok((merged, split, reseeded))
    }
}
