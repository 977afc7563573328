//! Trains a GPT with nanoGPT's recipes (its `train.py` and `config/`, Karpathy, MIT):
//! `shakespeare-char` (6 layers, 6 heads, 384 wide, block 256, batch 64, dropout 0.2, AdamW lr
//! 1e-3 with 100 warm-up steps and cosine decay to 1e-4 over 5000, beta2 0.99, weight decay 0.1
//! on matrices, gradient clipping at 1.0) on Tiny Shakespeare's characters (committed, the first
//! 90% for training); `gpt2` (124M: 12 x 12 x 768, block 1024) on GPT-2 BPE `.bin` files as
//! nanoGPT's `prepare.py` writes them (`--bin-dir`); `small` (2 x 4 x 64, block 64) for a
//! quick run. Prints loss, milliseconds per iteration and tokens per second, evaluates on
//! held-back batches, keeps the best checkpoint (nanoGPT's names: its `GPT` loads it) and ends
//! with a sample from it.
//!
//! ```sh
//! cargo run --release -p tensor-autograd --example gpt -- --config small --iters 200
//! cargo run --release -p tensor-autograd --example gpt -- --backend cuda --config shakespeare-char
//! cargo run --release -p tensor-autograd --example gpt -- --backend cuda --config gpt2 --devices 4
//! ```
//!
//! `--devices N` trains data-parallel on N devices (GPUs 0..N over NCCL, or N threads of the CPU
//! backend): each rank draws its own batches of `--batch` sequences, the gradients are averaged
//! over the ranks, and rank 0 logs, evaluates and writes the checkpoints.

mod common;

use clap::Parser;
use hal::Backend;
use hal::collective::Communicator;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;
use tensor_autograd::distributed::{Alone, Replicas};
use tensor_autograd::gpt::{Gpt, GptConfig};
use tensor_autograd::nn::Init;
use tensor_autograd::optim::{Adam, Cosine, GradScaler, Optimizer, Schedule, clip_grad_norm};
use tensor_autograd::text::{CharTokenizer, Gpt2Tokenizer, TokenStream, Tokenizer, write_tokens};
use tensor_autograd::{Tensor, autocast, no_grad};

