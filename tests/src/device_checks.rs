//! Checks of device behaviour beyond numerical parity, generic over the backend, for the GPU
//! backends' test files.

use hal::{Backend, BackendExt, Layout, View};

/// Index operands out of range (gather, scatter-add, segment ids, CSR columns and offsets):
/// the call returns, the next `synchronize` reports the error naming the op, the index and the
/// bound, the failed op wrote nothing, and the next op runs normally.
pub fn bad_indices_are_reported_at_synchronize<B: Backend>(gpu: &B) {
    use hal::{Csr, Error};
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
