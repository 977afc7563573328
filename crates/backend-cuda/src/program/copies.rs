//! **Copies**: a short program without store runs (an elementwise pass) runs several launch
//! indices a thread. One index a thread keeps one load in flight per thread, too few bytes to
//! cover the memory's latency (most of all for 16-bit elements); indices are independent (the
//! IR orders only one index's instructions), so running several in one thread, their
//! statements interleaved, changes no result.
//!
//! Two layouts:
//! - **Vector**: where every access at the launch index itself (`x[t]`) can be made a whole
//!   16-byte access, a thread takes [`VECTOR`] consecutive indices: each such buffer is read
//!   with one `uint4` load (two for 32-bit elements, four for 64-bit) at its first load, its
//!   store gathered into registers and written the same way after the element. Other
//!   accesses (`lse[t / C]`, say) stay checked scalar ones. A thread whose indices run past
//!   `n` or a buffer's end, or whose buffer is not 16-byte aligned, runs them one by one.
//!   Values equal for the thread's indices (a row's statistics at `index / c`, `c` a multiple
//!   of [`VECTOR`]) are computed and loaded once. The cross-entropy gradient over GPT-2's
//!   bf16 logits (618M elements, H200) took 2.87 ms one index a thread, 2.36 strided four a
//!   thread, 0.89 ms so (a hand-written kernel: 0.78); GPT-2's bf16 step 35.3 -> 32.6 ms,
//!   shakespeare_char's 8.81 -> 7.92 ms.
//! - **Strided**: otherwise [`COPIES`] indices `blockDim.x` apart, so that a warp's scalar
//!   accesses stay consecutive (GPT-2's bf16 step: 35.4 -> 34.6 ms on an H200 over one).

use super::dialect::{CudaC, ty};
use hal::DType;
use hal::ir::render::{render_body, render_statements};
use hal::ir::{Constant, Inst, IrBinary, Program, ScalarType, Value};
use std::collections::BTreeMap;
use std::fmt::Write;

/// How a program's launch indices map onto threads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Layout {
    /// One index a thread.
    One,
    /// This many indices a thread, `blockDim.x` apart.
    Strided(u32),
    /// [`VECTOR`] consecutive indices a thread, the accesses at the index whole vectors.
    Vector(Vectors),
}

impl Layout {
    /// Launch indices a thread covers.
    pub(super) fn per_thread(&self) -> u32 {
        match self {
            Layout::One => 1,
            Layout::Strided(k) => *k,
            Layout::Vector(_) => VECTOR,
        }
    }
}

/// The buffers a [`Layout::Vector`] program reads and writes as whole vectors.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Vectors {
    /// Buffer -> the instruction of its first load at the index (where the vector is read).
    loads: BTreeMap<u32, usize>,
    /// Buffer -> its one store, at the index.
    stores: BTreeMap<u32, usize>,
}

/// Indices a thread in the strided layout.
const COPIES: u32 = 4;
/// Consecutive indices a thread in the vector layout: 16 bytes of 16-bit elements.
const VECTOR: u32 = 8;
/// The longest program run several times a thread: longer ones compute more than they move.
const MAX_COPIED_INSTS: usize = 64;

/// The layout of `program` (`has_runs`: whether it has store runs, which stay one index a
/// thread). `BACKEND_CUDA_IR_COPIES=k` (1 to 16), for timing the choice, forces `k` strided
/// indices a thread (1: one) on every program that may take more than one.
pub(super) fn layout(program: &Program, has_runs: bool) -> Layout {
    if has_runs || program.insts.len() > MAX_COPIED_INSTS {
        return Layout::One;
    }
    match setting() {
        Some(1) => Layout::One,
        Some(k) => Layout::Strided(k),
        None => vectors(program).map_or(Layout::Strided(COPIES), Layout::Vector),
    }
}

