//! What the device Schur engines find out on the host, once: each residual shape's layout
//! (which of its columns are reduced, which eliminated) and, for the iterative engine, a
//! partition of the reduced columns into the preconditioner's blocks.

use super::kernels::{FIXED, Layout as Shape};
use crate::problem::Problem;

/// A group's [`Shape`] (every instance alike), and per instance its eliminated block
/// (`u32::MAX` for none) and reduced columns.
pub(super) struct GroupLayout {
    pub shape: Shape,
    pub blocks: Vec<u32>,
    pub rcols: Vec<u32>,
}

/// Every group's [`GroupLayout`]; an error where instances of one group differ.
pub(super) fn shapes(
    problem: &Problem,
    tangent: &crate::TangentSpace,
    first: usize,
    size: usize,
    count: usize,
    reduced_of: &[u32],
) -> Result<Vec<GroupLayout>, String> {
    let range = first..first + size * count;
    let mut out = Vec::new();
    for g in problem.groups() {
        let (p, slots) = (g.params_per_instance(), g.slots_per_instance());
        let mut shape: Option<Shape> = None;
        let mut blocks = Vec::with_capacity(g.len());
        let mut rcols = Vec::with_capacity(g.len() * p);
        for inst in g.param_index.chunks_exact(slots) {
            let mut eliminated = vec![usize::MAX; size];
            let mut reduced = Vec::new();
            let mut block = u32::MAX;
            for (pos, &index) in inst[..p].iter().enumerate() {
                let index = index as usize;
                if range.contains(&index) {
                    let k = index - first;
                    block = (k / size) as u32;
                    eliminated[k % size] = pos;
                } else {
                    reduced.push(pos);
                    rcols.push(reduced_of[tangent.col(index as u32) as usize]);
                }
            }
            let eliminated = if block == u32::MAX {
                Vec::new()
            } else if eliminated.contains(&usize::MAX) {
                return Err(format!(
                    "group {} reads part of an eliminated block; the device Schur engine \
                     takes whole blocks",
                    g.name
                ));
            } else {
                eliminated
            };
            let this = Shape {
                p,
                r: g.residuals_per_instance(),
                reduced,
                eliminated,
            };
            match &shape {
                None => shape = Some(this),
                Some(s) if *s == this => {}
                Some(_) => {
                    return Err(format!(
                        "the instances of group {} read their parameters in different roles",
                        g.name
                    ));
                }
            }
            blocks.push(block);
        }
        if let Some(shape) = shape {
            let nr = shape.reduced.len();
            rcols.truncate(g.len() * nr);
            out.push(GroupLayout {
                shape,
                blocks,
                rcols,
            });
        } else {
            out.push(GroupLayout {
                shape: Shape {
                    p,
                    r: g.residuals_per_instance(),
                    reduced: Vec::new(),
                    eliminated: Vec::new(),
                },
                blocks: Vec::new(),
                rcols: Vec::new(),
            });
        }
    }
    Ok(out)
}

/// The block-Jacobi preconditioner's blocks: runs of consecutive reduced columns, each the
/// union of the runs that residual instances read together (a camera's columns), cut into
/// pieces of at most `max` columns (any partition preconditions; the coupled columns together
/// precondition best). Per block its first column and size.
pub(super) fn partition(layouts: &[GroupLayout], reduced: usize, max: usize) -> Vec<(u32, u32)> {
    // joined[c]: columns c and c + 1 are read together by some instance.
    let mut joined = vec![false; reduced];
    let mut cols = Vec::new();
    for l in layouts {
        let nr = l.shape.reduced.len();
        if nr == 0 {
            continue;
        }
        for inst in l.rcols.chunks_exact(nr) {
            cols.clear();
            cols.extend(inst.iter().copied().filter(|&c| c != FIXED));
            cols.sort_unstable();
            for w in cols.windows(2) {
                if w[1] == w[0] + 1 {
                    joined[w[0] as usize] = true;
                }
            }
        }
    }
    let mut blocks = Vec::new();
    let mut start = 0usize;
    for (c, &with_next) in joined.iter().enumerate() {
        let size = c + 1 - start;
        if !with_next || size == max || c + 1 == reduced {
            blocks.push((start as u32, size as u32));
            start = c + 1;
        }
    }
    blocks
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(nr: usize, rcols: Vec<u32>) -> GroupLayout {
        GroupLayout {
            shape: Shape {
                p: nr,
                r: 1,
                reduced: (0..nr).collect(),
                eliminated: Vec::new(),
            },
            blocks: Vec::new(),
            rcols,
        }
    }

    /// Columns read together form blocks (in any order, fixed ones skipped); long runs are
    /// cut at `max`; columns no instance reads are blocks of their own.
    #[test]
    fn blocks_follow_the_columns_instances_read_together() {
        let a = group(3, vec![2, 0, 1, 4, FIXED, 5]);
        let b = group(2, vec![7, 8, 8, 9]);
        let got = partition(&[a, b], 11, 16);
        assert_eq!(got, vec![(0, 3), (3, 1), (4, 2), (6, 1), (7, 3), (10, 1)]);
        let cut = partition(&[group(2, vec![0, 1, 1, 2, 2, 3, 3, 4])], 5, 2);
        assert_eq!(cut, vec![(0, 2), (2, 2), (4, 1)]);
    }
}
