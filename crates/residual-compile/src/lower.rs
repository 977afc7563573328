//! Lowering a residual shape's values and Jacobian to one `hal` scalar program, run once per
//! residual instance.
//!
//! The program reads its instance's parameter indices and constants (indirect indexing, so one
//! kernel serves every instance of the shape), evaluates the shared value-and-derivative graph,
//! applies the robust loss, and writes residuals, Jacobian entries and the instance's cost:
//!
//! | buffer | dtype | contents |
//! |---|---|---|
//! | 0 `params` | float | every parameter of the problem |
//! | 1 `param_index` | u32 | `[instance * R + run]`: the first parameter of each run of slots (below) |
//! | 2 `constants` | float | `[instance * C + k]` (a 1-element dummy when `C = 0`) |
//! | 3 `offsets` | u32 | `[first residual row, first Jacobian entry, first cost entry]` |
//! | 4 `residuals` | float | row `first + instance * R + r` |
//! | 5 `jacobian` | float | entry `first + (instance * R + r) * P + k`: the CSR values (`P` differentiated slots) |
//! | 6 `cost` | float | `first + instance`: `rho(|f|^2) / 2`, NaN where a Jacobian entry is not finite |
//!
//! "float" is the solve's [`crate::Precision`]: `f64` (the default; literals and constants
//! exactly as written) or `f32`.
//!
//! The offsets come from a buffer rather than from literals so that the program depends on
//! the shape, the loss and the slot runs only, and one compiled kernel is reused by every
//! problem.
//!
//! **Slot runs**: where consecutive parameter slots hold consecutive parameters in every
//! instance (a point's x, y, z), the slots form a run and the instance stores only the run's
//! first parameter ([`SlotRuns`]). An edge between two points then reads 2 indices rather than
//! 6: the indices were the largest part of an evaluation's memory traffic.

use crate::Precision;
use crate::graph::Derivatives;
use crate::problem::Loss;
use crate::trace::{Binary, Node, Unary};
use hal::ir::{
    Access, BufferId, IrBinary, IrCmp, IrUnary, Program, ProgramBuilder, ScalarType, Value,
};

/// How a shape's parameter slots find their parameters: slot `k` reads parameter
/// `first[run[k]] + offset[k]`, where `first` is the instance's `runs()` stored indices.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SlotRuns {
    /// The run of each slot.
    pub run: Vec<u32>,
    /// Each slot's distance from its run's first slot.
    pub offset: Vec<u32>,
}

impl SlotRuns {
    /// Every slot its own run (no instance data assumed).
    pub fn single(p: usize) -> Self {
        Self {
            run: (0..p as u32).collect(),
            offset: vec![0; p],
        }
    }

    /// The longest runs `param_index` (`[instance * p + k]`) allows: slot `k` continues slot
    /// `k - 1`'s run when it holds the next parameter in every instance.
    pub fn of(param_index: &[u32], p: usize) -> Self {
        let mut continues: Vec<bool> = (0..p).map(|k| k > 0).collect();
        for inst in param_index.chunks_exact(p) {
            for k in 1..p {
                continues[k] &= inst[k - 1].checked_add(1) == Some(inst[k]);
            }
            if !continues.iter().any(|&c| c) {
                break;
            }
        }
        let (mut run, mut offset) = (Vec::with_capacity(p), Vec::with_capacity(p));
        for (k, &continued) in continues.iter().enumerate() {
            if k == 0 || !continued {
                run.push(run.last().map_or(0, |&r: &u32| r + 1));
                offset.push(0);
            } else {
                run.push(*run.last().expect("k > 0"));
                offset.push(offset.last().expect("k > 0") + 1);
            }
        }
        Self { run, offset }
    }

    /// Runs per instance.
    pub fn runs(&self) -> usize {
        self.run.last().map_or(0, |&r| r as usize + 1)
    }

