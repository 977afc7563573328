//! Checks of device behaviour beyond numerical parity, generic over the backend, for the GPU
//! backends' test files.

use hal::{Backend, BackendExt, Layout, View};

/// Index operands out of range (gather, scatter-add, segment ids, CSR columns and offsets):
/// the call returns, the next `synchronize` reports the error naming the op, the index and the
/// bound, the failed op wrote nothing, and the next op runs normally.
pub fn bad_indices_are_reported_at_synchronize<B: Backend>(gpu: &B) {
    bad_gather_indices(gpu);
    bad_scatter_and_segment_indices(gpu);
    bad_csr_structure(gpu);
}

/// gather with indices past the end and below 0; a good gather after them.
fn bad_gather_indices<B: Backend>(gpu: &B) {
    use hal::Error;
    let x = gpu.upload(&[1.0f32, 2.0, 3.0]).unwrap();
    let out = gpu.upload(&[-7.0f32; 4]).unwrap();
    let (lx, li) = (Layout::contiguous(&[3]), Layout::contiguous(&[4]));
    let expect_untouched = |what: &str| {
        assert_eq!(gpu.read::<f32>(&out).unwrap(), vec![-7.0; 4], "{what}");
    };

    // gather: u32 past the end, then i32 below 0.
    let idx = gpu.upload(&[0u32, 2, 3, 1]).unwrap();
    gpu.gather(
        View::new(&x, &lx),
        0,
        View::new(&idx, &li),
        View::new(&out, &li),
    )
    .unwrap();
    let err = gpu.synchronize().unwrap_err();
    assert!(
        matches!(
            err,
            Error::IndexOutOfRange {
                op: "gather",
                index: 3,
                bound: 3
            }
        ),
        "{err}"
    );
    expect_untouched("a failed gather writes nothing");
    let neg = gpu.upload(&[0i32, -1, 0, 0]).unwrap();
    gpu.gather(
        View::new(&x, &lx),
        0,
        View::new(&neg, &li),
        View::new(&out, &li),
    )
    .unwrap();
    let err = gpu.read::<f32>(&out).unwrap_err();
    assert!(
        matches!(
            err,
            Error::IndexOutOfRange {
                op: "gather",
                index: -1,
                ..
            }
        ),
        "{err}"
    );
    expect_untouched("a failed gather writes nothing");

    // A good gather right after runs and is not blamed for the earlier fault.
    let good = gpu.upload(&[2u32, 1, 0, 2]).unwrap();
    gpu.gather(
        View::new(&x, &lx),
        0,
        View::new(&good, &li),
        View::new(&out, &li),
    )
    .unwrap();
    assert_eq!(gpu.read::<f32>(&out).unwrap(), vec![3.0, 2.0, 1.0, 3.0]);
}

