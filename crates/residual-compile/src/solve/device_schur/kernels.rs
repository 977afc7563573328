//! The device Schur engine's IR kernels. Those over a residual shape's instances are
//! generated for its layout ([`Layout`]) and unrolled over its rows and columns (the IR has no
//! loops); those over eliminated blocks are unrolled over the block size.
//!
//! Every kernel reads its problem offsets from a small `U32` buffer ([`meta`]) rather than
//! holding them as constants, so one compiled program serves every problem of the same
//! layout. The Schur complement `S` is dense, column-major, lower triangle only (`S[col * n +
//! row]`, `row >= col`), as the host factorisation reads it.

// The unrolled matrix algebra reads clearest with its indices written out.
#![allow(clippy::needless_range_loop)]

use super::super::kernel::Kernel;
use crate::Precision;
use hal::Result;
use hal::ir::Program;
use hal::ir::expr::Expr;

/// Slots of a kernel's `meta` buffer.
pub(super) mod meta {
    /// The group's first Jacobian entry.
    pub const NNZ0: u32 = 0;
    /// The reduced system's size (the leading dimension of `S`).
    pub const REDUCED: u32 = 1;
    /// The column of the first eliminated parameter.
    pub const FIRST_COL: u32 = 2;
    pub const LEN: usize = 3;
}

/// A reduced column index that stands for a fixed column: its entries are dropped.
pub(super) const FIXED: u32 = u32::MAX;

/// Where one residual shape's Jacobian columns go: each instance has `r` rows of `p` entries;
/// `reduced` lists the positions (in `0..p`) of its reduced (or fixed) columns, `eliminated`
/// the positions of its eliminated block's columns in block order (empty when the shape reads
/// none).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Layout {
    pub p: usize,
    pub r: usize,
    pub reduced: Vec<usize>,
    pub eliminated: Vec<usize>,
}

pub(super) fn c(k: &Kernel, v: usize) -> Expr<'_> {
    k.s.u32(v as u32)
}

/// For reduced columns `ca` and `cb`: whether both are free, and the index of their entry in
/// `S`'s lower triangle (0 when one is fixed: the caller adds 0 there).
fn lower_entry<'s>(k: &'s Kernel, ca: Expr<'s>, cb: Expr<'s>, n: Expr<'s>) -> (Expr<'s>, Expr<'s>) {
    let fixed = c(k, FIXED as usize);
    let valid = ca.ne(fixed) & cb.ne(fixed);
    let at = ca.min(cb) * n + ca.max(cb);
    (valid, valid.select(at, c(k, 0)))
}

/// One instance's reduced column indices (`rcol[i * nr + a]`).
pub(super) fn reduced_cols<'s>(
    k: &'s Kernel,
    rcol: hal::ir::BufferId,
    i: Expr<'s>,
    nr: usize,
) -> Vec<Expr<'s>> {
    (0..nr)
        .map(|a| k.s.load(rcol, i * c(k, nr) + c(k, a)))
        .collect()
}

/// One instance's reduced columns (`rcol[i * nr + a]`), whether each is free (not
/// [`FIXED`]), and an index safe to load at (0 for a fixed one).
pub(super) struct FreeCols<'s> {
    pub cols: Vec<Expr<'s>>,
    pub valid: Vec<Expr<'s>>,
    pub safe: Vec<Expr<'s>>,
}

pub(super) fn free_cols<'s>(
    k: &'s Kernel,
    rcol: hal::ir::BufferId,
    i: Expr<'s>,
    nr: usize,
) -> FreeCols<'s> {
    let cols = reduced_cols(k, rcol, i, nr);
    let fixed = c(k, FIXED as usize);
    let valid: Vec<Expr> = cols.iter().map(|&ca| ca.ne(fixed)).collect();
    let safe = cols
        .iter()
        .zip(&valid)
        .map(|(&ca, &v)| v.select(ca, c(k, 0)))
        .collect();
    FreeCols { cols, valid, safe }
}

