//! Bad input gets a clear `hal::Error`, never a panic, and leaves the output untouched.

use backend_cpu::CpuBackend;
use hal::ir::{Access, ProgramBuilder};
use hal::{
    ArgReduceOp, Backend, BackendExt, BinaryOp, Conv2dGeometry, Csr, DType, Error, Layout,
    ReduceOp, View,
};

#[test]
fn shape_mismatch_names_both_shapes() {
    let cpu = CpuBackend::new();
    let a = cpu.upload(&[1.0f32; 6]).unwrap();
    let b = cpu.upload(&[1.0f32; 4]).unwrap();
    let out = cpu.alloc(DType::F32, 6).unwrap();
    let (la, lb) = (Layout::contiguous(&[2, 3]), Layout::contiguous(&[4]));
    let err = cpu
        .binary(
            BinaryOp::Add,
            View::new(&a, &la),
            View::new(&b, &lb),
            View::new(&out, &la),
        )
        .unwrap_err();
    assert!(matches!(err, Error::ShapeMismatch { .. }), "{err}");
    let text = err.to_string();
    assert!(text.contains("[2, 3]") && text.contains("[4]"), "{text}");

    let m = cpu.alloc(DType::F32, 12).unwrap();
    let (l1, l2, lo) = (
        Layout::contiguous(&[2, 3]),
        Layout::contiguous(&[4, 3]),
        Layout::contiguous(&[2, 3]),
    );
    let err = cpu
        .matmul(
            View::new(&a, &l1),
            View::new(&m, &l2),
            View::new(&out, &lo),
            1.0,
            0.0,
        )
        .unwrap_err();
    assert!(matches!(err, Error::ShapeMismatch { .. }), "{err}");
}

#[test]
fn dtype_mismatch_is_an_error() {
    let cpu = CpuBackend::new();
    let a = cpu.upload(&[1.0f32; 4]).unwrap();
    let b = cpu.upload(&[hal::f16::ONE; 4]).unwrap();
    let out = cpu.alloc(DType::F32, 4).unwrap();
    let l = Layout::contiguous(&[2, 2]);
    let err = cpu
        .matmul(
            View::new(&a, &l),
            View::new(&b, &l),
            View::new(&out, &l),
            1.0,
            0.0,
        )
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::DTypeMismatch {
                expected: DType::F32,
                got: DType::F16,
                ..
            }
        ),
        "{err}"
    );
    let err = cpu.read::<u32>(&a).unwrap_err();
    assert!(matches!(err, Error::DTypeMismatch { .. }), "{err}");
    let idx = cpu.alloc(DType::F32, 2).unwrap();
    let err = cpu
        .arg_reduce(
            ArgReduceOp::ArgMax,
            View::new(&a, &l),
            1,
            View::new(&idx, &Layout::contiguous(&[2, 1])),
        )
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::DTypeMismatch {
                expected: DType::U32,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn out_of_range_gather_index_is_an_error_and_writes_nothing() {
    let cpu = CpuBackend::new();
    let x = cpu.upload(&[1.0f32, 2.0, 3.0]).unwrap();
    let idx = cpu.upload(&[0u32, 2, 3, 1]).unwrap();
    let out = cpu.upload(&[-7.0f32; 4]).unwrap();
    let (lx, li) = (Layout::contiguous(&[3]), Layout::contiguous(&[4]));
    let err = cpu
        .gather(
            View::new(&x, &lx),
            0,
            View::new(&idx, &li),
            View::new(&out, &li),
        )
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::IndexOutOfRange {
                index: 3,
                bound: 3,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(
        cpu.read::<f32>(&out).unwrap(),
        vec![-7.0; 4],
        "a failed gather must leave the output untouched"
    );
    let neg = cpu.upload(&[-1i32, 0, 0, 0]).unwrap();
    let err = cpu
        .gather(
            View::new(&x, &lx),
            0,
            View::new(&neg, &li),
            View::new(&out, &li),
        )
        .unwrap_err();
    assert!(
        matches!(err, Error::IndexOutOfRange { index: -1, .. }),
        "{err}"
    );
}

#[test]
fn zero_size_inputs_without_a_result_are_errors() {
    let cpu = CpuBackend::new();
    let empty = cpu.alloc(DType::F32, 0).unwrap();
    let out = cpu.alloc(DType::U32, 3).unwrap();
    let (lx, lo) = (Layout::contiguous(&[3, 0]), Layout::contiguous(&[3, 1]));
    let err = cpu
        .arg_reduce(
            ArgReduceOp::ArgMin,
            View::new(&empty, &lx),
            1,
            View::new(&out, &lo),
        )
        .unwrap_err();
    assert!(matches!(err, Error::Empty { .. }), "{err}");
    let outf = cpu.alloc(DType::F32, 3).unwrap();
    let err = cpu
        .reduce(
            ReduceOp::Max,
            View::new(&empty, &lx),
            &[1],
            View::new(&outf, &lo),
        )
        .unwrap_err();
    assert!(matches!(err, Error::Empty { .. }), "{err}");
    // A sum over nothing is 0, not an error.
    cpu.reduce(
        ReduceOp::Sum,
        View::new(&empty, &lx),
        &[1],
        View::new(&outf, &lo),
    )
    .unwrap();
    assert_eq!(cpu.read::<f32>(&outf).unwrap(), vec![0.0; 3]);
    // Nearest centroid with no centroids.
    let x = cpu.upload(&[1.0f32; 8]).unwrap();
    let (i, d) = (
        cpu.alloc(DType::U32, 2).unwrap(),
        cpu.alloc(DType::F32, 2).unwrap(),
    );
    let l2 = Layout::contiguous(&[2]);
    let err = cpu
        .nearest_centroid(
            View::new(&x, &Layout::contiguous(&[2, 4])),
            View::new(&empty, &Layout::contiguous(&[0, 4])),
            View::new(&i, &l2),
            View::new(&d, &l2),
        )
        .unwrap_err();
    assert!(matches!(err, Error::Empty { .. }), "{err}");
}

#[test]
fn a_2_pow_40_element_allocation_is_refused_with_the_limit() {
    let cpu = CpuBackend::new();
    let err = cpu.alloc(DType::F32, 1usize << 40).unwrap_err();
    match &err {
        Error::AllocationTooLarge {
            requested_bytes,
            limit_bytes,
            ..
        } => {
            assert_eq!(*requested_bytes, 4u128 << 40);
            assert!(*limit_bytes > 0);
        }
        other => panic!("expected AllocationTooLarge, got {other}"),
    }
    assert!(err.to_string().contains("4398046511104"), "{err}");
}

#[test]
fn views_outside_their_buffer_are_refused() {
    let cpu = CpuBackend::new();
    let a = cpu.alloc(DType::F32, 10).unwrap();
    let l = Layout::strided(&[4], &[3], 2).unwrap(); // touches element 11
    let err = cpu.fill(View::new(&a, &l), 1.0).unwrap_err();
    assert!(matches!(err, Error::OutOfBounds { .. }), "{err}");
}

#[test]
fn bad_segments_sparse_indices_and_geometry_are_errors() {
    let cpu = CpuBackend::new();
    let x = cpu.upload(&[1.0f32; 6]).unwrap();
    let seg = cpu.upload(&[0u32, 5, 1]).unwrap();
    let (sums, counts) = (
        cpu.alloc(DType::F32, 4).unwrap(),
        cpu.alloc(DType::F32, 2).unwrap(),
    );
    let err = cpu
        .segment_sum(
            View::new(&x, &Layout::contiguous(&[3, 2])),
            View::new(&seg, &Layout::contiguous(&[3])),
            None,
            View::new(&sums, &Layout::contiguous(&[2, 2])),
            View::new(&counts, &Layout::contiguous(&[2])),
        )
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::IndexOutOfRange {
                index: 5,
                bound: 2,
                ..
            }
        ),
        "{err}"
    );

    let (ro, ci, va) = (
        cpu.upload(&[0u32, 1]).unwrap(),
        cpu.upload(&[9u32]).unwrap(),
        cpu.upload(&[1.0f32]).unwrap(),
    );
    let (xv, yv) = (
        cpu.upload(&[1.0f32; 3]).unwrap(),
        cpu.alloc(DType::F32, 1).unwrap(),
    );
    let err = cpu
        .spmv_csr(
            Csr {
                rows: 1,
                cols: 3,
                row_offsets: &ro,
                col_indices: &ci,
                values: &va,
            },
            &xv,
            &yv,
            1.0,
            0.0,
        )
        .unwrap_err();
    assert!(
        matches!(err, Error::IndexOutOfRange { index: 9, .. }),
        "{err}"
    );

    let g = Conv2dGeometry {
        batch: 1,
        channels: 1,
        height: 2,
        width: 2,
        kernel: (5, 5),
        stride: (1, 1),
        padding: (0, 0),
        dilation: (1, 1),
    };
    let err = cpu
        .im2col(
            View::new(&x, &Layout::contiguous(&[1, 1, 2, 2])),
            &g,
            View::new(&x, &Layout::contiguous(&[1, 25, 1])),
        )
        .unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
}

