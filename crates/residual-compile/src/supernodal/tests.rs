//! Tests of the parallel factorisation against faer's, and the test matrix other modules
//! share.

use super::*;
use faer::sparse::linalg::cholesky::{LltRef, SymmetricOrdering, factorize_symbolic_cholesky};
use faer::sparse::{SparseColMatRef, SymbolicSparseColMat};
use faer::{Conj, Side};

/// Uniform in [-1, 1): `hal`'s counter-based generator, one counter per draw.
fn uniform(counter: &mut u64, seed: u64) -> f64 {
    *counter += 1;
    let range = hal::Distribution::Uniform {
        low: -1.0,
        high: 1.0,
    };
    hal::random::random_value(range, seed, *counter) as f64
}

/// The lower triangle of a symmetric matrix over a `side` x `side` grid with 3 unknowns
/// per node, coupled to the 8 neighbours (a surface mesh's normal equations look alike);
/// diagonally dominant by `margin` (negative: not positive definite).
pub(crate) fn grid_matrix(
    side: usize,
    seed: u64,
    margin: f64,
) -> (SymbolicSparseColMat<u32>, Vec<f64>) {
    let nodes = side * side;
    let n = 3 * nodes;
    let mut counter = 0u64;
    let mut columns: Vec<Vec<(u32, f64)>> = vec![Vec::new(); n];
    for y in 0..side {
        for x in 0..side {
            let a = y * side + x;
            for (dx, dy) in [(0i64, 0i64), (1, 0), (-1, 1), (0, 1), (1, 1)] {
                let (nx, ny) = (x as i64 + dx, y as i64 + dy);
                if nx < 0 || ny < 0 || nx >= side as i64 || ny >= side as i64 {
                    continue;
                }
                let b = ny as usize * side + nx as usize;
                for i in 0..3 {
                    for j in 0..3 {
                        let (r, c) = (3 * b + i, 3 * a + j);
                        if r > c {
                            columns[c].push((r as u32, uniform(&mut counter, seed)));
                        }
                    }
                }
            }
        }
    }
    let mut row_sums = vec![0f64; n];
    for (c, column) in columns.iter().enumerate() {
        for &(r, v) in column {
            row_sums[r as usize] += v.abs();
            row_sums[c] += v.abs();
        }
    }
    let (mut col_ptr, mut rows, mut values) = (vec![0u32], Vec::new(), Vec::new());
    for (c, column) in columns.iter_mut().enumerate() {
        column.sort_by_key(|&(r, _)| r);
        rows.push(c as u32);
        values.push(row_sums[c] + margin);
        for &(r, v) in column.iter() {
            rows.push(r);
            values.push(v);
        }
        col_ptr.push(rows.len() as u32);
    }
    (
        SymbolicSparseColMat::new_checked(n, n, col_ptr, None, rows),
        values,
    )
}

fn analyse(pattern: &SymbolicSparseColMat<u32>) -> SymbolicCholesky<u32> {
    analyse_by(pattern, SymmetricOrdering::Amd)
}

fn analyse_by(
    pattern: &SymbolicSparseColMat<u32>,
    ordering: SymmetricOrdering<'_, u32>,
) -> SymbolicCholesky<u32> {
    factorize_symbolic_cholesky(pattern.as_ref(), Side::Lower, ordering, Default::default())
        .expect("symbolic analysis")
}

/// The analysis under METIS's nested dissection (`crate::ordering`).
fn analyse_dissected(pattern: &SymbolicSparseColMat<u32>) -> SymbolicCholesky<u32> {
    let order = crate::ordering::Compressed::from_pattern(pattern.as_ref())
        .nested_dissection()
        .expect("an order");
    let inverse = crate::ordering::inverse(&order);
    let perm = faer::perm::PermRef::new_checked(&order, &inverse, order.len());
    analyse_by(pattern, SymmetricOrdering::Custom(perm))
}

fn factor_on(
    threads: usize,
    parallel: &mut ParallelCholesky,
    values: &[f64],
    len: usize,
) -> Result<Vec<f64>, usize> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    let mut factor = vec![0.0; len];
    pool.install(|| parallel.factorize(values, &mut factor))?;
    Ok(factor)
}

#[test]
fn solves_like_faer_and_the_same_on_any_thread_count() {
    let (pattern, values) = grid_matrix(40, 0x5eed, 1.0);
    solves_like_faer(&pattern, &values, &analyse(&pattern));
    solves_like_faer(&pattern, &values, &analyse_dissected(&pattern));
}

