//! The iterative Schur engine's IR kernels: `S p` without forming `S` (through `J` and the
//! `W_i`), the block-Jacobi preconditioner (its blocks formed, inverted, applied), and the
//! conjugate-gradient updates, whose scalars stay on the device.

// The unrolled matrix algebra reads clearest with its indices written out.
#![allow(clippy::needless_range_loop)]

use super::super::kernel::Kernel;
use super::kernels::{Layout, c, dot, free_cols, meta, minv_block, spd_inverse, w_block};
use crate::Precision;
use hal::Result;
use hal::ir::expr::Expr;
use hal::ir::{BufferId, Program};

/// Slots of the conjugate gradients' scalar buffer.
pub(super) mod slot {
    pub const RZ: u32 = 0;
    pub const PQ: u32 = 1;
    pub const ALPHA: u32 = 2;
    pub const RZ_NEW: u32 = 3;
    pub const BETA: u32 = 4;
    pub const LEN: usize = 5;
}

/// One instance's Jacobian, by column (`column[col][row]`), at entry `meta[NNZ0] + i r p`.
fn instance_columns<'s>(
    k: &'s Kernel,
    meta_buf: BufferId,
    jac: BufferId,
    i: Expr<'s>,
    l: &Layout,
) -> Vec<Vec<Expr<'s>>> {
    let s = &k.s;
    let base = s.load(meta_buf, s.u32(meta::NNZ0)) + i * c(k, l.r * l.p);
    (0..l.p)
        .map(|col| {
            (0..l.r)
                .map(|row| s.load(jac, base + c(k, row * l.p + col)))
                .collect()
        })
        .collect()
}

/// Per eliminated block: `z_e = M_e^-1 t_e`. Buffers: `minv`, `t`, `z`.
pub(super) fn minv_apply(precision: Precision, m: usize) -> Result<Program> {
    let k = Kernel::new("schur_minv_apply", precision);
    let s = &k.s;
    let (minv, t, z) = (k.read(), k.read(), k.write());
    let e = s.index();
    let tv: Vec<Expr> = (0..m).map(|j| s.load(t, e * c(&k, m) + c(&k, j))).collect();
    for a in 0..m {
        let row: Vec<Expr> = (0..m)
            .map(|b| s.load(minv, e * c(&k, m * m) + c(&k, a * m + b)))
            .collect();
        s.store(z, e * c(&k, m) + c(&k, a), dot(&row, &tv));
    }
    k.s.build()
}

/// Per reduced column `i`: `q_i = lambda D p_i` (the damping's part of `S p`). Buffers:
/// `rmap`, `dd`, `lambda`, `p`, `q`.
pub(super) fn damp_apply(precision: Precision) -> Result<Program> {
    let k = Kernel::new("schur_damp_apply", precision);
    let s = &k.s;
    let (rmap, dd, lam, p) = (k.indices(), k.read(), k.read(), k.read());
    let q = k.write();
    let i = s.index();
    let lambda = s.load(lam, s.u32(0));
    let d = s.load(dd, s.load(rmap, i));
    s.store(q, i, lambda * d * s.load(p, i));
    k.s.build()
}

/// Per instance: `q += J_i' J_i p - W_i z_e` on its reduced columns (`z_e = M_e^-1 W' p`
/// summed over the block's instances). Buffers: `meta`, `jacobian`, `rcol`, `p`, `q`, and where
/// the shape reads a block `block`, `w`, `z`.
pub(super) fn schur_apply(precision: Precision, l: &Layout) -> Result<Program> {
    let k = Kernel::new("schur_apply", precision);
    let s = &k.s;
    let (meta_buf, jac, rcol, p) = (k.indices(), k.read(), k.indices(), k.read());
    let q = k.read_write();
    let (m, nr) = (l.eliminated.len(), l.reduced.len());
    if nr == 0 {
        return k.s.build();
    }
    let i = s.index();
    let column = instance_columns(&k, meta_buf, jac, i, l);
    let zero = k.float(0.0);
    let free = free_cols(&k, rcol, i, nr);
    let (valid, at) = (&free.valid, &free.safe);
    let pv: Vec<Expr> = (0..nr)
        .map(|a| valid[a].select(s.load(p, at[a]), zero))
        .collect();
    // J_c p per row, then J_c' of that.
    let rows: Vec<Expr> = (0..l.r)
        .map(|row| {
            let js: Vec<Expr> = l.reduced.iter().map(|&pos| column[pos][row]).collect();
            dot(&js, &pv)
        })
        .collect();
    let mut out: Vec<Expr> = (0..nr).map(|a| dot(&column[l.reduced[a]], &rows)).collect();
    if m > 0 {
        let (block, w, z) = (k.indices(), k.read(), k.read());
        let e = s.load(block, i);
        let wb = i * c(&k, nr * m);
        let ze: Vec<Expr> = (0..m).map(|j| s.load(z, e * c(&k, m) + c(&k, j))).collect();
        for a in 0..nr {
            let wa: Vec<Expr> = (0..m).map(|j| s.load(w, wb + c(&k, a * m + j))).collect();
            out[a] = out[a] - dot(&wa, &ze);
        }
    }
    for a in 0..nr {
        s.atomic_add(q, at[a], valid[a].select(out[a], zero));
    }
    k.s.build()
}

