//! The Schur engine (Ceres's `DENSE_SCHUR`): for problems that declare blocks to eliminate
//! ([`Problem::set_eliminated`], a bundle adjustment's points), the damped normal equations
//!
//! ```text
//! [ U  W ] [dc]   [-g_c]
//! [ W' V ] [de] = [-g_e]
//! ```
//!
//! are reduced to `S dc = -g_c + W V^-1 g_e` with `S = U - W V^-1 W'`, `V` block diagonal
//! (one small block per eliminated block, inverted by Cholesky). `S` is formed dense and
//! factorised by faer's dense Cholesky, then `de = V^-1 (-g_e - W' dc)`. Everything is `f64`
//! on the host, from the Jacobian the kernels wrote.

use super::host::Damping;
use super::{Engine, Iterates, Step, norm};
use crate::Error;
use crate::compile::CompiledProblem;
use crate::dense::{cholesky_solve, small_cholesky};
use crate::problem::Problem;
use faer::dyn_stack::{MemBuffer, MemStack};
use faer::linalg::cholesky::llt::factor::{LltError, cholesky_in_place, cholesky_in_place_scratch};
use faer::{MatMut, Par};
use hal::{Backend, BackendExt};
use web_time::Instant;

/// Where a column goes: the reduced system (its index there), an eliminated block (the block
/// and the offset in it), or nowhere (fixed).
#[derive(Clone, Copy, PartialEq)]
enum Col {
    Reduced(u32),
    Eliminated(u32, u8),
    Fixed,
}

/// One residual instance's layout: its first Jacobian row and entry, its columns' places, and
/// its eliminated block (if any) with where each reduced column sits in that block's list.
struct Instance {
    row: u32,
    entry: u32,
    rows: u8,
    cols: u8,
    /// Where its columns' places start in `SchurEngine::places`.
    first_place: u32,
}

pub(super) struct SchurEngine<B: Backend> {
    compiled: CompiledProblem<B>,
    params_buf: B::Buffer,
    it: Iterates<B, Vec<f64>>,
    cols: Vec<Col>,
    instances: Vec<Instance>,
    /// Per instance column: its place, and for a reduced column of an instance with an
    /// eliminated block, its position in that block's list (`block_cols`).
    places: Vec<(Col, u16)>,
    /// Size of the eliminated blocks, their number, and the reduced system's size.
    size: usize,
    blocks: usize,
    reduced: usize,
    /// Per eliminated block: the reduced columns its instances touch (sorted), and offsets into
    /// `w` (`w_start[e]..w_start[e + 1]`, `len * size` values, row-major).
    block_cols: Vec<Vec<u32>>,
    w_start: Vec<usize>,
    w: Vec<f64>,
    /// `V` per block (`size * size`), `U` dense (column-major `reduced x reduced`, lower
    /// triangle), the gradient over reduced then eliminated columns.
    v: Vec<f64>,
    u: Vec<f64>,
    gradient: Vec<f64>,
    /// Free columns' `(J^T J)_ii`, reduced then eliminated, for the damping.
    damping: Damping,
    /// The Schur complement being factorised, and scratch.
    s: Vec<f64>,
    scratch: MemBuffer,
    /// The step over free columns (reduced, then eliminated), and over every column.
    delta: Vec<f64>,
    step: Vec<f64>,
    /// The residuals and the Jacobian read at the last linearization (the model reduction
    /// reads the Jacobian again; both vectors are reused by the next read).
    residuals: Vec<f64>,
    jacobian: Vec<f64>,
    /// Per extra thread: its share of `S` and of the right-hand side.
    partial: Vec<(Vec<f64>, Vec<f64>)>,
    /// Per eliminated block, the Cholesky factor of `V + lambda D` (rewritten each solve,
    /// read again by the back substitution).
    factors: Vec<f64>,
}

/// The free column index of `c` in the engine's ordering: reduced first, then eliminated.
fn free_of(c: Col, reduced: usize, size: usize) -> Option<usize> {
    match c {
        Col::Reduced(r) => Some(r as usize),
        Col::Eliminated(e, k) => Some(reduced + e as usize * size + k as usize),
        Col::Fixed => None,
    }
}

