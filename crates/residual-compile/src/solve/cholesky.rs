//! The CPU engine: `J^T J` assembled on the host in `f64`, factorised by the supernodal sparse
//! Cholesky (`crate::supernodal`) over faer's symbolic analysis, solved by faer.

use super::{Engine, Iterates, Step, norm};
use crate::Error;
use crate::compile::CompiledProblem;
use crate::problem::Problem;
use faer::dyn_stack::{MemBuffer, MemStack};
use faer::sparse::linalg::cholesky::{
    LltRef, SymbolicCholesky, SymmetricOrdering, factorize_symbolic_cholesky,
};
use faer::sparse::{SparseColMatRef, SymbolicSparseColMat, SymbolicSparseColMatRef};
use faer::{Conj, Par, Side};
use hal::{Backend, BackendExt};
use web_time::Instant;

pub(super) struct CholeskyEngine<B: Backend> {
    compiled: CompiledProblem<B>,
    params_buf: B::Buffer,
    it: Iterates<B, Vec<f64>>,
    /// The damped normal matrix's values, rewritten each solve.
    damped: Vec<f64>,
    /// Column (a parameter, or a manifold block's tangent coordinate) -> index among free
    /// columns (`u32::MAX` when fixed).
    free_index: Vec<u32>,
    /// `J^T J` over the free parameters: lower triangle, CSC.
    normal: SymbolicSparseColMat<u32>,
    symbolic: SymbolicCholesky<u32>,
    /// The numeric factorisation on all cores, when faer's analysis is supernodal.
    parallel: Option<crate::supernodal::ParallelCholesky>,
    /// The factor's values and the factorisation's scratch, kept between iterations.
    factor: Vec<f64>,
    scratch: MemBuffer,
    /// Per instance of each group, the slot in `normal`'s values of each pair `(a, b)`,
    /// `b <= a`, of its parameter slots (`u32::MAX` when either is fixed).
    pair_slots: Vec<Vec<u32>>,
    normal_values: Vec<f64>,
    /// The residuals and the Jacobian as last read, kept between linearizations.
    host_residuals: Vec<f64>,
    host_jacobian: Vec<f64>,
    gradient: Vec<f64>,
    /// The damping's scaling `D` (see `Scaling`).
    damping: super::host::Damping,
    delta: Vec<f64>,
    /// The step over every column (0 where fixed), for the tangent space's `plus`.
    step: Vec<f64>,
    problem_groups: Vec<(usize, usize, usize)>,
    /// Per column, its bounds (infinite on a manifold), where any parameter has a finite one:
    /// steps are projected.
    bounds: Option<Vec<(f64, f64)>>,
}

