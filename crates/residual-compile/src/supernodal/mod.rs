//! The numeric sparse Cholesky factorisation of the CPU solver, on all cores.
//!
//! faer analyses the matrix (AMD ordering, supernodes, the factor's pattern) and solves with
//! the factor; this module computes the factor's values. faer's own numeric factorisation
//! visits the supernodes one after another and splits only the dense work inside a supernode
//! between threads, which costs more than it saves on supernodes this small (level 4 took
//! 4.8 s with it against 2.6 s sequentially). The supernodes form an elimination tree, and
//! disjoint subtrees do not touch each other's values, so here whole subtrees go to
//! different threads and a supernode starts as soon as its children are done.
//!
//! Each supernode is computed left-looking: its columns of the (permuted) matrix, minus the
//! updates of the descendants that touch it, applied in ascending order, then a dense
//! Cholesky of its diagonal block and a triangular solve below it. What a supernode computes
//! depends only on finished descendants, never on which thread ran what, so the factor is
//! the same bit for bit whatever the thread count or the schedule.
//!
//! The values are written in faer's supernodal layout, so `faer`'s `LltRef` solves with them.

use faer::dyn_stack::{MemBuffer, MemStack};
use faer::linalg::cholesky::llt::factor::{LltError, cholesky_in_place, cholesky_in_place_scratch};
use faer::reborrow::{Reborrow, ReborrowMut};
use faer::sparse::SymbolicSparseColMatRef;
use faer::sparse::linalg::cholesky::{SymbolicCholesky, SymbolicCholeskyRaw};
use faer::{Accum, MatMut, MatRef, Par};
use std::cell::RefCell;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

/// A subtree whose factorisation costs fewer flops than this runs on one thread as one task;
/// about 30 us on one core, well above the cost of handing a task to another thread.
const TASK_FLOPS: f64 = 1e6;
/// Below this many multiply-adds a descendant's update is computed by plain loops, above it
/// by faer's matrix product (which has a fixed cost to set up).
const UPDATE_MATMUL_MIN: usize = 8 * 8 * 8;

/// Columns of a descendant's update computed at a time (the diagonal block of each is
/// computed whole, so narrower blocks waste fewer products above the diagonal).
const UPDATE_BLOCK: usize = 32;
/// Dense work of at least this many multiply-adds is split between threads. The supernodes
/// near the root are large and form a chain, where the tree offers no parallelism.
const PARALLEL_DENSE_MIN: usize = 1 << 21;

fn dense_par(multiply_adds: usize) -> Par {
    if multiply_adds >= PARALLEL_DENSE_MIN {
        crate::all_cores()
    } else {
        Par::Seq
    }
}

/// The supernodal structure of one symbolic analysis, and the task tree over it.
pub(crate) struct ParallelCholesky {
    /// `forward[new]` is the matrix's column at position `new` of the fill-reducing order.
    forward: Vec<u32>,
    /// The permuted matrix's lower triangle (CSC); `input_position[k]` is where value `k` of
    /// the input lower triangle lands in it.
    permuted_col_ptr: Vec<usize>,
    permuted_rows: Vec<u32>,
    input_position: Vec<u32>,
    permuted_values: Vec<f64>,
    /// Supernode `s` holds columns `begin[s]..end[s]` and, below them, the rows
    /// `pattern[pattern_ptr[s]..pattern_ptr[s + 1]]`; its values are column-major at
    /// `value_ptr[s]..value_ptr[s + 1]`.
    begin: Vec<usize>,
    end: Vec<usize>,
    pattern_ptr: Vec<usize>,
    pattern: Vec<u32>,
    value_ptr: Vec<usize>,
    /// The descendants whose columns update supernode `s`, ascending.
    updater_ptr: Vec<usize>,
    updaters: Vec<u32>,
    /// Tasks: a task is a whole small subtree (its supernodes in ascending order) or one
    /// supernode of the large ones near the root.
    task_ptr: Vec<usize>,
    task_members: Vec<u32>,
    /// The task that waits for this one, or `u32::MAX` at a root.
    task_parent: Vec<u32>,
    /// How many tasks each task waits for.
    task_children: Vec<u32>,
    max_width: usize,
}

