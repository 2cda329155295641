"""A gloo job with process groups beside the world, where rank BAD breaks one collective of its own
subgroup: planted hangs for the Flight Recorder verdict beyond the world group (issue 65).

usage: planted_subgroup.py LAYOUT MODE BAD
LAYOUT (world W, even):
  pairs     new_group per pair: {0,1}, {2,3}, ...
  halves    new_group per half: {0..W/2-1}, {W/2..W-1}
  strides   new_group per stride: {r, r+W/2} (at 4 ranks {0,2}, {1,3})
  row, col  a 2 x W/2 DeviceMesh ("dp", "tp"): the fault is in BAD's row group (its "tp" dim, W/2
            ranks) or its column group (its "dp" dim, 2 ranks)
MODE:
  skip      rank BAD skips one all_reduce of its subgroup; every rank then calls the world's all_reduce,
            where BAD waits for the partner that still waits in the subgroup's call
  gather    rank BAD calls all_gather in its subgroup where the others call all_reduce
  size      rank BAD passes a tensor of another size to its subgroup's all_reduce
  finish    no fault: every rank completes and exits without destroy_process_group, leaving the exit
            dumps of a job that succeeded (a verdict must find nothing in them)
"""

import sys
import time

import torch
import torch.distributed as dist

layout, mode, bad = sys.argv[1], sys.argv[2], int(sys.argv[3])
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
half = world // 2


def my_group() -> "dist.ProcessGroup":
    """This rank's subgroup of LAYOUT (every rank creates every group, in one order, as torch requires)."""
    if layout in ("row", "col"):
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh("cpu", (2, half), mesh_dim_names=("dp", "tp"))
        return mesh.get_group("tp" if layout == "row" else "dp")
    if layout == "pairs":
        sets = [[r, r + 1] for r in range(0, world, 2)]
    elif layout == "halves":
        sets = [list(range(half)), list(range(half, world))]
    else:
        sets = [[r, r + half] for r in range(half)]
    mine = None
    for ranks in sets:
        g = dist.new_group(ranks)
        if rank in ranks:
            mine = g
    assert mine is not None
    return mine


group = my_group()
t = torch.ones(4)
print(f"rank {rank} up", flush=True)
for _ in range(3):  # good collectives in both groups first: the sequence numbers are past 1
    dist.all_reduce(t)
    dist.all_reduce(t, group=group)
print(f"rank {rank} warm", flush=True)
if rank == bad and mode == "skip":
    pass
elif rank == bad and mode == "gather":
    dist.all_gather([torch.zeros(4) for _ in range(dist.get_world_size(group))], t, group=group)
elif rank == bad and mode == "size":
    dist.all_reduce(torch.ones(8), group=group)
else:
    dist.all_reduce(t, group=group)
dist.all_reduce(t)  # the world's: the skipping rank waits here for its partner, still in the subgroup's call
time.sleep(3600) if rank == bad and mode == "skip" else None
print(f"rank {rank} done", flush=True)
if mode != "finish":
    dist.destroy_process_group()