    /// The stored indices, `[instance * runs() + run]`: each run's first parameter.
    pub fn firsts(&self, param_index: &[u32]) -> Vec<u32> {
        let p = self.run.len();
        let heads: Vec<usize> = (0..p).filter(|&k| self.offset[k] == 0).collect();
        let mut out = Vec::with_capacity(param_index.len() / p.max(1) * heads.len());
        for inst in param_index.chunks_exact(p) {
            out.extend(heads.iter().map(|&k| inst[k]));
        }
        out
    }
}

/// The program evaluating residuals, Jacobian and cost of every instance of one shape, its
/// parameter slots read through `runs`, in `precision`.
pub fn lower(
    derivatives: &Derivatives,
    loss: Loss,
    runs: &SlotRuns,
    name: &str,
    precision: Precision,
) -> hal::Result<Program> {
    let (dtype, ft) = (precision.dtype(), precision.scalar());
    let graph = &derivatives.graph;
    let (p, c, r) = (
        graph.n_params,
        graph.n_consts.max(1),
        graph.outputs.len() as u32,
    );
    assert_eq!(
        runs.run.len(),
        (p + graph.n_ambient) as usize,
        "a run for every slot"
    );
    let mut b = ProgramBuilder::new(name);
    let params = b.buffer(dtype, Access::Read);
    let param_index = b.buffer(hal::DType::U32, Access::Read);
    let constants = b.buffer(dtype, Access::Read);
    let offsets = b.buffer(hal::DType::U32, Access::Read);
    let residuals = b.buffer(dtype, Access::Write);
    let jacobian = b.buffer(dtype, Access::Write);
    let cost = b.buffer(dtype, Access::Write);

    let i = b.index();
    let offset = |b: &mut ProgramBuilder, k: u32| {
        let at = b.const_u32(k);
        b.load(offsets, at)
    };
    let (row0, entry0, cost0) = (offset(&mut b, 0), offset(&mut b, 1), offset(&mut b, 2));

    let needed = needed_nodes(derivatives);

    let nc = b.const_u32(c);
    let nruns = b.const_u32(runs.runs() as u32);
    let param_base = b.mul(i, nruns);
    let const_base = b.mul(i, nc);
    let mut reads = ParamReads {
        runs,
        firsts: vec![None; runs.runs()],
        base: param_base,
        param_index,
        params,
    };
    let mut value: Vec<Option<Value>> = vec![None; graph.nodes.len()];
    for (id, &node) in graph.nodes.iter().enumerate() {
        if !needed[id] {
            continue;
        }
        let v = |k: u32| value[k as usize].expect("operands precede their users");
        let out = match node {
            Node::Param(k) | Node::Ambient(k) => reads.param(&mut b, k),
            // `Graph::derivatives` folds tangent coordinates to their value, 0.
            Node::Delta(_) => b.const_float(ft, 0.0),
            Node::Const(k) => {
                let kk = b.const_u32(k);
                let at = b.add(const_base, kk);
                b.load(constants, at)
            }
            Node::Lit(bits) => b.const_float(ft, f64::from_bits(bits)),
            Node::Unary(op, x) => lower_unary(&mut b, op, v(x), ft),
            Node::Binary(op, x, y) => lower_binary(&mut b, op, v(x), v(y)),
            Node::Select {
                cmp,
                a,
                b: bb,
                t,
                f,
            } => {
                let cond = b.cmp(ir_cmp(cmp), v(a), v(bb));
                b.select(cond, v(t), v(f))
            }
        };
        value[id] = Some(out);
    }
    let v = |k: u32| value[k as usize].expect("outputs are needed");

    // The robust loss: rho of the block's squared norm, residuals and Jacobian rows scaled by
    // sqrt(rho') (the first-order correction; see `Loss`).
    let outputs: Vec<Value> = graph.outputs.iter().map(|&o| v(o)).collect();
    let mut s = b.const_float(ft, 0.0);
    for &f in &outputs {
        s = b.fma(f, f, s);
    }
    let (cost_value, scale) = robust_loss(&mut b, loss, s, ft);
    let scaled = |b: &mut ProgramBuilder, x: Value| match scale {
        Some(k) => b.mul(x, k),
        None => x,
    };

    // An instance's rows are consecutive, and so are its R x P Jacobian entries: every store
    // below is `instance base + constant`, which lets a backend combine a warp's stores (the
    // CUDA lowering does).
    let first_row = instance_base(&mut b, i, r, row0);
    let entry_base = instance_base(&mut b, i, r * p, entry0);
    // The Jacobian's finiteness folded into the cost: `d - d` is 0 for a finite entry and
    // NaN otherwise (and a sum of zeros cannot overflow), so one reduction of the costs tells
    // the solver both (an entry that is not finite makes the step unusable).
    let mut entries = b.const_float(ft, 0.0);
    for (ri, &f) in outputs.iter().enumerate() {
        let rr = b.const_u32(ri as u32);
        let row = b.add(first_row, rr);
        let fs = scaled(&mut b, f);
        b.store(residuals, row, fs);
        for k in 0..p {
            let q = b.const_u32(ri as u32 * p + k);
            let at = b.add(entry_base, q);
            let d = v(derivatives.jacobian[ri * p as usize + k as usize]);
            let ds = scaled(&mut b, d);
            b.store(jacobian, at, ds);
            let zero_if_finite = b.sub(ds, ds);
            entries = b.add(entries, zero_if_finite);
        }
    }
    let at = b.add(cost0, i);
    let cost_value = b.add(cost_value, entries);
    b.store(cost, at, cost_value);
    b.build()
}

