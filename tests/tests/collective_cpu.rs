//! The CPU reference's collectives (threads of one process) against float64 on the host, and
//! their errors: every case of `hal_parity::collective` on groups of 1 to 4 ranks.

use backend_cpu::{CpuBackend, CpuCommunicator};
use hal::collective::{CollectiveOp, Communicator};
use hal::{Backend, BackendExt, DType, Error, Layout, View};
use hal_parity::collective::{Case, Kind, cases, check_group, check_rank, run_rank};
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(60);

#[test]
fn every_collective_matches_float64_on_1_to_4_ranks() {
    let seed = hal_parity::fresh_seed("COLLECTIVE_SEED");
    for size in 1..=4 {
        let mut group = CpuCommunicator::group(size).unwrap();
        // 0, 1, odd, and more than one chunk of the reference's loop (16K elements).
        let cases = cases(size, &[0, 1, 37, 20_011]);
        let (passed, failures) = check_group(&mut group, seed, &cases, TIMEOUT);
        assert!(
            failures.is_empty(),
            "{} failures, first: {}",
            failures.len(),
            failures[0]
        );
        assert_eq!(passed, cases.len());
    }
}

#[test]
fn the_check_sees_a_wrong_element() {
    let seed = 11;
    let mut group = CpuCommunicator::group(3).unwrap();
    let case = Case {
        kind: Kind::AllReduce(CollectiveOp::Sum),
        dtype: DType::F32,
        n: 9,
        offset: 2,
        in_place: false,
        special: false,
    };
    let results: Vec<Vec<u8>> = std::thread::scope(|s| {
        let hs: Vec<_> = group
            .iter_mut()
            .map(|c| s.spawn(move || run_rank(&*c, seed, &case, TIMEOUT).unwrap()))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    check_rank(seed, &case, 3, 1, &results[1]).unwrap();
    let mut wrong = results[1].clone();
    // Element 4 of recv (recv starts at offset + 1 = 3): one ulp off.
    let at = (3 + 4) * 4;
    let v = f32::from_le_bytes(wrong[at..at + 4].try_into().unwrap());
    wrong[at..at + 4].copy_from_slice(&f32::from_bits(v.to_bits() + 1000).to_le_bytes());
    assert!(check_rank(seed, &case, 3, 1, &wrong).is_err());
    // A guard written past recv.
    let mut stray = results[1].clone();
    let end = stray.len();
    stray[end - 4..].copy_from_slice(&1.0f32.to_le_bytes());
    assert!(check_rank(seed, &case, 3, 1, &stray).is_err());
}

/// Runs `f(rank, comm)` on each rank's thread and returns their results.
fn on_ranks<T: Send>(
    group: &mut [CpuCommunicator],
    f: impl Fn(usize, &CpuCommunicator) -> T + Sync,
) -> Vec<T> {
    std::thread::scope(|s| {
        let f = &f;
        let hs: Vec<_> = group
            .iter_mut()
            .enumerate()
            .map(|(r, c)| s.spawn(move || f(r, &*c)))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn ranks_that_disagree_all_fail_and_nothing_hangs() {
    let mut group = CpuCommunicator::group(3).unwrap();
    let outcomes = on_ranks(&mut group, |rank, c| {
        let be = c.backend();
        let n = if rank == 2 { 5 } else { 4 };
        let x = be.upload(&vec![1.0f32; n]).unwrap();
        let y = be.alloc(DType::F32, n).unwrap();
        let l = Layout::contiguous(&[n]);
        c.all_reduce(CollectiveOp::Sum, View::new(&x, &l), View::new(&y, &l))
    });
    for o in &outcomes {
        match o {
            Err(Error::InvalidArgument { detail, .. }) => assert!(detail.contains("disagree")),
            other => panic!("expected a disagreement error, got {other:?}"),
        }
    }
    // The group still works afterwards.
    let sums = on_ranks(&mut group, |rank, c| {
        let be = c.backend();
        let x = be.upload(&[rank as f32, 1.0]).unwrap();
        let l = Layout::contiguous(&[2]);
        c.all_reduce(CollectiveOp::Sum, View::new(&x, &l), View::new(&x, &l))
            .unwrap();
        be.read::<f32>(&x).unwrap()
    });
    assert!(sums.iter().all(|s| s == &[3.0, 3.0]));
}

#[test]
fn bad_operands_are_refused_before_anything_runs() {
    let cpu = CpuBackend::new();
    let group = CpuCommunicator::group(2).unwrap();
    let c = &group[0];
    let x = cpu.upload(&[1.0f32; 8]).unwrap();
    let y = cpu.alloc(DType::F32, 8).unwrap();
    let l4 = Layout::contiguous(&[4]);
    let mut shifted = Layout::contiguous(&[4]);
    shifted.offset = 2;
    // Partly overlapping send and recv of one buffer.
    assert!(matches!(
        c.all_reduce(
            CollectiveOp::Sum,
            View::new(&x, &l4),
            View::new(&x, &shifted)
        ),
        Err(Error::InvalidArgument { .. })
    ));
    // Not contiguous.
    let strided = Layout::strided(&[4], &[2], 0).unwrap();
    assert!(matches!(
        c.all_reduce(
            CollectiveOp::Max,
            View::new(&x, &strided),
            View::new(&y, &l4)
        ),
        Err(Error::InvalidArgument { .. })
    ));
    // Counts out of ratio, a root that is no rank, dtypes that differ, a view past its buffer.
    assert!(matches!(
        c.all_gather(View::new(&x, &l4), View::new(&y, &l4)),
        Err(Error::ShapeMismatch { .. })
    ));
    assert!(matches!(
        c.reduce_scatter(CollectiveOp::Sum, View::new(&x, &l4), View::new(&y, &l4)),
        Err(Error::ShapeMismatch { .. })
    ));
    assert!(matches!(
        c.broadcast(2, View::new(&x, &l4), View::new(&y, &l4)),
        Err(Error::InvalidArgument { .. })
    ));
    let z = cpu.alloc(DType::I32, 8).unwrap();
    assert!(matches!(
        c.all_reduce(CollectiveOp::Sum, View::new(&x, &l4), View::new(&z, &l4)),
        Err(Error::DTypeMismatch { .. })
    ));
    let l9 = Layout::contiguous(&[9]);
    assert!(
        c.all_reduce(CollectiveOp::Sum, View::new(&x, &l9), View::new(&x, &l9))
            .is_err()
    );
    // None of it wrote anything.
    assert_eq!(cpu.read::<f32>(&x).unwrap(), vec![1.0; 8]);
    assert_eq!(cpu.read::<f32>(&y).unwrap(), vec![0.0; 8]);
}

#[test]
fn a_peer_that_never_calls_or_leaves_fails_the_call() {
    let group = CpuCommunicator::group_with_timeout(2, Duration::from_millis(200)).unwrap();
    let be = group[0].backend().clone();
    let x = be.upload(&[1.0f32; 3]).unwrap();
    let l = Layout::contiguous(&[3]);
    let started = std::time::Instant::now();
    let r = group[0].all_reduce(CollectiveOp::Sum, View::new(&x, &l), View::new(&x, &l));
    assert!(matches!(r, Err(Error::Backend { .. })), "{r:?}");
    assert!(started.elapsed() < Duration::from_secs(10));
    // Rank 1 leaves: rank 0's next call fails at once, whatever the timeout.
    let mut group = group;
    let rank1 = group.pop().unwrap();
    drop(rank1);
    let r = group[0].all_reduce(CollectiveOp::Sum, View::new(&x, &l), View::new(&x, &l));
    match r {
        Err(Error::InvalidArgument { detail, .. }) => assert!(detail.contains("left")),
        other => panic!("{other:?}"),
    }
    assert_eq!(be.read::<f32>(&x).unwrap(), vec![1.0; 3]);
}

#[test]
fn a_rank_that_leaves_while_a_peer_waits_wakes_it() {
    let mut group = CpuCommunicator::group(2).unwrap();
    let rank1 = group.pop().unwrap();
    let rank0 = group.pop().unwrap();
    let waiter = std::thread::spawn(move || {
        let be = rank0.backend().clone();
        let x = be.upload(&[2.0f64; 5]).unwrap();
        let l = Layout::contiguous(&[5]);
        rank0.all_reduce(CollectiveOp::Sum, View::new(&x, &l), View::new(&x, &l))
    });
    std::thread::sleep(Duration::from_millis(50));
    drop(rank1);
    let r = waiter.join().unwrap();
    assert!(matches!(r, Err(Error::InvalidArgument { .. })), "{r:?}");
}
