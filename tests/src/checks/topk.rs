//! Checks of top_k and ivf_scan: exact (the same selection and the same f32 sums on every
//! backend), against a host computation of the contract written here independently.

use super::*;
use hal::topk::order_key;
use hal::{IvfScanInputs, Layout as L};

/// A value for selection: ordinary most of the time, otherwise a special one (signed zeros,
/// infinities, NaNs of both signs, subnormals) or one of a few repeated values (ties).
fn selection_value(r: &mut TestRng) -> f32 {
    const SPECIAL: [f32; 8] = [
        0.0,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        1.0e-40,
        -1.0e-40,
        f32::MIN_POSITIVE,
    ];
    match r.below(10) {
        0 => SPECIAL[r.below(SPECIAL.len())],
        1 => -f32::NAN,
        2..=4 => [0.25f32, -1.5, 3.0][r.below(3)],
        _ => r.range(-100.0, 100.0),
    }
}

fn run_top_k<B: Backend>(
    b: &B,
    x: &HostTensor,
    outs: [&HostTensor; 2],
    largest: bool,
) -> Result<Vec<f64>> {
    let xb = x.upload(b)?;
    let [vb, ib] = [outs[0].upload(b)?, outs[1].upload(b)?];
    b.top_k(
        View::new(&xb, &x.layout),
        View::new(&vb, &outs[0].layout),
        View::new(&ib, &outs[1].layout),
        largest,
    )?;
    let mut out = read_view(b, &vb, &outs[0].layout)?;
    out.extend(read_view(b, &ib, &outs[1].layout)?);
    Ok(out)
}

pub(super) fn top_k<B: Backend>(s: &mut Suite<'_, B>) {
    let mut cases: Vec<[usize; 3]> = vec![
        [1, 1, 1],
        [3, 7, 7],
        [0, 5, 2],
        [4, 9, 0],
        [5, 257, 10],
        [2, 1500, 1024],
        [1, 16384, 33],
        [300, 64, 8],
        // Many rows past the selection buffer (2,048): a block's warps race to the rounds'
        // compactions (a CUDA bug once corrupted such rows).
        [3000, 4100, 1],
    ];
    while cases.len() < s.cfg.cases + 9 {
        let r = s.rng();
        let n = 1 + r.below(3000);
        let k = r.below(n.min(1024) + 1);
        cases.push([1 + r.below(40), n, k]);
    }
    for (ci, [rows, n, k]) in cases.into_iter().enumerate() {
        let kind = s.kind();
        let x = random_tensor(s.rng(), &[rows, n], DType::F32, kind, selection_value);
        let outs = [
            output_tensor(s.rng(), &[rows, k], DType::F32),
            output_tensor(s.rng(), &[rows, k], DType::U32),
        ];
        let largest = ci % 2 == 1;
        // The contract on the host: each row's (key, index) pairs sorted.
        let xs = x.logical();
        let mut want_v = Vec::with_capacity(rows * k);
        let mut want_i = Vec::with_capacity(rows * k);
        for r in 0..rows {
            let mut row: Vec<(u32, usize, f32)> = (0..n)
                .map(|c| {
                    let v = xs[r * n + c] as f32;
                    let key = if largest { !order_key(v) } else { order_key(v) };
                    (key, c, v)
                })
                .collect();
            row.sort_by_key(|&(key, c, _)| (key, c));
            for &(_, c, v) in &row[..k] {
                want_v.push(v as f64);
                want_i.push(c as f64);
            }
        }
        want_v.extend(want_i);
        let what = format!("rows={rows} n={n} k={k} largest={largest} {kind:?}");
        match both!(s, run_top_k(&x, [&outs[0], &outs[1]], largest)) {
            Ok((c, t)) => s.judge("top_k", &what, &c, t.as_deref(), &want_v, &|_, _| 0.0),
            Err(e) => s.fail("top_k", format!("{what}: {e}")),
        }
    }
}

/// An inverted-list scan problem drawn on the host.
struct Scan {
    queries: usize,
    probes: usize,
    lists: usize,
    bytes: usize,
    cw: usize,
    k: usize,
    tables: Vec<f32>,
    list_tables: Option<Vec<f32>>,
    probe: Vec<u32>,
    bases: Vec<f32>,
    offsets: Vec<u32>,
    codes: Vec<u32>,
    ids: Vec<u32>,
}

impl Scan {
    fn draw(
        r: &mut TestRng,
        [queries, probes, lists, bytes, cw, k]: [usize; 6],
        listed: bool,
    ) -> Self {
        let lens: Vec<usize> = (0..lists)
            .map(|_| match r.below(6) {
                0 => 0,
                1 => 1 + r.below(3),
                _ => r.below(700),
            })
            .collect();
        let mut offsets = vec![0u32];
        for l in &lens {
            offsets.push(offsets.last().copied().unwrap_or(0) + *l as u32);
        }
        let members = *offsets.last().expect("one offset") as usize;
        let words = bytes.div_ceil(4);
        let mut codes = vec![0u32; members * words];
        for i in 0..members {
            for j in 0..bytes {
                codes[i * words + j / 4] |= (r.below(cw) as u32) << (8 * (j % 4));
            }
        }
        // Ids: a permutation with gaps, so ties break by id, not by position.
        let mut ids: Vec<u32> = (0..members as u32).map(|i| 3 * i + 1).collect();
        for i in (1..ids.len()).rev() {
            ids.swap(i, r.below(i + 1));
        }
        // Table entries from a few values now and then (equal distances: ties).
        let entry = |r: &mut TestRng| {
            if r.below(4) == 0 {
                [0.5f32, 1.0][r.below(2)]
            } else {
                r.range(-2.0, 4.0)
            }
        };
        let tables = (0..queries * bytes * cw).map(|_| entry(r)).collect();
        let list_tables = listed.then(|| (0..lists * bytes * cw).map(|_| entry(r)).collect());
        let probe = (0..queries * probes)
            .map(|_| r.below(lists) as u32)
            .collect();
        let bases = (0..queries * probes).map(|_| r.range(0.0, 10.0)).collect();
        Scan {
            queries,
            probes,
            lists,
            bytes,
            cw,
            k,
            tables,
            list_tables,
            probe,
            bases,
            offsets,
            codes,
            ids,
        }
    }

