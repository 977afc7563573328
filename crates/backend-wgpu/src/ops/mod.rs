//! The primitives, one module per family (the names of `shaders/` and `hal`).

pub(crate) mod attention;
pub(crate) mod cluster;
pub(crate) mod conv;
pub(crate) mod elementwise;
pub(crate) mod index;
pub(crate) mod matmul;
pub(crate) mod norm;
pub(crate) mod optim;
pub(crate) mod random;
pub(crate) mod reduce;
pub(crate) mod segment;
pub(crate) mod topk;

use hal::Layout;

/// The most elements one thread scans or multiplies in one pass.
pub(crate) const CHUNK: usize = 2048;

/// Iterations one invocation's loops may run in the reproducible kernels. lavapipe stops a
/// loop after 65535 of its own counts, and a body with branches costs several counts per
/// iteration (the weighted segment sum lost rows past about 13,000); 8192 was measured safe.
pub(crate) const LOOP_BUDGET: usize = 8_192;

/// True when every layout is contiguous over `shape` (so element `t` of each is `offset + t`).
pub(crate) fn all_contiguous(shape: &[usize], layouts: &[&Layout]) -> bool {
    layouts
        .iter()
        .all(|l| l.shape == shape && l.is_contiguous())
}

/// The pattern of a broadcast operand that `binary_rows_vec4.wgsl` reads: leading dimensions
/// of stride 0, then dimensions laid out row-major among themselves (`outer` elements), then
/// trailing dimensions of stride 0 (`inner` elements each value covers). `None` for any other
/// layout, or sizes past `u32`.
pub(crate) fn broadcast_rows(l: &Layout) -> Option<(usize, usize)> {
    let dims: Vec<(usize, isize)> = l
        .shape
        .iter()
        .zip(&l.strides)
        .filter(|&(&d, _)| d != 1)
        .map(|(&d, &s)| (d, s))
        .collect();
    let trailing = dims.iter().rev().take_while(|&&(_, s)| s == 0).count();
    let inner: usize = dims[dims.len() - trailing..]
        .iter()
        .map(|&(d, _)| d)
        .product();
    let (mut outer, mut expected) = (1usize, 1isize);
    let mut rest = dims[..dims.len() - trailing].iter().rev();
    for &(d, s) in rest.by_ref() {
        if s == 0 {
            break;
        }
        if s != expected {
            return None;
        }
        outer *= d;
        expected *= d as isize;
    }
    let leading_broadcast = rest.all(|&(_, s)| s == 0);
    let fits = l.offset + outer <= u32::MAX as usize && inner <= u32::MAX as usize;
    (leading_broadcast && fits).then_some((inner, outer))
}
