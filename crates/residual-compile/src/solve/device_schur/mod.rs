//! The device Schur engine ([`super::LinearSolver::DeviceSchur`]): Ceres's `DENSE_SCHUR`
//! with the Schur complement formed on the device. The point (parameters, step, gradient)
//! stays on the device; per linearization kernels add each residual instance's Gram matrix
//! into `U` (dense, reduced columns) and `V` (one small block per eliminated block) and keep
//! its `W_i = J_reduced' J_eliminated`; per solve kernels invert `V + lambda D` block by
//! block and subtract `W V^-1 W'` from `U + lambda D` pair of instances by pair of
//! instances (atomically), then the host reads `S` and the reduced right-hand side back,
//! factorises `S` (dense Cholesky), and the device back-substitutes the eliminated blocks.
//! What crosses the bus per iteration is the reduced system and a few scalars.
//!
//! It takes what [`super::schur`] takes, without manifolds or bounds, where the backend adds
//! atomically in the solve's precision; sums of atomics land in any order, so results may
//! differ in their last bits from run to run.

mod kernels;

use super::host::Damping;
use super::{Engine, Iterates, Step};
use crate::compile::CompiledProblem;
use crate::dense::cholesky_solve;
use crate::problem::Problem;
use crate::{Error, Precision};
use faer::Par;
use faer::dyn_stack::MemBuffer;
use faer::linalg::cholesky::llt::factor::cholesky_in_place_scratch;
use hal::{Backend, BackendExt, BinaryOp, Csr, Layout, ReduceOp, UnaryOp, View};
use kernels::{FIXED, Layout as Shape, meta};
use std::time::Instant;

/// One residual group's layout on the device.
struct Group<B: Backend> {
    shape: Shape,
    instances: usize,
    /// `[nnz0, reduced, first_col]` ([`meta`]).
    meta: B::Buffer,
    /// Per instance its reduced columns' indices ([`FIXED`] for fixed ones).
    rcol: B::Buffer,
    gram: B::Kernel,
    /// Where the group reads eliminated blocks: per instance its block, its `W_i`, and the
    /// kernels that use them.
    reads: Option<Reads<B>>,
}

struct Reads<B: Backend> {
    block: B::Buffer,
    w: B::Buffer,
    eliminate: B::Kernel,
    back_sum: B::Kernel,
}

/// The pairs of distinct instances (of groups `first` and `second`) that read one block.
struct Pairs<B: Backend> {
    first: usize,
    second: usize,
    /// `[count * 3]`: instance of `first`, instance of `second`, block.
    pairs: B::Buffer,
    count: usize,
    kernel: B::Kernel,
}

/// Scalars read back after a solve, in one buffer.
mod slot {
    pub const JD2: usize = 0;
    pub const GD: usize = 1;
    pub const DD: usize = 2;
    pub const XX: usize = 3;
    pub const LEN: usize = 4;
}

pub(super) struct DeviceSchurEngine<B: Backend> {
    compiled: CompiledProblem<B>,
    it: Iterates<B, B::Buffer>,
    groups: Vec<Group<B>>,
    pairs: Vec<Pairs<B>>,
    /// Eliminated block size and count, and the reduced system's size.
    size: usize,
    blocks: usize,
    reduced: usize,
    /// `[0, reduced, first_col]`, and per reduced column its problem column.
    meta: B::Buffer,
    rmap: B::Buffer,
    invert: B::Kernel,
    damp: B::Kernel,
    back_solve: B::Kernel,
    scatter: B::Kernel,
    /// `U` and `S` (`reduced x reduced`), `V` and its damped inverses (`blocks x size^2`),
    /// `y = M^-1 g_e`, the right-hand side (with the failure flag after it), the reduced step
    /// and the back substitution's sums.
    u: B::Buffer,
    s: B::Buffer,
    v: B::Buffer,
    minv: B::Buffer,
    y: B::Buffer,
    rhs: B::Buffer,
    dc: B::Buffer,
    t: B::Buffer,
    /// Per column: the gradient `J' f`, `diag(J' J)`, the damping, the step; `lambda`.
    jt_values: B::Buffer,
    jt_squared: B::Buffer,
    ones: B::Buffer,
    gradient: B::Buffer,
    diagonal: B::Buffer,
    dd: B::Buffer,
    lambda: B::Buffer,
    delta: B::Buffer,
    /// Per row `J delta`; scratch for the dot products and their results.
    jd: B::Buffer,
    parts: B::Buffer,
    scalars: B::Buffer,
    damping: Damping,
    s_host: Vec<f64>,
    scratch: MemBuffer,
}