#[derive(Parser, Debug)]
#[command(about = "Train a GPT with nanoGPT's recipes")]
struct Args {
    /// cpu, wgpu, cuda or auto (the best present)
    #[arg(long, default_value = "auto")]
    backend: String,
    /// Devices to train on, data-parallel (cuda: GPUs 0..N over NCCL; cpu: N threads)
    #[arg(long, default_value_t = 1)]
    devices: usize,
    /// shakespeare-char, gpt2 or small
    #[arg(long, default_value = "shakespeare-char")]
    config: String,
    /// The text to train on at character level (default: the committed Tiny Shakespeare)
    #[arg(long)]
    text: Option<PathBuf>,
    /// A folder with nanoGPT's train.bin and val.bin (GPT-2 BPE tokens), for `gpt2`
    #[arg(long)]
    bin_dir: Option<PathBuf>,
    #[arg(long, default_value_t = 5000)]
    iters: usize,
    #[arg(long, default_value_t = 250)]
    eval_interval: usize,
    #[arg(long, default_value_t = 200)]
    eval_iters: usize,
    #[arg(long, default_value_t = 10)]
    log_interval: usize,
    /// Batch size (default: the recipe's: 64, or 12 for gpt2)
    #[arg(long)]
    batch: Option<usize>,
    #[arg(long, default_value_t = 1e-3)]
    lr: f32,
    #[arg(long, default_value_t = 1e-4)]
    min_lr: f32,
    #[arg(long, default_value_t = 100)]
    warmup: u64,
    #[arg(long, default_value_t = 0.1)]
    weight_decay: f32,
    #[arg(long, default_value_t = 0.99)]
    beta2: f32,
    #[arg(long, default_value_t = 1.0)]
    grad_clip: f32,
    /// Micro-batches per step, their gradients summed (nanoGPT's
    /// gradient_accumulation_steps): a step sees batch x this many sequences
    #[arg(long, default_value_t = 1)]
    grad_accum: usize,
    /// Dropout (default: the recipe's)
    #[arg(long)]
    dropout: Option<f32>,
    #[arg(long, default_value_t = 1337)]
    seed: u64,
    /// The matrix products: `fast` (TF32 tensor cores where the device has them, as nanoGPT
    /// sets `allow_tf32`) or `exact` (f32)
    #[arg(long, default_value = "fast")]
    precision: String,
    /// Mixed precision: `none` (f32), `bf16` (nanoGPT's default on GPUs that have it) or
    /// `f16` (with a loss scaler): products in that dtype, norms, attention and the loss in
    /// f32, f32 master weights
    #[arg(long, default_value = "none")]
    autocast: String,
    /// Where the best checkpoint goes (safetensors, nanoGPT's names), with the optimiser's
    /// state beside it (`.adam-decay` and `.adam-plain` before the extension)
    #[arg(long, default_value = "target/gpt/ckpt.safetensors")]
    out: PathBuf,
    /// Resume from the checkpoint at --out and its optimiser state: the run continues at the
    /// step it was saved after, with the same batches it would have drawn
    #[arg(long)]
    resume: bool,
    /// Tokens to sample at the end
    #[arg(long, default_value_t = 300)]
    sample: usize,
    /// After training, write the logits (f32, little-endian) of two windows of the validation
    /// tokens to this file, and the windows (u32) to the same path with `.tokens` appended: a
    /// fixed batch to compare with nanoGPT's logits from the checkpoint.
    #[arg(long)]
    dump_logits: Option<PathBuf>,
}