fn setting() -> Option<u32> {
    static SETTING: std::sync::OnceLock<Option<u32>> = std::sync::OnceLock::new();
    *SETTING.get_or_init(|| {
        std::env::var("BACKEND_CUDA_IR_COPIES")
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|k| (1..=16).contains(k))
    })
}

/// The vector accesses of `program`, where every access at the launch index can be one: a
/// buffer's loads at the index all before any write to it, a buffer's store at the index
/// its only write (unconditional, not atomic) and no load of it after.
fn vectors(program: &Program) -> Option<Vectors> {
    let at_index = |v: Value| matches!(program.insts[v.0 as usize], Inst::Index);
    // Buffer -> (instruction, at the index) of its loads, and of its writes (with whether
    // the write could be a vector store).
    let mut loads: BTreeMap<u32, Vec<(usize, bool)>> = BTreeMap::new();
    let mut writes: BTreeMap<u32, Vec<(usize, bool, bool)>> = BTreeMap::new();
    for (n, inst) in program.insts.iter().enumerate() {
        match *inst {
            Inst::Load { buffer, index } => {
                loads
                    .entry(buffer.0)
                    .or_default()
                    .push((n, at_index(index)));
            }
            Inst::Store {
                buffer,
                index,
                when,
                ..
            } => {
                let at = at_index(index);
                let entry = (n, at, at && when.is_none());
                writes.entry(buffer.0).or_default().push(entry);
            }
            Inst::AtomicAdd { buffer, index, .. } => {
                writes
                    .entry(buffer.0)
                    .or_default()
                    .push((n, at_index(index), false));
            }
            _ => {}
        }
    }
    let mut v = Vectors::default();
    for (&b, list) in &loads {
        let Some(&(first, _)) = list.iter().find(|(_, at)| *at) else {
            continue;
        };
        let last_load = list.last().map_or(0, |l| l.0);
        if writes.get(&b).is_some_and(|w| w[0].0 < last_load) {
            return None;
        }
        v.loads.insert(b, first);
    }
    for (&b, list) in &writes {
        if !list.iter().any(|w| w.1) {
            continue;
        }
        let [(n, _, true)] = list[..] else {
            return None;
        };
        if loads.get(&b).is_some_and(|l| l.iter().any(|&(m, _)| m > n)) {
            return None;
        }
        v.stores.insert(b, n);
    }
    (!v.loads.is_empty() || !v.stores.is_empty()).then_some(v)
}

/// The kernel's loop over its indices for a layout of more than one index a thread: opens
/// the loop and the thread's fault note (`bad_`), which the caller reports and closes.
pub(super) fn emit(src: &mut String, program: &Program, types: &[Option<ScalarType>], l: &Layout) {
    match l {
        Layout::One => unreachable!("one index a thread has no copies"),
        Layout::Strided(k) => strided(src, program, types, *k),
        Layout::Vector(v) => vector(src, program, types, v),
    }
}

/// `k` copies' statements, one statement of every copy after another.
fn interleave(src: &mut String, copies: &[Vec<String>]) {
    for statement in 0..copies[0].len() {
        for copy in copies {
            let _ = writeln!(src, "  {}", copy[statement]);
        }
    }
}

fn strided(src: &mut String, program: &Program, types: &[Option<ScalarType>], k: u32) {
    // A block covers `k` blocks' worth of consecutive indices, a thread every `blockDim.x`-th
    // of them. A thread short of `k` indices runs the ones it has one by one.
    let _ = writeln!(
        src,
        "  const i64 step_ = (i64)gridDim.x * blockDim.x * {k};\n  \
         for (i64 t0_ = (i64)blockIdx.x * blockDim.x * {k} + threadIdx.x; t0_ < n; t0_ += step_) {{\n  \
         bool bad_ = false; i64 bad_at_ = 0, bad_len_ = 0;\n  \
         if (t0_ + {} * (i64)blockDim.x < n) {{",
        k - 1
    );
    let copies: Vec<Vec<String>> = (0..k)
        .map(|c| {
            let _ = writeln!(src, "  u32 t_{c} = (u32)(t0_ + {c} * (i64)blockDim.x);");
            render_statements(program, types, &CudaC, &format!("_{c}"), |_| false)
        })
        .collect();
    interleave(src, &copies);
    *src += "  } else {\n  for (i64 t_ = t0_; t_ < n; t_ += blockDim.x) {\n  u32 t = (u32)t_;\n";
    *src += &render_body(program, types, &CudaC, "  ", |_| false);
    *src += "  }\n  }\n";
}