/// Whether the device engine takes `problem` in `precision` on `backend`; the reason if not.
pub(super) fn applies<B: Backend>(
    backend: &B,
    problem: &Problem,
    precision: Precision,
) -> Result<(), String> {
    super::schur::applies(problem)?;
    if problem.has_manifolds() || problem.has_bounds() {
        return Err("the device Schur engine takes no manifolds or bounds".into());
    }
    let caps = backend.capabilities();
    let f64_ok = caps.f64.atomics
        && caps.f64.programs
        && [
            "fill", "copy", "unary", "binary", "reduce", "gather", "spmv_csr", "launch",
        ]
        .iter()
        .all(|op| caps.f64.primitive(op));
    if precision == Precision::F64 && !f64_ok {
        return Err(format!(
            "{} has no f64 atomics or primitives for the device Schur engine",
            backend.info().name
        ));
    }
    Ok(())
}

/// A group's [`Shape`] (every instance alike), and per instance its eliminated block
/// (`u32::MAX` for none) and reduced columns.
struct GroupLayout {
    shape: Shape,
    blocks: Vec<u32>,
    rcols: Vec<u32>,
}

/// Every group's [`GroupLayout`]; an error where instances of one group differ.
fn shapes(
    problem: &Problem,
    tangent: &crate::TangentSpace,
    first: usize,
    size: usize,
    count: usize,
    reduced_of: &[u32],
) -> Result<Vec<GroupLayout>, String> {
    let range = first..first + size * count;
    let mut out = Vec::new();
    for g in problem.groups() {
        let (p, slots) = (g.params_per_instance(), g.slots_per_instance());
        let mut shape: Option<Shape> = None;
        let mut blocks = Vec::with_capacity(g.len());
        let mut rcols = Vec::with_capacity(g.len() * p);
        for inst in g.param_index.chunks_exact(slots) {
            let mut eliminated = vec![usize::MAX; size];
            let mut reduced = Vec::new();
            let mut block = u32::MAX;
            for (pos, &index) in inst[..p].iter().enumerate() {
                let index = index as usize;
                if range.contains(&index) {
                    let k = index - first;
                    block = (k / size) as u32;
                    eliminated[k % size] = pos;
                } else {
                    reduced.push(pos);
                    rcols.push(reduced_of[tangent.col(index as u32) as usize]);
                }
            }
            let eliminated = if block == u32::MAX {
                Vec::new()
            } else if eliminated.contains(&usize::MAX) {
                return Err(format!(
                    "group {} reads part of an eliminated block; the device Schur engine \
                     takes whole blocks",
                    g.name
                ));
            } else {
                eliminated
            };
            let this = Shape {
                p,
                r: g.residuals_per_instance(),
                reduced,
                eliminated,
            };
            match &shape {
                None => shape = Some(this),
                Some(s) if *s == this => {}
                Some(_) => {
                    return Err(format!(
                        "the instances of group {} read their parameters in different roles",
                        g.name
                    ));
                }
            }
            blocks.push(block);
        }
        if let Some(shape) = shape {
            let nr = shape.reduced.len();
            rcols.truncate(g.len() * nr);
            out.push(GroupLayout {
                shape,
                blocks,
                rcols,
            });
        } else {
            out.push(GroupLayout {
                shape: Shape {
                    p,
                    r: g.residuals_per_instance(),
                    reduced: Vec::new(),
                    eliminated: Vec::new(),
                },
                blocks: Vec::new(),
                rcols: Vec::new(),
            });
        }
    }
    Ok(out)
}

