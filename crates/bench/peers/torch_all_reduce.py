"""PyTorch's all-reduce timed the way `collectives --bandwidth` times ours: the anchor for
the collectives' bandwidth (issue 37).

One process per GPU (torch.multiprocessing), NCCL through torch.distributed, a tensor of
`--gib` GiB of float32 summed in place; 5 warm-up calls, then `--reps` timed ones, each
between a barrier and a synchronize. Prints the median time, the algorithm bandwidth
(bytes / time) and the bus bandwidth (x 2 (n - 1) / n, as nccl-tests reports it).

    python torch_all_reduce.py --gpus 2,4 --gib 1 --reps 20
"""

import argparse
import os
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def rank_main(rank, size, init_file, gib, reps, out):
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    torch.cuda.set_device(rank)
    dist.init_process_group(
        "nccl", init_method=f"file://{init_file}", rank=rank, world_size=size,
        device_id=torch.device("cuda", rank))
    n = int(gib * (1 << 30)) // 4
    x = torch.ones(n, dtype=torch.float32, device="cuda")
    times = []
    for rep in range(5 + reps):
        dist.barrier()
        torch.cuda.synchronize()
        start = time.perf_counter()
        dist.all_reduce(x)
        torch.cuda.synchronize()
        if rep >= 5:
            times.append(time.perf_counter() - start)
    if rank == 0:
        t = statistics.median(times)
        alg = n * 4 / t / 1e9
        bus = alg * 2 * (size - 1) / size
        out.put((t, alg, bus))
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--gpus", default="2,4")
    p.add_argument("--gib", type=float, default=1.0)
    p.add_argument("--reps", type=int, default=20)
    a = p.parse_args()
    available = torch.cuda.device_count()
    print(f"PyTorch {torch.__version__}, NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}, {available} GPUs")
    ctx = mp.get_context("spawn")
    for size in [int(g) for g in a.gpus.split(",") if int(g) <= available]:
        out = ctx.Queue()
        with tempfile.TemporaryDirectory() as d:
            init = os.path.join(d, "init")
            procs = [ctx.Process(target=rank_main, args=(r, size, init, a.gib, a.reps, out))
                     for r in range(size)]
            for pr in procs:
                pr.start()
            t, alg, bus = out.get(timeout=600)
            for pr in procs:
                pr.join()
        print(f"torch all_reduce f32 sum, {a.gib:.2f} GiB, {size} GPUs: median {t * 1e3:.3f} ms, "
              f"algbw {alg:.1f} GB/s, busbw {bus:.1f} GB/s ({a.reps} reps)")


if __name__ == "__main__":
    main()
