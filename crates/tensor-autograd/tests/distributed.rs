//! Data-parallel training on the CPU reference's collectives (a thread per rank): two ranks on
//! half batches follow one rank on whole batches step for step, the replicas stay equal bit
//! for bit, and the parameters start from rank 0's.

use backend_cpu::{CpuBackend, CpuCommunicator};
use std::path::Path;
use tensor_autograd::Tensor;
use tensor_autograd::distributed::DataParallel;
use tensor_autograd::gpt::{Gpt, GptConfig};
use tensor_autograd::nn::Init;
use tensor_autograd::optim::{Adam, Optimizer, clip_grad_norm};
use tensor_autograd::text::{CharTokenizer, TokenStream, Tokenizer, write_tokens};

const STEPS: usize = 12;
const BATCH: usize = 8;
const BLOCK: usize = 32;

fn config(vocab: usize) -> GptConfig {
    GptConfig {
        block_size: BLOCK,
        vocab_size: vocab,
        n_layer: 2,
        n_head: 2,
        n_embd: 32,
        dropout: 0.0,
        bias: false,
    }
}

fn stream(dir: &Path) -> (usize, TokenStream) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/tinyshakespeare/input.txt");
    let text = std::fs::read_to_string(path).unwrap();
    let text = &text[..200_000];
    let tok = CharTokenizer::from_text(text);
    let ids = tok.encode(text).unwrap();
    let bin = dir.join("train.bin");
    write_tokens(&bin, &ids).unwrap();
    (tok.vocab_size(), TokenStream::open(&bin).unwrap())
}

/// Losses and final parameters of `STEPS` AdamW steps on `size` ranks, each taking its rows
/// of the same batches (the whole batch on one rank). `bucket_bytes` small makes many buckets.
fn train(
    stream: &TokenStream,
    vocab: usize,
    size: usize,
    bucket_bytes: usize,
) -> Vec<(Vec<f32>, Vec<Vec<f32>>)> {
    let mut group = CpuCommunicator::group(size).unwrap();
    std::thread::scope(|s| {
        let hs: Vec<_> = group
            .drain(..)
            .map(|comm| {
                s.spawn(move || {
                    let dev = CpuBackend::new();
                    let model = Gpt::new(&mut Init::new(&dev, 3), config(vocab)).unwrap();
                    let params = model.parameters();
                    let ddp = DataParallel::with_bucket_bytes(comm, &params, bucket_bytes).unwrap();
                    let mut opt = Adam::adamw(3e-3);
                    let mut state = 5;
                    let rows = ddp.shard_range(BATCH);
                    let mut losses = Vec::new();
                    for _ in 0..STEPS {
                        let (x, y) = stream
                            .random_batch_tensors(&dev, &mut state, BATCH, BLOCK)
                            .unwrap();
                        let (x, y) = (
                            x.narrow(0, rows.start, rows.len()).unwrap(),
                            y.narrow(0, rows.start, rows.len()).unwrap(),
                        );
                        for p in &params {
                            p.zero_grad();
                        }
                        let loss = model.loss(&x, &y).unwrap();
                        ddp.backward(&loss).unwrap();
                        clip_grad_norm(&params, 1.0).unwrap();
                        opt.step(&params).unwrap();
                        losses.push(loss.item().unwrap());
                    }
                    let values = params.iter().map(|p| p.to_vec().unwrap()).collect();
                    (losses, values)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn two_ranks_on_half_batches_follow_one_rank_on_whole_ones() {
    let dir = std::env::temp_dir().join(format!("ddp-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (vocab, stream) = stream(&dir);
    let one = train(&stream, vocab, 1, 1 << 20);
    for bucket_bytes in [1 << 20, 4096] {
        let two = train(&stream, vocab, 2, bucket_bytes);
        // The replicas hold the same bits.
        assert_eq!(
            two[0].1, two[1].1,
            "the replicas differ ({bucket_bytes}-byte buckets)"
        );
        for step in 0..STEPS {
            let mean = (two[0].0[step] + two[1].0[step]) / 2.0;
            let single = one[0].0[step];
            assert!(
                (mean - single).abs() <= 2e-4 * single.abs(),
                "step {step}: two ranks {mean}, one rank {single}"
            );
        }
        let mut worst = 0f32;
        for (a, b) in two[0].1.iter().flatten().zip(one[0].1.iter().flatten()) {
            worst = worst.max((a - b).abs());
        }
        assert!(
            worst < 1e-3,
            "parameters differ by {worst} after {STEPS} steps"
        );
    }
    assert!(one[0].0[STEPS - 1] < one[0].0[0], "the loss did not fall");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn parameters_start_from_rank_zero_and_shards_cover_the_batch() {
    let mut group = CpuCommunicator::group(3).unwrap();
    let results: Vec<(Vec<f32>, std::ops::Range<usize>)> = std::thread::scope(|s| {
        let hs: Vec<_> = group
            .drain(..)
            .enumerate()
            .map(|(rank, comm)| {
                s.spawn(move || {
                    let dev = CpuBackend::new();
                    // Each rank draws different initial values.
                    let w = Tensor::randn(&dev, &[4, 5], 100 + rank as u64)
                        .unwrap()
                        .requires_grad();
                    let ddp = DataParallel::new(comm, &[w.clone(), w.clone()]).unwrap();
                    assert_eq!(ddp.params().len(), 1, "a tied parameter counts once");
                    assert_eq!(ddp.is_primary(), rank == 0);
                    (w.to_vec().unwrap(), ddp.shard_range(10))
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let rank0 = Tensor::randn(&CpuBackend::new(), &[4, 5], 100)
        .unwrap()
        .to_vec()
        .unwrap();
    for (values, _) in &results {
        assert_eq!(values, &rank0);
    }
    let ranges: Vec<_> = results.iter().map(|r| r.1.clone()).collect();
    assert_eq!(ranges, vec![0..4, 4..7, 7..10]);
}

#[test]
fn a_parameter_one_rank_does_not_use_counts_as_zero_there() {
    let mut group = CpuCommunicator::group(2).unwrap();
    let grads: Vec<Vec<f32>> = std::thread::scope(|s| {
        let hs: Vec<_> = group
            .drain(..)
            .enumerate()
            .map(|(rank, comm)| {
                s.spawn(move || {
                    let dev = CpuBackend::new();
                    let a = Tensor::from_slice(&dev, &[1.0, 2.0], &[2])
                        .unwrap()
                        .requires_grad();
                    let b = Tensor::from_slice(&dev, &[3.0, 4.0], &[2])
                        .unwrap()
                        .requires_grad();
                    let ddp =
                        DataParallel::with_bucket_bytes(comm, &[a.clone(), b.clone()], 8).unwrap();
                    // Rank 0's loss uses a and b, rank 1's only a.
                    let loss = if rank == 0 {
                        a.mul(&b).unwrap().sum_all().unwrap()
                    } else {
                        a.sum_all().unwrap()
                    };
                    ddp.backward(&loss).unwrap();
                    let mut g = a.grad().unwrap().to_vec().unwrap();
                    g.extend(b.grad().unwrap().to_vec().unwrap());
                    g
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    // a: (b + 1) / 2 = [2, 2.5]; b: (a + 0) / 2 = [0.5, 1].
    for g in grads {
        assert_eq!(g, vec![2.0, 2.5, 0.5, 1.0]);
    }
}
