//! The interpreter's arithmetic: each instruction's operation over a block's lanes, in the
//! 32-bit register file (`unary`, `binary`, `compare`, `cast`) and the 64-bit one (`*64`,
//! through raw pointers since a destination may share an operand's slot), written as plain
//! loops over fixed-size lanes so they vectorise.

use super::{Files, LANES, Reg, Wide, b, f};
use crate::math::exp_f32;
use hal::ir::{IrBinary, IrCmp, IrUnary, ScalarType};

/// `Inst::Cast` from slot `src` (of type `from`) into slot `dst` (of type `to`), across the
/// two register files.
#[inline(always)]
pub(super) fn cast_lanes(
    files: Files<'_>,
    from: ScalarType,
    to: ScalarType,
    src: usize,
    dst: usize,
) {
    let Files { regs, wide } = files;
    match (from == ScalarType::F64, to == ScalarType::F64) {
        (true, true) => wide[dst] = wide[src],
        (true, false) => {
            let xs = wide[src];
            let out = &mut regs[dst];
            (0..LANES).for_each(|l| out[l] = cast_from64(to, xs[l]));
        }
        (false, true) => {
            let xs = regs[src];
            let out = &mut wide[dst];
            (0..LANES).for_each(|l| out[l] = cast_to64(from, xs[l]));
        }
        (false, false) => {
            let xs = regs[src];
            let out = &mut regs[dst];
            (0..LANES).for_each(|l| out[l] = cast(from, to, xs[l]));
        }
    }
}

/// An `f64` (as bits) converted to a 32-bit type: truncation toward zero, saturating, NaN 0.
fn cast_from64(to: ScalarType, x: u64) -> u32 {
    let v = f64::from_bits(x);
    match to {
        ScalarType::F32 => b(v as f32),
        ScalarType::I32 => v as i32 as u32,
        ScalarType::U32 => v as u32,
        ScalarType::Bool => (v != 0.0) as u32,
        ScalarType::F64 => unreachable!("a 32-bit target"),
    }
}

/// A 32-bit value of type `from` as `f64` bits (exact).
fn cast_to64(from: ScalarType, x: u32) -> u64 {
    let v = match from {
        ScalarType::F32 => f(x) as f64,
        ScalarType::I32 => x as i32 as f64,
        ScalarType::U32 | ScalarType::Bool => x as f64,
        ScalarType::F64 => unreachable!("a 32-bit source"),
    };
    v.to_bits()
}

/// `wide[dst][l] = g(l, wide[a][l], wide[b][l])` (as `f64` bits) for every lane, in place:
/// `dst` may be `a` or `b` (slots are reused by the instruction that frees them), so the lanes
/// go through raw pointers, each read before it is written; no operand is copied.
#[inline(always)]
pub(super) fn lanes64(
    wide: &mut [Wide],
    dst: usize,
    a: usize,
    b: usize,
    g: impl Fn(usize, u64, u64) -> u64,
) {
    assert!(
        dst < wide.len() && a < wide.len() && b < wide.len(),
        "slots in the file"
    );
    let base = wide.as_mut_ptr() as *mut u64;
    // SAFETY: the three slots are in bounds (asserted) and `Wide` is `[u64; LANES]`, so lane
    // `l` of slot `s` is element `s * LANES + l`; no references are formed, so the
    // destination may alias an operand.
    unsafe {
        let (pa, pb, pd) = (
            base.add(a * LANES),
            base.add(b * LANES),
            base.add(dst * LANES),
        );
        for l in 0..LANES {
            *pd.add(l) = g(l, *pa.add(l), *pb.add(l));
        }
    }
}

/// `wide[d] = wide[a] * wide[b] + wide[c]` lane by lane, fused (`[a, b, c, d]` slots of the
/// file; `d` may be an operand's).
#[inline(always)]
pub(super) fn fma64(wide: &mut [Wide], slots: [usize; 4]) {
    assert!(slots.iter().all(|&s| s < wide.len()), "slots in the file");
    let base = wide.as_mut_ptr() as *mut u64;
    // SAFETY: every slot is in the file (asserted) and `Wide` is `[u64; LANES]`; raw reads
    // and writes, no references, so the destination may be an operand's slot (lane `l` of
    // every operand is read before lane `l` is written).
    let g = |s: usize, l: usize| f64::from_bits(unsafe { *base.add(s * LANES + l) });
    for l in 0..LANES {
        let v = g(slots[0], l).mul_add(g(slots[1], l), g(slots[2], l));
        // SAFETY: as above.
        unsafe { *base.add(slots[3] * LANES + l) = v.to_bits() };
    }
}

