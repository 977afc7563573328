//! The device engine: Jacobi-preconditioned conjugate gradients on the device, from CSR
//! mat-vecs on `J` and `J^T` and small IR kernels that keep the CG scalars on the device,
//! in the solve's precision (every vector and scalar `f64` or `f32`).

use super::kernel::Kernel;
use super::normal::{Transposed, dot_into, sum_into};
use super::{Engine, Iterates, SolveOptions, Step};
use crate::compile::CompiledProblem;
use crate::problem::Problem;
use crate::{Error, Precision};
use hal::ir::Program;
use hal::{Backend, BackendExt, BinaryOp, Layout, ReduceOp, UnaryOp, View};
use web_time::Instant;

/// Scalars the CG kernels share, in one small device buffer.
mod slot {
    pub const RZ: u32 = 0;
    pub const PQ: u32 = 1;
    pub const ALPHA: u32 = 2;
    pub const RZ_NEW: u32 = 3;
    pub const LAMBDA: u32 = 4;
    pub const JD2: u32 = 5;
    pub const GD: u32 = 6;
    pub const GMAX: u32 = 7;
    /// 1 once the damping's scaling is monotone (`Scaling::Monotone`), else 0.
    pub const MONOTONE: u32 = 8;
    pub const LEN: usize = 9;
}

struct CgKernels<B: Backend> {
    scale: B::Kernel,
    start: B::Kernel,
    q: B::Kernel,
    alpha: B::Kernel,
    update: B::Kernel,
    beta: B::Kernel,
    direction: B::Kernel,
}

/// The most buffers one of the engine's kernels binds in `precision` (what
/// [`hal::Capabilities::program_buffers`] must allow).
pub(super) fn kernel_buffers(precision: Precision) -> usize {
    cg_programs(precision).map_or(usize::MAX, |ps| {
        ps.iter().map(|p| p.buffers.len()).max().unwrap_or(0)
    })
}

fn cg_programs(p: Precision) -> hal::Result<[Program; 7]> {
    Ok([
        cg_scale(p)?,
        cg_start(p)?,
        cg_q(p)?,
        cg_alpha(p)?,
        cg_update(p)?,
        cg_beta(p)?,
        cg_direction(p)?,
    ])
}

/// The damping and preconditioner of one outer step: dd = max(clamp(diag, 1e-6, 1e32),
/// floor), `floor` Ceres's (from the first call's diagonal), or once monotone the largest
/// clamped diagonal so far (`peak`, kept in either mode: see `Scaling`); M = diag + lambda dd
/// (1 when fixed); damp = lambda dd m; minv = m / M. Apart from [`cg_start`] so that neither
/// binds more than 8 buffers (a browser's WebGPU may allow no more).
fn cg_scale(precision: Precision) -> hal::Result<Program> {
    let k = Kernel::new("lm_cg_scale", precision);
    let s = &k.s;
    let (diag, mask, scal) = (k.read(), k.read(), k.read());
    let (floors, peaks) = (k.read_write(), k.read_write());
    let (damp, minv) = (k.write(), k.write());
    let i = s.index();
    let lambda = s.load(scal, s.u32(slot::LAMBDA));
    let monotone = s.load(scal, s.u32(slot::MONOTONE));
    let (di, mi) = (s.load(diag, i), s.load(mask, i));
    let zero = k.float(0.0);
    // 0 until the first call sets Ceres's floor (which is positive).
    let stored = s.load(floors, i);
    let root = di.max(zero).sqrt() + 1.0;
    let floor = stored.gt(zero).select(stored, root * root * 1e-6);
    s.store(floors, i, floor);
    let clamped = di.max(k.float(1e-6)).min(k.float(1e32));
    let peak = s.load(peaks, i).max(clamped);
    s.store(peaks, i, peak);
    let dd = monotone.gt(zero).select(peak, clamped.max(floor));
    let m_diag = mi.gt(zero).select(lambda.fma(dd, di), k.float(1.0));
    s.store(damp, i, lambda * dd * mi);
    s.store(minv, i, mi / m_diag);
    k.s.build()
}

