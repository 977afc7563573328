//! A least-squares problem: parameters, and residual blocks grouped by topology as they are
//! traced.

use crate::Error;
use crate::graph::Graph;
use crate::manifold::{Manifold, TangentSpace};
use crate::slots::{ManifoldMap, SlotPlan, trace_block};
use crate::trace::{Node, Tape, Var};
use std::collections::HashMap;

/// A robust loss `rho(s)` applied to a residual block's squared norm `s = |f|^2`; the block
/// contributes `rho(s) / 2` to the cost.
///
/// The solver uses the first-order correction: the block's residuals and Jacobian rows are
/// scaled by `sqrt(rho'(s))`, which makes each Gauss-Newton step an iteratively reweighted
/// least-squares step (Ceres adds a second-order term where `rho'' < 0`; we do not).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Loss {
    /// `rho(s) = s`.
    Trivial,
    /// `rho(s) = s` for `s <= delta^2`, else `2 delta sqrt(s) - delta^2`.
    Huber(f64),
    /// `rho(s) = delta^2 ln(1 + s / delta^2)`.
    Cauchy(f64),
    /// Ceres's `SoftLOneLoss`: `rho(s) = 2 delta^2 (sqrt(1 + s / delta^2) - 1)`.
    SoftLOne(f64),
    /// Ceres's `TukeyLoss`: `rho(s) = delta^2 / 3 (1 - (1 - s / delta^2)^3)` for
    /// `s <= delta^2`, else `delta^2 / 3` (observations that far contribute no gradient).
    Tukey(f64),
}

impl Loss {
    /// The loss as plain bits: part of a residual shape's identity (lookup and kernel cache).
    pub(crate) fn key(self) -> (u8, u64) {
        match self {
            Loss::Trivial => (0, 0),
            Loss::Huber(d) => (1, d.to_bits()),
            Loss::Cauchy(d) => (2, d.to_bits()),
            Loss::SoftLOne(d) => (3, d.to_bits()),
            Loss::Tukey(d) => (4, d.to_bits()),
        }
    }

    /// `rho(s)` in `f64`.
    pub fn rho(self, s: f64) -> f64 {
        match self {
            Loss::Trivial => s,
            Loss::Huber(d) if s <= d * d => s,
            Loss::Huber(d) => 2.0 * d * s.sqrt() - d * d,
            Loss::Cauchy(d) => d * d * (s / (d * d)).ln_1p(),
            Loss::SoftLOne(d) => 2.0 * d * d * ((1.0 + s / (d * d)).sqrt() - 1.0),
            Loss::Tukey(d) if s <= d * d => d * d / 3.0 * (1.0 - (1.0 - s / (d * d)).powi(3)),
            Loss::Tukey(d) => d * d / 3.0,
        }
    }

    /// `sqrt(rho'(s))`: the scale of the block's residuals and Jacobian rows.
    pub fn scale(self, s: f64) -> f64 {
        match self {
            Loss::Trivial => 1.0,
            Loss::Huber(d) if s <= d * d => 1.0,
            Loss::Huber(d) => (d / s.sqrt()).sqrt(),
            Loss::Cauchy(d) => (1.0 / (1.0 + s / (d * d))).sqrt(),
            Loss::SoftLOne(d) => (1.0 + s / (d * d)).powf(-0.25),
            Loss::Tukey(d) if s <= d * d => 1.0 - s / (d * d),
            Loss::Tukey(_) => 0.0,
        }
    }
}

/// All instances of one residual shape (one topology signature and one loss): they share one
/// compiled kernel.
#[derive(Clone, Debug)]
pub struct ResidualGroup {
    /// The name of the first block added with this shape.
    pub name: String,
    pub graph: Graph,
    pub signature: u64,
    pub loss: Loss,
    /// `[instance * S + k]`: the problem parameter slot `k` reads, `S` the graph's slots
    /// ([`ResidualGroup::slots_per_instance`]). A manifold block's tangent slot `j` holds its
    /// block's parameter `j` (a placeholder: it reads nothing, but names its column).
    pub param_index: Vec<u32>,
    /// `[instance * C + k]`.
    pub constants: Vec<f64>,
    /// The problem-wide residual block id of each instance.
    pub block_ids: Vec<u32>,
}

