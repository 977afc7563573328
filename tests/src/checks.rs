//! The checks, one function per primitive family. Each draws cases, runs the primitive on the
//! CPU reference and (unless the target is the reference) on the target through one generic
//! `run_*` function, computes the float64 answer on the host, and hands all three to
//! `Suite::judge` with the tolerance the `hal` docs state.

use crate::Suite;
use crate::host::{
    HostTensor, ViewKind, logical, output_tensor, rand_core_shim::RngCoreExt, random_tensor,
    read_view, round_to, unravel,
};
use hal::ir::{Access, IrBinary, IrCmp, IrUnary, ProgramBuilder, ScalarType};
use hal::{
    AdamParams, ArgReduceOp, Backend, BackendExt, BinaryOp, Conv2dGeometry, Csr, DType,
    Distribution, Layout, ReduceOp, Result, SgdParams, TernaryOp, UnaryOp, View, numel,
};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::TestRng;

const U32F: f64 = f32::EPSILON as f64 / 2.0;

/// The rounding error of storing `w` in `dtype`, `n` times over: `n u |w|`, with an absolute
/// floor of half the smallest subnormal step for f16 (whose subnormals start at 6e-5).
fn rounding(dtype: DType, w: f64, n: f64) -> f64 {
    let floor = if dtype == DType::F16 {
        2f64.powi(-25)
    } else {
        0.0
    };
    n * (dtype.unit_roundoff() * w.abs() + floor)
}

/// The sizes every shape-drawing strategy favours.
fn dim() -> impl Strategy<Value = usize> {
    prop_oneof![1 => Just(0usize), 2 => Just(1usize), 2 => Just(7usize), 1 => Just(257usize), 1 => Just(65537usize), 5 => 2usize..24]
}

const KINDS: [ViewKind; 5] = [
    ViewKind::Contiguous,
    ViewKind::Permuted,
    ViewKind::Strided,
    ViewKind::Flipped,
    ViewKind::Broadcast,
];

/// Runs a backend call on the CPU reference and, unless the target is the reference, on the
/// target; `Err` carries the failure text.
macro_rules! both {
    ($s:expr, $f:ident ( $($arg:expr),* )) => {{
        let cpu = $f($s.cpu, $($arg),*);
        let tgt = if $s.target_is_reference { None } else { Some($f($s.target, $($arg),*)) };
        match (cpu, tgt) {
            (Ok(c), None) => Ok((c, None)),
            (Ok(c), Some(Ok(t))) => Ok((c, Some(t))),
            (Err(e), _) => Err(format!("cpu: {e}")),
            (_, Some(Err(e))) => Err(format!("target: {e}")),
        }
    }};
}

impl<B: Backend> Suite<'_, B> {
    fn draw<T: std::fmt::Debug>(&mut self, s: impl Strategy<Value = T>) -> T {
        s.new_tree(&mut self.runner)
            .expect("strategy draws")
            .current()
    }

    /// Shapes of rank in `ranks` with at most `max` elements: the special sizes first, then
    /// proptest draws.
    fn shapes(&mut self, ranks: std::ops::RangeInclusive<usize>, max: usize) -> Vec<Vec<usize>> {
        let special: Vec<Vec<usize>> = vec![
            vec![0],
            vec![1],
            vec![7],
            vec![257],
            vec![65537],
            vec![7, 257],
            vec![257, 7, 1],
            vec![3, 0, 5],
            vec![2, 7, 3, 5],
        ];
        // Zero dimensions count as 1: a view's backing buffer is sized by the other dimensions.
        let size = |s: &Vec<usize>| s.iter().map(|&d| d.max(1)).product::<usize>();
        let mut out: Vec<Vec<usize>> = special
            .into_iter()
            .filter(|s| ranks.contains(&s.len()) && size(s) <= max)
            .collect();
        let (lo, hi) = (*ranks.start(), *ranks.end());
        while out.len() < self.cfg.cases + 4 {
            let s = self.draw(
                proptest::collection::vec(dim(), lo..=hi)
                    .prop_filter("size", move |s| size(s) <= max),
            );
            out.push(s);
        }
        out
    }

    /// An index shape for gather/scatter over data of `shape`: each other dimension as large
    /// or one smaller, and a length along `axis` of 0, 1, 7 or 300.
    fn index_shape(&mut self, shape: &[usize], axis: usize) -> Vec<usize> {
        let mut ishape: Vec<usize> = shape
            .iter()
            .map(|&d| if d > 1 { d - self.rng().below(2) } else { d })
            .collect();
        ishape[axis] = [0usize, 1, 7, 300][self.rng().below(4)];
        // 300 along a size-1 axis of a long array (index [1, 300, 65537]) made a strided index
        // view whose backing buffer outgrew lavapipe's 128 MiB binding: keep the index within
        // the data's element budget (INDEX_ELEMENTS) by falling back to 7.
        let others: usize =
            ishape.iter().map(|&d| d.max(1)).product::<usize>() / ishape[axis].max(1);
        if others * ishape[axis] > INDEX_ELEMENTS {
            ishape[axis] = 7;
        }
        ishape
    }

    fn kind(&mut self) -> ViewKind {
        KINDS[self.rng().below(KINDS.len())]
    }

    fn float_dtype(&mut self) -> DType {
        // f32 most of the time; the 16-bit storage types often enough to be covered.
        [DType::F32, DType::F32, DType::F16, DType::BF16][self.rng().below(4)]
    }
}

/// The most elements an index shape of `Suite::index_shape` holds (the gather and scatter
/// data's own budget, 2^17, with room for a long axis).
const INDEX_ELEMENTS: usize = 1 << 20;

/// Every row the suite must produce; a row that drew no case fails (see `Suite::run`).
pub(crate) const EXPECTED_ROWS: [&str; 40] = [
    "fill",
    "copy (strided)",
    "copy (cast)",
    "unary",
    "unary (special values)",
    "binary",
    "binary (special values)",
    "binary (comparison)",
    "ternary",
    "reduce sum",
    "reduce mean",
    "reduce max",
    "reduce min",
    "argmax",
    "argmin",
    "matmul",
    "matmul (bf16 beyond f16)",
    "matmul (epilogue)",
    "matmul (gate, row sums)",
    "spmv_csr",
    "gather",
    "gather (index_select)",
    "scatter_add",
    "im2col",
    "col2im",
    "nearest_centroid",
    "nearest_centroid (batched)",
    "segment_sum",
    "segment_sum (weighted)",
    "nearest_centroid (Precision::Reproducible)",
    "segment_sum (Precision::Reproducible)",
    "kmeans_pp",
    "sgd_step",
    "adam_step",
    "random uniform",
    "random normal",
    "ir program (edge residual, atomics)",
    "ir program (math, int, select, cast)",
    "ir program (conditional store)",
    "record/replay",
];

/// The checks of the primitives a `Precision::Fast` or `Precision::Compensated` handle runs
/// differently.
pub(crate) fn run_matrix_unit_policy<B: Backend>(s: &mut Suite<'_, B>) {
    matmul(s);
    matmul_beyond_f16(s);
    if s.policy == hal::Precision::Fast {
        nearest_centroid(s);
        nearest_centroid_batched(s);
        kmeans_pp(s);
    }
}

pub(crate) fn run_all<B: Backend>(s: &mut Suite<'_, B>) {
    fill(s);
    copy(s);
    unary(s);
    crate::special::unary_special(s);
    binary(s);
    crate::special::binary_special(s);
    ternary(s);
    reduce(s);
    arg_reduce(s);
    matmul(s);
    matmul_beyond_f16(s);
    matmul_epilogue(s);
    matmul_gate(s);
    spmv(s);
    gather(s);
    scatter_add(s);
    conv(s);
    nearest_centroid(s);
    nearest_centroid_batched(s);
    segment_sum(s);
    reproducible(s);
    kmeans_pp(s);
    optimizers(s);
    random(s);
    programs(s);
    record_replay(s);
}

fn run_recorded<B: Backend>(b: &B, x: &[f32], replays: usize) -> Result<Vec<f64>> {
    let l = Layout::contiguous(&[x.len()]);
    let xb = b.upload(x)?;
    let yb = b.alloc(DType::F32, x.len())?;
    let (xs, ys, ls) = (xb.clone(), yb.clone(), l.clone());
    // y = 0.5 * (y + x) + 1, recorded once.
    let graph = b.record(std::sync::Arc::new(move |b: &B| {
        b.binary(
            BinaryOp::Add,
            View::new(&ys, &ls),
            View::new(&xs, &ls),
            View::new(&ys, &ls),
        )?;
        b.unary(
            UnaryOp::Affine {
                scale: 0.5,
                shift: 1.0,
            },
            View::new(&ys, &ls),
            View::new(&ys, &ls),
        )
    }))?;
    for _ in 0..replays {
        b.replay(&graph)?;
    }
    read_view(b, &yb, &l)
}

/// A recorded sequence replayed several times gives what running it that many times gives.
fn record_replay<B: Backend>(s: &mut Suite<'_, B>) {
    for (n, replays) in [(1usize, 1usize), (257, 3), (65537, 2)] {
        let x: Vec<f32> = (0..n).map(|_| s.rng().range(-1.0, 1.0)).collect();
        let mut exact = vec![0f64; n];
        for _ in 0..replays {
            for (e, &xi) in exact.iter_mut().zip(&x) {
                *e = (0.5f32.mul_add((*e as f32) + xi, 1.0)) as f64;
            }
        }
        match both!(s, run_recorded(&x, replays)) {
            Ok((c, t)) => s.judge(
                "record/replay",
                &format!("n={n}, {replays} replays"),
                &c,
                t.as_deref(),
                &exact,
                &|_, _| 0.0,
            ),
            Err(e) => s.fail("record/replay", e),
        }
    }
}

// ---------------------------------------------------------------- elementwise

fn run_fill<B: Backend>(b: &B, out: &HostTensor, v: f64) -> Result<Vec<f64>> {
    let buf = out.upload(b)?;
    b.fill(View::new(&buf, &out.layout), v)?;
    read_view(b, &buf, &out.layout)
}

fn fill<B: Backend>(s: &mut Suite<'_, B>) {
    for shape in s.shapes(0..=3, 1 << 18) {
        let dtype = DType::ALL[s.rng().below(5)];
        let out = output_tensor(s.rng(), &shape, dtype);
        let v = if dtype.is_float() {
            s.rng().range(-100.0, 100.0) as f64
        } else {
            (s.rng().below(1000)) as f64
        };
        let exact = vec![round_to(dtype, v as f32) as f64; numel(&shape)];
        match both!(s, run_fill(&out, v)) {
            Ok((c, t)) => s.judge(
                "fill",
                &format!("{shape:?} {dtype}"),
                &c,
                t.as_deref(),
                &exact,
                &|_, _| 0.0,
            ),
            Err(e) => s.fail("fill", e),
        }
    }
}

fn run_copy<B: Backend>(b: &B, src: &HostTensor, out: &HostTensor) -> Result<Vec<f64>> {
    let (sb, ob) = (src.upload(b)?, out.upload(b)?);
    b.copy(View::new(&sb, &src.layout), View::new(&ob, &out.layout))?;
    read_view(b, &ob, &out.layout)
}

fn copy<B: Backend>(s: &mut Suite<'_, B>) {
    for (i, shape) in s.shapes(0..=4, 1 << 18).into_iter().enumerate() {
        // Every other case keeps the dtype (a strided copy), the rest cast.
        let f = s.rng().below(5);
        let from = DType::ALL[f];
        let to = if i % 2 == 0 {
            from
        } else {
            DType::ALL[(f + 1 + s.rng().below(4)) % 5]
        };
        let kind = s.kind();
        let src = random_tensor(s.rng(), &shape, from, kind, |r| r.range(-300.0, 300.0));
        let out = output_tensor(s.rng(), &shape, to);
        let exact: Vec<f64> = src
            .logical()
            .iter()
            .map(|&v| round_to(to, v as f32) as f64)
            .collect();
        let name = if from == to {
            "copy (strided)"
        } else {
            "copy (cast)"
        };
        match both!(s, run_copy(&src, &out)) {
            Ok((c, t)) => s.judge(
                name,
                &format!("{shape:?} {from}->{to} {kind:?}"),
                &c,
                t.as_deref(),
                &exact,
                &|_, _| 0.0,
            ),
            Err(e) => s.fail(name, e),
        }
    }
}

fn run_unary<B: Backend>(b: &B, op: UnaryOp, x: &HostTensor, out: &HostTensor) -> Result<Vec<f64>> {
    let (xb, ob) = (x.upload(b)?, out.upload(b)?);
    b.unary(op, View::new(&xb, &x.layout), View::new(&ob, &out.layout))?;
    read_view(b, &ob, &out.layout)
}

fn erf64(x: f64) -> f64 {
    // The same rational approximation as `hal::erf_f32`, in f64.
    let t = 1.0 / (1.0 + 0.327_591_1 * x.abs());
    let poly = t
        * (0.254_829_6
            + t * (-0.284_496_74 + t * (1.421_413_7 + t * (-1.453_152_1 + t * 1.061_405_4))));
    let r = 1.0 - poly * (-x * x).exp();
    if x < 0.0 { -r } else { r }
}