/// `first + instance * stride`: where an instance's run of rows or entries starts.
fn instance_base(b: &mut ProgramBuilder, instance: Value, stride: u32, first: Value) -> Value {
    let s = b.const_u32(stride);
    let m = b.mul(instance, s);
    b.add(first, m)
}

/// Which nodes the outputs and the Jacobian need, so dead forward nodes cost nothing.
fn needed_nodes(derivatives: &Derivatives) -> Vec<bool> {
    let graph = &derivatives.graph;
    let mut needed = vec![false; graph.nodes.len()];
    let mut stack: Vec<u32> = graph
        .outputs
        .iter()
        .chain(&derivatives.jacobian)
        .copied()
        .collect();
    while let Some(id) = stack.pop() {
        if std::mem::replace(&mut needed[id as usize], true) {
            continue;
        }
        match graph.nodes[id as usize] {
            Node::Unary(_, x) => stack.push(x),
            Node::Binary(_, a, bb) => stack.extend([a, bb]),
            Node::Select { a, b: bb, t, f, .. } => stack.extend([a, bb, t, f]),
            _ => {}
        }
    }
    needed
}

/// The block's cost `rho(s) / 2` for the squared norm `s` of its residuals, and the factor
/// `sqrt(rho'(s))` its residuals and Jacobian rows are scaled by (none for the trivial loss).
fn robust_loss(
    b: &mut ProgramBuilder,
    loss: Loss,
    s: Value,
    ft: ScalarType,
) -> (Value, Option<Value>) {
    let half = b.const_float(ft, 0.5);
    match loss {
        Loss::Trivial => (b.mul(half, s), None),
        Loss::Huber(delta) => {
            let d = b.const_float(ft, delta);
            let d2 = b.const_float(ft, delta * delta);
            let inside = b.cmp(IrCmp::Le, s, d2);
            let norm = b.unary(IrUnary::Sqrt, s);
            let two_d = b.const_float(ft, 2.0 * delta);
            let lin = b.mul(two_d, norm);
            let outside = b.sub(lin, d2);
            let rho = b.select(inside, s, outside);
            let ratio = b.div(d, norm);
            let root = b.unary(IrUnary::Sqrt, ratio);
            let one = b.const_float(ft, 1.0);
            let scale = b.select(inside, one, root);
            (b.mul(half, rho), Some(scale))
        }
        Loss::Cauchy(delta) => {
            let inv_d2 = b.const_float(ft, 1.0 / (delta * delta));
            let d2 = b.const_float(ft, delta * delta);
            let one = b.const_float(ft, 1.0);
            let q = b.fma(s, inv_d2, one);
            let lg = b.unary(IrUnary::Log, q);
            let rho = b.mul(d2, lg);
            let inv = b.unary(IrUnary::Rsqrt, q);
            (b.mul(half, rho), Some(inv))
        }
        Loss::SoftLOne(delta) => {
            let inv_d2 = b.const_float(ft, 1.0 / (delta * delta));
            let two_d2 = b.const_float(ft, 2.0 * delta * delta);
            let one = b.const_float(ft, 1.0);
            let q = b.fma(s, inv_d2, one);
            let root = b.unary(IrUnary::Sqrt, q);
            let excess = b.sub(root, one);
            let rho = b.mul(two_d2, excess);
            // sqrt(rho') = q^(-1/4).
            let inv = b.unary(IrUnary::Rsqrt, q);
            let scale = b.unary(IrUnary::Sqrt, inv);
            (b.mul(half, rho), Some(scale))
        }
        Loss::Tukey(delta) => {
            let d2 = b.const_float(ft, delta * delta);
            let inv_d2 = b.const_float(ft, 1.0 / (delta * delta));
            let third = b.const_float(ft, delta * delta / 3.0);
            let one = b.const_float(ft, 1.0);
            let zero = b.const_float(ft, 0.0);
            let inside = b.cmp(IrCmp::Le, s, d2);
            // u = 1 - s / delta^2, clamped at 0 outside.
            let neg = b.mul(s, inv_d2);
            let u = b.sub(one, neg);
            let u = b.select(inside, u, zero);
            let u2 = b.mul(u, u);
            let u3 = b.mul(u2, u);
            let gap = b.sub(one, u3);
            let rho = b.mul(third, gap);
            (b.mul(half, rho), Some(u))
        }
    }
}

