//! The fill-reducing ordering of the CPU solver's sparse Cholesky factorisation.
//!
//! Approximate minimum degree (AMD, faer's) suits chains and small meshes (manhattan,
//! parking-garage, intel) but on a pose graph that closes loops all over a surface (torus3D)
//! leaves a third more flops than nested dissection. So the analysis is made both ways and
//! the cheaper factorisation kept, as CHOLMOD does when it tries several orderings: AMD, and
//! nested dissection by METIS (`METIS_NodeND`, native builds only; it is C).
//!
//! Both order a compressed graph ([`Compressed`]): columns with the same pattern (a pose's
//! six tangent coordinates, a point's three) become one vertex (weighted by their count for
//! METIS), so they order poses, not coordinates, and the columns of one vertex stay together.

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

/// Columns gathered into groups that share one pattern (a pose's six tangent columns, a
/// vertex's three), and the graph between the groups: what the orderings work on, and what
/// the scalar pattern is expanded from. Ordering 2,500 poses instead of 15,000 columns is
/// several times cheaper, and keeps each pose's columns together (so in one supernode).
pub(crate) struct Compressed {
    /// Each column's group.
    group: Vec<u32>,
    /// Group `g`'s columns, ascending: `members[member_ptr[g]..member_ptr[g + 1]]`.
    member_ptr: Vec<usize>,
    members: Vec<u32>,
    /// Group `g`'s neighbours, itself excluded, ascending: `adjacent[adjacent_ptr[g]..]`.
    adjacent_ptr: Vec<usize>,
    adjacent: Vec<u32>,
}

impl Compressed {
    /// The groups of `n` columns coupled by `cliques` (CSR: clique `k` is
    /// `columns[clique_ptr[k]..clique_ptr[k + 1]]`, a residual block's free columns, each
    /// once): every pair of columns in one clique is coupled. Columns in exactly the same
    /// cliques form a group; a column in none is a group alone.
    pub(crate) fn from_cliques(n: usize, clique_ptr: &[usize], columns: &[u32]) -> Self {
        // Each column's cliques, as a count and a hash of their indices in order (visited
        // ascending). Equal hashes group columns; were two different sets ever to collide,
        // the group's pattern would only gain stored zeros (the expansion below is a superset
        // of every member's pattern), never lose an entry.
        let mut hash = vec![0u64; n];
        let mut count = vec![0u32; n];
        for (k, clique) in clique_ptr.windows(2).enumerate() {
            for &c in &columns[clique[0]..clique[1]] {
                let h = &mut hash[c as usize];
                *h = (*h ^ (k as u64 + 1))
                    .wrapping_mul(0x9e37_79b9_7f4a_7c15)
                    .rotate_left(29);
                count[c as usize] += 1;
            }
        }
        let mut by_signature: std::collections::HashMap<(u64, u32), u32> = Default::default();
        let mut groups = 0u32;
        let group: Vec<u32> = (0..n)
            .map(|c| {
                let mut fresh = || {
                    groups += 1;
                    groups - 1
                };
                if count[c] == 0 {
                    fresh()
                } else {
                    *by_signature
                        .entry((hash[c], count[c]))
                        .or_insert_with(fresh)
                }
            })
            .collect();
        let mut adjacency: Vec<Vec<u32>> = vec![Vec::new(); groups as usize];
        let mut in_clique = Vec::new();
        for clique in clique_ptr.windows(2) {
            in_clique.clear();
            in_clique.extend(
                columns[clique[0]..clique[1]]
                    .iter()
                    .map(|&c| group[c as usize]),
            );
            in_clique.sort_unstable();
            in_clique.dedup();
            for &a in &in_clique {
                let list = &mut adjacency[a as usize];
                list.extend(in_clique.iter().copied().filter(|&b| b != a));
            }
        }
        Self::assemble(group, adjacency)
    }

    /// The groups of a lower-triangular pattern's columns (tests build their matrices so): those whose closed neighbourhoods
    /// (neighbours and the column itself) agree.
    #[cfg(test)]
    pub(crate) fn from_pattern(lower: SymbolicSparseColMatRef<'_, u32>) -> Self {
        let closed = closed_neighbourhoods(lower);
        let mut by_pattern: std::collections::HashMap<&[u32], u32> = Default::default();
        let mut groups = 0u32;
        let group: Vec<u32> = closed
            .iter()
            .map(|list| {
                *by_pattern.entry(list.as_slice()).or_insert_with(|| {
                    groups += 1;
                    groups - 1
                })
            })
            .collect();
        let mut adjacency: Vec<Vec<u32>> = vec![Vec::new(); groups as usize];
        for (c, list) in closed.iter().enumerate() {
            let g = group[c];
            if adjacency[g as usize].is_empty() {
                // Every member has the same neighbourhood; the first's, as groups.
                adjacency[g as usize] = list
                    .iter()
                    .map(|&r| group[r as usize])
                    .filter(|&h| h != g)
                    .collect();
            }
        }
        Self::assemble(group, adjacency)
    }

