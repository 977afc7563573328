//! Mixed precision: the autocast policy (which operations narrow, which widen), gradients that
//! reach f32 master weights and track the f32 ones, a small GPT that trains under bf16 as it
//! does in f32, and the f16 loss scaler (skips overflowing steps, backs off, grows).

mod common;

use backend_cpu::CpuBackend;
use common::{Rng, seed};
use hal::DType;
use std::path::Path;
use tensor_autograd::gpt::{Gpt, GptConfig};
use tensor_autograd::nn::Init;
use tensor_autograd::optim::{Adam, GradScaler, Optimizer, Sgd, clip_grad_norm};
use tensor_autograd::text::{CharTokenizer, TokenStream, Tokenizer, write_tokens};
use tensor_autograd::{AttentionOptions, Tensor, autocast, autocast_dtype};

fn tensor(dev: &CpuBackend, rng: &mut Rng, shape: &[usize], scale: f64) -> Tensor<CpuBackend> {
    let n = shape.iter().product();
    let v: Vec<f32> = rng
        .vec(n, -scale, scale)
        .iter()
        .map(|&x| x as f32)
        .collect();
    Tensor::from_slice(dev, &v, shape).unwrap()
}

/// `|a - b| / |b|` in the L2 norm.
fn relative(a: &[f32], b: &[f32]) -> f64 {
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (&x, &y) in a.iter().zip(b) {
        num += (x as f64 - y as f64).powi(2);
        den += (y as f64).powi(2);
    }
    (num / den.max(1e-30)).sqrt()
}

#[test]
fn the_policy_narrows_products_and_widens_norms_and_losses() {
    let dev = CpuBackend::new();
    let mut rng = Rng::new(seed());
    let x = tensor(&dev, &mut rng, &[6, 8], 1.0);
    let w = tensor(&dev, &mut rng, &[5, 8], 0.5);
    assert!(autocast(DType::F32, || ()).is_err());
    assert!(autocast(DType::F64, || ()).is_err());
    let (y, n, m, l) = autocast(DType::BF16, || {
        assert_eq!(autocast_dtype(), Some(DType::BF16));
        let y = x.linear(&w, None).unwrap();
        let n = y.layer_norm(1, None, None, 1e-5).unwrap();
        let m = x.matmul(&w.t().unwrap()).unwrap();
        let labels = Tensor::from_elements(&dev, &[0u32, 4, 2, 1, 3, 0], &[6]).unwrap();
        let l = y.cross_entropy(&labels).unwrap();
        // PyTorch's f32 list beyond norms and losses; the rest keeps the operand's dtype.
        assert_eq!(y.exp().unwrap().dtype(), DType::F32);
        assert_eq!(y.recip().unwrap().dtype(), DType::F32);
        assert_eq!(y.sum_all().unwrap().dtype(), DType::F32);
        assert_eq!(y.powf(2.0).unwrap().dtype(), DType::F32);
        assert_eq!(y.relu().unwrap().dtype(), DType::BF16);
        assert_eq!(y.gelu().unwrap().dtype(), DType::BF16);
        assert_eq!(y.mean_all().unwrap().dtype(), DType::BF16);
        assert_eq!(y.softmax(1).unwrap().dtype(), DType::F32);
        // Attention is a narrow-list operation (as PyTorch's): bf16 in, bf16 out.
        let x3 = x.reshape(&[2, 3, 8]).unwrap();
        let packed = Tensor::cat(&[&x3, &x3, &x3], 2).unwrap();
        let a = packed
            .qkv_attention(2, &AttentionOptions::default())
            .unwrap();
        assert_eq!(a.dtype(), DType::BF16);
        // Nested scopes: the innermost wins; f64 is never narrowed.
        let inner = autocast(DType::F16, || x.linear(&w, None).unwrap()).unwrap();
        assert_eq!(inner.dtype(), DType::F16);
        let x64 = x.to_dtype(DType::F64).unwrap();
        let w64 = w.to_dtype(DType::F64).unwrap();
        assert_eq!(x64.linear(&w64, None).unwrap().dtype(), DType::F64);
        (y, n, m, l)
    })
    .unwrap();
    assert_eq!(autocast_dtype(), None);
    assert_eq!(y.dtype(), DType::BF16);
    assert_eq!(m.dtype(), DType::BF16);
    assert_eq!(n.dtype(), DType::F32);
    assert_eq!(l.dtype(), DType::F32);
    // Outside the scope the same call stays f32.
    let reference = x.linear(&w, None).unwrap();
    assert_eq!(reference.dtype(), DType::F32);
    let (got, want) = (y.to_vec().unwrap(), reference.to_vec().unwrap());
    // bf16 operands and result: a few units of 2^-8.
    assert!(relative(&got, &want) < 2e-2, "{}", relative(&got, &want));
    assert!(relative(&got, &want) > 0.0, "bf16 gave f32's exact result");
}