fn unary_f64(op: UnaryOp, x: f64) -> f64 {
    match op {
        UnaryOp::Neg => -x,
        UnaryOp::Abs => x.abs(),
        UnaryOp::Exp => x.exp(),
        UnaryOp::Exp2 => x.exp2(),
        UnaryOp::Log => x.ln(),
        UnaryOp::Log2 => x.log2(),
        UnaryOp::Sqrt => x.sqrt(),
        UnaryOp::Rsqrt => 1.0 / x.sqrt(),
        UnaryOp::Recip => 1.0 / x,
        UnaryOp::Sin => x.sin(),
        UnaryOp::Cos => x.cos(),
        UnaryOp::Tanh => x.tanh(),
        UnaryOp::Sigmoid => 1.0 / (1.0 + (-x).exp()),
        UnaryOp::Relu => x.max(0.0),
        UnaryOp::LeakyRelu { slope } => {
            if x < 0.0 {
                slope as f64 * x
            } else {
                x
            }
        }
        UnaryOp::Gelu => 0.5 * x * (1.0 + erf64(x / std::f64::consts::SQRT_2)),
        UnaryOp::Silu => x / (1.0 + (-x).exp()),
        UnaryOp::Floor => x.floor(),
        UnaryOp::Ceil => x.ceil(),
        UnaryOp::Round => x.round_ties_even(),
        UnaryOp::Sign => {
            if x > 0.0 {
                1.0
            } else if x < 0.0 {
                -1.0
            } else {
                x
            }
        }
        UnaryOp::Square => x * x,
        UnaryOp::Affine { scale, shift } => scale as f64 * x + shift as f64,
        UnaryOp::Clamp { lo, hi } => x.max(lo as f64).min(hi as f64),
    }
}

fn is_exact_unary(op: UnaryOp) -> bool {
    use UnaryOp::*;
    matches!(
        op,
        Neg | Abs
            | Relu
            | LeakyRelu { .. }
            | Floor
            | Ceil
            | Round
            | Sign
            | Square
            | Affine { .. }
            | Clamp { .. }
    )
}

fn unary<B: Backend>(s: &mut Suite<'_, B>) {
    let ops = UnaryOp::all();
    let shapes = s.shapes(0..=4, 1 << 17);
    for (i, shape) in shapes.iter().enumerate() {
        for op in [ops[i % ops.len()], ops[(i * 7 + 3) % ops.len()]] {
            let (din, dout, kind) = (s.float_dtype(), s.float_dtype(), s.kind());
            let (lo, hi) = match op {
                UnaryOp::Log | UnaryOp::Log2 | UnaryOp::Sqrt | UnaryOp::Rsqrt => (0.05, 8.0),
                UnaryOp::Exp | UnaryOp::Exp2 => (-6.0, 6.0),
                _ => (-4.0, 4.0),
            };
            let x = random_tensor(s.rng(), shape, din, kind, |r| {
                let v = r.range(lo, hi);
                if matches!(op, UnaryOp::Recip) && v.abs() < 0.05 {
                    0.5
                } else {
                    v
                }
            });
            let out = output_tensor(s.rng(), shape, dout);
            let exact: Vec<f64> = x.logical().iter().map(|&v| unary_f64(op, v)).collect();
            let u = dout.unit_roundoff();
            let (rel, abs) = if is_exact_unary(op) {
                (2.0 * u + 2.0 * U32F, 0.0)
            } else {
                (4.0 * u + 2f64.powi(-18), 2f64.powi(-19))
            };
            match both!(s, run_unary(op, &x, &out)) {
                Ok((c, t)) => s.judge(
                    "unary",
                    &format!("{op:?} {shape:?} {din}->{dout} {kind:?}"),
                    &c,
                    t.as_deref(),
                    &exact,
                    &|_, w| rel * w.abs() + abs + rounding(dout, 0.0, 2.0),
                ),
                Err(e) => s.fail("unary", format!("{op:?} {shape:?}: {e}")),
            }
        }
    }
}

fn run_binary<B: Backend>(
    b: &B,
    op: BinaryOp,
    x: &HostTensor,
    y: &HostTensor,
    out: &HostTensor,
) -> Result<Vec<f64>> {
    let (xb, yb, ob) = (x.upload(b)?, y.upload(b)?, out.upload(b)?);
    b.binary(
        op,
        View::new(&xb, &x.layout),
        View::new(&yb, &y.layout),
        View::new(&ob, &out.layout),
    )?;
    read_view(b, &ob, &out.layout)
}

fn binary_f64(op: BinaryOp, a: f64, b: f64) -> f64 {
    let flag = |c: bool| if c { 1.0 } else { 0.0 };
    match op {
        BinaryOp::Add => a + b,
        BinaryOp::Sub => a - b,
        BinaryOp::Mul => a * b,
        BinaryOp::Div => a / b,
        BinaryOp::Rem => a - b * (a / b).floor(),
        BinaryOp::Pow => a.powf(b),
        BinaryOp::Max => {
            if a.is_nan() || b.is_nan() {
                f64::NAN
            } else {
                a.max(b)
            }
        }
        BinaryOp::Min => {
            if a.is_nan() || b.is_nan() {
                f64::NAN
            } else {
                a.min(b)
            }
        }
        BinaryOp::Atan2 => a.atan2(b),
        BinaryOp::Eq => flag(a == b),
        BinaryOp::Ne => flag(a != b),
        BinaryOp::Lt => flag(a < b),
        BinaryOp::Le => flag(a <= b),
        BinaryOp::Gt => flag(a > b),
        BinaryOp::Ge => flag(a >= b),
    }
}

/// A copy of `shape` with some dimensions set to 1 and maybe leading ones dropped, so the
/// operand broadcasts inside the primitive.
fn broadcastable(rng: &mut TestRng, shape: &[usize]) -> Vec<usize> {
    let mut s: Vec<usize> = shape
        .iter()
        .map(|&d| if rng.below(3) == 0 { 1 } else { d })
        .collect();
    let drop = rng.below(s.len() + 1);
    s.drain(..drop.min(s.len()));
    s
}

/// Values of `t` broadcast to `shape` in row-major order.
fn broadcast_logical(t: &HostTensor, shape: &[usize]) -> Vec<f64> {
    let l = t.layout.broadcast_to(shape).expect("broadcastable");
    logical(&t.backing, &l)
}

fn binary<B: Backend>(s: &mut Suite<'_, B>) {
    let shapes = s.shapes(0..=4, 1 << 17);
    let mut cases = Vec::new();
    for (i, shape) in shapes.iter().enumerate() {
        for op in [BinaryOp::ALL[i % 15], BinaryOp::ALL[(i * 4 + 9) % 15]] {
            let (da, db, kind) = (s.float_dtype(), s.float_dtype(), s.kind());
            let dout = if op.is_comparison() && s.rng().below(2) == 0 {
                DType::U32
            } else {
                s.float_dtype()
            };
            let bshape = broadcastable(s.rng(), shape);
            cases.push((shape.clone(), bshape, op, [da, db, dout], kind));
        }
    }
    // Biases over f32 contiguous operands (the pattern backends may read four at a time):
    // per channel of a channel-major output, per feature of a batch, and a run of 10.
    let f = DType::F32;
    for (shape, bshape, op) in [
        (vec![8, 12, 20], vec![1, 12, 1], BinaryOp::Add),
        (vec![64, 36], vec![36], BinaryOp::Mul),
        (vec![3, 12, 10], vec![12, 1], BinaryOp::Sub),
    ] {
        cases.push((shape, bshape, op, [f, f, f], ViewKind::Contiguous));
    }
    for (shape, bshape, op, [da, db, dout], kind) in cases {
        let shape = &shape;
        let gen_a = move |r: &mut TestRng| match op {
            BinaryOp::Pow => r.range(0.1, 3.0),
            _ if op.is_comparison() => (r.below(9) as f32 - 4.0) / 4.0,
            _ => r.range(-4.0, 4.0),
        };
        let gen_b = move |r: &mut TestRng| match op {
            BinaryOp::Pow => r.range(-2.0, 2.0),
            BinaryOp::Div | BinaryOp::Rem => {
                let v = r.range(0.25, 4.0);
                if r.below(2) == 0 { -v } else { v }
            }
            _ if op.is_comparison() => (r.below(9) as f32 - 4.0) / 4.0,
            _ => r.range(-4.0, 4.0),
        };
        let x = random_tensor(s.rng(), shape, da, kind, gen_a);
        let y = random_tensor(s.rng(), &bshape, db, ViewKind::Contiguous, gen_b);
        let out = output_tensor(s.rng(), shape, dout);
        let (xa, yb) = (x.logical(), broadcast_logical(&y, shape));
        let exact: Vec<f64> = xa
            .iter()
            .zip(&yb)
            .map(|(&a, &b)| binary_f64(op, a, b))
            .collect();
        let u = dout.unit_roundoff();
        let transcendental = matches!(op, BinaryOp::Pow | BinaryOp::Atan2);
        let (rel, abs) = if transcendental {
            (4.0 * u + 2f64.powi(-16), 2f64.powi(-20))
        } else {
            (2.0 * u + 4.0 * U32F, 0.0)
        };
        // Rem: floor(a/b) in f32 vs f64 can differ by one at exact multiples; allow |b| there.
        let rem_slack: Vec<f64> = if op == BinaryOp::Rem {
            xa.iter().zip(&yb).map(|(a, b)| a.abs() + b.abs()).collect()
        } else {
            Vec::new()
        };
        let tol = |i: usize, w: f64| {
            rel * w.abs()
                + abs
                + rounding(dout, 0.0, 2.0)
                + if op == BinaryOp::Rem {
                    2f64.powi(-20) * rem_slack[i]
                } else {
                    0.0
                }
        };
        match both!(s, run_binary(op, &x, &y, &out)) {
            Ok((c, t)) => {
                let name = if op.is_comparison() {
                    "binary (comparison)"
                } else {
                    "binary"
                };
                s.judge(
                    name,
                    &format!("{op:?} {shape:?} with {bshape:?} {da},{db}->{dout} {kind:?}"),
                    &c,
                    t.as_deref(),
                    &exact,
                    &tol,
                )
            }
            Err(e) => s.fail("binary", format!("{op:?} {shape:?} with {bshape:?}: {e}")),
        }
    }
}

fn run_ternary<B: Backend>(
    b: &B,
    op: TernaryOp,
    x: &HostTensor,
    y: &HostTensor,
    z: &HostTensor,
    out: &HostTensor,
) -> Result<Vec<f64>> {
    let (xb, yb, zb, ob) = (x.upload(b)?, y.upload(b)?, z.upload(b)?, out.upload(b)?);
    b.ternary(
        op,
        View::new(&xb, &x.layout),
        View::new(&yb, &y.layout),
        View::new(&zb, &z.layout),
        View::new(&ob, &out.layout),
    )?;
    read_view(b, &ob, &out.layout)
}

fn ternary<B: Backend>(s: &mut Suite<'_, B>) {
    let shapes = s.shapes(0..=4, 1 << 17);
    for (i, shape) in shapes.iter().enumerate() {
        let op = TernaryOp::ALL[i % 3];
        let dcond = if op == TernaryOp::Where && s.rng().below(2) == 0 {
            DType::U32
        } else {
            s.float_dtype()
        };
        let kind = s.kind();
        let x = random_tensor(s.rng(), shape, dcond, kind, move |r| {
            if op == TernaryOp::Where {
                r.below(2) as f32
            } else {
                r.range(-2.0, 2.0)
            }
        });
        let (ys, zs) = (broadcastable(s.rng(), shape), broadcastable(s.rng(), shape));
        let (dy, dz, dout) = (s.float_dtype(), s.float_dtype(), s.float_dtype());
        let y = random_tensor(s.rng(), &ys, dy, ViewKind::Contiguous, |r| {
            r.range(-2.0, 2.0)
        });
        let z = random_tensor(s.rng(), &zs, dz, ViewKind::Flipped, |r| r.range(-2.0, 2.0));
        let out = output_tensor(s.rng(), shape, dout);
        let (a, b, c) = (
            x.logical(),
            broadcast_logical(&y, shape),
            broadcast_logical(&z, shape),
        );
        let exact: Vec<f64> = (0..a.len())
            .map(|i| match op {
                TernaryOp::Where => {
                    if a[i] != 0.0 {
                        b[i]
                    } else {
                        c[i]
                    }
                }
                TernaryOp::Fma => a[i] * b[i] + c[i],
                TernaryOp::Lerp => b[i] + a[i] * (c[i] - b[i]),
            })
            .collect();
        let mags: Vec<f64> = (0..a.len())
            .map(|i| a[i].abs() * (b[i].abs() + c[i].abs()) + b[i].abs() + c[i].abs())
            .collect();
        match both!(s, run_ternary(op, &x, &y, &z, &out)) {
            Ok((cv, t)) => s.judge(
                "ternary",
                &format!("{op:?} {shape:?} {kind:?}"),
                &cv,
                t.as_deref(),
                &exact,
                &|i, w| rounding(dout, w, 2.0) + 4.0 * U32F * mags[i],
            ),
            Err(e) => s.fail("ternary", format!("{op:?} {shape:?}: {e}")),
        }
    }
}

// ---------------------------------------------------------------- reductions

fn run_reduce<B: Backend>(
    b: &B,
    op: ReduceOp,
    x: &HostTensor,
    axes: &[usize],
    out: &HostTensor,
) -> Result<Vec<f64>> {
    let (xb, ob) = (x.upload(b)?, out.upload(b)?);
    b.reduce(
        op,
        View::new(&xb, &x.layout),
        axes,
        View::new(&ob, &out.layout),
    )?;
    read_view(b, &ob, &out.layout)
}