/// One instance's `W_i = J_reduced' J_eliminated` (`nr x m`, row-major at `i * nr * m`).
pub(super) fn w_block<'s>(
    k: &'s Kernel,
    w: hal::ir::BufferId,
    i: Expr<'s>,
    nr: usize,
    m: usize,
) -> Vec<Vec<Expr<'s>>> {
    let base = i * c(k, nr * m);
    (0..nr)
        .map(|a| {
            (0..m)
                .map(|j| k.s.load(w, base + c(k, a * m + j)))
                .collect()
        })
        .collect()
}

/// Block `e`'s `(V + lambda D)^-1` (`m x m`).
pub(super) fn minv_block<'s>(
    k: &'s Kernel,
    minv: hal::ir::BufferId,
    e: Expr<'s>,
    m: usize,
) -> Vec<Vec<Expr<'s>>> {
    let base = e * c(k, m * m);
    (0..m)
        .map(|a| {
            (0..m)
                .map(|b| k.s.load(minv, base + c(k, a * m + b)))
                .collect()
        })
        .collect()
}

/// `sum_j a[j] b[j]`, fused.
pub(super) fn dot<'s>(a: &[Expr<'s>], b: &[Expr<'s>]) -> Expr<'s> {
    let mut acc = a[0] * b[0];
    for (x, y) in a.iter().zip(b).skip(1) {
        acc = x.fma(*y, acc);
    }
    acc
}

/// Per instance (one thread each): with `dense`, its Gram matrix's reduced part added into
/// `U` (lower triangle of `S`'s shape); its eliminated part into its block of `V` (`m x m`,
/// both triangles), and `W_i` stored. Buffers: `meta`, `jacobian`, `rcol`, `u` (with
/// `dense`), and where the shape reads an eliminated block `block`, `v`, `w`.
pub(super) fn gram(precision: Precision, l: &Layout, dense: bool) -> Result<Program> {
    let k = Kernel::new("schur_gram", precision);
    let s = &k.s;
    let (meta_buf, jac, rcol) = (k.indices(), k.read(), k.indices());
    let u = dense.then(|| k.read_write());
    let m = l.eliminated.len();
    let nr = l.reduced.len();
    let i = s.index();
    let n = s.load(meta_buf, s.u32(meta::REDUCED));
    let base = s.load(meta_buf, s.u32(meta::NNZ0)) + i * c(&k, l.r * l.p);
    // Column `col` of the instance's rows.
    let column: Vec<Vec<Expr>> = (0..l.p)
        .map(|col| {
            (0..l.r)
                .map(|row| s.load(jac, base + c(&k, row * l.p + col)))
                .collect()
        })
        .collect();
    let cols = reduced_cols(&k, rcol, i, nr);
    let zero = k.float(0.0);
    for a in (0..nr).filter(|_| dense) {
        for b in a..nr {
            let value = dot(&column[l.reduced[a]], &column[l.reduced[b]]);
            let (ca, cb) = (cols[a], cols[b]);
            // Two positions on one column: both orders land on the one diagonal entry.
            let value = if a == b {
                value
            } else {
                ca.eq(cb).select(value * 2.0, value)
            };
            let (valid, at) = lower_entry(&k, ca, cb, n);
            let u = u.expect("dense");
            s.atomic_add(u, at, valid.select(value, zero));
        }
    }
    if m > 0 {
        let (block, v, w) = (k.indices(), k.read_write(), k.write());
        let e = s.load(block, i);
        let vb = e * c(&k, m * m);
        for a in 0..m {
            for b in a..m {
                let value = dot(&column[l.eliminated[a]], &column[l.eliminated[b]]);
                s.atomic_add(v, vb + c(&k, a * m + b), value);
                if a != b {
                    s.atomic_add(v, vb + c(&k, b * m + a), value);
                }
            }
        }
        let wb = i * c(&k, nr * m);
        for a in 0..nr {
            for j in 0..m {
                let value = dot(&column[l.reduced[a]], &column[l.eliminated[j]]);
                s.store(w, wb + c(&k, a * m + j), value);
            }
        }
    }
    k.s.build()
}

/// The inverse of the symmetric `m x m` matrix whose entries `entry(a, b)` gives (lower
/// triangle read, `a >= b`), by an unrolled Cholesky factorisation `L L'`, and whether every
/// pivot was positive (where one is not, 1 stands in for it, so what follows stays finite and
/// is discarded by the caller).
pub(super) fn spd_inverse<'s>(
    k: &'s Kernel,
    m: usize,
    entry: impl Fn(usize, usize) -> Expr<'s>,
) -> (Vec<Vec<Expr<'s>>>, Expr<'s>) {
    let s = &k.s;
    let (zero, one) = (k.float(0.0), k.float(1.0));
    let mut l: Vec<Vec<Expr>> = vec![Vec::new(); m];
    let mut inv_diag = Vec::with_capacity(m);
    let mut ok = s.bool(true);
    for j in 0..m {
        let mut d = entry(j, j);
        for q in 0..j {
            d = (-l[j][q]).fma(l[j][q], d);
        }
        let good = d.gt(zero);
        ok = ok & good;
        let root = good.select(d, one).sqrt();
        let inv = one / root;
        let mut col = Vec::with_capacity(m);
        for i in j + 1..m {
            let mut x = entry(i, j);
            for q in 0..j {
                x = (-l[i][q]).fma(l[j][q], x);
            }
            col.push(x * inv);
        }
        l[j].push(root);
        for (i, x) in (j + 1..m).zip(col) {
            l[i].push(x);
        }
        inv_diag.push(inv);
    }
    // L^-1 (lower), then M^-1 = L^-T L^-1.
    let mut li: Vec<Vec<Expr>> = vec![vec![zero; m]; m];
    for j in 0..m {
        li[j][j] = inv_diag[j];
        for i in j + 1..m {
            let mut acc = l[i][j] * li[j][j];
            for q in j + 1..i {
                acc = l[i][q].fma(li[q][j], acc);
            }
            li[i][j] = -acc * inv_diag[i];
        }
    }
    let mut mi: Vec<Vec<Expr>> = vec![vec![zero; m]; m];
    for a in 0..m {
        for b in a..m {
            let from = a.max(b);
            let mut acc = li[from][a] * li[from][b];
            for q in from + 1..m {
                acc = li[q][a].fma(li[q][b], acc);
            }
            mi[a][b] = acc;
            mi[b][a] = acc;
        }
    }
    (mi, ok)
}