impl<B: Backend> CholeskyEngine<B> {
    pub(super) fn new(compiled: CompiledProblem<B>, problem: &Problem) -> Result<Self, Error> {
        let x = problem.parameters().to_vec();
        let tangent = &compiled.tangent;
        let fixed = &tangent.fixed;
        let mut free_index = vec![u32::MAX; tangent.cols];
        let mut free = 0u32;
        for (i, f) in fixed.iter().enumerate() {
            if !f {
                free_index[i] = free;
                free += 1;
            }
        }
        let n = free as usize;
        // Each instance's free columns couple pairwise in J^T J; the pattern is expanded from
        // the graph of column groups (`ordering::Compressed`), which the orderings use too.
        let mut problem_groups = Vec::new();
        let free_of = |index: u32| free_index[tangent.col(index) as usize];
        let (mut clique_ptr, mut clique_cols) = (vec![0usize], Vec::new());
        let mut in_clique = Vec::new();
        for g in problem.groups() {
            let (p, s) = (g.params_per_instance(), g.slots_per_instance());
            problem_groups.push((g.len(), g.residuals_per_instance(), p));
            for inst in g.param_index.chunks_exact(s) {
                in_clique.clear();
                in_clique.extend(inst[..p].iter().map(|&a| free_of(a)));
                in_clique.retain(|&f| f != u32::MAX);
                in_clique.sort_unstable();
                in_clique.dedup();
                clique_cols.extend_from_slice(&in_clique);
                clique_ptr.push(clique_cols.len());
            }
        }
        let compressed = crate::ordering::Compressed::from_cliques(n, &clique_ptr, &clique_cols);
        drop((clique_ptr, clique_cols));
        let (col_ptr, row_idx) = compressed.lower_pattern();
        let slot = |row: u32, col: u32| -> u32 {
            let (s, e) = (
                col_ptr[col as usize] as usize,
                col_ptr[col as usize + 1] as usize,
            );
            s as u32
                + row_idx[s..e]
                    .binary_search(&row)
                    .expect("pattern has the pair") as u32
        };
        let mut pair_slots = Vec::new();
        for g in problem.groups() {
            let (p, s) = (g.params_per_instance(), g.slots_per_instance());
            let mut slots = Vec::with_capacity(g.len() * p * (p + 1) / 2);
            for inst in g.param_index.chunks_exact(s) {
                for a in 0..p {
                    for b in 0..=a {
                        let (fa, fb) = (free_of(inst[a]), free_of(inst[b]));
                        slots.push(if fa == u32::MAX || fb == u32::MAX {
                            u32::MAX
                        } else {
                            slot(fa.max(fb), fa.min(fb))
                        });
                    }
                }
            }
            pair_slots.push(slots);
        }
        let nnz_normal = row_idx.len();
        let normal = SymbolicSparseColMat::new_checked(n, n, col_ptr, None, row_idx);
        let symbolic = analyse(normal.as_ref(), &compressed)?;
        // The numeric factorisation spreads subtrees over the cores (`supernodal`); faer's own
        // splits only inside supernodes, which are too small here for that to pay. faer
        // factors only when it chose its simplicial method (small problems).
        // Meanwhile the factor's pages are touched on another thread: the first factorisation
        // otherwise faults them in one by one (sphere2500: 15 MB, a first solve 8 ms slower).
        let (parallel, factor) = rayon::join(
            || crate::supernodal::ParallelCholesky::new(normal.as_ref(), &symbolic),
            || {
                let mut factor = Vec::new();
                factor.resize(symbolic.len_val(), 0.0);
                factor
            },
        );
        let scratch = MemBuffer::try_new(
            symbolic
                .factorize_numeric_llt_scratch::<f64>(Par::Seq, Default::default())
                .or(symbolic.solve_in_place_scratch::<f64>(1, Par::Seq)),
        )
        .map_err(|_| Error::Solver("out of memory for the sparse Cholesky scratch".into()))?;
        let backend = compiled.backend.clone();
        let params_buf = backend.alloc(compiled.precision.dtype(), x.len().max(1))?;
        let engine = Self {
            params_buf,
            it: Iterates::new(&compiled, x.clone(), x)?,
            damped: vec![0.0; nnz_normal],
            free_index,
            normal,
            symbolic,
            parallel,
            factor,
            scratch,
            pair_slots,
            normal_values: vec![0.0; nnz_normal],
            host_residuals: Vec::new(),
            host_jacobian: Vec::new(),
            gradient: vec![0.0; n],
            damping: Default::default(),
            delta: vec![0.0; n],
            step: vec![0.0; tangent.cols],
            problem_groups,
            bounds: problem.has_bounds().then(|| {
                (0..tangent.cols)
                    .map(|c| match tangent.param_of_col(c) {
                        Some(i) => problem.bounds(i),
                        None => (f64::NEG_INFINITY, f64::INFINITY),
                    })
                    .collect()
            }),
            compiled,
        };
        Ok(engine)
    }
}

impl<B: Backend> CholeskyEngine<B> {
    /// `max |g|` over the free parameters; with bounds, Ceres's projected form
    /// `max |x - P(x - g)|` (`P` the projection onto the bounds), which is 0 at a minimum on a
    /// bound where `g` is not.
    fn projected_gradient_max(&self) -> f64 {
        let Some(bounds) = &self.bounds else {
            return self.gradient.iter().fold(0.0, |m, g| m.max(g.abs()));
        };
        let mut max = 0.0f64;
        for (c, &fi) in self.free_index.iter().enumerate() {
            if fi == u32::MAX {
                continue;
            }
            let g = self.gradient[fi as usize];
            max = max.max(match self.compiled.tangent.param_of_col(c) {
                Some(i) => {
                    let (x, (lo, hi)) = (self.it.x[i], bounds[c]);
                    (x - (x - g).clamp(lo, hi)).abs()
                }
                None => g.abs(),
            });
        }
        max
    }