    fn assemble(group: Vec<u32>, mut adjacency: Vec<Vec<u32>>) -> Self {
        let groups = adjacency.len();
        let mut member_ptr = vec![0usize; groups + 1];
        for &g in &group {
            member_ptr[g as usize + 1] += 1;
        }
        for g in 0..groups {
            member_ptr[g + 1] += member_ptr[g];
        }
        let mut members = vec![0u32; group.len()];
        let mut next = member_ptr.clone();
        for (c, &g) in group.iter().enumerate() {
            members[next[g as usize]] = c as u32;
            next[g as usize] += 1;
        }
        let mut adjacent_ptr = Vec::with_capacity(groups + 1);
        let mut adjacent = Vec::new();
        adjacent_ptr.push(0);
        for list in &mut adjacency {
            list.sort_unstable();
            list.dedup();
            adjacent.extend_from_slice(list);
            adjacent_ptr.push(adjacent.len());
        }
        Self {
            group,
            member_ptr,
            members,
            adjacent_ptr,
            adjacent,
        }
    }

    /// The number of groups.
    pub(crate) fn groups(&self) -> usize {
        self.member_ptr.len() - 1
    }

    fn members(&self, g: usize) -> &[u32] {
        &self.members[self.member_ptr[g]..self.member_ptr[g + 1]]
    }

    fn adjacent(&self, g: usize) -> &[u32] {
        &self.adjacent[self.adjacent_ptr[g]..self.adjacent_ptr[g + 1]]
    }

    /// The scalar pattern's lower triangle (CSC, rows ascending, the diagonal in every
    /// column): column `c` couples to its group's other columns and every column of the
    /// groups next to its own.
    pub(crate) fn lower_pattern(&self) -> (Vec<u32>, Vec<u32>) {
        let n = self.group.len();
        let mut col_ptr = Vec::with_capacity(n + 1);
        let mut rows = Vec::new();
        col_ptr.push(0u32);
        for c in 0..n as u32 {
            let g = self.group[c as usize] as usize;
            let start = rows.len();
            rows.extend(self.members(g).iter().copied().filter(|&r| r >= c));
            for &h in self.adjacent(g) {
                rows.extend(self.members(h as usize).iter().copied().filter(|&r| r > c));
            }
            rows[start..].sort_unstable();
            col_ptr.push(rows.len() as u32);
        }
        (col_ptr, rows)
    }

    /// The column order of a group order: each group's columns together, ascending.
    fn expand(&self, group_order: impl IntoIterator<Item = u32>) -> Vec<u32> {
        group_order
            .into_iter()
            .flat_map(|g| self.members(g as usize).iter().copied())
            .collect()
    }

    /// An approximate-minimum-degree order of the columns (`order[new] = old`), by faer's AMD
    /// on the graph of groups.
    pub(crate) fn amd_order(&self) -> Result<Vec<u32>, crate::Error> {
        use faer::dyn_stack::{MemBuffer, MemStack};
        use faer::sparse::linalg::amd;
        let groups = self.groups();
        // The groups' lower pattern: each column the group itself, then its later neighbours.
        let mut col_ptr = Vec::with_capacity(groups + 1);
        let mut rows = Vec::new();
        col_ptr.push(0u32);
        for g in 0..groups {
            rows.push(g as u32);
            rows.extend(self.adjacent(g).iter().copied().filter(|&h| h as usize > g));
            col_ptr.push(rows.len() as u32);
        }
        let failed = |what: &str| crate::Error::Solver(format!("AMD ordering failed: {what}"));
        let nnz = rows.len();
        let lower = SymbolicSparseColMatRef::new_checked(groups, groups, &col_ptr, None, &rows);
        let mut order = vec![0u32; groups];
        let mut inverse = vec![0u32; groups];
        let mut scratch = MemBuffer::try_new(amd::order_scratch::<u32>(groups, nnz))
            .map_err(|_| failed("out of memory"))?;
        amd::order(
            &mut order,
            &mut inverse,
            lower,
            amd::Control::default(),
            MemStack::new(&mut scratch),
        )
        .map_err(|e| failed(&format!("{e:?}")))?;
        Ok(self.expand(order))
    }

    /// A nested-dissection order of the columns (`order[new] = old`) by METIS on the graph of
    /// groups, each weighted by its columns; `None` where the graph is too small to gain from
    /// it or METIS is not built (wasm32).
    pub(crate) fn nested_dissection(&self) -> Option<Vec<u32>> {
        let groups = self.groups();
        if cfg!(target_arch = "wasm32") || groups < DISSECTION_MIN_VERTICES {
            return None;
        }
        if self.adjacent.is_empty() {
            // No edges: nothing to dissect (and the order is immaterial).
            return None;
        }
        let xadj = self
            .adjacent_ptr
            .iter()
            .map(|&p| i32::try_from(p).ok())
            .collect::<Option<Vec<i32>>>()?;
        let adjacency = self.adjacent.iter().map(|&h| h as i32).collect();
        let weights = (0..groups).map(|g| self.members(g).len() as i32).collect();
        let group_order = metis_node_nd(xadj, adjacency, weights)?;
        Some(self.expand(group_order))
    }
}

