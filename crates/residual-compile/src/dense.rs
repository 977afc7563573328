//! Small dense linear algebra shared by the solver's Schur engine and the file readers.

/// Cholesky of the small symmetric `n x n` matrix `a` in place, column-major: the lower
/// factor in its lower triangle (the upper is left as it was); the column whose pivot was not
/// positive otherwise. For blocks of a few rows, without a dense library's per-call overhead.
pub(crate) fn small_cholesky(a: &mut [f64], n: usize) -> Result<(), usize> {
    for j in 0..n {
        let mut d = a[j * n + j];
        for k in 0..j {
            d -= a[k * n + j] * a[k * n + j];
        }
        if d.is_nan() || d <= 0.0 {
            return Err(j);
        }
        let d = d.sqrt();
        a[j * n + j] = d;
        for i in j + 1..n {
            let mut v = a[j * n + i];
            for k in 0..j {
                v -= a[k * n + i] * a[k * n + j];
            }
            a[j * n + i] = v / d;
        }
    }
    Ok(())
}

/// Solves `L L^T x = b` in place for the lower Cholesky factor in `l` (`n x n`,
/// column-major).
pub(crate) fn cholesky_solve(l: &[f64], n: usize, b: &mut [f64]) {
    for i in 0..n {
        let mut v = b[i];
        for k in 0..i {
            v -= l[k * n + i] * b[k];
        }
        b[i] = v / l[i * n + i];
    }
    for i in (0..n).rev() {
        let mut v = b[i];
        for k in i + 1..n {
            v -= l[i * n + k] * b[k];
        }
        b[i] = v / l[i * n + i];
    }
}
