"""The sites of the seed documents, as data. Every value cites where it comes from.

Users override any field in their own profiles.toml (a table with the same
name extends the built-in one); an account is never guessed.
"""

from __future__ import annotations

from torchhpc.profiles.model import Profile

__all__ = ["BUILTIN", "LUMI_CPU_MASKS"]

# Seed 002: "Linear assignment of GCD, then match the cores" — 7 cores (0xfe: core 0 of each
# L3 region left to the OS) per GCD, in the order GCD 0..7 sit on the CCDs of a LUMI-G node.
_C = "fe"
LUMI_CPU_MASKS = ",".join(
    f"0x{_C}{'0' * zeros}" for zeros in (12, 14, 4, 6, 0, 2, 8, 10)
)

BUILTIN: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile(
            name="mn5",
            description="MareNostrum5 accelerated partition (BSC): 4 H100 per node, Singularity",
            scheduler="slurm",
            launcher="torchrun",
            # MN5 routes jobs to the accelerated partition through the acc_* QoS
            # (acc_debug, acc_bsccs); the seed's scripts set no --partition.
            gpus_per_node=4,
            cpus_per_gpu=20,  # "--cpus-per-task: 20 * number of GPUs requested"
            modules=("singularity",),  # "Remember to load the module `module load singularity`"
            container_runtime="singularity",
            network="infiniband",
            require=("account", "qos", "time"),  # "Both parameters must be configured"; time "is mandatory"
            # ...for batch jobs; the seed's `salloc -q acc_debug --account bsc98 --gres=gpu:2
            # --cpus-per-task 40` gives no --time (the QoS has a default limit).
            shell_optional=("time",),
            gpu_kind="nvidia",
        ),
        Profile(
            name="lumi",
            description="LUMI-G (CSC): 8 MI250X GCDs per node, Slingshot hsn0-3, PyTorch Singularity module",
            scheduler="slurm",
            launcher="srun",  # one task per GCD: srun --ntasks=$((SLURM_NNODES*8))
            partition="standard-g",
            gpus_per_node=8,
            cpus_per_gpu=7,  # the 0xfe masks: 7 cores per GCD
            mem="480G",
            modules=("LUMI/24.03", "PyTorch/2.3.1-rocm-6.0.3-python-3.12-singularity-20240923"),
            container_runtime="singularity",
            container_image="$SIF",  # set by the PyTorch container module
            # The seed runs `singularity exec $SIFPYTORCH` with no --rocm: the image brings its
            # own ROCm, and --rocm would bind the host's over it.
            container_options=(("gpu", "none"),),
            image_without_torchhpc=True,  # the EasyBuild PyTorch container: torch, torchvision, no torchhpc
            network="lumi-slingshot",
            cpu_bind="mask_cpu:" + LUMI_CPU_MASKS,
            env=(
                # Seed 002's runscript: "each task uses the proper GPU", ROCR_VISIBLE_DEVICES from the
                # local id (GCD i for task i, matching mask i above); done by the task shim, which also
                # applies mask i under mpirun (srun applies cpu_bind itself).
                ("TORCHHPC_GPU_PER_TASK", "ROCR_VISIBLE_DEVICES"),
                ("TORCHHPC_CPU_MASKS", LUMI_CPU_MASKS),
            ),
            setup=(
                # MIOpen's default cache on Lustre breaks (file locking): a per-node /tmp cache.
                'export MIOPEN_USER_DB_PATH="/tmp/${USER:-$(id -un)}-miopen-cache-${SLURM_JOB_ID:-0}"',
                'export MIOPEN_CUSTOM_CACHE_DIR="$MIOPEN_USER_DB_PATH"',
                'srun --ntasks="${SLURM_NNODES:-1}" --ntasks-per-node=1 mkdir -p "$MIOPEN_USER_DB_PATH"',
            ),
            # Seed 002 charges a project (`export SBATCH_ACCOUNT=project_...`) and sets a limit
            # (`--time=5:00`): both required, as on mn5; $SBATCH_ACCOUNT satisfies the account.
            require=("account", "time"),
            gpu_kind="amd",
        ),
        Profile(
            name="alliance-cc",
            description="Digital Research Alliance of Canada clusters: srun + torchrun, venv on modules",
            scheduler="slurm",
            launcher="torchrun",
            gpus_per_node=4,
            # The Alliance's default is 256 MB per core ("Running jobs"): without a request a ResNet
            # job is OOM-killed. Its PyTorch guide asks memory per node with --mem; 8G per GPU here.
            mem="32G",
            modules=("StdEnv/2020", "gcc/11.3.0", "cuda/11.7", "nccl/2.12.12", "python/3.8.10"),
            require=("account",),  # def-<pi> allocations
            gpu_kind="nvidia",
        ),
        Profile(
            name="sockeye",
            description="UBC Sockeye (PBS): mpirun + python once on the first node with $PBS_NODEFILE",
            scheduler="pbs",
            launcher="mpirun",
            gpus_per_node=4,
            modules=("gcc/9.4.0", "python/3.8.10", "cuda/11.3.1", "nccl/2.9.9-1-cuda11-3"),
            # the HPC_helper guide's mpirun flags `-mca pml ob1 -mca btl ^openib`, as Open MPI variables
            env=(("OMPI_MCA_pml", "ob1"), ("OMPI_MCA_btl", "^openib")),
            require=("account",),
            gpu_kind="nvidia",
        ),
        Profile(
            name="rcp",
            description="EPFL RCP: RunAI on Kubernetes, RoCE v2 over mlx5 with the right GID index",
            scheduler="runai",
            launcher="torchrun",
            # The roce preset (NCCL_IB_HCA=mlx5, socket tuning, as the seed exports), then
            # `net detect` at pod start for the seed's key step: NCCL_IB_GID_INDEX from sysfs.
            network="roce,auto",
            options=(
                ("cli", "v1"),  # the RunAI on RCP guide documents `runai submit-dist`; --opt cli=v2 for the current CLI
                ("annotation", "k8s.v1.cni.cncf.io/networks=kube-system/roce"),
                ("extended-resource", "rdma/rdma=1"),
                ("large-shm", "true"),
            ),
            gpu_kind="nvidia",
        ),
    )
}
