//! Gradient clipping by the global norm, over every gradient in a few launches.

use super::grouped::size_groups;
use super::{dense_grad, unique_params};
use crate::error::Result;
use crate::tensor::Tensor;
use hal::ir::expr::{Expr, Scope};
use hal::ir::{Access, BufferId};
use hal::{Backend, DType, DeviceBuffer};

/// Gradients per grouped launch at most; with the accumulator (or the scale) they also stay
/// within the backend's [`hal::Capabilities::program_buffers`].
const CLIP_GROUP: usize = 64;

/// Scales the parameters' gradients so their joint L2 norm is at most `max_norm` and returns
/// the norm before clipping (a one-element device tensor: nothing is read back).
///
/// One pass over the gradients: launches over groups of gradients of similar lengths (as many
/// as a program may bind, up to 64) add each element's square into a per-position
/// accumulator (the group's shorter gradients end early), one reduction sums it, and grouped
/// launches multiply every gradient in place by
/// `min(1, max_norm / (norm + 1e-6))`, computed on the device. The sums run in a fixed
/// order, so a run is repeatable. Gradients are made dense f32 (and set back) first. Where a
/// parameter is not a dense f32 tensor, or two gradients share memory, each gradient is
/// reduced and scaled on its own instead (several launches a parameter).
pub fn clip_grad_norm<B: Backend>(
    params: &[Tensor<B>],
    max_norm: f32,
) -> Result<Option<Tensor<B>>> {
    scale_by_norm(params, &|norm| clip_scale(norm, max_norm))
}

/// The passes of [`clip_grad_norm`] with the factor the gradients are multiplied by computed
/// on the device from their joint norm by `factor` (a one-element tensor); returns the norm
/// before scaling.
pub(super) fn scale_by_norm<B: Backend>(
    params: &[Tensor<B>],
    factor: &dyn Fn(&Tensor<B>) -> Result<Tensor<B>>,
) -> Result<Option<Tensor<B>>> {
    crate::no_grad(|| {
        let params = unique_params(params);
        if params
            .iter()
            .any(|p| p.dtype() != DType::F32 || !p.is_dense())
        {
            return scale_each(&params, factor);
        }
        let mut pairs = Vec::new();
        for p in params.iter() {
            if let Some(g) = dense_grad(p, "clip_grad_norm")? {
                pairs.push((p.clone(), g));
            }
        }
        let Some((first, _)) = pairs.first() else {
            return Ok(None);
        };
        let b = first.backend().clone();
        let grads: Vec<&Tensor<B>> = pairs.iter().map(|(_, g)| g).collect();
        let shared = (0..grads.len())
            .any(|i| (0..i).any(|j| grads[i].buffer().same_memory(grads[j].buffer())));
        if shared {
            return scale_each(&params, factor);
        }
        let longest = grads.iter().map(|g| g.numel()).max().unwrap_or(0);
        let squares = Tensor::for_write(&b, &[longest.max(1)], DType::F32)?;
        if longest == 0 {
            squares.backend().fill(squares.view(), 0.0)?;
        }
        let per_launch = CLIP_GROUP
            .min(b.capabilities().program_buffers.saturating_sub(1))
            .max(1);
        // Groups of similar lengths, the longest first: the first launch writes every
        // position of `squares`, later ones add over their own longest member's length.
        let lens: Vec<usize> = grads.iter().map(|g| g.numel()).collect();
        let groups = size_groups(&lens, per_launch);
        for (k, group) in groups.iter().enumerate() {
            let group_lens: Vec<usize> = group.iter().map(|&i| lens[i]).collect();
            let reach = group_lens[0];
            let kernel = b.compile(&sum_squares_program(&group_lens, reach, k == 0)?)?;
            let mut args: Vec<&B::Buffer> = group.iter().map(|&i| grads[i].buffer()).collect();
            args.push(squares.buffer());
            b.launch(&kernel, &args, reach)?;
        }
        let norm = squares.sum_all()?.sqrt()?;
        let scale = factor(&norm)?;
        for group in &groups {
            let group_lens: Vec<usize> = group.iter().map(|&i| lens[i]).collect();
            let kernel = b.compile(&scale_program(&group_lens)?)?;
            let mut args: Vec<&B::Buffer> = group.iter().map(|&i| grads[i].buffer()).collect();
            args.push(scale.buffer());
            b.launch(&kernel, &args, group_lens[0])?;
        }
        for (p, g) in pairs {
            p.set_grad(Some(g));
        }
        Ok(Some(norm))
    })
}