fn vector(src: &mut String, program: &Program, types: &[Option<ScalarType>], v: &Vectors) {
    let k = VECTOR;
    let dtype = |b: u32| program.buffers[b as usize].dtype;
    // A buffer read and written in place is checked once.
    let buffers: std::collections::BTreeSet<u32> =
        v.loads.keys().chain(v.stores.keys()).copied().collect();
    let mut whole = format!("t0_ + {k} <= n");
    for &b in &buffers {
        let _ = write!(whole, " && t0_ + {k} <= len{b}");
    }
    let aligned: Vec<String> = buffers
        .iter()
        .map(|b| format!("(unsigned long long)b{b}"))
        .collect();
    let _ = writeln!(
        src,
        "  const i64 step_ = (i64)gridDim.x * blockDim.x * {k};\n  \
         for (i64 t0_ = ((i64)blockIdx.x * blockDim.x + threadIdx.x) * {k}; t0_ < n; t0_ += step_) {{\n  \
         bool bad_ = false; i64 bad_at_ = 0, bad_len_ = 0;\n  \
         if ({whole} && (({}) & 15ull) == 0) {{",
        aligned.join(" | ")
    );
    let mut copies: Vec<Vec<String>> = (0..k)
        .map(|c| {
            let _ = writeln!(src, "  u32 t_{c} = (u32)(t0_ + {c});");
            render_statements(program, types, &CudaC, &format!("_{c}"), |_| false)
        })
        .collect();
    // A value equal in every copy is computed (a load: read) by the first copy only.
    for (n, &same) in uniform(program).iter().enumerate() {
        if same {
            let t = types[n].expect("uniform values are values");
            for (c, copy) in copies.iter_mut().enumerate().skip(1) {
                copy[n] = format!("{} v{n}_{c} = v{n}_0;", ty(t));
            }
        }
    }
    for (n, inst) in program.insts.iter().enumerate() {
        match *inst {
            Inst::Load { buffer, index }
                if v.loads.contains_key(&buffer.0)
                    && matches!(program.insts[index.0 as usize], Inst::Index) =>
            {
                let b = buffer.0;
                let t = types[n].expect("loads define a value");
                let mut words = String::new();
                if v.loads[&b] == n {
                    for q in 0..words_of(dtype(b)) {
                        let _ = write!(
                            words,
                            "const uint4 w{b}_{q} = ((const uint4*)(b{b} + t0_))[{q}]; "
                        );
                    }
                }
                for (c, copy) in copies.iter_mut().enumerate() {
                    let value = unpack(dtype(b), &element(b, dtype(b), c as u32));
                    let lead = if c == 0 { words.as_str() } else { "" };
                    copy[n] = format!("{lead}{} v{n}_{c} = {value};", ty(t));
                }
            }
            Inst::Store { buffer, value, .. } if v.stores.get(&buffer.0) == Some(&n) => {
                let b = buffer.0;
                for (c, copy) in copies.iter_mut().enumerate() {
                    let bits = pack(dtype(b), &format!("v{}_{c}", value.0));
                    let word = if dtype(b) == DType::F64 { "u64" } else { "u32" };
                    copy[n] = format!("{word} s{b}_{c} = {bits};");
                }
            }
            _ => {}
        }
    }
    interleave(src, &copies);
    for &b in v.stores.keys() {
        for q in 0..words_of(dtype(b)) {
            let _ = writeln!(
                src,
                "  ((uint4*)(b{b} + t0_))[{q}] = {};",
                store_word(b, dtype(b), q)
            );
        }
    }
    let _ = writeln!(
        src,
        "  }} else {{\n  for (i64 t_ = t0_; t_ < n && t_ < t0_ + {k}; ++t_) {{\n  u32 t = (u32)t_;"
    );
    *src += &render_body(program, types, &CudaC, "  ", |_| false);
    *src += "  }\n  }\n";
}