/// Per eliminated block (`m` columns): `(V_e + lambda D_e)^-1` by an unrolled Cholesky
/// factorisation, and `y_e = (V_e + lambda D_e)^-1 g_e`; where a pivot is not positive (or not
/// finite) it stores 1 at `rhs[n]`, the failure flag. Buffers: `meta`, `v`, `dd` (the damping
/// per column), `gradient` (per column), `lambda` (`[1]`), `minv`, `y`, `rhs`.
pub(super) fn invert(precision: Precision, m: usize) -> Result<Program> {
    let k = Kernel::new("schur_invert", precision);
    let s = &k.s;
    let (meta_buf, v, dd, gradient, lam) = (k.indices(), k.read(), k.read(), k.read(), k.read());
    let (minv, y, rhs) = (k.write(), k.write(), k.write());
    let e = s.index();
    let n = s.load(meta_buf, s.u32(meta::REDUCED));
    let first = s.load(meta_buf, s.u32(meta::FIRST_COL)) + e * c(&k, m);
    let lambda = s.load(lam, s.u32(0));
    let vb = e * c(&k, m * m);
    let entry = |a: usize, b: usize| {
        let value = s.load(v, vb + c(&k, a * m + b));
        if a == b {
            lambda.fma(s.load(dd, first + c(&k, a)), value)
        } else {
            value
        }
    };
    let (mi, ok) = spd_inverse(&k, m, entry);
    let g: Vec<Expr> = (0..m).map(|j| s.load(gradient, first + c(&k, j))).collect();
    for a in 0..m {
        for b in 0..m {
            s.store(minv, vb + c(&k, a * m + b), mi[a][b]);
        }
        s.store(y, e * c(&k, m) + c(&k, a), dot(&mi[a], &g));
    }
    s.store_if(!ok, rhs, n, k.float(1.0));
    k.s.build()
}

