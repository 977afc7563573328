//! A traced residual as plain data: its topology signature, its values in `f64` on the host
//! (the reference the tests and the finite-difference checks use), and its Jacobian derived
//! symbolically, with common subexpressions shared and literals folded.

use crate::trace::{Binary, Cmp, Node, Unary};
use std::collections::HashMap;
use std::hash::{Hash, Hasher};

/// A residual function of `n_params` differentiated slots (its Jacobian columns: parameters
/// and manifold tangent coordinates), `n_ambient` further slots read but not differentiated
/// (manifold blocks' stored values, slots `n_params..n_params + n_ambient`) and `n_consts`
/// per-instance constants: nodes in topological order and the ids of the residual outputs.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Graph {
    pub nodes: Vec<Node>,
    pub outputs: Vec<u32>,
    pub n_params: u32,
    pub n_ambient: u32,
    pub n_consts: u32,
}

/// FNV-1a, 64-bit: the same signature in every process.
struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    // Whole words at a time: tracing hashes every instance's graph, and byte-at-a-time FNV
    // was most of the tracing time. (Still the same value in every process.)
    fn write_u8(&mut self, v: u8) {
        self.write_u64(v as u64);
    }
    fn write_u16(&mut self, v: u16) {
        self.write_u64(v as u64);
    }
    fn write_u32(&mut self, v: u32) {
        self.write_u64(v as u64);
    }
    fn write_i32(&mut self, v: i32) {
        self.write_u64(v as u32 as u64);
    }
    fn write_usize(&mut self, v: usize) {
        self.write_u64(v as u64);
    }
    fn write_isize(&mut self, v: isize) {
        self.write_u64(v as u64);
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0 ^ v).wrapping_mul(0x0000_0100_0000_01b3);
        self.0 ^= self.0 >> 29;
    }
}

/// [`Graph::signature`] of the graph these parts would make, without building it (tracing
/// computes it for every instance from the tape).
pub fn signature_of(
    nodes: &[Node],
    outputs: &[u32],
    n_params: u32,
    n_ambient: u32,
    n_consts: u32,
) -> u64 {
    let mut h = Fnv::default();
    nodes.hash(&mut h);
    outputs.hash(&mut h);
    n_params.hash(&mut h);
    n_ambient.hash(&mut h);
    n_consts.hash(&mut h);
    h.finish()
}

/// The value of one node given the values of the nodes before it; `params` holds every slot
/// (a [`Node::Delta`] is 0 whatever its slot holds).
pub fn eval_node(node: Node, vals: &[f64], params: &[f64], consts: &[f64]) -> f64 {
    let v = |i: u32| vals[i as usize];
    match node {
        Node::Param(k) | Node::Ambient(k) => params[k as usize],
        Node::Delta(_) => 0.0,
        Node::Const(k) => consts[k as usize],
        Node::Lit(bits) => f64::from_bits(bits),
        Node::Unary(op, x) => unary_f64(op, v(x)),
        Node::Binary(op, a, b) => binary_f64(op, v(a), v(b)),
        Node::Select { cmp, a, b, t, f } => {
            if cmp.holds(v(a), v(b)) {
                v(t)
            } else {
                v(f)
            }
        }
    }
}

pub fn unary_f64(op: Unary, x: f64) -> f64 {
    match op {
        Unary::Neg => -x,
        Unary::Sqrt => x.sqrt(),
        Unary::Rsqrt => 1.0 / x.sqrt(),
        Unary::Exp => x.exp(),
        Unary::Log => x.ln(),
        Unary::Sin => x.sin(),
        Unary::Cos => x.cos(),
        Unary::Tan => x.tan(),
        Unary::Atan => x.atan(),
        Unary::Tanh => x.tanh(),
        Unary::Abs => x.abs(),
        Unary::Sigmoid => 1.0 / (1.0 + (-x).exp()),
        Unary::Relu => x.max(0.0),
        Unary::Softplus => x.max(0.0) + (-x.abs()).exp().ln_1p(),
        Unary::PowI(n) => x.powi(n),
    }
}