fn solves_like_faer(
    pattern: &SymbolicSparseColMat<u32>,
    values: &[f64],
    symbolic: &SymbolicCholesky<u32>,
) {
    let mut parallel =
        ParallelCholesky::new(pattern.as_ref(), symbolic).expect("a supernodal analysis");
    assert!(
        parallel.task_children.iter().any(|&c| c > 1),
        "the test matrix should give a task tree with branches"
    );
    let one = factor_on(1, &mut parallel, values, symbolic.len_val()).unwrap();
    let four = factor_on(4, &mut parallel, values, symbolic.len_val()).unwrap();
    assert!(one == four, "the factor depends on the thread count");

    // faer's own factor of the same matrix, and both solves of one right-hand side.
    let n = pattern.nrows();
    let mut reference = vec![0.0; symbolic.len_val()];
    let mut scratch = MemBuffer::new(
        symbolic
            .factorize_numeric_llt_scratch::<f64>(Par::Seq, Default::default())
            .or(symbolic.solve_in_place_scratch::<f64>(1, Par::Seq)),
    );
    symbolic
        .factorize_numeric_llt::<f64>(
            &mut reference,
            SparseColMatRef::new(pattern.as_ref(), values),
            Side::Lower,
            Default::default(),
            Par::Seq,
            MemStack::new(&mut scratch),
            Default::default(),
        )
        .unwrap();
    let scale = reference.iter().fold(0f64, |m, v| m.max(v.abs()));
    let worst = one
        .iter()
        .zip(&reference)
        .fold(0f64, |m, (a, b)| m.max((a - b).abs()));
    assert!(
        worst <= 1e-12 * scale,
        "factor differs from faer's by {worst:e} (scale {scale:e})"
    );

    let mut counter = 0u64;
    let rhs: Vec<f64> = (0..n).map(|_| uniform(&mut counter, 99)).collect();
    let mut ours = rhs.clone();
    LltRef::new(symbolic, &one).solve_in_place_with_conj(
        Conj::No,
        MatMut::from_column_major_slice_mut(&mut ours, n, 1),
        Par::Seq,
        MemStack::new(&mut scratch),
    );
    let mut theirs = rhs.clone();
    LltRef::new(symbolic, &reference).solve_in_place_with_conj(
        Conj::No,
        MatMut::from_column_major_slice_mut(&mut theirs, n, 1),
        Par::Seq,
        MemStack::new(&mut scratch),
    );
    // And the residual A x - b of ours, from the lower triangle.
    let mut ax = vec![0f64; n];
    for c in 0..n {
        let range = pattern.col_ptr()[c] as usize..pattern.col_ptr()[c + 1] as usize;
        for (&r, &v) in pattern.row_idx()[range.clone()].iter().zip(&values[range]) {
            let r = r as usize;
            ax[r] += v * ours[c];
            if r != c {
                ax[c] += v * ours[r];
            }
        }
    }
    let residual = ax
        .iter()
        .zip(&rhs)
        .fold(0f64, |m, (a, b)| m.max((a - b).abs()));
    assert!(residual < 1e-10, "|A x - b| = {residual:e}");
    let gap = ours
        .iter()
        .zip(&theirs)
        .fold(0f64, |m, (a, b)| m.max((a - b).abs()));
    assert!(gap < 1e-10, "solutions differ by {gap:e}");
}

/// Supernodes wide enough that their dense work runs on rayon (`dense_par`), on more
/// threads than tasks can keep busy: a thread waiting inside faer's parallel product
/// runs another task of the factorisation. It once found its scratch still borrowed
/// there and panicked (seen on a 16-core host with sphere2500).
#[test]
fn nested_tasks_on_a_waiting_thread_do_not_panic() {
    // Four disconnected grids: their wide supernodes are in flight at once, so a thread
    // in one's parallel product has the others' tasks to steal.
    let (one, one_values) = grid_matrix(60, 0xfeed, 1.0);
    let (n1, nnz1) = (one.nrows(), one.row_idx().len());
    let (mut col_ptr, mut rows, mut values) = (vec![0u32], Vec::new(), Vec::new());
    for copy in 0..4u32 {
        for c in 0..n1 {
            for k in one.col_ptr()[c] as usize..one.col_ptr()[c + 1] as usize {
                rows.push(one.row_idx()[k] + copy * n1 as u32);
            }
            values.extend_from_slice(
                &one_values[one.col_ptr()[c] as usize..one.col_ptr()[c + 1] as usize],
            );
            col_ptr.push(col_ptr.last().unwrap() + (one.col_ptr()[c + 1] - one.col_ptr()[c]));
        }
    }
    assert_eq!(rows.len(), 4 * nnz1);
    let pattern = SymbolicSparseColMat::new_checked(4 * n1, 4 * n1, col_ptr, None, rows);
    let symbolic = analyse(&pattern);
    let mut parallel =
        ParallelCholesky::new(pattern.as_ref(), &symbolic).expect("a supernodal analysis");
    assert!(
        parallel.max_width.pow(3) / 3 >= PARALLEL_DENSE_MIN,
        "the widest supernode ({}) should take the parallel dense path",
        parallel.max_width
    );
    let first = factor_on(8, &mut parallel, &values, symbolic.len_val()).unwrap();
    for _ in 0..4 {
        let again = factor_on(8, &mut parallel, &values, symbolic.len_val()).unwrap();
        assert!(again == first, "the factor changed between runs");
    }
}

#[test]
fn indefinite_matrix_names_a_column() {
    let (pattern, mut values) = grid_matrix(40, 7, 1.0);
    let symbolic = analyse(&pattern);
    let mut parallel =
        ParallelCholesky::new(pattern.as_ref(), &symbolic).expect("a supernodal analysis");
    // Make one diagonal entry negative: its column (in the permuted order) or an earlier
    // one must fail.
    values[pattern.col_ptr()[100] as usize] = -1.0;
    let failed = factor_on(2, &mut parallel, &values, symbolic.len_val());
    assert!(
        matches!(failed, Err(c) if c < pattern.nrows()),
        "{failed:?}"
    );
}