/// scatter_add and segment_sum (few and many segments) with an id past the last.
fn bad_scatter_and_segment_indices<B: Backend>(gpu: &B) {
    use hal::Error;
    let li = Layout::contiguous(&[4]);
    // scatter_add into 3 slots with an index of 5.
    let src = gpu.upload(&[1.0f32; 4]).unwrap();
    let bad = gpu.upload(&[0u32, 5, 1, 2]).unwrap();
    let l3 = Layout::contiguous(&[3]);
    let small = gpu.upload(&[-7.0f32; 3]).unwrap();
    gpu.scatter_add(
        View::new(&src, &li),
        0,
        View::new(&bad, &li),
        View::new(&small, &l3),
    )
    .unwrap();
    let err = gpu.synchronize().unwrap_err();
    assert!(
        matches!(
            err,
            Error::IndexOutOfRange {
                op: "scatter_add",
                index: 5,
                bound: 3
            }
        ),
        "{err}"
    );
    assert_eq!(gpu.read::<f32>(&small).unwrap(), vec![-7.0; 3]);

    // segment_sum with an id one past the last segment: among 2 segments, and among 300 (a
    // backend may sort the rows first when there are many).
    let rows = gpu.upload(&[1.0f32, 2.0, 3.0, 4.0]).unwrap();
    for (m, ids) in [(2usize, [0u32, 1, 2, 1]), (300, [0, 299, 300, 1])] {
        let seg = gpu.upload(&ids).unwrap();
        let (sums, counts) = (
            gpu.upload(&vec![-7.0f32; m]).unwrap(),
            gpu.upload(&vec![-7.0f32; m]).unwrap(),
        );
        gpu.segment_sum(
            View::new(&rows, &Layout::contiguous(&[4, 1])),
            View::new(&seg, &li),
            None,
            View::new(&sums, &Layout::contiguous(&[m, 1])),
            View::new(&counts, &Layout::contiguous(&[m])),
        )
        .unwrap();
        let err = gpu.synchronize().unwrap_err();
        assert!(
            matches!(
                err,
                Error::IndexOutOfRange {
                    op: "segment_sum",
                    index,
                    bound,
                } if index as usize == m && bound == m
            ),
            "{err}"
        );
        assert_eq!(gpu.read::<f32>(&sums).unwrap(), vec![-7.0; m]);
        assert_eq!(gpu.read::<f32>(&counts).unwrap(), vec![-7.0; m]);
    }
}

/// spmv_csr with a column past the end, then decreasing row offsets; a good one after them.
fn bad_csr_structure<B: Backend>(gpu: &B) {
    use hal::{Csr, Error};
    // spmv: a column past the end, then decreasing row offsets.
    let values = gpu.upload(&[1.0f32; 4]).unwrap();
    let xv = gpu.upload(&[1.0f32; 3]).unwrap();
    let y = gpu.upload(&[-7.0f32; 2]).unwrap();
    let offsets = gpu.upload(&[0u32, 2, 4]).unwrap();
    let cols = gpu.upload(&[0u32, 1, 2, 3]).unwrap();
    let csr = |offsets, cols| Csr {
        rows: 2,
        cols: 3,
        row_offsets: offsets,
        col_indices: cols,
        values: &values,
    };
    gpu.spmv_csr(csr(&offsets, &cols), &xv, &y, 1.0, 0.0)
        .unwrap();
    let err = gpu.synchronize().unwrap_err();
    assert!(
        matches!(
            err,
            Error::IndexOutOfRange {
                op: "spmv_csr",
                index: 3,
                bound: 3
            }
        ),
        "{err}"
    );
    assert_eq!(gpu.read::<f32>(&y).unwrap(), vec![-7.0; 2]);
    let decreasing = gpu.upload(&[0u32, 3, 2]).unwrap();
    let fine_cols = gpu.upload(&[0u32, 1, 2, 0]).unwrap();
    gpu.spmv_csr(csr(&decreasing, &fine_cols), &xv, &y, 1.0, 0.0)
        .unwrap();
    let err = gpu.synchronize().unwrap_err();
    assert!(
        matches!(err, Error::InvalidArgument { op: "spmv_csr", .. }),
        "{err}"
    );
    assert_eq!(gpu.read::<f32>(&y).unwrap(), vec![-7.0; 2]);
    let good_offsets = gpu.upload(&[0u32, 3, 4]).unwrap();
    gpu.spmv_csr(csr(&good_offsets, &fine_cols), &xv, &y, 1.0, 0.0)
        .unwrap();
    assert_eq!(gpu.read::<f32>(&y).unwrap(), vec![3.0, 1.0]);
}