/// Per-thread scratch.
#[derive(Default)]
struct Scratch {
    product: Vec<f64>,
    local_rows: Vec<u32>,
    /// Where each run of consecutive `local_rows` starts, and `local_rows.len()` last.
    runs: Vec<u32>,
    /// Row of the matrix -> row of the supernode being computed, for the rows below its
    /// columns (set per supernode; stale elsewhere).
    row_map: Vec<u32>,
    /// The dense Cholesky's workspace, and the widest supernode it was sized for.
    dense: Option<(usize, MemBuffer)>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// The factor's values, written by several threads at disjoint supernodes.
#[derive(Clone, Copy)]
struct SharedValues(*mut f64);
// SAFETY: every supernode's range is written by exactly one task, and read by others only
// after that task has finished (ordered by the `AcqRel` counters of the schedule).
unsafe impl Send for SharedValues {}
unsafe impl Sync for SharedValues {}

impl SharedValues {
    /// Values `range`, to write.
    ///
    /// # Safety
    /// No other thread accesses `range` meanwhile.
    unsafe fn slice_mut<'a>(self, range: std::ops::Range<usize>) -> &'a mut [f64] {
        unsafe { std::slice::from_raw_parts_mut(self.0.add(range.start), range.len()) }
    }

    /// Values `range`, to read.
    ///
    /// # Safety
    /// No thread writes `range` meanwhile.
    unsafe fn slice<'a>(self, range: std::ops::Range<usize>) -> &'a [f64] {
        unsafe { std::slice::from_raw_parts(self.0.add(range.start), range.len()) }
    }
}

impl ParallelCholesky {
    /// The structure for `symbolic`, an analysis of the lower-triangular pattern `lower`
    /// (rows sorted in each column). `None` when faer chose its simplicial factorisation,
    /// which has no supernodes to spread.
    pub(crate) fn new(
        lower: SymbolicSparseColMatRef<'_, u32>,
        symbolic: &SymbolicCholesky<u32>,
    ) -> Option<Self> {
        let SymbolicCholeskyRaw::Supernodal(sn) = symbolic.raw() else {
            return None;
        };
        let n = lower.nrows();
        // Where each row and column goes: faer factors P A P^T with new index inverse[old].
        let (forward, inverse): (Vec<u32>, Vec<usize>) = match symbolic.perm() {
            Some(p) => (
                p.arrays().0.to_vec(),
                p.arrays().1.iter().map(|&i| i as usize).collect(),
            ),
            None => ((0..n as u32).collect(), (0..n).collect()),
        };
        let nnz = lower.row_idx().len();
        let (permuted_col_ptr, permuted_rows, input_position) = permute_lower(lower, &inverse);

        let ns = sn.n_supernodes();
        let begin: Vec<usize> = sn.supernode_begin().iter().map(|&v| v as usize).collect();
        let end: Vec<usize> = sn.supernode_end().iter().map(|&v| v as usize).collect();
        let pattern_ptr: Vec<usize> = sn
            .col_ptr_for_row_idx()
            .iter()
            .map(|&v| v as usize)
            .collect();
        let value_ptr: Vec<usize> = sn.col_ptr_for_val().iter().map(|&v| v as usize).collect();
        let pattern = sn.row_idx().to_vec();
        let mut supernode_of = vec![0u32; n];
        for s in 0..ns {
            supernode_of[begin[s]..end[s]].fill(s as u32);
        }
        let pattern_of = |s: usize| &pattern[pattern_ptr[s]..pattern_ptr[s + 1]];

        let (updater_ptr, updaters, parent) = updaters(ns, pattern_of, &supernode_of);
        let widths: Vec<usize> = (0..ns).map(|s| end[s] - begin[s]).collect();
        let [task_ptr, task_members, task_parent, task_children] =
            group_tasks(&widths, pattern_of, &parent);
        let max_width = (0..ns).map(|s| end[s] - begin[s]).max().unwrap_or(0);
        Some(Self {
            forward,
            permuted_col_ptr,
            permuted_rows,
            input_position,
            permuted_values: vec![0.0; nnz],
            begin,
            end,
            pattern_ptr,
            pattern,
            value_ptr,
            updater_ptr,
            updaters,
            task_ptr: task_ptr.into_iter().map(|v| v as usize).collect(),
            task_members,
            task_parent,
            task_children,
            max_width,
        })
    }