impl ResidualGroup {
    pub fn len(&self) -> usize {
        self.block_ids.len()
    }
    pub fn is_empty(&self) -> bool {
        self.block_ids.is_empty()
    }
    /// Jacobian columns per instance: scalar parameters and manifold tangent coordinates.
    pub fn params_per_instance(&self) -> usize {
        self.graph.n_params as usize
    }
    /// Parameter indices stored per instance: the differentiated slots, then the manifold
    /// blocks' stored values.
    pub fn slots_per_instance(&self) -> usize {
        (self.graph.n_params + self.graph.n_ambient) as usize
    }
    /// Residuals per instance.
    pub fn residuals_per_instance(&self) -> usize {
        self.graph.outputs.len()
    }
}

/// A nonlinear least-squares problem: minimise `sum over blocks of rho_b(|f_b(x)|^2) / 2`.
///
/// ```
/// use residual_compile::{Problem, Loss};
/// let mut p = Problem::new();
/// let x = p.add_parameters(&[3.0, -1.0]);
/// // (x0 - 1)^2 + 10 (x1 - x0^2)^2 ... as two residuals of one block
/// p.add_residual("rosenbrock", &[x, x + 1], &[], Loss::Trivial, |v, _| {
///     vec![1.0 - v[0], 10.0 * (v[1] - v[0] * v[0])]
/// }).unwrap();
/// assert_eq!(p.groups().len(), 1);
/// ```
#[derive(Default)]
pub struct Problem {
    params: Vec<f64>,
    fixed: Vec<bool>,
    /// Per parameter, the bounds a solve keeps it within (`-inf` and `inf` by default).
    lower: Vec<f64>,
    upper: Vec<f64>,
    groups: Vec<ResidualGroup>,
    lookup: HashMap<(u64, (u8, u64)), Vec<usize>>,
    names: Vec<String>,
    name_ids: HashMap<String, u32>,
    /// Per residual block: (group, instance within the group, name id).
    blocks: Vec<(u32, u32, u32)>,
    tape: Tape,
    rows: usize,
    /// The group of the last block added.
    last_group: Option<usize>,
    /// Blocks on manifolds: first parameter and manifold.
    manifolds: Vec<(usize, Manifold)>,
    /// Per parameter: the entry of `manifolds` it belongs to (`u32::MAX`: Euclidean).
    manifold_of: Vec<u32>,
    /// Per parameter: read by a residual block already.
    referenced: Vec<bool>,
    /// Blocks the Schur engine eliminates: first parameter, block size, count.
    eliminated: Option<(usize, usize, usize)>,
}

impl Problem {
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends parameters with their initial values; returns the index of the first.
    pub fn add_parameters(&mut self, values: &[f64]) -> usize {
        let first = self.params.len();
        self.params.extend_from_slice(values);
        self.fixed.resize(self.params.len(), false);
        self.lower.resize(self.params.len(), f64::NEG_INFINITY);
        self.upper.resize(self.params.len(), f64::INFINITY);
        self.manifold_of.resize(self.params.len(), u32::MAX);
        self.referenced.resize(self.params.len(), false);
        first
    }

    /// Puts parameters `first..first + manifold.ambient_size()` on `manifold` (Ceres's
    /// `SetManifold`): solves step in its tangent space and move the block by its `plus`
    /// (see [`crate::manifold`]). A residual block must then read the whole block, in order
    /// (`&[q, q + 1, q + 2, q + 3]` for a quaternion at `q`). Refused for parameters that are
    /// out of range, already on a manifold, bounded, or already read by a residual block
    /// (their kernels were traced Euclidean).
    pub fn set_manifold(&mut self, first: usize, manifold: Manifold) -> Result<(), Error> {
        let a = manifold.ambient_size();
        let range = first..first + a;
        let bad = |detail: String| {
            Err(Error::InvalidProblem(format!(
                "set_manifold({first}, {manifold:?}): {detail}"
            )))
        };
        if range.end > self.params.len() {
            return bad(format!(
                "the block needs parameters {first}..{} and the problem has {}",
                range.end,
                self.params.len()
            ));
        }
        if let Some(i) = range.clone().find(|&i| self.manifold_of[i] != u32::MAX) {
            return bad(format!("parameter {i} is on a manifold already"));
        }
        if let Some(i) = range.clone().find(|&i| self.referenced[i]) {
            return bad(format!(
                "parameter {i} is read by a residual block already; set manifolds before \
                 adding the residuals that read them"
            ));
        }
        if let Some(i) = range
            .clone()
            .find(|&i| self.lower[i].is_finite() || self.upper[i].is_finite())
        {
            return bad(format!(
                "parameter {i} has a bound; a manifold block cannot"
            ));
        }
        let id = self.manifolds.len() as u32;
        self.manifolds.push((first, manifold));
        for i in range {
            self.manifold_of[i] = id;
        }
        Ok(())
    }

