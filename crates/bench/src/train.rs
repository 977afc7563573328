//! `--suite train`: full training steps (forward, cross-entropy, backward, Adam) of the
//! tensor-autograd models, against PyTorch running the same models in the same run where it is
//! installed; and device memory over 10,000 steps.

use hal::Backend;
use std::sync::Arc;
use std::time::Instant;
use tensor_autograd::models::{RecordedStep, lenet, mlp, train_step};
use tensor_autograd::nn::{Init, Module, ModuleExt, Sequential};
use tensor_autograd::optim::Adam;
use tensor_autograd::{Tensor, no_grad};

const PEER: &str = include_str!("../peers/train_torch.py");
const BATCH: usize = 256;

#[derive(Clone, Debug)]
pub struct TrainArgs {
    pub reps: usize,
    /// Steps of the memory check (it reports after 100 and after this many).
    pub memory_steps: usize,
}

fn build<B: Backend>(b: &B, which: &str) -> tensor_autograd::Result<Sequential<B>> {
    let mut init = Init::new(b, 1);
    if which == "mlp" {
        mlp(&mut init, &[784, 512, 512, 10])
    } else {
        lenet(&mut init, 1, 28, (32, 64), 128, 10)
    }
}

/// Fresh random batches on the device, drawn before timing.
fn batches<B: Backend>(
    b: &B,
    count: usize,
) -> tensor_autograd::Result<Vec<(Tensor<B>, Tensor<B>)>> {
    (0..count)
        .map(|i| {
            let x = Tensor::randn(b, &[BATCH, 1, 28, 28], 100 + i as u64)?;
            let y = Tensor::rand(b, &[BATCH], 900 + i as u64)?
                .mul_scalar(10.0)?
                .floor()?
                .to_dtype(hal::DType::U32)?;
            Ok((x, y))
        })
        .collect()
}

