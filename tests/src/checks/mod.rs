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
        // Saturating: four dimensions of 65537 overflow a usize, and such a draw is refused.
        let size = |s: &Vec<usize>| s.iter().fold(1usize, |a, &d| a.saturating_mul(d.max(1)));
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
pub(crate) const EXPECTED_ROWS: [&str; 49] = [
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
    "attention",
    "attention_backward",
    "attention (16-bit)",
    "attention_backward (16-bit)",
    "layer_norm",
    "layer_norm_backward",
    "top_k",
    "ivf_scan",
    "candidate_scores",
];

/// The checks of the primitives a `Precision::Fast` or `Precision::Compensated` handle runs
/// differently.
pub(crate) fn run_matrix_unit_policy<B: Backend>(s: &mut Suite<'_, B>) {
    matmul(s);
    matmul_beyond_f16(s);
    if s.policy == hal::Precision::Fast {
        attention(s);
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
    attention(s);
    layer_norm(s);
    top_k(s);
    ivf_scan(s);
    candidate_scores(s);
    wide::all(s);
}

/// The f64 rows every backend produces (compared, or refused where it has no f64 form).
pub(crate) const F64_ROWS: [&str; 16] = wide::ROWS;

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

mod attention;
mod cluster;
mod conv;
mod elementwise;
mod index;
mod matmul;
mod norm;
mod optim;
mod program;
mod random;
mod reduce;
mod segment;
mod topk;
mod wide;

use attention::*;
use cluster::*;
use conv::*;
use elementwise::*;
use index::*;
use matmul::*;
use norm::*;
use optim::*;
pub use program::sample_programs;
use program::*;
use random::*;
use reduce::*;
use segment::*;
use topk::*;
