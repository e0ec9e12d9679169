"""Data-parallel training of a small B-spline KAN with torch.distributed (DDP, or FSDP2 with ``--fsdp``).

The model is a stack of ``warpkan.torch_bridge.KANLinear`` layers (widths 2-16-16-1 by default) fitted to
f(x, y) = exp(sin(pi x) + y^2) on [-1, 1]^2. Every rank draws the same global batch of each step from a
seeded generator and trains on its own contiguous slice of ``--batch`` samples, so a run on N ranks computes
the same gradients (DDP averages them) as one rank with the N slices combined. Timing starts after
``--warmup`` steps (Warp compiles its kernels on first use); each rank prints its samples/s and rank 0
prints the total and checks that the loss went down.

The warpkan ops launch their Warp kernels on torch's current stream, so the gradients that DDP's
all-reduce hooks (or FSDP2's reduce-scatter) read are ordered after the kernels that wrote them.

    python examples/train_distributed.py [--quick]                                      # 1 process
    torchrun --nproc_per_node=2 examples/train_distributed.py --backend gloo            # 2 CPU processes
    torchrun --nproc_per_node=2 examples/train_distributed.py --backend nccl            # 2 GPUs
    torchrun --nproc_per_node=2 examples/train_distributed.py --backend nccl --fsdp     # FSDP2
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
import warnings

import torch
import torch.distributed as dist
from torch import nn


QUICK = {"steps": 40, "warmup": 5, "batch": 512}  # --quick: a short run; the loss must still go down


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help=f"a short run: {', '.join(f'--{k} {v}' for k, v in QUICK.items())} unless given")
    parser.add_argument("--backend", choices=("gloo", "nccl"), default=None,
                        help="process-group backend: nccl puts rank r on cuda:LOCAL_RANK, gloo runs on the CPU "
                             "(default: nccl when CUDA is available, else gloo)")
    parser.add_argument("--fsdp", action="store_true", help="shard the model with FSDP2 (fully_shard) instead of DDP")
    parser.add_argument("--steps", type=int, default=200, help="training steps, warm-up included")
    parser.add_argument("--warmup", type=int, default=10, help="steps left out of the throughput timing")
    parser.add_argument("--batch", type=int, default=4096, help="samples per rank per step")
    parser.add_argument("--widths", default="2,16,16,1", help="layer widths, comma separated")
    parser.add_argument("--grid-size", type=int, default=8)
    parser.add_argument("--spline-order", type=int, default=3)
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    parser.add_argument("--optimizer", choices=("adam", "sgd"), default="adam")
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log-every", type=int, default=50,
                        help="show the loss on rank 0's progress bar every this many steps (0: never)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--save-state", default=None,
                        help="rank 0 writes the trained model's full state_dict (on the CPU) to this file")
    parser.add_argument("--no-check", action="store_true", help="don't fail when the loss did not go down")
    args = parser.parse_args(argv)
    if args.quick:  # the quick values as defaults, so that options given explicitly still win
        parser.set_defaults(**QUICK)
        args = parser.parse_args(argv)
    if args.steps < 1 or args.batch < 1 or args.warmup < 0:
        parser.error("--steps and --batch must be positive and --warmup non-negative")
    if args.warmup >= args.steps:
        parser.error(f"--warmup ({args.warmup}) must be smaller than --steps ({args.steps}): nothing would be timed")
    return args


def target_function(xy: torch.Tensor) -> torch.Tensor:
    return torch.exp(torch.sin(math.pi * xy[:, :1]) + xy[:, 1:2] ** 2)


def build_model(widths, grid_size: int, spline_order: int, device, dtype, seed: int) -> nn.Sequential:
    """The same initial parameters on every rank (seeded), so FSDP2 shards agree and DDP's start-up
    broadcast from rank 0 changes nothing. The layers' parameters are contiguous (their default), as FSDP2
    requires."""
    from warpkan.torch_bridge import KANLinear

    torch.manual_seed(seed)
    return nn.Sequential(*(
        KANLinear(n_in, n_out, grid_size=grid_size, spline_order=spline_order, device=device, dtype=dtype)
        for n_in, n_out in zip(widths[:-1], widths[1:])
    ))


def global_batch(step: int, global_size: int, seed: int, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole step's batch, on the CPU, identical on every rank and for any world size."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + step)
    xy = torch.rand(global_size, 2, generator=generator, dtype=torch.float64) * 2 - 1
    return xy.to(dtype), target_function(xy).to(dtype)


def rank_batches(steps: int, batch: int, rank: int, world: int, seed: int, device, dtype):
    """This rank's slice [rank * batch, (rank + 1) * batch) of every step's global batch, made up front so
    the timed loop does no data work. A few distinct batches are cycled when there are many steps."""
    distinct = min(steps, 16)
    batches = []
    for step in range(distinct):
        xy, z = global_batch(step, batch * world, seed, dtype)
        rows = slice(rank * batch, (rank + 1) * batch)
        batches.append((xy[rows].to(device), z[rows].to(device)))
    return [batches[step % distinct] for step in range(steps)]


def make_optimizer(name: str, params, lr: float) -> torch.optim.Optimizer:
    return torch.optim.Adam(params, lr=lr) if name == "adam" else torch.optim.SGD(params, lr=lr)


def train(model: nn.Module, optimizer: torch.optim.Optimizer, batches, *, warmup: int = 0, log_every: int = 0,
          progress: bool = False, desc: str = "", synchronize=lambda: None) -> tuple[list[float], float]:
    """Plain training loop on the prepared batches; returns (losses of this rank, seconds for the steps after
    ``warmup``). The loss is read back only every ``log_every`` steps (shown on the progress bar) and at the
    end, to keep the loop asynchronous."""
    from tqdm import tqdm

    losses = []
    start = None
    bar = tqdm(batches, desc=desc, disable=not progress, file=sys.stdout)
    for step, (xy, z) in enumerate(bar):
        if step == warmup:
            synchronize()
            start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(model(xy), z)
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
        if progress and log_every and (step % log_every == 0 or step == len(batches) - 1):
            bar.set_postfix(loss=f"{loss.item():.3e}")
    synchronize()
    bar.close()
    elapsed = time.perf_counter() - start if start is not None else float("nan")
    return [float(v) for v in torch.stack(losses).cpu()], elapsed


def full_state_dict(model: nn.Module) -> dict:
    """The unsharded, unwrapped state_dict on the CPU (collective under FSDP2: call it on every rank)."""
    from torch.distributed.tensor import DTensor

    inner = model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model
    state = {}
    for name, value in inner.state_dict().items():
        if isinstance(value, DTensor):
            value = value.full_tensor()
        state[name] = value.detach().cpu().clone()
    return state


def main(argv=None) -> int:
    args = parse_args(argv)
    backend = args.backend or ("nccl" if torch.cuda.is_available() else "gloo")
    rank = int(os.environ.get("RANK", 0))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    if backend == "nccl":
        if not torch.cuda.is_available():
            raise SystemExit("--backend nccl needs CUDA; use --backend gloo on the CPU")
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    device_id = device if device.type == "cuda" else None
    if "RANK" in os.environ:  # started by torchrun (or another launcher that sets the env:// variables)
        dist.init_process_group(backend, device_id=device_id)
    else:  # plain `python examples/train_distributed.py`: one process, which needs no rendezvous
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, device_id=device_id)
    status = _run(args, backend, rank, world, device)
    # every rank reaches this point before any tears its connections down: a rank that exits while a peer
    # is still talking to it can abort that peer at exit. (On an exception there is no barrier: the peers
    # would wait forever; torchrun ends them.)
    dist.barrier()
    dist.destroy_process_group()
    return status


def _run(args, backend, rank, world, device) -> int:
    dtype = getattr(torch, args.dtype)
    widths = [int(w) for w in args.widths.split(",")]
    if widths[0] != 2 or widths[-1] != 1:
        raise SystemExit(f"--widths must start with 2 and end with 1 (f maps R^2 to R), got {args.widths}")

    def log(message):
        print(f"[rank {rank}/{world}] {message}", flush=True)

    model = build_model(widths, args.grid_size, args.spline_order, device, dtype, args.seed)
    if args.fsdp:
        # FSDP2 warns whenever a wrapped module returns a view (KANLinear reshapes its 2-D result back to the
        # input's leading shape); the warning is about in-place ops on that output, which this loop never does.
        warnings.filterwarnings("ignore", message=".*returned a view tensor.*")
        from torch.distributed.fsdp import fully_shard

        for layer in model:
            fully_shard(layer)
        fully_shard(model)
        wrapped = model
    else:
        wrapped = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = make_optimizer(args.optimizer, wrapped.parameters(), args.lr)
    batches = rank_batches(args.steps, args.batch, rank, world, args.seed, device, dtype)
    synchronize = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    if rank == 0:
        n_params = sum(p.numel() for p in model.parameters())
        log(f"{'FSDP2' if args.fsdp else 'DDP'} on {backend}, {world} rank(s), widths {widths}, grid {args.grid_size}, "
            f"{args.dtype}, {n_params} parameters (global count), {args.batch} samples/rank/step, {args.steps} steps")

    losses, elapsed = train(wrapped, optimizer, batches, warmup=args.warmup, log_every=args.log_every,
                            progress=rank == 0 and not args.no_progress, desc=f"[rank 0/{world}] training",
                            synchronize=synchronize)

    timed_steps = args.steps - args.warmup
    rate = timed_steps * args.batch / elapsed if timed_steps > 0 else 0.0
    log(f"throughput {rate:,.0f} samples/s ({timed_steps} timed steps in {elapsed:.3f} s, {device})")
    totals = torch.tensor([rate, losses[0], losses[-1]], dtype=torch.float64,
                          device=device if backend == "nccl" else "cpu")
    dist.all_reduce(totals)
    total_rate, first_loss, last_loss = totals[0].item(), totals[1].item() / world, totals[2].item() / world

    state = full_state_dict(wrapped)
    if rank == 0:
        if timed_steps > 0:
            log(f"total throughput {total_rate:,.0f} samples/s over {world} rank(s) "
                f"({total_rate / world:,.0f} per rank)")
        log(f"mean loss over ranks: first step {first_loss:.4e}, last step {last_loss:.4e}")
        if args.save_state:
            torch.save(state, args.save_state)
    if not args.no_check and not last_loss < first_loss:
        log("FAILED: the loss did not go down")
        return 1
    return 0


def exit_without_teardown(status: int) -> None:
    """End a torchrun worker without running the interpreter's teardown.

    Once DDP has wrapped a model, torch keeps the gloo backend alive from C++ until the process ends: its
    worker threads (``gloo_tcp_loop``, ``pt_gloo_runloop``) are still running after
    ``destroy_process_group``, whatever Python still holds. At interpreter teardown one of them can then
    race the exit handlers and abort the process ("terminate called without an active exception", SIGABRT),
    about once in 300 two-rank CPU runs measured here, after all of the run's work and output are done. Every
    result is written by now, so the worker flushes its output and leaves directly.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


if __name__ == "__main__":
    exit_without_teardown(main())
