"""PyTorch peer of `bench --suite train`: the same models, batch and optimiser, timed the same way
(warm-up steps, then the median over blocks of steps, each block ended by a synchronisation).

usage: python3 train_torch.py MODEL DEVICE THREADS REPS   (MODEL mlp|cnn, DEVICE cpu|cuda)
prints one JSON line: {"step_ms": ..., "what": "..."}
"""
import json, statistics, sys, time
import torch
import torch.nn as nn

model_name, device, threads, reps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
torch.set_num_threads(threads)
torch.manual_seed(0)
if model_name == "mlp":
    model = nn.Sequential(nn.Flatten(), nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
else:
    model = nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10))
model = model.to(device)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
loss_fn = nn.CrossEntropyLoss()
batches = [(torch.randn(256, 1, 28, 28, device=device), torch.randint(0, 10, (256,), device=device)) for _ in range(8)]

def step(i):
    x, y = batches[i % len(batches)]
    opt.zero_grad(set_to_none=True)
    loss = loss_fn(model(x), y)
    loss.backward()
    opt.step()

def sync():
    if device == "cuda":
        torch.cuda.synchronize()

for i in range(5):
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
print(json.dumps({"step_ms": statistics.median(times), "what": f"torch {torch.__version__} eager Adam {device} {threads} threads"}))