impl<B: Backend> DeviceSchurEngine<B> {
    pub(super) fn new(compiled: CompiledProblem<B>, problem: &Problem) -> Result<Self, Error> {
        let started = Instant::now();
        let b = compiled.backend.clone();
        let precision = compiled.precision;
        applies(&b, problem, precision).map_err(Error::InvalidProblem)?;
        let dtype = precision.dtype();
        let (first, size, blocks) = problem.eliminated().expect("checked by applies");
        let tangent = &compiled.tangent;
        let n = tangent.cols;
        let first_col = tangent.col(first as u32) as usize;
        // Reduced columns: the free columns outside the eliminated range.
        let mut reduced_of = vec![FIXED; n];
        let mut rmap = Vec::new();
        for (c, place) in reduced_of.iter_mut().enumerate() {
            if !(first_col..first_col + size * blocks).contains(&c) && !tangent.fixed[c] {
                *place = rmap.len() as u32;
                rmap.push(c as u32);
            }
        }
        let reduced = rmap.len();
        if reduced == 0 {
            return Err(Error::InvalidProblem(
                "the device Schur engine needs at least one free column outside the \
                 eliminated blocks"
                    .into(),
            ));
        }
        let layouts = shapes(problem, tangent, first, size, blocks, &reduced_of)
            .map_err(Error::InvalidProblem)?;
        let upload_meta = |nnz0: usize| -> Result<B::Buffer, Error> {
            let m: [u32; meta::LEN] = [nnz0 as u32, reduced as u32, first_col as u32];
            Ok(b.upload(&m)?)
        };
        let mut groups = Vec::with_capacity(layouts.len());
        // Per eliminated block, the (group, instance) pairs that read it and some reduced
        // column (the others add nothing to `S`).
        let mut readers: Vec<Vec<(u32, u32)>> = vec![Vec::new(); blocks];
        let mut nnz0 = 0usize;
        for (gi, (layout, g)) in layouts.into_iter().zip(problem.groups()).enumerate() {
            let GroupLayout {
                shape,
                blocks: block_of,
                rcols,
            } = layout;
            let instances = g.len();
            let reads = if shape.eliminated.is_empty() {
                None
            } else {
                for (i, &e) in block_of.iter().enumerate() {
                    if !shape.reduced.is_empty() {
                        readers[e as usize].push((gi as u32, i as u32));
                    }
                }
                let nr = shape.reduced.len();
                Some(Reads {
                    block: b.upload(&block_of)?,
                    w: b.alloc(dtype, (instances * nr * size).max(1))?,
                    eliminate: b.compile(&kernels::eliminate(precision, &shape)?)?,
                    back_sum: b.compile(&kernels::back_sum(precision, &shape)?)?,
                })
            };
            let rcols = if rcols.is_empty() { vec![FIXED] } else { rcols };
            groups.push(Group {
                gram: b.compile(&kernels::gram(precision, &shape)?)?,
                meta: upload_meta(nnz0)?,
                rcol: b.upload(&rcols)?,
                instances,
                reads,
                shape,
            });
            nnz0 += instances * g.residuals_per_instance() * g.params_per_instance();
        }
        // The pairs, bucketed by their groups (the first group's index not above the second's).
        let mut buckets: std::collections::BTreeMap<(u32, u32), Vec<u32>> = Default::default();
        for (e, list) in readers.iter().enumerate() {
            for (a, &(g1, i1)) in list.iter().enumerate() {
                for &(g2, i2) in &list[a + 1..] {
                    let (x, y) = if g1 <= g2 {
                        ((g1, i1), (g2, i2))
                    } else {
                        ((g2, i2), (g1, i1))
                    };
                    buckets
                        .entry((x.0, y.0))
                        .or_default()
                        .extend_from_slice(&[x.1, y.1, e as u32]);
                }
            }
        }
        drop(readers);
        let mut pairs = Vec::with_capacity(buckets.len());
        for ((g1, g2), list) in buckets {
            let (g1, g2) = (g1 as usize, g2 as usize);
            let kernel = kernels::cross(precision, &groups[g1].shape, &groups[g2].shape)?;
            pairs.push(Pairs {
                first: g1,
                second: g2,
                count: list.len() / 3,
                pairs: b.upload(&list)?,
                kernel: b.compile(&kernel)?,
            });
        }
        let (rows, nnz) = (compiled.rows, compiled.nnz);
        let vec = |len: usize| b.alloc(dtype, len.max(1));
        let x = problem.parameters();
        let start = compiled.upload_floats(x)?;
        let scratch = MemBuffer::try_new(cholesky_in_place_scratch::<f64>(
            reduced,
            Par::rayon(0),
            Default::default(),
        ))
        .map_err(|_| Error::Solver("out of memory for the Schur scratch".into()))?;
        let mut engine = Self {
            it: Iterates::new(&compiled, vec(x.len())?, start)?,
            groups,
            pairs,
            size,
            blocks,
            reduced,
            meta: upload_meta(0)?,
            rmap: b.upload(&rmap)?,
            invert: b.compile(&kernels::invert(precision, size)?)?,
            damp: b.compile(&kernels::damp(precision)?)?,
            back_solve: b.compile(&kernels::back_solve(precision, size)?)?,
            scatter: b.compile(&kernels::scatter(precision)?)?,
            u: vec(reduced * reduced)?,
            s: vec(reduced * reduced)?,
            v: vec(blocks * size * size)?,
            minv: vec(blocks * size * size)?,
            y: vec(blocks * size)?,
            rhs: vec(reduced + 1)?,
            dc: vec(reduced)?,
            t: vec(blocks * size)?,
            jt_values: vec(nnz)?,
            jt_squared: vec(nnz)?,
            ones: {
                let o = vec(rows)?;
                b.fill(View::new(&o, &Layout::contiguous(&[rows.max(1)])), 1.0)?;
                o
            },
            gradient: vec(n)?,
            diagonal: vec(n)?,
            dd: vec(n)?,
            lambda: vec(1)?,
            delta: vec(n)?,
            jd: vec(rows)?,
            parts: vec(n.max(rows))?,
            scalars: vec(slot::LEN)?,
            damping: Damping::default(),
            s_host: vec![0.0; reduced * reduced],
            scratch,
            compiled,
        };
        // Its kernels and structure count as compilation.
        engine.it.times.compile = started.elapsed().as_secs_f64();
        engine.start(problem)?;
        Ok(engine)
    }

