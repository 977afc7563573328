//! Selection: top-k of rows, the inverted-list scan of product-quantised codes and the
//! scores of candidates (`hal::topk` gives the order and the distances). A row's candidates are packed as
//! `order_key << 32 | index` in a `u64`, whose integer order is the contract's.

use crate::ops::cluster::f32_rows;
use crate::storage::CpuBuffer;
use hal::topk::{CandidateShape, IvfScanShape, NO_CANDIDATE, from_order_key, order_key};
use hal::{CandidateInputs, Error, IvfScanInputs, Result, View};
use rayon::prelude::*;
use std::collections::BinaryHeap;

/// A strided element pointer, shareable across the threads that write disjoint rows.
#[derive(Clone, Copy)]
struct Out<T>(*mut T);
// SAFETY: each thread writes the rows it owns; the output views reach each element once.
unsafe impl<T> Send for Out<T> {}
unsafe impl<T> Sync for Out<T> {}

impl<T> Out<T> {
    /// The pointer (a method, so that closures capture the whole `Out`, which is `Sync`).
    fn ptr(self) -> *mut T {
        self.0
    }
}

/// The `k` least of `cands`, ascending.
fn least(cands: &mut Vec<u64>, k: usize) {
    if k < cands.len() {
        if k > 0 {
            cands.select_nth_unstable(k - 1);
        }
        cands.truncate(k);
    }
    cands.sort_unstable();
}

/// Writes row `r` of the outputs: each packed candidate's value and index, then `pad` to `k`.
///
/// # Safety
/// The views lie inside their buffers (validated) and row `r` is this caller's alone.
unsafe fn write_row(
    [values, indices]: [(Out<f32>, &hal::Layout); 2],
    r: usize,
    row: &[u64],
    k: usize,
    value: impl Fn(u64) -> f32,
    pad: (f32, u32),
) {
    let at = |l: &hal::Layout, c: usize| {
        l.offset as isize + r as isize * l.strides[0] + c as isize * l.strides[1]
    };
    for c in 0..k {
        let (v, i) = row.get(c).map_or(pad, |&p| (value(p), p as u32));
        // SAFETY: see the function's contract.
        unsafe {
            *values.0.ptr().offset(at(values.1, c)) = v;
            *(indices.0.0 as *mut u32).offset(at(indices.1, c)) = i;
        }
    }
}

pub(crate) fn top_k(
    x: View<'_, CpuBuffer>,
    values: View<'_, CpuBuffer>,
    indices: View<'_, CpuBuffer>,
    [rows, n, k]: [usize; 3],
    largest: bool,
) {
    let src = Out(x.buffer.typed::<f32>());
    let outs = [
        (Out(values.buffer.typed::<f32>()), values.layout),
        (
            Out(indices.buffer.typed::<u32>() as *mut f32),
            indices.layout,
        ),
    ];
    let l = x.layout;
    let flip = if largest { u32::MAX } else { 0 };
    (0..rows).into_par_iter().for_each(|r| {
        let mut cands: Vec<u64> = (0..n)
            .map(|c| {
                let at = l.offset as isize + r as isize * l.strides[0] + c as isize * l.strides[1];
                // SAFETY: the view was checked to lie inside its buffer.
                let v = unsafe { *src.ptr().offset(at) };
                ((order_key(v) ^ flip) as u64) << 32 | c as u64
            })
            .collect();
        least(&mut cands, k);
        let value = |p: u64| from_order_key((p >> 32) as u32 ^ flip);
        // SAFETY: validated views; row r is this iteration's.
        unsafe { write_row(outs, r, &cands, k, value, (0.0, 0)) };
    });
}

fn u32s(v: View<'_, CpuBuffer>) -> &[u32] {
    // SAFETY: a contiguous u32 view inside its buffer (validated), alive for the call.
    unsafe {
        std::slice::from_raw_parts(
            v.buffer.typed::<u32>().add(v.layout.offset),
            v.layout.numel(),
        )
    }
}

/// The offsets start at 0, never decrease and end within the members.
fn check_offsets(offsets: &[u32], members: usize) -> Result<()> {
    let mut prev = 0u32;
    for (a, &o) in offsets.iter().enumerate() {
        if (a == 0 && o != 0) || o < prev || o as usize > members {
            return Err(Error::InvalidArgument {
                op: "ivf_scan",
                detail: format!(
                    "offsets must start at 0, never decrease and end within the {members} \
                     stored entries (found offset {o} at list {a})"
                ),
            });
        }
        prev = o;
    }
    Ok(())
}