pub fn binary_f64(op: Binary, a: f64, b: f64) -> f64 {
    match op {
        Binary::Add => a + b,
        Binary::Sub => a - b,
        Binary::Mul => a * b,
        Binary::Div => a / b,
        Binary::Pow => a.powf(b),
        Binary::Atan2 => a.atan2(b),
        Binary::Min => a.min(b),
        Binary::Max => a.max(b),
    }
}

impl Graph {
    /// The topology signature: a hash of the nodes (operations, wiring and literals), the
    /// outputs and the slot counts. Per-instance constants and parameter values are not part of
    /// it, so every instance of one residual shape has the same signature.
    pub fn signature(&self) -> u64 {
        signature_of(
            &self.nodes,
            &self.outputs,
            self.n_params,
            self.n_ambient,
            self.n_consts,
        )
    }

    /// Every node's value in `f64`.
    pub fn eval_nodes(&self, params: &[f64], consts: &[f64]) -> Vec<f64> {
        let mut vals = Vec::with_capacity(self.nodes.len());
        for &n in &self.nodes {
            let v = eval_node(n, &vals, params, consts);
            vals.push(v);
        }
        vals
    }

    /// The residuals in `f64`.
    pub fn eval(&self, params: &[f64], consts: &[f64]) -> Vec<f64> {
        let vals = self.eval_nodes(params, consts);
        self.outputs.iter().map(|&o| vals[o as usize]).collect()
    }

    /// The residuals and their Jacobian as one graph of shared nodes (see [`Derivatives`]).
    pub fn derivatives(&self) -> Derivatives {
        let mut pool = Pool::default();
        let mut forward: Vec<u32> = Vec::with_capacity(self.nodes.len());
        for &n in &self.nodes {
            let id = pool.add_traced(n, &forward);
            forward.push(id);
        }
        // Which forward nodes depend on a parameter: adjoints flow only into those.
        let mut live = vec![false; pool.nodes.len()];
        for (id, &n) in pool.nodes.iter().enumerate() {
            live[id] = match n {
                Node::Param(_) | Node::Delta(_) => true,
                Node::Const(_) | Node::Lit(_) | Node::Ambient(_) => false,
                Node::Unary(_, x) => live[x as usize],
                Node::Binary(_, a, b) => live[a as usize] || live[b as usize],
                Node::Select { t, f, .. } => live[t as usize] || live[f as usize],
            };
        }
        let n_forward = pool.nodes.len();
        let outputs: Vec<u32> = self.outputs.iter().map(|&o| forward[o as usize]).collect();
        let p = self.n_params as usize;
        let zero = pool.lit(0.0);
        let mut jacobian = vec![zero; outputs.len() * p];
        for (r, &out) in outputs.iter().enumerate() {
            let mut adjoint: Vec<Option<u32>> = vec![None; n_forward];
            adjoint[out as usize] = Some(pool.lit(1.0));
            for id in (0..=out as usize).rev() {
                let Some(g) = adjoint[id] else { continue };
                if !live[id] {
                    continue;
                }
                let node = pool.nodes[id];
                let y = id as u32;
                let mut contributions: [(u32, u32); 2] = [(u32::MAX, 0); 2];
                match node {
                    Node::Param(k) | Node::Delta(k) => {
                        let slot = &mut jacobian[r * p + k as usize];
                        *slot = pool.binary(Binary::Add, *slot, g);
                    }
                    Node::Const(_) | Node::Lit(_) | Node::Ambient(_) => {}
                    Node::Unary(op, x) => {
                        contributions[0] = (x, pool.unary_adjoint(op, x, y, g));
                    }
                    Node::Binary(op, a, b) => {
                        let (da, db) = pool.binary_adjoint(op, a, b, y, g);
                        contributions = [(a, da), (b, db)];
                    }
                    Node::Select { cmp, a, b, t, f } => {
                        let (dt, df) = pool.route(cmp, a, b, g);
                        contributions = [(t, dt), (f, df)];
                    }
                }
                for (target, d) in contributions {
                    if target == u32::MAX || !live[target as usize] {
                        continue;
                    }
                    let slot = &mut adjoint[target as usize];
                    *slot = Some(match *slot {
                        None => d,
                        Some(prev) => pool.binary(Binary::Add, prev, d),
                    });
                }
            }
        }
        let derivatives = Derivatives {
            graph: Graph {
                nodes: pool.nodes,
                outputs: outputs.clone(),
                n_params: self.n_params,
                n_ambient: self.n_ambient,
                n_consts: self.n_consts,
            },
            jacobian,
        };
        derivatives.at_zero_deltas()
    }
}