/// Whether `problem` can be solved by this engine: it declares eliminated blocks, they
/// are Euclidean, free and unbounded, and no residual block reads two of them.
pub(super) fn applies(problem: &Problem) -> Result<(), String> {
    let Some((first, size, count)) = problem.eliminated() else {
        return Err("the problem declares no blocks to eliminate".into());
    };
    for i in first..first + size * count {
        if problem.manifold(i).is_some() || problem.is_fixed(i) {
            return Err(format!(
                "eliminated parameter {i} is on a manifold or fixed; eliminated blocks are \
                 free Euclidean parameters"
            ));
        }
        let (lo, hi) = problem.bounds(i);
        if lo.is_finite() || hi.is_finite() {
            return Err(format!("eliminated parameter {i} is bounded"));
        }
    }
    // No residual block may read two eliminated blocks.
    let range = first..first + size * count;
    for g in problem.groups() {
        let (p, slots) = (g.params_per_instance(), g.slots_per_instance());
        for (i, inst) in g.param_index.chunks_exact(slots).enumerate() {
            let mut block = None;
            for &index in &inst[..p] {
                let index = index as usize;
                if range.contains(&index) {
                    let e = (index - first) / size;
                    if block.is_some_and(|b| b != e) {
                        return Err(format!(
                            "residual block {} reads two eliminated blocks; the Schur \
                             complement needs each block to read at most one",
                            g.block_ids[i]
                        ));
                    }
                    block = Some(e);
                }
            }
        }
    }
    Ok(())
}

impl<B: Backend> SchurEngine<B> {
    pub(super) fn new(compiled: CompiledProblem<B>, problem: &Problem) -> Result<Self, Error> {
        applies(problem).map_err(Error::InvalidProblem)?;
        let (first, size, blocks) = problem.eliminated().expect("checked by applies");
        let tangent = &compiled.tangent;
        let first_col = tangent.col(first as u32) as usize;
        let mut cols = Vec::with_capacity(tangent.cols);
        let mut reduced = 0u32;
        for c in 0..tangent.cols {
            cols.push(if (first_col..first_col + size * blocks).contains(&c) {
                let k = c - first_col;
                Col::Eliminated((k / size) as u32, (k % size) as u8)
            } else if tangent.fixed[c] {
                Col::Fixed
            } else {
                reduced += 1;
                Col::Reduced(reduced - 1)
            });
        }
        let reduced = reduced as usize;
        if problem.groups().iter().any(|g| {
            g.params_per_instance() > u8::MAX as usize
                || g.residuals_per_instance() > u8::MAX as usize
        }) {
            return Err(Error::InvalidProblem(
                "the Schur engine takes residual blocks of at most 255 residuals and columns"
                    .into(),
            ));
        }
        let offsets = &compiled.host_row_offsets;
        let col_index = &compiled.host_col_indices;
        let mut instances = Vec::new();
        let mut block_cols: Vec<Vec<u32>> = vec![Vec::new(); blocks];
        let mut row = 0usize;
        for g in problem.groups() {
            let (p, r) = (g.params_per_instance(), g.residuals_per_instance());
            for _ in 0..g.len() {
                let entry = offsets[row] as usize;
                // At most one eliminated block (`applies` checked).
                let block = col_index[entry..entry + p]
                    .iter()
                    .find_map(|&c| match cols[c as usize] {
                        Col::Eliminated(e, _) => Some(e),
                        _ => None,
                    })
                    .unwrap_or(u32::MAX);
                if block != u32::MAX {
                    for &c in &col_index[entry..entry + p] {
                        if let Col::Reduced(rc) = cols[c as usize] {
                            block_cols[block as usize].push(rc);
                        }
                    }
                }
                instances.push(Instance {
                    row: row as u32,
                    entry: entry as u32,
                    rows: r as u8,
                    cols: p as u8,
                    first_place: block,
                });
                row += r;
            }
        }
        let mut w_start = Vec::with_capacity(blocks + 1);
        w_start.push(0);
        for list in &mut block_cols {
            list.sort_unstable();
            list.dedup();
            w_start.push(w_start.last().unwrap() + list.len() * size);
        }
        // Each instance's places (its `first_place` held its block until here).
        let mut places = Vec::new();
        for inst in &mut instances {
            let (block, entry) = (inst.first_place, inst.entry as usize);
            inst.first_place = places.len() as u32;
            for &c in &col_index[entry..entry + inst.cols as usize] {
                let place = cols[c as usize];
                let local = match (place, block) {
                    (Col::Reduced(rc), b) if b != u32::MAX => block_cols[b as usize]
                        .binary_search(&rc)
                        .expect("listed above"),
                    _ => 0,
                };
                if local > u16::MAX as usize {
                    return Err(Error::InvalidProblem(format!(
                        "eliminated block {block} is read with more than {} other columns",
                        u16::MAX
                    )));
                }
                places.push((place, local as u16));
            }
        }
        let x = problem.parameters().to_vec();
        let n_free = reduced + blocks * size;
        let backend = compiled.backend.clone();
        let params_buf = backend.alloc(compiled.precision.dtype(), x.len().max(1))?;
        let scratch = MemBuffer::try_new(cholesky_in_place_scratch::<f64>(
            reduced.max(size),
            crate::all_cores(),
            Default::default(),
        ))
        .map_err(|_| Error::Solver("out of memory for the Schur scratch".into()))?;
        let engine = Self {
            params_buf,
            it: Iterates::new(&compiled, x.clone(), x)?,
            cols,
            instances,
            places,
            size,
            blocks,
            reduced,
            w: vec![0.0; *w_start.last().unwrap()],
            w_start,
            block_cols,
            v: vec![0.0; blocks * size * size],
            u: vec![0.0; reduced * reduced],
            gradient: vec![0.0; n_free],
            damping: Damping::default(),
            s: vec![0.0; reduced * reduced],
            scratch,
            delta: vec![0.0; n_free],
            step: vec![0.0; tangent.cols],
            residuals: Vec::new(),
            jacobian: Vec::new(),
            partial: Vec::new(),
            factors: vec![0.0; blocks * size * size],
            compiled,
        };
        Ok(engine)
    }

