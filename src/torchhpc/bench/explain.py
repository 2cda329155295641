"""``torchhpc bench explain``: what the columns mean, in a page users actually read."""

from __future__ import annotations

from torchhpc.bench.collectives import COLLECTIVES

__all__ = ["explain_text"]

_TEXT = """\
What the numbers of `torchhpc bench` mean (the same as NVIDIA's nccl-tests)

time    mean time of one call, from {iters} back-to-back calls after an untimed
        warm-up and a barrier, combined over ranks (-a: 1 = average, the
        default). `median` is the median single call: far below the mean
        means a few slow calls (a noisy link, a busy CPU) pull the mean up.

algbw   algorithm bandwidth = size / time, in GB/s with 1 GB = 1e9 bytes.
        `size` is the larger buffer one rank passes to the call. algbw is
        what your program sees, but it falls as you add ranks even on a
        perfect network, because each rank has more to send: you cannot
        compare it between 2 and 16 GPUs.

busbw   bus bandwidth = algbw x a factor per collective, chosen so that the
        result is the data each link carries per second, whatever the number
        of ranks n. This is the number to compare with the hardware:
{factors}
        With one rank nothing crosses a link, so busbw is 0 for all_reduce,
        all_gather, reduce_scatter and all_to_all: "Avg bus bandwidth = 0"
        on one GPU is correct, not a failure.

The link limit: busbw can at best reach the slowest link in the ring, per
direction. Within a node that is NVLink/xGMI (H100 NVLink4: 450 GB/s per
direction, so an all_reduce busbw of a few hundred GB/s is healthy); between
nodes it is the network per GPU: 200 Gb/s InfiniBand or RoCE = 25 GB/s,
400 Gb/s = 50 GB/s; over TCP sockets expect a fraction of the wire speed
(1.25 GB/s per 10 Gb/s). A multi-node busbw far below the NIC's speed usually
means NCCL is on the wrong interface or not using RDMA: look for "NET/IB" vs
"NET/Socket" with NCCL_DEBUG=INFO, and see `torchhpc net` for the interface
and GID settings. Tables in Gb/s (as some site guides print) are busbw x 8.

Sizes: small messages measure latency (time flat, bandwidth low); the
plateau at large sizes (>= 64-256 MiB on GPUs) is the bandwidth. Compare
plateaus, not single sizes; use -b 8 -e 1G -f 2 for the whole curve.

#wrong  elements that differ from the expected result in one call made after
        timing on fresh data, summed over ranks. Anything but 0 is a broken
        collective (bad driver, memory, or network); the run then exits 1.
        `Out of bounds values : N OK|FAILED` totals it.

Placements: out-of-place passes separate input and output buffers, in-place
one buffer. torch.distributed's all_reduce, broadcast and reduce take one
buffer: their out-of-place call copies the input into the output, then runs
the collective there (the copy is in the time, as in a torch program).
all_to_all and sendrecv are out-of-place only: their in-place column reads n/a. `Avg bus bandwidth` is the mean busbw over every size and
placement shown; --min-bw GBPS fails the run when it is below GBPS.
"""


def explain_text(iters: int = 20) -> str:
    factors = {"all_reduce": "2(n-1)/n", "broadcast": "1", "reduce": "1", "sendrecv": "1"}
    rows = [f"          {c.name:<15} {factors.get(c.name, '(n-1)/n'):<9} {c.describe}"
            for c in COLLECTIVES.values()]
    return _TEXT.format(iters=iters, factors="\n".join(rows))