    /// The manifold parameter `index`'s block lives on, with the block's first parameter.
    pub fn manifold(&self, index: usize) -> Option<(usize, Manifold)> {
        let id = *self.manifold_of.get(index)?;
        (id != u32::MAX).then(|| self.manifolds[id as usize])
    }

    /// Declares `count` blocks of `size` parameters from `first` on (a bundle adjustment's
    /// points) as the blocks [`crate::LinearSolver::DenseSchur`] eliminates (Ceres's
    /// elimination group 0): each is solved for in closed form given the rest, so only the
    /// reduced system of the other parameters is factorised. The blocks must be free,
    /// Euclidean and unbounded when solved, and no residual block may read two of them.
    /// `size` is 1 to 16.
    pub fn set_eliminated(&mut self, first: usize, size: usize, count: usize) -> Result<(), Error> {
        let end = size
            .checked_mul(count)
            .and_then(|n| n.checked_add(first))
            .filter(|&end| end <= self.params.len() && (1..=16).contains(&size) && count > 0);
        if end.is_none() {
            return Err(Error::InvalidProblem(format!(
                "set_eliminated({first}, {size}, {count}): blocks of 1 to 16 parameters, at \
                 least one, inside the problem's {} parameters",
                self.params.len()
            )));
        }
        self.eliminated = Some((first, size, count));
        Ok(())
    }

    /// The blocks [`Problem::set_eliminated`] declared: first parameter, size, count.
    pub fn eliminated(&self) -> Option<(usize, usize, usize)> {
        self.eliminated
    }