/// The residuals and Jacobian of a [`Graph`], as one graph: `graph.outputs` are the residuals
/// and `jacobian[r * n_params + k]` the node holding `d residual_r / d param_k` (a literal 0
/// where the residual does not depend on the parameter).
#[derive(Clone, Debug)]
pub struct Derivatives {
    pub graph: Graph,
    pub jacobian: Vec<u32>,
}

impl Derivatives {
    /// The same values with every [`Node::Delta`] replaced by the literal 0 it evaluates to
    /// and the literals folded again: what differentiating needed the tangent coordinates
    /// for is done, and a manifold block's kernel then does no arithmetic on them.
    fn at_zero_deltas(self) -> Derivatives {
        if !self.graph.nodes.iter().any(|n| matches!(n, Node::Delta(_))) {
            return self;
        }
        let mut pool = Pool::default();
        let mut remap: Vec<u32> = Vec::with_capacity(self.graph.nodes.len());
        for &n in &self.graph.nodes {
            let id = match n {
                Node::Delta(_) => pool.lit(0.0),
                other => pool.add_traced(other, &remap),
            };
            remap.push(id);
        }
        let m = |ids: &[u32]| ids.iter().map(|&i| remap[i as usize]).collect::<Vec<u32>>();
        Derivatives {
            graph: Graph {
                outputs: m(&self.graph.outputs),
                nodes: pool.nodes,
                ..self.graph
            },
            jacobian: m(&self.jacobian),
        }
    }

    /// The Jacobian in `f64`, row-major `[residual][param]`.
    pub fn eval_jacobian(&self, params: &[f64], consts: &[f64]) -> Vec<f64> {
        let vals = self.graph.eval_nodes(params, consts);
        self.jacobian.iter().map(|&j| vals[j as usize]).collect()
    }
}

/// Nodes with hash-consing (an equal node is stored once) and simplification of literals.
#[derive(Default)]
struct Pool {
    nodes: Vec<Node>,
    index: HashMap<Node, u32>,
}

impl Pool {
    fn lit_value(&self, id: u32) -> Option<f64> {
        match self.nodes[id as usize] {
            Node::Lit(bits) => Some(f64::from_bits(bits)),
            _ => None,
        }
    }

    fn lit(&mut self, v: f64) -> u32 {
        self.add(Node::lit(v))
    }

    /// Adds a node whose operands are already pool ids.
    fn add(&mut self, node: Node) -> u32 {
        let node = self.simplify(node);
        if let Node::Lit(_) | Node::Param(_) | Node::Const(_) | Node::Delta(_) | Node::Ambient(_) =
            node
        {
        } else if let Some(id) = self.forward_alias(node) {
            return id;
        }
        if let Some(&id) = self.index.get(&node) {
            return id;
        }
        self.nodes.push(node);
        let id = self.nodes.len() as u32 - 1;
        self.index.insert(node, id);
        id
    }

