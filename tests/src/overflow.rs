//! Hostile views: shapes, strides and offsets near the limits of `usize` and `isize`, given to
//! every primitive of a backend. A call may fail (it must, when the view's true extent does
//! not fit its buffer) but never crash, never succeed on a view whose true size wrapped, and
//! never write outside the views it was given: every buffer of the call and two neighbours
//! allocated around it are compared with their contents before the call.
//!
//! The true extent is computed here in `i128`, independently of `hal`'s checked arithmetic.

use hal::ir::{Access, ProgramBuilder};
use hal::{
    ArgReduceOp, Backend, BackendExt, BinaryOp, Conv2dGeometry, Csr, DType, DeviceBuffer,
    Distribution, Layout, ReduceOp, TernaryOp, UnaryOp, View,
};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

/// Elements of every buffer a call gets (and of its neighbours).
const LEN: usize = 16;
/// What every buffer holds before a call.
const SENTINEL: f32 = 7.25;

/// True when every element of `l` lies in `0..len`, computed in `i128` with nothing wrapped:
/// what `hal` must accept, and all it may accept.
pub fn truly_fits(l: &Layout, len: usize) -> bool {
    if l.shape.len() != l.strides.len() {
        return false;
    }
    // hal's rule: an empty view's arithmetic, with its zero dimensions counted as 1, fits
    // `isize` too (backends walk its other dimensions); strides are never isize::MIN.
    let limit = isize::MAX as i128;
    if l.strides.contains(&isize::MIN) {
        return false;
    }
    let numel = l
        .shape
        .iter()
        .try_fold(1u128, |acc, &d| acc.checked_mul(d.max(1) as u128));
    if numel.is_none_or(|n| n > isize::MAX as u128) {
        return false;
    }
    let (mut lo, mut hi) = (l.offset as i128, l.offset as i128);
    for (&d, &s) in l.shape.iter().zip(&l.strides) {
        let span = (d.max(1) as i128 - 1) * s as i128;
        if span < 0 {
            lo += span;
        } else {
            hi += span;
        }
        if lo < -limit - 1 || hi > limit {
            return false;
        }
    }
    if l.shape.contains(&0) {
        return true;
    }
    lo >= 0 && hi < len as i128
}

/// A size near a limit, or a small one.
fn size() -> impl Strategy<Value = usize> {
    prop_oneof![
        Just(0usize),
        Just(1),
        Just(2),
        Just(4),
        Just(usize::MAX),
        Just(usize::MAX / 2),
        Just(isize::MAX as usize + 1),
        Just((1usize << 62) + 1),
        Just(1usize << 32),
        Just((1usize << 32) + 3),
        Just(u32::MAX as usize),
        Just(1usize << 31),
        (0usize..64),
        any::<usize>(),
    ]
}

/// A stride near a limit, or a small one.
fn stride() -> impl Strategy<Value = isize> {
    prop_oneof![
        Just(0isize),
        Just(1),
        Just(-1),
        Just(4),
        Just(1024),
        Just(1isize << 40),
        Just(-(1isize << 40)),
        Just(1isize << 62),
        Just(isize::MAX),
        Just(isize::MIN),
        Just(isize::MIN + 1),
        Just(1isize << 32),
        (-64isize..64),
        any::<isize>(),
    ]
}

fn offset() -> impl Strategy<Value = usize> {
    prop_oneof![
        4 => 0usize..16,
        1 => Just(usize::MAX),
        1 => Just(isize::MAX as usize),
        1 => Just(isize::MAX as usize + 1),
        1 => Just(1usize << 62),
        1 => any::<usize>(),
    ]
}

/// A hostile layout of rank 1 to 4.
fn layout() -> impl Strategy<Value = Layout> {
    (1usize..=4)
        .prop_flat_map(|r| {
            (
                proptest::collection::vec(size(), r),
                proptest::collection::vec(stride(), r),
                offset(),
            )
        })
        .prop_map(|(shape, strides, offset)| Layout {
            shape,
            strides,
            offset,
        })
}

/// The outcome of one call: what went wrong, if anything.
type Outcome = Option<String>;