    fn manifold_map(&self) -> ManifoldMap<'_> {
        ManifoldMap {
            manifold_of: &self.manifold_of,
            manifolds: &self.manifolds,
        }
    }

    /// The solver's columns for this problem's parameters (see [`TangentSpace`]).
    pub fn tangent_space(&self) -> Result<TangentSpace, Error> {
        TangentSpace::new(self.params.len(), &self.manifolds, &self.fixed)
    }

    /// Keeps parameter `index` at or above `bound` during solves (Ceres's
    /// `SetParameterLowerBound`): every step is projected onto the bounds. `-inf` removes
    /// the bound; NaN is refused.
    pub fn set_lower_bound(&mut self, index: usize, bound: f64) -> Result<(), Error> {
        self.set_bound(index, bound, true)
    }

    /// Keeps parameter `index` at or below `bound` during solves (Ceres's
    /// `SetParameterUpperBound`). `inf` removes the bound; NaN is refused.
    pub fn set_upper_bound(&mut self, index: usize, bound: f64) -> Result<(), Error> {
        self.set_bound(index, bound, false)
    }

    fn set_bound(&mut self, index: usize, bound: f64, lower: bool) -> Result<(), Error> {
        let (what, n) = (if lower { "lower" } else { "upper" }, self.params.len());
        if bound.is_nan() {
            return Err(Error::InvalidProblem(format!(
                "set_{what}_bound: the bound of parameter {index} is NaN"
            )));
        }
        if let Some((first, m)) = self.manifold(index) {
            return Err(Error::InvalidProblem(format!(
                "set_{what}_bound: parameter {index} is in the {m:?} block at {first}; a \
                 manifold block cannot be bounded"
            )));
        }
        let slot = if lower {
            self.lower.get_mut(index)
        } else {
            self.upper.get_mut(index)
        };
        *slot.ok_or_else(|| {
            Error::InvalidProblem(format!(
                "set_{what}_bound: parameter {index} does not exist (the problem has {n})"
            ))
        })? = bound;
        Ok(())
    }

    /// Parameter `index`'s bounds, `(lower, upper)`.
    pub fn bounds(&self, index: usize) -> (f64, f64) {
        (
            self.lower.get(index).copied().unwrap_or(f64::NEG_INFINITY),
            self.upper.get(index).copied().unwrap_or(f64::INFINITY),
        )
    }

    /// Whether any parameter has a finite bound.
    pub(crate) fn has_bounds(&self) -> bool {
        self.lower.iter().chain(&self.upper).any(|b| b.is_finite())
    }

    /// Checks that every parameter's bounds are ordered and hold its current value (a solve
    /// starts from a feasible point, as Ceres requires).
    pub(crate) fn check_bounds(&self) -> Result<(), Error> {
        for (i, &x) in self.params.iter().enumerate() {
            let (lo, hi) = self.bounds(i);
            if lo > hi {
                return Err(Error::InvalidProblem(format!(
                    "parameter {i}: lower bound {lo} above upper bound {hi}"
                )));
            }
            if !(lo..=hi).contains(&x) {
                return Err(Error::InvalidProblem(format!(
                    "parameter {i} starts at {x}, outside its bounds [{lo}, {hi}]"
                )));
            }
        }
        Ok(())
    }

    /// Holds parameter `index` at its current value during solves.
    pub fn set_fixed(&mut self, index: usize, fixed: bool) -> Result<(), Error> {
        let n = self.params.len();
        *self.fixed.get_mut(index).ok_or_else(|| {
            Error::InvalidProblem(format!(
                "set_fixed: parameter {index} does not exist (the problem has {n})"
            ))
        })? = fixed;
        Ok(())
    }

    pub fn is_fixed(&self, index: usize) -> bool {
        self.fixed.get(index).copied().unwrap_or(false)
    }

    pub fn parameters(&self) -> &[f64] {
        &self.params
    }

    pub fn parameters_mut(&mut self) -> &mut [f64] {
        &mut self.params
    }

    /// Whether any parameter block is on a manifold.
    pub fn has_manifolds(&self) -> bool {
        !self.manifolds.is_empty()
    }

    pub fn groups(&self) -> &[ResidualGroup] {
        &self.groups
    }

    /// Residual blocks added.
    pub fn num_blocks(&self) -> usize {
        self.blocks.len()
    }

    /// Scalar residuals (rows of the Jacobian).
    pub fn num_residuals(&self) -> usize {
        self.rows
    }

    /// The name and the instance number (its block id) of residual block `block`.
    pub fn block_name(&self, block: usize) -> Option<&str> {
        self.blocks
            .get(block)
            .map(|&(_, _, name)| self.names[name as usize].as_str())
    }

    /// Adds a residual block: `f(params, constants)` traced once on this instance's values'
    /// slots. `params` are problem parameter indices (each at most once), `constants` this
    /// instance's data. Blocks whose traced graphs are equal (same operations, wiring and
    /// literals) and whose losses are equal share one compiled kernel. Returns the block id.
    pub fn add_residual<F>(
        &mut self,
        name: &str,
        params: &[usize],
        constants: &[f64],
        loss: Loss,
        f: F,
    ) -> Result<usize, Error>
    where
        F: for<'t> Fn(&[Var<'t>], &[Var<'t>]) -> Vec<Var<'t>>,
    {
        let block = self.blocks.len();
        check_block(name, block, params, constants, loss, self.params.len())?;
        let plan = self
            .manifold_map()
            .plan(params)
            .map_err(|detail| block_error(name, block, detail))?;
        // The tape is taken out while its nodes are looked up, so they need no copy.
        let tape = std::mem::take(&mut self.tape);
        let group = trace_block(&tape, &plan, constants.len(), &f).map(|outputs| {
            let nodes = tape.nodes();
            self.group_for(name, &nodes, &outputs, &plan, constants.len(), loss)
        });
        self.tape = tape;
        let group = group.map_err(|detail| block_error(name, block, detail))?;
        let name_id = self.name_id(name);
        self.push_instances(group, name_id, &plan.slots, constants, 1);
        Ok(block)
    }

    /// Adds `count` residual blocks of one arity at once, traced in parallel: block `i` reads
    /// parameters `params[i * P..(i + 1) * P]` and constants `constants[i * C..(i + 1) * C]`
    /// (`count = params.len() / P`; `constants.len()` must be `count * C`). The result is the
    /// same as `count` calls of [`Problem::add_residual`] in order (groups, instance order,
    /// block ids), but when any block is invalid nothing is added and the error names the
    /// first invalid block. Returns the first block id.
    #[allow(clippy::too_many_arguments)]
    pub fn add_residuals<F>(
        &mut self,
        name: &str,
        params_per_block: usize,
        params: &[usize],
        constants_per_block: usize,
        constants: &[f64],
        loss: Loss,
        f: F,
    ) -> Result<usize, Error>
    where
        F: for<'t> Fn(&[Var<'t>], &[Var<'t>]) -> Vec<Var<'t>> + Sync,
    {
        use rayon::prelude::*;
        let first = self.blocks.len();
        if params_per_block == 0 {
            return Err(block_error(name, first, "it has no parameters".into()));
        }
        let count = params.len() / params_per_block;
        if params.len() != count * params_per_block
            || constants.len() != count * constants_per_block
        {
            return Err(Error::InvalidProblem(format!(
                "add_residuals '{name}': {} parameter indices and {} constants do not make whole blocks of {params_per_block} and {constants_per_block}",
                params.len(),
                constants.len()
            )));
        }
        let n_total = self.params.len();
        let map = self.manifold_map();
        // Runs of consecutive blocks with one graph, per chunk of blocks; each chunk on its
        // own tape.
        struct Run {
            nodes: Vec<Node>,
            outputs: Vec<u32>,
            plan: SlotPlan,
            /// The blocks' slots, flattened.
            slots: Vec<u32>,
            blocks: std::ops::Range<usize>,
        }
        const CHUNK: usize = 4096;
        let chunks: Vec<Result<Vec<Run>, Error>> = (0..count.div_ceil(CHUNK))
            .into_par_iter()
            .map(|c| {
                let tape = Tape::new();
                let mut runs: Vec<Run> = Vec::new();
                for i in c * CHUNK..((c + 1) * CHUNK).min(count) {
                    let bp = &params[i * params_per_block..(i + 1) * params_per_block];
                    let bc = &constants[i * constants_per_block..(i + 1) * constants_per_block];
                    check_block(name, first + i, bp, bc, loss, n_total)?;
                    let plan = map
                        .plan(bp)
                        .map_err(|detail| block_error(name, first + i, detail))?;
                    let outputs = trace_block(&tape, &plan, bc.len(), &f)
                        .map_err(|detail| block_error(name, first + i, detail))?;
                    let nodes = tape.nodes();
                    match runs.last_mut() {
                        Some(r) if r.outputs == outputs && r.nodes == *nodes => {
                            r.blocks.end = i + 1;
                            r.slots.extend_from_slice(&plan.slots);
                        }
                        _ => runs.push(Run {
                            nodes: nodes.clone(),
                            outputs,
                            slots: plan.slots.clone(),
                            plan,
                            blocks: i..i + 1,
                        }),
                    }
                }
                Ok(runs)
            })
            .collect();
        let mut all = Vec::new();
        for chunk in chunks {
            all.extend(chunk?);
        }
        let name_id = self.name_id(name);
        for run in all {
            let group = self.group_for(
                name,
                &run.nodes,
                &run.outputs,
                &run.plan,
                constants_per_block,
                loss,
            );
            let (lo, hi) = (run.blocks.start, run.blocks.end);
            self.push_instances(
                group,
                name_id,
                &run.slots,
                &constants[lo * constants_per_block..hi * constants_per_block],
                hi - lo,
            );
        }
        Ok(first)
    }

    /// The group of a traced graph: the last block's when equal (consecutive blocks usually
    /// share a shape, and comparing is cheaper than hashing), else found by signature, else new.
    fn group_for(
        &mut self,
        name: &str,
        nodes: &[Node],
        outputs: &[u32],
        plan: &SlotPlan,
        n_consts: usize,
        loss: Loss,
    ) -> usize {
        let (n_params, n_ambient, n_consts) = (plan.n_params, plan.n_ambient, n_consts as u32);
        let same_graph = |graph: &Graph| {
            graph.n_params == n_params
                && graph.n_ambient == n_ambient
                && graph.n_consts == n_consts
                && graph.outputs == outputs
                && graph.nodes == nodes
        };
        if let Some(g) = self
            .last_group
            .filter(|&g| self.groups[g].loss == loss && same_graph(&self.groups[g].graph))
        {
            return g;
        }
        let signature = crate::graph::signature_of(nodes, outputs, n_params, n_ambient, n_consts);
        let candidates = self.lookup.entry((signature, loss.key())).or_default();
        let group = match candidates
            .iter()
            .copied()
            .find(|&g| same_graph(&self.groups[g].graph))
        {
            Some(g) => g,
            None => {
                self.groups.push(ResidualGroup {
                    name: name.to_string(),
                    graph: Graph {
                        nodes: nodes.to_vec(),
                        outputs: outputs.to_vec(),
                        n_params,
                        n_ambient,
                        n_consts,
                    },
                    signature,
                    loss,
                    param_index: Vec::new(),
                    constants: Vec::new(),
                    block_ids: Vec::new(),
                });
                candidates.push(self.groups.len() - 1);
                self.groups.len() - 1
            }
        };
        self.last_group = Some(group);
        group
    }

    /// The id of a block name (the last block's when equal: names come in runs).
    fn name_id(&mut self, name: &str) -> u32 {
        let last = self.blocks.last().map(|b| b.2);
        if let Some(id) = last.filter(|&id| self.names[id as usize] == name) {
            return id;
        }
        if let Some(&id) = self.name_ids.get(name) {
            return id;
        }
        self.names.push(name.to_string());
        let id = self.names.len() as u32 - 1;
        self.name_ids.insert(name.to_string(), id);
        id
    }

    /// Appends `count` instances of `group` (their slots' parameter indices and constants
    /// flattened) as the next blocks.
    fn push_instances(
        &mut self,
        group: usize,
        name_id: u32,
        slots: &[u32],
        constants: &[f64],
        count: usize,
    ) {
        for &p in slots {
            self.referenced[p as usize] = true;
        }
        let g = &mut self.groups[group];
        let first_instance = g.block_ids.len() as u32;
        let first_block = self.blocks.len() as u32;
        g.param_index.extend_from_slice(slots);
        g.constants.extend_from_slice(constants);
        g.block_ids
            .extend((0..count as u32).map(|i| first_block + i));
        self.rows += count * g.graph.outputs.len();
        self.blocks
            .extend((0..count as u32).map(|i| (group as u32, first_instance + i, name_id)));
    }

    /// The cost `sum rho(|f|^2) / 2` at `params`, in `f64` on the host (the reference).
    pub fn cost_f64(&self, params: &[f64]) -> f64 {
        let mut total = 0.0;
        for g in &self.groups {
            let (p, c) = (g.slots_per_instance(), g.graph.n_consts as usize);
            let mut x = vec![0.0; p];
            for i in 0..g.len() {
                for (k, slot) in x.iter_mut().enumerate() {
                    *slot = params[g.param_index[i * p + k] as usize];
                }
                let consts = &g.constants[i * c..(i + 1) * c];
                let s: f64 = g.graph.eval(&x, consts).iter().map(|r| r * r).sum();
                total += 0.5 * g.loss.rho(s);
            }
        }
        total
    }

    /// Which block and residual a Jacobian row belongs to, given rows laid out group by group.
    /// The block whose cost is entry `entry` of an evaluation's per-block costs (blocks in
    /// group order, as the rows).
    pub(crate) fn locate_cost(&self, entry: usize) -> Option<usize> {
        let mut first = 0;
        for g in &self.groups {
            if entry < first + g.len() {
                return Some(g.block_ids[entry - first] as usize);
            }
            first += g.len();
        }
        None
    }

    pub(crate) fn locate_row(&self, row: usize) -> Option<(usize, usize)> {
        let mut first = 0;
        for g in &self.groups {
            let r = g.residuals_per_instance();
            let n = g.len() * r;
            if row < first + n {
                let local = row - first;
                return Some((g.block_ids[local / r] as usize, local % r));
            }
            first += n;
        }
        None
    }
}