fn main() -> ExitCode {
    // SAFETY: the first line of main: no other thread exists yet.
    unsafe { backends::quiet_headless_start() };
    let args = Args::parse();
    if args.devices <= 1 {
        // One thread drives the backend (ranks are threads of their own otherwise).
        backends::join_rayon_pool("gpt");
    }
    let choice = backends::resolve(&args.backend).to_string();
    println!(
        "gpt: backend {choice}, recipe {}, autocast {}",
        args.config, args.autocast
    );
    let outcome = if args.devices > 1 {
        backends::on_group!(choice.as_str(), args.devices, parallel(&args))
    } else {
        backends::on_backend!(choice.as_str(), with_policy(&args))
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpt: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The training and validation tokens, and their tokenizer where it is known.
type Data = (
    TokenStream,
    TokenStream,
    Option<Box<dyn Tokenizer + Send + Sync>>,
);

/// The training and validation token files, and the tokenizer that reads them back where it
/// is known: characters for the character recipes; GPT-2's BPE for `gpt2` on `--text`, the
/// text encoded here as nanoGPT's `data/shakespeare/prepare.py` does (the first 90% to train,
/// the rest to validate; ids as u16).
fn data(args: &Args, work: &Path) -> Result<Data, String> {
    let e = |e: tensor_autograd::Error| e.to_string();
    if let Some(dir) = &args.bin_dir {
        let train = TokenStream::open(&dir.join("train.bin")).map_err(e)?;
        let val = TokenStream::open(&dir.join("val.bin")).map_err(e)?;
        let tok: Option<Box<dyn Tokenizer + Send + Sync>> = if args.config == "gpt2" {
            Some(Box::new(Gpt2Tokenizer::new().map_err(e)?))
        } else {
            None
        };
        return Ok((train, val, tok));
    }
    let path = args.text.clone().unwrap_or_else(|| {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("data/tinyshakespeare/input.txt")
    });
    let text =
        std::fs::read_to_string(&path).map_err(|err| format!("{}: {err}", path.display()))?;
    let (tok, ids, split, kind): (Box<dyn Tokenizer + Send + Sync>, Vec<u32>, usize, &str) =
        if args.config == "gpt2" {
            let bpe = Gpt2Tokenizer::new().map_err(e)?;
            let at = text
                .char_indices()
                .map(|(i, _)| i)
                .find(|&i| i >= text.len() * 9 / 10)
                .unwrap_or(text.len());
            // Each part encoded alone, as prepare.py does.
            let mut ids = bpe.encode(&text[..at]).map_err(e)?;
            let split = ids.len();
            ids.extend(bpe.encode(&text[at..]).map_err(e)?);
            (Box::new(bpe), ids, split, "GPT-2 BPE")
        } else {
            let tok = CharTokenizer::from_text(&text);
            let ids = tok.encode(&text).map_err(e)?;
            let split = ids.len() * 9 / 10;
            (Box::new(tok), ids, split, "character")
        };
    std::fs::create_dir_all(work).map_err(|err| format!("{}: {err}", work.display()))?;
    finish(tok, ids, split, work, &text, &path, kind)
}

/// Writes `ids[..split]` and `ids[split..]` as the run's token files and opens them.
fn finish(
    tok: Box<dyn Tokenizer + Send + Sync>,
    ids: Vec<u32>,
    split: usize,
    work: &Path,
    text: &str,
    path: &Path,
    kind: &str,
) -> Result<Data, String> {
    let e = |e: tensor_autograd::Error| e.to_string();
    let (tp, vp) = (work.join("train.bin"), work.join("val.bin"));
    write_tokens(&tp, &ids[..split]).map_err(e)?;
    write_tokens(&vp, &ids[split..]).map_err(e)?;
    println!(
        "gpt: {} characters from {}, {kind} tokens (vocabulary {}): {} training, {} validation",
        text.chars().count(),
        path.display(),
        tok.vocab_size(),
        split,
        ids.len() - split
    );
    Ok((
        TokenStream::open(&tp).map_err(e)?,
        TokenStream::open(&vp).map_err(e)?,
        Some(tok),
    ))
}

fn config(args: &Args, vocab: usize) -> Result<GptConfig, String> {
    let mut c = match args.config.as_str() {
        "shakespeare-char" => GptConfig::shakespeare_char(vocab),
        "gpt2" => GptConfig::gpt2_124m(),
        "small" => GptConfig {
            block_size: 64,
            vocab_size: vocab,
            n_layer: 2,
            n_head: 4,
            n_embd: 64,
            dropout: 0.0,
            bias: false,
        },
        other => {
            return Err(format!(
                "unknown recipe {other} (shakespeare-char, gpt2, small)"
            ));
        }
    };
    if let Some(p) = args.dropout {
        c.dropout = p;
    }
    Ok(c)
}

/// The mean loss over `iters` random batches, without gradients, in evaluation mode.
fn estimate<B: Backend>(
    model: &mut Gpt<B>,
    backend: &B,
    stream: &TokenStream,
    state: &mut u64,
    (iters, batch): (usize, usize),
    mixed: Option<hal::DType>,
) -> Result<f32, String> {
    model.set_training(false);
    let block = model.config.block_size;
    let total = no_grad(|| -> tensor_autograd::Result<f32> {
        let mut sum = 0.0;
        for _ in 0..iters {
            let (x, y) = stream.random_batch_tensors(backend, state, batch, block)?;
            sum += loss_under(mixed, || model.loss(&x, &y))?.item()?;
        }
        Ok(sum)
    })
    .map_err(|e| e.to_string())?;
    model.set_training(true);
    Ok(total / iters.max(1) as f32)
}

/// `f` under autocast to `mixed` where given.
fn loss_under<R>(
    mixed: Option<hal::DType>,
    f: impl FnOnce() -> tensor_autograd::Result<R>,
) -> tensor_autograd::Result<R> {
    match mixed {
        Some(dt) => autocast(dt, f)?,
        None => f(),
    }
}

fn policy(args: &Args) -> Result<hal::Precision, String> {
    match args.precision.as_str() {
        "fast" => Ok(hal::Precision::Fast),
        "exact" => Ok(hal::Precision::Exact),
        p => Err(format!("unknown precision {p} (fast or exact)")),
    }
}

fn work_dir(args: &Args) -> PathBuf {
    args.out.parent().unwrap_or(Path::new(".")).to_path_buf()
}

fn with_policy<B: Backend>(backend: &B, args: &Args) -> Result<(), String> {
    let data = data(args, &work_dir(args))?;
    run(&backend.with_precision(policy(args)?), args, &data, |_| {
        Ok(Box::new(Alone))
    })
}

/// One thread per rank of `comms`, each training a replica on its own device.
fn parallel<C: Communicator + 'static>(comms: Vec<C>, args: &Args) -> Result<(), String> {
    let data = data(args, &work_dir(args))?;
    let precision = policy(args)?;
    println!("gpt: data-parallel over {} devices", comms.len());
    let data = &data;
    common::on_ranks(comms, |_, comm| {
        let backend = comm.backend().with_precision(precision);
        run(&backend, args, data, move |params| {
            common::join(comm, params)
        })
    })
}

/// Prints on the primary rank only.
macro_rules! say {
    ($primary:expr, $($t:tt)*) => {
        if $primary {
            println!($($t)*);
        }
    };
}

fn run<'a, B: Backend>(
    backend: &B,
    args: &Args,
    data: &Data,
    join: impl FnOnce(&[Tensor<B>]) -> Result<Box<dyn Replicas<B> + 'a>, String> + 'a,
) -> Result<(), String> {
    let e = |e: tensor_autograd::Error| e.to_string();
    let (train, val, tok) = data;
    let vocab = tok.as_ref().map_or(50304, |t| t.vocab_size());
    let cfg = config(args, vocab)?;
    let mixed = match args.autocast.as_str() {
        "none" => None,
        "bf16" => Some(hal::DType::BF16),
        "f16" => Some(hal::DType::F16),
        a => return Err(format!("unknown autocast {a} (none, bf16 or f16)")),
    };
    let mut scaler = (mixed == Some(hal::DType::F16)).then(GradScaler::new);
    let batch = args
        .batch
        .unwrap_or(if args.config == "gpt2" { 12 } else { 64 });
    let mut init = Init::new(backend, args.seed);
    let mut model = Gpt::new(&mut init, cfg).map_err(e)?;
    let params = model.parameters();
    // nanoGPT's groups: weight decay on the matrices (embeddings and Linear weights), none on
    // the LayerNorm weights and biases.
    let (decay, plain): (Vec<Tensor<B>>, Vec<Tensor<B>>) =
        params.iter().cloned().partition(|p| p.rank() >= 2);
    let adamw = |wd: f32| {
        let mut o = Adam::adamw(args.lr).weight_decay(wd);
        o.hyper.beta2 = args.beta2;
        o
    };
    let (mut opt_decay, mut opt_plain) = (adamw(args.weight_decay), adamw(0.0));
    let (decay_state, plain_state) = (
        args.out.with_extension("adam-decay.safetensors"),
        args.out.with_extension("adam-plain.safetensors"),
    );
    let mut first_iter = 0;
    if args.resume {
        model.load(&args.out).map_err(e)?;
        opt_decay.load_state(&decay, &decay_state).map_err(e)?;
        opt_plain.load_state(&plain, &plain_state).map_err(e)?;
        first_iter = opt_decay.steps() as usize;
        println!(
            "gpt: resumed from {} after step {first_iter}",
            args.out.display()
        );
    }
    // Rank 0's parameters go to every rank (a resumed run loaded the same files on each).
    let replicas = join(&params)?;
    let primary = replicas.is_primary();
    let ranks = replicas.size();
    say!(
        primary,
        "gpt: {} layers, {} heads, {} wide, block {}, vocabulary {}: {:.2}M parameters; batch {batch}{}, {} iterations",
        cfg.n_layer,
        cfg.n_head,
        cfg.n_embd,
        cfg.block_size,
        cfg.vocab_size,
        model.num_parameters() as f64 / 1e6,
        if ranks > 1 {
            format!(" per device on {ranks}")
        } else {
            String::new()
        },
        args.iters
    );
    let schedule = Cosine {
        base: args.lr,
        min: args.min_lr,
        warmup: args.warmup,
        total: args.iters as u64,
    };
    let tokens_per_iter = batch * cfg.block_size * args.grad_accum.max(1) * ranks;
    let mut eval_state = args.seed ^ 0xe7a1;
    let mut best = f32::INFINITY;
    // Whether this run saved a checkpoint (the file may be an older run's otherwise).
    let mut saved = false;
    let mut times = Vec::new();
    // Iterations are timed per log interval: the host queues steps ahead of the device, so one
    // step's own wall time would include the queue it waits behind. The clock restarts after
    // evaluations (not training time) and at each log line (a synchronizing loss read).
    let mut since: Option<(Instant, usize)> = None;
    for iter in first_iter..=args.iters {
        let evaluate =
            args.eval_interval > 0 && (iter % args.eval_interval == 0 || iter == args.iters);
        if evaluate && primary {
            let t = estimate(
                &mut model,
                backend,
                train,
                &mut eval_state,
                (args.eval_iters, batch),
                mixed,
            )?;
            let v = estimate(
                &mut model,
                backend,
                val,
                &mut eval_state,
                (args.eval_iters, batch),
                mixed,
            )?;
            say!(primary, "step {iter}: train loss {t:.4}, val loss {v:.4}");
            since = None;
            if v < best {
                best = v;
                if iter > first_iter {
                    model.save(&args.out).map_err(e)?;
                    saved = true;
                    opt_decay.save_state(&decay, &decay_state).map_err(e)?;
                    opt_plain.save_state(&plain, &plain_state).map_err(e)?;
                }
            }
        }
        if iter == args.iters {
            break;
        }
        let lr = schedule.learning_rate(iter as u64);
        opt_decay.set_learning_rate(lr);
        opt_plain.set_learning_rate(lr);
        if since.is_none() {
            backend.synchronize().map_err(|x| x.to_string())?;
            since = Some((Instant::now(), iter));
        }
        for p in &params {
            p.zero_grad();
        }
        // Each step's batches follow from the seed and the step, so a resumed run draws the
        // batches the uninterrupted one would have.
        // Rank r > 0 mixes its rank in: its own batches (rank 0's are a single run's).
        let mut data_state = args.seed
            ^ (iter as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)
            ^ (replicas.rank() as u64).wrapping_mul(0xd1b5_4a32_d192_ed03);
        let micro = args.grad_accum.max(1);
        let mut loss = None;
        for m in 0..micro {
            let (x, y) = train
                .random_batch_tensors(backend, &mut data_state, batch, cfg.block_size)
                .map_err(e)?;
            // Each micro-batch's mean loss divided by their number: the gradients sum to the
            // gradient of the whole step's mean.
            let l = loss_under(mixed, || model.loss(&x, &y)).map_err(e)?;
            let scaled = match &scaler {
                Some(s) => s.scale_loss(&l).map_err(e)?,
                None => l.clone(),
            };
            let scaled = scaled.mul_scalar(1.0 / micro as f32).map_err(e)?;
            // The last micro-batch's backward averages the summed gradients over the ranks.
            if m + 1 == micro {
                replicas.backward(&scaled).map_err(e)?;
            } else {
                scaled.backward().map_err(e)?;
            }
            loss = Some(l.detach());
        }
        let loss = loss.expect("at least one micro-batch");
        let clip = (args.grad_clip > 0.0).then_some(args.grad_clip);
        if let Some(s) = &mut scaler {
            s.unscale(&params, clip).map_err(e)?;
            s.step(&mut [(&mut opt_decay, &decay), (&mut opt_plain, &plain)])
                .map_err(e)?;
        } else {
            if let Some(max) = clip {
                clip_grad_norm(&params, max).map_err(e)?;
            }
            opt_decay.step(&decay).map_err(e)?;
            opt_plain.step(&plain).map_err(e)?;
        }
        if iter % args.log_interval == 0 {
            // Reading the loss waits for the step, and so for every step queued since the clock
            // started: their mean time.
            let l = loss.item().map_err(e)?;
            let (start, from) = since.take().expect("started above");
            let ms = start.elapsed().as_secs_f64() * 1e3 / (iter + 1 - from) as f64;
            times.push(ms);
            since = Some((Instant::now(), iter + 1));
            say!(
                primary,
                "iter {iter}: loss {l:.4}, {ms:.2} ms, {:.0} tokens/s, lr {lr:.2e}",
                tokens_per_iter as f64 / (ms / 1e3)
            );
        }
    }
    times.sort_by(f64::total_cmp);
    if let Some(&median) = times.get(times.len() / 2) {
        let val = if best.is_finite() {
            format!(", best val loss {best:.4}")
        } else {
            String::new()
        };
        say!(
            primary,
            "gpt on {}: median {median:.2} ms per iteration ({:.0} tokens/s){val}",
            backend.info().name,
            tokens_per_iter as f64 / (median / 1e3)
        );
    }
    if let Some(s) = &scaler {
        say!(
            primary,
            "gpt: loss scale {} at the end, {} steps skipped for overflow",
            s.scale(),
            s.skipped_steps()
        );
    }
    if best.is_finite() && args.out.exists() {
        say!(primary, "gpt: best checkpoint in {}", args.out.display());
    }
    if !primary {
        return Ok(());
    }
    if let Some(path) = &args.dump_logits {
        dump_logits(&mut model, backend, val, path)?;
    }
    if let (Some(tok), true) = (&tok, args.sample > 0) {
        // From the best checkpoint, as nanoGPT's sample.py samples from its ckpt.pt (the
        // final weights of a long run are overfit).
        if saved {
            model.load(&args.out).map_err(e)?;
        }
        model.set_training(false);
        let prompt = tok.encode("\n").map_err(e)?;
        let out = model
            .generate(&prompt, args.sample, 0.8, Some(200), args.seed)
            .map_err(e)?;
        say!(primary, "---\n{}\n---", tok.decode(&out).map_err(e)?);
    }
    Ok(())
}