/// One query's `k` best candidates, packed, ascending.
fn scan_query(x: &IvfScanInputs<'_, CpuBuffer>, s: &IvfScanShape, q: usize) -> Result<Vec<u64>> {
    let (bytes, cw, words) = (s.bytes, s.codewords, s.words);
    let len = bytes * cw;
    let f32s = |v: View<'_, CpuBuffer>| f32_rows(v.buffer.src(), v.layout);
    let tables = f32s(x.tables);
    let qt = &tables[q * len..(q + 1) * len];
    let lt = x.list_tables.map(f32s);
    let (probes, bases) = (u32s(x.probes), f32s(x.bases));
    let (offsets, codes, ids) = (u32s(x.offsets), u32s(x.codes), u32s(x.ids));
    let mut best: BinaryHeap<u64> = BinaryHeap::with_capacity(s.k.min(4096) + 1);
    let mut table = vec![0f32; if lt.is_some() { len } else { 0 }];
    for p in 0..s.probes {
        let a = probes[q * s.probes + p] as usize;
        if a >= s.lists {
            return Err(Error::IndexOutOfRange {
                op: "ivf_scan",
                index: a as i64,
                bound: s.lists,
            });
        }
        let t: &[f32] = match &lt {
            Some(lt) => {
                for ((t, &l), &v) in table.iter_mut().zip(&lt[a * len..(a + 1) * len]).zip(qt) {
                    *t = l + v;
                }
                &table
            }
            None => qt,
        };
        let base = bases[q * s.probes + p];
        for i in offsets[a] as usize..offsets[a + 1] as usize {
            let code = &codes[i * words..(i + 1) * words];
            let mut dist = base;
            for j in 0..bytes {
                let c = (code[j / 4] >> (8 * (j % 4)) & 0xff) as usize;
                if c >= cw {
                    return Err(Error::IndexOutOfRange {
                        op: "ivf_scan",
                        index: c as i64,
                        bound: cw,
                    });
                }
                dist += t[j * cw + c];
            }
            let packed = (order_key(dist) as u64) << 32 | ids[i] as u64;
            if best.len() < s.k {
                best.push(packed);
            } else if let Some(mut top) = best.peek_mut()
                && packed < *top
            {
                *top = packed;
            }
        }
    }
    Ok(best.into_sorted_vec())
}

pub(crate) fn ivf_scan(
    x: IvfScanInputs<'_, CpuBuffer>,
    s: &IvfScanShape,
    distances: View<'_, CpuBuffer>,
    labels: View<'_, CpuBuffer>,
) -> Result<()> {
    check_offsets(u32s(x.offsets), s.members)?;
    // Every row first, the outputs written only when no query found bad data.
    let rows: Vec<Vec<u64>> = (0..s.queries)
        .into_par_iter()
        .map(|q| scan_query(&x, s, q))
        .collect::<Result<_>>()?;
    let outs = [
        (Out(distances.buffer.typed::<f32>()), distances.layout),
        (Out(labels.buffer.typed::<u32>() as *mut f32), labels.layout),
    ];
    let value = |p: u64| from_order_key((p >> 32) as u32);
    for (q, row) in rows.iter().enumerate() {
        // SAFETY: validated views, written by this thread alone.
        unsafe { write_row(outs, q, row, s.k, value, (f32::INFINITY, u32::MAX)) };
    }
    Ok(())
}

/// `candidate_scores`: each query's candidates scored from their rows of `vectors` (f32 read
/// in place, f16 converted as read), every score computed before any is written.
pub(crate) fn candidate_scores(
    x: CandidateInputs<'_, CpuBuffer>,
    s: &CandidateShape,
    alpha: f32,
    scores: View<'_, CpuBuffer>,
) -> Result<()> {
    let (d, c) = (s.d, s.candidates);
    let labels = u32s(x.labels);
    if let Some(&bad) = labels
        .iter()
        .find(|&&l| l != NO_CANDIDATE && l as usize >= s.n)
    {
        return Err(Error::IndexOutOfRange {
            op: "candidate_scores",
            index: bad as i64,
            bound: s.n,
        });
    }
    let f32s = |v: View<'_, CpuBuffer>| f32_rows(v.buffer.src(), v.layout);
    let queries = f32s(x.queries);
    let (qb, vb) = (x.query_bias.map(f32s), x.vector_bias.map(f32s));
    let vsrc = x.vectors.buffer.src();
    let (voff, f16) = (
        x.vectors.layout.offset,
        x.vectors.dtype() != hal::DType::F32,
    );
    let whole = (!f16).then(|| f32s(x.vectors));
    let rows: Vec<f32> = (0..s.queries * c)
        .into_par_iter()
        .map(|rc| {
            let (r, l) = (rc / c, labels[rc]);
            if l == NO_CANDIDATE {
                return f32::INFINITY;
            }
            let l = l as usize;
            let q = &queries[r * d..(r + 1) * d];
            let dot: f32 = match &whole {
                Some(v) => q
                    .iter()
                    .zip(&v[l * d..(l + 1) * d])
                    .map(|(a, b)| a * b)
                    .sum(),
                // SAFETY: row l < n of a validated contiguous view.
                None => (0..d)
                    .map(|j| q[j] * unsafe { vsrc.load((voff + l * d + j) as isize) })
                    .sum(),
            };
            let bias = qb.as_ref().map_or(0.0, |b| b[r]) + vb.as_ref().map_or(0.0, |b| b[l]);
            bias + alpha * dot
        })
        .collect();
    let out = scores.buffer.typed::<f32>();
    for (rc, v) in rows.into_iter().enumerate() {
        let (r, j) = (rc / c, rc % c);
        let at = scores.layout.offset as isize
            + r as isize * scores.layout.strides[0]
            + j as isize * scores.layout.strides[1];
        // SAFETY: a validated output view; this thread alone writes.
        unsafe { *out.offset(at) = v };
    }
    Ok(())
}