    /// Factors the matrix whose lower triangle has the values `lower_values` (in the order of
    /// the pattern given to `new`) into `factor` (faer's layout for the same analysis).
    /// `Err(column)` names a column of the matrix whose pivot was not positive.
    pub(crate) fn factorize(
        &mut self,
        lower_values: &[f64],
        factor: &mut [f64],
    ) -> Result<(), usize> {
        assert_eq!(lower_values.len(), self.input_position.len());
        assert_eq!(factor.len(), *self.value_ptr.last().unwrap_or(&0));
        for (&v, &at) in lower_values.iter().zip(&self.input_position) {
            self.permuted_values[at as usize] = v;
        }
        let this = &*self;
        let values = SharedValues(factor.as_mut_ptr());
        let failed = AtomicUsize::new(usize::MAX);
        let waiting: Vec<AtomicU32> = this
            .task_children
            .iter()
            .map(|&c| AtomicU32::new(c))
            .collect();
        rayon::scope(|scope| {
            for (t, &c) in this.task_children.iter().enumerate() {
                if c == 0 {
                    let (waiting, failed) = (&waiting, &failed);
                    scope.spawn(move |scope| this.run_task(t, values, waiting, failed, scope));
                }
            }
        });
        match failed.into_inner() {
            usize::MAX => Ok(()),
            column => Err(self.forward[column] as usize),
        }
    }

    fn run_task<'s>(
        &'s self,
        task: usize,
        values: SharedValues,
        waiting: &'s [AtomicU32],
        failed: &'s AtomicUsize,
        scope: &rayon::Scope<'s>,
    ) {
        // The thread's scratch is taken out for the task and put back after, not borrowed
        // across it: a large supernode's dense work runs on rayon, and a thread waiting
        // there may run another task of this factorisation (which then finds the slot
        // empty and grows its own scratch), where a held borrow would panic.
        let mut scratch = SCRATCH.with(|slot| std::mem::take(&mut *slot.borrow_mut()));
        for &s in &self.task_members[self.task_ptr[task]..self.task_ptr[task + 1]] {
            // SAFETY: see `SharedValues`; this task is the only writer of `s`, and every
            // descendant of `s` belongs to this task (earlier) or to one already finished.
            if let Err(column) = unsafe { self.factor_supernode(s as usize, values, &mut scratch) }
            {
                failed.fetch_min(column, Ordering::Relaxed);
            }
        }
        SCRATCH.with(|slot| *slot.borrow_mut() = scratch);
        let parent = self.task_parent[task];
        if parent != u32::MAX && waiting[parent as usize].fetch_sub(1, Ordering::AcqRel) == 1 {
            scope
                .spawn(move |scope| self.run_task(parent as usize, values, waiting, failed, scope));
        }
    }

