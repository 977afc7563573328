//! The annealing loop's IR kernels: Huber weights, the anchor update, the maintenance
//! check and the device-side bookkeeping of energies.

use super::state::advance;
use crate::error::Result;
use hal::DType;
use hal::ir::expr::{Expr, Scope};
use hal::ir::{Access, IrCmp, ProgramBuilder};

/// Huber weights: `w[i] = 1` where `r2[i] <= delta2`, `sqrt(delta2 / r2[i])` beyond;
/// `delta2 = params[0] * total[0]` (the squared Huber multiple over `n`, times the sum of
/// squared distances: the multiple squared times the energy).
pub(crate) fn huber_program() -> Result<hal::ir::Program> {
    let s = Scope::new("vlc_huber_weights");
    let r2 = s.buffer(DType::F32, Access::Read);
    let params = s.buffer(DType::F32, Access::Read);
    let total = s.buffer(DType::F32, Access::Read);
    let w = s.buffer(DType::F32, Access::Write);
    let i = s.index();
    let first = s.u32(0);
    let delta2 = s.load(params, first) * s.load(total, first);
    let r = s.load(r2, i);
    let shrink = (delta2 / r).sqrt();
    s.store(w, i, r.le(delta2).select(s.f32(1.0), shrink));
    Ok(s.build()?)
}

/// Anchor update over `m * d` elements (`d` baked in): with `cnt = counts[i / d]`,
/// `mean = cnt > 0 ? sums[i] / cnt : anchor[i]`, `v = momentum * v + T * (mean - anchor)`,
/// `anchor += v`; `params = [huber^2 / n, T, momentum, 0]`. Separate multiplies and adds (no fused
/// multiply-add), so every backend rounds the same way.
pub(crate) fn update_program(d: usize) -> Result<hal::ir::Program> {
    let s = Scope::new("vlc_anchor_update");
    let sums = s.buffer(DType::F32, Access::Read);
    let counts = s.buffer(DType::F32, Access::Read);
    let params = s.buffer(DType::F32, Access::Read);
    let anchors = s.buffer(DType::F32, Access::ReadWrite);
    let vel = s.buffer(DType::F32, Access::ReadWrite);
    let i = s.index();
    let (mean, a) = mean_of_members(&s, [sums, counts, anchors], i, d);
    let v = s.load(vel, i);
    let (t, momentum) = (s.load(params, s.u32(1)), s.load(params, s.u32(2)));
    let v2 = momentum * v + t * (mean - a);
    s.store(vel, i, v2);
    s.store(anchors, i, a + v2);
    Ok(s.build()?)
}

/// Whether a maintenance round can have anything to do, decided on the device so that a
/// round that would change nothing reads nothing back. Over `m * m` threads, thread `t = i m + j`
/// flags (adds 1 to `flags[0]`) when anchor `i` has no members (`i = j`, `counts[i] = 0`) or
/// when `i < j` and the squared distance between anchors `i` and `j` (in f32, `d` baked in) is
/// at most `scale * max(total[0], floor)` with `[scale, floor] = limits[0..2]`; every other
/// thread adds 0 to one of 1,024 spare slots (`flags` has 1,025), so that only flagging
/// threads contend for `flags[0]`. [`maintenance_limits`] gives `limits`, which make the test
/// conservative: whatever [`State::maintain`] would merge (squared distance below
/// `merge_distance^2 * max(total / n, f64::MIN_POSITIVE)`, summed in f64) is flagged, whatever
/// the f32 rounding. The limits are a buffer, not constants, so that one compiled program
/// serves every `n` (the unrolled distance makes its compilation cost seconds at `d` in the
/// hundreds).
pub(crate) fn maintenance_check_program(m: usize, d: usize) -> Result<hal::ir::Program> {
    let mut p = ProgramBuilder::new("vlc_maintenance_check");
    let anchors = p.buffer(DType::F32, Access::Read);
    let counts = p.buffer(DType::F32, Access::Read);
    let total = p.buffer(DType::F32, Access::Read);
    let limits = p.buffer(DType::F32, Access::Read);
    let flags = p.buffer(DType::F32, Access::ReadWrite);
    let t = p.index();
    let mm = p.const_u32(m as u32);
    let i = p.div(t, mm);
    let i_m = p.mul(i, mm);
    let j = p.sub(t, i_m);
    let dd = p.const_u32(d as u32);
    let row_i = p.mul(i, dd);
    let row_j = p.mul(j, dd);
    let mut d2 = p.const_f32(0.0);
    for k in 0..d {
        let k = p.const_u32(k as u32);
        let at_i = p.add(row_i, k);
        let at_j = p.add(row_j, k);
        let a = p.load(anchors, at_i);
        let b = p.load(anchors, at_j);
        let diff = p.sub(a, b);
        d2 = p.fma(diff, diff, d2);
    }
    let zero_u = p.const_u32(0);
    let sum = p.load(total, zero_u);
    let one_u = p.const_u32(1);
    let floor = p.load(limits, one_u);
    let sum = p.binary(hal::ir::IrBinary::Max, sum, floor);
    let scale = p.load(limits, zero_u);
    let limit = p.mul(scale, sum);
    let below = p.cmp(IrCmp::Le, d2, limit);
    let later = p.cmp(IrCmp::Lt, i, j);
    let close = p.binary(hal::ir::IrBinary::And, later, below);
    let cnt = p.load(counts, i);
    let zero = p.const_f32(0.0);
    let none = p.cmp(IrCmp::Eq, cnt, zero);
    let same = p.cmp(IrCmp::Eq, i, j);
    let empty = p.binary(hal::ir::IrBinary::And, same, none);
    let flagged = p.binary(hal::ir::IrBinary::Or, close, empty);
    let one = p.const_f32(1.0);
    let value = p.select(flagged, one, zero);
    let spread = p.const_u32(1023);
    let spare = p.binary(hal::ir::IrBinary::And, t, spread);
    let spare = p.add(spare, one_u);
    let at = p.select(flagged, zero_u, spare);
    p.atomic_add(flags, at, value);
    Ok(p.build()?)
}