/// Per reduced column `i` (column `rmap[i]` of the problem): `rhs_i = -g`, with `dense` also
/// `S_ii += lambda D`; thread 0 clears the failure flag `rhs[n]`. Buffers: `meta`, `rmap`,
/// `dd`, `gradient`, `lambda`, `rhs`, `s` (with `dense`).
pub(super) fn damp(precision: Precision, dense: bool) -> Result<Program> {
    let k = Kernel::new("schur_damp", precision);
    let s = &k.s;
    let (meta_buf, rmap, dd, gradient, lam) =
        (k.indices(), k.indices(), k.read(), k.read(), k.read());
    let rhs = k.write();
    let i = s.index();
    let n = s.load(meta_buf, s.u32(meta::REDUCED));
    let col = s.load(rmap, i);
    if dense {
        let sm = k.read_write();
        let at = i * n + i;
        let lambda = s.load(lam, s.u32(0));
        s.store(sm, at, lambda.fma(s.load(dd, col), s.load(sm, at)));
    }
    s.store(rhs, i, -s.load(gradient, col));
    s.store_if(i.eq(s.u32(0)), rhs, n, k.float(0.0));
    k.s.build()
}

/// Per instance reading an eliminated block `e`: `rhs += W_i y_e`, and with `dense` `S -= W_i
/// M_e^-1 W_i'` (its own pairs of columns). Buffers: `meta`, `rcol`, `block`, `w`, `minv`,
/// `y`, `rhs`, `s` (with `dense`).
pub(super) fn eliminate(precision: Precision, l: &Layout, dense: bool) -> Result<Program> {
    let k = Kernel::new("schur_eliminate", precision);
    let s = &k.s;
    let (meta_buf, rcol, block, w, minv, y) = (
        k.indices(),
        k.indices(),
        k.indices(),
        k.read(),
        k.read(),
        k.read(),
    );
    let rhs = k.read_write();
    let sm = dense.then(|| k.read_write());
    let (m, nr) = (l.eliminated.len(), l.reduced.len());
    let i = s.index();
    let n = s.load(meta_buf, s.u32(meta::REDUCED));
    let e = s.load(block, i);
    let free = free_cols(&k, rcol, i, nr);
    let cols = &free.cols;
    let wi = w_block(&k, w, i, nr, m);
    let mi = minv_block(&k, minv, e, m);
    let ye: Vec<Expr> = (0..m).map(|j| s.load(y, e * c(&k, m) + c(&k, j))).collect();
    let zero = k.float(0.0);
    for a in 0..nr {
        let value = free.valid[a].select(dot(&wi[a], &ye), zero);
        s.atomic_add(rhs, free.safe[a], value);
    }
    let Some(sm) = sm else {
        return k.s.build();
    };
    // H = W_i M^-1.
    let h: Vec<Vec<Expr>> = (0..nr)
        .map(|a| {
            (0..m)
                .map(|q| {
                    let column: Vec<Expr> = (0..m).map(|j| mi[j][q]).collect();
                    dot(&wi[a], &column)
                })
                .collect()
        })
        .collect();
    for a in 0..nr {
        for b in a..nr {
            let t = dot(&h[a], &wi[b]);
            let (ca, cb) = (cols[a], cols[b]);
            let t = if a == b {
                t
            } else {
                ca.eq(cb).select(t * 2.0, t)
            };
            let (valid, at) = lower_entry(&k, ca, cb, n);
            s.atomic_add(sm, at, valid.select(-t, zero));
        }
    }
    k.s.build()
}

