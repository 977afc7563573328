//! A problem compiled onto a backend: one kernel per residual shape, the per-instance data and
//! the Jacobian's sparsity structure (CSR, and its transpose) on the device.

use crate::graph::Derivatives;
use crate::lower::{SlotRuns, lower};
use crate::problem::{Loss, Problem, ResidualGroup};
use crate::{Error, Precision};
use hal::{Backend, BackendExt, DType, Layout, ReduceOp, View};
use std::collections::HashMap;
use std::sync::Mutex;
use web_time::Instant;

/// Compiled kernels by residual shape and loss, kept across problems: a shape compiled once is
/// a cache hit for every later problem on the same backend handle.
pub struct KernelCache<B: Backend> {
    entries: Mutex<HashMap<CacheKey, CacheBucket<B>>>,
}

/// A shape's signature, its loss and the precision it was lowered in.
type CacheKey = (u64, (u8, u64), Precision);
/// The shapes under one key (equal hashes of different graphs are told apart by comparison),
/// each with the slot runs its kernel was lowered for.
type CacheBucket<B> = Vec<(crate::graph::Graph, SlotRuns, <B as Backend>::Kernel)>;
/// One compile thread's result: the group and its kernel with its IR size.
type Compiled<K> = (usize, hal::Result<(K, usize)>);

fn cache_key(signature: u64, loss: Loss, precision: Precision) -> CacheKey {
    (signature, loss.key(), precision)
}

impl<B: Backend> Default for KernelCache<B> {
    fn default() -> Self {
        Self {
            entries: Mutex::new(HashMap::new()),
        }
    }
}

impl<B: Backend> KernelCache<B> {
    pub fn new() -> Self {
        Self::default()
    }

    fn get(
        &self,
        key: CacheKey,
        graph: &crate::graph::Graph,
        runs: &SlotRuns,
    ) -> Option<B::Kernel> {
        let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries
            .get(&key)?
            .iter()
            .find(|(g, r, _)| g == graph && r == runs)
            .map(|(_, _, k)| k.clone())
    }

    fn insert(&self, key: CacheKey, graph: crate::graph::Graph, runs: SlotRuns, kernel: B::Kernel) {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries.entry(key).or_default().push((graph, runs, kernel));
    }
}

/// What compiling a problem did, per residual shape.
#[derive(Clone, Debug, Default)]
pub struct CompileReport {
    pub groups: Vec<GroupReport>,
    pub kernels_compiled: usize,
    pub cache_hits: usize,
    /// Deriving, lowering and compiling the kernels (in parallel over shapes).
    pub compile_seconds: f64,
    /// Uploading the per-instance data (parameter indices and constants).
    pub upload_seconds: f64,
    /// Building the Jacobian's sparsity structure (CSR and transpose) and uploading it: setup
    /// for the solver rather than compilation.
    pub structure_seconds: f64,
}

#[derive(Clone, Debug)]
pub struct GroupReport {
    pub name: String,
    pub signature: u64,
    pub instances: usize,
    pub params_per_instance: usize,
    pub residuals_per_instance: usize,
    /// Nodes traced per instance, and IR instructions of the compiled values-and-Jacobian
    /// program (0 on a cache hit, which compiles nothing).
    pub traced_nodes: usize,
    /// Parameter indices stored per instance: runs of slots that hold consecutive parameters
    /// in every instance share one (`SlotRuns`).
    pub index_runs: usize,
    pub ir_instructions: usize,
    pub cache_hit: bool,
}

struct GroupKernel<B: Backend> {
    kernel: B::Kernel,
    param_index: B::Buffer,
    constants: B::Buffer,
    offsets: B::Buffer,
    instances: usize,
}

/// The buffers one evaluation writes.
pub struct Evaluation<B: Backend> {
    /// `[rows]`: the (loss-scaled) residuals.
    pub residuals: B::Buffer,
    /// `[nnz]`: the Jacobian's CSR values.
    pub jacobian: B::Buffer,
    /// `[blocks]`: each block's cost `rho / 2` (NaN where one of its Jacobian entries is not
    /// finite: see `lower`).
    pub cost: B::Buffer,
    /// `[1]`: the total cost, not finite where a residual, a cost or a Jacobian entry is not.
    /// `f64` where the backend reduces into `f64`, whatever the precision; `f32` otherwise.
    pub total: B::Buffer,
}

