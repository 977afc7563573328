//! # tensor-autograd: a PyTorch-like tensor library over any `hal` backend
//!
//! Strided tensors whose data stays on the device, define-by-run reverse-mode autograd, the
//! layers and losses of a small `nn`, fused optimisers and a background-thread data loader. The
//! crate depends on `hal` only: the same model code trains on the CPU, wgpu or CUDA backend,
//! whichever the binary picks at run time.
//!
//! Where things live:
//! - [`Tensor`] (`tensor.rs`): a buffer, a [`hal::Layout`] and, for results of differentiable
//!   operations, the node that made it. Constructors, host transfer (`to_vec`, `item`), dtype
//!   casts and device moves.
//! - `autocast.rs`: mixed precision, [`autocast`] (products and attention in bf16 or f16,
//!   norms and losses in f32, f32 master weights), as `torch.autocast`;
//!   [`optim::GradScaler`] scales f16 losses.
//! - `autograd.rs`: the tape-free graph (each tensor holds its node), [`Tensor::backward`],
//!   [`no_grad`].
//! - `ops/`: every operation and its backward: `elementwise.rs` (arithmetic, math functions,
//!   comparisons, `where`), `reduce.rs` (sum, mean, max, var, softmax, ...), `movement.rs`
//!   (views: reshape, permute, expand, narrow, flip, step; copies: pad, cat, stack),
//!   `linalg.rs` (batched matmul, conv2d by im2col, pooling), `index.rs` (gather,
//!   index_select, embedding), `loss.rs`, `random.rs` (dropout).
//! - [`nn`]: the [`nn::Module`] trait and layers; safetensors save/load.
//! - [`optim`]: SGD, Adam, AdamW on the backends' fused step kernels; schedules; clipping.
//! - [`gradcheck`] (`gradcheck.rs`): autograd's gradients against central differences, in
//!   f64 tensors (every primitive of the CPU and CUDA backends computes in f64, and the fused
//!   backward kernels are built in the tensors' width, erf's included; f64 cross-entropy is
//!   the composition `log_softmax` + `nll_loss`, the one-kernel form being f32's).
//! - [`distributed`]: data-parallel training ([`distributed::DataParallel`]): parameters
//!   broadcast from rank 0, gradients averaged over a [`hal::Communicator`] in buckets as the
//!   backward pass finishes them.
//! - [`data`]: datasets and a [`data::DataLoader`] that prepares the next batch on a thread;
//!   [`idx`]: the IDX files of real MNIST (`cargo xtask fetch mnist` downloads them);
//!   [`text`]: character and GPT-2 tokenizers, nanoGPT's `.bin` token files as random batches.
//! - [`gpt`]: nanoGPT's GPT (fused causal self-attention over the packed qkv projection, or
//!   composed from matmul, an additive mask and softmax for comparison; tied head; nanoGPT's
//!   state names, so its `GPT` loads our checkpoints) with `generate` (temperature, top-k).
//! - [`models`]: the reference MLP and LeNet-style CNN, the training loop the examples and the
//!   bench share ([`models::train_step`], and [`models::RecordedStep`], the same step recorded
//!   once and replayed: one device-graph launch a step on CUDA), and the digits / synthetic
//!   MNIST-shaped datasets.
//!
//! ```
//! use backend_cpu::CpuBackend;
//! use tensor_autograd::Tensor;
//! let dev = CpuBackend::new();
//! let x = Tensor::from_slice(&dev, &[1.0, 2.0, 3.0], &[3]).unwrap().requires_grad();
//! let y = x.mul(&x).unwrap().sum_all().unwrap();   // y = sum x^2
//! y.backward().unwrap();
//! assert_eq!(x.grad().unwrap().to_vec().unwrap(), vec![2.0, 4.0, 6.0]);
//! ```
//!
//! Invariants: movement operations launch nothing (they make views); nothing is read back to
//! the host unless asked (`to_vec`, `item`, a loss printed by the caller); backward runs on the
//! device the forward ran on, with the backends' race-free reductions and scatter-adds.

mod autocast;
mod autograd;
pub mod data;
pub mod distributed;
mod error;
pub mod gpt;
mod gradcheck;
pub mod idx;
pub mod models;
pub mod nn;
mod ops;
pub mod optim;
mod tensor;
pub mod text;

pub use autocast::{autocast, autocast_dtype};
pub use autograd::{is_grad_enabled, no_grad};
pub use error::{Error, Result};
pub use gradcheck::{GradcheckOptions, GradcheckReport, gradcheck};
pub use ops::{AttentionOptions, Conv2dOptions};
pub use tensor::Tensor;