struct Harness<'a, B: Backend> {
    b: &'a B,
    /// Every buffer in play, in allocation order, each with its dtype.
    buffers: Vec<B::Buffer>,
}

impl<B: Backend> Harness<'_, B> {
    fn new(b: &B) -> Harness<'_, B> {
        Harness {
            b,
            buffers: Vec::new(),
        }
    }

    /// A new buffer of `LEN` elements of `dtype` filled with the sentinel (as f32) or small
    /// indices (as u32), between two neighbours filled the same way.
    fn buffer(&mut self, dtype: DType) -> hal::Result<B::Buffer> {
        let mut made = Vec::new();
        for _ in 0..3 {
            let buf = match dtype {
                DType::U32 => self.b.upload(&[0u32; LEN])?,
                DType::I32 => self.b.upload(&[0i32; LEN])?,
                _ => {
                    let buf = self.b.alloc(dtype, LEN)?;
                    let l = Layout::contiguous(&[LEN]);
                    self.b.fill(View::new(&buf, &l), SENTINEL as f64)?;
                    buf
                }
            };
            made.push(buf);
        }
        self.buffers.extend(made.iter().cloned());
        Ok(made.swap_remove(1))
    }

    fn snapshot(&self) -> hal::Result<Vec<Vec<u8>>> {
        self.b.synchronize()?;
        self.buffers.iter().map(|b| self.b.read_bytes(b)).collect()
    }
}

/// Runs `call` with the hostile view `l` (on a buffer of `LEN` elements); `writes` says
/// whether the hostile view is an output (then a successful call may change its buffer).
/// Returns a description of any broken promise.
fn judge<B: Backend>(
    h: &Harness<'_, B>,
    what: &str,
    l: &Layout,
    writes: &[&B::Buffer],
    call: impl FnOnce() -> hal::Result<()>,
) -> Outcome {
    judge_with(h, what, l, writes, false, call)
}

/// [`judge`], where `partial` allows a failed call to have written its output buffer (an IR
/// launch whose stores in range land before a fault is reported); neighbours never change.
fn judge_with<B: Backend>(
    h: &Harness<'_, B>,
    what: &str,
    l: &Layout,
    writes: &[&B::Buffer],
    partial: bool,
    call: impl FnOnce() -> hal::Result<()>,
) -> Outcome {
    let before = match h.snapshot() {
        Ok(s) => s,
        Err(e) => {
            return Some(format!(
                "{what}: reading buffers failed before the call: {e}"
            ));
        }
    };
    let result = call().and_then(|()| h.b.synchronize());
    let fits = truly_fits(l, LEN);
    if result.is_ok() && !fits {
        return Some(format!(
            "{what}: accepted {l:?}, whose true extent does not fit {LEN} elements"
        ));
    }
    let after = match h.snapshot() {
        Ok(s) => s,
        Err(e) => {
            return Some(format!(
                "{what}: reading buffers failed after the call: {e}"
            ));
        }
    };
    for (i, (a, b)) in before.iter().zip(&after).enumerate() {
        let allowed =
            (result.is_ok() || partial) && writes.iter().any(|w| w.same_memory(&h.buffers[i]));
        if a != b && !allowed {
            return Some(format!(
                "{what} with {l:?}: buffer {i} changed although the call {}",
                match &result {
                    Ok(()) => "did not write it".to_string(),
                    Err(e) => format!("failed ({e})"),
                }
            ));
        }
    }
    None
}

/// Every primitive with the hostile layout `l` in one operand position; returns the broken
/// promises. A view that truly fits but spans more than 2^20 elements (a broadcast of a few
/// elements to a huge shape) is skipped: a call on it is valid and does work in proportion.
fn primitives<B: Backend>(b: &B, l: &Layout) -> hal::Result<Vec<String>> {
    if truly_fits(l, LEN) && hal::numel(&l.shape) > 1 << 20 {
        return Ok(Vec::new());
    }
    let mut h = Harness::new(b);
    let f = DType::F32;
    let ops = Operands {
        x: h.buffer(f)?,
        y: h.buffer(f)?,
        out: h.buffer(f)?,
        idx: h.buffer(DType::U32)?,
        idx_f: h.buffer(f)?,
    };
    let mut failures = elementwise_calls(b, &h, l, &ops);
    failures.extend(axis_calls(b, &h, l, &ops));
    failures.extend(product_calls(b, &h, l, &ops));
    failures.extend(other_calls(b, &h, l, &ops));
    Ok(failures)
}