/// On a backend that captures its recordings: waits and host traffic inside a recording are
/// refused naming the call, nothing of the recording runs, and the backend works afterwards.
pub fn host_traffic_inside_a_recording_is_refused<B: Backend>(gpu: &B) {
    use hal::{BinaryOp, DType, Error};
    use std::sync::Arc;
    assert!(gpu.capabilities().graph_capture);
    let l = Layout::contiguous(&[8]);
    let x = gpu.upload(&[1.0f32; 8]).unwrap();
    for call in ["synchronize", "read_bytes", "write_bytes", "upload_bytes"] {
        let (xs, ls) = (x.clone(), l.clone());
        let err = gpu
            .record(Arc::new(move |b: &B| {
                let v = View::new(&xs, &ls);
                b.binary(BinaryOp::Add, v, v, v)?;
                match call {
                    "synchronize" => b.synchronize(),
                    "read_bytes" => b.read_bytes(&xs).map(drop),
                    "write_bytes" => b.write_bytes(&xs, &[0u8; 32]),
                    _ => b.upload(&[2.0f32]).map(drop),
                }
            }))
            .unwrap_err();
        assert!(
            matches!(&err, Error::InvalidArgument { op, .. } if *op == call),
            "{call}: {err}"
        );
    }
    // Nothing ran, and the device works again.
    assert_eq!(gpu.read::<f32>(&x).unwrap(), vec![1.0; 8]);
    let y = gpu.alloc(DType::F32, 8).unwrap();
    assert_eq!(gpu.read::<f32>(&y).unwrap(), vec![0.0; 8]);
}

/// A captured recording replays faithfully: recording runs nothing; a buffer allocated inside
/// starts at zero on every replay (it is the accumulator of a sum here, so a leftover would
/// double the result); the inputs' contents may change between replays; an index check
/// inside reports a bad index written between replays at the next synchronize, and its guarded
/// gather writes nothing, and the next replay's check starts afresh; what the recording
/// allocated is held by the graph.
pub fn captured_recordings_replay_faithfully<B: Backend>(gpu: &B) {
    use hal::{BinaryOp, DType, Error, ReduceOp};
    use std::sync::{Arc, Mutex};
    assert!(gpu.capabilities().graph_capture);
    let n = 1000;
    let (l, l1) = (Layout::contiguous(&[n]), Layout::contiguous(&[1]));
    let x = gpu.upload(&vec![1.0f32; n]).unwrap();
    let index = gpu.upload(&[3u32, 1, 4, 1]).unwrap();
    let (out, li) = (gpu.alloc(DType::F32, 1).unwrap(), Layout::contiguous(&[4]));
    let gathered = gpu.upload(&[-7.0f32; 4]).unwrap();
    let (xs, is, os, gs) = (x.clone(), index.clone(), out.clone(), gathered.clone());
    let seen = Arc::new(Mutex::new(0usize));
    let calls = seen.clone();
    let graph = gpu
        .record(Arc::new(move |b: &B| {
            *calls.lock().unwrap() += 1;
            // acc = 0 (fresh) + x + x; out = sum(acc).
            let acc = b.alloc(DType::F32, n)?;
            let (va, vx) = (View::new(&acc, &l), View::new(&xs, &l));
            b.binary(BinaryOp::Add, va, vx, va)?;
            b.binary(BinaryOp::Add, va, vx, va)?;
            b.reduce(ReduceOp::Sum, va, &[0], View::new(&os, &l1))?;
            b.gather(
                View::new(&xs, &l),
                0,
                View::new(&is, &li),
                View::new(&gs, &li),
            )
        }))
        .unwrap();
    assert_eq!(
        *seen.lock().unwrap(),
        1,
        "the steps run once, when recording"
    );
    assert_eq!(
        gpu.read::<f32>(&out).unwrap(),
        vec![0.0],
        "recording ran the steps"
    );
    for (replay, value) in [(1, 1.0f32), (2, 1.0), (3, 0.25)] {
        gpu.write(&x, &vec![value; n]).unwrap();
        gpu.replay(&graph).unwrap();
        assert_eq!(
            gpu.read::<f32>(&out).unwrap(),
            vec![2.0 * value * n as f32],
            "replay {replay}"
        );
        assert_eq!(gpu.read::<f32>(&gathered).unwrap(), vec![value; 4]);
    }
    assert_eq!(
        *seen.lock().unwrap(),
        1,
        "a replay does not run the steps again"
    );
    gpu.write(&index, &[0u32, 1000, 0, 0]).unwrap();
    gpu.write(&gathered, &[-7.0f32; 4]).unwrap();
    gpu.replay(&graph).unwrap();
    let err = gpu.synchronize().unwrap_err();
    assert!(
        matches!(
            err,
            Error::IndexOutOfRange {
                op: "gather",
                index: 1000,
                bound: 1000
            }
        ),
        "{err}"
    );
    assert_eq!(gpu.read::<f32>(&gathered).unwrap(), vec![-7.0; 4]);
    // The graph holds what it allocated (the accumulator, whose handle went when the steps
    // returned): fresh allocations do not alias it, so a replay neither reads their data nor
    // overwrites it. (Buffers made outside stay the caller's to keep alive.)
    gpu.write(&index, &[0u32, 1, 2, 3]).unwrap();
    let others: Vec<_> = (0..8)
        .map(|_| gpu.upload(&vec![5.0f32; n]).unwrap())
        .collect();
    gpu.replay(&graph).unwrap();
    assert_eq!(gpu.read::<f32>(&out).unwrap(), vec![0.5 * n as f32]);
    // The failed check of the replay before does not hold: this one's indices are good, and
    // its gather writes.
    assert_eq!(gpu.read::<f32>(&gathered).unwrap(), vec![0.25; 4]);
    for o in &others {
        assert_eq!(gpu.read::<f32>(o).unwrap(), vec![5.0; n]);
    }
}

