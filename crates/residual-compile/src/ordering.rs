//! The fill-reducing ordering of the CPU solver's sparse Cholesky factorisation.
//!
//! faer orders by approximate minimum degree (AMD), which suits chains and small meshes
//! (manhattan, parking-garage, intel) but on a pose graph that closes loops all over a
//! surface (torus3D) leaves a third more flops than nested dissection. So the analysis is
//! made both ways and the cheaper factorisation kept, as CHOLMOD does when it tries several
//! orderings: AMD (faer's), and nested dissection by METIS (`METIS_NodeND`, native builds
//! only; it is C).
//!
//! METIS orders a compressed graph: columns with the same pattern (a pose's six tangent
//! coordinates, a point's three) become one vertex weighted by their count, so it partitions
//! poses, not coordinates, and the columns of one vertex stay together in the order.

use faer::sparse::SymbolicSparseColMatRef;
use faer::sparse::linalg::cholesky::{SymbolicCholesky, SymbolicCholeskyRaw};

/// The factorisation's cost for an analysis: `sum over columns of |column of L|^2`, counted
/// over faer's supernodes (their stored zeros included, as they are computed); the factor's
/// length where the analysis is simplicial.
pub(crate) fn factor_flops(symbolic: &SymbolicCholesky<u32>) -> f64 {
    match symbolic.raw() {
        SymbolicCholeskyRaw::Supernodal(sn) => {
            let (begin, end) = (sn.supernode_begin(), sn.supernode_end());
            let rows = sn.col_ptr_for_row_idx();
            (0..sn.n_supernodes())
                .map(|s| {
                    crate::supernodal::supernode_cost(
                        (end[s] - begin[s]) as usize,
                        (rows[s + 1] - rows[s]) as usize,
                    )
                })
                .sum()
        }
        SymbolicCholeskyRaw::Simplicial(_) => symbolic.len_val() as f64,
    }
}

/// Columns grouped by identical patterns: `(group of each column, the number of groups)`,
/// from each column's `closed` neighbourhood (its neighbours and itself, sorted). Two
/// columns are in one group when those agree.
fn supervariables(closed: &[Vec<u32>]) -> (Vec<u32>, usize) {
    let mut by_pattern: std::collections::HashMap<&[u32], u32> = Default::default();
    let mut group = vec![0u32; closed.len()];
    let mut groups = 0u32;
    for (c, list) in closed.iter().enumerate() {
        group[c] = *by_pattern.entry(list.as_slice()).or_insert_with(|| {
            groups += 1;
            groups - 1
        });
    }
    (group, groups as usize)
}

/// Each column's closed neighbourhood in the full symmetric pattern: its neighbours and
/// itself, sorted.
fn closed_neighbourhoods(lower: SymbolicSparseColMatRef<'_, u32>) -> Vec<Vec<u32>> {
    let n = lower.ncols();
    let (col_ptr, rows) = (lower.col_ptr(), lower.row_idx());
    let mut closed: Vec<Vec<u32>> = (0..n as u32).map(|c| vec![c]).collect();
    for c in 0..n {
        for &r in &rows[col_ptr[c] as usize..col_ptr[c + 1] as usize] {
            if r as usize != c {
                closed[c].push(r);
                closed[r as usize].push(c as u32);
            }
        }
    }
    closed.iter_mut().for_each(|list| list.sort_unstable());
    closed
}

/// The inverse of a permutation `order` (`order[new] = old`): `inverse[old] = new`.
pub(crate) fn inverse(order: &[u32]) -> Vec<u32> {
    let mut inverse = vec![0u32; order.len()];
    for (new, &old) in order.iter().enumerate() {
        inverse[old as usize] = new as u32;
    }
    inverse
}

/// Graphs with fewer vertices than this are left to AMD (METIS has nothing to gain there).
const DISSECTION_MIN_VERTICES: usize = 256;

/// A nested-dissection order of `lower`'s columns (`order[new] = old`), or `None` where the
/// compressed graph is too small to gain from it or METIS is not built (wasm32).
pub(crate) fn nested_dissection(lower: SymbolicSparseColMatRef<'_, u32>) -> Option<Vec<u32>> {
    if cfg!(target_arch = "wasm32") {
        return None;
    }
    let closed = closed_neighbourhoods(lower);
    let (group, groups) = supervariables(&closed);
    if groups < DISSECTION_MIN_VERTICES {
        return None;
    }
    // The compressed graph: one vertex per group, weighted by its columns.
    let mut members: Vec<Vec<u32>> = vec![Vec::new(); groups];
    for (c, &g) in group.iter().enumerate() {
        members[g as usize].push(c as u32);
    }
    let mut xadj = Vec::with_capacity(groups + 1);
    let mut adjacency = Vec::new();
    xadj.push(0i32);
    for list in &members {
        // Every member has the same neighbourhood; the first's, as groups, its own excluded.
        let g = group[list[0] as usize];
        let mut adjacent: Vec<u32> = closed[list[0] as usize]
            .iter()
            .map(|&c| group[c as usize])
            .filter(|&h| h != g)
            .collect();
        adjacent.sort_unstable();
        adjacent.dedup();
        adjacency.extend(adjacent.iter().map(|&h| h as i32));
        xadj.push(i32::try_from(adjacency.len()).ok()?);
    }
    if adjacency.is_empty() {
        // No edges: nothing to dissect (and the order is immaterial).
        return None;
    }
    let weights: Vec<i32> = members.iter().map(|m| m.len() as i32).collect();
    let group_order = metis_node_nd(xadj, adjacency, weights)?;
    Some(
        group_order
            .iter()
            .flat_map(|&g| members[g as usize].iter().copied())
            .collect(),
    )
}