    fn csr<'a>(&'a self, values: &'a B::Buffer, transposed: bool) -> Csr<'a, B::Buffer> {
        let c = &self.compiled;
        if transposed {
            Csr {
                rows: c.cols,
                cols: c.rows,
                row_offsets: &c.t_row_offsets,
                col_indices: &c.t_col_indices,
                values,
            }
        } else {
            Csr {
                rows: c.rows,
                cols: c.cols,
                row_offsets: &c.row_offsets,
                col_indices: &c.col_indices,
                values,
            }
        }
    }

    fn zero(&self, buffer: &B::Buffer, len: usize) -> Result<(), Error> {
        let l = Layout::contiguous(&[len.max(1)]);
        Ok(self.compiled.backend.fill(View::new(buffer, &l), 0.0)?)
    }

    /// `scalars[at] = sum(a * b)` over `len` elements.
    fn dot_into(&self, a: &B::Buffer, b: &B::Buffer, len: usize, at: usize) -> Result<(), Error> {
        let be = &self.compiled.backend;
        let l = Layout::contiguous(&[len]);
        be.binary(
            BinaryOp::Mul,
            View::new(a, &l),
            View::new(b, &l),
            View::new(&self.parts, &l),
        )?;
        let out = Layout::strided(&[1], &[1], at)?;
        be.reduce(
            ReduceOp::Sum,
            View::new(&self.parts, &l),
            &[0],
            View::new(&self.scalars, &out),
        )?;
        Ok(())
    }

