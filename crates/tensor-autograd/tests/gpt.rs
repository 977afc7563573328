//! A small GPT (2 layers, 4 heads, 64 wide, block 64) trained on Tiny Shakespeare's characters
//! on the CPU: a fixed number of AdamW steps from a fixed seed brings the training loss from
//! ln(65) = 4.17 (uniform guessing) below a stated threshold, and two runs agree bit for bit.
//! Also: the state has nanoGPT's names, and a saved file loads back.

use backend_cpu::CpuBackend;
use std::path::Path;
use tensor_autograd::gpt::{Gpt, GptConfig};
use tensor_autograd::nn::Init;
use tensor_autograd::optim::{Adam, Optimizer, clip_grad_norm};
use tensor_autograd::text::{CharTokenizer, TokenStream, Tokenizer, write_tokens};

const STEPS: usize = 120;
/// The loss the run must end below (the mean of its last 10 steps).
const THRESHOLD: f32 = 2.6;

fn small(vocab: usize) -> GptConfig {
    GptConfig {
        block_size: 64,
        vocab_size: vocab,
        n_layer: 2,
        n_head: 4,
        n_embd: 64,
        dropout: 0.0,
        bias: false,
    }
}

fn shakespeare_tokens(dir: &Path) -> (CharTokenizer, TokenStream) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/tinyshakespeare/input.txt");
    let text = std::fs::read_to_string(path).unwrap();
    let tok = CharTokenizer::from_text(&text);
    let ids = tok.encode(&text).unwrap();
    let bin = dir.join("train.bin");
    write_tokens(&bin, &ids[..ids.len() * 9 / 10]).unwrap();
    (tok, TokenStream::open(&bin).unwrap())
}

/// The losses of `STEPS` AdamW steps (lr 3e-3, betas 0.9/0.99, clip 1.0), batch 16.
fn train(stream: &TokenStream, vocab: usize) -> Vec<f32> {
    let dev = CpuBackend::new();
    let mut init = Init::new(&dev, 1);
    let model = Gpt::new(&mut init, small(vocab)).unwrap();
    let params = model.parameters();
    let mut opt = Adam::adamw(3e-3);
    opt.hyper.beta2 = 0.99;
    let mut state = 7;
    let mut losses = Vec::new();
    for _ in 0..STEPS {
        let (x, y) = stream
            .random_batch_tensors(&dev, &mut state, 16, 64)
            .unwrap();
        for p in &params {
            p.zero_grad();
        }
        let loss = model.loss(&x, &y).unwrap();
        loss.backward().unwrap();
        clip_grad_norm(&params, 1.0).unwrap();
        opt.step(&params).unwrap();
        losses.push(loss.item().unwrap());
    }
    losses
}

#[test]
fn a_small_gpt_learns_shakespeare_deterministically() {
    let dir = std::env::temp_dir().join(format!("gpt-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (tok, stream) = shakespeare_tokens(&dir);
    let a = train(&stream, tok.vocab_size());
    let first = a[0];
    let last: f32 = a[STEPS - 10..].iter().sum::<f32>() / 10.0;
    println!("loss {first:.3} -> {last:.3} over {STEPS} steps");
    assert!((first - 65f32.ln()).abs() < 0.3, "first loss {first}");
    assert!(last < THRESHOLD, "loss {last} after {STEPS} steps");
    let b = train(&stream, tok.vocab_size());
    assert_eq!(a, b, "two runs from one seed differ");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_state_has_nanogpts_names_and_round_trips() {
    let dev = CpuBackend::new();
    let mut init = Init::new(&dev, 3);
    let model = Gpt::new(&mut init, small(65)).unwrap();
    let mut names = Vec::new();
    model.visit(&mut |n, t, _| names.push((n.to_string(), t.shape().to_vec())));
    assert_eq!(
        names[0],
        ("transformer.wte.weight".to_string(), vec![65, 64])
    );
    assert!(names.contains(&(
        "transformer.h.1.attn.c_attn.weight".to_string(),
        vec![192, 64]
    )));
    assert!(names.contains(&(
        "transformer.h.0.mlp.c_proj.weight".to_string(),
        vec![64, 256]
    )));
    assert_eq!(names.last().unwrap().0, "transformer.ln_f.weight");
    // 65*64 + 64*64 + 2 * (64 + 192*64 + 64*64 + 64 + 256*64 + 64*256) + 64
    assert_eq!(model.num_parameters(), 4160 + 4096 + 2 * 49280 + 64);
    let dir = std::env::temp_dir().join(format!("gpt-save-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("ckpt.safetensors");
    model.save(&path).unwrap();
    let mut other = Gpt::new(&mut Init::new(&dev, 4), small(65)).unwrap();
    other.load(&path).unwrap();
    let x = tensor_autograd::Tensor::from_elements(&dev, &[1u32, 5, 9, 2], &[1, 4]).unwrap();
    let (a, b) = (model.forward(&x).unwrap(), other.forward(&x).unwrap());
    assert_eq!(a.to_vec().unwrap(), b.to_vec().unwrap());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The fused attention and the composed one (matmul, mask, softmax, dropout, matmul) draw the
/// same dropout masks, so one training-mode step gives the same loss and gradients to f32
/// rounding.
#[test]
fn fused_and_composed_attention_agree_with_dropout() {
    let dev = CpuBackend::new();
    let config = GptConfig {
        dropout: 0.2,
        ..small(65)
    };
    let mut state = 5u64;
    let ids: Vec<u32> = (0..3 * 41)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 33) as u32 % 65
        })
        .collect();
    let x = tensor_autograd::Tensor::from_elements(&dev, &ids[..3 * 40], &[3, 40]).unwrap();
    let y = tensor_autograd::Tensor::from_elements(&dev, &ids[3..], &[3, 40]).unwrap();
    let run = |fused: bool| {
        let mut model = Gpt::new(&mut Init::new(&dev, 9), config).unwrap();
        model.set_fused_attention(fused);
        let loss = model.loss(&x, &y).unwrap();
        loss.backward().unwrap();
        let grads: Vec<Vec<f32>> = model
            .parameters()
            .iter()
            .map(|p| p.grad().unwrap().to_vec().unwrap())
            .collect();
        (loss.item().unwrap(), grads)
    };
    let (fused_loss, fused_grads) = run(true);
    let (composed_loss, composed_grads) = run(false);
    assert!(
        (fused_loss - composed_loss).abs() < 1e-5 * composed_loss.abs(),
        "{fused_loss} vs {composed_loss}"
    );
    for (f, c) in fused_grads.iter().zip(&composed_grads) {
        let scale = c.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-6);
        let worst = f.iter().zip(c).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(
            worst < 1e-4 * scale,
            "gradient differs by {worst} (scale {scale})"
        );
    }
}