/// `METIS_NodeND` on a graph in CSR form (no self loops, both directions): `order[new] =
/// old`, or `None` when METIS reports an error.
#[cfg(not(target_arch = "wasm32"))]
fn metis_node_nd(
    mut xadj: Vec<i32>,
    mut adjacency: Vec<i32>,
    mut weights: Vec<i32>,
) -> Option<Vec<u32>> {
    use metis_sys as m;
    let mut n = i32::try_from(weights.len()).ok()?;
    let mut options = [0 as m::idx_t; m::METIS_NOPTIONS as usize];
    let mut order = vec![0 as m::idx_t; weights.len()];
    let mut inverse = vec![0 as m::idx_t; weights.len()];
    // SAFETY: every array is as long as METIS reads or writes: `options` METIS_NOPTIONS,
    // `xadj` n + 1 with offsets into `adjacency`, which holds vertex indices below n,
    // `weights`, `order` and `inverse` n each; METIS keeps no pointer after returning.
    let status = unsafe {
        if m::METIS_SetDefaultOptions(options.as_mut_ptr()) != m::rstatus_et_METIS_OK {
            return None;
        }
        options[m::moptions_et_METIS_OPTION_NUMBERING as usize] = 0;
        m::METIS_NodeND(
            &mut n,
            xadj.as_mut_ptr(),
            adjacency.as_mut_ptr(),
            weights.as_mut_ptr(),
            options.as_mut_ptr(),
            order.as_mut_ptr(),
            inverse.as_mut_ptr(),
        )
    };
    (status == m::rstatus_et_METIS_OK).then(|| order.iter().map(|&v| v as u32).collect())
}

#[cfg(target_arch = "wasm32")]
fn metis_node_nd(_: Vec<i32>, _: Vec<i32>, _: Vec<i32>) -> Option<Vec<u32>> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use faer::Side;
    use faer::sparse::SymbolicSparseColMat;
    use faer::sparse::linalg::cholesky::{SymmetricOrdering, factorize_symbolic_cholesky};

    /// The lower pattern of a `side` x `side` grid of nodes with three columns each
    /// (`supernodal`'s test matrix).
    fn grid(side: usize) -> SymbolicSparseColMat<u32> {
        crate::supernodal::tests::grid_matrix(side, 1, 1.0).0
    }

    fn flops_by(pattern: &SymbolicSparseColMat<u32>, ordering: SymmetricOrdering<'_, u32>) -> f64 {
        let symbolic = factorize_symbolic_cholesky(
            pattern.as_ref(),
            Side::Lower,
            ordering,
            Default::default(),
        )
        .expect("analysis");
        factor_flops(&symbolic)
    }

    #[test]
    fn supervariables_are_the_grid_nodes() {
        let pattern = grid(9);
        let (group, groups) = supervariables(&closed_neighbourhoods(pattern.as_ref()));
        assert_eq!(groups, 81);
        for (c, &g) in group.iter().enumerate() {
            assert_eq!(g, group[c / 3 * 3], "column {c} apart from its node");
        }
        // (No two nodes share a group: their neighbours differ.)
    }

    #[test]
    fn dissection_orders_every_column_once_keeping_nodes_whole_and_fills_less() {
        let pattern = grid(60);
        let order = nested_dissection(pattern.as_ref()).expect("an order");
        let mut seen = vec![false; pattern.ncols()];
        for &c in &order {
            assert!(!std::mem::replace(&mut seen[c as usize], true), "{c} twice");
        }
        assert!(seen.iter().all(|&s| s), "a column missing");
        for node in order.chunks_exact(3) {
            assert!(
                node.iter().all(|&c| c / 3 == node[0] / 3),
                "a node's columns apart: {node:?}"
            );
        }
        let inverse = inverse(&order);
        let perm = faer::perm::PermRef::new_checked(&order, &inverse, order.len());
        let dissected = flops_by(&pattern, SymmetricOrdering::Custom(perm));
        let amd = flops_by(&pattern, SymmetricOrdering::Amd);
        assert!(
            dissected < amd,
            "nested dissection {dissected:e} flops, AMD {amd:e}, on a 60 x 60 grid"
        );
    }

    #[test]
    fn a_graph_without_edges_is_left_to_amd() {
        let n = 1000;
        let diagonal = SymbolicSparseColMat::new_checked(
            n,
            n,
            (0..=n as u32).collect(),
            None,
            (0..n as u32).collect(),
        );
        assert!(nested_dissection(diagonal.as_ref()).is_none());
    }

    #[test]
    fn small_graphs_are_left_to_amd() {
        assert!(nested_dissection(grid(10).as_ref()).is_none());
    }
}