/// One `f64` binary operation over every lane, the operation chosen once per instruction.
#[inline(always)]
pub(super) fn binary64(wide: &mut [Wide], op: IrBinary, dst: usize, a: usize, b: usize) {
    macro_rules! go {
        (|$p:ident, $q:ident| $e:expr) => {
            lanes64(wide, dst, a, b, |_, x, y| {
                let ($p, $q) = (f64::from_bits(x), f64::from_bits(y));
                ($e).to_bits()
            })
        };
    }
    match op {
        IrBinary::Add => go!(|p, q| p + q),
        IrBinary::Sub => go!(|p, q| p - q),
        IrBinary::Mul => go!(|p, q| p * q),
        IrBinary::Div => go!(|p, q| p / q),
        IrBinary::Rem => go!(|p, q| p % q),
        IrBinary::Min => go!(|p, q| p.min(q)),
        IrBinary::Max => go!(|p, q| p.max(q)),
        IrBinary::Pow => go!(|p, q| p.powf(q)),
        IrBinary::Atan2 => go!(|p, q| p.atan2(q)),
        _ => unreachable!("validated: not a float op"),
    }
}

/// One `f64` unary operation over every lane (see [`binary64`]).
#[inline(always)]
pub(super) fn unary64(wide: &mut [Wide], op: IrUnary, dst: usize, x: usize) {
    macro_rules! go {
        (|$v:ident| $e:expr) => {
            lanes64(wide, dst, x, x, |_, a, _| {
                let $v = f64::from_bits(a);
                ($e).to_bits()
            })
        };
    }
    match op {
        IrUnary::Neg => go!(|v| -v),
        IrUnary::Abs => go!(|v| v.abs()),
        IrUnary::Sqrt => go!(|v| v.sqrt()),
        IrUnary::Rsqrt => go!(|v| 1.0 / v.sqrt()),
        IrUnary::Recip => go!(|v| 1.0 / v),
        IrUnary::Exp => go!(|v| v.exp()),
        IrUnary::Exp2 => go!(|v| v.exp2()),
        IrUnary::Log => go!(|v| v.ln()),
        IrUnary::Log2 => go!(|v| v.log2()),
        IrUnary::Sin => go!(|v| v.sin()),
        IrUnary::Cos => go!(|v| v.cos()),
        IrUnary::Tan => go!(|v| v.tan()),
        IrUnary::Tanh => go!(|v| v.tanh()),
        IrUnary::Floor => go!(|v| v.floor()),
        IrUnary::Ceil => go!(|v| v.ceil()),
        IrUnary::Not => unreachable!("validated: not a float op"),
    }
}

#[inline(always)]
pub(super) fn cast(from: ScalarType, to: ScalarType, x: u32) -> u32 {
    use ScalarType::*;
    match (from, to) {
        (a, b) if a == b => x,
        (F32, I32) => f(x) as i32 as u32,
        (F32, U32) => f(x) as u32,
        (F32, Bool) => (f(x) != 0.0) as u32,
        (I32, F32) => b(x as i32 as f32),
        (U32, F32) => b(x as f32),
        (Bool, F32) => b(x as f32),
        (I32, U32) | (U32, I32) | (Bool, I32) | (Bool, U32) => x,
        (I32, Bool) | (U32, Bool) => (x != 0) as u32,
        _ => unreachable!("all pairs covered"),
    }
}