/// A block of every family the GPT uses: layer norm, the packed attention, GELU, a residual,
/// cross-entropy; its loss and gradients with and without autocast.
fn block_loss(
    dev: &CpuBackend,
    params: &[Tensor<CpuBackend>],
    tokens: &Tensor<CpuBackend>,
) -> Tensor<CpuBackend> {
    let [emb, ln_w, qkv, proj, fc, out] = params else {
        unreachable!()
    };
    let (b, t, c) = (2, 5, 8);
    let x = emb
        .index_select(0, tokens)
        .unwrap()
        .reshape(&[b, t, c])
        .unwrap();
    let h = x.layer_norm(1, Some(ln_w), None, 1e-5).unwrap();
    let opts = AttentionOptions {
        causal: true,
        ..Default::default()
    };
    let a = h
        .linear(qkv, None)
        .unwrap()
        .qkv_attention(2, &opts)
        .unwrap();
    let x = x.add(&a.linear(proj, None).unwrap()).unwrap();
    let f = x.linear(fc, None).unwrap().gelu().unwrap();
    let logits = f.linear(out, None).unwrap().reshape(&[b * t, 11]).unwrap();
    let labels: Vec<u32> = (0..b * t).map(|i| (i * 7 % 11) as u32).collect();
    let _ = dev;
    logits
        .cross_entropy(&Tensor::from_elements(dev, &labels, &[b * t]).unwrap())
        .unwrap()
}

#[test]
fn gradients_reach_f32_weights_and_track_f32_ones() {
    let dev = CpuBackend::new();
    let mut rng = Rng::new(seed());
    let shapes: [&[usize]; 6] = [&[11, 8], &[8], &[24, 8], &[8, 8], &[16, 8], &[11, 16]];
    let params: Vec<Tensor<CpuBackend>> = shapes
        .iter()
        .map(|s| tensor(&dev, &mut rng, s, 0.5).requires_grad())
        .collect();
    let ids: Vec<u32> = (0..10).map(|i| (i * 3 % 11) as u32).collect();
    let tokens = Tensor::from_elements(&dev, &ids, &[10]).unwrap();
    let run = |dtype: Option<DType>| {
        for p in &params {
            p.zero_grad();
        }
        let loss = match dtype {
            Some(dt) => autocast(dt, || block_loss(&dev, &params, &tokens)).unwrap(),
            None => block_loss(&dev, &params, &tokens),
        };
        assert_eq!(loss.dtype(), DType::F32);
        // Backward outside the scope, as a training loop calls it.
        loss.backward().unwrap();
        let grads: Vec<Vec<f32>> = params
            .iter()
            .map(|p| {
                let g = p.grad().expect("every parameter gets a gradient");
                assert_eq!(g.dtype(), DType::F32, "master gradients are f32");
                g.to_vec().unwrap()
            })
            .collect();
        (loss.item().unwrap(), grads)
    };
    let (loss32, g32) = run(None);
    for (dt, tol) in [(DType::BF16, 5e-2), (DType::F16, 1e-2)] {
        let (loss, g) = run(Some(dt));
        assert!(
            ((loss - loss32) / loss32).abs() < tol as f32,
            "{dt}: loss {loss} vs {loss32}"
        );
        for (k, (a, b)) in g.iter().zip(&g32).enumerate() {
            let r = relative(a, b);
            assert!(r < tol, "{dt}: parameter {k}'s gradient differs by {r}");
            assert!(r > 0.0, "{dt}: parameter {k}'s gradient is f32's exactly");
        }
    }
}

