//! The device engine: Jacobi-preconditioned conjugate gradients on the device, from CSR
//! mat-vecs on `J` and `J^T` and small IR kernels that keep the CG scalars on the device.

use super::{Engine, Iterates, SolveOptions, Step};
use crate::Error;
use crate::compile::CompiledProblem;
use crate::problem::Problem;
use hal::ir::{Access, Program, ProgramBuilder};
use hal::{Backend, BackendExt, BinaryOp, Csr, DType, Layout, ReduceOp, UnaryOp, View};
use std::time::Instant;

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
    pub const LEN: usize = 8;
}

struct CgKernels<B: Backend> {
    start: B::Kernel,
    q: B::Kernel,
    alpha: B::Kernel,
    update: B::Kernel,
    beta: B::Kernel,
    direction: B::Kernel,
}

fn cg_programs() -> hal::Result<[Program; 6]> {
    use hal::ir::IrCmp;
    let f32r = |b: &mut ProgramBuilder| b.buffer(DType::F32, Access::Read);
    let f32w = |b: &mut ProgramBuilder| b.buffer(DType::F32, Access::Write);
    let f32rw = |b: &mut ProgramBuilder| b.buffer(DType::F32, Access::ReadWrite);
    let scalar = |b: &mut ProgramBuilder, buf, k: u32| {
        let at = b.const_u32(k);
        b.load(buf, at)
    };
    // scal[num] / scal[den] where the denominator is positive, 0 otherwise.
    let safe_ratio = |b: &mut ProgramBuilder, buf, num: u32, den: u32| {
        let (n, d) = (scalar(b, buf, num), scalar(b, buf, den));
        let zero = b.const_f32(0.0);
        let positive = b.cmp(IrCmp::Gt, d, zero);
        let ratio = b.div(n, d);
        b.select(positive, ratio, zero)
    };

    // start: r = -g m; M = diag + lambda dd (1 when fixed); z = r / M; p = z; delta = 0;
    // parts = r z; damp = lambda dd m; minv = m / M.
    let mut b = ProgramBuilder::new("lm_cg_start");
    let (g, diag, mask, scal) = (f32r(&mut b), f32r(&mut b), f32r(&mut b), f32r(&mut b));
    let (r, z, p, delta, parts, damp, minv) = (
        f32w(&mut b),
        f32w(&mut b),
        f32w(&mut b),
        f32w(&mut b),
        f32w(&mut b),
        f32w(&mut b),
        f32w(&mut b),
    );
    let i = b.index();
    let lambda = scalar(&mut b, scal, slot::LAMBDA);
    let (gi, di, mi) = (b.load(g, i), b.load(diag, i), b.load(mask, i));
    let lo = b.const_f32(1e-6);
    let hi = b.const_f32(1e32);
    let dd = b.binary(hal::ir::IrBinary::Max, di, lo);
    let dd = b.binary(hal::ir::IrBinary::Min, dd, hi);
    let m_full = b.fma(lambda, dd, di);
    let zero = b.const_f32(0.0);
    let is_free = b.cmp(IrCmp::Gt, mi, zero);
    let one = b.const_f32(1.0);
    let m_diag = b.select(is_free, m_full, one);
    let ng = b.unary(hal::ir::IrUnary::Neg, gi);
    let ri = b.mul(ng, mi);
    let inv = b.div(mi, m_diag);
    let zi = b.mul(ri, inv);
    b.store(r, i, ri);
    b.store(z, i, zi);
    b.store(p, i, zi);
    b.store(delta, i, zero);
    let rz = b.mul(ri, zi);
    b.store(parts, i, rz);
    let ld = b.mul(lambda, dd);
    let dmp = b.mul(ld, mi);
    b.store(damp, i, dmp);
    b.store(minv, i, inv);
    let start = b.build()?;

    // q = m (q + damp p); parts = p q.
    let mut b = ProgramBuilder::new("lm_cg_q");
    let (q, p, damp, mask, parts) = (
        f32rw(&mut b),
        f32r(&mut b),
        f32r(&mut b),
        f32r(&mut b),
        f32w(&mut b),
    );
    let i = b.index();
    let (qi, pi, di, mi) = (b.load(q, i), b.load(p, i), b.load(damp, i), b.load(mask, i));
    let s = b.fma(di, pi, qi);
    let s = b.mul(s, mi);
    b.store(q, i, s);
    let pq = b.mul(pi, s);
    b.store(parts, i, pq);
    let q_program = b.build()?;

    // alpha = pq > 0 ? rz / pq : 0 (one thread).
    let mut b = ProgramBuilder::new("lm_cg_alpha");
    let scal = f32rw(&mut b);
    let alpha = safe_ratio(&mut b, scal, slot::RZ, slot::PQ);
    let at = b.const_u32(slot::ALPHA);
    b.store(scal, at, alpha);
    let alpha_program = b.build()?;

    // delta += alpha p; r -= alpha q; z = r minv; parts = r z.
    let mut b = ProgramBuilder::new("lm_cg_update");
    let (delta, r, z, p, q, minv, scal, parts) = (
        f32rw(&mut b),
        f32rw(&mut b),
        f32w(&mut b),
        f32r(&mut b),
        f32r(&mut b),
        f32r(&mut b),
        f32r(&mut b),
        f32w(&mut b),
    );
    let i = b.index();
    let alpha = scalar(&mut b, scal, slot::ALPHA);
    let (di, ri, pi, qi, mi) = (
        b.load(delta, i),
        b.load(r, i),
        b.load(p, i),
        b.load(q, i),
        b.load(minv, i),
    );
    let dn = b.fma(alpha, pi, di);
    b.store(delta, i, dn);
    let na = b.unary(hal::ir::IrUnary::Neg, alpha);
    let rn = b.fma(na, qi, ri);
    b.store(r, i, rn);
    let zn = b.mul(rn, mi);
    b.store(z, i, zn);
    let rz = b.mul(rn, zn);
    b.store(parts, i, rz);
    let update = b.build()?;

    // beta = rz_new / rz; rz = rz_new (one thread).
    let mut b = ProgramBuilder::new("lm_cg_beta");
    let scal = f32rw(&mut b);
    let beta = safe_ratio(&mut b, scal, slot::RZ_NEW, slot::RZ);
    let at = b.const_u32(slot::ALPHA); // alpha is dead until the next q: beta reuses it
    b.store(scal, at, beta);
    let rz_new = scalar(&mut b, scal, slot::RZ_NEW);
    let at = b.const_u32(slot::RZ);
    b.store(scal, at, rz_new);
    let beta_program = b.build()?;

    // p = z + beta p.
    let mut b = ProgramBuilder::new("lm_cg_direction");
    let (p, z, scal) = (f32rw(&mut b), f32r(&mut b), f32r(&mut b));
    let i = b.index();
    let beta = scalar(&mut b, scal, slot::ALPHA);
    let (pi, zi) = (b.load(p, i), b.load(z, i));
    let pn = b.fma(beta, pi, zi);
    b.store(p, i, pn);
    let direction = b.build()?;

    Ok([
        start,
        q_program,
        alpha_program,
        update,
        beta_program,
        direction,
    ])
}