/// `min(1, max_norm / (norm + 1e-6))`, computed on the device.
fn clip_scale<B: Backend>(norm: &Tensor<B>, max_norm: f32) -> Result<Tensor<B>> {
    norm.add_scalar(1e-6)?
        .recip()?
        .mul_scalar(max_norm)?
        .clamp(0.0, 1.0)
}

/// [`scale_by_norm`] a gradient at a time, in any dtype: each one's squares summed, the sums
/// added, and each gradient scaled into a fresh tensor.
fn scale_each<B: Backend>(
    params: &[Tensor<B>],
    factor: &dyn Fn(&Tensor<B>) -> Result<Tensor<B>>,
) -> Result<Option<Tensor<B>>> {
    let grads: Vec<(Tensor<B>, Tensor<B>)> = params
        .iter()
        .filter_map(|p| p.grad().map(|g| (p.clone(), g)))
        .collect();
    let mut total: Option<Tensor<B>> = None;
    for (_, g) in &grads {
        let s = g.square()?.sum_all()?;
        total = Some(match total {
            Some(t) => t.add(&s)?,
            None => s,
        });
    }
    let Some(total) = total else { return Ok(None) };
    let norm = total.sqrt()?;
    let scale = factor(&norm)?;
    for (p, g) in grads {
        p.set_grad(Some(g.mul(&scale)?.dense()?));
    }
    Ok(Some(norm))
}

/// Element `i` of each of `lens`' buffers where `i` is inside it: its index (0 past the end,
/// where nothing is stored or counted) and whether it is inside.
fn element<'s>(
    s: &'s Scope,
    i: Expr<'s>,
    len: usize,
    longest: usize,
) -> (Expr<'s>, Option<Expr<'s>>) {
    if len == longest {
        return (i, None);
    }
    let (at, inside) = s.with_builder(|p| crate::ops::index_within(p, i.value(), len));
    (s.expr(at), Some(s.expr(inside)))
}

/// `squares[i] (+)= sum over the group's gradients of g[i]^2` (buffers: the gradients, then
/// `squares` of `longest` elements; the first group writes, later ones add).
fn sum_squares_program(lens: &[usize], longest: usize, first: bool) -> Result<hal::ir::Program> {
    let s = Scope::new("clip_sum_squares");
    let grads: Vec<BufferId> = lens
        .iter()
        .map(|_| s.buffer(DType::F32, Access::Read))
        .collect();
    let access = if first {
        Access::Write
    } else {
        Access::ReadWrite
    };
    let squares = s.buffer(DType::F32, access);
    let i = s.index();
    let mut total = if first {
        s.f32(0.0)
    } else {
        s.load(squares, i)
    };
    for (&len, &g) in lens.iter().zip(&grads) {
        let (at, inside) = element(&s, i, len, longest);
        let x = s.load(g, at);
        let sq = x * x;
        total = total + inside.map_or(sq, |w| w.select(sq, s.f32(0.0)));
    }
    s.store(squares, i, total);
    Ok(s.build()?)
}

/// `g *= scale[0]` in place for each of the group's gradients (buffers: the gradients, then
/// `scale`).
fn scale_program(lens: &[usize]) -> Result<hal::ir::Program> {
    let s = Scope::new("clip_scale");
    let grads: Vec<BufferId> = lens
        .iter()
        .map(|_| s.buffer(DType::F32, Access::ReadWrite))
        .collect();
    let scale = s.buffer(DType::F32, Access::Read);
    let i = s.index();
    let longest = lens.iter().copied().max().unwrap_or(0);
    let factor = s.load(scale, s.u32(0));
    for (&len, &g) in lens.iter().zip(&grads) {
        let (at, inside) = element(&s, i, len, longest);
        let scaled = s.load(g, at) * factor;
        match inside {
            Some(w) => s.store_if(w, g, at, scaled),
            None => s.store(g, at, scaled),
        }
    }
    Ok(s.build()?)
}