/// Loads of parameter slots through [`SlotRuns`]: each run's first parameter index loaded
/// once, the others at a constant offset from it.
struct ParamReads<'a> {
    runs: &'a SlotRuns,
    /// Each run's first parameter index, once loaded.
    firsts: Vec<Option<Value>>,
    /// The instance's first stored index (`instance * runs`).
    base: Value,
    param_index: BufferId,
    params: BufferId,
}

impl ParamReads<'_> {
    /// The value of parameter slot `k`.
    fn param(&mut self, b: &mut ProgramBuilder, k: u32) -> Value {
        let (run, offset) = (self.runs.run[k as usize], self.runs.offset[k as usize]);
        let first = match self.firsts[run as usize] {
            Some(f) => f,
            None => {
                let rr = b.const_u32(run);
                let at = b.add(self.base, rr);
                let f = b.load(self.param_index, at);
                self.firsts[run as usize] = Some(f);
                f
            }
        };
        let which = if offset == 0 {
            first
        } else {
            let o = b.const_u32(offset);
            b.add(first, o)
        };
        b.load(self.params, which)
    }
}

fn lower_binary(b: &mut ProgramBuilder, op: Binary, x: Value, y: Value) -> Value {
    let ir = match op {
        Binary::Add => IrBinary::Add,
        Binary::Sub => IrBinary::Sub,
        Binary::Mul => IrBinary::Mul,
        Binary::Div => IrBinary::Div,
        Binary::Pow => IrBinary::Pow,
        Binary::Atan2 => IrBinary::Atan2,
        Binary::Min => IrBinary::Min,
        Binary::Max => IrBinary::Max,
    };
    b.binary(ir, x, y)
}

fn ir_cmp(cmp: crate::trace::Cmp) -> IrCmp {
    match cmp {
        crate::trace::Cmp::Lt => IrCmp::Lt,
        crate::trace::Cmp::Le => IrCmp::Le,
        crate::trace::Cmp::Gt => IrCmp::Gt,
        crate::trace::Cmp::Ge => IrCmp::Ge,
        crate::trace::Cmp::Eq => IrCmp::Eq,
        crate::trace::Cmp::Ne => IrCmp::Ne,
    }
}

