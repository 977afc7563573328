//! `--suite gpt`: GPT training iterations (forward, cross-entropy, backward, gradient
//! clipping, AdamW) of tensor-autograd's nanoGPT model on random tokens, as nanoGPT's
//! `bench.py` times them, beside nanoGPT's own model in PyTorch in the same run where the
//! host has PyTorch and nanoGPT's code (`--nanogpt DIR`, the folder holding its `model.py`):
//! on CUDA eager and torch.compile with bf16 autocast, on the CPU eager f32 with 2 threads.
//! Ours in f32, then, on devices with matrix units, with TF32 products and under bf16
//! autocast.
//! Configs: shakespeare-char, gpt2 (124M), small (the CPU test's model).

use hal::Backend;
use std::path::PathBuf;
use std::time::Instant;
use tensor_autograd::Tensor;
use tensor_autograd::gpt::{Gpt, GptConfig};
use tensor_autograd::nn::Init;
use tensor_autograd::optim::{Adam, Optimizer, clip_grad_norm};

const PEER: &str = include_str!("../peers/gpt_torch.py");

#[derive(Clone, Debug)]
pub struct GptArgs {
    pub reps: usize,
    /// shakespeare-char or gpt2 (or both, comma-separated on the command line).
    pub configs: Vec<String>,
    pub nanogpt: Option<PathBuf>,
    /// Overrides the recipe's dropout (and skips the peer).
    pub dropout: Option<f32>,
}

fn recipe(name: &str) -> Result<(GptConfig, usize), String> {
    match name {
        "shakespeare-char" => Ok((GptConfig::shakespeare_char(65), 64)),
        "gpt2" => Ok((GptConfig::gpt2_124m(), 12)),
        // The CPU test's model (tensor-autograd/tests/gpt.rs), batch 16.
        "small" => Ok((
            GptConfig {
                block_size: 64,
                vocab_size: 65,
                n_layer: 2,
                n_head: 4,
                n_embd: 64,
                dropout: 0.0,
                bias: false,
            },
            16,
        )),
        other => Err(format!(
            "unknown GPT config {other} (shakespeare-char, gpt2, small)"
        )),
    }
}

pub fn gpt<B: Backend>(b: &B, args: &GptArgs) -> Result<(), String> {
    // Exact f32 products, then TF32 ones (`Precision::Fast`: nanoGPT's `allow_tf32`) and bf16
    // autocast (nanoGPT's default where the GPU has bf16) where the device has matrix units.
    for &(policy, mixed) in &variants(b) {
        gpt_under(&b.with_precision(policy), args, (policy, mixed))?;
    }
    Ok(())
}

/// The precision policies and autocast dtypes the suite times on `b`'s device, in order.
fn variants<B: Backend>(b: &B) -> Vec<(hal::Precision, Option<hal::DType>)> {
    let mut v = vec![(hal::Precision::Exact, None)];
    if b.capabilities().fast_precision {
        v.push((hal::Precision::Fast, None));
        v.push((hal::Precision::Fast, Some(hal::DType::BF16)));
    }
    v
}