/// A problem's kernels and sparsity structure on one backend.
pub struct CompiledProblem<B: Backend> {
    pub backend: B,
    pub precision: Precision,
    kernels: Vec<GroupKernel<B>>,
    pub rows: usize,
    /// Jacobian columns ([`crate::TangentSpace::cols`]): the problem's parameters where none
    /// is on a manifold.
    pub cols: usize,
    pub nnz: usize,
    pub blocks: usize,
    /// CSR structure of the Jacobian (`rows + 1` offsets, `nnz` column indices).
    pub row_offsets: B::Buffer,
    pub col_indices: B::Buffer,
    /// CSR structure of its transpose, whose values are `jacobian[transpose_perm[k]]`.
    pub t_row_offsets: B::Buffer,
    pub t_col_indices: B::Buffer,
    pub transpose_perm: B::Buffer,
    /// The same structures on the host (the sparse Cholesky path builds `J^T J` from them).
    pub host_row_offsets: Vec<u32>,
    pub host_col_indices: Vec<u32>,
    /// The columns: parameters, or tangent coordinates of blocks on manifolds.
    pub tangent: crate::TangentSpace,
    pub report: CompileReport,
}

impl<B: Backend> CompiledProblem<B> {
    /// Compiles every residual shape of `problem` in `precision` (reusing `cache`) and
    /// uploads the per-instance data and the Jacobian structure.
    pub fn new(
        backend: &B,
        problem: &Problem,
        cache: &KernelCache<B>,
        precision: Precision,
    ) -> Result<Self, Error> {
        if problem.num_blocks() == 0 {
            return Err(Error::InvalidProblem(
                "the problem has no residual blocks".into(),
            ));
        }
        let started = Instant::now();
        let groups = problem.groups();
        // Each shape's slot runs (what its instances' parameter indices allow), then derive,
        // lower and compile the shapes not in the cache, in parallel.
        let runs: Vec<SlotRuns> = {
            use rayon::prelude::*;
            groups
                .par_iter()
                .map(|g| SlotRuns::of(&g.param_index, g.slots_per_instance()))
                .collect()
        };
        let mut kernels: Vec<Option<B::Kernel>> = groups
            .iter()
            .zip(&runs)
            .map(|(g, r)| {
                let key = cache_key(g.signature, g.loss, precision);
                cache.get(key, &g.graph, r)
            })
            .collect();
        let mut ir_sizes = vec![0usize; groups.len()];
        let misses: Vec<usize> = (0..groups.len())
            .filter(|&g| kernels[g].is_none())
            .collect();
        let compiled = compile_groups(backend, groups, &runs, &misses, precision);
        for (gi, result) in compiled {
            let (kernel, insts) = result?;
            cache.insert(
                cache_key(groups[gi].signature, groups[gi].loss, precision),
                groups[gi].graph.clone(),
                runs[gi].clone(),
                kernel.clone(),
            );
            kernels[gi] = Some(kernel);
            ir_sizes[gi] = insts;
        }
        let compile_seconds = started.elapsed().as_secs_f64();

        let started = Instant::now();
        let tangent = problem.tangent_space()?;
        let cols = tangent.cols;
        let mut rows = 0usize;
        let mut nnz = 0usize;
        let mut cost_first = 0usize;
        let mut row_offsets: Vec<u32> = vec![0];
        let mut col_indices: Vec<u32> = Vec::new();
        let mut group_kernels = Vec::with_capacity(groups.len());
        let mut report = CompileReport {
            kernels_compiled: misses.len(),
            cache_hits: groups.len() - misses.len(),
            compile_seconds,
            ..Default::default()
        };
        for (gi, g) in groups.iter().enumerate() {
            let (p, r, n) = (g.params_per_instance(), g.residuals_per_instance(), g.len());
            let offsets = [rows as u32, nnz as u32, cost_first as u32];
            if (nnz + n * r * p) > u32::MAX as usize {
                return Err(Error::InvalidProblem(format!(
                    "the Jacobian has more than {} entries",
                    u32::MAX
                )));
            }
            push_rows(g, &tangent, &mut row_offsets, &mut col_indices);
            let upload_started = Instant::now();
            let constants = upload_floats(backend, precision, &g.constants)?;
            group_kernels.push(GroupKernel {
                kernel: kernels[gi].take().expect("every group was compiled"),
                param_index: backend.upload(&runs[gi].firsts(&g.param_index))?,
                constants,
                offsets: backend.upload(&offsets)?,
                instances: n,
            });
            report.upload_seconds += upload_started.elapsed().as_secs_f64();
            report.groups.push(GroupReport {
                name: g.name.clone(),
                signature: g.signature,
                instances: n,
                params_per_instance: p,
                residuals_per_instance: r,
                traced_nodes: g.graph.nodes.len(),
                index_runs: runs[gi].runs(),
                ir_instructions: ir_sizes[gi],
                cache_hit: ir_sizes[gi] == 0,
            });
            rows += n * r;
            nnz += n * r * p;
            cost_first += n;
        }

        let (t_row_offsets, t_cols, perm) = transpose(&row_offsets, &col_indices, cols);
        let mut compiled = Self {
            backend: backend.clone(),
            precision,
            kernels: group_kernels,
            rows,
            cols,
            nnz,
            blocks: cost_first,
            row_offsets: backend.upload(&row_offsets)?,
            col_indices: backend.upload(&col_indices)?,
            t_row_offsets: backend.upload(&t_row_offsets)?,
            t_col_indices: backend.upload(&t_cols)?,
            transpose_perm: backend.upload(&perm)?,
            host_row_offsets: row_offsets,
            host_col_indices: col_indices,
            tangent,
            report,
        };
        compiled.report.structure_seconds =
            started.elapsed().as_secs_f64() - compiled.report.upload_seconds;
        Ok(compiled)
    }