fn reduce<B: Backend>(s: &mut Suite<'_, B>) {
    let shapes = s.shapes(1..=4, 1 << 18);
    let mut cases: Vec<(Vec<usize>, Vec<usize>)> = shapes
        .into_iter()
        .map(|shape| {
            let axes = (0..shape.len()).filter(|_| s.rng().below(2) == 0).collect();
            (shape, axes)
        })
        .collect();
    // Column sums (the leading axis of row-major data, as for a bias gradient), which
    // backends may serve with their own kernel: short and long columns, odd widths.
    cases.extend([
        (vec![257, 77], vec![0]),
        (vec![131, 5, 33], vec![0]),
        (vec![2003, 41], vec![0]),
        // Short lines that still span several chunks: whole lines, a workgroup's worth of
        // invocations each where backends have such a kernel (wgpu's reduce_lanes).
        (vec![3001], vec![0]),
        (vec![7, 1500], vec![1]),
    ]);
    for (i, (shape, axes)) in cases.iter().enumerate() {
        let (shape, axes) = (shape.clone(), axes.clone());
        let shape = &shape;
        let op = ReduceOp::ALL[i % 4];
        let mut oshape = shape.clone();
        for &a in &axes {
            oshape[a] = 1;
        }
        let (din, dout, kind) = (s.float_dtype(), s.float_dtype(), s.kind());
        let inject_nan = i % 5 == 4;
        let mut x = random_tensor(s.rng(), shape, din, kind, |r| r.range(-2.0, 2.0));
        if inject_nan && !x.backing.is_empty() {
            let at = s.rng().below(x.backing.len());
            x.backing[at] = f32::NAN;
        }
        let out = output_tensor(s.rng(), &oshape, dout);
        let name = match op {
            ReduceOp::Sum => "reduce sum",
            ReduceOp::Mean => "reduce mean",
            ReduceOp::Max => "reduce max",
            ReduceOp::Min => "reduce min",
        };
        let count: usize = axes.iter().map(|&a| shape[a]).product();
        if count == 0 && numel(&oshape) > 0 && matches!(op, ReduceOp::Max | ReduceOp::Min) {
            match both!(s, run_reduce(op, &x, &axes, &out)) {
                Err(e) if e.contains("empty input") => s.pass(name),
                other => s.fail(
                    name,
                    format!(
                        "{shape:?} over {axes:?}: expected an empty-input error, got {other:?}"
                    ),
                ),
            }
            continue;
        }
        let xs = x.logical();
        let mut sums = vec![0f64; numel(&oshape)];
        let mut abs = vec![0f64; numel(&oshape)];
        let mut ext = vec![None::<f64>; numel(&oshape)];
        for (p, &v) in xs.iter().enumerate() {
            let mut idx = unravel(p, shape);
            for &a in &axes {
                idx[a] = 0;
            }
            let o = Layout::contiguous(&oshape).index_of(&idx);
            sums[o] += v;
            abs[o] += v.abs();
            let better = |cur: f64| match op {
                ReduceOp::Max => v > cur || v.is_nan(),
                _ => v < cur || v.is_nan(),
            };
            ext[o] = match ext[o] {
                Some(cur) if cur.is_nan() || !better(cur) => Some(cur),
                _ => Some(v),
            };
        }
        let exact: Vec<f64> = (0..sums.len())
            .map(|o| match op {
                ReduceOp::Sum => sums[o],
                ReduceOp::Mean => sums[o] / count as f64,
                _ => ext[o].unwrap_or(f64::NAN),
            })
            .collect();
        let scale = if op == ReduceOp::Mean {
            1.0 / count.max(1) as f64
        } else {
            1.0
        };
        match both!(s, run_reduce(op, &x, &axes, &out)) {
            Ok((c, t)) => s.judge(
                name,
                &format!("{shape:?} over {axes:?} {din}->{dout} {kind:?}"),
                &c,
                t.as_deref(),
                &exact,
                &|o, w| 2f64.powi(-17) * abs[o] * scale + rounding(dout, w, 2.0),
            ),
            Err(e) => s.fail(name, format!("{shape:?} over {axes:?}: {e}")),
        }
    }
}

fn run_arg<B: Backend>(
    b: &B,
    op: ArgReduceOp,
    x: &HostTensor,
    axis: usize,
    out: &HostTensor,
) -> Result<Vec<f64>> {
    let (xb, ob) = (x.upload(b)?, out.upload(b)?);
    b.arg_reduce(
        op,
        View::new(&xb, &x.layout),
        axis,
        View::new(&ob, &out.layout),
    )?;
    read_view(b, &ob, &out.layout)
}

fn arg_reduce<B: Backend>(s: &mut Suite<'_, B>) {
    let mut cases: Vec<(Vec<usize>, Option<usize>)> = s
        .shapes(1..=3, 1 << 18)
        .into_iter()
        .map(|shape| (shape, None))
        .collect();
    // A few long lines (the backends' paths for few outputs along a long axis, and for one
    // output split over blocks), one strided.
    cases.extend([
        (vec![1, 8191], Some(1)),
        (vec![300007], Some(0)),
        (vec![4097, 1], Some(0)),
        (vec![3, 65537], Some(1)),
        (vec![2051, 2], Some(0)),
        // Short axes with many outputs (a pooling window's argmax), up to the longest a
        // backend may give one thread per output.
        (vec![37, 4, 53], Some(1)),
        (vec![16, 1001], Some(0)),
        (vec![603, 17], Some(1)),
    ]);
    for (i, (shape, axis)) in cases.iter().enumerate() {
        if shape.contains(&0) {
            continue;
        }
        let op = if i % 2 == 0 {
            ArgReduceOp::ArgMax
        } else {
            ArgReduceOp::ArgMin
        };
        let axis = match axis {
            Some(a) => *a,
            None => s.rng().below(shape.len()),
        };
        let mut oshape = shape.clone();
        oshape[axis] = 1;
        let (din, kind) = (s.float_dtype(), s.kind());
        // Few distinct values, so ties are common; sometimes a NaN.
        let mut x = random_tensor(s.rng(), shape, din, kind, |r| r.below(5) as f32);
        if i % 4 == 3 && !x.backing.is_empty() {
            let at = s.rng().below(x.backing.len());
            x.backing[at] = f32::NAN;
        }
        let out = output_tensor(s.rng(), &oshape, DType::U32);
        let xs = x.logical();
        let cl = Layout::contiguous(shape);
        let exact: Vec<f64> = (0..numel(&oshape))
            .map(|o| {
                let base = unravel(o, &oshape);
                let mut best: Option<(usize, f64)> = None;
                for j in 0..shape[axis] {
                    let mut idx = base.clone();
                    idx[axis] = j;
                    let v = xs[cl.index_of(&idx)];
                    best = match best {
                        Some((_, b)) if b.is_nan() => best,
                        None => Some((j, v)),
                        Some((_, b))
                            if v.is_nan()
                                || (op == ArgReduceOp::ArgMax && v > b)
                                || (op == ArgReduceOp::ArgMin && v < b) =>
                        {
                            Some((j, v))
                        }
                        keep => keep,
                    };
                }
                best.map_or(0.0, |(j, _)| j as f64)
            })
            .collect();
        let name = if op == ArgReduceOp::ArgMax {
            "argmax"
        } else {
            "argmin"
        };
        match both!(s, run_arg(op, &x, axis, &out)) {
            Ok((c, t)) => s.judge(
                name,
                &format!("{shape:?} axis {axis} {kind:?}"),
                &c,
                t.as_deref(),
                &exact,
                &|_, _| 0.0,
            ),
            Err(e) => s.fail(name, format!("{shape:?} axis {axis}: {e}")),
        }
    }
}

// ---------------------------------------------------------------- linear algebra

fn run_matmul<B: Backend>(
    b: &B,
    x: &HostTensor,
    y: &HostTensor,
    out: &HostTensor,
    alpha: f32,
    beta: f32,
) -> Result<Vec<f64>> {
    let (xb, yb, ob) = (x.upload(b)?, y.upload(b)?, out.upload(b)?);
    b.matmul(
        View::new(&xb, &x.layout),
        View::new(&yb, &y.layout),
        View::new(&ob, &out.layout),
        alpha,
        beta,
    )?;
    read_view(b, &ob, &out.layout)
}

/// A matrix operand `[batch, rows, cols]`, stored transposed, broadcast along the batch or
/// plain.
fn matrix_operand(
    rng: &mut TestRng,
    batch: usize,
    rows: usize,
    cols: usize,
    dtype: DType,
) -> HostTensor {
    match rng.below(3) {
        0 => {
            let mut t = random_tensor(
                rng,
                &[batch, cols, rows],
                dtype,
                ViewKind::Contiguous,
                |r| r.range(-1.0, 1.0),
            );
            t.layout = t.layout.transpose(1, 2).expect("rank 3");
            t
        }
        1 if batch > 1 => {
            random_tensor(rng, &[batch, rows, cols], dtype, ViewKind::Broadcast, |r| {
                r.range(-1.0, 1.0)
            })
        }
        _ => random_tensor(rng, &[batch, rows, cols], dtype, ViewKind::Strided, |r| {
            r.range(-1.0, 1.0)
        }),
    }
}

fn matmul<B: Backend>(s: &mut Suite<'_, B>) {
    let sizes = [1usize, 7, 16, 33, 65, 130, 257];
    let mut cases: Vec<[usize; 4]> = vec![
        [1, 257, 257, 65],
        [3, 7, 0, 7],
        [1, 0, 5, 3],
        [2, 65, 130, 33],
        // Long k over few output tiles: backends may split k (wgpu does, under beta 0), and
        // a thin output's slices may be dot products (wgpu's at most 16 wide).
        [1, 33, 1040, 65],
        [1, 12, 2080, 40],
        // Enough output tiles for wgpu's large tiles, over a thin side: its half tiles
        // (64 x 128 and 128 x 64), which pad less.
        [1, 64, 64, 32768],
        [1, 32768, 16, 40],
        // Long k over a few tiles of an odd output: split over k (wgpu's slices in 64 x 64
        // tiles, partly padding).
        [1, 40, 4096, 200],
        [1, 200, 4096, 40],
        // Wide on both sides: where f32 products may take matrix units under Precision::Fast.
        [1, 1040, 130, 1100],
    ];
    while cases.len() < s.cfg.cases + 11 {
        let r = s.rng();
        cases.push([
            1 + r.below(3),
            sizes[r.below(7)],
            sizes[r.below(7)],
            sizes[r.below(7)],
        ]);
    }
    for [batch, m, k, n] in cases {
        let dt = s.float_dtype();
        let dout = s.float_dtype();
        let x = matrix_operand(s.rng(), batch, m, k, dt);
        let y = matrix_operand(s.rng(), batch, k, n, dt);
        let out = output_tensor(s.rng(), &[batch, m, n], dout);
        let (alpha, beta) = (
            s.rng().range(0.5, 2.0),
            if s.rng().below(2) == 0 || k >= 1024 {
                0.0
            } else {
                s.rng().range(-1.0, 1.0)
            },
        );
        let oa = out.logical();
        let (mut exact, mut mag) = host_products(&x, &y, [batch, m, k, n]);
        for o in 0..batch * m * n {
            let old = if beta == 0.0 {
                0.0
            } else {
                beta as f64 * oa[o]
            };
            exact[o] = alpha as f64 * exact[o] + old;
            mag[o] = alpha as f64 * mag[o] + old.abs();
        }
        let (row, rel) = match s.policy {
            hal::Precision::Fast => ("matmul (Precision::Fast)", 2f64.powi(-10)),
            hal::Precision::Compensated => ("matmul (Precision::Compensated)", 2f64.powi(-18)),
            _ => ("matmul", 2f64.powi(-18)),
        };
        match both!(s, run_matmul(&x, &y, &out, alpha, beta)) {
            Ok((c, t)) => s.judge(
                row,
                &format!("[{batch},{m},{k}]@[{batch},{k},{n}] {dt}->{dout} beta {beta}"),
                &c,
                t.as_deref(),
                &exact,
                &|o, w| rel * mag[o] + rounding(dout, w, 2.0),
            ),
            Err(e) => s.fail(row, format!("[{batch},{m},{k},{n}]: {e}")),
        }
    }
}

/// `fixed` products `[m, k, n]` followed by the suite's count of random ones, each side one
/// of a few odd and even sizes.
fn with_random_products<B: Backend>(
    s: &mut Suite<'_, B>,
    mut fixed: Vec<[usize; 3]>,
) -> Vec<[usize; 3]> {
    let sizes = [1usize, 7, 16, 33, 65, 130];
    for _ in 0..s.cfg.cases {
        let r = s.rng();
        fixed.push([sizes[r.below(6)], sizes[r.below(6)], sizes[r.below(6)]]);
    }
    fixed
}

fn run_matmul_epilogue<B: Backend>(
    b: &B,
    [x, y, out]: [&HostTensor; 3],
    bias: Option<&HostTensor>,
    activation: Option<UnaryOp>,
    (alpha, beta): (f32, f32),
) -> Result<Vec<f64>> {
    let (xb, yb, ob) = (x.upload(b)?, y.upload(b)?, out.upload(b)?);
    let bb = bias.map(|t| t.upload(b)).transpose()?;
    let bias_view = bias
        .zip(bb.as_ref())
        .map(|(t, buf)| View::new(buf, &t.layout));
    b.matmul_epilogue(
        View::new(&xb, &x.layout),
        View::new(&yb, &y.layout),
        View::new(&ob, &out.layout),
        alpha,
        beta,
        hal::Epilogue {
            bias: bias_view,
            activation,
            ..Default::default()
        },
    )?;
    read_view(b, &ob, &out.layout)
}