#[inline(always)]
pub(super) fn unary(op: IrUnary, t: ScalarType, x: &Reg, out: &mut Reg) {
    // Each arm one loop straight into `out`.
    macro_rules! lanes {
        (|$v:ident| $e:expr) => {
            for l in 0..LANES {
                let $v = x[l];
                out[l] = $e;
            }
        };
    }
    macro_rules! fl {
        ($g:expr) => {
            lanes!(|v| b($g(f(v))))
        };
    }
    match (op, t) {
        (IrUnary::Neg, ScalarType::F32) => fl!(|v: f32| -v),
        (IrUnary::Neg, _) => lanes!(|v| (v as i32).wrapping_neg() as u32),
        (IrUnary::Abs, ScalarType::F32) => fl!(f32::abs),
        (IrUnary::Abs, ScalarType::I32) => lanes!(|v| (v as i32).wrapping_abs() as u32),
        (IrUnary::Abs, _) => *out = *x,
        (IrUnary::Not, ScalarType::Bool) => lanes!(|v| (v == 0) as u32),
        (IrUnary::Not, _) => lanes!(|v| !v),
        (IrUnary::Sqrt, _) => fl!(f32::sqrt),
        (IrUnary::Rsqrt, _) => fl!(|v: f32| 1.0 / v.sqrt()),
        (IrUnary::Recip, _) => fl!(|v: f32| 1.0 / v),
        (IrUnary::Exp, _) => fl!(exp_f32),
        (IrUnary::Exp2, _) => fl!(f32::exp2),
        (IrUnary::Log, _) => fl!(f32::ln),
        (IrUnary::Log2, _) => fl!(f32::log2),
        (IrUnary::Sin, _) => fl!(f32::sin),
        (IrUnary::Cos, _) => fl!(f32::cos),
        (IrUnary::Tan, _) => fl!(f32::tan),
        (IrUnary::Tanh, _) => fl!(f32::tanh),
        (IrUnary::Floor, _) => fl!(f32::floor),
        (IrUnary::Ceil, _) => fl!(f32::ceil),
    }
}

#[inline(always)]
pub(super) fn binary(op: IrBinary, t: ScalarType, x: &Reg, y: &Reg, out: &mut Reg) {
    use ScalarType::*;
    // Each arm one loop straight into `out`.
    macro_rules! lanes {
        (|$a:ident, $b2:ident| $e:expr) => {
            for l in 0..LANES {
                let ($a, $b2) = (x[l], y[l]);
                out[l] = $e;
            }
        };
    }
    match (op, t) {
        (IrBinary::Add, F32) => lanes!(|p, q| b(f(p) + f(q))),
        (IrBinary::Sub, F32) => lanes!(|p, q| b(f(p) - f(q))),
        (IrBinary::Mul, F32) => lanes!(|p, q| b(f(p) * f(q))),
        (IrBinary::Div, F32) => lanes!(|p, q| b(f(p) / f(q))),
        (IrBinary::Rem, F32) => lanes!(|p, q| b(f(p) % f(q))),
        (IrBinary::Min, F32) => lanes!(|p, q| b(f(p).min(f(q)))),
        (IrBinary::Max, F32) => lanes!(|p, q| b(f(p).max(f(q)))),
        (IrBinary::Pow, _) => lanes!(|p, q| b(f(p).powf(f(q)))),
        (IrBinary::Atan2, _) => lanes!(|p, q| b(f(p).atan2(f(q)))),
        (IrBinary::Add, _) => lanes!(|p, q| p.wrapping_add(q)),
        (IrBinary::Sub, _) => lanes!(|p, q| p.wrapping_sub(q)),
        (IrBinary::Mul, _) => lanes!(|p, q| p.wrapping_mul(q)),
        (IrBinary::Div, I32) => lanes!(|p, q| if q == 0 {
            0
        } else {
            (p as i32).wrapping_div(q as i32) as u32
        }),
        (IrBinary::Div, _) => lanes!(|p, q| div_u32(p, q)),
        (IrBinary::Rem, I32) => lanes!(|p, q| if q == 0 {
            0
        } else {
            (p as i32).wrapping_rem(q as i32) as u32
        }),
        (IrBinary::Rem, _) => lanes!(|p, q| if q == 0 {
            0
        } else {
            p.wrapping_sub(q.wrapping_mul(div_u32(p, q)))
        }),
        (IrBinary::Min, I32) => lanes!(|p, q| (p as i32).min(q as i32) as u32),
        (IrBinary::Max, I32) => lanes!(|p, q| (p as i32).max(q as i32) as u32),
        (IrBinary::Min, _) => lanes!(|p, q| p.min(q)),
        (IrBinary::Max, _) => lanes!(|p, q| p.max(q)),
        (IrBinary::And, _) => lanes!(|p, q| p & q),
        (IrBinary::Or, _) => lanes!(|p, q| p | q),
        (IrBinary::Xor, _) => lanes!(|p, q| p ^ q),
        (IrBinary::Shl, _) => lanes!(|p, q| p.wrapping_shl(q)),
        (IrBinary::Shr, I32) => lanes!(|p, q| (p as i32).wrapping_shr(q) as u32),
        (IrBinary::Shr, _) => lanes!(|p, q| p.wrapping_shr(q)),
    }
}