    /// Computes supernode `s` from the matrix and its finished descendants.
    ///
    /// # Safety
    /// No other thread may access `s`'s values meanwhile, and every descendant of `s` must be
    /// finished.
    unsafe fn factor_supernode(
        &self,
        s: usize,
        values: SharedValues,
        scratch: &mut Scratch,
    ) -> Result<(), usize> {
        let (s0, s1) = (self.begin[s], self.end[s]);
        let width = s1 - s0;
        let below = &self.pattern[self.pattern_ptr[s]..self.pattern_ptr[s + 1]];
        let nrows = width + below.len();
        // SAFETY: the caller guarantees exclusive access to this range.
        let own = unsafe { values.slice_mut(self.value_ptr[s]..self.value_ptr[s + 1]) };
        own.fill(0.0);
        // Rows below the columns, by the map (a descendant's rows are looked up in constant
        // time, not searched for in the pattern).
        let mut row_map = std::mem::take(&mut scratch.row_map);
        row_map.resize(self.forward.len(), 0);
        for (k, &r) in below.iter().enumerate() {
            row_map[r as usize] = (width + k) as u32;
        }
        let local_row = |row: usize| -> usize {
            if row < s1 {
                row - s0
            } else {
                let local = row_map[row] as usize;
                debug_assert_eq!(below[local - width] as usize, row, "row in the pattern");
                local
            }
        };
        for j in s0..s1 {
            let column = &mut own[(j - s0) * nrows..(j - s0 + 1) * nrows];
            for k in self.permuted_col_ptr[j]..self.permuted_col_ptr[j + 1] {
                column[local_row(self.permuted_rows[k] as usize)] += self.permuted_values[k];
            }
        }

        for &d in &self.updaters[self.updater_ptr[s]..self.updater_ptr[s + 1]] {
            let d = d as usize;
            let d_width = self.end[d] - self.begin[d];
            let d_below = &self.pattern[self.pattern_ptr[d]..self.pattern_ptr[d + 1]];
            let d_rows = d_width + d_below.len();
            // SAFETY: `d` is a finished descendant; nobody writes it any more.
            let ld = unsafe { values.slice(self.value_ptr[d]..self.value_ptr[d + 1]) };
            // d's rows inside s's columns (`mid`), then the rest, all of them in s's pattern.
            let first = d_below.partition_point(|&r| (r as usize) < s0);
            let mid = d_below[first..].partition_point(|&r| (r as usize) < s1);
            let rows = d_below.len() - first;
            scratch.local_rows.clear();
            scratch.local_rows.extend(
                d_below[first..]
                    .iter()
                    .map(|&r| local_row(r as usize) as u32),
            );
            scratch.runs.clear();
            for (i, &r) in scratch.local_rows.iter().enumerate() {
                if i == 0 || r != scratch.local_rows[i - 1] + 1 {
                    scratch.runs.push(i as u32);
                }
            }
            scratch.runs.push(scratch.local_rows.len() as u32);
            let top = d_width + first;
            subtract_update(own, nrows, ld, [d_width, d_rows, top], [rows, mid], scratch);
        }
        scratch.row_map = row_map;

        let block = MatMut::from_column_major_slice_mut(own, nrows, width);
        let (mut diagonal, lower) = block.split_at_row_mut(width);
        let needed = cholesky_in_place_scratch::<f64>(self.max_width, Par::Seq, Default::default());
        let dense = match &mut scratch.dense {
            Some((size, buffer)) if *size >= self.max_width => buffer,
            slot => &mut slot.insert((self.max_width, MemBuffer::new(needed))).1,
        };
        let pivots = cholesky_in_place(
            diagonal.rb_mut(),
            Default::default(),
            dense_par(width * width * width / 3),
            MemStack::new(dense),
            Default::default(),
        );
        if let Err(LltError::NonPositivePivot { index }) = pivots {
            return Err(s0 + index);
        }
        // The rows below: L_below = A_below L_diag^-T, i.e. L_diag X = A_below^T.
        faer::linalg::triangular_solve::solve_lower_triangular_in_place(
            diagonal.rb(),
            lower.transpose_mut(),
            dense_par(width * width * below.len()),
        );
        Ok(())
    }
}