    /// `x_candidate = x + delta` over the free parameters, projected onto the bounds where
    /// there are any, and `delta` made the projected step (what the model and the step norm
    /// then measure).
    fn place_candidate(&mut self) {
        let tangent = &self.compiled.tangent;
        for (c, &fi) in self.free_index.iter().enumerate() {
            if fi == u32::MAX {
                self.step[c] = 0.0;
                continue;
            }
            let d = &mut self.delta[fi as usize];
            if let (Some(bounds), Some(i)) = (&self.bounds, tangent.param_of_col(c)) {
                let (lo, hi) = bounds[c];
                let x = self.it.x[i];
                *d = (x + *d).clamp(lo, hi) - x;
            }
            self.step[c] = *d;
        }
        tangent.plus(&self.it.x, &self.step, &mut self.it.x_candidate);
        if let Some(bounds) = &self.bounds {
            // `x + (clamp(x + d) - x)` can round past the bound by an ulp.
            for (c, &(lo, hi)) in bounds.iter().enumerate() {
                if let Some(i) = tangent.param_of_col(c) {
                    self.it.x_candidate[i] = self.it.x_candidate[i].clamp(lo, hi);
                }
            }
        }
    }
}

impl<B: Backend> Engine for CholeskyEngine<B> {
    super::host::host_engine_common!();

    async fn linearize(&mut self) -> Result<f64, Error> {
        let t = Instant::now();
        let b = &self.compiled.backend;
        let (residuals, jacobian) = (&mut self.host_residuals, &mut self.host_jacobian);
        b.read_f64_into_async(&self.it.current.residuals, residuals)
            .await?;
        b.read_f64_into_async(&self.it.current.jacobian, jacobian)
            .await?;
        self.normal_values.iter_mut().for_each(|v| *v = 0.0);
        self.gradient.iter_mut().for_each(|v| *v = 0.0);
        let cols = &self.compiled.host_col_indices;
        let (mut row, mut entry) = (0usize, 0usize);
        // Per instance: the lower triangle of its Gram matrix J_i' J_i and J_i' f_i, summed
        // over its rows with plain loops, then each entry added to its slot once (a slot
        // per pair, not per row and pair).
        let mut gram: Vec<f64> = Vec::new();
        let mut grad: Vec<f64> = Vec::new();
        for (gi, &(n, r, p)) in self.problem_groups.iter().enumerate() {
            let slots = &self.pair_slots[gi];
            let pairs = p * (p + 1) / 2;
            gram.resize(pairs, 0.0);
            grad.resize(p, 0.0);
            for inst in 0..n {
                let inst_slots = &slots[inst * pairs..(inst + 1) * pairs];
                gram.iter_mut().for_each(|v| *v = 0.0);
                grad.iter_mut().for_each(|v| *v = 0.0);
                for k in 0..r {
                    let f = residuals[row + k];
                    let js = &jacobian[entry + k * p..entry + (k + 1) * p];
                    let mut s = 0;
                    for (a, &ja) in js.iter().enumerate() {
                        grad[a] += ja * f;
                        for (out, &jb) in gram[s..s + a + 1].iter_mut().zip(js) {
                            *out += ja * jb;
                        }
                        s += a + 1;
                    }
                }
                // A pair (a, b) with a != b whose parameters share a free index cannot
                // occur: parameters appear once per block.
                for (&slot, &v) in inst_slots.iter().zip(&gram) {
                    if slot != u32::MAX {
                        self.normal_values[slot as usize] += v;
                    }
                }
                for (k, &g) in grad.iter().enumerate() {
                    let fi = self.free_index[cols[entry + k] as usize];
                    if fi != u32::MAX {
                        self.gradient[fi as usize] += g;
                    }
                }
                row += r;
                entry += r * p;
            }
        }
        // The damping's scaling (see `Scaling`). Each column's first stored row is the
        // diagonal (rows are sorted, and every column holds its diagonal).
        let col_ptr = self.normal.col_ptr();
        let diagonal = col_ptr[..self.gradient.len()]
            .iter()
            .map(|&start| self.normal_values[start as usize]);
        self.damping.update(diagonal);
        self.it.times.linearize += t.elapsed().as_secs_f64();
        Ok(self.projected_gradient_max())
    }