/// Bad operands of the selection primitives: a `top_k` asking for more than a row holds is
/// refused at once; an `ivf_scan` probe naming no list, a code byte past the codewords and
/// offsets that do not start at 0 are errors (returned by the call or by the next
/// `synchronize`), and the next good scan runs normally. With `writes_nothing` (the CPU) the
/// failed calls must also leave their outputs untouched.
pub fn bad_selection_inputs_are_errors<B: Backend>(b: &B, writes_nothing: bool) {
    use hal::{DType, Error, IvfScanInputs};
    let x = b.upload(&[3.0f32, 1.0, 2.0]).unwrap();
    let (vals, idx) = (
        b.alloc(DType::F32, 4).unwrap(),
        b.alloc(DType::U32, 4).unwrap(),
    );
    let (lx, lk) = (Layout::contiguous(&[1, 3]), Layout::contiguous(&[1, 4]));
    let e = b
        .top_k(
            View::new(&x, &lx),
            View::new(&vals, &lk),
            View::new(&idx, &lk),
            false,
        )
        .unwrap_err();
    assert!(
        matches!(e, Error::InvalidArgument { op: "top_k", .. }),
        "{e}"
    );

    // Two lists of two members, one-byte codes of 4 codewords; one query probing both.
    let tables = b.upload(&[0.0f32, 1.0, 2.0, 3.0]).unwrap();
    let bases = b.upload(&[0.5f32, 0.25]).unwrap();
    let ids = b.upload(&[10u32, 11, 12, 13]).unwrap();
    let (dist, label) = (
        b.upload(&[-7.0f32; 3]).unwrap(),
        b.upload(&[7u32; 3]).unwrap(),
    );
    let lt = Layout::contiguous(&[1, 1, 4]);
    let lp = Layout::contiguous(&[1, 2]);
    let (lo, lc, li) = (
        Layout::contiguous(&[3]),
        Layout::contiguous(&[4, 1]),
        Layout::contiguous(&[4]),
    );
    let lout = Layout::contiguous(&[1, 3]);
    let scan =
        |probes: &[u32], offsets: &[u32], codes: &[u32]| -> hal::Result<(Vec<f32>, Vec<u32>)> {
            let (p, o, c) = (b.upload(probes)?, b.upload(offsets)?, b.upload(codes)?);
            b.ivf_scan(
                IvfScanInputs {
                    tables: View::new(&tables, &lt),
                    list_tables: None,
                    probes: View::new(&p, &lp),
                    bases: View::new(&bases, &lp),
                    offsets: View::new(&o, &lo),
                    codes: View::new(&c, &lc),
                    ids: View::new(&ids, &li),
                },
                View::new(&dist, &lout),
                View::new(&label, &lout),
            )?;
            b.synchronize()?;
            Ok((b.read::<f32>(&dist)?, b.read::<u32>(&label)?))
        };
    let untouched = |what: &str| {
        if writes_nothing {
            assert_eq!(b.read::<f32>(&dist).unwrap(), vec![-7.0; 3], "{what}");
            assert_eq!(b.read::<u32>(&label).unwrap(), vec![7; 3], "{what}");
        }
    };
    let good = [0u32, 2, 4];
    let e = scan(&[0, 2], &good, &[0, 1, 2, 3]).unwrap_err();
    assert!(
        matches!(
            e,
            Error::IndexOutOfRange {
                op: "ivf_scan",
                index: 2,
                bound: 2
            }
        ),
        "{e}"
    );
    untouched("a probe naming no list");
    let e = scan(&[0, 1], &good, &[0, 1, 4, 3]).unwrap_err();
    assert!(
        matches!(
            e,
            Error::IndexOutOfRange {
                op: "ivf_scan",
                index: 4,
                bound: 4
            }
        ),
        "{e}"
    );
    untouched("a code byte past the codewords");
    let e = scan(&[0, 1], &[1, 2, 4], &[0, 1, 2, 3]).unwrap_err();
    assert!(
        matches!(e, Error::InvalidArgument { op: "ivf_scan", .. }),
        "{e}"
    );
    untouched("offsets that do not start at 0");
    // Members 10, 11 (list 0, base 0.5) and 12, 13 (list 1, base 0.25) with codes 3, 1, 0, 2.
    let (d, l) = scan(&[0, 1], &good, &[3, 1, 0, 2]).unwrap();
    assert_eq!(l, vec![12, 11, 13]);
    assert_eq!(d, vec![0.25, 1.5, 2.25]);

    // Candidate scores: two 2-d vectors, a query with three candidates (one padding).
    let q = b.upload(&[1.0f32, 2.0]).unwrap();
    let v = b.upload(&[3.0f32, 4.0, -1.0, 0.5]).unwrap();
    let vb = b.upload(&[10.0f32, 20.0]).unwrap();
    let out = b.upload(&[-7.0f32; 3]).unwrap();
    let (lq, lv, lb, ll) = (
        Layout::contiguous(&[1, 2]),
        Layout::contiguous(&[2, 2]),
        Layout::contiguous(&[2]),
        Layout::contiguous(&[1, 3]),
    );
    let score = |labels: &[u32]| -> hal::Result<Vec<f32>> {
        let l = b.upload(labels)?;
        b.candidate_scores(
            hal::CandidateInputs {
                queries: View::new(&q, &lq),
                vectors: View::new(&v, &lv),
                labels: View::new(&l, &ll),
                query_bias: None,
                vector_bias: Some(View::new(&vb, &lb)),
            },
            -2.0,
            View::new(&out, &ll),
        )?;
        b.synchronize()?;
        b.read::<f32>(&out)
    };
    let e = score(&[1, 2, 0]).unwrap_err();
    assert!(
        matches!(
            e,
            Error::IndexOutOfRange {
                op: "candidate_scores",
                index: 2,
                bound: 2
            }
        ),
        "{e}"
    );
    if writes_nothing {
        assert_eq!(b.read::<f32>(&out).unwrap(), vec![-7.0; 3]);
    }
    // 10 - 2 (1*3 + 2*4) = -12; 20 - 2 (-1 + 1) = 20; padding +inf.
    let got = score(&[0, u32::MAX, 1]).unwrap();
    assert_eq!(got, vec![-12.0, f32::INFINITY, 20.0]);
}
