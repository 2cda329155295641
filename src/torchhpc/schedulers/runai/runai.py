"""The RunAI backend: the current ``runai training pytorch submit`` (:mod:`.commands`), or, with
``--opt cli=v1`` (the rcp profile), ``runai submit-dist pytorch`` as the EPFL RCP guide uses it (the RunAI on RCP guide).

Two traps from the seed are handled here so users stop falling into them:

* ``--workers`` is nodes - 1: RunAI adds the master pod itself.
* The command after ``--`` reaches the pod through a second round of shell
  parsing: RunAI joins the words after ``--`` and the pod's shell reads them
  again. The seed's answer is ``bash -c '"..."'`` -- the single quotes are for
  the local shell, the double quotes for the pod's -- with every ``$`` escaped
  as ``\\$`` so variables expand inside the pod (``$WORLD_SIZE``, ``$RANK``,
  ``$MASTER_ADDR``, set by RunAI per pod), not on the laptop. We build that
  argument from an argv, so user values cannot break out of either layer.

Inside each pod, torchrun runs once with ``--nnodes $WORLD_SIZE --node-rank
$RANK``: RunAI's WORLD_SIZE/RANK count *pods*; torchrun then sets the
per-process RANK/WORLD_SIZE its workers see (nnodes x nproc-per-node).
"""

from __future__ import annotations

import re

from torchhpc.core.shell import Raw, join, validate_env_name
from torchhpc.core.spec import JobSpec
from torchhpc.core.units import parse_switch
from torchhpc.core.validate import check_value
from torchhpc.errors import CommandError, SchedulerError, SpecError, UnknownJob
from torchhpc.jobdir.record import new_record, read_record, save_record
from torchhpc.launchers import get_launcher, torchrun_argv
from torchhpc.network.gid_sh import one_line
from torchhpc.network.presets import wants_auto
from torchhpc.schedulers.api import JobStatus, Scheduler, Submission
from torchhpc.schedulers.kubernetes.pods import RDMA_ANNOTATION, k8s_name, normalized_options, volume_claims
from torchhpc.schedulers.options import Option, declare
from torchhpc.schedulers.runai.commands import LIFECYCLE, refuse_v1_only, submit_argv_v2

__all__ = ["RDMA_ANNOTATION", "RunAIScheduler", "normalized_options", "pod_command", "runai_state", "second_layer"]


# RunAI job statuses (CLI `runai describe job` / `runai list jobs`) -> our vocabulary.
_STATES: dict[str, str] = {
    "pending": "PENDING",
    "submitted": "PENDING",
    "queued": "PENDING",
    "containercreating": "PENDING",
    "initializing": "PENDING",
    "creating": "PENDING",
    "scheduling": "PENDING",
    "running": "RUNNING",
    "restarting": "RUNNING",
    "terminating": "COMPLETING",
    "succeeded": "COMPLETED",
    "completed": "COMPLETED",
    "failed": "FAILED",
    "error": "FAILED",
    "crashloopbackoff": "FAILED",
    "timedout": "TIMEOUT",
    "deleted": "CANCELLED",
    "stopped": "CANCELLED",
    "preempted": "PREEMPTED",
}


def runai_state(text: str) -> str:
    return _STATES.get(re.sub(r"[\s_-]", "", text).lower(), "UNKNOWN")


def second_layer(payload: str) -> str:
    """Wrap pod shell text for the seed's ``bash -c '"..."'``: double-quoted, every ``\\ " $ ` `` escaped.

    The pod's shell removes the double quotes and the escapes, so ``bash -c``
    receives ``payload`` exactly, and the ``$VARS`` in it expand in the pod.
    """
    return '"' + re.sub(r'([\\"$`])', r"\\\1", payload) + '"'


def pod_command(spec: JobSpec, python: str) -> str:
    """The shell text each pod runs: torchrun over pods, its output optionally kept in a file."""
    argv = torchrun_argv(
        spec,
        python,
        nnodes=Raw('"$WORLD_SIZE"'),
        rdzv_id="",
        endpoint="",
        node_rank=Raw('"$RANK"'),
        extra=["--tee", "3"],
    )
    lines = []
    if spec.option("workdir"):
        lines.append(join(["cd", spec.option("workdir")]))
    if spec.network and wants_auto(spec.network):
        # --network auto at pod start: the RunAI on RCP guide's `grep 'RoCE v2' ... gids` for NCCL_IB_GID_INDEX,
        # net detect's rule in POSIX shell: the image needs nothing (the RunAI on RCP guide's image has no torchhpc).
        lines.append(one_line())
    cmd = "exec " + join(argv)
    log_dir = spec.option("log_dir")
    if log_dir:
        # The seed's reason: `runai logs` forgets a job after a while; a file on the PVC does not.
        lines.append(join(["mkdir", "-p", log_dir]))
        target = join([log_dir]) + '/"${JOB_UUID:-job}-pod${RANK}.log"'
        cmd += f" > {target} 2>&1"
    lines.append(cmd)
    return "; ".join(lines)