pub(super) struct DeviceEngine<B: Backend> {
    compiled: CompiledProblem<B>,
    kernels: CgKernels<B>,
    options: SolveOptions,
    it: Iterates<B, B::Buffer>,
    jt_values: B::Buffer,
    jt_squared: B::Buffer,
    ones: B::Buffer,
    mask: B::Buffer,
    gradient: B::Buffer,
    diagonal: B::Buffer,
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
}

impl<B: Backend> DeviceEngine<B> {
    pub(super) fn new(
        compiled: CompiledProblem<B>,
        problem: &Problem,
        options: &SolveOptions,
    ) -> Result<Self, Error> {
        let b = compiled.backend.clone();
        let programs = cg_programs()?;
        let kernels = CgKernels {
            start: b.compile(&programs[0])?,
            q: b.compile(&programs[1])?,
            alpha: b.compile(&programs[2])?,
            update: b.compile(&programs[3])?,
            beta: b.compile(&programs[4])?,
            direction: b.compile(&programs[5])?,
        };
        let (n, rows, nnz) = (compiled.cols.max(1), compiled.rows, compiled.nnz);
        let vec_n = || b.alloc(DType::F32, n);
        let x: Vec<f32> = problem.parameters().iter().map(|&v| v as f32).collect();
        let mask: Vec<f32> = problem
            .fixed_mask()
            .iter()
            .map(|&f| if f { 0.0 } else { 1.0 })
            .collect();
        // The start goes in as the candidate: `start` evaluates it and makes it current.
        let start = if x.is_empty() {
            vec_n()?
        } else {
            b.upload(&x)?
        };
        let mut engine = Self {
            it: Iterates::new(&compiled, vec_n()?, start)?,
            jt_values: b.alloc(DType::F32, nnz.max(1))?,
            jt_squared: b.alloc(DType::F32, nnz.max(1))?,
            ones: {
                let o = b.alloc(DType::F32, rows.max(1))?;
                b.fill(View::new(&o, &Layout::contiguous(&[rows.max(1)])), 1.0)?;
                o
            },
            mask: if mask.is_empty() {
                vec_n()?
            } else {
                b.upload(&mask)?
            },
            gradient: vec_n()?,
            diagonal: vec_n()?,
            delta: vec_n()?,
            r: vec_n()?,
            z: vec_n()?,
            p: vec_n()?,
            q: vec_n()?,
            t: b.alloc(DType::F32, rows.max(1))?,
            damp: vec_n()?,
            minv: vec_n()?,
            parts: b.alloc(DType::F32, n.max(rows))?,
            scalars: b.alloc(DType::F32, slot::LEN)?,
            options: options.clone(),
            kernels,
            compiled,
        };
        engine.start(problem)?;
        Ok(engine)
    }