    /// `x_candidate = x (+) delta`.
    fn place_candidate(&mut self) {
        for (c, &place) in self.cols.iter().enumerate() {
            self.step[c] = match free_of(place, self.reduced, self.size) {
                Some(f) => self.delta[f],
                None => 0.0,
            };
        }
        self.compiled
            .tangent
            .plus(&self.it.x, &self.step, &mut self.it.x_candidate);
    }
}

/// Cholesky of the `n x n` column-major matrix `a` in place (lower triangle); the pivot that
/// failed otherwise.
pub(super) fn cholesky(a: &mut [f64], n: usize, scratch: &mut MemBuffer) -> Result<(), usize> {
    let par = if n >= 256 {
        crate::all_cores()
    } else {
        Par::Seq
    };
    match cholesky_in_place(
        MatMut::from_column_major_slice_mut(a, n, n),
        Default::default(),
        par,
        MemStack::new(scratch),
        Default::default(),
    ) {
        Ok(_) => Ok(()),
        Err(LltError::NonPositivePivot { index }) => Err(index),
    }
}

/// `S[rows, cols] -= Y_A W_B'` for one pair of 9-column runs and 3-value blocks: `at` is the
/// block's (first column, first row) in `s` (column-major, leading dimension `ld`); on the
/// diagonal (`diagonal`) only the lower triangle.
#[inline(always)]
fn block_9x3(
    s: &mut [f64],
    ld: usize,
    at: (usize, usize),
    ya: &[f64; 27],
    wb: &[f64; 27],
    diagonal: bool,
) {
    let (col0, row0) = at;
    for j in 0..9 {
        let (w0, w1, w2) = (wb[3 * j], wb[3 * j + 1], wb[3 * j + 2]);
        let col: &mut [f64; 9] = (&mut s[(col0 + j) * ld + row0..(col0 + j) * ld + row0 + 9])
            .try_into()
            .expect("9");
        let first = if diagonal { j } else { 0 };
        for i in first..9 {
            col[i] -= ya[3 * i] * w0 + ya[3 * i + 1] * w1 + ya[3 * i + 2] * w2;
        }
    }
}

impl<B: Backend> Engine for SchurEngine<B> {
    super::host::host_engine_common!();