/// Which values are the same for the [`VECTOR`] consecutive indices of a thread: constants,
/// `index / c` for a constant `c` that [`VECTOR`] divides (the thread's first index is a
/// multiple of [`VECTOR`]: a row of `c` elements holds all of its indices or none), loads at
/// such values (a row's statistics, say), and what is computed from them alone.
fn uniform(program: &Program) -> Vec<bool> {
    let insts = &program.insts;
    let mut same = vec![false; insts.len()];
    for (n, inst) in insts.iter().enumerate() {
        same[n] = match *inst {
            Inst::Index | Inst::Store { .. } | Inst::AtomicAdd { .. } => false,
            Inst::Binary {
                op: IrBinary::Div,
                a,
                b,
            } if matches!(insts[a.0 as usize], Inst::Index) => matches!(
                insts[b.0 as usize],
                Inst::Const(Constant::U32(c)) if c != 0 && c % VECTOR == 0
            ),
            _ => inst.operands().all(|v| same[v.0 as usize]),
        };
    }
    same
}

/// `uint4` words of [`VECTOR`] elements of `dtype`.
fn words_of(dtype: DType) -> u32 {
    VECTOR * dtype.size_in_bytes() as u32 / 16
}

const FIELDS: [&str; 4] = ["x", "y", "z", "w"];

/// The bits of element `c` of buffer `b`'s vector words.
fn element(b: u32, dtype: DType, c: u32) -> String {
    let per = 16 / dtype.size_in_bytes() as u32;
    let (q, r) = (c / per, (c % per) as usize);
    match dtype.size_in_bytes() {
        2 => format!(
            "((w{b}_{q}.{} >> {}u) & 0xffffu)",
            FIELDS[r / 2],
            16 * (r % 2)
        ),
        4 => format!("w{b}_{q}.{}", FIELDS[r]),
        _ => format!(
            "(((u64)w{b}_{q}.{} << 32) | w{b}_{q}.{})",
            FIELDS[2 * r + 1],
            FIELDS[2 * r]
        ),
    }
}

/// An element's bits as the value a load yields.
fn unpack(dtype: DType, bits: &str) -> String {
    match dtype {
        DType::F16 => format!("f16_to_f32({bits})"),
        DType::BF16 => format!("bf16_to_f32({bits})"),
        DType::F32 => format!("__uint_as_float({bits})"),
        DType::I32 => format!("(int){bits}"),
        DType::U32 => bits.to_string(),
        DType::F64 => format!("__longlong_as_double((long long){bits})"),
    }
}

/// A value's bits as a store writes them (16-bit floats rounded as the scalar store does).
fn pack(dtype: DType, value: &str) -> String {
    match dtype {
        DType::F16 => format!("f32_to_f16({value})"),
        DType::BF16 => format!("f32_to_bf16({value})"),
        DType::F32 => format!("__float_as_uint({value})"),
        DType::I32 => format!("(u32){value}"),
        DType::U32 => value.to_string(),
        DType::F64 => format!("(u64)__double_as_longlong({value})"),
    }
}