pub fn train<B: Backend>(
    b: &B,
    args: &TrainArgs,
    memory: Option<&dyn Fn() -> String>,
) -> Result<(), String> {
    let e = |e: tensor_autograd::Error| e.to_string();
    let cpu = b.info().kind == hal::DeviceKind::Cpu;
    for which in ["mlp", "cnn"] {
        let model: Arc<dyn Module<B>> = Arc::new(build(b, which).map_err(e)?);
        let params = model.parameters();
        let mut opt = Adam::new(1e-3);
        let data = batches(b, 8).map_err(e)?;
        let mut i = 0usize;
        let mut step = |opt: &mut Adam<B>| -> tensor_autograd::Result<Tensor<B>> {
            let (x, y) = &data[i % data.len()];
            i += 1;
            Ok(train_step(&*model, &params, opt, x, y)?.loss)
        };
        // Check it learns at all before timing: the loss after 30 steps is below the first.
        let first = step(&mut opt).map_err(e)?.item().map_err(e)?;
        for _ in 0..28 {
            step(&mut opt).map_err(e)?;
        }
        let last = step(&mut opt).map_err(e)?.item().map_err(e)?;
        if last.partial_cmp(&first) != Some(std::cmp::Ordering::Less) {
            return Err(format!("{which}: loss did not fall ({first} -> {last})"));
        }
        let time = |run: &mut dyn FnMut() -> tensor_autograd::Result<()>| {
            let block = 10;
            let mut times = Vec::with_capacity(args.reps);
            let mut host = Vec::with_capacity(args.reps);
            // What came before is left out of a profile.
            let _ = crate::take_profile(1);
            for _ in 0..args.reps {
                b.synchronize().map_err(|x| x.to_string())?;
                let t = Instant::now();
                for _ in 0..block {
                    run().map_err(e)?;
                }
                host.push(t.elapsed().as_secs_f64() / block as f64);
                b.synchronize().map_err(|x| x.to_string())?;
                times.push(t.elapsed().as_secs_f64() / block as f64);
            }
            crate::print_profile(args.reps * block);
            // The host's share: the time to enqueue a step, which bounds the step from below
            // where the device is asynchronous.
            println!(
                "train {which}: the host enqueues a step in {:.3} ms (median)",
                crate::median(host) * 1e3
            );
            Ok::<f64, String>(crate::median(times) * 1e3)
        };
        let ours = time(&mut || step(&mut opt).map(drop))?;
        let label = if which == "mlp" {
            "MLP 784-512-512-10"
        } else {
            "LeNet-style CNN (conv 32, conv 64, 3136-128-10)"
        };
        let peer = if cpu {
            torch(which, "cpu", 2, args.reps)
        } else {
            Err("PyTorch runs here only on this CPU".into())
        };
        match peer {
            Ok((ms, what)) => println!(
                "train {label}, batch {BATCH}, Adam: {ours:.3} ms per step; PyTorch {ms:.3} ms ({what}): ratio {:.2}x (loss {first:.3} -> {last:.3} in 30 steps)",
                ours / ms
            ),
            Err(why) => println!(
                "train {label}, batch {BATCH}, Adam: {ours:.3} ms per step (loss {first:.3} -> {last:.3} in 30 steps); PyTorch not run: {why}"
            ),
        }
        if which == "mlp" {
            memory_over_steps(b, args.memory_steps, memory, &mut || step(&mut opt))?;
        }
        // The same step recorded once and replayed (on CUDA, one graph launch a step).
        let (x0, y0) = &data[0];
        let recorded = RecordedStep::new(model.clone(), opt, x0, y0).map_err(e)?;
        let mut k = 0usize;
        let mut last = f32::NAN;
        let replayed = time(&mut || {
            let (x, y) = &data[k % data.len()];
            k += 1;
            recorded.run(x, y).map(drop)
        })?;
        for (x, y) in data.iter().take(2) {
            last = recorded.run(x, y).map_err(e)?.loss.item().map_err(e)?;
        }
        if !last.is_finite() || last >= first {
            return Err(format!(
                "{which}: the recorded step's loss {last} is not below the first eager loss {first}"
            ));
        }
        println!(
            "train {label}, batch {BATCH}, Adam, the step recorded and replayed ({}): {replayed:.3} ms per step ({:.2}x the eager step; loss {last:.3} after {} steps)",
            if b.capabilities().graph_capture {
                "captured launches"
            } else {
                "the calls run again"
            },
            replayed / ours,
            recorded.optimizer().steps()
        );
    }
    Ok(())
}

/// Device memory after 100 steps and after `steps` steps of `step` (a leak shows as growth).
fn memory_over_steps<B: Backend>(
    b: &B,
    steps: usize,
    memory: Option<&dyn Fn() -> String>,
    step: &mut dyn FnMut() -> tensor_autograd::Result<Tensor<B>>,
) -> Result<(), String> {
    let e = |e: tensor_autograd::Error| e.to_string();
    let t = Instant::now();
    for s in 1..=steps {
        let loss = step().map_err(e)?;
        if s == 100 || s == steps {
            no_grad(|| loss.item()).map_err(e)?;
            let report = crate::launch::memory_report(b, memory);
            println!("train memory after {s} steps: {report}");
        }
    }
    println!(
        "train memory loop: {steps} steps in {:.2} s",
        t.elapsed().as_secs_f64()
    );
    Ok(())
}

fn torch(which: &str, device: &str, threads: usize, reps: usize) -> Result<(f64, String), String> {
    let args = [which, device, &threads.to_string(), &reps.to_string()].map(str::to_string);
    let text = crate::run_peer(PEER, &args, "torch")?;
    let ms = crate::json_field(&text, "step_ms")
        .and_then(|v| v.parse::<f64>().ok())
        .ok_or(format!("unreadable output: {text}"))?;
    Ok((ms, crate::json_field(&text, "what").unwrap_or_default()))
}