    /// Forms `S` and the reduced right-hand side on the device for `lambda`.
    fn form(&self, lambda: f64) -> Result<(), Error> {
        let be = &self.compiled.backend;
        let (n, e) = (self.reduced, self.blocks);
        self.compiled.write_floats(&self.lambda, &[lambda])?;
        let l = Layout::contiguous(&[n * n]);
        be.copy(View::new(&self.u, &l), View::new(&self.s, &l))?;
        let (m, r) = (&self.meta, &self.rhs);
        be.launch(
            &self.damp,
            &[
                m,
                &self.rmap,
                &self.dd,
                &self.gradient,
                &self.lambda,
                &self.s,
                r,
            ],
            n,
        )?;
        be.launch(
            &self.invert,
            &[
                m,
                &self.v,
                &self.dd,
                &self.gradient,
                &self.lambda,
                &self.minv,
                &self.y,
                r,
            ],
            e,
        )?;
        for g in &self.groups {
            if let Some(reads) = &g.reads {
                be.launch(
                    &reads.eliminate,
                    &[
                        m,
                        &g.rcol,
                        &reads.block,
                        &reads.w,
                        &self.minv,
                        &self.y,
                        &self.s,
                        r,
                    ],
                    g.instances,
                )?;
            }
        }
        for p in &self.pairs {
            let (g1, g2) = (&self.groups[p.first], &self.groups[p.second]);
            let (w1, w2) = match (&g1.reads, &g2.reads) {
                (Some(a), Some(b)) => (&a.w, &b.w),
                _ => unreachable!("pairs are of groups that read blocks"),
            };
            be.launch(
                &p.kernel,
                &[m, &p.pairs, &g1.rcol, &g2.rcol, w1, w2, &self.minv, &self.s],
                p.count,
            )?;
        }
        Ok(())
    }

    /// `delta` from the reduced step in `dc`: the eliminated blocks back-substituted, fixed
    /// columns 0.
    fn back_substitute(&self) -> Result<(), Error> {
        let be = &self.compiled.backend;
        self.zero(&self.t, self.blocks * self.size)?;
        for g in &self.groups {
            if let Some(reads) = &g.reads {
                be.launch(
                    &reads.back_sum,
                    &[&g.rcol, &reads.block, &reads.w, &self.dc, &self.t],
                    g.instances,
                )?;
            }
        }
        self.zero(&self.delta, self.compiled.cols)?;
        be.launch(
            &self.back_solve,
            &[&self.meta, &self.minv, &self.gradient, &self.t, &self.delta],
            self.blocks,
        )?;
        be.launch(
            &self.scatter,
            &[&self.rmap, &self.dc, &self.delta],
            self.reduced,
        )?;
        Ok(())
    }

    fn place_candidate(&self) -> Result<(), Error> {
        let l = Layout::contiguous(&[self.compiled.cols]);
        self.compiled.backend.binary(
            BinaryOp::Add,
            View::new(&self.it.x, &l),
            View::new(&self.delta, &l),
            View::new(&self.it.x_candidate, &l),
        )?;
        Ok(())
    }
}

impl<B: Backend> Engine for DeviceSchurEngine<B> {
    type B = B;
    type Point = B::Buffer;

    fn state(&self) -> &Iterates<B, B::Buffer> {
        &self.it
    }

    fn state_mut(&mut self) -> &mut Iterates<B, B::Buffer> {
        &mut self.it
    }

    fn compiled(&self) -> &CompiledProblem<B> {
        &self.compiled
    }

    fn evaluate_candidate(&mut self) -> Result<f64, Error> {
        self.compiled
            .evaluate(&self.it.x_candidate, &self.it.candidate)?;
        Ok(self.compiled.backend.read_f64(&self.it.candidate.total)?[0])
    }