    /// A node that simplified to one of its operands.
    fn forward_alias(&self, node: Node) -> Option<u32> {
        match node {
            Node::Binary(Binary::Add, a, b) => match (self.lit_value(a), self.lit_value(b)) {
                (Some(0.0), _) => Some(b),
                (_, Some(0.0)) => Some(a),
                _ => None,
            },
            Node::Binary(Binary::Sub, a, b) if self.lit_value(b) == Some(0.0) => Some(a),
            Node::Binary(Binary::Mul, a, b) => match (self.lit_value(a), self.lit_value(b)) {
                (Some(1.0), _) => Some(b),
                (_, Some(1.0)) => Some(a),
                _ => None,
            },
            Node::Binary(Binary::Div, a, b) if self.lit_value(b) == Some(1.0) => Some(a),
            Node::Unary(Unary::Neg, x) => match self.nodes[x as usize] {
                Node::Unary(Unary::Neg, inner) => Some(inner),
                _ => None,
            },
            Node::Select { t, f, .. } if t == f => Some(t),
            _ => None,
        }
    }

    /// Folds literals and canonicalises commutative operands.
    fn simplify(&self, node: Node) -> Node {
        match node {
            Node::Unary(op, x) => {
                if let Some(v) = self.lit_value(x) {
                    return Node::lit(unary_f64(op, v));
                }
                node
            }
            Node::Binary(op, a, b) => {
                if let (Some(x), Some(y)) = (self.lit_value(a), self.lit_value(b)) {
                    return Node::lit(binary_f64(op, x, y));
                }
                if op == Binary::Mul
                    && (self.lit_value(a) == Some(0.0) || self.lit_value(b) == Some(0.0))
                {
                    return Node::lit(0.0);
                }
                if op == Binary::Div && self.lit_value(a) == Some(0.0) {
                    return Node::lit(0.0);
                }
                if op == Binary::Sub && self.lit_value(a) == Some(0.0) {
                    return Node::Unary(Unary::Neg, b);
                }
                if matches!(op, Binary::Add | Binary::Mul | Binary::Min | Binary::Max) && a > b {
                    return Node::Binary(op, b, a);
                }
                node
            }
            Node::Select { cmp, a, b, t, f } => {
                if let (Some(x), Some(y)) = (self.lit_value(a), self.lit_value(b)) {
                    let chosen = if cmp.holds(x, y) { t } else { f };
                    return self.nodes[chosen as usize];
                }
                node
            }
            _ => node,
        }
    }

    /// Adds a traced node, translating its operands (traced ids) through `remap`.
    fn add_traced(&mut self, node: Node, remap: &[u32]) -> u32 {
        let m = |i: u32| remap[i as usize];
        self.add(match node {
            Node::Unary(op, x) => Node::Unary(op, m(x)),
            Node::Binary(op, a, b) => Node::Binary(op, m(a), m(b)),
            Node::Select { cmp, a, b, t, f } => Node::Select {
                cmp,
                a: m(a),
                b: m(b),
                t: m(t),
                f: m(f),
            },
            other => other,
        })
    }

    fn unary(&mut self, op: Unary, x: u32) -> u32 {
        self.add(Node::Unary(op, x))
    }

    fn binary(&mut self, op: Binary, a: u32, b: u32) -> u32 {
        self.add(Node::Binary(op, a, b))
    }