    async fn solve(&mut self, lambda: f64) -> Result<Step, Error> {
        let t = Instant::now();
        self.damped.copy_from_slice(&self.normal_values);
        let col_ptr = self.normal.col_ptr();
        for (&start, &d) in col_ptr.iter().zip(&self.damping.diagonal) {
            self.damped[start as usize] += lambda * d;
        }
        let not_positive = |what: String| {
            Error::NotPositiveDefinite(format!(
                "sparse Cholesky failed ({what}): J^T J + lambda D is not positive definite (lambda = {lambda:e}); a parameter no residual constrains? fix it with Problem::set_fixed"
            ))
        };
        let llt = match &mut self.parallel {
            Some(parallel) => {
                parallel
                    .factorize(&self.damped, &mut self.factor)
                    .map_err(|column| not_positive(format!("pivot of free parameter {column}")))?;
                LltRef::new(&self.symbolic, &self.factor)
            }
            None => self
                .symbolic
                .factorize_numeric_llt::<f64>(
                    &mut self.factor,
                    SparseColMatRef::new(self.normal.as_ref(), &self.damped),
                    Side::Lower,
                    Default::default(),
                    Par::Seq,
                    MemStack::new(&mut self.scratch),
                    Default::default(),
                )
                .map_err(|e| not_positive(format!("{e:?}")))?,
        };
        self.delta
            .iter_mut()
            .zip(&self.gradient)
            .for_each(|(d, g)| *d = -g);
        let n = self.delta.len();
        llt.solve_in_place_with_conj(
            Conj::No,
            faer::MatMut::from_column_major_slice_mut(&mut self.delta, n, 1),
            Par::Seq,
            MemStack::new(&mut self.scratch),
        );
        self.place_candidate();
        // L(0) - L(delta) = -g.delta - |J delta|^2 / 2, and |J delta|^2 = delta^T (J^T J) delta
        // (of the step as projected onto the bounds, where there are any).
        let jtj_quad = symmetric_quadratic(&self.normal, &self.normal_values, &self.delta);
        let g_dot: f64 = self
            .gradient
            .iter()
            .zip(&self.delta)
            .map(|(g, d)| g * d)
            .sum();
        self.it.times.linear_solve += t.elapsed().as_secs_f64();
        Ok(Step {
            model_reduction: -g_dot - 0.5 * jtj_quad,
            step_norm: norm(&self.delta),
            x_norm: norm(&self.it.x),
            cg_iterations: 0,
        })
    }
}

/// The symbolic analysis of the lower-triangular pattern `lower` under the cheaper of two
/// fill-reducing orders of its column groups (`crate::ordering`): AMD, and nested
/// dissection where it applies.
fn analyse(
    lower: SymbolicSparseColMatRef<'_, u32>,
    compressed: &crate::ordering::Compressed,
) -> Result<SymbolicCholesky<u32>, Error> {
    let by = |order: Vec<u32>| {
        let inverse = crate::ordering::inverse(&order);
        let perm = faer::perm::PermRef::new_checked(&order, &inverse, order.len());
        factorize_symbolic_cholesky(
            lower,
            Side::Lower,
            SymmetricOrdering::Custom(perm),
            faer::sparse::linalg::cholesky::CholeskySymbolicParams {
                // Always supernodal, factorised by `supernodal` on all cores: faer picks its
                // simplicial method for pose graphs (their 6 x 6 blocks fill little), where
                // the supernodes' dense kernels were still 2.4x faster (parking-garage).
                supernodal_flop_ratio_threshold:
                    faer::sparse::linalg::SupernodalThreshold::FORCE_SUPERNODAL,
                ..Default::default()
            },
        )
        .map_err(|e| Error::Solver(format!("sparse Cholesky analysis failed: {e:?}")))
    };
    // The two analyses are independent: side by side where there are threads.
    let (amd, dissected) = rayon::join(
        || by(compressed.amd_order()?),
        || compressed.nested_dissection().map(by).transpose(),
    );
    let amd = amd?;
    Ok(match dissected? {
        Some(d) if crate::ordering::factor_flops(&d) < crate::ordering::factor_flops(&amd) => d,
        _ => amd,
    })
}

/// `v^T A v` for symmetric `A` stored as its lower triangle.
fn symmetric_quadratic(a: &SymbolicSparseColMat<u32>, values: &[f64], v: &[f64]) -> f64 {
    let (col_ptr, row_idx) = (a.col_ptr(), a.row_idx());
    let mut total = 0.0;
    for c in 0..v.len() {
        for k in col_ptr[c] as usize..col_ptr[c + 1] as usize {
            let r = row_idx[k] as usize;
            let term = values[k] * v[r] * v[c];
            total += if r == c { term } else { 2.0 * term };
        }
    }
    total
}