/// Products with a bias and an activation after them (`Backend::matmul_epilogue`): shapes
/// that wgpu splits over k (its fused sum pass) and shapes it does not (the separate calls),
/// biases per column (contiguous, strided, broadcast), per row and per element.
fn matmul_epilogue<B: Backend>(s: &mut Suite<'_, B>) {
    let fixed = vec![
        [33, 1040, 65],
        [12, 2080, 40],
        [64, 784, 96],
        // Small thin outputs that wgpu runs whole as dot products, epilogue included.
        [130, 520, 10],
        [16, 200, 77],
        [7, 16, 33],
        [0, 5, 3],
        [5, 0, 7],
    ];
    let cases = with_random_products(s, fixed);
    let activations = [
        None,
        Some(UnaryOp::Relu),
        Some(UnaryOp::Sigmoid),
        Some(UnaryOp::Tanh),
        Some(UnaryOp::LeakyRelu { slope: 0.1 }),
        Some(UnaryOp::Gelu),
    ];
    for (i, [m, k, n]) in cases.into_iter().enumerate() {
        let (dt, dout, dbias) = (s.float_dtype(), s.float_dtype(), s.float_dtype());
        let x = matrix_operand(s.rng(), 1, m, k, dt);
        let y = matrix_operand(s.rng(), 1, k, n, dt);
        let out = output_tensor(s.rng(), &[1, m, n], dout);
        let bias_shape = match i % 4 {
            0 => None,
            1 | 2 => Some(vec![n]),
            _ => Some(if i % 8 == 3 {
                vec![m, 1]
            } else {
                vec![1, m, n]
            }),
        };
        let kind = s.kind();
        let bias = bias_shape
            .map(|shape| random_tensor(s.rng(), &shape, dbias, kind, |r| r.range(-1.0, 1.0)));
        let activation = activations[s.rng().below(activations.len())];
        let alpha = s.rng().range(0.5, 2.0);
        let beta = if s.rng().below(3) == 0 && k < 1024 {
            s.rng().range(-1.0, 1.0)
        } else {
            0.0
        };
        let (mut z, mut mag) = host_products(&x, &y, [1, m, k, n]);
        let old = out.logical();
        let bias_at = bias.as_ref().map(|b| {
            let values = b.logical();
            let shape = b.layout.shape.clone();
            move |o: usize| -> f64 {
                match shape.len() {
                    1 => values[o % n],
                    2 => values[o / n.max(1)],
                    _ => values[o],
                }
            }
        });
        let mut exact = vec![0f64; m * n];
        let mut pre = vec![0f64; m * n];
        for o in 0..m * n {
            let kept = if beta == 0.0 {
                0.0
            } else {
                beta as f64 * old[o]
            };
            z[o] = alpha as f64 * z[o] + kept;
            mag[o] = alpha as f64 * mag[o] + kept.abs();
            pre[o] = z[o] + bias_at.as_ref().map_or(0.0, |b| b(o));
            exact[o] = activation.map_or(pre[o], |op| unary_f64(op, pre[o]));
        }
        // The product's tolerance and one rounding of the product and of the sum (a backend
        // that runs the steps stores each), through the activation (slope at most 1.13,
        // GELU's), then the activation's own.
        let u = dout.unit_roundoff();
        let (rel, abs) = match activation {
            Some(op) if !is_exact_unary(op) => (4.0 * u + 2f64.powi(-18), 2f64.powi(-19)),
            _ => (2.0 * u + 2.0 * U32F, 0.0),
        };
        let tol = |o: usize, w: f64| {
            1.13 * (2f64.powi(-18) * mag[o]
                + rounding(dout, z[o], 2.0)
                + rounding(dout, pre[o], 2.0))
                + rel * w.abs()
                + abs
                + rounding(dout, w, 2.0)
        };
        let what = format!(
            "[{m},{k}]@[{k},{n}] {dt}->{dout} bias {:?} {dbias} {kind:?} {activation:?} beta {beta}",
            bias.as_ref().map(|b| b.layout.shape.clone())
        );
        match both!(
            s,
            run_matmul_epilogue([&x, &y, &out], bias.as_ref(), activation, (alpha, beta))
        ) {
            Ok((c, t)) => s.judge("matmul (epilogue)", &what, &c, t.as_deref(), &exact, &tol),
            Err(e) => s.fail("matmul (epilogue)", format!("{what}: {e}")),
        }
    }
}

fn run_matmul_gate<B: Backend>(
    b: &B,
    [x, y, out]: [&HostTensor; 3],
    gate: Option<(UnaryOp, &HostTensor)>,
    sums: Option<&HostTensor>,
    (alpha, beta): (f32, f32),
) -> Result<Vec<f64>> {
    let (xb, yb, ob) = (x.upload(b)?, y.upload(b)?, out.upload(b)?);
    let gb = gate.map(|(_, t)| t.upload(b)).transpose()?;
    let sb = sums.map(|t| t.upload(b)).transpose()?;
    let a_gate = gate
        .zip(gb.as_ref())
        .map(|((activation, t), buf)| hal::Gate {
            activation,
            output: View::new(buf, &t.layout),
        });
    b.matmul_epilogue(
        View::new(&xb, &x.layout),
        View::new(&yb, &y.layout),
        View::new(&ob, &out.layout),
        alpha,
        beta,
        hal::Epilogue {
            a_gate,
            a_row_sums: sums
                .zip(sb.as_ref())
                .map(|(t, buf)| View::new(buf, &t.layout)),
            ..Default::default()
        },
    )?;
    let mut got = read_view(b, &ob, &out.layout)?;
    if let Some((t, buf)) = sums.zip(sb.as_ref()) {
        got.extend(read_view(b, buf, &t.layout)?);
    }
    Ok(got)
}

/// The backward epilogues (`Epilogue::a_gate`, `Epilogue::a_row_sums`): a Linear layer's
/// weight gradient `(g * act'(y))^T x` with its bias gradient, and its input gradient. Gates
/// laid out as `a` (which wgpu fuses into the product's reads) and otherwise (the separate
/// calls); shapes wgpu splits over k (row sums in the split's last column; thin outputs as
/// dot products) and shapes it does not.
fn matmul_gate<B: Backend>(s: &mut Suite<'_, B>) {
    let fixed = vec![
        [65, 1040, 33],
        [10, 256, 130],
        [130, 256, 10],
        [64, 784, 96],
        [7, 16, 33],
        [0, 5, 3],
        [5, 0, 7],
        [6, 9, 0],
    ];
    let cases = with_random_products(s, fixed);
    for (i, [m, k, n]) in cases.into_iter().enumerate() {
        let (dt, dout, dgate, dsums) = (
            s.float_dtype(),
            s.float_dtype(),
            s.float_dtype(),
            s.float_dtype(),
        );
        let x = matrix_operand(s.rng(), 1, m, k, dt);
        let y = matrix_operand(s.rng(), 1, k, n, dt);
        let out = output_tensor(s.rng(), &[1, m, n], dout);
        let activation = hal::Gate::<()>::ACTIVATIONS[s.rng().below(3)];
        // The gate's output: the activation of random values, at `x`'s strides (fusable) or
        // laid out on its own.
        let act = move |v: f32| unary_f64(activation, v as f64) as f32;
        let gate = match i % 4 {
            0 => None,
            1 | 2 => {
                let backing = (0..x.backing.len())
                    .map(|_| round_to(dgate, act(s.rng().range(-2.0, 2.0))))
                    .collect();
                Some(HostTensor {
                    dtype: dgate,
                    backing,
                    layout: x.layout.clone(),
                })
            }
            _ => {
                let kind = s.kind();
                Some(random_tensor(s.rng(), &[1, m, k], dgate, kind, |r| {
                    act(r.range(-2.0, 2.0))
                }))
            }
        };
        let sums = (i % 3 != 1).then(|| output_tensor(s.rng(), &[1, m], dsums));
        let alpha = s.rng().range(0.5, 2.0);
        let beta = if s.rng().below(4) == 0 {
            s.rng().range(-1.0, 1.0)
        } else {
            0.0
        };
        // The gated operand in f64, then the product and the row sums.
        let mut gated = x.clone();
        if let Some(g) = &gate {
            let (xs, ys) = (x.logical(), g.logical());
            let through = |a: f64, y: f64| match activation {
                UnaryOp::Relu if y > 0.0 => a,
                UnaryOp::Relu => 0.0,
                UnaryOp::Sigmoid => y * (1.0 - y) * a,
                _ => (1.0 - y * y) * a,
            };
            let values: Vec<f32> = (0..m * k).map(|e| through(xs[e], ys[e]) as f32).collect();
            gated = HostTensor::contiguous(DType::F32, &[1, m, k], values);
        }
        let (mut exact, mut mag) = host_products(&gated, &y, [1, m, k, n]);
        let old = out.logical();
        for o in 0..m * n {
            let kept = if beta == 0.0 {
                0.0
            } else {
                beta as f64 * old[o]
            };
            exact[o] = alpha as f64 * exact[o] + kept;
            mag[o] = alpha as f64 * mag[o] + kept.abs();
        }
        if sums.is_some() {
            let ga = gated.logical();
            for r in 0..m {
                let row = &ga[r * k..(r + 1) * k];
                exact.push(alpha as f64 * row.iter().sum::<f64>());
                mag.push(alpha as f64 * k as f64 * row.iter().map(|v| v.abs()).sum::<f64>());
            }
        }
        // The product's tolerance (its scale from the gated operand, which the host rounds
        // to f32 as a backend does), one rounding of the stored values (two for the row
        // sums: a backend may round the sum and then its scaling by alpha).
        let tol = |o: usize, w: f64| {
            let d = if o < m * n { dout } else { dsums };
            2f64.powi(-18) * mag[o] + rounding(d, w, 2.0) + 2.0 * U32F * w.abs()
        };
        let what = format!(
            "[{m},{k}]@[{k},{n}] {dt}->{dout} gate {:?} {dgate} (layout of a: {}) sums {:?} {dsums} beta {beta}",
            gate.as_ref().map(|_| activation),
            gate.as_ref().is_some_and(|g| g.layout == x.layout),
            sums.as_ref().map(|t| t.layout.clone()),
        );
        let gate_arg = gate.as_ref().map(|g| (activation, g));
        match both!(
            s,
            run_matmul_gate([&x, &y, &out], gate_arg, sums.as_ref(), (alpha, beta))
        ) {
            Ok((c, t)) => s.judge(
                "matmul (gate, row sums)",
                &what,
                &c,
                t.as_deref(),
                &exact,
                &tol,
            ),
            Err(e) => s.fail("matmul (gate, row sums)", format!("{what}: {e}")),
        }
    }
}

/// The batched product `x @ y` in f64 on the host, and beside it `k * (|x| @ |y|)` (the scale
/// matmul tolerances are stated in).
fn host_products(
    x: &HostTensor,
    y: &HostTensor,
    [batch, m, k, n]: [usize; 4],
) -> (Vec<f64>, Vec<f64>) {
    let (xa, ya) = (x.logical(), y.logical());
    let mut exact = vec![0f64; batch * m * n];
    let mut mag = vec![0f64; batch * m * n];
    for bi in 0..batch {
        for i in 0..m {
            for j in 0..n {
                let o = (bi * m + i) * n + j;
                for p in 0..k {
                    let v = xa[(bi * m + i) * k + p] * ya[(bi * k + p) * n + j];
                    exact[o] += v;
                    mag[o] += v.abs();
                }
                mag[o] *= k as f64;
            }
        }
    }
    (exact, mag)
}

/// Products whose operands hold values that f16 cannot represent (bf16 operands; f32 ones
/// under `Fast` and `Compensated`): a backend that multiplies on f16 matrix units must notice
/// (huge, tiny, infinite) and compute them another way, within the policy's tolerance.
fn matmul_beyond_f16<B: Backend>(s: &mut Suite<'_, B>) {
    let (row, rel, dt) = match s.policy {
        hal::Precision::Fast => (
            "matmul (Precision::Fast, beyond f16)",
            2f64.powi(-10),
            DType::F32,
        ),
        hal::Precision::Compensated => (
            "matmul (Precision::Compensated, beyond f16)",
            2f64.powi(-18),
            DType::F32,
        ),
        _ => ("matmul (bf16 beyond f16)", 2f64.powi(-18), DType::BF16),
    };
    for (case, [batch, m, k, n]) in [[1, 65, 33, 65], [2, 130, 47, 129], [1, 257, 64, 200]]
        .into_iter()
        .enumerate()
    {
        let odd = [3.0e5f32, -7.5e6, 1.0e-9, 2.5e-12][case % 4];
        let mut x = random_tensor(s.rng(), &[batch, m, k], dt, ViewKind::Contiguous, |r| {
            r.range(-1.0, 1.0)
        });
        let y = random_tensor(s.rng(), &[batch, k, n], dt, ViewKind::Strided, |r| {
            r.range(-1.0, 1.0)
        });
        let at = s.rng().below(x.backing.len());
        x.backing[at] = round_to(dt, odd);
        let out = output_tensor(s.rng(), &[batch, m, n], DType::F32);
        let (exact, mag) = host_products(&x, &y, [batch, m, k, n]);
        match both!(s, run_matmul(&x, &y, &out, 1.0, 0.0)) {
            Ok((c, t)) => s.judge(
                row,
                &format!("[{batch},{m},{k}]@[{batch},{k},{n}] {dt} holding {odd:e}"),
                &c,
                t.as_deref(),
                &exact,
                &|o, w| rel * mag[o] + rounding(DType::F32, w, 2.0),
            ),
            Err(e) => s.fail(row, format!("[{batch},{m},{k},{n}]: {e}")),
        }
    }
}

struct CsrHost {
    rows: usize,
    cols: usize,
    offsets: Vec<u32>,
    indices: Vec<u32>,
    values: Vec<f32>,
}

fn run_spmv<B: Backend>(
    b: &B,
    a: &CsrHost,
    x: &[f32],
    y: &[f32],
    alpha: f32,
    beta: f32,
) -> Result<Vec<f64>> {
    let (ro, ci, va) = (
        b.upload(&a.offsets)?,
        b.upload(&a.indices)?,
        b.upload(&a.values)?,
    );
    let (xb, yb) = (b.upload(x)?, b.upload(y)?);
    b.spmv_csr(
        Csr {
            rows: a.rows,
            cols: a.cols,
            row_offsets: &ro,
            col_indices: &ci,
            values: &va,
        },
        &xb,
        &yb,
        alpha,
        beta,
    )?;
    Ok(b.read::<f32>(&yb)?.into_iter().map(f64::from).collect())
}

