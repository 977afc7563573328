//! The device Schur engines: Ceres's `DENSE_SCHUR` ([`super::LinearSolver::DeviceSchur`])
//! and `ITERATIVE_SCHUR` ([`super::LinearSolver::IterativeSchur`]) with the linear algebra on
//! the device. The point (parameters, step, gradient) stays there. Per linearization, kernels
//! generated for each residual shape add each instance's Gram matrix into `V` (one small block
//! per eliminated block) and keep its `W_i = J_reduced' J_eliminated`, and for the dense
//! engine its reduced part into `U`. Per solve, a kernel inverts `V + lambda D` block by block
//! and the reduced right-hand side gathers `W V^-1 g_e`; then the reduced system `S dc = rhs`,
//! `S = U + lambda D - W V^-1 W'`, is solved
//! - dense ([`dense`]): `S` formed on the device pair of instances by pair of instances
//!   (atomically), read back and factorised on the host; or
//! - iteratively ([`pcg`]): conjugate gradients on the device with `S` applied through `J` and
//!   the `W_i` without being formed, preconditioned by the inverses of `S`'s diagonal blocks
//!   (a camera's columns: Ceres's Schur-Jacobi);
//!
//! and the device back-substitutes the eliminated blocks. What crosses the bus per iteration
//! is a few scalars (and for the dense engine the reduced system).
//!
//! They take what [`super::schur`] takes, without manifolds or bounds, where the backend adds
//! atomically in the solve's precision; sums of atomics land in any order, so results may
//! differ in their last bits from run to run.

mod dense;
mod kernels;
mod layout;
mod pcg;
mod pcg_kernels;

use super::host::Damping;
use super::kernel::compile_all;
use super::normal::{Transposed, dot_into};
use super::{Engine, Iterates, SolveOptions, Step};
use crate::compile::CompiledProblem;
use crate::problem::Problem;
use crate::{Error, Precision};
use hal::{Backend, BackendExt, BinaryOp, Layout, UnaryOp, View};
use kernels::{FIXED, Layout as Shape, meta};
use layout::GroupLayout;
use web_time::Instant;

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

/// Scalars read back after a solve, in one buffer.
mod slot {
    pub const JD2: usize = 0;
    pub const GD: usize = 1;
    pub const DD: usize = 2;
    pub const XX: usize = 3;
    pub const LEN: usize = 4;
}

/// What both engines hold: the problem on the device, its groups, the eliminated blocks' state
/// and the per-column vectors.
struct Shared<B: Backend> {
    compiled: CompiledProblem<B>,
    it: Iterates<B, B::Buffer>,
    groups: Vec<Group<B>>,
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
    /// `V` and its damped inverses (`blocks x size^2`), `y = M^-1 g_e`, the right-hand side
    /// (with the failure flag after it), the reduced step and the back substitution's sums.
    v: B::Buffer,
    minv: B::Buffer,
    y: B::Buffer,
    rhs: B::Buffer,
    dc: B::Buffer,
    t: B::Buffer,
    /// `J'` on the device; per column the gradient `J' f`, `diag(J' J)`, the damping, the
    /// step; `lambda`.
    jt: Transposed<B>,
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
}

/// How the reduced system is solved.
enum Reduced<B: Backend> {
    Dense(dense::Dense<B>),
    Iterative(pcg::Pcg<B>),
}

pub(super) struct DeviceSchurEngine<B: Backend> {
    sh: Shared<B>,
    reduced: Reduced<B>,
}

/// Whether the device engines take `problem` in `precision` on `backend`; the reason if not.
pub(super) fn applies<B: Backend>(
    backend: &B,
    problem: &Problem,
    precision: Precision,
) -> Result<(), String> {
    super::schur::applies(problem)?;
    if problem.has_manifolds() || problem.has_bounds() {
        return Err("the device Schur engines take no manifolds or bounds".into());
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
            "{} has no f64 atomics or primitives for the device Schur engines",
            backend.info().name
        ));
    }
    Ok(())
}