/// The buffers every call of [`primitives`] draws its operands from.
struct Operands<B: Backend> {
    x: B::Buffer,
    y: B::Buffer,
    out: B::Buffer,
    idx: B::Buffer,
    idx_f: B::Buffer,
}

/// The elementwise calls with `l` in each operand position.
fn elementwise_calls<B: Backend>(
    b: &B,
    h: &Harness<'_, B>,
    l: &Layout,
    o: &Operands<B>,
) -> Vec<String> {
    let Operands { x, y, out, .. } = o;
    let (one, benign) = (Layout::contiguous(&[1]), Layout::contiguous(&[2, 2]));
    let mut failures = Vec::new();
    let mut check = |o: Outcome| failures.extend(o);

    check(judge(h, "fill", l, &[out], || {
        b.fill(View::new(out, l), 1.0)
    }));
    check(judge(h, "copy (source)", l, &[out], || {
        b.copy(View::new(x, l), View::new(out, &benign))
    }));
    check(judge(h, "copy (output)", l, &[out], || {
        b.copy(
            View::new(x, &Layout::contiguous(&l.shape)),
            View::new(out, l),
        )
    }));
    check(judge(h, "unary (input)", l, &[out], || {
        b.unary(UnaryOp::Exp, View::new(x, l), View::new(out, &benign))
    }));
    check(judge(h, "unary (output)", l, &[out], || {
        b.unary(UnaryOp::Exp, View::new(x, &one), View::new(out, l))
    }));
    check(judge(h, "binary", l, &[out], || {
        b.binary(
            BinaryOp::Add,
            View::new(x, &one),
            View::new(y, l),
            View::new(out, l),
        )
    }));
    check(judge(h, "ternary", l, &[out], || {
        b.ternary(
            TernaryOp::Fma,
            View::new(x, l),
            View::new(y, &one),
            View::new(x, &one),
            View::new(out, l),
        )
    }));
    failures
}

/// The calls along each axis of `l`: reductions, arg-reductions, gather and scatter.
fn axis_calls<B: Backend>(b: &B, h: &Harness<'_, B>, l: &Layout, o: &Operands<B>) -> Vec<String> {
    let Operands { x, out, idx, .. } = o;
    let mut failures = Vec::new();
    let mut check = |o: Outcome| failures.extend(o);
    for axis in 0..l.rank() {
        let mut kept = l.shape.clone();
        kept[axis] = 1;
        let kept = Layout::contiguous(&kept);
        for op in [ReduceOp::Sum, ReduceOp::Max] {
            check(judge(h, &format!("reduce {op:?}"), l, &[out], || {
                b.reduce(op, View::new(x, l), &[axis], View::new(out, &kept))
            }));
        }
        check(judge(h, "arg_reduce", l, &[idx], || {
            b.arg_reduce(
                ArgReduceOp::ArgMax,
                View::new(x, l),
                axis,
                View::new(idx, &kept),
            )
        }));
        check(judge(h, "gather (data)", l, &[out], || {
            let index = Layout::contiguous(&vec![1; l.rank()]);
            b.gather(
                View::new(x, l),
                axis,
                View::new(idx, &index),
                View::new(out, &index),
            )
        }));
        check(judge(h, "scatter_add (output)", l, &[out], || {
            let index = Layout::contiguous(&vec![1; l.rank()]);
            b.scatter_add(
                View::new(x, &index),
                axis,
                View::new(idx, &index),
                View::new(out, l),
            )
        }));
    }
    failures
}

