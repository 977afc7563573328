//! Tuning knobs and switches read once from the environment.

/// A path on unless the environment variable `var` is `0` (a knob for comparisons); read
/// once, into `cell`.
pub(crate) fn switch(cell: &'static std::sync::OnceLock<bool>, var: &str) -> bool {
    *cell.get_or_init(|| std::env::var(var).as_deref() != Ok("0"))
}

/// A tuning knob: the environment variable `var` as a number (at least 1), else `default`;
/// read once, into `cell`.
pub(crate) fn knob(cell: &'static std::sync::OnceLock<usize>, var: &str, default: usize) -> usize {
    *cell.get_or_init(|| {
        std::env::var(var)
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .map_or(default, |n| n.max(1))
    })
}