fn small(vocab: usize) -> GptConfig {
    GptConfig {
        block_size: 32,
        vocab_size: vocab,
        n_layer: 2,
        n_head: 4,
        n_embd: 32,
        dropout: 0.0,
        bias: false,
    }
}

/// The losses of `steps` AdamW steps on Tiny Shakespeare, under `dtype` where given.
fn train_gpt(dtype: Option<DType>, steps: usize) -> Vec<f32> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/tinyshakespeare/input.txt");
    let text = std::fs::read_to_string(path).unwrap();
    let tok = CharTokenizer::from_text(&text);
    let ids = tok.encode(&text[..200_000]).unwrap();
    let dir = std::env::temp_dir().join(format!("autocast-{}-{dtype:?}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bin = dir.join("train.bin");
    write_tokens(&bin, &ids).unwrap();
    let stream = TokenStream::open(&bin).unwrap();
    let dev = CpuBackend::new();
    let mut init = Init::new(&dev, 3);
    let model = Gpt::new(&mut init, small(tok.vocab_size())).unwrap();
    let params = model.parameters();
    let mut opt = Adam::adamw(3e-3);
    let mut state = 11;
    let mut losses = Vec::new();
    for _ in 0..steps {
        let (x, y) = stream
            .random_batch_tensors(&dev, &mut state, 8, 32)
            .unwrap();
        for p in &params {
            p.zero_grad();
        }
        let loss = match dtype {
            Some(dt) => autocast(dt, || model.loss(&x, &y)).unwrap().unwrap(),
            None => model.loss(&x, &y).unwrap(),
        };
        loss.backward().unwrap();
        clip_grad_norm(&params, 1.0).unwrap();
        opt.step(&params).unwrap();
        losses.push(loss.item().unwrap());
    }
    std::fs::remove_dir_all(&dir).unwrap();
    for p in &params {
        assert_eq!(p.dtype(), DType::F32);
    }
    losses
}

#[test]
fn a_small_gpt_trains_under_bf16_as_in_f32() {
    const STEPS: usize = 60;
    let f32_run = train_gpt(None, STEPS);
    let bf16_run = train_gpt(Some(DType::BF16), STEPS);
    let tail = |l: &[f32]| l[STEPS - 10..].iter().sum::<f32>() / 10.0;
    let (a, b) = (tail(&f32_run), tail(&bf16_run));
    println!("last-10 mean loss: f32 {a:.4}, bf16 {b:.4}");
    assert!(a < f32_run[0] - 1.0, "f32 did not learn: {f32_run:?}");
    assert!((a - b).abs() < 0.05, "bf16 {b} vs f32 {a}");
    assert_ne!(f32_run, bf16_run, "bf16 computed f32's exact losses");
}

#[test]
fn the_loss_scaler_unscales_skips_overflow_and_adapts() {
    let dev = CpuBackend::new();
    let mut rng = Rng::new(seed());
    let x = tensor(&dev, &mut rng, &[16, 12], 1.0);
    let w = tensor(&dev, &mut rng, &[4, 12], 0.3).requires_grad();
    let labels: Vec<u32> = (0..16).map(|i| (i % 4) as u32).collect();
    let labels = Tensor::from_elements(&dev, &labels, &[16]).unwrap();
    let loss_of = || {
        autocast(DType::F16, || x.linear(&w, None)?.cross_entropy(&labels))
            .unwrap()
            .unwrap()
    };
    // The unscaled f16 gradient matches the plain one (a power-of-two scale is exact).
    w.zero_grad();
    loss_of().backward().unwrap();
    let plain = w.grad().unwrap().to_vec().unwrap();
    let mut scaler = GradScaler::new().growth_interval(2).unwrap();
    assert_eq!(scaler.scale(), 65536.0);
    w.zero_grad();
    scaler.scale_loss(&loss_of()).unwrap().backward().unwrap();
    let norm = scaler
        .unscale(std::slice::from_ref(&w), None)
        .unwrap()
        .unwrap();
    assert!(norm.is_finite());
    let unscaled = w.grad().unwrap().to_vec().unwrap();
    assert!(
        relative(&unscaled, &plain) < 2e-3,
        "{}",
        relative(&unscaled, &plain)
    );
    let want_norm = plain
        .iter()
        .map(|&g| (g as f64).powi(2))
        .sum::<f64>()
        .sqrt();
    assert!(((norm as f64 - want_norm) / want_norm).abs() < 2e-3);
    assert!(scaler.unscale(std::slice::from_ref(&w), None).is_err());
    let mut opt = Sgd::new(0.1);
    let before = w.to_vec().unwrap();
    assert!(
        scaler
            .step(&mut [(&mut opt, std::slice::from_ref(&w))])
            .unwrap()
    );
    let after = w.to_vec().unwrap();
    for ((a, b), g) in after.iter().zip(&before).zip(&unscaled) {
        assert!((a - (b - 0.1 * g)).abs() <= 1e-6 * (1.0 + b.abs()));
    }
    // A second good step grows the scale (interval 2).
    w.zero_grad();
    scaler.scale_loss(&loss_of()).unwrap().backward().unwrap();
    assert!(
        scaler
            .step(&mut [(&mut opt, std::slice::from_ref(&w))])
            .unwrap()
    );
    assert_eq!(scaler.scale(), 131072.0);
    // A scale that overflows f16's gradients: the step is skipped, the weights stay, the
    // scale backs off.
    let mut scaler = GradScaler::new().init_scale(1e30).unwrap();
    w.zero_grad();
    scaler.scale_loss(&loss_of()).unwrap().backward().unwrap();
    let before = w.to_vec().unwrap();
    assert!(
        !scaler
            .step(&mut [(&mut opt, std::slice::from_ref(&w))])
            .unwrap()
    );
    assert_eq!(w.to_vec().unwrap(), before);
    assert_eq!(scaler.scale(), 5e29);
    assert_eq!(scaler.skipped_steps(), 1);
    // Clipping while unscaling: the same as clipping the plain gradient.
    let mut scaler = GradScaler::new();
    w.zero_grad();
    scaler.scale_loss(&loss_of()).unwrap().backward().unwrap();
    scaler
        .unscale(std::slice::from_ref(&w), Some(0.01))
        .unwrap();
    let clipped = w.grad().unwrap().to_vec().unwrap();
    w.zero_grad();
    loss_of().backward().unwrap();
    clip_grad_norm(std::slice::from_ref(&w), 0.01).unwrap();
    let want = w.grad().unwrap().to_vec().unwrap();
    assert!(
        relative(&clipped, &want) < 2e-3,
        "{}",
        relative(&clipped, &want)
    );
    assert!(GradScaler::new().init_scale(0.0).is_err());
    assert!(GradScaler::new().growth_interval(0).is_err());
}

#[test]
fn a_narrow_branch_joins_the_f32_residual_without_a_cast() {
    let dev = CpuBackend::new();
    let mut rng = Rng::new(seed());
    let r = tensor(&dev, &mut rng, &[7, 33], 1.0).requires_grad();
    let x16 = tensor(&dev, &mut rng, &[7, 33], 1.0)
        .to_dtype(DType::BF16)
        .unwrap()
        .detach()
        .requires_grad();
    let y = x16.dropout_add(&r, 0.3, 5, 9).unwrap();
    assert_eq!(y.dtype(), DType::F32);
    // The same mask and values as widening first: bf16 widens exactly.
    let want = x16
        .to_dtype(DType::F32)
        .unwrap()
        .dropout(0.3, 5, 9)
        .unwrap()
        .add(&r)
        .unwrap();
    assert_eq!(y.to_vec().unwrap(), want.to_vec().unwrap());
    let w = tensor(&dev, &mut rng, &[7, 33], 1.0);
    y.mul(&w).unwrap().sum_all().unwrap().backward().unwrap();
    let gx = x16.grad().unwrap();
    assert_eq!(gx.dtype(), DType::BF16);
    assert_eq!(r.grad().unwrap().dtype(), DType::F32);
    // The branch's gradient: the weights through the same mask, rounded to bf16 once.
    let kept = w.dropout(0.3, 5, 9).unwrap().to_dtype(DType::BF16).unwrap();
    assert_eq!(gx.to_vec().unwrap(), kept.to_vec().unwrap());
}
