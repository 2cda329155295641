"""Real GPU failures on purpose, to record their texts and check torchhpc's verdict on them.

    torchhpc run -n 1 benchmarks/gpu_failures.py oom            # a real CUDA out-of-memory
    torchhpc run -n 1 benchmarks/gpu_failures.py bad-ordinal    # NCCL init bound to a GPU that is not there
    torchhpc run -n 1 -e NCCL_SOCKET_IFNAME=nosuchif0 benchmarks/gpu_failures.py nccl
    torchhpc run -n 2 benchmarks/gpu_failures.py nccl           # two ranks on one GPU, plain torch: NCCL's own error
    torchhpc run -n 2 benchmarks/gpu_failures.py thd            # the same through thd.init(): refused before NCCL

``benchmarks/gpu_proof.sh`` runs them on a GPU machine; the texts they printed
there are in ``tests/data/diagnose/messages`` (its README says which). The
cases use plain ``torch.distributed`` where the point is the library's own
message, and ``torchhpc.dist`` only for the pre-flight case. Without a GPU
every case says so and exits 0: there is nothing to provoke.
"""

from __future__ import annotations

import argparse
import os
import sys

CASES = ("oom", "bad-ordinal", "nccl", "thd")


def grow_activations() -> None:
    """A training step at a batch far larger than the card holds: the allocator's own out-of-memory."""
    import torch
    import torch.nn.functional as F

    total = torch.cuda.get_device_properties(0).total_memory
    try:
        import torchvision

        model = torchvision.models.resnet50(weights=None).cuda().to(memory_format=torch.channels_last)
        # ResNet-50 at 224 px keeps ~45 MB of bf16 activations per image for the backward pass.
        batch = int(2 * total / 45e6)
        x = torch.randn(batch, 3, 224, 224, device="cuda").contiguous(memory_format=torch.channels_last)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), torch.zeros(batch, dtype=torch.long, device="cuda"))
        loss.backward()
    except ImportError:  # no torchvision: the same allocator message from plain blocks
        blocks = [torch.empty(total // 8, dtype=torch.uint8, device="cuda") for _ in range(16)]
        del blocks


def nccl_all_reduce(device_index: int) -> None:
    """Plain torch: an NCCL process group bound to ``device_index``, one all_reduce."""
    import torch
    import torch.distributed as dist

    dev = torch.device("cuda", device_index)
    dist.init_process_group("nccl", device_id=dev)
    t = torch.ones(1, device=dev)
    dist.all_reduce(t)
    torch.cuda.synchronize(dev)
    print(f"rank {dist.get_rank()}: all_reduce gave {t.item()}", flush=True)
    dist.destroy_process_group()


def thd_all_reduce() -> None:
    import torch

    import torchhpc.dist as thd

    with thd.init() as ctx:
        t = torch.ones(1, device=ctx.device)
        thd.all_reduce_mean(t)
        ctx.print(f"all_reduce over {ctx.world_size} rank(s) gave {t.item()}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("case", choices=CASES)
    args = p.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print(f"No GPU visible: case {args.case} provokes a GPU failure and has nothing to provoke here.")
        return 0
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if args.case == "oom":
        grow_activations()
    elif args.case == "bad-ordinal":
        nccl_all_reduce(torch.cuda.device_count() + local)  # one past the last GPU
    elif args.case == "nccl":
        nccl_all_reduce(0)  # every rank on GPU 0
    else:
        thd_all_reduce()
    return 0


if __name__ == "__main__":
    sys.exit(main())