fn block_error(name: &str, block: usize, detail: String) -> Error {
    Error::InvalidProblem(format!("residual block '{name}' (block {block}): {detail}"))
}

/// The checks every block passes before it is traced.
fn check_block(
    name: &str,
    block: usize,
    params: &[usize],
    constants: &[f64],
    loss: Loss,
    n_params: usize,
) -> Result<(), Error> {
    let bad = |detail: String| block_error(name, block, detail);
    if params.is_empty() {
        return Err(bad("it has no parameters".into()));
    }
    for (k, &p) in params.iter().enumerate() {
        if p >= n_params {
            return Err(bad(format!(
                "parameter index {p} is out of range (the problem has {n_params} parameters)"
            )));
        }
        if params[..k].contains(&p) {
            return Err(bad(format!("parameter {p} appears twice")));
        }
    }
    if let Some(c) = constants.iter().find(|c| !c.is_finite()) {
        return Err(bad(format!("constant {c} is not finite")));
    }
    match loss {
        Loss::Huber(d) | Loss::Cauchy(d) | Loss::SoftLOne(d) | Loss::Tukey(d)
            if !(d.is_finite() && d > 0.0) =>
        {
            Err(bad(format!("loss scale {d} must be finite and positive")))
        }
        _ => Ok(()),
    }
}