/// r = -g m; z = r minv; p = z; delta = 0; parts = r z (after [`cg_scale`]).
fn cg_start(precision: Precision) -> hal::Result<Program> {
    let k = Kernel::new("lm_cg_start", precision);
    let s = &k.s;
    let (g, mask, minv) = (k.read(), k.read(), k.read());
    let [r, z, p, delta, parts] = [(); 5].map(|_| k.write());
    let i = s.index();
    let ri = -s.load(g, i) * s.load(mask, i);
    let zi = ri * s.load(minv, i);
    s.store(r, i, ri);
    s.store(z, i, zi);
    s.store(p, i, zi);
    s.store(delta, i, k.float(0.0));
    s.store(parts, i, ri * zi);
    k.s.build()
}

/// q = m (q + damp p); parts = p q.
fn cg_q(precision: Precision) -> hal::Result<Program> {
    let k = Kernel::new("lm_cg_q", precision);
    let s = &k.s;
    let (q, p, damp, mask, parts) = (k.read_write(), k.read(), k.read(), k.read(), k.write());
    let i = s.index();
    let pi = s.load(p, i);
    let qn = s.load(damp, i).fma(pi, s.load(q, i)) * s.load(mask, i);
    s.store(q, i, qn);
    s.store(parts, i, pi * qn);
    k.s.build()
}

/// alpha = pq > 0 ? rz / pq : 0 (one thread).
fn cg_alpha(precision: Precision) -> hal::Result<Program> {
    let k = Kernel::new("lm_cg_alpha", precision);
    let scal = k.read_write();
    let ratio = k.safe_ratio(scal, slot::RZ, slot::PQ);
    k.s.store(scal, k.s.u32(slot::ALPHA), ratio);
    k.s.build()
}

/// delta += alpha p; r -= alpha q; z = r minv; parts = r z.
fn cg_update(precision: Precision) -> hal::Result<Program> {
    let k = Kernel::new("lm_cg_update", precision);
    let s = &k.s;
    let (delta, r, z) = (k.read_write(), k.read_write(), k.write());
    let (p, q, minv, scal, parts) = (k.read(), k.read(), k.read(), k.read(), k.write());
    let i = s.index();
    let alpha = s.load(scal, s.u32(slot::ALPHA));
    s.store(delta, i, alpha.fma(s.load(p, i), s.load(delta, i)));
    let rn = (-alpha).fma(s.load(q, i), s.load(r, i));
    s.store(r, i, rn);
    let zn = rn * s.load(minv, i);
    s.store(z, i, zn);
    s.store(parts, i, rn * zn);
    k.s.build()
}

/// beta = rz_new / rz; rz = rz_new (one thread). Alpha is dead until the next q: beta takes
/// its slot.
fn cg_beta(precision: Precision) -> hal::Result<Program> {
    let k = Kernel::new("lm_cg_beta", precision);
    let s = &k.s;
    let scal = k.read_write();
    s.store(
        scal,
        s.u32(slot::ALPHA),
        k.safe_ratio(scal, slot::RZ_NEW, slot::RZ),
    );
    let rz_new = s.load(scal, s.u32(slot::RZ_NEW));
    s.store(scal, s.u32(slot::RZ), rz_new);
    k.s.build()
}

/// p = z + beta p.
fn cg_direction(precision: Precision) -> hal::Result<Program> {
    let k = Kernel::new("lm_cg_direction", precision);
    let s = &k.s;
    let (p, z, scal) = (k.read_write(), k.read(), k.read());
    let i = s.index();
    let beta = s.load(scal, s.u32(slot::ALPHA));
    s.store(p, i, beta.fma(s.load(p, i), s.load(z, i)));
    k.s.build()
}

pub(super) struct DeviceEngine<B: Backend> {
    compiled: CompiledProblem<B>,
    kernels: CgKernels<B>,
    options: SolveOptions,
    it: Iterates<B, B::Buffer>,
    jt: Transposed<B>,
    mask: B::Buffer,
    gradient: B::Buffer,
    diagonal: B::Buffer,
    /// Per parameter, Ceres's floor under the damping's scaling and the largest clamped
    /// diagonal so far (see `Scaling`).
    scaling: B::Buffer,
    peaks: B::Buffer,
    /// Whether the scaling is monotone.
    monotone: bool,
    delta: B::Buffer,
    r: B::Buffer,
    z: B::Buffer,
    p: B::Buffer,
    q: B::Buffer,
    t: B::Buffer,
    damp: B::Buffer,
    minv: B::Buffer,
    parts: B::Buffer,
    scalars: B::Buffer,
    /// Per parameter, its bounds (in f32 rounded inwards), where any parameter has a finite
    /// one: steps are projected onto them.
    bounds: Option<(B::Buffer, B::Buffer)>,
}