fn lower_unary(b: &mut ProgramBuilder, op: Unary, x: Value, ft: ScalarType) -> Value {
    let direct = |b: &mut ProgramBuilder, ir| b.unary(ir, x);
    match op {
        Unary::Neg => direct(b, IrUnary::Neg),
        Unary::Sqrt => direct(b, IrUnary::Sqrt),
        Unary::Rsqrt => direct(b, IrUnary::Rsqrt),
        Unary::Exp => direct(b, IrUnary::Exp),
        Unary::Log => direct(b, IrUnary::Log),
        Unary::Sin => direct(b, IrUnary::Sin),
        Unary::Cos => direct(b, IrUnary::Cos),
        Unary::Tan => direct(b, IrUnary::Tan),
        // atan(x) = atan2(x, 1): every backend has atan2, with the reference's special values.
        Unary::Atan => {
            let one = b.const_float(ft, 1.0);
            b.binary(IrBinary::Atan2, x, one)
        }
        Unary::Tanh => direct(b, IrUnary::Tanh),
        Unary::Abs => direct(b, IrUnary::Abs),
        Unary::Sigmoid => {
            let n = b.unary(IrUnary::Neg, x);
            let e = b.unary(IrUnary::Exp, n);
            let one = b.const_float(ft, 1.0);
            let d = b.add(one, e);
            b.unary(IrUnary::Recip, d)
        }
        Unary::Relu => {
            let z = b.const_float(ft, 0.0);
            b.binary(IrBinary::Max, x, z)
        }
        Unary::Softplus => {
            // max(x, 0) + ln(1 + e^-|x|): no overflow for large |x|.
            let z = b.const_float(ft, 0.0);
            let pos = b.binary(IrBinary::Max, x, z);
            let a = b.unary(IrUnary::Abs, x);
            let na = b.unary(IrUnary::Neg, a);
            let e = b.unary(IrUnary::Exp, na);
            let one = b.const_float(ft, 1.0);
            let s = b.add(one, e);
            let l = b.unary(IrUnary::Log, s);
            b.add(pos, l)
        }
        Unary::PowI(n) => {
            // Square-and-multiply; a negative power is the reciprocal of the positive one.
            let mut result: Option<Value> = None;
            let mut base = x;
            let mut e = n.unsigned_abs();
            while e > 0 {
                if e & 1 == 1 {
                    result = Some(match result {
                        None => base,
                        Some(acc) => b.mul(acc, base),
                    });
                }
                e >>= 1;
                if e > 0 {
                    base = b.mul(base, base);
                }
            }
            let positive = result.unwrap_or_else(|| b.const_float(ft, 1.0));
            if n < 0 {
                b.unary(IrUnary::Recip, positive)
            } else {
                positive
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::SlotRuns;

    #[test]
    fn slot_runs_follow_consecutive_indices_in_every_instance() {
        // Two points of three coordinates each, in two instances.
        let index = [9, 10, 11, 3, 4, 5, 0, 1, 2, 30, 31, 32];
        let runs = SlotRuns::of(&index, 6);
        assert_eq!(runs.run, vec![0, 0, 0, 1, 1, 1]);
        assert_eq!(runs.offset, vec![0, 1, 2, 0, 1, 2]);
        assert_eq!(runs.firsts(&index), vec![9, 3, 0, 30]);
        // One instance breaks the second run after its first slot.
        let index = [9, 10, 11, 3, 4, 5, 0, 1, 2, 30, 7, 8];
        let runs = SlotRuns::of(&index, 6);
        assert_eq!(runs.run, vec![0, 0, 0, 1, 2, 2]);
        assert_eq!(runs.offset, vec![0, 1, 2, 0, 0, 1]);
        assert_eq!(runs.firsts(&index), vec![9, 3, 4, 0, 30, 7]);
        // u32::MAX has no successor; a single slot is one run.
        assert_eq!(SlotRuns::of(&[u32::MAX, 0], 2).runs(), 2);
        assert_eq!(SlotRuns::of(&[5, 6], 1), SlotRuns::single(1));
    }
}