    /// The Jacobian as a CSR operator over `values` (its entries, in the structure's order).
    pub fn jacobian_csr<'a>(&'a self, values: &'a B::Buffer) -> hal::Csr<'a, B::Buffer> {
        hal::Csr {
            rows: self.rows,
            cols: self.cols,
            row_offsets: &self.row_offsets,
            col_indices: &self.col_indices,
            values,
        }
    }

    /// Its transpose as a CSR operator over `values` (`jacobian[transpose_perm[k]]`).
    pub fn transpose_csr<'a>(&'a self, values: &'a B::Buffer) -> hal::Csr<'a, B::Buffer> {
        hal::Csr {
            rows: self.cols,
            cols: self.rows,
            row_offsets: &self.t_row_offsets,
            col_indices: &self.t_col_indices,
            values,
        }
    }

    /// Buffers for one evaluation's outputs.
    pub fn alloc_evaluation(&self) -> Result<Evaluation<B>, Error> {
        let b = &self.backend;
        let dtype = self.precision.dtype();
        Ok(Evaluation {
            residuals: b.alloc(dtype, self.rows.max(1))?,
            jacobian: b.alloc(dtype, self.nnz.max(1))?,
            cost: b.alloc(dtype, self.blocks.max(1))?,
            total: b.alloc(self.total_dtype(), 1)?,
        })
    }

    /// The dtype of [`Evaluation::total`]: `f64` where the backend reduces into it.
    pub fn total_dtype(&self) -> DType {
        if self.backend.capabilities().f64.primitive("reduce") {
            DType::F64
        } else {
            DType::F32
        }
    }

    /// `values` in the problem's precision on the device (one 0 when empty: a buffer
    /// cannot be empty).
    pub fn upload_floats(&self, values: &[f64]) -> Result<B::Buffer, Error> {
        upload_floats(&self.backend, self.precision, values)
    }

    /// Writes `values` over `dst` (of the precision's dtype, at least as long), rounded to
    /// `f32` in [`Precision::F32`].
    pub fn write_floats(&self, dst: &B::Buffer, values: &[f64]) -> Result<(), Error> {
        if values.is_empty() {
            return Ok(());
        }
        match self.precision {
            Precision::F64 => self.backend.write(dst, values)?,
            Precision::F32 => {
                let narrow: Vec<f32> = values.iter().map(|&v| v as f32).collect();
                self.backend.write(dst, &narrow)?
            }
        }
        Ok(())
    }

    /// Evaluates residuals, Jacobian and cost at `params` (of the precision's dtype, one per
    /// problem parameter) into `out`. Enqueued: nothing is read back.
    pub fn evaluate(&self, params: &B::Buffer, out: &Evaluation<B>) -> Result<(), Error> {
        for k in &self.kernels {
            self.backend.launch(
                &k.kernel,
                &[
                    params,
                    &k.param_index,
                    &k.constants,
                    &k.offsets,
                    &out.residuals,
                    &out.jacobian,
                    &out.cost,
                ],
                k.instances,
            )?;
        }
        let all = Layout::contiguous(&[self.blocks]);
        let one = Layout::contiguous(&[1]);
        self.backend.reduce(
            ReduceOp::Sum,
            View::new(&out.cost, &all),
            &[0],
            View::new(&out.total, &one),
        )?;
        Ok(())
    }
}

