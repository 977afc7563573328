"""PyTorch peer of `bench --suite gpt`: nanoGPT's own GPT (its model.py, from the folder given)
training on random tokens as nanoGPT's bench.py does: bf16 autocast, TF32 on, fused AdamW
(lr 1e-3, betas 0.9/0.99, weight decay 0.1 on matrices), gradient clipping at 1.0; warm-up
steps, then the median over blocks of steps, each block ended by a synchronisation.

On the CPU (DEVICE cpu): f32 (no autocast), eager, nanoGPT's unfused AdamW, 2 threads.

usage: python3 gpt_torch.py NANOGPT_DIR CONFIG BATCH REPS COMPILE [DEVICE]
  (CONFIG shakespeare-char|gpt2|small; COMPILE 0|1; DEVICE cuda (default) or cpu)
prints one JSON line: {"step_ms": ..., "what": "..."}
"""
import json, statistics, sys, time
import torch

nanogpt, config, batch, reps, compile_ = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1"
device = sys.argv[6] if len(sys.argv) > 6 else "cuda"
cuda = device == "cuda"
if not cuda:
    torch.set_num_threads(2)
sys.path.insert(0, nanogpt)
from model import GPT, GPTConfig

torch.manual_seed(1337)
torch.backends.cuda.matmul.allow_tf32 = True
torch.backends.cudnn.allow_tf32 = True
if config == "gpt2":
    cfg = GPTConfig(block_size=1024, vocab_size=50304, n_layer=12, n_head=12, n_embd=768, dropout=0.0, bias=False)
elif config == "small":
    cfg = GPTConfig(block_size=64, vocab_size=65, n_layer=2, n_head=4, n_embd=64, dropout=0.0, bias=False)
else:
    cfg = GPTConfig(block_size=256, vocab_size=65, n_layer=6, n_head=6, n_embd=384, dropout=0.2, bias=False)
model = GPT(cfg).to(device)
opt = model.configure_optimizers(weight_decay=0.1, learning_rate=1e-3, betas=(0.9, 0.99), device_type=device)
if compile_:
    model = torch.compile(model)
import contextlib
ctx = torch.amp.autocast(device_type="cuda", dtype=torch.bfloat16) if cuda else contextlib.nullcontext()
windows = [torch.randint(0, cfg.vocab_size, (batch, cfg.block_size + 1), device=device) for _ in range(8)]
# Contiguous inputs and targets, as nanoGPT's get_batch makes them (its loss views targets).
data = [(w[:, :-1].contiguous(), w[:, 1:].contiguous()) for w in windows]

def step(i):
    x, y = data[i % len(data)]
    with ctx:
        _, loss = model(x, y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)

def sync():
    if cuda:
        torch.cuda.synchronize()

for i in range(10 if compile_ else 5):
    step(i)
sync()
block = 10
times = []
for r in range(reps):
    t = time.perf_counter()
    for i in range(block):
        step(i)
    sync()
    times.append((time.perf_counter() - t) / block * 1e3)
if cuda:
    what = f"nanoGPT model.py; torch {torch.__version__}; {'torch.compile' if compile_ else 'eager'}; bf16 autocast; TF32; fused AdamW"
else:
    what = f"nanoGPT model.py; torch {torch.__version__}; CPU, {torch.get_num_threads()} threads; f32; eager"
print(json.dumps({"step_ms": statistics.median(times), "what": what}))