impl<B: Backend> DeviceEngine<B> {
    pub(super) fn new(
        compiled: CompiledProblem<B>,
        problem: &Problem,
        options: &SolveOptions,
    ) -> Result<Self, Error> {
        let b = compiled.backend.clone();
        let precision = compiled.precision;
        let dtype = precision.dtype();
        let programs = cg_programs(precision)?;
        let kernels = CgKernels {
            scale: b.compile(&programs[0])?,
            start: b.compile(&programs[1])?,
            q: b.compile(&programs[2])?,
            alpha: b.compile(&programs[3])?,
            update: b.compile(&programs[4])?,
            beta: b.compile(&programs[5])?,
            direction: b.compile(&programs[6])?,
        };
        let (n, rows) = (compiled.cols.max(1), compiled.rows);
        let vec_n = || b.alloc(dtype, n);
        let x = problem.parameters();
        if !compiled.tangent.is_identity() && problem.has_bounds() {
            return Err(Error::InvalidOptions(
                "bounds together with manifold blocks need LinearSolver::SparseCholesky".into(),
            ));
        }
        let mask: Vec<f64> = compiled
            .tangent
            .fixed
            .iter()
            .map(|&f| if f { 0.0 } else { 1.0 })
            .collect();
        // The start goes in as the candidate: `start` evaluates it and makes it current.
        let start = compiled.upload_floats(x)?;
        let engine = Self {
            it: Iterates::new(&compiled, b.alloc(dtype, x.len().max(1))?, start)?,
            jt: Transposed::new(&compiled)?,
            mask: compiled.upload_floats(&mask)?,
            gradient: vec_n()?,
            diagonal: vec_n()?,
            scaling: vec_n()?,
            peaks: vec_n()?,
            monotone: false,
            delta: vec_n()?,
            r: vec_n()?,
            z: vec_n()?,
            p: vec_n()?,
            q: vec_n()?,
            t: b.alloc(dtype, rows.max(1))?,
            damp: vec_n()?,
            minv: vec_n()?,
            parts: b.alloc(dtype, n.max(rows))?,
            scalars: b.alloc(dtype, slot::LEN)?,
            bounds: match problem.has_bounds() {
                true => {
                    // In f32, rounded inwards (a step never leaves the feasible set).
                    let (lo, hi): (Vec<f64>, Vec<f64>) = (0..problem.parameters().len())
                        .map(|i| {
                            let (lo, hi) = problem.bounds(i);
                            match precision {
                                Precision::F64 => (lo, hi),
                                Precision::F32 => (f32_at_least(lo) as f64, f32_at_most(hi) as f64),
                            }
                        })
                        .unzip();
                    let up = |v: &[f64]| compiled.upload_floats(v);
                    Some((up(&lo)?, up(&hi)?))
                }
                false => None,
            },
            options: options.clone(),
            kernels,
            compiled,
        };
        Ok(engine)
    }

    /// `x_candidate = x + delta`, projected onto the bounds where there are any, and `delta`
    /// made the projected step.
    async fn place_candidate(&self) -> Result<(), Error> {
        let be = &self.compiled.backend;
        if !self.compiled.tangent.is_identity() {
            // Manifold blocks move by their `plus`, on the host (no bounds here: `new`).
            let x = be.read_f64_async(&self.it.x).await?;
            let delta = be.read_f64_async(&self.delta).await?;
            let mut candidate = x.clone();
            let cols = self.compiled.cols;
            self.compiled
                .tangent
                .plus(&x, &delta[..cols], &mut candidate);
            return self.compiled.write_floats(&self.it.x_candidate, &candidate);
        }
        let l = Layout::contiguous(&[self.compiled.cols]);
        let v = |b| View::new(b, &l);
        let candidate = &self.it.x_candidate;
        be.binary(BinaryOp::Add, v(&self.it.x), v(&self.delta), v(candidate))?;
        if let Some((lo, hi)) = &self.bounds {
            be.binary(BinaryOp::Max, v(candidate), v(lo), v(candidate))?;
            be.binary(BinaryOp::Min, v(candidate), v(hi), v(candidate))?;
            be.binary(BinaryOp::Sub, v(candidate), v(&self.it.x), v(&self.delta))?;
        }
        Ok(())
    }