    fn csr<'a>(&'a self, values: &'a B::Buffer) -> Csr<'a, B::Buffer> {
        Csr {
            rows: self.compiled.rows,
            cols: self.compiled.cols,
            row_offsets: &self.compiled.row_offsets,
            col_indices: &self.compiled.col_indices,
            values,
        }
    }

    fn csr_t<'a>(&'a self, values: &'a B::Buffer) -> Csr<'a, B::Buffer> {
        Csr {
            rows: self.compiled.cols,
            cols: self.compiled.rows,
            row_offsets: &self.compiled.t_row_offsets,
            col_indices: &self.compiled.t_col_indices,
            values,
        }
    }

    /// `scalars[at] = sum(a * b)` over `len` elements (`parts` as scratch).
    fn dot_into(&self, a: &B::Buffer, b: &B::Buffer, len: usize, at: u32) -> Result<(), Error> {
        let be = &self.compiled.backend;
        let l = Layout::contiguous(&[len]);
        be.binary(
            BinaryOp::Mul,
            View::new(a, &l),
            View::new(b, &l),
            View::new(&self.parts, &l),
        )?;
        self.sum_parts_into(len, at)
    }

    fn sum_parts_into(&self, len: usize, at: u32) -> Result<(), Error> {
        let l = Layout::contiguous(&[len]);
        let out = Layout::strided(&[1], &[1], at as usize)?;
        self.compiled.backend.reduce(
            ReduceOp::Sum,
            View::new(&self.parts, &l),
            &[0],
            View::new(&self.scalars, &out),
        )?;
        Ok(())
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
    fn evaluate_candidate(&mut self) -> Result<(f64, bool), Error> {
        self.compiled
            .evaluate(&self.it.x_candidate, &self.it.candidate)?;
        let total = self
            .compiled
            .backend
            .read::<f32>(&self.it.candidate.total)?;
        Ok((total[0] as f64, total[1].is_finite()))
    }

    fn linearize(&mut self) -> Result<f64, Error> {
        let t = Instant::now();
        let be = self.compiled.backend.clone();
        let (n, nnz) = (self.compiled.cols, self.compiled.nnz);
        let ln = Layout::contiguous(&[nnz]);
        let lp = Layout::contiguous(&[self.compiled.nnz]);
        be.gather(
            View::new(&self.it.current.jacobian, &ln),
            0,
            View::new(&self.compiled.transpose_perm, &lp),
            View::new(&self.jt_values, &ln),
        )?;
        be.unary(
            UnaryOp::Square,
            View::new(&self.jt_values, &ln),
            View::new(&self.jt_squared, &ln),
        )?;
        be.spmv_csr(
            self.csr_t(&self.jt_values),
            &self.it.current.residuals,
            &self.gradient,
            1.0,
            0.0,
        )?;
        be.spmv_csr(
            self.csr_t(&self.jt_squared),
            &self.ones,
            &self.diagonal,
            1.0,
            0.0,
        )?;
        // max |g| over the free parameters.
        let l = Layout::contiguous(&[n]);
        be.binary(
            BinaryOp::Mul,
            View::new(&self.gradient, &l),
            View::new(&self.mask, &l),
            View::new(&self.parts, &l),
        )?;
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
        let s = be.read::<f32>(&self.scalars)?;
        self.it.times.linearize += t.elapsed().as_secs_f64();
        Ok(s[slot::GMAX as usize] as f64)
    }

    fn solve(&mut self, lambda: f64) -> Result<Step, Error> {
        let t = Instant::now();
        let be = self.compiled.backend.clone();
        let (n, rows) = (self.compiled.cols, self.compiled.rows);
        let k = &self.kernels;
        let scalars_init = [0f32, 0.0, 0.0, 0.0, lambda as f32, 0.0, 0.0, 0.0];
        be.write(&self.scalars, &scalars_init)?;
        be.launch(
            &k.start,
            &[
                &self.gradient,
                &self.diagonal,
                &self.mask,
                &self.scalars,
                &self.r,
                &self.z,
                &self.p,
                &self.delta,
                &self.parts,
                &self.damp,
                &self.minv,
            ],
            n,
        )?;
        self.sum_parts_into(n, slot::RZ)?;
        let rz0 = be.read::<f32>(&self.scalars)?[slot::RZ as usize] as f64;
        let target = rz0 * self.options.cg_tolerance * self.options.cg_tolerance;
        let mut iterations = 0;
        if rz0 > 0.0 {
            while iterations < self.options.max_cg_iterations {
                be.spmv_csr(
                    self.csr(&self.it.current.jacobian),
                    &self.p,
                    &self.t,
                    1.0,
                    0.0,
                )?;
                be.spmv_csr(self.csr_t(&self.jt_values), &self.t, &self.q, 1.0, 0.0)?;
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
                    let rz = be.read::<f32>(&self.scalars)?[slot::RZ as usize] as f64;
                    if rz <= target {
                        break;
                    }
                }
            }
        }
        // The model reduction -g.delta - |J delta|^2 / 2, and the norms, from one read.
        be.spmv_csr(
            self.csr(&self.it.current.jacobian),
            &self.delta,
            &self.t,
            1.0,
            0.0,
        )?;
        self.dot_into(&self.t, &self.t, rows, slot::JD2)?;
        self.dot_into(&self.gradient, &self.delta, n, slot::GD)?;
        self.dot_into(&self.delta, &self.delta, n, slot::PQ)?;
        self.dot_into(&self.it.x, &self.it.x, n, slot::ALPHA)?;
        let l = Layout::contiguous(&[n]);
        be.binary(
            BinaryOp::Add,
            View::new(&self.it.x, &l),
            View::new(&self.delta, &l),
            View::new(&self.it.x_candidate, &l),
        )?;
        let s = be.read::<f32>(&self.scalars)?;
        self.it.times.linear_solve += t.elapsed().as_secs_f64();
        let (jd2, gd) = (s[slot::JD2 as usize] as f64, s[slot::GD as usize] as f64);
        Ok(Step {
            model_reduction: -gd - 0.5 * jd2,
            step_norm: (s[slot::PQ as usize] as f64).sqrt(),
            x_norm: (s[slot::ALPHA as usize] as f64).sqrt(),
            cg_iterations: iterations,
        })
    }

    fn scale_step(&mut self, factor: f64) -> Result<(), Error> {
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
        be.binary(
            BinaryOp::Add,
            View::new(&self.it.x, &l),
            View::new(&self.delta, &l),
            View::new(&self.it.x_candidate, &l),
        )?;
        Ok(())
    }

    fn parameters(&self) -> Result<Vec<f64>, Error> {
        let x = self.compiled.backend.read::<f32>(&self.it.x)?;
        Ok(x.iter()
            .take(self.compiled.cols)
            .map(|&v| v as f64)
            .collect())
    }
}
