//! Lowering a residual shape's values and Jacobian to one `hal` scalar program, run once per
//! residual instance.
//!
//! The program reads its instance's parameter indices and constants (indirect indexing, so one
//! kernel serves every instance of the shape), evaluates the shared value-and-derivative graph,
//! applies the robust loss, and writes residuals, Jacobian entries and the instance's cost:
//!
//! | buffer | dtype | contents |
//! |---|---|---|
//! | 0 `params` | f32 | every parameter of the problem |
//! | 1 `param_index` | u32 | `[instance * P + k]`: the parameter in slot `k` |
//! | 2 `constants` | f32 | `[instance * C + k]` (a 1-element dummy when `C = 0`) |
//! | 3 `offsets` | u32 | `[first residual row, first Jacobian entry, first cost entry]` |
//! | 4 `residuals` | f32 | row `first + instance * R + r` |
//! | 5 `jacobian` | f32 | entry `first + (instance * R + r) * P + k`: the CSR values |
//! | 6 `cost` | f32 | `first + instance`: `rho(|f|^2) / 2` |
//!
//! The offsets come from a buffer rather than from literals so that the program depends on
//! the shape and the loss only, and one compiled kernel is reused by every problem.

use crate::graph::Derivatives;
use crate::problem::Loss;
use crate::trace::{Binary, Node, Unary};
use hal::DType;
use hal::ir::{Access, IrBinary, IrCmp, IrUnary, Program, ProgramBuilder, Value};