fn spmv<B: Backend>(s: &mut Suite<'_, B>) {
    let dims = [0usize, 1, 7, 257, 65537];
    for c in 0..s.cfg.cases + 4 {
        let (rows, cols) = (dims[c % 5], dims[(c / 5 + 2) % 5].max(1));
        let r = s.rng();
        let mut a = CsrHost {
            rows,
            cols,
            offsets: vec![0],
            indices: Vec::new(),
            values: Vec::new(),
        };
        for _ in 0..rows {
            for _ in 0..r.below(9) {
                a.indices.push(r.below(cols) as u32);
                a.values.push(r.range(-1.0, 1.0));
            }
            a.offsets.push(a.indices.len() as u32);
        }
        let x: Vec<f32> = (0..cols).map(|_| r.range(-1.0, 1.0)).collect();
        let y: Vec<f32> = (0..rows).map(|_| r.range(-1.0, 1.0)).collect();
        let (alpha, beta) = (
            r.range(0.5, 2.0),
            if r.below(2) == 0 {
                0.0
            } else {
                r.range(-1.0, 1.0)
            },
        );
        let mut exact = vec![0f64; rows];
        let mut mag = vec![0f64; rows];
        for i in 0..rows {
            let (mut acc, mut m) = (0f64, 0f64);
            for k in a.offsets[i] as usize..a.offsets[i + 1] as usize {
                let t = a.values[k] as f64 * x[a.indices[k] as usize] as f64;
                acc += t;
                m += t.abs();
            }
            exact[i] = alpha as f64 * acc
                + if beta == 0.0 {
                    0.0
                } else {
                    beta as f64 * y[i] as f64
                };
            mag[i] = alpha as f64 * m * 9.0 + (beta as f64 * y[i] as f64).abs();
        }
        match both!(s, run_spmv(&a, &x, &y, alpha, beta)) {
            Ok((cv, t)) => s.judge(
                "spmv_csr",
                &format!("{rows}x{cols}"),
                &cv,
                t.as_deref(),
                &exact,
                &|i, w| 2f64.powi(-18) * mag[i] + 2.0 * U32F * w.abs(),
            ),
            Err(e) => s.fail("spmv_csr", format!("{rows}x{cols}: {e}")),
        }
    }
}

// ---------------------------------------------------------------- indexing

fn run_gather<B: Backend>(
    b: &B,
    x: &HostTensor,
    axis: usize,
    index: &HostTensor,
    out: &HostTensor,
) -> Result<Vec<f64>> {
    let (xb, ib, ob) = (x.upload(b)?, index.upload(b)?, out.upload(b)?);
    b.gather(
        View::new(&xb, &x.layout),
        axis,
        View::new(&ib, &index.layout),
        View::new(&ob, &out.layout),
    )?;
    read_view(b, &ob, &out.layout)
}

fn gather<B: Backend>(s: &mut Suite<'_, B>) {
    let shapes = s.shapes(1..=3, 1 << 17);
    for (i, shape) in shapes.iter().enumerate() {
        let axis = s.rng().below(shape.len());
        if shape[axis] == 0 {
            continue;
        }
        let (dx, kind) = (s.float_dtype(), s.kind());
        let x = random_tensor(s.rng(), shape, dx, kind, |r| r.range(-3.0, 3.0));
        let select = i % 2 == 1; // index_select: one index list broadcast along the other dims
        let ishape = s.index_shape(shape, axis);
        let bound = shape[axis];
        let idt = if s.rng().below(2) == 0 {
            DType::U32
        } else {
            DType::I32
        };
        let index = if select {
            let mut t = random_tensor(s.rng(), &[ishape[axis]], idt, ViewKind::Contiguous, |r| {
                r.below(bound) as f32
            });
            let mut l = Layout {
                shape: vec![1; shape.len()],
                strides: vec![0; shape.len()],
                offset: 0,
            };
            l.shape[axis] = ishape[axis];
            l.strides[axis] = 1;
            t.layout = l.broadcast_to(&ishape).expect("broadcast");
            t
        } else {
            random_tensor(s.rng(), &ishape, idt, ViewKind::Strided, |r| {
                r.below(bound) as f32
            })
        };
        let fdt = s.float_dtype();
        let out = output_tensor(s.rng(), &ishape, fdt);
        let (xs, is) = (&x, index.logical());
        let exact: Vec<f64> = (0..numel(&ishape))
            .map(|p| {
                let mut idx = unravel(p, &ishape);
                idx[axis] = is[p] as usize;
                round_to(out.dtype, xs.backing[xs.layout.index_of(&idx)]) as f64
            })
            .collect();
        let name = if select {
            "gather (index_select)"
        } else {
            "gather"
        };
        match both!(s, run_gather(&x, axis, &index, &out)) {
            Ok((c, t)) => s.judge(
                name,
                &format!("{shape:?} axis {axis} index {ishape:?}"),
                &c,
                t.as_deref(),
                &exact,
                &|_, _| 0.0,
            ),
            Err(e) => s.fail(name, format!("{shape:?} axis {axis} index {ishape:?}: {e}")),
        }
    }
}

fn run_scatter<B: Backend>(
    b: &B,
    src: &HostTensor,
    axis: usize,
    index: &HostTensor,
    out: &HostTensor,
) -> Result<Vec<f64>> {
    let (sb, ib, ob) = (src.upload(b)?, index.upload(b)?, out.upload(b)?);
    b.scatter_add(
        View::new(&sb, &src.layout),
        axis,
        View::new(&ib, &index.layout),
        View::new(&ob, &out.layout),
    )?;
    read_view(b, &ob, &out.layout)
}

fn scatter_add<B: Backend>(s: &mut Suite<'_, B>) {
    let shapes = s.shapes(1..=3, 1 << 17);
    for shape in shapes {
        let axis = s.rng().below(shape.len());
        if shape[axis] == 0 {
            continue;
        }
        let ishape = s.index_shape(&shape, axis);
        let bound = shape[axis];
        let index = random_tensor(s.rng(), &ishape, DType::U32, ViewKind::Contiguous, |r| {
            r.below(bound) as f32
        });
        let kind = s.kind();
        let fdt = s.float_dtype();
        let src = random_tensor(s.rng(), &ishape, fdt, kind, |r| r.range(-1.0, 1.0));
        let fdt = s.float_dtype();
        let out = output_tensor(s.rng(), &shape, fdt);
        let mut exact = out.logical();
        let mut mag: Vec<f64> = exact.iter().map(|v| v.abs()).collect();
        let mut terms = vec![1f64; exact.len()];
        let (is, ss) = (index.logical(), src.logical());
        let cl = Layout::contiguous(&shape);
        for p in 0..numel(&ishape) {
            let mut idx = unravel(p, &ishape);
            idx[axis] = is[p] as usize;
            let o = cl.index_of(&idx);
            exact[o] += ss[p];
            mag[o] += ss[p].abs();
            terms[o] += 1.0;
        }
        let dout = out.dtype;
        // Each add rounds to the output dtype: the sequential-summation bound, k terms.
        match both!(s, run_scatter(&src, axis, &index, &out)) {
            Ok((c, t)) => s.judge(
                "scatter_add",
                &format!("{shape:?} axis {axis} index {ishape:?} {kind:?}"),
                &c,
                t.as_deref(),
                &exact,
                &|o, w| {
                    2.0 * terms[o] * (U32F + dout.unit_roundoff()) * mag[o] + rounding(dout, w, 2.0)
                },
            ),
            Err(e) => s.fail("scatter_add", format!("{shape:?} axis {axis}: {e}")),
        }
    }
}

fn run_im2col<B: Backend>(
    b: &B,
    x: &HostTensor,
    g: &Conv2dGeometry,
    out: &HostTensor,
) -> Result<Vec<f64>> {
    let (xb, ob) = (x.upload(b)?, out.upload(b)?);
    b.im2col(View::new(&xb, &x.layout), g, View::new(&ob, &out.layout))?;
    read_view(b, &ob, &out.layout)
}

fn run_col2im<B: Backend>(
    b: &B,
    c: &HostTensor,
    g: &Conv2dGeometry,
    out: &HostTensor,
) -> Result<Vec<f64>> {
    let (cb, ob) = (c.upload(b)?, out.upload(b)?);
    b.col2im(View::new(&cb, &c.layout), g, View::new(&ob, &out.layout))?;
    read_view(b, &ob, &out.layout)
}

fn conv<B: Backend>(s: &mut Suite<'_, B>) {
    let mut done = 0;
    while done < s.cfg.cases + 4 {
        let r = s.rng();
        let g = Conv2dGeometry {
            batch: 1 + r.below(2),
            channels: 1 + r.below(3),
            height: 1 + r.below(12),
            width: 1 + r.below(12),
            kernel: (1 + r.below(3), 1 + r.below(3)),
            stride: (1 + r.below(2), 1 + r.below(2)),
            padding: (r.below(2), r.below(2)),
            dilation: (1 + r.below(2), 1 + r.below(2)),
        };
        let Some(cols) = g.cols_shape() else { continue };
        done += 1;
        let (oh, ow) = g.output_size().expect("valid");
        let kind = s.kind();
        let fdt = s.float_dtype();
        let x = random_tensor(s.rng(), &g.image_shape(), fdt, kind, |r| r.range(-1.0, 1.0));
        let out = output_tensor(s.rng(), &cols, x.dtype);
        // Reference: each (column row, output position) reads one pixel or the padding.
        let xs = x.logical();
        let il = Layout::contiguous(&g.image_shape());
        let (kh, kw) = g.kernel;
        let pixel = |n: usize, row: usize, pos: usize| -> Option<usize> {
            let (c, i, j) = (row / (kh * kw), (row / kw) % kh, row % kw);
            let (oy, ox) = (pos / ow, pos % ow);
            let iy = (oy * g.stride.0 + i * g.dilation.0) as isize - g.padding.0 as isize;
            let ix = (ox * g.stride.1 + j * g.dilation.1) as isize - g.padding.1 as isize;
            (iy >= 0 && ix >= 0 && (iy as usize) < g.height && (ix as usize) < g.width)
                .then(|| il.index_of(&[n, c, iy as usize, ix as usize]))
        };
        let exact: Vec<f64> = (0..numel(&cols))
            .map(|p| {
                let [n, row, pos] = <[usize; 3]>::try_from(unravel(p, &cols)).expect("rank 3");
                pixel(n, row, pos).map_or(0.0, |at| xs[at])
            })
            .collect();
        match both!(s, run_im2col(&x, &g, &out)) {
            Ok((c, t)) => s.judge(
                "im2col",
                &format!("{g:?} {kind:?}"),
                &c,
                t.as_deref(),
                &exact,
                &|_, _| 0.0,
            ),
            Err(e) => s.fail("im2col", format!("{g:?}: {e}")),
        }
        // col2im: the adjoint, summing every column entry into its pixel.
        let fdt = s.float_dtype();
        let colsv = random_tensor(s.rng(), &cols, fdt, kind, |r| r.range(-1.0, 1.0));
        let fdt = s.float_dtype();
        let img = output_tensor(s.rng(), &g.image_shape(), fdt);
        let cv = colsv.logical();
        let mut exact = vec![0f64; numel(&g.image_shape())];
        let mut mag = vec![0f64; exact.len()];
        for (p, &v) in cv.iter().enumerate() {
            let [n, row, pos] = <[usize; 3]>::try_from(unravel(p, &cols)).expect("rank 3");
            if let Some(at) = pixel(n, row, pos) {
                exact[at] += v;
                mag[at] += v.abs();
            }
        }
        let _ = (oh, ow);
        match both!(s, run_col2im(&colsv, &g, &img)) {
            Ok((c, t)) => s.judge(
                "col2im",
                &format!("{g:?} {kind:?}"),
                &c,
                t.as_deref(),
                &exact,
                &|o, w| 2f64.powi(-17) * mag[o] + rounding(img.dtype, w, 2.0),
            ),
            Err(e) => s.fail("col2im", format!("{g:?}: {e}")),
        }
    }
}

// ---------------------------------------------------------------- clustering

/// Runs `nearest_centroid` on `x` and `c` (rank 2, or rank 3 for a batch) and returns the
/// indices and distances group after group. A batch's outputs are point-major (`[n, g]`
/// storage seen as `[g, n]`), as a product quantiser lays out its codes.
fn run_nc<B: Backend>(b: &B, x: &HostTensor, c: &HostTensor) -> Result<(Vec<f64>, Vec<f64>)> {
    let (g, n) = match x.shape() {
        [g, n, _] => (*g, *n),
        shape => (1, shape[0]),
    };
    let (xb, cb) = (x.upload(b)?, c.upload(b)?);
    let (ib, db) = (b.alloc(DType::U32, g * n)?, b.alloc(DType::F32, g * n)?);
    let l = match x.shape().len() {
        3 => Layout::contiguous(&[n, g]).transpose(0, 1)?,
        _ => Layout::contiguous(&[n]),
    };
    b.nearest_centroid(
        View::new(&xb, &x.layout),
        View::new(&cb, &c.layout),
        View::new(&ib, &l),
        View::new(&db, &l),
    )?;
    let group_major = |v: Vec<f32>| -> Vec<f64> {
        (0..g * n)
            .map(|t| f64::from(v[(t % n) * g + t / n]))
            .collect()
    };
    Ok((group_major(b.read_f32(&ib)?), group_major(b.read_f32(&db)?)))
}

fn nearest_centroid<B: Backend>(s: &mut Suite<'_, B>) {
    let mut cases: Vec<[usize; 3]> = vec![
        [0, 4, 3],
        [1, 1, 1],
        [7, 3, 7],
        [257, 16, 65],
        [65537, 8, 33],
        [300, 33, 257],
        // Tensor-core shapes (contiguous rows, d a multiple of 4): several ragged centroid
        // tiles, d at and under the held kernels' limit, and beyond it.
        [1000, 128, 300],
        [129, 96, 513],
        [200, 132, 130],
        [150, 260, 200],
    ];
    while cases.len() < s.cfg.cases + 4 {
        let r = s.rng();
        cases.push([1 + r.below(500), 1 + r.below(40), 1 + r.below(100)]);
    }
    for [n, d, m] in cases {
        // The tensor-core shapes keep contiguous rows, so those kernels surely run.
        let (dt, kind) = match d {
            96.. => (DType::F32, ViewKind::Contiguous),
            _ => (s.float_dtype(), s.kind()),
        };
        let x = random_tensor(s.rng(), &[n, d], dt, kind, |r| r.range(-1.0, 1.0));
        let mut c = random_tensor(s.rng(), &[m, d], dt, ViewKind::Contiguous, |r| {
            r.range(-1.0, 1.0)
        });
        if m >= 3 {
            // A duplicated centroid: the lower index must win the tie.
            let (src, dst) = (s.rng().below(m / 2), m / 2 + s.rng().below(m - m / 2));
            for k in 0..d {
                c.backing[dst * d + k] = c.backing[src * d + k];
            }
        }
        let (xs, cs) = (x.logical(), c.logical());
        match both!(s, run_nc(&x, &c)) {
            Ok(((ci, cd), t)) => {
                let case = format!("n={n} d={d} m={m} {dt} {kind:?}");
                let reference = t.as_ref().map(|_| ci.as_slice());
                let (gi, gd) = t.as_ref().map_or((&ci, &cd), |(ti, td)| (ti, td));
                let got = (gi.as_slice(), gd.as_slice());
                let (worst, worst_rel, worst_case) =
                    judge_nearest(s.policy, &xs, &cs, [n, d, m], got, reference);
                s.record(
                    nearest_row(s.policy),
                    &format!("{case} {worst_case}"),
                    worst_rel,
                    worst,
                );
            }
            Err(e) => s.fail("nearest_centroid", format!("n={n} d={d} m={m}: {e}")),
        }
    }
}

