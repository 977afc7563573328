"""PyTorch DDP peer of `gpt --devices N` (issue 37): nanoGPT's own GPT (its model.py, from the
folder given) wrapped in DistributedDataParallel, one process per GPU (torch.multiprocessing,
as torchrun starts them), each on its own random batch of BATCH x block tokens: bf16
autocast, TF32, fused AdamW (lr 1e-3, betas 0.9/0.99, weight decay 0.1 on matrices), clipping
at 1.0, as gpt_torch.py does on one GPU. After warm-up, the median over blocks of 10 steps,
each block ended by a synchronisation; tokens/s counts every rank's tokens.

usage: python3 gpt_ddp_torch.py NANOGPT_DIR CONFIG BATCH REPS COMPILE GPUS[,GPUS...]
prints one line per group size
"""
import os, statistics, sys, tempfile, time
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP


def config(name):
    from model import GPTConfig
    if name == "gpt2":
        return GPTConfig(block_size=1024, vocab_size=50304, n_layer=12, n_head=12, n_embd=768, dropout=0.0, bias=False)
    if name == "small":
        return GPTConfig(block_size=64, vocab_size=65, n_layer=2, n_head=4, n_embd=64, dropout=0.0, bias=False)
    return GPTConfig(block_size=256, vocab_size=65, n_layer=6, n_head=6, n_embd=384, dropout=0.2, bias=False)


def rank_main(rank, size, init, nanogpt, name, batch, reps, compile_, out):
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    sys.path.insert(0, nanogpt)
    from model import GPT
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{init}", rank=rank, world_size=size,
                            device_id=torch.device("cuda", rank))
    torch.manual_seed(1337)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    cfg = config(name)
    model = GPT(cfg).cuda()
    opt = model.configure_optimizers(weight_decay=0.1, learning_rate=1e-3, betas=(0.9, 0.99), device_type="cuda")
    if compile_:
        model = torch.compile(model)
    model = DDP(model, device_ids=[rank])
    ctx = torch.amp.autocast(device_type="cuda", dtype=torch.bfloat16)
    g = torch.Generator(device="cuda").manual_seed(rank)
    windows = [torch.randint(0, cfg.vocab_size, (batch, cfg.block_size + 1), device="cuda", generator=g) for _ in range(8)]
    data = [(w[:, :-1].contiguous(), w[:, 1:].contiguous()) for w in windows]

    def step(i):
        x, y = data[i % len(data)]
        with ctx:
            _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    for i in range(10 if compile_ else 5):
        step(i)
    torch.cuda.synchronize()
    times = []
    for r in range(reps):
        dist.barrier()
        start = time.perf_counter()
        for i in range(10):
            step(i)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) / 10)
    if rank == 0:
        out.put(statistics.median(times))
    dist.destroy_process_group()


def main():
    nanogpt, name, batch, reps, compile_, gpus = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1", sys.argv[6]
    ctx = mp.get_context("spawn")
    block = {"gpt2": 1024, "small": 64}.get(name, 256)
    for size in [int(s) for s in gpus.split(",") if int(s) <= torch.cuda.device_count()]:
        out = ctx.Queue()
        with tempfile.TemporaryDirectory() as d:
            procs = [ctx.Process(target=rank_main, args=(r, size, os.path.join(d, "init"), nanogpt, name, batch, reps, compile_, out)) for r in range(size)]
            for p in procs:
                p.start()
            t = out.get(timeout=900)
            for p in procs:
                p.join()
        tokens = size * batch * block
        print(f"torch DDP {name} {'compile' if compile_ else 'eager'}, {size} GPUs, batch {batch} x {block} per GPU: "
              f"{t * 1e3:.2f} ms per iteration, {tokens / t:.0f} tokens/s", flush=True)


if __name__ == "__main__":
    main()