/// The program evaluating residuals, Jacobian and cost of every instance of one shape.
pub fn lower(derivatives: &Derivatives, loss: Loss, name: &str) -> hal::Result<Program> {
    let graph = &derivatives.graph;
    let (p, c, r) = (
        graph.n_params,
        graph.n_consts.max(1),
        graph.outputs.len() as u32,
    );
    let mut b = ProgramBuilder::new(name);
    let params = b.buffer(DType::F32, Access::Read);
    let param_index = b.buffer(DType::U32, Access::Read);
    let constants = b.buffer(DType::F32, Access::Read);
    let offsets = b.buffer(DType::U32, Access::Read);
    let residuals = b.buffer(DType::F32, Access::Write);
    let jacobian = b.buffer(DType::F32, Access::Write);
    let cost = b.buffer(DType::F32, Access::Write);

    let i = b.index();
    let offset = |b: &mut ProgramBuilder, k: u32| {
        let at = b.const_u32(k);
        b.load(offsets, at)
    };
    let (row0, entry0, cost0) = (offset(&mut b, 0), offset(&mut b, 1), offset(&mut b, 2));

    // Which nodes the outputs need, so dead forward nodes cost nothing.
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

    let np = b.const_u32(p);
    let nc = b.const_u32(c);
    let param_base = b.mul(i, np);
    let const_base = b.mul(i, nc);
    let mut value: Vec<Option<Value>> = vec![None; graph.nodes.len()];
    for (id, &node) in graph.nodes.iter().enumerate() {
        if !needed[id] {
            continue;
        }
        let v = |k: u32| value[k as usize].expect("operands precede their users");
        let out = match node {
            Node::Param(k) => {
                let kk = b.const_u32(k);
                let at = b.add(param_base, kk);
                let which = b.load(param_index, at);
                b.load(params, which)
            }
            Node::Const(k) => {
                let kk = b.const_u32(k);
                let at = b.add(const_base, kk);
                b.load(constants, at)
            }
            Node::Lit(bits) => b.const_f32(f64::from_bits(bits) as f32),
            Node::Unary(op, x) => lower_unary(&mut b, op, v(x)),
            Node::Binary(op, x, y) => {
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
                b.binary(ir, v(x), v(y))
            }
            Node::Select {
                cmp,
                a,
                b: bb,
                t,
                f,
            } => {
                let ir = match cmp {
                    crate::trace::Cmp::Lt => IrCmp::Lt,
                    crate::trace::Cmp::Le => IrCmp::Le,
                    crate::trace::Cmp::Gt => IrCmp::Gt,
                    crate::trace::Cmp::Ge => IrCmp::Ge,
                    crate::trace::Cmp::Eq => IrCmp::Eq,
                    crate::trace::Cmp::Ne => IrCmp::Ne,
                };
                let cond = b.cmp(ir, v(a), v(bb));
                b.select(cond, v(t), v(f))
            }
        };
        value[id] = Some(out);
    }
    let v = |k: u32| value[k as usize].expect("outputs are needed");

    // The robust loss: rho of the block's squared norm, residuals and Jacobian rows scaled by
    // sqrt(rho') (the first-order correction; see `Loss`).
    let outputs: Vec<Value> = graph.outputs.iter().map(|&o| v(o)).collect();
    let mut s = b.const_f32(0.0);
    for &f in &outputs {
        s = b.fma(f, f, s);
    }
    let half = b.const_f32(0.5);
    let (cost_value, scale) = match loss {
        Loss::Trivial => (b.mul(half, s), None),
        Loss::Huber(delta) => {
            let d = b.const_f32(delta as f32);
            let d2 = b.const_f32((delta * delta) as f32);
            let inside = b.cmp(IrCmp::Le, s, d2);
            let norm = b.unary(IrUnary::Sqrt, s);
            let two_d = b.const_f32(2.0 * delta as f32);
            let lin = b.mul(two_d, norm);
            let outside = b.sub(lin, d2);
            let rho = b.select(inside, s, outside);
            let ratio = b.div(d, norm);
            let root = b.unary(IrUnary::Sqrt, ratio);
            let one = b.const_f32(1.0);
            let scale = b.select(inside, one, root);
            (b.mul(half, rho), Some(scale))
        }
        Loss::Cauchy(delta) => {
            let inv_d2 = b.const_f32((1.0 / (delta * delta)) as f32);
            let d2 = b.const_f32((delta * delta) as f32);
            let one = b.const_f32(1.0);
            let q = b.fma(s, inv_d2, one);
            let lg = b.unary(IrUnary::Log, q);
            let rho = b.mul(d2, lg);
            let inv = b.unary(IrUnary::Rsqrt, q);
            (b.mul(half, rho), Some(inv))
        }
    };
    let scaled = |b: &mut ProgramBuilder, x: Value| match scale {
        Some(k) => b.mul(x, k),
        None => x,
    };

    let nr = b.const_u32(r);
    let row_base = b.mul(i, nr);
    let first_row = b.add(row0, row_base);
    for (ri, &f) in outputs.iter().enumerate() {
        let rr = b.const_u32(ri as u32);
        let row = b.add(first_row, rr);
        let fs = scaled(&mut b, f);
        b.store(residuals, row, fs);
        let local_row = b.add(row_base, rr);
        let entry_base = b.mul(local_row, np);
        let entry_base = b.add(entry0, entry_base);
        for k in 0..p {
            let kk = b.const_u32(k);
            let at = b.add(entry_base, kk);
            let d = v(derivatives.jacobian[ri * p as usize + k as usize]);
            let ds = scaled(&mut b, d);
            b.store(jacobian, at, ds);
        }
    }
    let at = b.add(cost0, i);
    b.store(cost, at, cost_value);
    b.build()
}

fn lower_unary(b: &mut ProgramBuilder, op: Unary, x: Value) -> Value {
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
        Unary::Tanh => direct(b, IrUnary::Tanh),
        Unary::Abs => direct(b, IrUnary::Abs),
        Unary::Sigmoid => {
            let n = b.unary(IrUnary::Neg, x);
            let e = b.unary(IrUnary::Exp, n);
            let one = b.const_f32(1.0);
            let d = b.add(one, e);
            b.unary(IrUnary::Recip, d)
        }
        Unary::Relu => {
            let z = b.const_f32(0.0);
            b.binary(IrBinary::Max, x, z)
        }
        Unary::Softplus => {
            // max(x, 0) + ln(1 + e^-|x|): no overflow for large |x|.
            let z = b.const_f32(0.0);
            let pos = b.binary(IrBinary::Max, x, z);
            let a = b.unary(IrUnary::Abs, x);
            let na = b.unary(IrUnary::Neg, a);
            let e = b.unary(IrUnary::Exp, na);
            let one = b.const_f32(1.0);
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
            let positive = result.unwrap_or_else(|| b.const_f32(1.0));
            if n < 0 {
                b.unary(IrUnary::Recip, positive)
            } else {
                positive
            }
        }
    }
}