    async fn linearize(&mut self) -> Result<f64, Error> {
        let t = Instant::now();
        let b = &self.compiled.backend;
        let mut residuals = std::mem::take(&mut self.residuals);
        let mut jacobian = std::mem::take(&mut self.jacobian);
        b.read_f64_into_async(&self.it.current.residuals, &mut residuals)
            .await?;
        b.read_f64_into_async(&self.it.current.jacobian, &mut jacobian)
            .await?;
        let (reduced, size) = (self.reduced, self.size);
        self.u.iter_mut().for_each(|v| *v = 0.0);
        self.v.iter_mut().for_each(|v| *v = 0.0);
        self.w.iter_mut().for_each(|v| *v = 0.0);
        self.gradient.iter_mut().for_each(|v| *v = 0.0);
        // Per instance: its Gram matrix J_i' J_i and J_i' f_i (dense, p x p), then each entry
        // added where its pair of columns belongs (U, W or V).
        let mut gram = vec![0.0f64; 256 * 256];
        let mut grad = [0.0f64; 256];
        for inst in &self.instances {
            let (p, entry) = (inst.cols as usize, inst.entry as usize);
            let places = &self.places[inst.first_place as usize..inst.first_place as usize + p];
            let gram = &mut gram[..p * p];
            gram.iter_mut().for_each(|v| *v = 0.0);
            grad[..p].iter_mut().for_each(|v| *v = 0.0);
            for r in 0..inst.rows as usize {
                let f = residuals[inst.row as usize + r];
                let js = &jacobian[entry + r * p..entry + (r + 1) * p];
                for (a, &ja) in js.iter().enumerate() {
                    grad[a] += ja * f;
                    for (out, &jb) in gram[a * p..(a + 1) * p].iter_mut().zip(js) {
                        *out += ja * jb;
                    }
                }
            }
            for (a, &(place_a, local_a)) in places.iter().enumerate() {
                let row = &gram[a * p..(a + 1) * p];
                match place_a {
                    Col::Fixed => {}
                    Col::Reduced(ra) => {
                        self.gradient[ra as usize] += grad[a];
                        for (&(place_b, _), &v) in places.iter().zip(row) {
                            match place_b {
                                // U, lower triangle: row >= column.
                                Col::Reduced(rb) if rb <= ra => {
                                    self.u[rb as usize * reduced + ra as usize] += v
                                }
                                Col::Eliminated(e, kb) => {
                                    let at = self.w_start[e as usize]
                                        + local_a as usize * size
                                        + kb as usize;
                                    self.w[at] += v;
                                }
                                _ => {}
                            }
                        }
                    }
                    Col::Eliminated(e, ka) => {
                        let base = e as usize * size + ka as usize;
                        self.gradient[reduced + base] += grad[a];
                        for (&(place_b, _), &v) in places.iter().zip(row) {
                            if let Col::Eliminated(_, kb) = place_b {
                                self.v[base * size + kb as usize] += v;
                            }
                        }
                    }
                }
            }
        }
        let diagonal = (0..reduced)
            .map(|i| self.u[i * reduced + i])
            .chain((0..self.blocks * size).map(|i| {
                let (e, k) = (i / size, i % size);
                self.v[(e * size + k) * size + k]
            }))
            .collect::<Vec<f64>>();
        self.damping.update(diagonal.into_iter());
        (self.residuals, self.jacobian) = (residuals, jacobian);
        self.it.times.linearize += t.elapsed().as_secs_f64();
        Ok(self.gradient.iter().fold(0.0, |m, g| m.max(g.abs())))
    }