/// See `Args::dump_logits`.
fn dump_logits<B: Backend>(
    model: &mut Gpt<B>,
    backend: &B,
    val: &TokenStream,
    path: &Path,
) -> Result<(), String> {
    let e = |e: tensor_autograd::Error| e.to_string();
    let t = model.config.block_size;
    let tokens = val.window(0, 2 * t).map_err(e)?;
    model.set_training(false);
    let x = Tensor::from_elements(backend, &tokens, &[2, t]).map_err(e)?;
    let logits = no_grad(|| model.forward(&x))
        .map_err(e)?
        .to_vec()
        .map_err(e)?;
    let bytes: Vec<u8> = logits.iter().flat_map(|v| v.to_le_bytes()).collect();
    let ids: Vec<u8> = tokens.iter().flat_map(|v| v.to_le_bytes()).collect();
    let io = |err: std::io::Error| format!("{}: {err}", path.display());
    hal::durable::write_bytes_atomic(path, &bytes).map_err(io)?;
    let mut tpath = path.as_os_str().to_owned();
    tpath.push(".tokens");
    hal::durable::write_bytes_atomic(Path::new(&tpath), &ids).map_err(io)?;
    println!(
        "gpt: logits [2, {t}, {}] of the first validation windows in {}",
        model.config.vocab_size,
        path.display()
    );
    Ok(())
}
