"""The current Run:ai CLI (v2): ``runai training pytorch submit NAME``, the default RunAI render.

Why: CLI v1, and with it ``runai submit-dist``, is deprecated since Run:ai 2.20
(January 2025); ``--opt cli=v1`` (and the rcp profile, whose the RunAI on RCP guide documents
that form) keeps it. What changed for a renderer, from the CLI reference:

* the name is positional; ``--workers`` still counts the pods besides the
  master (nodes - 1);
* the master has its own resource flags (``--master-gpu-devices-request``,
  ``--master-cpu-core-request``, ``--master-cpu-memory-request``,
  ``--master-extended-resource``) and ``--master-environment-variable``: without
  them the master pod, which is node rank 0 of the training, gets none;
* ``--gpu`` became ``--gpu-devices-request``, ``--cpu``/``--memory``
  ``--cpu-core-request``/``--cpu-memory-request``, ``--pvc`` ``--existing-pvc
  claimname=...,path=...``, ``--preemptible`` ``--preemptibility``, and
  ``--environment`` now names an environment asset: variables are ``-e``;
* words after ``--`` are arguments of the image's entrypoint unless
  ``--command`` is given. The reference's own examples quote the command once
  (``--command -- /bin/bash -c "..."``), so the words reach the container as its
  argv: unlike v1's ``submit-dist`` there is no second shell layer to escape for.
"""

from __future__ import annotations

from collections.abc import Mapping

from torchhpc.core.shell import validate_env_name
from torchhpc.core.spec import JobSpec
from torchhpc.core.units import parse_switch
from torchhpc.errors import SpecError
from torchhpc.schedulers.kubernetes.pods import RDMA_ANNOTATION, k8s_name, pairs, volume_claims

__all__ = ["LIFECYCLE", "refuse_v1_only", "submit_argv_v2"]

# How each CLI names the lifecycle commands (the job name follows each prefix).
LIFECYCLE: dict[str, dict[str, list[str]]] = {
    "v1": {"describe": ["runai", "describe", "job"], "logs": ["runai", "logs"], "delete": ["runai", "delete", "job"]},
    "v2": {verb: ["runai", "training", "pytorch", verb] for verb in ("describe", "logs", "delete")},
}


def _both(flag: str, value: str) -> list[str]:
    """A value for the workers' flag and the master's own (``--x`` and ``--master-x``)."""
    return [flag, value, "--master-" + flag.lstrip("-"), value]


def submit_argv_v2(spec: JobSpec, opts: Mapping[str, str], image: str, pod_command: str) -> list[str]:
    """``runai training pytorch submit`` for ``spec``; ``pod_command`` is the pod's shell text (one argv word)."""
    argv = ["runai", "training", "pytorch", "submit", k8s_name(spec.name), "-i", image]
    if opts.get("project"):
        argv += ["-p", opts["project"]]
    # RunAI adds the master pod: --workers counts only the others (the RunAI on RCP guide's trap, unchanged in v2).
    argv += ["--workers", str(spec.nodes - 1)]
    if spec.gpus_per_node:
        argv += _both("--gpu-devices-request", str(spec.gpus_per_node))
    if spec.cpus_per_task:
        argv += _both("--cpu-core-request", str(spec.cpus_per_task * spec.nproc_per_node))
    if spec.mem:
        argv += _both("--cpu-memory-request", spec.mem)
    if opts.get("node_pool"):
        argv += ["--node-pools", opts["node_pool"]]
    for c in volume_claims(spec, opts):
        argv += ["--existing-pvc", f"claimname={c.claim},path={c.path}" + (",ro" if c.read_only else "")]
    annotations = [f"{k}={v}" for k, v in pairs(opts, "annotation")]
    resources = [f"{k}={v}" for k, v in pairs(opts, "extended_resource")]
    if opts.get("rdma"):
        annotations.append(f"{RDMA_ANNOTATION}={opts['rdma']}")
        resources.append(opts.get("rdma_resource", "rdma/rdma=1"))
    for item in annotations:
        argv += ["--annotation", item]
    for item in resources:
        argv += _both("--extended-resource", item)
    # For torchhpc's env detector: RunAI's RANK/WORLD_SIZE count pods, this says how many processes each.
    env = [("TORCHHPC_NPROC_PER_NODE", str(spec.nproc_per_node)), *spec.env]
    for k, v in env:
        item = f"{validate_env_name(k, '--env')}={v}"
        argv += ["-e", item, "--master-environment-variable", item]
    if parse_switch(opts.get("large_shm", "1"), "large_shm (from --opt)"):
        argv.append("--large-shm")
    if opts.get("preemptibility"):
        argv += ["--preemptibility", opts["preemptibility"]]
    return [*argv, "--command", "--", "bash", "-c", pod_command]


def refuse_v1_only(opts: Mapping[str, str]) -> None:
    """Flags CLI v1's submit-dist does not have: refused, never dropped."""
    if opts.get("preemptibility"):
        raise SpecError(
            f"--opt preemptibility={opts['preemptibility']} has no `runai submit-dist` flag (CLI v1)",
            "drop it, or use the current CLI (leave out --opt cli=v1)",
        )