    /// `scalars[at] = sum(a * b)` over `len` elements (`parts` as scratch).
    fn dot_into(&self, a: &B::Buffer, b: &B::Buffer, len: usize, at: u32) -> Result<(), Error> {
        let be = &self.compiled.backend;
        dot_into(be, (a, b), len, &self.parts, &self.scalars, at as usize)
    }

    fn sum_parts_into(&self, len: usize, at: u32) -> Result<(), Error> {
        sum_into(
            &self.compiled.backend,
            &self.parts,
            len,
            &self.scalars,
            at as usize,
        )
    }
}

impl<B: Backend> Engine for DeviceEngine<B> {
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

    /// The cost summed on the device; one scalar read.
    async fn evaluate_candidate(&mut self) -> Result<f64, Error> {
        self.compiled
            .evaluate(&self.it.x_candidate, &self.it.candidate)?;
        Ok(self
            .compiled
            .backend
            .read_f64_async(&self.it.candidate.total)
            .await?[0])
    }

    async fn linearize(&mut self) -> Result<f64, Error> {
        let t = Instant::now();
        let be = self.compiled.backend.clone();
        let n = self.compiled.cols;
        let it = &self.it;
        self.jt
            .linearize(&self.compiled, &it.current, &self.gradient, &self.diagonal)?;
        // max |g| over the free parameters; with bounds, Ceres's projected form
        // max |x - P(x - g)| (`P` the projection onto the bounds: 0 at a minimum on a bound).
        let l = Layout::contiguous(&[n]);
        be.binary(
            BinaryOp::Mul,
            View::new(&self.gradient, &l),
            View::new(&self.mask, &l),
            View::new(&self.parts, &l),
        )?;
        if let Some((lo, hi)) = &self.bounds {
            let v = |b| View::new(b, &l);
            let (x, q, parts) = (&self.it.x, &self.q, &self.parts);
            be.binary(BinaryOp::Sub, v(x), v(parts), v(q))?;
            be.binary(BinaryOp::Max, v(q), v(lo), v(q))?;
            be.binary(BinaryOp::Min, v(q), v(hi), v(q))?;
            be.binary(BinaryOp::Sub, v(x), v(q), v(parts))?;
        }
        be.unary(
            UnaryOp::Abs,
            View::new(&self.parts, &l),
            View::new(&self.parts, &l),
        )?;
        let out = Layout::strided(&[1], &[1], slot::GMAX as usize)?;
        be.reduce(
            ReduceOp::Max,
            View::new(&self.parts, &l),
            &[0],
            View::new(&self.scalars, &out),
        )?;
        let s = be.read_f64_async(&self.scalars).await?;
        self.it.times.linearize += t.elapsed().as_secs_f64();
        Ok(s[slot::GMAX as usize])
    }