    async fn solve(&mut self, lambda: f64) -> Result<Step, Error> {
        let t = Instant::now();
        let (reduced, size) = (self.reduced, self.size);
        let d = &self.damping.diagonal;
        // S = U + lambda D_c, then minus W V^-1 W' per block; rhs = -g_c + W V^-1 g_e.
        self.s.copy_from_slice(&self.u);
        for (i, &di) in d.iter().enumerate().take(reduced) {
            self.s[i * reduced + i] += lambda * di;
        }
        let mut rhs: Vec<f64> = self.gradient[..reduced].iter().map(|g| -g).collect();
        // Per block: V + lambda D_e's Cholesky factor (kept for the back substitution).
        let not_positive = |what: String| {
            Error::NotPositiveDefinite(format!(
                "Schur complement failed ({what}): the damped normal matrix is not positive \
                 definite (lambda = {lambda:e}); a parameter no residual constrains?"
            ))
        };
        for (e, f) in self.factors.chunks_exact_mut(size * size).enumerate() {
            f.copy_from_slice(&self.v[e * size * size..(e + 1) * size * size]);
            // V is stored row-major with both triangles; symmetric, so column-major too.
            for k in 0..size {
                f[k * size + k] += lambda * d[reduced + e * size + k];
            }
            small_cholesky(f, size)
                .map_err(|k| not_positive(format!("eliminated block {e}, pivot {k}")))?;
        }
        // S -= W V^-1 W' and rhs += W V^-1 g_e, the blocks split over the threads, each
        // accumulating into its own copy (summed after).
        let threads = rayon::current_num_threads().clamp(1, self.blocks.max(1));
        let per = self.blocks.div_ceil(threads);
        if self.partial.len() < threads - 1 {
            self.partial.resize_with(threads - 1, || {
                (vec![0.0; reduced * reduced], vec![0.0; reduced])
            });
        }
        let mut own_s = std::mem::take(&mut self.s);
        let mut parts = std::mem::take(&mut self.partial);
        let this = &*self;
        rayon::scope(|scope| {
            let mut rest = parts.iter_mut();
            for t in 1..threads {
                let (ps, pr) = rest.next().expect("a partial per extra thread");
                let factors = &this.factors;
                scope.spawn(move |_| {
                    ps.iter_mut().for_each(|v| *v = 0.0);
                    pr.iter_mut().for_each(|v| *v = 0.0);
                    let blocks = t * per..((t + 1) * per).min(this.blocks);
                    this.eliminate(blocks, factors, ps, pr);
                });
            }
            this.eliminate(0..per.min(this.blocks), &this.factors, &mut own_s, &mut rhs);
        });
        for (ps, pr) in parts.iter().take(threads - 1) {
            own_s.iter_mut().zip(ps).for_each(|(a, b)| *a += b);
            rhs.iter_mut().zip(pr).for_each(|(a, b)| *a += b);
        }
        self.s = own_s;
        self.partial = parts;
        cholesky(&mut self.s, reduced, &mut self.scratch)
            .map_err(|k| not_positive(format!("reduced system, pivot {k}")))?;
        cholesky_solve(&self.s, reduced, &mut rhs);
        self.delta[..reduced].copy_from_slice(&rhs);
        // de = V^-1 (-g_e - W' dc), in place in the step.
        for e in 0..self.blocks {
            let list = &self.block_cols[e];
            let w = &self.w[self.w_start[e]..self.w_start[e + 1]];
            let at = reduced + e * size..reduced + (e + 1) * size;
            let b = &mut self.delta[at.clone()];
            for (out, &g) in b.iter_mut().zip(&self.gradient[at]) {
                *out = -g;
            }
            for (a, &ra) in list.iter().enumerate() {
                for k in 0..size {
                    b[k] -= w[a * size + k] * rhs[ra as usize];
                }
            }
            cholesky_solve(
                &self.factors[e * size * size..(e + 1) * size * size],
                size,
                b,
            );
        }
        self.place_candidate();
        let model_reduction = self.model_reduction();
        self.it.times.linear_solve += t.elapsed().as_secs_f64();
        Ok(Step {
            model_reduction,
            step_norm: norm(&self.delta),
            x_norm: norm(&self.it.x),
            cg_iterations: 0,
        })
    }
}