/// Products with `l` as an operand or output (of rank 2 or 3), the search and the segment sum over it, and a bias.
fn product_calls<B: Backend>(
    b: &B,
    h: &Harness<'_, B>,
    l: &Layout,
    o: &Operands<B>,
) -> Vec<String> {
    let Operands {
        x,
        y,
        out,
        idx,
        idx_f,
    } = o;
    let one = Layout::contiguous(&[1]);
    let mut failures = Vec::new();
    let mut check = |o: Outcome| failures.extend(o);
    if (2..=3).contains(&l.rank()) {
        let r = l.rank();
        let (m, k) = (l.shape[r - 2], l.shape[r - 1]);
        let mut bshape = l.shape.clone();
        bshape[r - 2] = k;
        bshape[r - 1] = 1;
        let mut oshape = l.shape.clone();
        oshape[r - 1] = 1;
        let _ = m;
        check(judge(h, "matmul (a)", l, &[out], || {
            b.matmul(
                View::new(x, l),
                View::new(y, &Layout::contiguous(&bshape)),
                View::new(out, &Layout::contiguous(&oshape)),
                1.0,
                0.0,
            )
        }));
        check(judge(h, "matmul (out)", l, &[out], || {
            let mut ashape = l.shape.clone();
            ashape[r - 1] = 1;
            let mut bs = l.shape.clone();
            bs[r - 2] = 1;
            b.matmul(
                View::new(x, &Layout::contiguous(&ashape)),
                View::new(y, &Layout::contiguous(&bs)),
                View::new(out, l),
                1.0,
                0.0,
            )
        }));
        if r == 2 {
            let rows = Layout::contiguous(&[l.shape[0]]);
            check(judge(
                h,
                "nearest_centroid (points)",
                l,
                &[idx, out],
                || {
                    b.nearest_centroid(
                        View::new(x, l),
                        View::new(y, &Layout::contiguous(&[1, l.shape[1]])),
                        View::new(idx, &rows),
                        View::new(out, &rows),
                    )
                },
            ));
            check(judge(h, "segment_sum (x)", l, &[y, out], || {
                b.segment_sum(
                    View::new(x, l),
                    View::new(idx, &rows),
                    None,
                    View::new(y, &Layout::contiguous(&[1, l.shape[1]])),
                    View::new(out, &one),
                )
            }));
        }
    }
    check(judge(h, "matmul_epilogue (bias)", l, &[out], || {
        let ab = Layout::contiguous(&[2, 2]);
        let epilogue = hal::Epilogue {
            bias: Some(View::new(y, l)),
            activation: Some(UnaryOp::Relu),
            a_gate: None,
            a_row_sums: None,
        };
        b.matmul_epilogue(
            View::new(x, &ab),
            View::new(idx_f, &ab),
            View::new(out, &ab),
            1.0,
            0.0,
            epilogue,
        )
    }));
    failures
}

/// k-means++, random, the image copies and the sparse product.
fn other_calls<B: Backend>(b: &B, h: &Harness<'_, B>, l: &Layout, o: &Operands<B>) -> Vec<String> {
    let Operands { x, y, out, idx, .. } = o;
    let mut failures = Vec::new();
    let mut check = |o: Outcome| failures.extend(o);
    if l.rank() == 2 {
        check(judge(h, "kmeans_pp (x)", l, &[out], || {
            let anchors = Layout::contiguous(&[1, l.shape[1]]);
            b.kmeans_pp(View::new(x, l), View::new(out, &anchors), 3)
        }));
    }
    check(judge(h, "random", l, &[out], || {
        b.random(
            View::new(out, l),
            Distribution::Uniform {
                low: 0.0,
                high: 1.0,
            },
            1,
            0,
        )
    }));
    let geometry = Conv2dGeometry {
        batch: l.shape[0],
        channels: *l.shape.get(1).unwrap_or(&1),
        height: *l.shape.get(2).unwrap_or(&1),
        width: *l.shape.get(3).unwrap_or(&1),
        kernel: (1, 1),
        stride: (1, 1),
        padding: (l.offset % 3, l.offset % 5),
        dilation: (1, 1),
    };
    let image = Layout::contiguous(&geometry.image_shape());
    if let Some(cols) = geometry.cols_shape() {
        let cols = Layout::contiguous(&cols);
        check(judge(h, "im2col", &image, &[out], || {
            b.im2col(View::new(x, &image), &geometry, View::new(out, &cols))
        }));
        check(judge(h, "col2im", &cols, &[out], || {
            b.col2im(View::new(x, &cols), &geometry, View::new(out, &image))
        }));
    }
    check(judge(h, "spmv_csr", l, &[out], || {
        let a = Csr {
            rows: l.shape[0],
            cols: LEN,
            row_offsets: idx,
            col_indices: idx,
            values: y,
        };
        b.spmv_csr(a, x, out, 1.0, 0.0)
    }));
    failures
}