/// `own[rows, mid] -= L_d[rows, :] L_d[mid, :]^T`, lower triangle only, by blocks of columns,
/// each from its diagonal down: a descendant's update of a supernode. `own` is the
/// supernode's block (`nrows` rows, column major); `ld` the descendant's (`d_width` columns of
/// `d_rows` rows), whose rows from `top` fall in `own` at `scratch.local_rows` (the first
/// `mid` of them inside the supernode's columns).
fn subtract_update(
    own: &mut [f64],
    nrows: usize,
    ld: &[f64],
    [d_width, d_rows, top]: [usize; 3],
    [rows, mid]: [usize; 2],
    scratch: &mut Scratch,
) {
    let mut c0 = 0;
    while c0 < mid {
        let c1 = (c0 + UPDATE_BLOCK).min(mid);
        let (h, w) = (rows - c0, c1 - c0);
        if scratch.product.len() < h * w {
            scratch.product.resize(h * w, 0.0);
        }
        let product = &mut scratch.product[..h * w];
        let multiply_adds = h * w * d_width;
        if multiply_adds >= UPDATE_MATMUL_MIN {
            // (The product replaces what the block held: no zeroing first.)
            // Rows top + c0.. of L_d; the right operand is their first w rows.
            let lhs =
                MatRef::from_column_major_slice_with_stride(&ld[top + c0..], h, d_width, d_rows);
            let rhs = lhs.subrows(0, w);
            faer::linalg::matmul::matmul(
                MatMut::from_column_major_slice_mut(product, h, w),
                Accum::Replace,
                lhs,
                rhs.transpose(),
                1.0,
                dense_par(multiply_adds),
            );
        } else {
            product.fill(0.0);
            for jj in 0..w {
                let column = &mut product[jj * h..(jj + 1) * h];
                for k in 0..d_width {
                    let source = &ld[k * d_rows + top + c0..][..h];
                    let scale = source[jj];
                    for (p, &l) in column[jj..].iter_mut().zip(&source[jj..]) {
                        *p += l * scale;
                    }
                }
            }
        }
        // Scattered run by run: a run of consecutive rows of `L_d` lands on consecutive rows
        // of `own` (a pose's six, say), a slice subtraction the compiler vectorises.
        let (local_rows, runs) = (&scratch.local_rows, &scratch.runs);
        let mut run = 0;
        for jj in 0..w {
            let a = c0 + jj;
            let column = &mut own[local_rows[a] as usize * nrows..];
            let product = &product[jj * h..(jj + 1) * h];
            while runs[run + 1] as usize <= a {
                run += 1;
            }
            let mut i = a;
            for &end in &runs[run + 1..] {
                let (end, target) = (end as usize, local_rows[i] as usize);
                let len = end - i;
                let source = &product[i - c0..i - c0 + len];
                for (out, &p) in column[target..target + len].iter_mut().zip(source) {
                    *out -= p;
                }
                i = end;
            }
        }
        c0 = c1;
    }
}

/// The lower triangle `lower` of `A` as the lower triangle of `P A P^T` (`inverse[old]` the
/// new index): its column pointers, its rows (sorted in each column), and for each input
/// entry its position there.
fn permute_lower(
    lower: SymbolicSparseColMatRef<'_, u32>,
    inverse: &[usize],
) -> (Vec<usize>, Vec<u32>, Vec<u32>) {
    let n = lower.nrows();
    let col_ptr = lower.col_ptr();
    let rows = lower.row_idx();
    let mut counts = vec![0usize; n + 1];
    for c in 0..n {
        for &r in &rows[col_ptr[c] as usize..col_ptr[c + 1] as usize] {
            let (a, b) = (inverse[r as usize], inverse[c]);
            counts[a.min(b) + 1] += 1;
        }
    }
    for c in 0..n {
        counts[c + 1] += counts[c];
    }
    let permuted_col_ptr = counts.clone();
    let nnz = rows.len();
    let mut entries: Vec<(u32, u32)> = vec![(0, 0); nnz]; // (permuted row, input index)
    let mut next = counts;
    for c in 0..n {
        for k in col_ptr[c] as usize..col_ptr[c + 1] as usize {
            let (a, b) = (inverse[rows[k] as usize], inverse[c]);
            let col = a.min(b);
            entries[next[col]] = (a.max(b) as u32, k as u32);
            next[col] += 1;
        }
    }
    let mut input_position = vec![0u32; nnz];
    let mut permuted_rows = vec![0u32; nnz];
    for c in 0..n {
        let column = &mut entries[permuted_col_ptr[c]..permuted_col_ptr[c + 1]];
        column.sort_unstable();
        for (offset, &(row, input)) in column.iter().enumerate() {
            permuted_rows[permuted_col_ptr[c] + offset] = row;
            input_position[input as usize] = (permuted_col_ptr[c] + offset) as u32;
        }
    }
    (permuted_col_ptr, permuted_rows, input_position)
}