/// `values` in `precision` on the device (one 0 when empty: a buffer cannot be empty).
fn upload_floats<B: Backend>(
    backend: &B,
    precision: Precision,
    values: &[f64],
) -> Result<B::Buffer, Error> {
    let values = if values.is_empty() {
        &[0.0][..]
    } else {
        values
    };
    Ok(match precision {
        Precision::F64 => backend.upload(values)?,
        Precision::F32 => {
            let narrow: Vec<f32> = values.iter().map(|&v| v as f32).collect();
            backend.upload(&narrow)?
        }
    })
}

/// Appends the Jacobian rows of group `g` to a CSR structure: each instance's `r` rows, each
/// holding its `p` differentiated slots' columns.
fn push_rows(
    g: &ResidualGroup,
    tangent: &crate::TangentSpace,
    row_offsets: &mut Vec<u32>,
    col_indices: &mut Vec<u32>,
) {
    let (p, r, n) = (g.params_per_instance(), g.residuals_per_instance(), g.len());
    let s = g.slots_per_instance();
    row_offsets.reserve(n * r);
    col_indices.reserve(n * r * p);
    let mut cols_of = vec![0u32; p];
    for i in 0..n {
        for (c, &index) in cols_of.iter_mut().zip(&g.param_index[i * s..i * s + p]) {
            *c = tangent.col(index);
        }
        for _ in 0..r {
            col_indices.extend_from_slice(&cols_of);
            let last = *row_offsets.last().expect("starts with 0");
            row_offsets.push(last + p as u32);
        }
    }
}

/// Derives, lowers and compiles the groups `misses` of `groups`, one thread each (one after
/// another on wasm32, which has no threads).
fn compile_groups<B: Backend>(
    backend: &B,
    groups: &[ResidualGroup],
    runs: &[SlotRuns],
    misses: &[usize],
    precision: Precision,
) -> Vec<Compiled<B::Kernel>> {
    let one = |gi: usize| {
        let (g, slot_runs) = (&groups[gi], &runs[gi]);
        let derivatives: Derivatives = g.graph.derivatives();
        let name = format!("residual_{}", sanitize(&g.name));
        let lowered = lower(&derivatives, g.loss, slot_runs, &name, precision);
        let result =
            lowered.and_then(|program| Ok((backend.compile(&program)?, program.insts.len())));
        (gi, result)
    };
    if cfg!(target_arch = "wasm32") {
        return misses.iter().map(|&gi| one(gi)).collect();
    }
    std::thread::scope(|s| {
        let handles: Vec<_> = misses.iter().map(|&gi| s.spawn(move || one(gi))).collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a compile thread panicked"))
            .collect()
    })
}

/// The CSR structure of the transpose of the one given (`cols` columns): its row offsets,
/// its column indices, and for each of its entries the entry of the original it is. Entries
/// are sorted by column, stably, so rows ascend within a column.
fn transpose(
    row_offsets: &[u32],
    col_indices: &[u32],
    cols: usize,
) -> (Vec<u32>, Vec<u32>, Vec<u32>) {
    let (rows, nnz) = (row_offsets.len() - 1, col_indices.len());
    let mut t_row_offsets = vec![0u32; cols + 1];
    for &c in col_indices {
        t_row_offsets[c as usize + 1] += 1;
    }
    for c in 0..cols {
        t_row_offsets[c + 1] += t_row_offsets[c];
    }
    let mut next = t_row_offsets.clone();
    let mut perm = vec![0u32; nnz];
    let mut t_cols = vec![0u32; nnz];
    for row in 0..rows {
        for k in row_offsets[row]..row_offsets[row + 1] {
            let c = col_indices[k as usize] as usize;
            let at = next[c] as usize;
            next[c] += 1;
            perm[at] = k;
            t_cols[at] = row as u32;
        }
    }
    (t_row_offsets, t_cols, perm)
}

fn sanitize(name: &str) -> String {
    name.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .take(40)
        .collect()
}