impl<B: Backend> DeviceSchurEngine<B> {
    /// The dense engine (`iterative` false) or the iterative one.
    pub(super) fn new(
        compiled: CompiledProblem<B>,
        problem: &Problem,
        options: &SolveOptions,
        iterative: bool,
    ) -> Result<Self, Error> {
        let started = Instant::now();
        let b = compiled.backend.clone();
        let precision = compiled.precision;
        applies(&b, problem, precision).map_err(Error::InvalidProblem)?;
        let dense = !iterative;
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
                "the device Schur engines need at least one free column outside the \
                 eliminated blocks"
                    .into(),
            ));
        }
        let layouts = layout::shapes(problem, tangent, first, size, blocks, &reduced_of)
            .map_err(Error::InvalidProblem)?;
        let upload_meta = |nnz0: usize| -> Result<B::Buffer, Error> {
            let m: [u32; meta::LEN] = [nnz0 as u32, reduced as u32, first_col as u32];
            Ok(b.upload(&m)?)
        };
        // Every kernel's program first, then all compiled at once.
        let mut programs = vec![
            kernels::invert(precision, size)?,
            kernels::damp(precision, dense)?,
            kernels::back_solve(precision, size)?,
            kernels::scatter(precision)?,
        ];
        for l in &layouts {
            programs.push(kernels::gram(precision, &l.shape, dense)?);
            if !l.shape.eliminated.is_empty() {
                programs.push(kernels::eliminate(precision, &l.shape, dense)?);
                programs.push(kernels::back_sum(precision, &l.shape)?);
            }
        }
        let mut built = compile_all(&b, &programs)?.into_iter();
        let mut next = || built.next().expect("a kernel per program");
        let (invert, damp, back_solve, scatter) = (next(), next(), next(), next());
        let mut groups = Vec::with_capacity(layouts.len());
        let mut nnz0 = 0usize;
        for (layout, g) in layouts.iter().zip(problem.groups()) {
            let GroupLayout {
                shape,
                blocks: block_of,
                rcols,
            } = layout;
            let instances = g.len();
            let gram = next();
            let reads = if shape.eliminated.is_empty() {
                None
            } else {
                let nr = shape.reduced.len();
                Some(Reads {
                    block: b.upload(block_of)?,
                    w: b.alloc(dtype, (instances * nr * size).max(1))?,
                    eliminate: next(),
                    back_sum: next(),
                })
            };
            let rcols = if rcols.is_empty() {
                &[FIXED][..]
            } else {
                rcols
            };
            groups.push(Group {
                gram,
                meta: upload_meta(nnz0)?,
                rcol: b.upload(rcols)?,
                instances,
                reads,
                shape: shape.clone(),
            });
            nnz0 += instances * g.residuals_per_instance() * g.params_per_instance();
        }
        let rows = compiled.rows;
        let vec = |len: usize| b.alloc(dtype, len.max(1));
        let x = problem.parameters();
        let start = compiled.upload_floats(x)?;
        let sh = Shared {
            it: Iterates::new(&compiled, vec(x.len())?, start)?,
            groups,
            size,
            blocks,
            reduced,
            meta: upload_meta(0)?,
            rmap: b.upload(&rmap)?,
            invert,
            damp,
            back_solve,
            scatter,
            v: vec(blocks * size * size)?,
            minv: vec(blocks * size * size)?,
            y: vec(blocks * size)?,
            rhs: vec(reduced + 1)?,
            dc: vec(reduced)?,
            t: vec(blocks * size)?,
            jt: Transposed::new(&compiled)?,
            gradient: vec(n)?,
            diagonal: vec(n)?,
            dd: vec(n)?,
            lambda: vec(1)?,
            delta: vec(n)?,
            jd: vec(rows)?,
            parts: vec(n.max(rows))?,
            scalars: vec(slot::LEN)?,
            damping: Damping::default(),
            compiled,
        };
        let reduced_solver = if iterative {
            Reduced::Iterative(pcg::Pcg::new(&sh, &layouts, options)?)
        } else {
            Reduced::Dense(dense::Dense::new(&sh, &layouts)?)
        };
        let mut engine = Self {
            sh,
            reduced: reduced_solver,
        };
        // Its kernels and structure count as compilation.
        engine.sh.it.times.compile = started.elapsed().as_secs_f64();
        Ok(engine)
    }
}