/// Each column's closed neighbourhood in the full symmetric pattern: its neighbours and
/// itself, sorted.
#[cfg(test)]
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
        let compressed = Compressed::from_pattern(pattern.as_ref());
        assert_eq!(compressed.groups(), 81);
        for (c, &g) in compressed.group.iter().enumerate() {
            assert_eq!(
                g,
                compressed.group[c / 3 * 3],
                "column {c} apart from its node"
            );
        }
        // (No two nodes share a group: their neighbours differ.)
        let (col_ptr, rows) = compressed.lower_pattern();
        assert_eq!(col_ptr.as_slice(), pattern.col_ptr(), "expanded pattern");
        assert_eq!(rows.as_slice(), pattern.row_idx(), "expanded pattern");
    }

    /// The cliques of a `side` x `side` grid's edges (each node three columns), as a pose
    /// graph's edges couple two poses.
    fn grid_cliques(side: usize) -> (Vec<usize>, Vec<u32>) {
        let node = |i: usize, j: usize| (i * side + j) as u32 * 3;
        let (mut ptr, mut cols) = (vec![0], Vec::new());
        for i in 0..side {
            for j in 0..side {
                for (a, b) in [(i + 1, j), (i, j + 1)] {
                    if a < side && b < side {
                        for n in [node(i, j), node(a, b)] {
                            cols.extend([n, n + 1, n + 2]);
                        }
                        ptr.push(cols.len());
                    }
                }
            }
        }
        (ptr, cols)
    }

    #[test]
    fn cliques_group_each_node_and_expand_to_the_scalar_pattern() {
        let side = 7;
        let (ptr, cols) = grid_cliques(side);
        // A column in no clique (a parameter no residual touches) is a group alone.
        let n = side * side * 3 + 2;
        let compressed = Compressed::from_cliques(n, &ptr, &cols);
        assert_eq!(compressed.groups(), side * side + 2);
        for c in 0..side * side * 3 {
            assert_eq!(
                compressed.group[c],
                compressed.group[c / 3 * 3],
                "column {c}"
            );
        }
        // The expansion holds exactly the pairs some clique couples, and the diagonal.
        let mut coupled = std::collections::BTreeSet::new();
        for k in 0..ptr.len() - 1 {
            for &a in &cols[ptr[k]..ptr[k + 1]] {
                for &b in &cols[ptr[k]..ptr[k + 1]] {
                    coupled.insert((a.max(b), a.min(b)));
                }
            }
        }
        coupled.extend((0..n as u32).map(|c| (c, c)));
        let (col_ptr, rows) = compressed.lower_pattern();
        let mut expanded = std::collections::BTreeSet::new();
        for c in 0..n {
            let column = &rows[col_ptr[c] as usize..col_ptr[c + 1] as usize];
            assert!(
                column.windows(2).all(|w| w[0] < w[1]),
                "column {c} unsorted"
            );
            expanded.extend(column.iter().map(|&r| (r, c as u32)));
        }
        assert_eq!(expanded, coupled);
        // AMD orders every column once, each node's columns together.
        let order = compressed.amd_order().expect("AMD");
        let mut seen = vec![false; n];
        for &c in &order {
            assert!(!std::mem::replace(&mut seen[c as usize], true), "{c} twice");
        }
        assert!(seen.iter().all(|&s| s), "a column missing");
        let position = inverse(&order);
        for c in 0..side * side * 3 {
            let first = c / 3 * 3;
            assert_eq!(
                position[c] as usize - position[first] as usize,
                c - first,
                "node of column {c} split"
            );
        }
    }

    #[test]
    fn dissection_orders_every_column_once_keeping_nodes_whole_and_fills_less() {
        let pattern = grid(60);
        let compressed = Compressed::from_pattern(pattern.as_ref());
        let order = compressed.nested_dissection().expect("an order");
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
        let amd_order = compressed.amd_order().expect("AMD");
        let amd_inverse = super::inverse(&amd_order);
        let amd_perm = faer::perm::PermRef::new_checked(&amd_order, &amd_inverse, amd_order.len());
        let compressed_amd = flops_by(&pattern, SymmetricOrdering::Custom(amd_perm));
        assert!(
            compressed_amd < 1.1 * amd,
            "AMD on the nodes {compressed_amd:e} flops, on the columns {amd:e}"
        );
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
        assert!(
            Compressed::from_pattern(diagonal.as_ref())
                .nested_dissection()
                .is_none()
        );
    }

    #[test]
    fn small_graphs_are_left_to_amd() {
        let pattern = grid(10);
        assert!(
            Compressed::from_pattern(pattern.as_ref())
                .nested_dissection()
                .is_none()
        );
    }
}
