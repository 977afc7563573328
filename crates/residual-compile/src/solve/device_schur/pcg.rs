//! The iterative reduced solve (Ceres's `ITERATIVE_SCHUR` with `SCHUR_JACOBI`): conjugate
//! gradients on `S dc = rhs` on the device, `S p = (U + lambda D_c) p - W V^-1 W' p` applied
//! instance by instance from `J` and the `W_i` (never formed), preconditioned by the inverses
//! of `S`'s diagonal blocks over [`super::layout::partition`]'s blocks (a camera's columns).
//! The loop reads one scalar every `cg_check_every` iterations.

use super::super::kernel::compile_all;
use super::super::normal::dot_into;
use super::layout::{GroupLayout, partition};
use super::pcg_kernels::{self as kernels, slot};
use super::{Shared, SolveOptions};
use crate::Error;
use hal::{Backend, BackendExt, Layout, View};

/// The largest preconditioner block (columns read together beyond it are cut into blocks of
/// this size).
pub(super) const MAX_BLOCK: usize = 16;

/// Per group: its `S p` kernel and its share of the preconditioner's blocks.
struct GroupKernels<B: Backend> {
    apply: B::Kernel,
    precond: B::Kernel,
}

pub(super) struct Pcg<B: Backend> {
    /// Block size (padded) and count; per reduced column its block and place in it; per
    /// block its first column and size; the blocks of `S` and their damped inverses.
    bs: usize,
    nblocks: usize,
    pblock: B::Buffer,
    plocal: B::Buffer,
    pstart: B::Buffer,
    psize: B::Buffer,
    pmat: B::Buffer,
    pinv: B::Buffer,
    groups: Vec<GroupKernels<B>>,
    minv_apply: B::Kernel,
    damp_apply: B::Kernel,
    precond_invert: B::Kernel,
    precond_apply: B::Kernel,
    alpha: B::Kernel,
    beta: B::Kernel,
    update: B::Kernel,
    direction: B::Kernel,
    /// Over reduced columns: residual, preconditioned residual, direction, `S p`; per block
    /// `M^-1 W' p`; scratch and the scalars.
    r: B::Buffer,
    z: B::Buffer,
    p: B::Buffer,
    q: B::Buffer,
    ze: B::Buffer,
    parts: B::Buffer,
    scalars: B::Buffer,
    max_iterations: usize,
    tolerance: f64,
    check_every: usize,
}

impl<B: Backend> Pcg<B> {
    pub(super) fn new(
        sh: &Shared<B>,
        layouts: &[GroupLayout],
        options: &SolveOptions,
    ) -> Result<Self, Error> {
        let b = sh.backend();
        let precision = sh.compiled.precision;
        let n = sh.reduced;
        let blocks = partition(layouts, n, MAX_BLOCK);
        let bs = blocks
            .iter()
            .map(|&(_, size)| size as usize)
            .max()
            .unwrap_or(1);
        let (mut pblock, mut plocal) = (vec![0u32; n], vec![0u32; n]);
        for (k, &(start, size)) in blocks.iter().enumerate() {
            for j in 0..size {
                pblock[(start + j) as usize] = k as u32;
                plocal[(start + j) as usize] = j;
            }
        }
        let (pstart, psize): (Vec<u32>, Vec<u32>) = blocks.iter().copied().unzip();
        let mut programs = vec![
            kernels::minv_apply(precision, sh.size)?,
            kernels::damp_apply(precision)?,
            kernels::precond_invert(precision, bs)?,
            kernels::precond_apply(precision, bs)?,
            kernels::alpha(precision)?,
            kernels::beta(precision)?,
            kernels::update(precision)?,
            kernels::direction(precision)?,
        ];
        for l in layouts {
            programs.push(kernels::schur_apply(precision, &l.shape)?);
            programs.push(kernels::precond_add(precision, &l.shape, bs)?);
        }
        let mut built = compile_all(b, &programs)?.into_iter();
        let mut next = || built.next().expect("a kernel per program");
        let [
            minv_apply,
            damp_apply,
            precond_invert,
            precond_apply,
            alpha,
            beta,
            update,
            direction,
        ] = [(); 8].map(|_| next());
        let groups = layouts
            .iter()
            .map(|_| GroupKernels {
                apply: next(),
                precond: next(),
            })
            .collect();
        let vec = |len: usize| b.alloc(precision.dtype(), len.max(1));
        Ok(Self {
            bs,
            nblocks: blocks.len(),
            pblock: b.upload(&pblock)?,
            plocal: b.upload(&plocal)?,
            pstart: b.upload(&pstart)?,
            psize: b.upload(&psize)?,
            pmat: vec(blocks.len() * bs * bs)?,
            pinv: vec(blocks.len() * bs * bs)?,
            groups,
            minv_apply,
            damp_apply,
            precond_invert,
            precond_apply,
            alpha,
            beta,
            update,
            direction,
            r: vec(n)?,
            z: vec(n)?,
            p: vec(n)?,
            q: vec(n)?,
            ze: vec(sh.blocks * sh.size)?,
            parts: vec(n)?,
            scalars: vec(slot::LEN)?,
            max_iterations: options.max_cg_iterations,
            tolerance: options.cg_tolerance,
            check_every: options.cg_check_every.max(1),
        })
    }