/// Word `q` of buffer `b`'s store, from the copies' bits `s{b}_{c}`.
fn store_word(b: u32, dtype: DType, q: u32) -> String {
    let lanes: Vec<String> = match dtype.size_in_bytes() {
        2 => (0..4)
            .map(|j| {
                format!(
                    "s{b}_{} | (s{b}_{} << 16)",
                    8 * q + 2 * j,
                    8 * q + 2 * j + 1
                )
            })
            .collect(),
        4 => (0..4).map(|j| format!("s{b}_{}", 4 * q + j)).collect(),
        _ => (0..2)
            .flat_map(|j| {
                let c = 2 * q + j;
                [format!("(u32)s{b}_{c}"), format!("(u32)(s{b}_{c} >> 32)")]
            })
            .collect(),
    };
    format!("make_uint4({})", lanes.join(", "))
}

#[cfg(test)]
mod tests {
    use super::super::{layout_of, lower, lower_as};
    use super::*;
    use hal::ir::{Access, ProgramBuilder};

    /// With several indices a thread, the copies' statements alternate (the loads of every
    /// copy come before any copy's arithmetic), each copy named apart; a thread short of its
    /// indices runs the plain body per index.
    #[test]
    fn copies_are_interleaved_statement_by_statement() {
        let mut b = ProgramBuilder::new("scale");
        let x = b.buffer(DType::BF16, Access::Read);
        let y = b.buffer(DType::BF16, Access::Write);
        let i = b.index();
        let v = b.load(x, i);
        let two = b.const_f32(2.0);
        let r = b.mul(v, two);
        b.store(y, i, r);
        let src = lower_as(&b.build().unwrap(), &Layout::Strided(3)).unwrap();
        let at = |needle: &str| {
            src.find(needle)
                .unwrap_or_else(|| panic!("{needle}: {src}"))
        };
        assert!(at("u32 t_2 = (u32)(t0_ + 2 * (i64)blockDim.x);") < at("float v1_0 = "));
        assert!(at("float v1_2 = ") < at("float v3_0 = v1_0 * v2_0;"));
        assert!(at("b1[v0_2] = ") < at("for (i64 t_ = t0_; t_ < n; t_ += blockDim.x)"));
        assert!(src.contains("t0_ + 2 * (i64)blockDim.x < n"), "{src}");
        assert!(src.contains("float v3 = v1 * v2;"), "{src}");
    }

    /// The cross-entropy gradient's shape: bf16 logits read and the gradient written as one
    /// 16-byte vector each; the per-row loads stay checked scalars, and a thread short of its
    /// indices (or with a misaligned buffer) runs them one by one.
    #[test]
    fn accesses_at_the_index_become_vectors() {
        let mut b = ProgramBuilder::new("ce_like");
        let x = b.buffer(DType::BF16, Access::Read);
        let lse = b.buffer(DType::F32, Access::Read);
        let out = b.buffer(DType::BF16, Access::Write);
        let t = b.index();
        let c = b.const_u32(50304);
        let row = b.binary(IrBinary::Div, t, c);
        let v = b.load(x, t);
        let l = b.load(lse, row);
        let d = b.sub(v, l);
        b.store(out, t, d);
        let program = b.build().unwrap();
        assert!(matches!(layout_of(&program), Layout::Vector(_)));
        let src = lower(&program).unwrap();
        let at = |needle: &str| {
            src.find(needle)
                .unwrap_or_else(|| panic!("{needle}: {src}"))
        };
        assert!(
            src.contains("t0_ + 8 <= n && t0_ + 8 <= len0 && t0_ + 8 <= len2"),
            "{src}"
        );
        assert!(src.contains("((unsigned long long)b0 | (unsigned long long)b2) & 15ull"));
        assert!(at("const uint4 w0_0 = ((const uint4*)(b0 + t0_))[0];") < at("v3_7 ="));
        assert!(src.contains("float v3_7 = bf16_to_f32(((w0_0.w >> 16u) & 0xffffu));"));
        assert!(src.contains("u32 s2_3 = f32_to_bf16(v5_3);"), "{src}");
        assert!(src.contains(
            "((uint4*)(b2 + t0_))[0] = make_uint4(s2_0 | (s2_1 << 16), s2_2 | (s2_3 << 16), \
             s2_4 | (s2_5 << 16), s2_6 | (s2_7 << 16));"
        ));
        // The row (50304 a multiple of 8) is one for the thread's eight indices: lse is read
        // once, checked, in the whole case, and once in the tail; no checked x or out.
        assert_eq!(src.matches("< len1) v4").count(), 2, "{src}");
        assert!(src.contains("float v4_7 = v4_0;"), "{src}");
        assert_eq!(src.matches("< len0)").count(), 1, "{src}");
        assert!(at("t_ < n && t_ < t0_ + 8; ++t_") > at("make_uint4"));
    }