/// The table row a nearest-centroid check reports under.
fn nearest_row(policy: hal::Precision) -> &'static str {
    if policy == hal::Precision::Fast {
        "nearest_centroid (Precision::Fast)"
    } else {
        "nearest_centroid"
    }
}

/// Judges nearest-centroid results `got` (indices, distances) for the points `xs: [n, d]`
/// among `cs: [m, d]` (float64, row-major): for every row, the chosen centroid's exact
/// distance must be within tolerance of the best one's (the reference's choice when
/// `reference` gives the CPU's indices), the reported distance within tolerance of the exact
/// one, and an exact tie between duplicate centroids must go to the lower index. Returns the
/// worst tolerance ratio, the worst relative distance error and the worst row's description.
fn judge_nearest(
    policy: hal::Precision,
    xs: &[f64],
    cs: &[f64],
    [n, d, m]: [usize; 3],
    (gi, gd): (&[f64], &[f64]),
    reference: Option<&[f64]>,
) -> (f64, f64, String) {
    let dist = |i: usize, j: usize| -> f64 {
        (0..d)
            .map(|k| (xs[i * d + k] - cs[j * d + k]).powi(2))
            .sum()
    };
    let norm = |v: &[f64], i: usize| -> f64 { (0..d).map(|k| v[i * d + k].powi(2)).sum() };
    let cmax = (0..m).map(|j| norm(cs, j)).fold(0.0, f64::max);
    let (mut worst, mut worst_rel, mut worst_case) = (0f64, 0f64, String::new());
    // Precision::Fast may pick a centroid up to 2^-9 (|x|^2 + |c|^2) worse.
    let choice = if policy == hal::Precision::Fast {
        2f64.powi(-9)
    } else {
        2f64.powi(-16)
    };
    for i in 0..n {
        let tol = 2f64.powi(-16) * (norm(xs, i) + cmax);
        let choice_tol = choice * (norm(xs, i) + cmax);
        let j = gi[i] as usize;
        let reference_j = match reference {
            Some(ci) => ci[i] as usize,
            None => (0..m)
                .min_by(|&a, &b| dist(i, a).total_cmp(&dist(i, b)))
                .unwrap_or(0),
        };
        let best = dist(i, reference_j);
        let chosen = if j < m { dist(i, j) } else { f64::INFINITY };
        let mut over = ((chosen - best).max(0.0) / choice_tol).max((gd[i] - chosen).abs() / tol);
        if chosen == best
            && j > reference_j
            && (0..d).all(|k| cs[j * d + k] == cs[reference_j * d + k])
        {
            over = f64::INFINITY; // a duplicate centroid not resolved to the lower index
        }
        worst_rel = worst_rel.max((gd[i] - best).abs() / best.max(2f64.powi(-20)));
        if over > worst {
            worst = over;
            worst_case = format!(
                "row {i}: index {j} (distance {}) vs {reference_j} (distance {best})",
                gd[i]
            );
        }
    }
    (worst, worst_rel, worst_case)
}

fn run_kmeans_pp<B: Backend>(
    b: &B,
    x: &[f32],
    [n, d, m]: [usize; 3],
    seed: u64,
) -> Result<Vec<f64>> {
    let xb = b.upload(x)?;
    let anchors = b.alloc(DType::F32, m * d)?;
    b.kmeans_pp(
        View::new(&xb, &Layout::contiguous(&[n, d])),
        View::new(&anchors, &Layout::contiguous(&[m, d])),
        seed,
    )?;
    Ok(b.read::<f32>(&anchors)?
        .into_iter()
        .map(f64::from)
        .collect())
}

/// The row of `x` each anchor is (`None` where an anchor is no row).
fn anchor_rows(x: &[f32], anchors: &[f64], d: usize) -> Vec<Option<usize>> {
    anchors
        .chunks(d.max(1))
        .map(|a| {
            x.chunks(d.max(1))
                .position(|r| r.iter().zip(a).all(|(&v, &w)| v as f64 == w))
        })
        .collect()
}

/// k-means++ seeding: every anchor a row of `x`, no row twice, and the target's picks the
/// reference's until a step where the two picks' race keys (recomputed in float64 from the
/// shared anchors so far and the uniform stream) lie within the distance tolerance of each
/// other; from there on the two runs legitimately differ. Keys' tolerance: `2^-12` relative
/// (distances of up to a few hundred coordinates summed in f32 in different orders).
fn kmeans_pp<B: Backend>(s: &mut Suite<'_, B>) {
    let mut cases: Vec<[usize; 3]> = vec![
        [1, 3, 1],
        [7, 2, 7],
        [300, 5, 23],
        [2000, 128, 64],
        [999, 50, 40],
        [513, 300, 9],
        [1500, 768, 30],
        // Fewer slices of points than coordinates: the sliced step's copy of each anchor's
        // row needs threads of its own.
        [11, 57, 9],
    ];
    while cases.len() < s.cfg.cases.min(4) + 7 {
        let r = s.rng();
        let n = 1 + r.below(3000);
        cases.push([n, 1 + r.below(160), 1 + r.below(n.min(80))]);
    }
    for [n, d, m] in cases {
        // Points in a few loose clusters, as seeding meets them.
        let centres: Vec<f32> = (0..8 * d).map(|_| s.rng().range(-4.0, 4.0)).collect();
        let x: Vec<f32> = (0..n * d)
            .map(|i| centres[(i / d % 8) * d + i % d] + s.rng().range(-1.0, 1.0))
            .collect();
        let seed = s.rng().next_u64();
        let case = format!("n={n} d={d} m={m} seed={seed}");
        let (cpu, target) = match both!(s, run_kmeans_pp(&x, [n, d, m], seed)) {
            Ok(r) => r,
            Err(e) => {
                s.fail("kmeans_pp", format!("{case}: {e}"));
                continue;
            }
        };
        let got = target.as_ref().unwrap_or(&cpu);
        let (picked, reference) = (anchor_rows(&x, got, d), anchor_rows(&x, &cpu, d));
        let mut rows = std::collections::HashSet::new();
        if let Some(j) = (0..m).find(|&j| picked[j].is_none_or(|r| !rows.insert(r))) {
            s.fail(
                "kmeans_pp",
                format!("{case}: anchor {j} is not a new row of x ({:?})", picked[j]),
            );
            continue;
        }
        let mut over = 0.0f64;
        if let Some(j) = (0..m).find(|&j| picked[j] != reference[j]) {
            // D^2 to the anchors both placed, then each pick's key.
            let row = |i: usize| &x[i * d..(i + 1) * d];
            let d2 = |i: usize| -> f64 {
                reference[..j]
                    .iter()
                    .map(|a| {
                        let a = row(a.expect("checked"));
                        row(i)
                            .iter()
                            .zip(a)
                            .map(|(&p, &q)| (p as f64 - q as f64).powi(2))
                            .sum::<f64>()
                    })
                    .fold(f64::INFINITY, f64::min)
            };
            let key = |i: usize| -> f64 {
                let u = hal::random::random_value(
                    hal::Distribution::Uniform {
                        low: 0.0,
                        high: 1.0,
                    },
                    seed,
                    (j * n + i) as u64,
                );
                if j == 0 {
                    return u as f64;
                }
                -(u.max(f32::MIN_POSITIVE) as f64).ln() / d2(i)
            };
            let (ours, theirs) = (
                key(picked[j].expect("checked")),
                key(reference[j].expect("checked")),
            );
            over = (ours / theirs - 1.0).abs() / 2f64.powi(-12);
        }
        s.record("kmeans_pp", &case, 0.0, over);
    }
}

/// Batched searches (`x: [g, n, d]` against `centroids: [g, m, d]`): each group's results
/// judged against its own centroids as the unbatched search is, on any view of the points,
/// with a duplicated centroid in every group.
fn nearest_centroid_batched<B: Backend>(s: &mut Suite<'_, B>) {
    let mut cases: Vec<[usize; 4]> = vec![
        [1, 1, 1, 1],
        [3, 0, 4, 5],
        [16, 1000, 8, 256],
        [3, 257, 5, 33],
        [5, 300, 20, 9],
        [2, 129, 3, 1],
        [4, 70, 67, 40],
        [6, 90, 13, 300],
    ];
    while cases.len() < s.cfg.cases.min(6) + 8 {
        let r = s.rng();
        cases.push([
            1 + r.below(20),
            1 + r.below(300),
            1 + r.below(24),
            1 + r.below(100),
        ]);
    }
    for [g, n, d, m] in cases {
        let (dt, kind) = (s.float_dtype(), s.kind());
        let x = random_tensor(s.rng(), &[g, n, d], dt, kind, |r| r.range(-1.0, 1.0));
        let mut c = random_tensor(s.rng(), &[g, m, d], dt, ViewKind::Contiguous, |r| {
            r.range(-1.0, 1.0)
        });
        if m >= 3 {
            for group in 0..g {
                let (src, dst) = (s.rng().below(m / 2), m / 2 + s.rng().below(m - m / 2));
                let base = group * m * d;
                for k in 0..d {
                    c.backing[base + dst * d + k] = c.backing[base + src * d + k];
                }
            }
        }
        let (xs, cs) = (x.logical(), c.logical());
        let case = format!("g={g} n={n} d={d} m={m} {dt} {kind:?}");
        match both!(s, run_nc(&x, &c)) {
            Ok(((ci, cd), t)) => {
                let (gi, gd) = t.as_ref().map_or((&ci, &cd), |(ti, td)| (ti, td));
                let (mut worst, mut worst_rel, mut worst_case) = (0f64, 0f64, String::new());
                for group in 0..g {
                    let rows = group * n..(group + 1) * n;
                    let reference = t.as_ref().map(|_| &ci[rows.clone()]);
                    let (w, r, case) = judge_nearest(
                        s.policy,
                        &xs[group * n * d..(group + 1) * n * d],
                        &cs[group * m * d..(group + 1) * m * d],
                        [n, d, m],
                        (&gi[rows.clone()], &gd[rows]),
                        reference,
                    );
                    worst_rel = worst_rel.max(r);
                    if w > worst {
                        (worst, worst_case) = (w, format!("group {group} {case}"));
                    }
                }
                s.record(
                    "nearest_centroid (batched)",
                    &format!("{case} {worst_case}"),
                    worst_rel,
                    worst,
                );
            }
            Err(e) => s.fail("nearest_centroid (batched)", format!("{case}: {e}")),
        }
    }
}

fn run_seg<B: Backend>(
    b: &B,
    x: &HostTensor,
    seg: &[u32],
    w: Option<&[f32]>,
    m: usize,
) -> Result<Vec<f64>> {
    let (n, d) = (x.shape()[0], x.shape()[1]);
    let xb = x.upload(b)?;
    let sb = b.upload(seg)?;
    let wb = w.map(|w| b.upload(w)).transpose()?;
    let (sums, counts) = (b.alloc(DType::F32, m * d)?, b.alloc(DType::F32, m)?);
    let (ln, lm, lmd) = (
        Layout::contiguous(&[n]),
        Layout::contiguous(&[m]),
        Layout::contiguous(&[m, d]),
    );
    b.segment_sum(
        View::new(&xb, &x.layout),
        View::new(&sb, &ln),
        wb.as_ref().map(|w| View::new(w, &ln)),
        View::new(&sums, &lmd),
        View::new(&counts, &lm),
    )?;
    let mut out: Vec<f64> = b.read::<f32>(&sums)?.into_iter().map(f64::from).collect();
    out.extend(b.read::<f32>(&counts)?.into_iter().map(f64::from));
    Ok(out)
}

fn segment_sum<B: Backend>(s: &mut Suite<'_, B>) {
    let mut cases: Vec<[usize; 3]> = vec![
        [0, 3, 2],
        [1, 1, 1],
        [7, 5, 3],
        [257, 16, 7],
        [65537, 8, 257],
        [3001, 5, 300],
        [3, 2, 1],
        // Segments times rows beyond 2^24, where GPU backends sort the rows first (smaller
        // problems scan the ids per segment); odd position, so weighted. The second has at
        // most 64 rows per segment on average (CUDA sums such segments whole, not in parts).
        [70001, 3, 300],
        [65537, 4, 1031],
    ];
    while cases.len() < s.cfg.cases + 7 {
        let r = s.rng();
        cases.push([r.below(3000), 1 + r.below(40), 1 + r.below(400)]);
    }
    for (ci, [n, d, m]) in cases.into_iter().enumerate() {
        let kind = s.kind();
        let fdt = s.float_dtype();
        let x = random_tensor(s.rng(), &[n, d], fdt, kind, |r| r.range(-1.0, 1.0));
        let r = s.rng();
        let seg: Vec<u32> = (0..n).map(|_| r.below(m) as u32).collect();
        segment_case(s, &x, &seg, m, ci % 2 == 1, &format!("{kind:?}"));
    }
    // Long segments of one repeated row (a broadcast view of same-sign values), most rows in
    // segment 0: the sums that drift furthest where a backend adds a segment as one chain of
    // f32 adds. Sized for each GPU path: the per-segment scan, the sorted sums in parts, and
    // the sorted sums of whole segments (at most 64 rows per segment on average).
    for (ci, [n, d, m]) in [[6000, 9, 2], [90000, 3, 200], [30000, 3, 600]]
        .into_iter()
        .enumerate()
    {
        let r = s.rng();
        let row: Vec<f32> = (0..d).map(|_| r.range(0.5, 1.0)).collect();
        let x = HostTensor {
            dtype: DType::F32,
            backing: row,
            layout: Layout::contiguous(&[1, d])
                .broadcast_to(&[n, d])
                .expect("broadcast"),
        };
        let seg: Vec<u32> = (0..n)
            .map(|i| if i % 8 == 0 { r.below(m) as u32 } else { 0 })
            .collect();
        segment_case(s, &x, &seg, m, ci == 1, "equal rows");
    }
}