    /// The contract, written out: every probed member's distance summed in order of the code
    /// bytes, each query's k best by (distance, id), padded.
    fn expected(&self) -> Vec<f64> {
        let (len, words) = (self.bytes * self.cw, self.bytes.div_ceil(4));
        let mut dist = Vec::new();
        let mut label = Vec::new();
        for q in 0..self.queries {
            let mut cands: Vec<(u32, u32, f32)> = Vec::new();
            for p in 0..self.probes {
                let a = self.probe[q * self.probes + p] as usize;
                let base = self.bases[q * self.probes + p];
                for i in self.offsets[a] as usize..self.offsets[a + 1] as usize {
                    let mut d = base;
                    for j in 0..self.bytes {
                        let c = (self.codes[i * words + j / 4] >> (8 * (j % 4)) & 0xff) as usize;
                        let e = j * self.cw + c;
                        let t = self.tables[q * len + e];
                        d += match &self.list_tables {
                            Some(l) => l[a * len + e] + t,
                            None => t,
                        };
                    }
                    cands.push((order_key(d), self.ids[i], d));
                }
            }
            cands.sort_by_key(|&(key, id, _)| (key, id));
            for c in 0..self.k {
                let (d, id) = cands
                    .get(c)
                    .map_or((f32::INFINITY, u32::MAX), |x| (x.2, x.1));
                dist.push(d as f64);
                label.push(id as f64);
            }
        }
        dist.extend(label);
        dist
    }
}

fn run_scan<B: Backend>(b: &B, p: &Scan) -> Result<Vec<f64>> {
    let words = p.bytes.div_ceil(4);
    let members = p.ids.len();
    let tables = b.upload(&p.tables)?;
    let list_tables = p.list_tables.as_ref().map(|l| b.upload(l)).transpose()?;
    let (probe, bases) = (b.upload(&p.probe)?, b.upload(&p.bases)?);
    let (offsets, codes, ids) = (
        b.upload(&p.offsets)?,
        b.upload(&p.codes)?,
        b.upload(&p.ids)?,
    );
    let (dist, label) = (
        b.alloc(DType::F32, p.queries * p.k)?,
        b.alloc(DType::U32, p.queries * p.k)?,
    );
    let lt = L::contiguous(&[p.queries, p.bytes, p.cw]);
    let ll = L::contiguous(&[p.lists, p.bytes, p.cw]);
    let lp = L::contiguous(&[p.queries, p.probes]);
    let lo = L::contiguous(&[p.lists + 1]);
    let (lc, li) = (L::contiguous(&[members, words]), L::contiguous(&[members]));
    let lk = L::contiguous(&[p.queries, p.k]);
    b.ivf_scan(
        IvfScanInputs {
            tables: View::new(&tables, &lt),
            list_tables: list_tables.as_ref().map(|l| View::new(l, &ll)),
            probes: View::new(&probe, &lp),
            bases: View::new(&bases, &lp),
            offsets: View::new(&offsets, &lo),
            codes: View::new(&codes, &lc),
            ids: View::new(&ids, &li),
        },
        View::new(&dist, &lk),
        View::new(&label, &lk),
    )?;
    let mut out: Vec<f64> = b.read::<f32>(&dist)?.into_iter().map(f64::from).collect();
    out.extend(b.read::<u32>(&label)?.into_iter().map(f64::from));
    Ok(out)
}

pub(super) fn ivf_scan<B: Backend>(s: &mut Suite<'_, B>) {
    // [queries, probes, lists, bytes, codewords, k]
    let mut cases: Vec<[usize; 6]> = vec![
        [1, 1, 1, 1, 1, 1],
        [3, 2, 5, 4, 16, 10],
        [0, 3, 4, 8, 256, 5],
        [2, 4, 6, 16, 256, 0],
        [7, 5, 9, 7, 13, 50],
        [5, 8, 12, 8, 256, 1024],
        [4, 3, 3, 33, 64, 17],
        [2, 2, 3, 70, 4, 9],
    ];
    while cases.len() < s.cfg.cases + 7 {
        let r = s.rng();
        let bytes = 1 + r.below(16);
        cases.push([
            1 + r.below(20),
            1 + r.below(8),
            1 + r.below(30),
            bytes,
            1 + r.below(256),
            r.below(200),
        ]);
    }
    for (ci, dims) in cases.into_iter().enumerate() {
        let listed = ci % 2 == 0;
        let p = Scan::draw(s.rng(), dims, listed);
        let want = p.expected();
        let [q, np, lists, bytes, cw, k] = dims;
        let what =
            format!("q={q} p={np} lists={lists} bytes={bytes} cw={cw} k={k} list tables={listed}");
        match both!(s, run_scan(&p)) {
            Ok((c, t)) => s.judge("ivf_scan", &what, &c, t.as_deref(), &want, &|_, _| 0.0),
            Err(e) => s.fail("ivf_scan", format!("{what}: {e}")),
        }
    }
}