impl<B: Backend> Shared<B> {
    fn backend(&self) -> &B {
        &self.compiled.backend
    }

    fn zero(&self, buffer: &B::Buffer, len: usize) -> Result<(), Error> {
        let l = Layout::contiguous(&[len.max(1)]);
        Ok(self.backend().fill(View::new(buffer, &l), 0.0)?)
    }

    /// The right-hand side `-g_c + W V^-1 g_e` and the blocks' damped inverses for the
    /// `lambda` in `self.lambda`; with `s` (the dense engine's `S`, holding `U`), also `S +=
    /// lambda D_c - W_i M^-1 W_i'` per instance.
    fn eliminate(&self, s: Option<&B::Buffer>) -> Result<(), Error> {
        let be = self.backend();
        let (m, r) = (&self.meta, &self.rhs);
        let mut args = vec![m, &self.rmap, &self.dd, &self.gradient, &self.lambda, r];
        args.extend(s);
        be.launch(&self.damp, &args, self.reduced)?;
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
            self.blocks,
        )?;
        for g in &self.groups {
            if let Some(reads) = &g.reads {
                let mut args = vec![m, &g.rcol, &reads.block, &reads.w, &self.minv, &self.y, r];
                args.extend(s);
                be.launch(&reads.eliminate, &args, g.instances)?;
            }
        }
        Ok(())
    }

    /// `t_e = sum_i W_i' x` over the instances reading each block (`x` over reduced columns).
    fn block_sums(&self, x: &B::Buffer, t: &B::Buffer) -> Result<(), Error> {
        self.zero(t, self.blocks * self.size)?;
        for g in &self.groups {
            if let Some(reads) = &g.reads {
                self.backend().launch(
                    &reads.back_sum,
                    &[&g.rcol, &reads.block, &reads.w, x, t],
                    g.instances,
                )?;
            }
        }
        Ok(())
    }

    /// `delta` from the reduced step in `dc`: the eliminated blocks back-substituted, fixed
    /// columns 0.
    fn back_substitute(&self) -> Result<(), Error> {
        let be = self.backend();
        self.block_sums(&self.dc, &self.t)?;
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
        self.backend().binary(
            BinaryOp::Add,
            View::new(&self.it.x, &l),
            View::new(&self.delta, &l),
            View::new(&self.it.x_candidate, &l),
        )?;
        Ok(())
    }

    /// The step's model reduction `-g.delta - |J delta|^2 / 2` and norms, one read.
    async fn step(&self, linear_iterations: usize) -> Result<Step, Error> {
        let be = self.backend();
        let (cols, rows) = (self.compiled.cols, self.compiled.rows);
        let jacobian = self.compiled.jacobian_csr(&self.it.current.jacobian);
        be.spmv_csr(jacobian, &self.delta, &self.jd, 1.0, 0.0)?;
        let (p, sc) = (&self.parts, &self.scalars);
        dot_into(be, (&self.jd, &self.jd), rows, p, sc, slot::JD2)?;
        dot_into(be, (&self.gradient, &self.delta), cols, p, sc, slot::GD)?;
        dot_into(be, (&self.delta, &self.delta), cols, p, sc, slot::DD)?;
        dot_into(be, (&self.it.x, &self.it.x), cols, p, sc, slot::XX)?;
        let s = be.read_f64_async(&self.scalars).await?;
        Ok(Step {
            model_reduction: -s[slot::GD] - 0.5 * s[slot::JD2],
            step_norm: s[slot::DD].sqrt(),
            x_norm: s[slot::XX].sqrt(),
            cg_iterations: linear_iterations,
        })
    }

    fn not_positive(lambda: f64, what: &str) -> Error {
        Error::NotPositiveDefinite(format!(
            "Schur complement failed ({what}): the damped normal matrix is not positive \
             definite (lambda = {lambda:e}); a parameter no residual constrains?"
        ))
    }
}