    /// `g * dy/dx` for `y = op(x)`.
    fn unary_adjoint(&mut self, op: Unary, x: u32, y: u32, g: u32) -> u32 {
        use Binary::*;
        match op {
            Unary::Neg => self.unary(Unary::Neg, g),
            Unary::Sqrt => {
                let half = self.lit(0.5);
                let gh = self.binary(Mul, g, half);
                self.binary(Div, gh, y)
            }
            Unary::Rsqrt => {
                let y2 = self.binary(Mul, y, y);
                let y3 = self.binary(Mul, y2, y);
                let k = self.lit(-0.5);
                let s = self.binary(Mul, y3, k);
                self.binary(Mul, g, s)
            }
            Unary::Exp => self.binary(Mul, g, y),
            Unary::Log => self.binary(Div, g, x),
            Unary::Sin => {
                let c = self.unary(Unary::Cos, x);
                self.binary(Mul, g, c)
            }
            Unary::Cos => {
                let s = self.unary(Unary::Sin, x);
                let gs = self.binary(Mul, g, s);
                self.unary(Unary::Neg, gs)
            }
            Unary::Atan => {
                // g / (1 + x^2)
                let x2 = self.binary(Mul, x, x);
                let one = self.lit(1.0);
                let d = self.binary(Add, one, x2);
                self.binary(Div, g, d)
            }
            Unary::Tan | Unary::Tanh => {
                let y2 = self.binary(Mul, y, y);
                let one = self.lit(1.0);
                let d = if op == Unary::Tan {
                    self.binary(Add, one, y2)
                } else {
                    self.binary(Sub, one, y2)
                };
                self.binary(Mul, g, d)
            }
            Unary::Abs => {
                let (z, m, p) = (self.lit(0.0), self.lit(-1.0), self.lit(1.0));
                let sign = self.add(Node::Select {
                    cmp: Cmp::Lt,
                    a: x,
                    b: z,
                    t: m,
                    f: p,
                });
                self.binary(Mul, g, sign)
            }
            Unary::Sigmoid => {
                let one = self.lit(1.0);
                let c = self.binary(Sub, one, y);
                let d = self.binary(Mul, y, c);
                self.binary(Mul, g, d)
            }
            Unary::Relu => {
                let z = self.lit(0.0);
                self.add(Node::Select {
                    cmp: Cmp::Gt,
                    a: x,
                    b: z,
                    t: g,
                    f: z,
                })
            }
            Unary::Softplus => {
                let s = self.unary(Unary::Sigmoid, x);
                self.binary(Mul, g, s)
            }
            Unary::PowI(n) => {
                if n == 0 {
                    return self.lit(0.0);
                }
                let p = self.unary(Unary::PowI(n - 1), x);
                let k = self.lit(n as f64);
                let d = self.binary(Mul, k, p);
                self.binary(Mul, g, d)
            }
        }
    }

    /// `(g * dy/da, g * dy/db)` for `y = op(a, b)`.
    fn binary_adjoint(&mut self, op: Binary, a: u32, b: u32, y: u32, g: u32) -> (u32, u32) {
        use Binary::*;
        match op {
            Add => (g, g),
            Sub => (g, self.unary(Unary::Neg, g)),
            Mul => (self.binary(Mul, g, b), self.binary(Mul, g, a)),
            Div => {
                let da = self.binary(Div, g, b);
                let gy = self.binary(Mul, da, y);
                (da, self.unary(Unary::Neg, gy))
            }
            Pow => {
                let one = self.lit(1.0);
                let bm1 = self.binary(Sub, b, one);
                let p = self.binary(Pow, a, bm1);
                let bp = self.binary(Mul, b, p);
                let da = self.binary(Mul, g, bp);
                let la = self.unary(Unary::Log, a);
                let yl = self.binary(Mul, y, la);
                (da, self.binary(Mul, g, yl))
            }
            Atan2 => {
                let aa = self.binary(Mul, a, a);
                let bb = self.binary(Mul, b, b);
                let r2 = self.binary(Add, aa, bb);
                let gb = self.binary(Mul, g, b);
                let ga = self.binary(Mul, g, a);
                let da = self.binary(Div, gb, r2);
                let db = self.binary(Div, ga, r2);
                (da, self.unary(Unary::Neg, db))
            }
            Min | Max => {
                let cmp = if op == Min { Cmp::Le } else { Cmp::Ge };
                self.route(cmp, a, b, g)
            }
        }
    }

    /// A gradient `g` routed by a comparison: `(cmp(a, b) ? g : 0, cmp(a, b) ? 0 : g)`, the
    /// adjoints of a select's two branches (and of min/max's two operands).
    fn route(&mut self, cmp: Cmp, a: u32, b: u32, g: u32) -> (u32, u32) {
        let z = self.lit(0.0);
        let taken = self.add(Node::Select {
            cmp,
            a,
            b,
            t: g,
            f: z,
        });
        let other = self.add(Node::Select {
            cmp,
            a,
            b,
            t: z,
            f: g,
        });
        (taken, other)
    }
}