/// Per instance: its share of `S`'s diagonal blocks, `J_i' J_i - W_i M_e^-1 W_i'` over each
/// pair of its reduced columns that fall in one preconditioner block, added into that block
/// (`bs x bs`, both triangles). Buffers: `meta`, `jacobian`, `rcol`, `pblock`, `plocal`, `pmat`,
/// and where the shape reads a block `block`, `w`, `minv`.
pub(super) fn precond_add(precision: Precision, l: &Layout, bs: usize) -> Result<Program> {
    let k = Kernel::new("schur_precond_add", precision);
    let s = &k.s;
    let (meta_buf, jac, rcol) = (k.indices(), k.read(), k.indices());
    let (pblock, plocal, pmat) = (k.indices(), k.indices(), k.read_write());
    let (m, nr) = (l.eliminated.len(), l.reduced.len());
    if nr == 0 {
        return k.s.build();
    }
    let i = s.index();
    let column = instance_columns(&k, meta_buf, jac, i, l);
    let zero = k.float(0.0);
    let free = free_cols(&k, rcol, i, nr);
    let (valid, safe) = (&free.valid, &free.safe);
    let blk: Vec<Expr> = safe.iter().map(|&ca| s.load(pblock, ca)).collect();
    let loc: Vec<Expr> = safe.iter().map(|&ca| s.load(plocal, ca)).collect();
    let h = if m > 0 {
        let (block, w, minv) = (k.indices(), k.read(), k.read());
        let e = s.load(block, i);
        let (wi, mi) = (w_block(&k, w, i, nr, m), minv_block(&k, minv, e, m));
        let h: Vec<Vec<Expr>> = (0..nr)
            .map(|a| {
                (0..m)
                    .map(|q| dot(&wi[a], &(0..m).map(|j| mi[j][q]).collect::<Vec<_>>()))
                    .collect()
            })
            .collect();
        Some((h, wi))
    } else {
        None
    };
    for a in 0..nr {
        for b in 0..nr {
            let mut value = dot(&column[l.reduced[a]], &column[l.reduced[b]]);
            if let Some((h, wi)) = &h {
                value = value - dot(&h[a], &wi[b]);
            }
            let same = valid[a] & valid[b] & blk[a].eq(blk[b]);
            let at = blk[a] * c(&k, bs * bs) + loc[a] * c(&k, bs) + loc[b];
            s.atomic_add(pmat, same.select(at, c(&k, 0)), same.select(value, zero));
        }
    }
    k.s.build()
}

/// Per preconditioner block: `(P + lambda D)^-1`, padded to `bs x bs` with the identity past
/// the block's size; where a pivot is not positive it stores 1 at `rhs[n]`, the failure flag.
/// Buffers: `meta`, `pstart`, `psize`, `rmap`, `dd`, `lambda`, `pmat`, `pinv`, `rhs`.
pub(super) fn precond_invert(precision: Precision, bs: usize) -> Result<Program> {
    let k = Kernel::new("schur_precond_invert", precision);
    let s = &k.s;
    let (meta_buf, pstart, psize, rmap) = (k.indices(), k.indices(), k.indices(), k.indices());
    let (dd, lam, pmat) = (k.read(), k.read(), k.read());
    let (pinv, rhs) = (k.write(), k.write());
    let blk = s.index();
    let n = s.load(meta_buf, s.u32(meta::REDUCED));
    let (start, size) = (s.load(pstart, blk), s.load(psize, blk));
    let lambda = s.load(lam, s.u32(0));
    let base = blk * c(&k, bs * bs);
    let (zero, one) = (k.float(0.0), k.float(1.0));
    let last = n - c(&k, 1);
    let entry = |a: usize, b: usize| {
        let inside = c(&k, a).lt(size) & c(&k, b).lt(size);
        let value = s.load(pmat, base + c(&k, a * bs + b));
        if a == b {
            let col = s.load(rmap, (start + c(&k, a)).min(last));
            inside.select(lambda.fma(s.load(dd, col), value), one)
        } else {
            inside.select(value, zero)
        }
    };
    let (inv, ok) = spd_inverse(&k, bs, entry);
    for a in 0..bs {
        for b in 0..bs {
            s.store(pinv, base + c(&k, a * bs + b), inv[a][b]);
        }
    }
    s.store_if(!ok, rhs, n, one);
    k.s.build()
}