    /// Solves the reduced system for the `lambda` in `sh.lambda` into `sh.dc`; the number of
    /// iterations.
    pub(super) async fn solve(&mut self, sh: &Shared<B>, lambda: f64) -> Result<usize, Error> {
        let be = sh.backend();
        let n = sh.reduced;
        sh.eliminate(None)?;
        self.precondition(sh)?;
        let flag = be.read_f64_async(&sh.rhs).await?[n];
        if flag != 0.0 {
            return Err(Shared::<B>::not_positive(
                lambda,
                "an eliminated block or a preconditioner block",
            ));
        }
        // dc = 0, r = rhs, z = P^-1 r, p = z, rz = r.z.
        let l = Layout::contiguous(&[n]);
        sh.zero(&sh.dc, n)?;
        be.copy(View::new(&sh.rhs, &l), View::new(&self.r, &l))?;
        self.apply_preconditioner(sh)?;
        be.copy(View::new(&self.z, &l), View::new(&self.p, &l))?;
        let (parts, scalars) = (&self.parts, &self.scalars);
        dot_into(be, (&self.r, &self.z), n, parts, scalars, slot::RZ as usize)?;
        let rz0 = be.read_f64_async(&self.scalars).await?[slot::RZ as usize];
        let target = rz0 * self.tolerance * self.tolerance;
        let mut iterations = 0;
        // A zero right-hand side (or a non-finite one, which the step then carries).
        if rz0.is_nan() || rz0 <= 0.0 {
            return Ok(0);
        }
        while iterations < self.max_iterations {
            self.apply_schur(sh)?;
            dot_into(be, (&self.p, &self.q), n, parts, scalars, slot::PQ as usize)?;
            be.launch(&self.alpha, &[&self.scalars], 1)?;
            be.launch(
                &self.update,
                &[&self.scalars, &self.p, &self.q, &sh.dc, &self.r],
                n,
            )?;
            self.apply_preconditioner(sh)?;
            dot_into(
                be,
                (&self.r, &self.z),
                n,
                parts,
                scalars,
                slot::RZ_NEW as usize,
            )?;
            be.launch(&self.beta, &[&self.scalars], 1)?;
            be.launch(&self.direction, &[&self.scalars, &self.z, &self.p], n)?;
            iterations += 1;
            if iterations % self.check_every == 0 {
                let rz = be.read_f64_async(&self.scalars).await?[slot::RZ as usize];
                if rz <= target {
                    break;
                }
            }
        }
        Ok(iterations)
    }

    /// The damped diagonal blocks of `S`, inverted (a failure sets `rhs`'s flag).
    fn precondition(&self, sh: &Shared<B>) -> Result<(), Error> {
        let be = sh.backend();
        sh.zero(&self.pmat, self.nblocks * self.bs * self.bs)?;
        let jac = &sh.it.current.jacobian;
        for (g, k) in sh.groups.iter().zip(&self.groups) {
            if g.shape.reduced.is_empty() {
                continue;
            }
            let mut args = vec![
                &g.meta,
                jac,
                &g.rcol,
                &self.pblock,
                &self.plocal,
                &self.pmat,
            ];
            if let Some(reads) = &g.reads {
                args.extend([&reads.block, &reads.w, &sh.minv]);
            }
            be.launch(&k.precond, &args, g.instances)?;
        }
        be.launch(
            &self.precond_invert,
            &[
                &sh.meta,
                &self.pstart,
                &self.psize,
                &sh.rmap,
                &sh.dd,
                &sh.lambda,
                &self.pmat,
                &self.pinv,
                &sh.rhs,
            ],
            self.nblocks,
        )?;
        Ok(())
    }

    /// `z = P^-1 r`.
    fn apply_preconditioner(&self, sh: &Shared<B>) -> Result<(), Error> {
        sh.backend().launch(
            &self.precond_apply,
            &[
                &sh.meta,
                &self.pblock,
                &self.plocal,
                &self.pstart,
                &self.psize,
                &self.pinv,
                &self.r,
                &self.z,
            ],
            sh.reduced,
        )?;
        Ok(())
    }

    /// `q = S p`.
    fn apply_schur(&self, sh: &Shared<B>) -> Result<(), Error> {
        let be = sh.backend();
        sh.block_sums(&self.p, &sh.t)?;
        be.launch(&self.minv_apply, &[&sh.minv, &sh.t, &self.ze], sh.blocks)?;
        be.launch(
            &self.damp_apply,
            &[&sh.rmap, &sh.dd, &sh.lambda, &self.p, &self.q],
            sh.reduced,
        )?;
        let jac = &sh.it.current.jacobian;
        for (g, k) in sh.groups.iter().zip(&self.groups) {
            if g.shape.reduced.is_empty() {
                continue;
            }
            let mut args = vec![&g.meta, jac, &g.rcol, &self.p, &self.q];
            if let Some(reads) = &g.reads {
                args.extend([&reads.block, &reads.w, &self.ze]);
            }
            be.launch(&k.apply, &args, g.instances)?;
        }
        Ok(())
    }
}