/// One segment_sum case judged against the float64 sums (weights drawn here when
/// `weighted`).
fn segment_case<B: Backend>(
    s: &mut Suite<'_, B>,
    x: &HostTensor,
    seg: &[u32],
    m: usize,
    weighted: bool,
    what: &str,
) {
    let (n, d) = (x.layout.shape[0], x.layout.shape[1]);
    let r = s.rng();
    let w: Vec<f32> = (0..n).map(|_| r.range(0.05, 1.0)).collect();
    let xs = x.logical();
    let mut exact = vec![0f64; m * d + m];
    let mut mag = vec![0f64; m * d + m];
    for i in 0..n {
        let wi = if weighted { w[i] as f64 } else { 1.0 };
        let sg = seg[i] as usize;
        for k in 0..d {
            exact[sg * d + k] += wi * xs[i * d + k];
            mag[sg * d + k] += (wi * xs[i * d + k]).abs();
        }
        exact[m * d + sg] += wi;
        mag[m * d + sg] += wi;
    }
    let name = if weighted {
        "segment_sum (weighted)"
    } else {
        "segment_sum"
    };
    let wref = weighted.then_some(&w[..]);
    match both!(s, run_seg(x, seg, wref, m)) {
        Ok((c, t)) => s.judge(
            name,
            &format!("n={n} d={d} m={m} {what}"),
            &c,
            t.as_deref(),
            &exact,
            &|o, w| 2f64.powi(-17) * mag[o] + 2.0 * U32F * w.abs(),
        ),
        Err(e) => s.fail(name, format!("n={n} d={d} m={m}: {e}")),
    }
}

/// `Precision::Reproducible`: nearest-centroid results and segment sums bit-identical to the
/// CPU's (on the CPU itself: the distances equal to the exact-mode reference's, the sums
/// within the sequential-summation bound of float64).
fn reproducible<B: Backend>(s: &mut Suite<'_, B>) {
    let target = s.target.with_precision(hal::Precision::Reproducible);
    let cpu = s.cpu.with_precision(hal::Precision::Reproducible);
    // The last fixed case has segments times rows beyond 2^24 (GPU backends sort there).
    let mut cases: Vec<[usize; 3]> = vec![
        [1, 1, 1],
        [7, 3, 7],
        [300, 33, 65],
        [65537, 8, 33],
        [300001, 2, 61],
    ];
    while cases.len() < s.cfg.cases.min(6) + 5 {
        let r = s.rng();
        cases.push([1 + r.below(2000), 1 + r.below(70), 1 + r.below(80)]);
    }
    for [n, d, m] in cases {
        let kind = s.kind();
        let x = random_tensor(s.rng(), &[n, d], DType::F32, kind, |r| r.range(-1.0, 1.0));
        let c = random_tensor(s.rng(), &[m, d], DType::F32, ViewKind::Contiguous, |r| {
            r.range(-1.0, 1.0)
        });
        let r = s.rng();
        let seg: Vec<u32> = (0..n).map(|_| r.below(m) as u32).collect();
        let w: Vec<f32> = (0..n).map(|_| r.range(0.05, 1.0)).collect();
        let case = format!("n={n} d={d} m={m} {kind:?}");
        let nc_name = "nearest_centroid (Precision::Reproducible)";
        let seg_name = "segment_sum (Precision::Reproducible)";
        let reference =
            run_nc(&cpu, &x, &c).and_then(|r| Ok((r, run_seg(&cpu, &x, &seg, Some(&w), m)?)));
        let ((ci, cd), csum) = match reference {
            Ok(r) => r,
            Err(e) => {
                s.fail(nc_name, format!("{case}: cpu: {e}"));
                continue;
            }
        };
        if s.target_is_reference {
            // The CPU's exact mode already follows the reproducible order for nearest_centroid.
            match run_nc(s.cpu, &x, &c) {
                Ok((ei, ed)) => {
                    let same =
                        ei == ci && ed.iter().zip(&cd).all(|(a, b)| a.to_bits() == b.to_bits());
                    s.record(nc_name, &case, 0.0, if same { 0.0 } else { f64::INFINITY });
                }
                Err(e) => s.fail(nc_name, format!("{case}: {e}")),
            }
            let xs = x.logical();
            let (mut exact, mut mag, mut len) =
                (vec![0f64; m * d + m], vec![0f64; m * d + m], vec![0f64; m]);
            for i in 0..n {
                let (sg, wi) = (seg[i] as usize, w[i] as f64);
                for k in 0..d {
                    exact[sg * d + k] += wi * xs[i * d + k];
                    mag[sg * d + k] += (wi * xs[i * d + k]).abs();
                }
                exact[m * d + sg] += wi;
                mag[m * d + sg] += wi;
                len[sg] += 1.0;
            }
            let worst = (0..m * d + m)
                .map(|o| {
                    let count = if o < m * d {
                        len[o / d.max(1)]
                    } else {
                        len[o - m * d]
                    };
                    (csum[o] - exact[o]).abs() / ((count + 1.0) * 2f64.powi(-24) * mag[o] + 1e-30)
                })
                .fold(0.0, f64::max);
            s.record(seg_name, &case, 0.0, worst);
            continue;
        }
        match run_nc(&target, &x, &c) {
            Ok((ti, td)) => {
                let diff = (0..n).find(|&i| ti[i] != ci[i] || td[i].to_bits() != cd[i].to_bits());
                let detail = diff.map_or(String::new(), |i| {
                    format!(
                        " row {i}: {} at {} vs the CPU's {} at {}",
                        ti[i], td[i], ci[i], cd[i]
                    )
                });
                s.record(
                    nc_name,
                    &format!("{case}{detail}"),
                    0.0,
                    if diff.is_some() { f64::INFINITY } else { 0.0 },
                );
            }
            Err(e) => s.fail(nc_name, format!("{case}: target: {e}")),
        }
        match run_seg(&target, &x, &seg, Some(&w), m) {
            Ok(tsum) => {
                let diff = (0..tsum.len()).find(|&o| tsum[o].to_bits() != csum[o].to_bits());
                let detail = diff.map_or(String::new(), |o| {
                    format!(" element {o}: {} vs the CPU's {}", tsum[o], csum[o])
                });
                s.record(
                    seg_name,
                    &format!("{case}{detail}"),
                    0.0,
                    if diff.is_some() { f64::INFINITY } else { 0.0 },
                );
            }
            Err(e) => s.fail(seg_name, format!("{case}: target: {e}")),
        }
    }
}

// ---------------------------------------------------------------- optimisers and random

fn run_sgd<B: Backend>(b: &B, p: &[f32], g: &[f32], h: &SgdParams) -> Result<Vec<f64>> {
    let (pb, gb, mb) = (b.upload(p)?, b.upload(g)?, b.alloc(DType::F32, p.len())?);
    for step in 1..=2 {
        b.sgd_step(&pb, &gb, Some(&mb), &SgdParams { step, ..*h })?;
    }
    Ok(b.read::<f32>(&pb)?.into_iter().map(f64::from).collect())
}

fn run_adam<B: Backend>(b: &B, p: &[f32], g: &[f32], h: &AdamParams) -> Result<Vec<f64>> {
    let (pb, gb) = (b.upload(p)?, b.upload(g)?);
    let (mb, vb) = (b.alloc(DType::F32, p.len())?, b.alloc(DType::F32, p.len())?);
    for step in 1..=3 {
        b.adam_step(&pb, &gb, &mb, &vb, &AdamParams { step, ..*h })?;
    }
    Ok(b.read::<f32>(&pb)?.into_iter().map(f64::from).collect())
}

fn optimizers<B: Backend>(s: &mut Suite<'_, B>) {
    let sizes = [0usize, 1, 7, 257, 65537];
    for c in 0..s.cfg.cases + 4 {
        let n = sizes[c % 5];
        let r = s.rng();
        let p: Vec<f32> = (0..n).map(|_| r.range(-1.0, 1.0)).collect();
        let g: Vec<f32> = (0..n).map(|_| r.range(-1.0, 1.0)).collect();
        let h = SgdParams {
            lr: 0.1,
            momentum: [0.0, 0.9][c % 2],
            dampening: [0.0, 0.1][(c / 2) % 2],
            weight_decay: [0.0, 0.01][(c / 3) % 2],
            nesterov: c % 4 == 1,
            step: 1,
        };
        let exact: Vec<f64> = (0..n)
            .map(|i| {
                let (mut pi, gi0) = (p[i] as f64, g[i] as f64);
                let mut buf = 0f64;
                for step in 1..=2 {
                    let mut gi = gi0 + h.weight_decay as f64 * pi;
                    if h.momentum != 0.0 {
                        buf = if step == 1 {
                            gi
                        } else {
                            h.momentum as f64 * buf + (1.0 - h.dampening as f64) * gi
                        };
                        gi = if h.nesterov {
                            gi + h.momentum as f64 * buf
                        } else {
                            buf
                        };
                    }
                    pi -= h.lr as f64 * gi;
                }
                pi
            })
            .collect();
        match both!(s, run_sgd(&p, &g, &h)) {
            Ok((cv, t)) => s.judge(
                "sgd_step",
                &format!("n={n} {h:?}"),
                &cv,
                t.as_deref(),
                &exact,
                &|_, w| 16.0 * U32F * (w.abs() + 1.0),
            ),
            Err(e) => s.fail("sgd_step", format!("n={n}: {e}")),
        }
        let a = AdamParams {
            lr: 0.01,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: [0.0, 0.05][c % 2],
            decoupled_weight_decay: c % 3 == 0,
            step: 1,
        };
        let exact: Vec<f64> = (0..n)
            .map(|i| {
                let (mut pi, gi0) = (p[i] as f64, g[i] as f64);
                let (mut m, mut v) = (0f64, 0f64);
                for step in 1..=3 {
                    let mut gi = gi0;
                    if a.decoupled_weight_decay {
                        pi *= 1.0 - a.lr as f64 * a.weight_decay as f64;
                    } else {
                        gi += a.weight_decay as f64 * pi;
                    }
                    m = a.beta1 as f64 * m + (1.0 - a.beta1 as f64) * gi;
                    v = a.beta2 as f64 * v + (1.0 - a.beta2 as f64) * gi * gi;
                    let mh = m / (1.0 - (a.beta1 as f64).powi(step));
                    let vh = v / (1.0 - (a.beta2 as f64).powi(step));
                    pi -= a.lr as f64 * mh / (vh.sqrt() + a.eps as f64);
                }
                pi
            })
            .collect();
        // Adam's update has magnitude ~lr; allow a relative 2^-14 of it (its sqrt and division
        // in f32 amplify tiny v), plus rounding of the parameter.
        match both!(s, run_adam(&p, &g, &a)) {
            Ok((cv, t)) => s.judge(
                "adam_step",
                &format!("n={n} {a:?}"),
                &cv,
                t.as_deref(),
                &exact,
                &|_, w| 16.0 * U32F * w.abs() + 3.0 * a.lr as f64 * 2f64.powi(-14),
            ),
            Err(e) => s.fail("adam_step", format!("n={n}: {e}")),
        }
    }
}

fn run_random<B: Backend>(
    b: &B,
    out: &HostTensor,
    dist: Distribution,
    seed: u64,
    offset: u64,
) -> Result<Vec<f64>> {
    let ob = out.upload(b)?;
    b.random(View::new(&ob, &out.layout), dist, seed, offset)?;
    read_view(b, &ob, &out.layout)
}

fn random<B: Backend>(s: &mut Suite<'_, B>) {
    let shapes = s.shapes(0..=3, 1 << 18);
    for (i, shape) in shapes.iter().enumerate() {
        let normal = i % 2 == 1;
        let dist = if normal {
            Distribution::Normal {
                mean: 0.5,
                std: 2.0,
            }
        } else {
            Distribution::Uniform {
                low: -1.0,
                high: 3.0,
            }
        };
        let (seed, offset) = (s.rng().next_u64(), s.rng().next_u64() >> 1);
        let fdt = s.float_dtype();
        let out = output_tensor(s.rng(), shape, fdt);
        let exact: Vec<f64> = (0..numel(shape))
            .map(|p| {
                round_to(
                    out.dtype,
                    hal::random::random_value(dist, seed, offset + p as u64),
                ) as f64
            })
            .collect();
        let name = if normal {
            "random normal"
        } else {
            "random uniform"
        };
        let dout = out.dtype;
        match both!(s, run_random(&out, dist, seed, offset)) {
            Ok((c, t)) => {
                // Moments of large draws: the stream must also look like its distribution.
                if c.len() >= 65537 {
                    let mean = c.iter().sum::<f64>() / c.len() as f64;
                    let var = c.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / c.len() as f64;
                    let (em, ev) = if normal {
                        (0.5, 4.0)
                    } else {
                        (1.0, 16.0 / 12.0)
                    };
                    if (mean - em).abs() > 0.05 || (var / ev - 1.0).abs() > 0.05 {
                        s.fail(
                            name,
                            format!(
                                "{shape:?}: mean {mean} variance {var}, expected {em} and {ev}"
                            ),
                        );
                        continue;
                    }
                }
                // std = 2 in the normal case.
                let tol = move |_: usize, w: f64| {
                    if normal {
                        2f64.powi(-15) * 2.0 + rounding(dout, w, 2.0)
                    } else {
                        rounding(dout, w, 2.0)
                    }
                };
                s.judge(
                    name,
                    &format!("{shape:?} seed {seed} offset {offset}"),
                    &c,
                    t.as_deref(),
                    &exact,
                    &tol,
                )
            }
            Err(e) => s.fail(name, format!("{shape:?}: {e}")),
        }
    }
}