impl<B: Backend> DeviceSchurEngine<B> {
    /// The points' steps from the cameras', the candidate placed, the step's norms read.
    async fn finish_step(&self, linear_iterations: usize) -> Result<Step, Error> {
        self.sh.back_substitute()?;
        self.sh.place_candidate()?;
        self.sh.step(linear_iterations).await
    }
}

impl<B: Backend> Engine for DeviceSchurEngine<B> {
    type B = B;
    type Point = B::Buffer;

    fn state(&self) -> &Iterates<B, B::Buffer> {
        &self.sh.it
    }

    fn state_mut(&mut self) -> &mut Iterates<B, B::Buffer> {
        &mut self.sh.it
    }

    fn compiled(&self) -> &CompiledProblem<B> {
        &self.sh.compiled
    }

    async fn evaluate_candidate(&mut self) -> Result<f64, Error> {
        let sh = &self.sh;
        sh.compiled.evaluate(&sh.it.x_candidate, &sh.it.candidate)?;
        Ok(sh.backend().read_f64_async(&sh.it.candidate.total).await?[0])
    }

    async fn linearize(&mut self) -> Result<f64, Error> {
        let t = Instant::now();
        let sh = &mut self.sh;
        let be = sh.compiled.backend.clone();
        let n = sh.compiled.cols;
        let u = match &self.reduced {
            Reduced::Dense(d) => {
                sh.zero(&d.u, sh.reduced * sh.reduced)?;
                Some(&d.u)
            }
            Reduced::Iterative(_) => None,
        };
        sh.zero(&sh.v, sh.blocks * sh.size * sh.size)?;
        let jac = &sh.it.current.jacobian;
        for g in &sh.groups {
            let mut args = vec![&g.meta, jac, &g.rcol];
            args.extend(u);
            if let Some(reads) = &g.reads {
                args.extend([&reads.block, &sh.v, &reads.w]);
            }
            be.launch(&g.gram, &args, g.instances)?;
        }
        sh.jt
            .linearize(&sh.compiled, &sh.it.current, &sh.gradient, &sh.diagonal)?;
        let gradient = be.read_f64_async(&sh.gradient).await?;
        let diagonal = be.read_f64_async(&sh.diagonal).await?;
        let fixed = &sh.compiled.tangent.fixed;
        sh.damping.update(diagonal[..n].iter().copied());
        sh.compiled.write_floats(&sh.dd, &sh.damping.diagonal)?;
        let gmax = gradient[..n]
            .iter()
            .zip(fixed)
            .filter(|(_, f)| !**f)
            .fold(0.0f64, |m, (g, _)| m.max(g.abs()));
        sh.it.times.linearize += t.elapsed().as_secs_f64();
        Ok(gmax)
    }

    async fn solve(&mut self, lambda: f64) -> Result<Step, Error> {
        let t = Instant::now();
        self.sh.compiled.write_floats(&self.sh.lambda, &[lambda])?;
        let solved = match &mut self.reduced {
            Reduced::Dense(d) => d.solve(&self.sh, lambda).await.map(|()| 0),
            Reduced::Iterative(p) => p.solve(&self.sh, lambda).await,
        };
        let step = match solved {
            Ok(iterations) => self.finish_step(iterations).await,
            Err(e) => Err(e),
        };
        self.sh.it.times.linear_solve += t.elapsed().as_secs_f64();
        step
    }

    async fn scale_step(&mut self, factor: f64) -> Result<(), Error> {
        let sh = &self.sh;
        let l = Layout::contiguous(&[sh.compiled.cols]);
        sh.backend().unary(
            UnaryOp::Affine {
                scale: factor as f32,
                shift: 0.0,
            },
            View::new(&sh.delta, &l),
            View::new(&sh.delta, &l),
        )?;
        sh.place_candidate()
    }

    fn set_scaling(&mut self, scaling: super::Scaling) {
        self.sh.damping.scaling = scaling;
    }

    async fn parameters(&self) -> Result<Vec<f64>, Error> {
        let sh = &self.sh;
        let mut x = sh.backend().read_f64_async(&sh.it.x).await?;
        x.truncate(sh.compiled.tangent.parameters());
        Ok(x)
    }
}