/// `p / q` rounded down, 0 where `q` is 0, through `f64`: a vector division, where the
/// integer one is a scalar instruction of some 25 cycles per lane (index arithmetic such as
/// `t / classes` runs it for every element). Exact: both operands are below 2^32, so the
/// correctly rounded `f64` quotient of a non-integer `p / q` stays below the next integer
/// (their gap, at least `1 / q`, exceeds the quotient's rounding error, at most
/// `2^-52 p / q`).
#[inline(always)]
fn div_u32(p: u32, q: u32) -> u32 {
    let quotient = (p as f64 / q as f64) as u32;
    if q == 0 { 0 } else { quotient }
}

pub(super) fn pick<T: PartialOrd>(op: IrCmp, a: T, b: T) -> u32 {
    (match op {
        IrCmp::Eq => a == b,
        IrCmp::Ne => a != b,
        IrCmp::Lt => a < b,
        IrCmp::Le => a <= b,
        IrCmp::Gt => a > b,
        IrCmp::Ge => a >= b,
    }) as u32
}

#[inline(always)]
pub(super) fn compare(op: IrCmp, t: ScalarType, x: &Reg, y: &Reg, out: &mut Reg) {
    // One loop per type, straight into `out`.
    match t {
        ScalarType::F32 => (0..LANES).for_each(|l| out[l] = pick(op, f(x[l]), f(y[l]))),
        ScalarType::I32 => (0..LANES).for_each(|l| out[l] = pick(op, x[l] as i32, y[l] as i32)),
        _ => (0..LANES).for_each(|l| out[l] = pick(op, x[l], y[l])),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `div_u32` and the remainder built on it against the integer instructions: the
    /// extremes, quotients just below an integer (p = n q - 1) and a seeded sweep.
    #[test]
    fn u32_division_through_f64_is_exact() {
        let mut pairs = vec![
            (0, 0),
            (5, 0),
            (u32::MAX, 0),
            (u32::MAX, 1),
            (u32::MAX, u32::MAX),
        ];
        for q in [
            1u32,
            2,
            3,
            7,
            50_304,
            65_536,
            (1 << 31) - 1,
            1 << 31,
            u32::MAX - 1,
        ] {
            for n in [1u32, 2, 3, 1000, u32::MAX / q] {
                let p = (n as u64 * q as u64).min(u32::MAX as u64) as u32;
                pairs.extend([(p, q), (p.wrapping_sub(1), q), (p.saturating_add(1), q)]);
            }
        }
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..200_000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let (p, q) = (state as u32, (state >> 32) as u32 >> (state % 31));
            pairs.push((p, q));
        }
        let (x, y): (Vec<u32>, Vec<u32>) = pairs.iter().copied().unzip();
        for (xs, ys) in x.chunks(LANES).zip(y.chunks(LANES)) {
            let (mut a, mut c) = ([0u32; LANES], [0u32; LANES]);
            a[..xs.len()].copy_from_slice(xs);
            c[..ys.len()].copy_from_slice(ys);
            let (mut quot, mut rem) = ([0u32; LANES], [0u32; LANES]);
            binary(IrBinary::Div, ScalarType::U32, &a, &c, &mut quot);
            binary(IrBinary::Rem, ScalarType::U32, &a, &c, &mut rem);
            for l in 0..xs.len() {
                let (p, q) = (a[l], c[l]);
                assert_eq!(quot[l], p.checked_div(q).unwrap_or(0), "{p} / {q}");
                assert_eq!(rem[l], p.checked_rem(q).unwrap_or(0), "{p} % {q}");
            }
        }
    }
}