    fn linearize(&mut self) -> Result<f64, Error> {
        let t = Instant::now();
        let be = self.compiled.backend.clone();
        let (n, nnz) = (self.compiled.cols, self.compiled.nnz);
        self.zero(&self.u, self.reduced * self.reduced)?;
        self.zero(&self.v, self.blocks * self.size * self.size)?;
        let jac = &self.it.current.jacobian;
        for g in &self.groups {
            let mut args = vec![&g.meta, jac, &g.rcol, &self.u];
            if let Some(reads) = &g.reads {
                args.extend([&reads.block, &self.v, &reads.w]);
            }
            be.launch(&g.gram, &args, g.instances)?;
        }
        let ln = Layout::contiguous(&[nnz]);
        be.gather(
            View::new(jac, &ln),
            0,
            View::new(&self.compiled.transpose_perm, &ln),
            View::new(&self.jt_values, &ln),
        )?;
        be.unary(
            UnaryOp::Square,
            View::new(&self.jt_values, &ln),
            View::new(&self.jt_squared, &ln),
        )?;
        let residuals = &self.it.current.residuals;
        be.spmv_csr(
            self.csr(&self.jt_values, true),
            residuals,
            &self.gradient,
            1.0,
            0.0,
        )?;
        be.spmv_csr(
            self.csr(&self.jt_squared, true),
            &self.ones,
            &self.diagonal,
            1.0,
            0.0,
        )?;
        let gradient = be.read_f64(&self.gradient)?;
        let diagonal = be.read_f64(&self.diagonal)?;
        let fixed = &self.compiled.tangent.fixed;
        self.damping.update(diagonal[..n].iter().copied());
        self.compiled
            .write_floats(&self.dd, &self.damping.diagonal)?;
        let gmax = gradient[..n]
            .iter()
            .zip(fixed)
            .filter(|(_, f)| !**f)
            .fold(0.0f64, |m, (g, _)| m.max(g.abs()));
        self.it.times.linearize += t.elapsed().as_secs_f64();
        Ok(gmax)
    }

    fn solve(&mut self, lambda: f64) -> Result<Step, Error> {
        let t = Instant::now();
        let be = self.compiled.backend.clone();
        let n = self.reduced;
        self.form(lambda)?;
        let mut rhs = be.read_f64(&self.rhs)?;
        let not_positive = |what: &str| {
            Error::NotPositiveDefinite(format!(
                "Schur complement failed ({what}): the damped normal matrix is not positive \
                 definite (lambda = {lambda:e}); a parameter no residual constrains?"
            ))
        };
        if rhs[n] != 0.0 {
            self.it.times.linear_solve += t.elapsed().as_secs_f64();
            return Err(not_positive("an eliminated block"));
        }
        rhs.truncate(n);
        self.s_host = be.read_f64(&self.s)?;
        super::schur::cholesky(&mut self.s_host, n, &mut self.scratch)
            .map_err(|k| not_positive(&format!("reduced system, pivot {k}")))?;
        cholesky_solve(&self.s_host, n, &mut rhs);
        self.compiled.write_floats(&self.dc, &rhs)?;
        self.back_substitute()?;
        self.place_candidate()?;
        // -g.delta - |J delta|^2 / 2, and the norms.
        let (cols, rows) = (self.compiled.cols, self.compiled.rows);
        be.spmv_csr(
            self.csr(&self.it.current.jacobian, false),
            &self.delta,
            &self.jd,
            1.0,
            0.0,
        )?;
        self.dot_into(&self.jd, &self.jd, rows, slot::JD2)?;
        self.dot_into(&self.gradient, &self.delta, cols, slot::GD)?;
        self.dot_into(&self.delta, &self.delta, cols, slot::DD)?;
        self.dot_into(&self.it.x, &self.it.x, cols, slot::XX)?;
        let s = be.read_f64(&self.scalars)?;
        self.it.times.linear_solve += t.elapsed().as_secs_f64();
        Ok(Step {
            model_reduction: -s[slot::GD] - 0.5 * s[slot::JD2],
            step_norm: s[slot::DD].sqrt(),
            x_norm: s[slot::XX].sqrt(),
            cg_iterations: 0,
        })
    }

    fn scale_step(&mut self, factor: f64) -> Result<(), Error> {
        let l = Layout::contiguous(&[self.compiled.cols]);
        self.compiled.backend.unary(
            UnaryOp::Affine {
                scale: factor as f32,
                shift: 0.0,
            },
            View::new(&self.delta, &l),
            View::new(&self.delta, &l),
        )?;
        self.place_candidate()
    }

    fn set_scaling(&mut self, scaling: super::Scaling) {
        self.damping.scaling = scaling;
    }

    fn parameters(&self) -> Result<Vec<f64>, Error> {
        let mut x = self.compiled.backend.read_f64(&self.it.x)?;
        x.truncate(self.compiled.tangent.parameters());
        Ok(x)
    }
}