class RunAIScheduler(Scheduler):
    name = "runai"
    submit_command = "runai"
    # capabilities (schedulers/capabilities.py): no wall-time flag, no arrays, the cluster's runtime
    supports_time_limit = False
    supports_cpus_per_gpu = False
    supports_container_options = False
    supports_setup = False
    supports_dependencies = False  # runai submit has no dependency flag: refused (docs/capabilities.md)
    runs_in_pods = True
    OPTIONS = declare(
        Option("cli", "which runai CLI: v2 (`runai training pytorch submit`) or v1 (`runai submit-dist pytorch`)",
               "choice", "v2", ("v2", "v1")),
        Option("image", "container image every pod runs (--image); or give --container IMAGE"),
        Option("project", "RunAI project (-p); default: the CLI's configured project"),
        Option("pvc", "PVC mounts, comma separated CLAIM:/mount/path[:ro] (--existing-pvc; v1: --pvc), e.g. mlo-scratch:/mloscratch"),
        Option("bind", "PVC mounts given as --bind without --container (CLAIM:/mount/path[:ro], comma separated)"),
        Option("preemptibility", "v2 --preemptibility", "choice", None, ("preemptible", "non-preemptible")),
        Option("rdma", "RDMA network attachment, e.g. kube-system/roce: adds the annotation and rdma/rdma=1"),
        Option("rdma_resource", "extended resource requested with rdma", default="rdma/rdma=1"),
        Option("annotation", "extra pod annotations, comma separated KEY=VALUE (--annotation)"),
        Option("extended_resource", "extra extended resources, comma separated NAME=COUNT (--extended-resource)"),
        Option("large_shm", "--large-shm: /dev/shm big enough for DataLoader workers", "bool", "1"),
        Option("workdir", "directory to cd into inside the pod before starting torchrun"),
        Option("log_dir", "directory (on a PVC) where each pod writes JOB_UUID-podRANK.log"),
        Option("node_pool", "RunAI node pool(s) (--node-pools)"),
        Option("max_restarts", "torchrun --max-restarts (0: fail fast)", "int", "0"),
    )

    def _check(self, spec: JobSpec) -> dict[str, str]:
        opts = self.checked_options(spec, normalized_options(spec))
        for key in ("workdir", "log_dir"):  # words of `cd`/`mkdir -p` in the pod: never an option
            if opts.get(key):
                check_value(opts[key], f"{key} (from --opt)", word=True)
        for key in ("pvc", "bind", "annotation", "extended_resource"):  # comma lists whose items are stripped
            if re.search(r"[\x00-\x1f\x7f]", opts.get(key) or ""):
                raise SpecError(f"{key}={opts[key]!r} (from --opt) contains a control character", "write plain text")
        get_launcher(spec.launcher).check(self.name)
        return opts

    def image(self, spec: JobSpec) -> str:
        image = spec.option("image") or (spec.container.image if spec.container else "")
        if not image:
            raise SpecError(
                "the runai scheduler needs a container image",
                "add --image REGISTRY/IMAGE:TAG (or --opt image=...)",
            )
        return image

    def submit_argv(self, spec: JobSpec) -> list[str]:
        opts = self._check(spec)
        python = spec.entrypoint.python or "python"
        if opts.get("cli", "v2") == "v2":
            command = pod_command(spec.with_(options=tuple(opts.items())), python)
            return submit_argv_v2(spec, opts, self.image(spec), command)
        refuse_v1_only(opts)
        argv = ["runai", "submit-dist", "pytorch", "--name", k8s_name(spec.name), "--image", self.image(spec)]
        if opts.get("project"):
            argv += ["-p", opts["project"]]
        # RunAI adds the master pod: --workers counts only the others (the RunAI on RCP guide's trap).
        argv += ["--workers", str(spec.nodes - 1), "--gpu", str(spec.gpus_per_node)]
        if spec.cpus_per_task:
            argv += ["--cpu", str(spec.cpus_per_task * spec.nproc_per_node)]
        if spec.mem:
            argv += ["--memory", spec.mem]
        if opts.get("node_pool"):
            argv += ["--node-pools", opts["node_pool"]]
        for c in volume_claims(spec, opts):
            argv += ["--pvc", f"{c.claim}:{c.path}" + (":ro" if c.read_only else "")]
        if opts.get("rdma"):
            argv += ["--annotation", f"{RDMA_ANNOTATION}={opts['rdma']}"]
            argv += ["--extended-resource", opts.get("rdma_resource", "rdma/rdma=1")]
        for flag, key in (("--annotation", "annotation"), ("--extended-resource", "extended_resource")):
            for item in (opts.get(key) or "").split(","):
                if item.strip():
                    if "=" not in item:
                        raise SpecError(f"{key} {item!r} (from --opt {key}=...) is not NAME=VALUE")
                    argv += [flag, item.strip()]
        # For torchhpc's env detector: RunAI's RANK/WORLD_SIZE count pods, this says how many processes each.
        argv += ["-e", f"TORCHHPC_NPROC_PER_NODE={spec.nproc_per_node}"]
        for k, v in spec.env:
            argv += ["-e", f"{validate_env_name(k, '--env')}={v}"]
        if parse_switch(opts.get("large_shm", "1"), "large_shm (from --opt)"):
            argv.append("--large-shm")
        argv += ["--", "bash", "-c", second_layer(pod_command(spec.with_(options=tuple(opts.items())), python))]
        return argv

    def _render(self, spec: JobSpec) -> Submission:
        from torchhpc.core.array import refuse_array

        refuse_array(self.name, spec.array)
        if spec.time_seconds:
            # RunAI's pytorch submit has no wall-time flag: a limit silently dropped is a job that
            # runs (and holds its GPUs) past what the user asked for.
            raise SpecError(
                "--time has no RunAI equivalent: runai pytorch jobs run until the program ends",
                "drop --time (and unset time in the config file or $TORCHHPC_TIME); "
                "to bound the run, let the program stop itself, or delete the job",
            )
        notes: tuple[str, ...] = ()
        if spec.nodes == 1:
            # Seed 004: pods = --workers + 1; with --workers 0 RunAI's PyTorchJob has a master pod only
            # (no worker pods; KAI-Scheduler issue #141 on Run:ai single-node PyTorchJobs).
            notes = ("--nodes 1: --workers 0, RunAI runs the master pod only (WORLD_SIZE 1, RANK 0)",)
        if normalized_options(spec).get("cli", "v2") == "v2":  # (v1 renders stay as the RunAI on RCP guide shows them)
            notes += ("targets the current CLI, `runai training pytorch submit` (`runai version` tells which CLI "
                      "a machine has; --opt cli=v1 renders `runai submit-dist`)",)
        return Submission(
            scheduler=self.name,
            spec=spec,
            argv=tuple(self.submit_argv(spec)),
            notes=(
                f"{spec.nodes} pods (--workers {spec.nodes - 1} + the master RunAI adds), "
                f"{spec.nproc_per_node} processes each: world size {spec.world_size}",
                *notes,
            ),
        )

    # talking to RunAI ----------------------------------------------------------
    def _verb(self, verb: str, job_id: str) -> list[str]:
        """The lifecycle command of the CLI the job was submitted with (records without 'cli': v1), in its project."""
        rec = read_record(self.name, job_id)
        cli = str(rec.extra.get("cli") or "v1")
        return [*LIFECYCLE.get(cli, LIFECYCLE["v1"])[verb], job_id, *(["-p", str(rec.project)] if rec.project else [])]

    def schedule(self, submission: Submission) -> str:
        self.runner.run(list(submission.argv), hint="is the runai CLI installed and logged in? `runai whoami`")
        job = k8s_name(submission.spec.name)
        spec = submission.spec
        save_record(new_record(
            self.name, job, name=job, project=spec.option("project") or "",
            nproc_per_node=spec.nproc_per_node, nodes=spec.nodes, cli=normalized_options(spec).get("cli", "v2"),
        ))
        return job

    def status(self, job_id: str) -> JobStatus:
        try:
            done = self.runner.run(self._verb("describe", job_id), timeout=60)
        except CommandError as e:
            if "not found" in (e.stderr + e.stdout).lower():
                raise UnknownJob(f"runai job {job_id} not found", "`runai list jobs` shows the names") from None
            raise
        return parse_describe(job_id, done.stdout)

    def logs(self, job_id: str, rank: int | None = None) -> str:
        argv = self._verb("logs", job_id)
        if rank is not None:
            rec = read_record(self.name, job_id)
            node = rank // max(1, rec.nproc_per_node)
            argv += ["--pod", f"{job_id}-master-0" if node == 0 else f"{job_id}-worker-{node - 1}"]
        return self.runner.run(argv, timeout=120).stdout

    def cancel(self, job_id: str) -> None:
        self.runner.run(self._verb("delete", job_id))


def parse_describe(job_id: str, text: str) -> JobStatus:
    """``runai describe job NAME`` text -> status (``Status:`` line, pods' exit codes if listed).

    Written from RunAI CLI v2.x's output (``Name:``, ``Status:``, ``Duration:``
    lines, then a pod table); only the fields read here are relied on.
    """
    fields: dict[str, str] = {}
    for line in text.splitlines():
        m = re.match(r"^\s*([A-Za-z][A-Za-z ]*?)\s*:\s*(.*)$", line)
        if m and m.group(1).lower() not in fields:
            fields[m.group(1).lower()] = m.group(2).strip()
    raw = fields.get("status") or fields.get("phase") or ""
    if not raw:
        raise SchedulerError(f"`runai describe job {job_id}` printed no Status line", "run it by hand to see why")
    state = runai_state(raw.split()[0])
    return JobStatus(
        job_id=job_id,
        state=state,
        exit_code=0 if state == "COMPLETED" else None,
        reason=raw if state == "UNKNOWN" else "",
        elapsed=fields.get("duration", ""),
        name=fields.get("name", job_id),
        raw=fields,
    )
