//! fill, copy (strided copy and cast), unary, binary and ternary ops.
//!
//! Every kernel walks the output's shape with [`Walk`]; an all-`f32`, unit-stride run takes a
//! fast path whose loop the compiler vectorises, everything else loads and stores through the
//! dtype-converting [`Src`]/[`Dst`]. Where any operand is `f64` the op is computed in `f64`
//! (`apply_f64`), and rounded once into a narrower output.

use crate::math::{exp_f32, gelu_f32, with_avx2};
use crate::storage::{Dst, Src};
use crate::walk::Walk;
use hal::{BinaryOp, DType, Layout, TernaryOp, UnaryOp};

pub(crate) fn fill(out: Dst, layout: &Layout, value: f64) {
    let walk = Walk::new(&layout.shape, [layout]);
    // The element bits once (integers straight from f64, so large ones are not rounded).
    let bits = out.dtype.fill_bits(value);
    let (base, size) = (out.ptr as usize, out.dtype.size_in_bytes());
    // SAFETY: validate::fill proved `layout` inside the buffer (checked arithmetic), so every
    // offset the walk yields is in bounds; the view reaches each element once
    // (check_no_self_overlap), so the threads' runs are disjoint.
    walk.par_runs(|_, [o], [so], len| unsafe {
        if size == 8 {
            let d = base as *mut u64;
            for j in 0..len as isize {
                *d.offset(o + j * so) = bits;
            }
        } else if size == 4 {
            let d = base as *mut u32;
            for j in 0..len as isize {
                *d.offset(o + j * so) = bits as u32;
            }
        } else {
            let d = base as *mut u16;
            for j in 0..len as isize {
                *d.offset(o + j * so) = bits as u16;
            }
        }
    });
}

pub(crate) fn copy(src: Src, sl: &Layout, out: Dst, ol: &Layout) {
    let walk = Walk::new(&ol.shape, [ol, sl]);
    let same = src.dtype == out.dtype;
    // SAFETY: validate::copy proved both views inside their buffers and the output free of
    // self-overlap and of overlap with the source (unless identical): in-bounds, disjoint runs.
    walk.par_runs(|_, [o, s], [so, ss], len| unsafe {
        let n = len as isize;
        if same {
            // Bit-exact for every dtype, integers included.
            match out.dtype.size_in_bytes() {
                8 => {
                    let (d, s0) = (out.ptr as *mut u64, src.ptr as *const u64);
                    for j in 0..n {
                        *d.offset(o + j * so) = *s0.offset(s + j * ss);
                    }
                }
                4 => {
                    let (d, s0) = (out.ptr as *mut u32, src.ptr as *const u32);
                    for j in 0..n {
                        *d.offset(o + j * so) = *s0.offset(s + j * ss);
                    }
                }
                _ => {
                    let (d, s0) = (out.ptr as *mut u16, src.ptr as *const u16);
                    for j in 0..n {
                        *d.offset(o + j * so) = *s0.offset(s + j * ss);
                    }
                }
            }
        } else if !src.dtype.is_float() && !out.dtype.is_float() {
            for j in 0..n {
                let v = src.load_index(s + j * ss);
                match out.dtype {
                    DType::I32 => {
                        *(out.ptr as *mut i32).offset(o + j * so) =
                            v.clamp(i32::MIN as i64, i32::MAX as i64) as i32
                    }
                    _ => {
                        *(out.ptr as *mut u32).offset(o + j * so) =
                            v.clamp(0, u32::MAX as i64) as u32
                    }
                }
            }
        } else if src.dtype == DType::F64 || out.dtype == DType::F64 {
            // Through f64: exact from every dtype, rounded once into a narrower one.
            for j in 0..n {
                out.store_f64(o + j * so, src.load_f64(s + j * ss));
            }
        } else {
            for j in 0..n {
                out.store(o + j * so, src.load(s + j * ss));
            }
        }
    });
}

/// Whether any of `dtypes` makes an elementwise op compute in `f64`.
fn wide(dtypes: &[DType]) -> bool {
    dtypes.contains(&DType::F64)
}

/// Runs `f` elementwise in `f64`.
fn map1_wide(x: Src, xl: &Layout, out: Dst, ol: &Layout, f: impl Fn(f64) -> f64 + Sync) {
    let walk = Walk::new(&ol.shape, [ol, xl]);
    // SAFETY: as for `map1`.
    walk.par_runs(|_, [o, a], [so, sa], len| unsafe {
        for j in 0..len as isize {
            out.store_f64(o + j * so, f(x.load_f64(a + j * sa)));
        }
    });
}

/// Runs `f` elementwise; `fast` is the same function on plain `f32`s for the vectorised path.
#[inline(always)]
fn map1(x: Src, xl: &Layout, out: Dst, ol: &Layout, f: impl Fn(f32) -> f32 + Sync) {
    let walk = Walk::new(&ol.shape, [ol, xl]);
    let all_f32 = x.dtype == DType::F32 && out.dtype == DType::F32;
    // SAFETY: validate::unary proved the output inside its buffer and free of overlap, and the
    // input's broadcast layout inside its own; each run's offsets stay in those ranges.
    walk.par_runs(|_, [o, a], [so, sa], len| unsafe {
        if all_f32 && so == 1 && sa == 1 {
            let (d, s) = (
                (out.ptr as *mut f32).offset(o),
                (x.ptr as *const f32).offset(a),
            );
            // AVX2 where the CPU has it: the functions of `math` vectorise. (`move`: the
            // pointers as values, not loaded again from the closure after every store.)
            let f = &f;
            with_avx2(move || {
                for j in 0..len {
                    *d.add(j) = f(*s.add(j));
                }
            });
        } else {
            for j in 0..len as isize {
                out.store(o + j * so, f(x.load(a + j * sa)));
            }
        }
    });
}

