"""submitit's helpers inside a Slurm job, as submitit's docs show.

JobEnvironment() recognises a job by SUBMITIT_EXECUTOR, which submitit's own sbatch
exports; a script launched by torchhpc says it itself. export(overwrite=True):
torchhpc's batch script already exports MASTER_ADDR/MASTER_PORT (submitit's does not).
"""

import os

import submitit
import torch
import torch.distributed as dist

os.environ.setdefault("SUBMITIT_EXECUTOR", "slurm")
job_env = submitit.JobEnvironment()
dist_env = submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False, overwrite=True)
dist.init_process_group(backend="gloo")
t = torch.tensor([float(dist_env.rank + 1)])
dist.all_reduce(t)
print(
    f"COMPAT row=submitit rank={job_env.global_rank} world={job_env.num_tasks} sum={t.item():g} "
    f"via={type(job_env).__name__}:local={job_env.local_rank}",
    flush=True,
)
dist.destroy_process_group()