    /// 32- and 64-bit elements take two and four words; a buffer read and written in place is
    /// both a vector load and a vector store.
    #[test]
    fn wider_elements_take_more_words() {
        let mut b = ProgramBuilder::new("axpy_f64");
        let x = b.buffer(DType::F64, Access::Read);
        let y = b.buffer(DType::F32, Access::ReadWrite);
        let t = b.index();
        let (xv, yv) = (b.load(x, t), b.load(y, t));
        let xf = b.cast(ScalarType::F32, xv);
        let r = b.add(xf, yv);
        b.store(y, t, r);
        let src = lower(&b.build().unwrap()).unwrap();
        assert!(
            src.contains("const uint4 w0_3 = ((const uint4*)(b0 + t0_))[3];"),
            "{src}"
        );
        assert!(src.contains(
            "double v1_7 = __longlong_as_double((long long)(((u64)w0_3.w << 32) | w0_3.z));"
        ));
        assert!(
            src.contains("float v2_5 = __uint_as_float(w1_1.y);"),
            "{src}"
        );
        assert!(src.contains("((uint4*)(b1 + t0_))[1] = make_uint4(s1_4, s1_5, s1_6, s1_7);"));
    }

    /// Where an access at the index cannot be a vector, the layout is strided: a conditional
    /// store, an atomic add, a load after the buffer's store, two stores to one buffer.
    #[test]
    fn accesses_that_cannot_be_vectors_keep_the_strided_layout() {
        let build = |case: u32| {
            let mut b = ProgramBuilder::new("case");
            let x = b.buffer(DType::F32, Access::ReadWrite);
            let y = b.buffer(DType::F32, Access::ReadWrite);
            let t = b.index();
            let v = b.load(x, t);
            match case {
                0 => {
                    let zero = b.const_f32(0.0);
                    let pos = b.cmp(hal::ir::IrCmp::Gt, v, zero);
                    b.store_if(pos, y, t, v);
                }
                1 => b.atomic_add(y, t, v),
                2 => {
                    b.store(y, t, v);
                    let again = b.load(y, t);
                    b.store(x, t, again);
                }
                _ => {
                    b.store(y, t, v);
                    b.store(y, t, v);
                }
            }
            layout_of(&b.build().unwrap())
        };
        for case in 0..4 {
            assert_eq!(build(case), Layout::Strided(COPIES), "case {case}");
        }
    }

    /// `index / c` is one value for a thread's indices only where `c` is a multiple of
    /// [`VECTOR`] (65 classes: a thread's eight indices may straddle two rows).
    #[test]
    fn rows_are_uniform_only_for_multiples_of_the_vector() {
        let row_load = |c: u32| {
            let mut b = ProgramBuilder::new("rows");
            let x = b.buffer(DType::F32, Access::Read);
            let stats = b.buffer(DType::F32, Access::Read);
            let y = b.buffer(DType::F32, Access::Write);
            let t = b.index();
            let cc = b.const_u32(c);
            let row = b.binary(IrBinary::Div, t, cc);
            let (v, s) = (b.load(x, t), b.load(stats, row));
            let r = b.mul(v, s);
            b.store(y, t, r);
            let program = b.build().unwrap();
            uniform(&program)[4]
        };
        assert!(row_load(768));
        assert!(!row_load(65));
        assert!(!row_load(4));
    }
}