impl<B: Backend> SchurEngine<B> {
    /// Adds the blocks' `-W V^-1 W'` to `s` (lower triangle) and `W V^-1 g_e` to `rhs`, given
    /// each block's factor of `V + lambda D`. A block's reduced columns come in runs of
    /// consecutive columns (a camera's), so each column of `s` takes a contiguous update.
    ///
    /// On x86-64 CPUs with AVX2 and FMA (checked at run time) the loops are compiled for them.
    fn eliminate(
        &self,
        blocks: std::ops::Range<usize>,
        factors: &[f64],
        s: &mut [f64],
        rhs: &mut [f64],
    ) {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: the CPU has AVX2 and FMA (just checked).
            unsafe { self.eliminate_avx2(blocks, factors, s, rhs) };
            return;
        }
        self.eliminate_body(blocks, factors, s, rhs)
    }

    /// [`SchurEngine::eliminate_body`] compiled for AVX2 and FMA.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    fn eliminate_avx2(
        &self,
        blocks: std::ops::Range<usize>,
        factors: &[f64],
        s: &mut [f64],
        rhs: &mut [f64],
    ) {
        self.eliminate_body(blocks, factors, s, rhs)
    }

    /// The work of [`SchurEngine::eliminate`].
    #[inline(always)]
    fn eliminate_body(
        &self,
        blocks: std::ops::Range<usize>,
        factors: &[f64],
        s: &mut [f64],
        rhs: &mut [f64],
    ) {
        let (size, reduced) = (self.size, self.reduced);
        let mut yt: Vec<f64> = Vec::new();
        let mut yr: Vec<f64> = Vec::new();
        let mut row = [0.0f64; 16];
        let mut vinv = vec![0.0f64; size * size];
        let mut runs: Vec<(usize, usize, usize)> = Vec::new();
        for e in blocks {
            let f = &factors[e * size * size..(e + 1) * size * size];
            let list = &self.block_cols[e];
            let w = &self.w[self.w_start[e]..self.w_start[e + 1]];
            let g = &self.gradient[reduced + e * size..reduced + (e + 1) * size];
            let m = list.len();
            // Y = W V^-1, stored transposed (`yt[k * m + a]`).
            // Also row-major (`yr[a * size + k]`) for the blocked path.
            yt.clear();
            yt.resize(size * m, 0.0);
            yr.clear();
            yr.resize(size * m, 0.0);
            // V^-1 once per block (symmetric), and V^-1 g_e: then each row of Y is a small
            // product rather than a triangular solve.
            for k in 0..size {
                let col = &mut vinv[k * size..(k + 1) * size];
                col.iter_mut()
                    .enumerate()
                    .for_each(|(i, v)| *v = (i == k) as u8 as f64);
                cholesky_solve(f, size, col);
            }
            row[..size].copy_from_slice(g);
            cholesky_solve(f, size, &mut row[..size]);
            let vinv_g = row;
            for a in 0..m {
                let wa = &w[a * size..(a + 1) * size];
                for k in 0..size {
                    let vk = &vinv[k * size..(k + 1) * size];
                    let y: f64 = wa.iter().zip(vk).map(|(p, q)| p * q).sum();
                    yt[k * m + a] = y;
                    yr[a * size + k] = y;
                }
                let dot: f64 = wa.iter().zip(&vinv_g[..size]).map(|(p, q)| p * q).sum();
                rhs[list[a] as usize] += dot;
            }
            // Runs of consecutive reduced columns: (first local index, first column, length).
            runs.clear();
            for (a, &c) in list.iter().enumerate() {
                match runs.last_mut() {
                    Some((a0, c0, len)) if *c0 + *len == c as usize && *a0 + *len == a => *len += 1,
                    _ => runs.push((a, c as usize, 1)),
                }
            }
            if size == 3 && runs.iter().all(|r| r.2 == 9) {
                // Points and 9-parameter cameras (BAL): fixed 9 x 9 blocks, unrolled.
                for (bi, &(b0, cb0, _)) in runs.iter().enumerate() {
                    let wb: &[f64; 27] = w[b0 * 3..b0 * 3 + 27].try_into().expect("27");
                    for &(a0, ca0, _) in &runs[bi..] {
                        let ya: &[f64; 27] = yr[a0 * 3..a0 * 3 + 27].try_into().expect("27");
                        block_9x3(s, reduced, (cb0, ca0), ya, wb, a0 == b0);
                    }
                }
                continue;
            }
            for (bi, &(b0, cb0, lb)) in runs.iter().enumerate() {
                for j in 0..lb {
                    let (b, cb) = (b0 + j, cb0 + j);
                    let wb = &w[b * size..(b + 1) * size];
                    for &(a0, ca0, la) in &runs[bi..] {
                        // Rows at or below the diagonal: the same run starts at `j`.
                        let skip = if a0 == b0 { j } else { 0 };
                        let col = &mut s[cb * reduced + ca0 + skip..cb * reduced + ca0 + la];
                        if let [w0, w1, w2] = *wb {
                            // Points (3 values): one pass over the column.
                            let at = |k: usize| &yt[k * m + a0 + skip..k * m + a0 + la];
                            let (y0, y1, y2) = (at(0), at(1), at(2));
                            for (((out, &p), &q), &r) in col.iter_mut().zip(y0).zip(y1).zip(y2) {
                                *out -= p * w0 + q * w1 + r * w2;
                            }
                            continue;
                        }
                        // One contiguous pass per k: vectorises for any block size.
                        for (k, &wk) in wb.iter().enumerate() {
                            let yk = &yt[k * m + a0 + skip..k * m + a0 + la];
                            for (out, &y) in col.iter_mut().zip(yk) {
                                *out -= y * wk;
                            }
                        }
                    }
                }
            }
        }
    }

    /// `L(0) - L(delta) = -g.delta - |J delta|^2 / 2`, `|J delta|^2` row by row.
    fn model_reduction(&self) -> f64 {
        let jacobian = &self.jacobian;
        let cols = &self.compiled.host_col_indices;
        let offsets = &self.compiled.host_row_offsets;
        let mut jd2 = 0.0;
        for row in 0..self.compiled.rows {
            let mut v = 0.0;
            for k in offsets[row] as usize..offsets[row + 1] as usize {
                v += jacobian[k] * self.step[cols[k] as usize];
            }
            jd2 += v * v;
        }
        let g_dot: f64 = self
            .gradient
            .iter()
            .zip(&self.delta)
            .map(|(g, d)| g * d)
            .sum();
        -g_dot - 0.5 * jd2
    }
}