/// `[scale, floor]` of [`maintenance_check_program`] for `n` points: `scale =
/// merge_distance^2 / n * (1 + 2^-8)`, `floor = n * f32::MIN_POSITIVE`.
pub(crate) fn maintenance_limits(n: usize, merge_distance: f32) -> [f32; 2] {
    let merge = merge_distance as f64;
    let scale = (merge * merge / n as f64 * (1.0 + 2f64.powi(-8))) as f32;
    [scale, n as f32 * f32::MIN_POSITIVE]
}

/// Anchors up to which a GPU decides on the device whether a maintenance round has work
/// (its check runs over `m * m` pairs).
pub(crate) const DEVICE_CHECK_ANCHORS: usize = 4096;

/// IR for element `i` of an `m x width` centre matrix: `(mean, old)` where `old` is the
/// centre's current value and `mean` is `sums[i] / counts[i / width]`, or `old` for a centre
/// with no weight. Buffers: `[sums, counts, centres]`.
pub(crate) fn mean_of_members<'s>(
    s: &'s Scope,
    [sums, counts, centres]: [hal::ir::BufferId; 3],
    i: Expr<'s>,
    width: usize,
) -> (Expr<'s>, Expr<'s>) {
    let cnt = s.load(counts, i / s.u32(width as u32));
    let old = s.load(centres, i);
    let mean = s.load(sums, i) / cnt;
    (cnt.gt(s.f32(0.0)).select(mean, old), old)
}

/// `params[k] = schedule[4 step[0] + k]` for `k < 4`, then `step[0] += 1` (one thread).
pub(crate) fn take_row_program() -> Result<hal::ir::Program> {
    let mut p = ProgramBuilder::new("vlc_take_schedule_row");
    let schedule = p.buffer(DType::F32, Access::Read);
    let step = p.buffer(DType::U32, Access::ReadWrite);
    let params = p.buffer(DType::F32, Access::Write);
    let zero = p.const_u32(0);
    let s = p.load(step, zero);
    let four = p.const_u32(4);
    let base = p.mul(s, four);
    for k in 0..4u32 {
        let kk = p.const_u32(k);
        let at = p.add(base, kk);
        let v = p.load(schedule, at);
        p.store(params, kk, v);
    }
    advance(&mut p, step, s);
    Ok(p.build()?)
}

/// `totals[slot[0]] = total[0]`, then `slot[0] += 1` (one thread).
pub(crate) fn keep_total_program() -> Result<hal::ir::Program> {
    let mut p = ProgramBuilder::new("vlc_keep_total");
    let total = p.buffer(DType::F32, Access::Read);
    let slot = p.buffer(DType::U32, Access::ReadWrite);
    let totals = p.buffer(DType::F32, Access::Write);
    let zero = p.const_u32(0);
    let at = p.load(slot, zero);
    let t = p.load(total, zero);
    p.store(totals, at, t);
    advance(&mut p, slot, at);
    Ok(p.build()?)
}