fn gpt_under<B: Backend>(
    b: &B,
    args: &GptArgs,
    (policy, mixed): (hal::Precision, Option<hal::DType>),
) -> Result<(), String> {
    let e = |e: tensor_autograd::Error| e.to_string();
    let label = match (policy, mixed) {
        (_, Some(dt)) => format!("{dt} autocast"),
        (hal::Precision::Fast, None) => "f32, TF32 products".to_string(),
        _ => "f32".to_string(),
    };
    for name in &args.configs {
        let (mut cfg, batch) = recipe(name)?;
        if let Some(p) = args.dropout {
            cfg.dropout = p;
        }
        let mut init = Init::new(b, 1);
        let model = Gpt::new(&mut init, cfg).map_err(e)?;
        let params = model.parameters();
        let (decay, plain): (Vec<Tensor<B>>, Vec<Tensor<B>>) =
            params.iter().cloned().partition(|p| p.rank() >= 2);
        let adamw = |wd: f32| {
            let mut o = Adam::adamw(1e-3).weight_decay(wd);
            o.hyper.beta2 = 0.99;
            o
        };
        let (mut od, mut op) = (adamw(0.1), adamw(0.0));
        let data: Vec<(Tensor<B>, Tensor<B>)> = (0..8u64)
            .map(|i| {
                let ids = |seed: u64| -> tensor_autograd::Result<Tensor<B>> {
                    Tensor::rand(b, &[batch, cfg.block_size], seed)?
                        .mul_scalar(cfg.vocab_size as f32)?
                        .floor()?
                        .to_dtype(hal::DType::U32)
                };
                Ok((ids(100 + i)?, ids(900 + i)?))
            })
            .collect::<tensor_autograd::Result<_>>()
            .map_err(e)?;
        let mut k = 0usize;
        let mut step = || -> tensor_autograd::Result<Tensor<B>> {
            let (x, y) = &data[k % data.len()];
            k += 1;
            for p in &params {
                p.zero_grad();
            }
            let loss = match mixed {
                Some(dt) => tensor_autograd::autocast(dt, || model.loss(x, y))??,
                None => model.loss(x, y)?,
            };
            loss.backward()?;
            clip_grad_norm(&params, 1.0)?;
            od.step(&decay)?;
            op.step(&plain)?;
            Ok(loss.detach())
        };
        let first = step().map_err(e)?.item().map_err(e)?;
        for _ in 0..3 {
            step().map_err(e)?;
        }
        b.synchronize().map_err(|x| x.to_string())?;
        let _ = crate::take_profile(1);
        let block = 5;
        let mut times = Vec::with_capacity(args.reps);
        for _ in 0..args.reps {
            let t = Instant::now();
            for _ in 0..block {
                step().map_err(e)?;
            }
            b.synchronize().map_err(|x| x.to_string())?;
            times.push(t.elapsed().as_secs_f64() / block as f64);
        }
        crate::print_profile(args.reps * block);
        let last = step().map_err(e)?.item().map_err(e)?;
        let ours = crate::median(times) * 1e3;
        let tokens = (batch * cfg.block_size) as f64;
        println!(
            "gpt {name} ({} layers, {} wide, block {}, batch {batch}, dropout {}), {label}: {ours:.2} ms per iteration, {:.0} tokens/s (loss {first:.3} -> {last:.3})",
            cfg.n_layer,
            cfg.n_embd,
            cfg.block_size,
            cfg.dropout,
            tokens / (ours / 1e3)
        );
        // The peer once, after the last variant, with the recipe as it is.
        if variants(b).last() != Some(&(policy, mixed)) || args.dropout.is_some() {
            continue;
        }
        // The peer on the same device: CUDA (eager, then torch.compile) or the CPU (eager).
        let device = b.info().backend;
        let compiles: &[&str] = if device == "cpu" { &["0"] } else { &["0", "1"] };
        for compile in compiles {
            let peer = match (&args.nanogpt, device == "cuda" || device == "cpu") {
                (Some(dir), true) => {
                    let a = [
                        dir.display().to_string(),
                        name.clone(),
                        batch.to_string(),
                        args.reps.to_string(),
                        compile.to_string(),
                        device.to_string(),
                    ];
                    crate::run_peer(PEER, &a, "torch").and_then(|text| {
                        let ms = crate::json_field(&text, "step_ms")
                            .and_then(|v| v.parse::<f64>().ok())
                            .ok_or_else(|| format!("unreadable peer output: {text}"))?;
                        Ok((ms, crate::json_field(&text, "what").unwrap_or_default()))
                    })
                }
                (None, _) => Err("no --nanogpt folder given".to_string()),
                (_, false) => Err("nanoGPT's peer runs on CUDA or the CPU".to_string()),
            };
            match peer {
                Ok((ms, what)) => println!(
                    "gpt {name}: PyTorch {ms:.2} ms per iteration ({what}): ours / theirs {:.2}x",
                    ours / ms
                ),
                Err(why) => {
                    println!("gpt {name}: PyTorch not run: {why}");
                    break;
                }
            }
        }
    }
    Ok(())
}