#[test]
fn bad_programs_and_launches_are_errors() {
    let cpu = CpuBackend::new();
    let mut b = ProgramBuilder::new("reads_past_the_end");
    let x = b.buffer(DType::F32, Access::Read);
    let y = b.buffer(DType::F32, Access::Write);
    let i = b.index();
    let ten = b.const_u32(10);
    let j = b.add(i, ten);
    let v = b.load(x, j);
    b.store(y, i, v);
    let k = cpu.compile(&b.build().unwrap()).unwrap();
    let (xb, yb) = (
        cpu.alloc(DType::F32, 12).unwrap(),
        cpu.alloc(DType::F32, 12).unwrap(),
    );
    let err = cpu.launch(&k, &[&xb, &yb], 4).unwrap_err();
    assert!(
        matches!(
            err,
            Error::IndexOutOfRange {
                index: 12,
                bound: 12,
                ..
            }
        ),
        "{err}"
    );
    let err = cpu.launch(&k, &[&xb], 4).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    let ub = cpu.alloc(DType::U32, 12).unwrap();
    assert!(cpu.launch(&k, &[&xb, &ub], 2).is_err());
    // Compiling the same structure again is a cache hit.
    let before = cpu.cached_kernels();
    let mut b2 = ProgramBuilder::new("same_structure_other_name");
    let x2 = b2.buffer(DType::F32, Access::Read);
    let y2 = b2.buffer(DType::F32, Access::Write);
    let i2 = b2.index();
    let t2 = b2.const_u32(10);
    let j2 = b2.add(i2, t2);
    let v2 = b2.load(x2, j2);
    b2.store(y2, i2, v2);
    cpu.compile(&b2.build().unwrap()).unwrap();
    assert_eq!(cpu.cached_kernels(), before);
}

#[test]
fn bad_selection_inputs_are_errors_that_write_nothing() {
    hal_parity::device_checks::bad_selection_inputs_are_errors(&CpuBackend::new(), true);
}