/// Per pair of distinct instances `(i1, i2)` reading one eliminated block `e`
/// (`pairs[3 q..3 q + 3]`, `i1` of shape `l1`, `i2` of `l2`): `S -= W_i1 M_e^-1 W_i2'` and its
/// transpose, in the lower triangle. Buffers: `meta`, `pairs`, `rcol1`, `rcol2`, `w1`, `w2`,
/// `minv`, `s`.
pub(super) fn cross(precision: Precision, l1: &Layout, l2: &Layout) -> Result<Program> {
    let k = Kernel::new("schur_cross", precision);
    let s = &k.s;
    let (meta_buf, pairs, rcol1, rcol2) = (k.indices(), k.indices(), k.indices(), k.indices());
    let (w1, w2, minv, sm) = (k.read(), k.read(), k.read(), k.read_write());
    let m = l1.eliminated.len();
    let (n1, n2) = (l1.reduced.len(), l2.reduced.len());
    let q = s.index();
    let n = s.load(meta_buf, s.u32(meta::REDUCED));
    let at3 = q * c(&k, 3);
    let i1 = s.load(pairs, at3);
    let i2 = s.load(pairs, at3 + c(&k, 1));
    let e = s.load(pairs, at3 + c(&k, 2));
    let (cols1, cols2) = (
        reduced_cols(&k, rcol1, i1, n1),
        reduced_cols(&k, rcol2, i2, n2),
    );
    let (wa, wb) = (w_block(&k, w1, i1, n1, m), w_block(&k, w2, i2, n2, m));
    let mi = minv_block(&k, minv, e, m);
    let zero = k.float(0.0);
    for a in 0..n1 {
        let column =
            |j: usize| -> Expr { dot(&wa[a], &(0..m).map(|p| mi[p][j]).collect::<Vec<_>>()) };
        let h: Vec<Expr> = (0..m).map(column).collect();
        for b in 0..n2 {
            let t = dot(&h, &wb[b]);
            let (ca, cb) = (cols1[a], cols2[b]);
            // The pair's block and its transpose meet on the diagonal.
            let t = ca.eq(cb).select(t * 2.0, t);
            let (valid, at) = lower_entry(&k, ca, cb, n);
            s.atomic_add(sm, at, valid.select(-t, zero));
        }
    }
    k.s.build()
}

/// Per instance reading block `e`: `t_e += W_i' dc` (`dc` over reduced columns). Buffers:
/// `rcol`, `block`, `w`, `dc`, `t`.
pub(super) fn back_sum(precision: Precision, l: &Layout) -> Result<Program> {
    let k = Kernel::new("schur_back_sum", precision);
    let s = &k.s;
    let (rcol, block, w, dc) = (k.indices(), k.indices(), k.read(), k.read());
    let t = k.read_write();
    let (m, nr) = (l.eliminated.len(), l.reduced.len());
    let i = s.index();
    let e = s.load(block, i);
    let free = free_cols(&k, rcol, i, nr);
    let wi = w_block(&k, w, i, nr, m);
    let zero = k.float(0.0);
    let x: Vec<Expr> = (0..nr)
        .map(|a| free.valid[a].select(s.load(dc, free.safe[a]), zero))
        .collect();
    // A shape that reads no reduced column adds nothing.
    for j in (0..m).filter(|_| nr > 0) {
        let column: Vec<Expr> = (0..nr).map(|a| wi[a][j]).collect();
        s.atomic_add(t, e * c(&k, m) + c(&k, j), dot(&column, &x));
    }
    k.s.build()
}

/// Per eliminated block: `delta_e = M_e^-1 (-g_e - t_e)`. Buffers: `meta`, `minv`,
/// `gradient`, `t`, `delta`.
pub(super) fn back_solve(precision: Precision, m: usize) -> Result<Program> {
    let k = Kernel::new("schur_back_solve", precision);
    let s = &k.s;
    let (meta_buf, minv, gradient, t) = (k.indices(), k.read(), k.read(), k.read());
    let delta = k.read_write();
    let e = s.index();
    let first = s.load(meta_buf, s.u32(meta::FIRST_COL)) + e * c(&k, m);
    let mi = minv_block(&k, minv, e, m);
    let b: Vec<Expr> = (0..m)
        .map(|j| -s.load(gradient, first + c(&k, j)) - s.load(t, e * c(&k, m) + c(&k, j)))
        .collect();
    for a in 0..m {
        s.store(delta, first + c(&k, a), dot(&mi[a], &b));
    }
    k.s.build()
}

/// Per reduced column `i`: `delta[rmap[i]] = dc[i]`. Buffers: `rmap`, `dc`, `delta`.
pub(super) fn scatter(precision: Precision) -> Result<Program> {
    let k = Kernel::new("schur_scatter", precision);
    let s = &k.s;
    let (rmap, dc, delta) = (k.indices(), k.read(), k.read_write());
    let i = s.index();
    s.store(delta, s.load(rmap, i), s.load(dc, i));
    k.s.build()
}