/// Per reduced column `i` (local `plocal[i]` of block `pblock[i]`): `z_i = (P^-1 r)_i`.
/// Buffers: `meta`, `pblock`, `plocal`, `pstart`, `psize`, `pinv`, `r`, `z`.
pub(super) fn precond_apply(precision: Precision, bs: usize) -> Result<Program> {
    let k = Kernel::new("schur_precond_apply", precision);
    let s = &k.s;
    let (meta_buf, pblock, plocal, pstart, psize) = (
        k.indices(),
        k.indices(),
        k.indices(),
        k.indices(),
        k.indices(),
    );
    let (pinv, r, z) = (k.read(), k.read(), k.write());
    let i = s.index();
    let n = s.load(meta_buf, s.u32(meta::REDUCED));
    let blk = s.load(pblock, i);
    let (start, size) = (s.load(pstart, blk), s.load(psize, blk));
    let row = blk * c(&k, bs * bs) + s.load(plocal, i) * c(&k, bs);
    let last = n - c(&k, 1);
    let zero = k.float(0.0);
    let mut acc = zero;
    for j in 0..bs {
        let inside = c(&k, j).lt(size);
        let rv = s.load(r, (start + c(&k, j)).min(last));
        let term = s.load(pinv, row + c(&k, j)) * inside.select(rv, zero);
        acc = if j == 0 { term } else { acc + term };
    }
    s.store(z, i, acc);
    k.s.build()
}

/// `scal[ALPHA] = rz / pq` (0 unless `pq > 0`), one thread. Buffers: `scalars`.
pub(super) fn alpha(precision: Precision) -> Result<Program> {
    let k = Kernel::new("schur_pcg_alpha", precision);
    let scal = k.read_write();
    let ratio = k.safe_ratio(scal, slot::RZ, slot::PQ);
    k.s.store(scal, k.s.u32(slot::ALPHA), ratio);
    k.s.build()
}

/// `scal[BETA] = rz_new / rz; scal[RZ] = rz_new`, one thread. Buffers: `scalars`.
pub(super) fn beta(precision: Precision) -> Result<Program> {
    let k = Kernel::new("schur_pcg_beta", precision);
    let s = &k.s;
    let scal = k.read_write();
    s.store(
        scal,
        s.u32(slot::BETA),
        k.safe_ratio(scal, slot::RZ_NEW, slot::RZ),
    );
    let rz_new = s.load(scal, s.u32(slot::RZ_NEW));
    s.store(scal, s.u32(slot::RZ), rz_new);
    k.s.build()
}

/// `x += alpha p; r -= alpha q`. Buffers: `scalars`, `p`, `q`, `x`, `r`.
pub(super) fn update(precision: Precision) -> Result<Program> {
    let k = Kernel::new("schur_pcg_update", precision);
    let s = &k.s;
    let (scal, p, q) = (k.read(), k.read(), k.read());
    let (x, r) = (k.read_write(), k.read_write());
    let i = s.index();
    let alpha = s.load(scal, s.u32(slot::ALPHA));
    s.store(x, i, alpha.fma(s.load(p, i), s.load(x, i)));
    s.store(r, i, (-alpha).fma(s.load(q, i), s.load(r, i)));
    k.s.build()
}

/// `p = z + beta p`. Buffers: `scalars`, `z`, `p`.
pub(super) fn direction(precision: Precision) -> Result<Program> {
    let k = Kernel::new("schur_pcg_direction", precision);
    let s = &k.s;
    let (scal, z, p) = (k.read(), k.read(), k.read_write());
    let i = s.index();
    let beta = s.load(scal, s.u32(slot::BETA));
    s.store(p, i, beta.fma(s.load(p, i), s.load(z, i)));
    k.s.build()
}
