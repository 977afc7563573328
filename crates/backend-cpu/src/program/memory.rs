//! The interpreter's memory side: buffers as element formats, loads into register lanes and
//! stores (or atomic adds) out of them, every index checked and the first fault noted.

use super::{Reg, Wide};
use hal::{DType, bf16, f16};
use std::sync::atomic::{AtomicU16, AtomicU32, AtomicU64, Ordering::Relaxed};

/// The element formats a 32-bit register value is loaded from and stored to.
#[derive(Clone, Copy)]
pub(super) enum Narrow {
    /// f32, i32 and u32: the bits themselves.
    Bits32,
    F16,
    BF16,
}

#[derive(Clone, Copy)]
pub(super) struct Mem {
    pub(super) ptr: *mut u8,
    pub(super) len: usize,
    pub(super) dtype: DType,
}
// SAFETY: every access goes through atomics (see `load`), bounds-checked by the caller.
unsafe impl Send for Mem {}
unsafe impl Sync for Mem {}

impl Mem {
    /// How this buffer's 32-bit register values are stored: decided once per instruction,
    /// so the lane loops below carry no per-element `match`.
    #[inline(always)]
    pub(super) fn narrow(&self) -> Narrow {
        match self.dtype {
            DType::F32 | DType::I32 | DType::U32 => Narrow::Bits32,
            DType::F16 => Narrow::F16,
            DType::BF16 => Narrow::BF16,
            DType::F64 => unreachable!("f64 buffers go through load64 and store64"),
        }
    }
    #[inline(always)]
    pub(super) fn load(&self, w: Narrow, i: usize) -> u32 {
        // SAFETY: the caller checked `i < len`; atomics make concurrent access defined.
        unsafe {
            match w {
                Narrow::Bits32 => (*(self.ptr as *const AtomicU32).add(i)).load(Relaxed),
                Narrow::F16 => {
                    f16::from_bits((*(self.ptr as *const AtomicU16).add(i)).load(Relaxed))
                        .to_f32()
                        .to_bits()
                }
                Narrow::BF16 => {
                    bf16::from_bits((*(self.ptr as *const AtomicU16).add(i)).load(Relaxed))
                        .to_f32()
                        .to_bits()
                }
            }
        }
    }
    /// Element `i` of an `f64` buffer, as bits.
    #[inline(always)]
    pub(super) fn load64(&self, i: usize) -> u64 {
        // SAFETY: the caller checked `i < len` and the dtype (f64: 8-byte elements).
        unsafe { (*(self.ptr as *const AtomicU64).add(i)).load(Relaxed) }
    }
    #[inline(always)]
    pub(super) fn store64(&self, i: usize, bits: u64) {
        // SAFETY: as for `load64`.
        unsafe { (*(self.ptr as *const AtomicU64).add(i)).store(bits, Relaxed) }
    }
    #[inline(always)]
    pub(super) fn atomic_add64(&self, i: usize, bits: u64) {
        // SAFETY: as for `load64`.
        let a = unsafe { &*(self.ptr as *const AtomicU64).add(i) };
        let mut cur = a.load(Relaxed);
        loop {
            let new = (f64::from_bits(cur) + f64::from_bits(bits)).to_bits();
            match a.compare_exchange_weak(cur, new, Relaxed, Relaxed) {
                Ok(_) => break,
                Err(seen) => cur = seen,
            }
        }
    }
    #[inline(always)]
    pub(super) fn store(&self, w: Narrow, i: usize, bits: u32) {
        // SAFETY: the caller checked `i < len`; atomics make concurrent access defined.
        unsafe {
            match w {
                Narrow::Bits32 => (*(self.ptr as *const AtomicU32).add(i)).store(bits, Relaxed),
                Narrow::F16 => (*(self.ptr as *const AtomicU16).add(i))
                    .store(f16::from_f32(f32::from_bits(bits)).to_bits(), Relaxed),
                Narrow::BF16 => (*(self.ptr as *const AtomicU16).add(i))
                    .store(bf16::from_f32(f32::from_bits(bits)).to_bits(), Relaxed),
            }
        }
    }
    #[inline(always)]
    pub(super) fn atomic_add(&self, i: usize, bits: u32) {
        // SAFETY: the caller checked `i < len`; Program::validate admits atomic adds on F32,
        // I32 and U32 buffers only, so an AtomicU32 at element `i` is in bounds.
        unsafe {
            let a = &*(self.ptr as *const AtomicU32).add(i);
            match self.dtype {
                DType::F32 => {
                    let mut cur = a.load(Relaxed);
                    loop {
                        let new = (f32::from_bits(cur) + f32::from_bits(bits)).to_bits();
                        match a.compare_exchange_weak(cur, new, Relaxed, Relaxed) {
                            Ok(_) => break,
                            Err(seen) => cur = seen,
                        }
                    }
                }
                _ => {
                    a.fetch_add(bits, Relaxed);
                }
            }
        }
    }
}

/// The values a store or atomic add writes: 32-bit lanes, or 64-bit ones for an f64 buffer.
pub(super) enum Stored<'a> {
    Narrow(&'a Reg),
    Wide(&'a Wide),
}

/// Stores (or adds atomically) each live lane's value at its index where `when` holds,
/// noting the fault of an index out of range.
#[inline(always)]
pub(super) fn store_lanes(
    m: Mem,
    ix: &Reg,
    value: Stored<'_>,
    when: Option<&Reg>,
    atomic: bool,
    lanes: usize,
    fault: &impl Fn(u32),
) {
    // The lanes to write, each index checked; `put` is chosen once, outside the loop.
    #[inline(always)]
    fn each(
        ix: &Reg,
        when: Option<&Reg>,
        lanes: usize,
        len: usize,
        fault: &impl Fn(u32),
        put: impl Fn(usize, usize),
    ) {
        for l in 0..lanes {
            if when.is_some_and(|w| w[l] == 0) {
                continue;
            }
            let i = ix[l] as usize;
            if i >= len {
                fault(ix[l]);
                continue;
            }
            put(l, i);
        }
    }
    let len = m.len;
    match (value, atomic) {
        (Stored::Wide(v), true) => {
            each(ix, when, lanes, len, fault, |l, i| m.atomic_add64(i, v[l]))
        }
        (Stored::Wide(v), false) => each(ix, when, lanes, len, fault, |l, i| m.store64(i, v[l])),
        (Stored::Narrow(v), true) => {
            each(ix, when, lanes, len, fault, |l, i| m.atomic_add(i, v[l]))
        }
        (Stored::Narrow(v), false) => match m.narrow() {
            Narrow::Bits32 => each(ix, when, lanes, len, fault, |l, i| {
                m.store(Narrow::Bits32, i, v[l])
            }),
            Narrow::F16 => each(ix, when, lanes, len, fault, |l, i| {
                m.store(Narrow::F16, i, v[l])
            }),
            Narrow::BF16 => each(ix, when, lanes, len, fault, |l, i| {
                m.store(Narrow::BF16, i, v[l])
            }),
        },
    }
}

/// `load(i)` at each live lane's index below `len`, or the fault noted (the lane left 0).
#[inline(always)]
pub(super) fn lanes_of(
    out: &mut Reg,
    ix: &Reg,
    lanes: usize,
    len: usize,
    fault: &impl Fn(u32),
    load: impl Fn(usize) -> u32,
) {
    for l in 0..lanes {
        let i = ix[l] as usize;
        out[l] = if i < len {
            load(i)
        } else {
            fault(ix[l]);
            0
        };
    }
}