pub(crate) fn unary(op: UnaryOp, x: Src, xl: &Layout, out: Dst, ol: &Layout) {
    if wide(&[x.dtype, out.dtype]) {
        return map1_wide(x, xl, out, ol, |v| op.apply_f64(v));
    }
    macro_rules! go {
        ($($pat:pat => $f:expr),* $(,)?) => {
            match op {
                $($pat => map1(x, xl, out, ol, $f),)*
                _ => map1(x, xl, out, ol, |v| op.apply(v)),
            }
        };
    }
    go! {
        UnaryOp::Neg => |v: f32| -v,
        UnaryOp::Abs => |v: f32| v.abs(),
        UnaryOp::Relu => |v: f32| if v < 0.0 { 0.0 } else { v },
        UnaryOp::Square => |v: f32| v * v,
        UnaryOp::Exp => exp_f32,
        UnaryOp::Gelu => gelu_f32,
        UnaryOp::Sigmoid => |v: f32| 1.0 / (1.0 + exp_f32(-v)),
        UnaryOp::Silu => |v: f32| v / (1.0 + exp_f32(-v)),
    }
}

#[inline(always)]
fn map2(
    a: Src,
    al: &Layout,
    b: Src,
    bl: &Layout,
    out: Dst,
    ol: &Layout,
    f: impl Fn(f32, f32) -> f32 + Sync,
) {
    let walk = Walk::new(&ol.shape, [ol, al, bl]);
    let all_f32 = a.dtype == DType::F32 && b.dtype == DType::F32 && out.dtype == DType::F32;
    // SAFETY: validate::binary proved every view inside its buffer (the inputs broadcast to the
    // output's shape), the output free of overlap: in-bounds offsets, disjoint writes.
    walk.par_runs(|_, [o, x, y], [so, sx, sy], len| unsafe {
        if all_f32 && so == 1 && sx == 1 && (sy == 1 || sy == 0) {
            let d = (out.ptr as *mut f32).offset(o);
            let p = (a.ptr as *const f32).offset(x);
            let q = (b.ptr as *const f32).offset(y);
            if sy == 1 {
                for j in 0..len {
                    *d.add(j) = f(*p.add(j), *q.add(j));
                }
            } else {
                let c = *q;
                for j in 0..len {
                    *d.add(j) = f(*p.add(j), c);
                }
            }
        } else {
            for j in 0..len as isize {
                out.store(o + j * so, f(a.load(x + j * sx), b.load(y + j * sy)));
            }
        }
    });
}

pub(crate) fn binary(
    op: BinaryOp,
    a: Src,
    al: &Layout,
    b: Src,
    bl: &Layout,
    out: Dst,
    ol: &Layout,
) {
    if wide(&[a.dtype, b.dtype, out.dtype]) {
        let walk = Walk::new(&ol.shape, [ol, al, bl]);
        // SAFETY: as for `map2`.
        walk.par_runs(|_, [o, x, y], [so, sx, sy], len| unsafe {
            for j in 0..len as isize {
                let v = op.apply_f64(a.load_f64(x + j * sx), b.load_f64(y + j * sy));
                out.store_f64(o + j * so, v);
            }
        });
        return;
    }
    match op {
        BinaryOp::Add => map2(a, al, b, bl, out, ol, |x, y| x + y),
        BinaryOp::Sub => map2(a, al, b, bl, out, ol, |x, y| x - y),
        BinaryOp::Mul => map2(a, al, b, bl, out, ol, |x, y| x * y),
        BinaryOp::Div => map2(a, al, b, bl, out, ol, |x, y| x / y),
        _ => map2(a, al, b, bl, out, ol, |x, y| op.apply(x, y)),
    }
}

pub(crate) fn ternary(
    op: TernaryOp,
    a: Src,
    al: &Layout,
    b: Src,
    bl: &Layout,
    c: Src,
    cl: &Layout,
    out: Dst,
    ol: &Layout,
) {
    let walk = Walk::new(&ol.shape, [ol, al, bl, cl]);
    let wide = wide(&[a.dtype, b.dtype, c.dtype, out.dtype]);
    // SAFETY: validate::ternary, as for binary: every offset in bounds, disjoint writes.
    walk.par_runs(|_, [o, x, y, z], [so, sx, sy, sz], len| unsafe {
        if wide {
            for j in 0..len as isize {
                let (p, q, r) = (
                    a.load_f64(x + j * sx),
                    b.load_f64(y + j * sy),
                    c.load_f64(z + j * sz),
                );
                out.store_f64(o + j * so, op.apply_f64(p, q, r));
            }
            return;
        }
        for j in 0..len as isize {
            let v = op.apply(a.load(x + j * sx), b.load(y + j * sy), c.load(z + j * sz));
            out.store(o + j * so, v);
        }
    });
}
