//! How a residual block's parameter indices become its graph's slots, and the tracing of its
//! closure over them: Euclidean parameters are differentiated slots; a block on a manifold is
//! tangent slots (differentiated, value 0) plus stored-value slots, and the closure sees its
//! `plus` of the two (see [`crate::manifold`]).

use crate::manifold::Manifold;
use crate::trace::{Node, Tape, Var};

/// How a block's parameter indices become graph slots: a Euclidean parameter is a
/// differentiated slot; a manifold block of ambient size `a` and tangent size `t` is `t`
/// tangent slots (differentiated, value 0) and `a` stored-value slots after all the
/// differentiated ones, and the closure sees its `plus` of the two.
#[derive(Clone, Debug)]
pub(crate) struct SlotPlan {
    /// Per slot, the parameter index stored for it (`n_params + n_ambient` of them).
    pub(crate) slots: Vec<u32>,
    pub(crate) n_params: u32,
    pub(crate) n_ambient: u32,
    /// Per manifold block read: where it starts among the block's parameters, its first
    /// tangent slot, its first stored-value slot, and the manifold. Empty for a Euclidean
    /// block.
    manifolds: Vec<(usize, u32, u32, Manifold)>,
}

/// Which manifold block each parameter is in (`Problem::manifold_of`) and the blocks.
#[derive(Clone, Copy)]
pub(crate) struct ManifoldMap<'a> {
    pub(crate) manifold_of: &'a [u32],
    pub(crate) manifolds: &'a [(usize, Manifold)],
}

impl ManifoldMap<'_> {
    fn manifold(&self, index: usize) -> Option<(usize, Manifold)> {
        let id = self.manifold_of[index];
        (id != u32::MAX).then(|| self.manifolds[id as usize])
    }

    /// The slots of a block reading `params` (checked in range and distinct); a manifold
    /// block must be read whole and in order.
    pub(crate) fn plan(&self, params: &[usize]) -> Result<SlotPlan, String> {
        let trivial = params.iter().all(|&p| self.manifold_of[p] == u32::MAX);
        if trivial {
            return Ok(SlotPlan {
                slots: params.iter().map(|&p| p as u32).collect(),
                n_params: params.len() as u32,
                n_ambient: 0,
                manifolds: Vec::new(),
            });
        }
        let mut differentiated = Vec::with_capacity(params.len());
        let mut ambient = Vec::new();
        let mut manifolds = Vec::new();
        let mut k = 0;
        while k < params.len() {
            let p = params[k];
            let Some((first, m)) = self.manifold(p) else {
                differentiated.push(p as u32);
                k += 1;
                continue;
            };
            let a = m.ambient_size();
            let whole =
                p == first && params.len() >= k + a && (0..a).all(|j| params[k + j] == first + j);
            if !whole {
                return Err(format!(
                    "parameter {p} is in the {m:?} block at parameters {first}..{}; a block \
                     on a manifold is read whole and in order",
                    first + a
                ));
            }
            manifolds.push((k, differentiated.len() as u32, ambient.len() as u32, m));
            differentiated.extend((0..m.tangent_size()).map(|j| (first + j) as u32));
            ambient.extend((0..a).map(|j| (first + j) as u32));
            k += a;
        }
        let n_params = differentiated.len() as u32;
        for entry in &mut manifolds {
            entry.2 += n_params;
        }
        let n_ambient = ambient.len() as u32;
        differentiated.extend(ambient);
        Ok(SlotPlan {
            slots: differentiated,
            n_params,
            n_ambient,
            manifolds,
        })
    }
}

/// Traces `f` on `tape` (cleared first) over the slots of `plan` and `nc` constant slots;
/// returns the output node ids.
pub(crate) fn trace_block<F>(
    tape: &Tape,
    plan: &SlotPlan,
    nc: usize,
    f: &F,
) -> Result<Vec<u32>, String>
where
    F: for<'t> Fn(&[Var<'t>], &[Var<'t>]) -> Vec<Var<'t>>,
{
    if plan.manifolds.is_empty() {
        return trace_euclidean(tape, plan.n_params as usize, nc, f);
    }
    tape.clear();
    let (np, na) = (plan.n_params, plan.n_ambient);
    let is_tangent = |k: u32| {
        plan.manifolds
            .iter()
            .any(|&(_, t0, _, m)| (t0..t0 + m.tangent_size() as u32).contains(&k))
    };
    for k in 0..np {
        tape.push(if is_tangent(k) {
            Node::Delta(k)
        } else {
            Node::Param(k)
        });
    }
    for k in np..np + na {
        tape.push(Node::Ambient(k));
    }
    for k in 0..nc {
        tape.push(Node::Const(k as u32));
    }
    let consts: Vec<Var<'_>> = (0..nc).map(|k| tape.var(np + na + k as u32)).collect();
    // The closure's view: Euclidean slots as they are, manifold blocks as `plus`.
    let mut vars: Vec<Var<'_>> = Vec::new();
    let mut next_param = 0u32;
    let mut manifolds = plan.manifolds.iter().peekable();
    while let Some(&&(at, t0, a0, m)) = manifolds.peek() {
        while vars.len() < at {
            vars.push(tape.var(next_param));
            next_param += 1;
        }
        let x: Vec<Var<'_>> = (0..m.ambient_size() as u32)
            .map(|j| tape.var(a0 + j))
            .collect();
        let d: Vec<Var<'_>> = (0..m.tangent_size() as u32)
            .map(|j| tape.var(t0 + j))
            .collect();
        vars.extend(m.trace_plus(&x, &d));
        next_param = t0 + m.tangent_size() as u32;
        manifolds.next();
    }
    while next_param < np {
        vars.push(tape.var(next_param));
        next_param += 1;
    }
    let outputs: Vec<u32> = f(&vars, &consts).iter().map(|v| v.id()).collect();
    if outputs.is_empty() {
        return Err("the closure returned no residuals".into());
    }
    Ok(outputs)
}

/// [`trace_block`] of a block with no manifold: slots are the closure's variables.
fn trace_euclidean<F>(tape: &Tape, np: usize, nc: usize, f: &F) -> Result<Vec<u32>, String>
where
    F: for<'t> Fn(&[Var<'t>], &[Var<'t>]) -> Vec<Var<'t>>,
{
    tape.clear();
    for k in 0..np {
        tape.push(Node::Param(k as u32));
    }
    for k in 0..nc {
        tape.push(Node::Const(k as u32));
    }
    // The slot variables are nodes 0..np+nc; small blocks get them without a heap allocation
    // (tracing runs once per instance).
    const STACK: usize = 32;
    let outputs: Vec<u32> = if np + nc <= STACK {
        let vars: [Var<'_>; STACK] = std::array::from_fn(|k| tape.var(k as u32));
        f(&vars[..np], &vars[np..np + nc])
            .iter()
            .map(|v| v.id())
            .collect()
    } else {
        let vars: Vec<Var<'_>> = (0..np + nc).map(|k| tape.var(k as u32)).collect();
        f(&vars[..np], &vars[np..]).iter().map(|v| v.id()).collect()
    };
    if outputs.is_empty() {
        return Err("the closure returned no residuals".into());
    }
    Ok(outputs)
}
