"""Which detector wins, in one place, with the reason for each position.

``detect()`` and ``explain()`` are pure functions of an environment mapping
(plus a file reader for PBS nodefiles). ``export()`` is the separate step that
writes torch's ``env://`` contract into an environment, and only where the
user has not set a value already.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping
from dataclasses import replace

from torchhpc.env.base import DistEnv, FileReader, Verdict, read_text
from torchhpc.env.context import job_context
from torchhpc.env.detector import Detector
from torchhpc.env.jobs import (
    KubeflowDetector,
    LocalDetector,
    ManualEnvDetector,
    PBSDetector,
    RunAIDetector,
    SlurmDetector,
    TrainJobDetector,
)
from torchhpc.env.launchers import MPICH, MVAPICH, OPENMPI, MPIDetector, TorchrunDetector

__all__ = ["PRIORITY", "conflicts", "detect", "explain", "export"]

# (detector, why it sits here). The first detector that matches wins.
PRIORITY: tuple[tuple[Detector, str], ...] = (
    (
        TorchrunDetector(),
        "first: torchrun runs inside srun, PBS and pods; its RANK/LOCAL_RANK are process ranks, "
        "while the outer variables count tasks, nodes or pods",
    ),
    (
        MPIDetector(OPENMPI),
        "MPI before Slurm: an mpirun inside an allocation sees the batch step's SLURM_* and the "
        "srun step of its own daemons (SLURM_PROCID = node index), not its ranks",
    ),
    (MPIDetector(MPICH), "MPICH/Hydra/Intel MPI: same reason as Open MPI; srun --mpi=pmi2 also sets PMI_* and agrees"),
    (MPIDetector(MVAPICH), "MVAPICH: same reason as Open MPI"),
    (
        SlurmDetector(),
        "srun-direct: one task per process; only a real srun step (SLURM_STEP_NUM_TASKS) counts, "
        "so a batch script is never taken for rank 0 of N",
    ),
    (
        TrainJobDetector(),
        "pods after process launchers (torchrun's workers in a TrainJob pod carry LOCAL_RANK); before "
        "RunAI/Kubeflow v1: PET_MASTER_ADDR is set only by Kubeflow Trainer v2, which sets no RANK or MASTER_ADDR",
    ),
    (
        RunAIDetector(),
        "pods after process launchers: RunAI's RANK/WORLD_SIZE count pods; before Kubeflow, whose "
        "PyTorchJob RunAI uses underneath",
    ),
    (KubeflowDetector(), "PyTorchJob pods: RANK is the pod index; process ranks need the processes per pod"),
    (PBSDetector(), "a PBS job script outside mpirun is one process (PBS starts no ranks itself)"),
    (
        ManualEnvDetector(),
        "RANK/WORLD_SIZE set by hand: late, because pods and launchers set them with other meanings",
    ),
    (LocalDetector(), "last: always matches, a single process"),
)


def _environ(env: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if env is None else env


def explain(env: Mapping[str, str] | None = None, read_file: FileReader | None = None) -> list[Verdict]:
    """Every detector's verdict, in priority order; the winner has ``chosen=True``. Never raises."""
    env = _environ(env)
    ctx = job_context(env, read_file or read_text)
    verdicts: list[Verdict] = []
    chosen = False
    for detector, why in PRIORITY:
        verdict = replace(detector.probe(env, ctx), priority_reason=why)
        if verdict.matched and not chosen:
            verdict = replace(verdict, chosen=True)
            chosen = True
        verdicts.append(verdict)
    return verdicts


def detect(env: Mapping[str, str] | None = None, read_file: FileReader | None = None) -> DistEnv:
    """Where this process sits in the job, from ``env`` (default ``os.environ``).

    Raises :class:`~torchhpc.errors.EnvironmentDetectionError` when the
    winning detector recognises its launcher but the values are unusable
    (never falls through to a wrong answer).
    """
    env = _environ(env)
    ctx = job_context(env, read_file or read_text)
    for detector, _ in PRIORITY:
        verdict = detector.probe(env, ctx)
        if not verdict.matched:
            continue
        if verdict.error is not None:
            raise verdict.error
        assert verdict.env is not None
        return verdict.env
    raise AssertionError("the local detector always matches")  # pragma: no cover


def conflicts(dist_env: DistEnv, environ: Mapping[str, str]) -> dict[str, tuple[str, str]]:
    """``{name: (user's value, detected value)}`` where the user's value differs from detection."""
    return {name: (environ[name], value) for name, value in dist_env.as_torch_env().items()
            if environ.get(name) not in (None, value)}


def export(dist_env: DistEnv, environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Write torch's env contract into ``environ`` (default ``os.environ``) with setdefault semantics.

    A variable already present is never overwritten: the user's (or the
    batch script's) value wins. Returns only what was added.
    """
    target: MutableMapping[str, str] = os.environ if environ is None else environ
    added = {name: value for name, value in dist_env.as_torch_env().items() if name not in target}
    target.update(added)
    return added