    async fn solve(&mut self, lambda: f64) -> Result<Step, Error> {
        let t = Instant::now();
        let be = self.compiled.backend.clone();
        let (n, rows) = (self.compiled.cols, self.compiled.rows);
        let k = &self.kernels;
        let mut scalars_init = [0.0; slot::LEN];
        scalars_init[slot::LAMBDA as usize] = lambda;
        scalars_init[slot::MONOTONE as usize] = self.monotone as u8 as f64;
        self.compiled.write_floats(&self.scalars, &scalars_init)?;
        be.launch(
            &k.scale,
            &[
                &self.diagonal,
                &self.mask,
                &self.scalars,
                &self.scaling,
                &self.peaks,
                &self.damp,
                &self.minv,
            ],
            n,
        )?;
        be.launch(
            &k.start,
            &[
                &self.gradient,
                &self.mask,
                &self.minv,
                &self.r,
                &self.z,
                &self.p,
                &self.delta,
                &self.parts,
            ],
            n,
        )?;
        self.sum_parts_into(n, slot::RZ)?;
        let rz0 = be.read_f64_async(&self.scalars).await?[slot::RZ as usize];
        let target = rz0 * self.options.cg_tolerance * self.options.cg_tolerance;
        let mut iterations = 0;
        if rz0 > 0.0 {
            while iterations < self.options.max_cg_iterations {
                be.spmv_csr(
                    self.compiled.jacobian_csr(&self.it.current.jacobian),
                    &self.p,
                    &self.t,
                    1.0,
                    0.0,
                )?;
                be.spmv_csr(
                    self.compiled.transpose_csr(&self.jt.values),
                    &self.t,
                    &self.q,
                    1.0,
                    0.0,
                )?;
                be.launch(
                    &k.q,
                    &[&self.q, &self.p, &self.damp, &self.mask, &self.parts],
                    n,
                )?;
                self.sum_parts_into(n, slot::PQ)?;
                be.launch(&k.alpha, &[&self.scalars], 1)?;
                be.launch(
                    &k.update,
                    &[
                        &self.delta,
                        &self.r,
                        &self.z,
                        &self.p,
                        &self.q,
                        &self.minv,
                        &self.scalars,
                        &self.parts,
                    ],
                    n,
                )?;
                self.sum_parts_into(n, slot::RZ_NEW)?;
                be.launch(&k.beta, &[&self.scalars], 1)?;
                be.launch(&k.direction, &[&self.p, &self.z, &self.scalars], n)?;
                iterations += 1;
                if iterations % self.options.cg_check_every.max(1) == 0 {
                    let rz = be.read_f64_async(&self.scalars).await?[slot::RZ as usize];
                    if rz <= target {
                        break;
                    }
                }
            }
        }
        self.place_candidate().await?;
        // The model reduction -g.delta - |J delta|^2 / 2, and the norms, from one read (of
        // the step as projected onto the bounds, where there are any).
        be.spmv_csr(
            self.compiled.jacobian_csr(&self.it.current.jacobian),
            &self.delta,
            &self.t,
            1.0,
            0.0,
        )?;
        self.dot_into(&self.t, &self.t, rows, slot::JD2)?;
        self.dot_into(&self.gradient, &self.delta, n, slot::GD)?;
        self.dot_into(&self.delta, &self.delta, n, slot::PQ)?;
        self.dot_into(
            &self.it.x,
            &self.it.x,
            self.compiled.tangent.parameters(),
            slot::ALPHA,
        )?;
        let s = be.read_f64_async(&self.scalars).await?;
        self.it.times.linear_solve += t.elapsed().as_secs_f64();
        let (jd2, gd) = (s[slot::JD2 as usize], s[slot::GD as usize]);
        Ok(Step {
            model_reduction: -gd - 0.5 * jd2,
            step_norm: s[slot::PQ as usize].sqrt(),
            x_norm: s[slot::ALPHA as usize].sqrt(),
            cg_iterations: iterations,
        })
    }

    async fn scale_step(&mut self, factor: f64) -> Result<(), Error> {
        let be = &self.compiled.backend;
        let l = Layout::contiguous(&[self.compiled.cols]);
        be.unary(
            UnaryOp::Affine {
                scale: factor as f32,
                shift: 0.0,
            },
            View::new(&self.delta, &l),
            View::new(&self.delta, &l),
        )?;
        if !self.compiled.tangent.is_identity() {
            return self.place_candidate().await;
        }
        be.binary(
            BinaryOp::Add,
            View::new(&self.it.x, &l),
            View::new(&self.delta, &l),
            View::new(&self.it.x_candidate, &l),
        )?;
        Ok(())
    }

    fn set_scaling(&mut self, scaling: super::Scaling) {
        self.monotone = scaling == super::Scaling::Monotone;
    }

    async fn parameters(&self) -> Result<Vec<f64>, Error> {
        let mut x = self.compiled.backend.read_f64_async(&self.it.x).await?;
        x.truncate(self.compiled.tangent.parameters());
        Ok(x)
    }
}

/// The least f32 at or above `v` (a lower bound rounded inwards; infinities stay).
fn f32_at_least(v: f64) -> f32 {
    let f = v as f32;
    if (f as f64) < v { next_f32(f, 1) } else { f }
}

/// The greatest f32 at or below `v` (an upper bound rounded inwards; infinities stay).
fn f32_at_most(v: f64) -> f32 {
    let f = v as f32;
    if (f as f64) > v { next_f32(f, -1) } else { f }
}

/// The neighbouring finite f32 of finite `f` towards `+inf` (`dir` 1) or `-inf` (-1).
fn next_f32(f: f32, dir: i32) -> f32 {
    if f == 0.0 {
        return f32::from_bits(1) * dir as f32;
    }
    let up = (f > 0.0) == (dir > 0);
    let bits = f.to_bits();
    f32::from_bits(if up { bits + 1 } else { bits - 1 })
}