/// Which descendants update each of the `ns` supernodes (`pattern_of(s)`: the rows below
/// its columns): every supernode its pattern's rows fall in, consecutive rows of one
/// supernode counted once, ascending by construction. Returns the lists as pointers and
/// entries, and each supernode's parent (`u32::MAX` for a root).
fn updaters<'p>(
    ns: usize,
    pattern_of: impl Fn(usize) -> &'p [u32],
    supernode_of: &[u32],
) -> (Vec<usize>, Vec<u32>, Vec<u32>) {
    let mut lists: Vec<Vec<u32>> = vec![Vec::new(); ns];
    let mut parent = vec![u32::MAX; ns];
    for (d, parent_of_d) in parent.iter_mut().enumerate() {
        let mut last = u32::MAX;
        for &r in pattern_of(d) {
            let s = supernode_of[r as usize];
            if s != last {
                lists[s as usize].push(d as u32);
                last = s;
            }
        }
        if let Some(&r) = pattern_of(d).first() {
            *parent_of_d = supernode_of[r as usize];
        }
    }
    let mut updater_ptr = vec![0usize; ns + 1];
    let mut updaters = Vec::new();
    for (s, list) in lists.iter().enumerate() {
        updaters.extend_from_slice(list);
        updater_ptr[s + 1] = updaters.len();
    }
    (updater_ptr, updaters, parent)
}

/// The work of a supernode `width` columns wide with `below` rows under them: `sum over its
/// columns of |column of L|^2` (its dense Cholesky and the updates it sends its ancestors).
pub(crate) fn supernode_cost(width: usize, below: usize) -> f64 {
    (0..width)
        .map(|k| ((width - k + below) as f64).powi(2))
        .sum()
}

/// The tasks of the parallel factorisation: a supernode whose subtree is small (in flops of
/// its own columns and their updates of ancestors) joins the task of its subtree's top; a
/// large one is a task alone. Returns each task's members (pointers and entries, in
/// supernode order), its parent task (`u32::MAX` for a root) and its count of children.
fn group_tasks<'p>(
    widths: &[usize],
    pattern_of: impl Fn(usize) -> &'p [u32],
    parent: &[u32],
) -> [Vec<u32>; 4] {
    let ns = widths.len();
    // Parents come after their children in faer's numbering.
    let mut subtree = vec![0f64; ns];
    for s in 0..ns {
        let (w, below) = (widths[s], pattern_of(s).len());
        subtree[s] += supernode_cost(w, below);
        if parent[s] != u32::MAX {
            debug_assert!(parent[s] as usize > s);
            let own = subtree[s];
            subtree[parent[s] as usize] += own;
        }
    }
    // Tops are visited root first, so a task's members are collected by walking down.
    let is_large = |s: usize| subtree[s] >= TASK_FLOPS;
    let mut task_of = vec![u32::MAX; ns];
    let mut task_top = Vec::new();
    for s in (0..ns).rev() {
        let p = parent[s];
        if is_large(s) || p == u32::MAX || is_large(p as usize) {
            task_of[s] = task_top.len() as u32;
            task_top.push(s);
        } else {
            task_of[s] = task_of[p as usize];
        }
    }
    let tasks = task_top.len();
    let mut members: Vec<Vec<u32>> = vec![Vec::new(); tasks];
    for s in 0..ns {
        members[task_of[s] as usize].push(s as u32);
    }
    let mut task_ptr = vec![0u32; tasks + 1];
    let mut task_members = Vec::with_capacity(ns);
    let mut task_parent = vec![u32::MAX; tasks];
    let mut task_children = vec![0u32; tasks];
    for (t, list) in members.iter().enumerate() {
        task_members.extend_from_slice(list);
        task_ptr[t + 1] = task_members.len() as u32;
        let p = parent[task_top[t]];
        if p != u32::MAX {
            let pt = task_of[p as usize];
            task_parent[t] = pt;
            task_children[pt as usize] += 1;
        }
    }
    [task_ptr, task_members, task_parent, task_children]
}

#[cfg(test)]
pub(crate) mod tests;
