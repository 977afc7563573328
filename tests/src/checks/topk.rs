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
        [1000, 2600, 1],
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

/// One `candidate_scores` problem: queries, vectors (kept as f32 values exact in the stored
/// dtype), labels with padding and repeats, optional biases, placed at offsets in their
/// buffers, the scores written transposed or not.
struct Candidates {
    sizes: [usize; 4],
    half: bool,
    alpha: f32,
    /// Zeros before each operand's first element (a view's offset).
    pad: usize,
    transposed: bool,
    queries: Vec<f32>,
    vectors: Vec<f32>,
    labels: Vec<u32>,
    query_bias: Option<Vec<f32>>,
    vector_bias: Option<Vec<f32>>,
}

impl Candidates {
    fn draw(r: &mut TestRng, sizes: [usize; 4], ci: usize) -> Self {
        let [q, c, d, n] = sizes;
        let half = ci % 2 == 1;
        // Infinities and NaNs in some cases, subnormals in others: a device that flushes
        // subnormals to zero (Vulkan may) makes NaN of infinity times a subnormal.
        let wild = ci % 5 < 2;
        let value = |r: &mut TestRng| -> f32 {
            match r.below(40) {
                0 if wild => [0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN][r.below(5)],
                0 => [0.0, -0.0, 1.0e-40, -3.0e-39][r.below(4)],
                _ => r.range(-4.0, 4.0),
            }
        };
        let queries: Vec<f32> = (0..q * d).map(|_| value(r)).collect();
        let vectors: Vec<f32> = (0..n * d)
            .map(|_| {
                let v = value(r);
                if half {
                    half::f16::from_f32(v).to_f32()
                } else {
                    v
                }
            })
            .collect();
        let labels = (0..q * c)
            .map(|_| match r.below(8) {
                0 => hal::topk::NO_CANDIDATE,
                _ if n == 0 => hal::topk::NO_CANDIDATE,
                1 => 0,
                _ => r.below(n) as u32,
            })
            .collect();
        let bias = |r: &mut TestRng, len: usize| (0..len).map(|_| r.range(0.0, 50.0)).collect();
        Candidates {
            sizes,
            half,
            alpha: [-2.0, -1.0, 0.5][ci % 3],
            pad: ci % 4,
            transposed: ci % 3 == 1,
            query_bias: (ci % 4 < 2).then(|| bias(r, q)),
            vector_bias: (ci % 4 != 1).then(|| bias(r, n)),
            queries,
            vectors,
            labels,
        }
    }

    /// Scores in f64 (the contract's sum, exactly), then for each the tolerance's scale.
    fn expected(&self) -> (Vec<f64>, Vec<f64>) {
        let [q, c, d, _] = self.sizes;
        let (mut want, mut scale) = (Vec::new(), Vec::new());
        for i in 0..q * c {
            let (r, l) = (i / c, self.labels[i]);
            if l == hal::topk::NO_CANDIDATE {
                want.push(f64::INFINITY);
                scale.push(0.0);
                continue;
            }
            let l = l as usize;
            let terms =
                (0..d).map(|j| self.queries[r * d + j] as f64 * self.vectors[l * d + j] as f64);
            let (dot, abs) = terms.fold((0.0, 0.0), |(s, a), t| (s + t, a + t.abs()));
            let bias = self.query_bias.as_ref().map_or(0.0, |b| b[r] as f64)
                + self.vector_bias.as_ref().map_or(0.0, |b| b[l] as f64);
            let v = bias + self.alpha as f64 * dot;
            want.push(v);
            let alpha = self.alpha.abs() as f64;
            scale.push(
                alpha
                    * ((2f64.powi(-18) * d as f64 + 2f64.powi(-24)) * abs
                        + d as f64 * 2f64.powi(-126))
                    + 2f64.powi(-24) * (v.abs() + bias.abs()),
            );
        }
        // The transposed output is read back in row-major order of [q, c] too.
        (want, scale)
    }
}

fn run_candidates<B: Backend>(b: &B, p: &Candidates) -> Result<Vec<f64>> {
    let [q, c, d, n] = p.sizes;
    let padded = |v: &[f32]| {
        let mut out = vec![0f32; p.pad];
        out.extend_from_slice(v);
        out
    };
    let at = |shape: &[usize]| L {
        offset: p.pad,
        ..L::contiguous(shape)
    };
    let queries = b.upload(&padded(&p.queries))?;
    let vectors = if p.half {
        let h: Vec<half::f16> = padded(&p.vectors)
            .iter()
            .map(|&v| half::f16::from_f32(v))
            .collect();
        b.upload(&h)?
    } else {
        b.upload(&padded(&p.vectors))?
    };
    let mut labels = vec![0u32; p.pad];
    labels.extend_from_slice(&p.labels);
    let labels = b.upload(&labels)?;
    let qb = p
        .query_bias
        .as_ref()
        .map(|v| b.upload(&padded(v)))
        .transpose()?;
    let vb = p
        .vector_bias
        .as_ref()
        .map(|v| b.upload(&padded(v)))
        .transpose()?;
    let scores = b.alloc(DType::F32, (q * c).max(1))?;
    // Transposed: scores[r, j] at j * q + r.
    let ls = if p.transposed {
        L {
            shape: vec![q, c],
            strides: vec![1, q as isize],
            offset: 0,
        }
    } else {
        L::contiguous(&[q, c])
    };
    let (lq, lv, ll, lqb, lvb) = (at(&[q, d]), at(&[n, d]), at(&[q, c]), at(&[q]), at(&[n]));
    b.candidate_scores(
        hal::CandidateInputs {
            queries: View::new(&queries, &lq),
            vectors: View::new(&vectors, &lv),
            labels: View::new(&labels, &ll),
            query_bias: qb.as_ref().map(|v| View::new(v, &lqb)),
            vector_bias: vb.as_ref().map(|v| View::new(v, &lvb)),
        },
        p.alpha,
        View::new(&scores, &ls),
    )?;
    read_view(b, &scores, &ls)
}

pub(super) fn candidate_scores<B: Backend>(s: &mut Suite<'_, B>) {
    // [queries, candidates, d, n]
    let mut cases: Vec<[usize; 4]> = vec![
        [1, 1, 1, 1],
        [0, 4, 8, 5],
        [3, 0, 8, 5],
        [4, 7, 33, 20],
        [5, 64, 384, 300],
        [2, 9, 1, 3],
        [6, 5, 65, 0],
        [3, 17, 1000, 40],
    ];
    while cases.len() < s.cfg.cases + 8 {
        let r = s.rng();
        cases.push([
            1 + r.below(30),
            r.below(70),
            1 + r.below(200),
            1 + r.below(100),
        ]);
    }
    for (ci, sizes) in cases.into_iter().enumerate() {
        let p = Candidates::draw(s.rng(), sizes, ci);
        let (want, scale) = p.expected();
        let [q, c, d, n] = sizes;
        let what = format!(
            "q={q} c={c} d={d} n={n} f16={} alpha={} transposed={}",
            p.half, p.alpha, p.transposed
        );
        match both!(s, run_candidates(&p)) {
            Ok((cpu, t)) => s.judge(
                "candidate_scores",
                &what,
                &cpu,
                t.as_deref(),
                &want,
                &|i, _| 2.0 * scale[i],
            ),
            Err(e) => s.fail("candidate_scores", format!("{what}: {e}")),
        }
    }
}