/// A launch of `n` indices of a kernel that stores its index into a `LEN`-element buffer:
/// indices past the buffer are faults (an error), never writes elsewhere.
fn launch<B: Backend>(b: &B, n: usize) -> hal::Result<Outcome> {
    let mut h = Harness::new(b);
    let out = h.buffer(DType::F32)?;
    let mut p = ProgramBuilder::new("hostile_store");
    let o = p.buffer(DType::F32, Access::Write);
    let i = p.index();
    let v = p.const_f32(1.0);
    p.store(o, i, v);
    let kernel = b.compile(&p.build()?)?;
    let l = Layout::contiguous(&[n]);
    Ok(judge_with(&h, "launch", &l, &[&out], true, || {
        b.launch(&kernel, &[&out], n)
    }))
}

/// Runs `cases` hostile layouts drawn from `seed` through every primitive of `b` (and launches
/// of hostile sizes); returns the broken promises, at most 20.
pub fn hostile_views<B: Backend>(b: &B, cases: usize, seed: u64) -> hal::Result<Vec<String>> {
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(&seed.to_le_bytes());
    let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &bytes);
    let mut runner = TestRunner::new_with_rng(Config::default(), rng);
    let mut failures = Vec::new();
    let fixed = [
        // The reproducers: a wrapped element count, a wrapped address range.
        Layout {
            shape: vec![(1 << 62) + 1, 4],
            strides: vec![4, 1],
            offset: 0,
        },
        Layout {
            shape: vec![4, (1 << 62) + 1],
            strides: vec![1, 1024],
            offset: 0,
        },
        Layout {
            shape: vec![4, (1 << 62) + 1],
            strides: vec![1, 1 << 40],
            offset: 0,
        },
        Layout {
            shape: vec![1 << 32, 1 << 32],
            strides: vec![1 << 32, 1],
            offset: 0,
        },
        Layout {
            shape: vec![2],
            strides: vec![isize::MIN],
            offset: usize::MAX,
        },
    ];
    for l in fixed {
        failures.extend(primitives(b, &l)?);
    }
    for _ in 0..cases {
        let l = layout()
            .new_tree(&mut runner)
            .expect("strategy draws")
            .current();
        failures.extend(primitives(b, &l)?);
        if failures.len() >= 20 {
            break;
        }
    }
    for n in [LEN + 1, 1 << 20, u32::MAX as usize + 2, usize::MAX] {
        failures.extend(launch(b, n)?);
    }
    failures.truncate(20);
    Ok(failures)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_true_extent_is_not_fooled_by_wrapping() {
        let wrapped = Layout {
            shape: vec![(1 << 62) + 1, 4],
            strides: vec![4, 1],
            offset: 0,
        };
        assert!(!truly_fits(&wrapped, 16));
        assert!(truly_fits(&Layout::contiguous(&[4, 4]), 16));
        assert!(!truly_fits(&Layout::contiguous(&[4, 5]), 16));
        let empty = Layout {
            shape: vec![usize::MAX, 0],
            strides: vec![isize::MAX, 1],
            offset: usize::MAX,
        };
        assert!(!truly_fits(&empty, 16), "its other dimensions overflow");
        let empty = Layout {
            shape: vec![3, 0],
            strides: vec![1 << 40, 1],
            offset: 5,
        };
        assert!(truly_fits(&empty, 16));
    }
}