// ---------------------------------------------------------------- scalar programs

/// An edge-length residual with its gradient scattered by atomic adds: 40-odd instructions
/// touching loads by computed index, arithmetic, sqrt, division, select, casts and atomics.
fn edge_program() -> hal::ir::Program {
    let mut b = ProgramBuilder::new("edge_length_residual");
    let pts = b.buffer(DType::F32, Access::Read);
    let edges = b.buffer(DType::U32, Access::Read);
    let rest = b.buffer(DType::F32, Access::Read);
    let resid = b.buffer(DType::F32, Access::Write);
    let grad = b.buffer(DType::F32, Access::ReadWrite);
    let hits = b.buffer(DType::U32, Access::ReadWrite);
    let e = b.index();
    let two = b.const_u32(2);
    let three = b.const_u32(3);
    let one = b.const_u32(1);
    let e2 = b.mul(e, two);
    let e2p1 = b.add(e2, one);
    let (ia, ib) = (b.load(edges, e2), b.load(edges, e2p1));
    let (ba, bb) = (b.mul(ia, three), b.mul(ib, three));
    let mut diffs = Vec::new();
    for k in 0..3u32 {
        let kk = b.const_u32(k);
        let (pa, pb) = (b.add(ba, kk), b.add(bb, kk));
        let (va, vb) = (b.load(pts, pa), b.load(pts, pb));
        diffs.push((b.sub(va, vb), pa, pb));
    }
    let sq0 = b.mul(diffs[0].0, diffs[0].0);
    let sq1 = b.fma(diffs[1].0, diffs[1].0, sq0);
    let sq2 = b.fma(diffs[2].0, diffs[2].0, sq1);
    let len = b.unary(IrUnary::Sqrt, sq2);
    let r0 = b.load(rest, e);
    let r = b.sub(len, r0);
    b.store(resid, e, r);
    // d r / d a_k = diff_k / len (guarded: 0 for a degenerate edge)
    let tiny = b.const_f32(1e-12);
    let degenerate = b.cmp(IrCmp::Lt, len, tiny);
    let zero = b.const_f32(0.0);
    let inv = b.unary(IrUnary::Recip, len);
    let inv = b.select(degenerate, zero, inv);
    let rinv = b.mul(r, inv);
    for &(dk, pa, pb) in &diffs {
        let gk = b.mul(rinv, dk);
        let ngk = b.unary(IrUnary::Neg, gk);
        b.atomic_add(grad, pa, gk);
        b.atomic_add(grad, pb, ngk);
    }
    // Count edges per vertex through integer atomics, and mark long edges via a cast.
    b.atomic_add(hits, ia, one);
    b.atomic_add(hits, ib, one);
    b.build().expect("valid program")
}

fn run_edge<B: Backend>(b: &B, pts: &[f32], edges: &[u32], rest: &[f32]) -> Result<Vec<f64>> {
    let k = b.compile(&edge_program())?;
    let ne = rest.len();
    let (pb, eb, rb) = (b.upload(pts)?, b.upload(edges)?, b.upload(rest)?);
    let (res, grad, hits) = (
        b.alloc(DType::F32, ne)?,
        b.alloc(DType::F32, pts.len())?,
        b.alloc(DType::U32, pts.len() / 3)?,
    );
    b.launch(&k, &[&pb, &eb, &rb, &res, &grad, &hits], ne)?;
    let mut out: Vec<f64> = b.read::<f32>(&res)?.into_iter().map(f64::from).collect();
    out.extend(b.read::<f32>(&grad)?.into_iter().map(f64::from));
    out.extend(b.read::<u32>(&hits)?.into_iter().map(f64::from));
    Ok(out)
}

/// One instruction of every other kind: transcendental functions, integer arithmetic,
/// comparisons, selects and casts, on f16 input and bf16 output.
fn math_program() -> hal::ir::Program {
    let mut b = ProgramBuilder::new("ir_math");
    let x = b.buffer(DType::F16, Access::Read);
    let y = b.buffer(DType::BF16, Access::Write);
    let z = b.buffer(DType::I32, Access::Write);
    let i = b.index();
    let v = b.load(x, i);
    let mut acc = b.const_f32(0.0);
    let a = b.unary(IrUnary::Abs, v);
    let small = b.const_f32(0.1);
    let pos = b.binary(IrBinary::Max, a, small);
    for op in [
        IrUnary::Sqrt,
        IrUnary::Rsqrt,
        IrUnary::Recip,
        IrUnary::Log,
        IrUnary::Log2,
    ] {
        let t = b.unary(op, pos);
        acc = b.add(acc, t);
    }
    for op in [
        IrUnary::Exp,
        IrUnary::Exp2,
        IrUnary::Sin,
        IrUnary::Cos,
        IrUnary::Tan,
        IrUnary::Tanh,
        IrUnary::Floor,
        IrUnary::Ceil,
        IrUnary::Neg,
    ] {
        let t = b.unary(op, v);
        acc = b.add(acc, t);
    }
    let p = b.binary(IrBinary::Pow, pos, v);
    let at = b.binary(IrBinary::Atan2, v, pos);
    let rm = b.binary(IrBinary::Rem, v, pos);
    let mn = b.binary(IrBinary::Min, p, at);
    let dv = b.div(rm, pos);
    acc = b.add(acc, mn);
    acc = b.add(acc, dv);
    b.store(y, i, acc);
    // Integer path: ((i * 7) xor (i >> 1)) % 13 - 6, then select against a float comparison.
    let seven = b.const_u32(7);
    let one = b.const_u32(1);
    let thirteen = b.const_u32(13);
    let m7 = b.mul(i, seven);
    let sh = b.binary(IrBinary::Shr, i, one);
    let xo = b.binary(IrBinary::Xor, m7, sh);
    let md = b.binary(IrBinary::Rem, xo, thirteen);
    let si = b.cast(ScalarType::I32, md);
    let six = b.const_i32(6);
    let centered = b.sub(si, six);
    let neg = b.cmp(IrCmp::Lt, v, small);
    let notneg = b.unary(IrUnary::Not, neg);
    let absd = b.unary(IrUnary::Abs, centered);
    let fromf = b.cast(ScalarType::I32, acc);
    let chosen = b.select(notneg, absd, fromf);
    b.store(z, i, chosen);
    b.build().expect("valid program")
}

fn math_f64(v: f64, i: u32) -> (f64, f64) {
    let pos = v.abs().max(0.1f32 as f64);
    let mut acc = pos.sqrt() + 1.0 / pos.sqrt() + 1.0 / pos + pos.ln() + pos.log2();
    acc += v.exp() + v.exp2() + v.sin() + v.cos() + v.tan() + v.tanh() + v.floor() + v.ceil() - v;
    let p = pos.powf(v);
    let at = v.atan2(pos);
    let rm = v % pos;
    acc += p.min(at) + rm / pos;
    let md = ((i.wrapping_mul(7)) ^ (i >> 1)) % 13;
    let centered = md as i64 - 6;
    let z = if v >= 0.1f32 as f64 {
        centered.abs() as f64
    } else {
        (acc as f32) as i32 as f64
    };
    (acc, z)
}

fn run_math<B: Backend>(b: &B, x: &[f32]) -> Result<Vec<f64>> {
    let k = b.compile(&math_program())?;
    let xb = b.upload_bytes(DType::F16, &crate::host::bytes_of(DType::F16, x))?;
    let (yb, zb) = (
        b.alloc(DType::BF16, x.len())?,
        b.alloc(DType::I32, x.len())?,
    );
    b.launch(&k, &[&xb, &yb, &zb], x.len())?;
    let mut out: Vec<f64> = b.read_f32(&yb)?.into_iter().map(f64::from).collect();
    out.extend(b.read::<i32>(&zb)?.into_iter().map(f64::from));
    Ok(out)
}

/// `y[i] = 2 x[i]` where `x[i] > 0`, nothing elsewhere; and a store far out of range under a
/// condition that never holds, which must not fault.
fn masked_program() -> hal::ir::Program {
    let mut b = ProgramBuilder::new("ir_masked");
    let x = b.buffer(DType::F32, Access::Read);
    let y = b.buffer(DType::F32, Access::Write);
    let i = b.index();
    let v = b.load(x, i);
    let zero = b.const_f32(0.0);
    let positive = b.cmp(IrCmp::Gt, v, zero);
    let twice = b.add(v, v);
    b.store_if(positive, y, i, twice);
    let huge = b.const_f32(100.0);
    let never = b.cmp(IrCmp::Gt, v, huge);
    let far = b.const_u32(1 << 30);
    let out_of_range = b.add(i, far);
    b.store_if(never, y, out_of_range, v);
    b.build().expect("a valid program")
}

fn run_masked<B: Backend>(b: &B, x: &[f32]) -> Result<Vec<f64>> {
    let k = b.compile(&masked_program())?;
    let xb = b.upload(x)?;
    let yb = b.upload(&vec![-7.0f32; x.len()])?;
    b.launch(&k, &[&xb, &yb], x.len())?;
    Ok(b.read::<f32>(&yb)?.into_iter().map(f64::from).collect())
}

/// The IR programs the suite runs, for tools that check their lowering (`cargo xtask wgsl`).
pub fn sample_programs() -> Vec<hal::ir::Program> {
    vec![edge_program(), math_program(), masked_program()]
}

fn programs<B: Backend>(s: &mut Suite<'_, B>) {
    assert!(
        edge_program().insts.len() >= 20,
        "the IR parity program must have at least 20 instructions"
    );
    let sizes = [0usize, 1, 7, 257, 65537];
    for c in 0..s.cfg.cases + 4 {
        let (np, ne) = (sizes[(c + 1) % 5].max(2), sizes[c % 5]);
        let r = s.rng();
        let pts: Vec<f32> = (0..3 * np).map(|_| r.range(-1.0, 1.0)).collect();
        let edges: Vec<u32> = (0..2 * ne).map(|_| r.below(np) as u32).collect();
        let rest: Vec<f32> = (0..ne).map(|_| r.range(0.0, 0.5)).collect();
        let mut exact = vec![0f64; ne + 3 * np + np];
        let mut mag = vec![0f64; exact.len()];
        let mut terms = vec![1f64; exact.len()];
        for e in 0..ne {
            let (a, b) = (edges[2 * e] as usize, edges[2 * e + 1] as usize);
            let d: Vec<f64> = (0..3)
                .map(|k| pts[3 * a + k] as f64 - pts[3 * b + k] as f64)
                .collect();
            let len = (d[0] * d[0] + d[1] * d[1] + d[2] * d[2]).sqrt();
            let res = len - rest[e] as f64;
            exact[e] = res;
            mag[e] = len + rest[e] as f64;
            let inv = if len < 1e-12 { 0.0 } else { 1.0 / len };
            // f32 error of each gradient term: a few roundings of len and rest, amplified by
            // the cancellation in len - rest, times d_k / len.
            let cond = 4.0 * (len + rest[e] as f64) * inv;
            for k in 0..3 {
                let g = res * inv * d[k];
                exact[ne + 3 * a + k] += g;
                exact[ne + 3 * b + k] -= g;
                mag[ne + 3 * a + k] += g.abs() + cond * d[k].abs();
                mag[ne + 3 * b + k] += g.abs() + cond * d[k].abs();
                terms[ne + 3 * a + k] += 1.0;
                terms[ne + 3 * b + k] += 1.0;
            }
            exact[ne + 3 * np + a] += 1.0;
            exact[ne + 3 * np + b] += 1.0;
        }
        match both!(s, run_edge(&pts, &edges, &rest)) {
            // A degenerate edge (a == b) has len 0 in both; elsewhere f32 vs f64 rounding.
            Ok((cv, t)) => s.judge(
                "ir program (edge residual, atomics)",
                &format!("{np} points, {ne} edges"),
                &cv,
                t.as_deref(),
                &exact,
                &|i, w| 2.0 * U32F * terms[i] * mag[i] + 8.0 * U32F * w.abs(),
            ),
            Err(e) => s.fail(
                "ir program (edge residual, atomics)",
                format!("{np} points, {ne} edges: {e}"),
            ),
        }
        let n = sizes[c % 5];
        let r = s.rng();
        let x: Vec<f32> = (0..n)
            .map(|_| round_to(DType::F16, r.range(-3.0, 3.0)))
            .collect();
        let mut exact = vec![0f64; 2 * n];
        let mut tolv = vec![0f64; 2 * n];
        for (i, &v) in x.iter().enumerate() {
            let (y, z) = math_f64(v as f64, i as u32);
            exact[i] = round_to(DType::BF16, y as f32) as f64;
            tolv[i] = 2.0 * DType::BF16.unit_roundoff() * y.abs()
                + 1e-4 * (1.0 + (v as f64).exp() + (v as f64).tan().abs() + 4.0);
            exact[n + i] = z;
            // The float-to-int branch may land one off when the sum straddles an integer.
            tolv[n + i] = if v < 0.1 { 1.0 } else { 0.0 };
        }
        match both!(s, run_math(&x)) {
            Ok((cv, t)) => s.judge(
                "ir program (math, int, select, cast)",
                &format!("n={n}"),
                &cv,
                t.as_deref(),
                &exact,
                &|i, _| tolv[i],
            ),
            Err(e) => s.fail(
                "ir program (math, int, select, cast)",
                format!("n={n}: {e}"),
            ),
        }
        let x: Vec<f32> = (0..n).map(|_| s.rng().range(-1.0, 1.0)).collect();
        let exact: Vec<f64> = x
            .iter()
            .map(|&v| if v > 0.0 { 2.0 * v as f64 } else { -7.0 })
            .collect();
        match both!(s, run_masked(&x)) {
            Ok((cv, t)) => s.judge(
                "ir program (conditional store)",
                &format!("n={n}"),
                &cv,
                t.as_deref(),
                &exact,
                &|_, _| 0.0,
            ),
            Err(e) => s.fail("ir program (conditional store)", format!("n={n}: {e}")),
        }
    }
}
