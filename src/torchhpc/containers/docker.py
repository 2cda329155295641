"""Docker and Podman: ``docker run --rm --gpus all --ipc=host … IMAGE CMD``, one container per task.

The flags follow the MareNostrum5 guide (``--ipc=host --ulimit memlock=-1 --ulimit stack=67108864``)
plus what a rank needs to reach its peers: the host network and UTS namespaces, so
MASTER_ADDR and hostnames mean the same inside. GPUs are exactly those the scheduler
gave this task or node, read when the task starts (boot/gpus.sh): ``--gpus
'"device=I,J"'`` on Docker, one CDI device ``nvidia.com/gpu=I`` each on Podman. Never
``all``: the daemon (or CDI) sees every GPU of the node, including another job's. Podman runs for real here under Slurm
(tests/integration); Docker has no engine on this machine, so its rendering is
golden-tested against docs.docker.com/reference/cli/docker/container/run/.
"""

from __future__ import annotations

from collections.abc import Sequence

import torchhpc.containers._common as c
from torchhpc.core.spec import ContainerSpec
from torchhpc.errors import SpecError

OPTIONS: dict[str, str] = {
    "shm_size": "--shm-size (only meaningful with ipc other than host)",
    "ipc": "IPC namespace (default host: NCCL and DataLoader workers need a large /dev/shm)",
    "network": "network (default host: ranks reach MASTER_ADDR:MASTER_PORT directly)",
    "ulimits": "comma-separated --ulimit values (default memlock=-1,stack=67108864; empty for none)",
    "pull": "--pull policy, e.g. never for a locally built image",
    "user": "--user UID[:GID] inside the container",
    "podman_root": "podman --root (image storage directory)",
    "podman_runroot": "podman --runroot (state directory)",
    "podman_args": "global podman arguments before 'run', shell-split (e.g. --cgroup-manager=cgroupfs)",
    "docker_args": "global docker arguments before 'run', shell-split (e.g. --context NAME)",
}

DEFAULT_ULIMITS = "memlock=-1,stack=67108864"

_AMD_DEVICES = ("/dev/kfd", "/dev/dri")


def docker_ref(image: str, runtime: str = "docker") -> str:
    """The image as ``docker run``/``podman run`` take it: ``docker://reg/img:1`` -> ``reg/img:1``.

    ``docker://`` is the scheme Apptainer, enroot and pyxis read a registry reference with; docker
    refuses it ("invalid reference format"). Any other ``SCHEME://`` (``oras://``, ``library://``) names
    something neither runtime pulls: refused here, with what to pass instead."""
    if c.is_variable(image):
        return image
    if image.startswith("docker://"):
        return image[len("docker://"):]
    scheme = image.split("://", 1)[0] if "://" in image else ""
    if scheme:
        raise SpecError(f"--container {image}: {runtime} pulls registry images, not {scheme}:// ones",
                        "pass a registry reference (reg/img:tag, or docker://reg/img:tag), or another --runtime")
    return image


def wrap(container: ContainerSpec, argv: Sequence[str], how: c.Wrapping = c.PLAIN) -> list[str]:
    podman = container.runtime == "podman"
    opts = c.options(container, OPTIONS)
    for key in ("podman_root", "podman_runroot", "podman_args") if not podman else ("docker_args",):
        if key in opts:
            raise SpecError(
                f"container option {key!r} is for {'podman' if key.startswith('podman') else 'docker'}, "
                f"not --runtime {container.runtime}",
            )
    head = [c.binary(container, opts, container.runtime)]
    if podman:
        if opts.get("podman_root"):
            head += ["--root", opts["podman_root"]]
        if opts.get("podman_runroot"):
            head += ["--runroot", opts["podman_runroot"]]
        head += c.split_args(opts, "podman_args")
    else:
        head += c.split_args(opts, "docker_args")
    head += ["run", "--rm"]
    if how.interactive:
        head.append("-it")  # a shell needs a terminal; the other runtimes keep the caller's
    nvidia = how.gpus > 0 and how.gpu_kind == "nvidia"  # flags added when the task starts (boot/gpus.sh)
    if how.gpus > 0 and not nvidia:
        if how.gpu_kind == "amd":
            for dev in _AMD_DEVICES:
                head += ["--device", dev]
            head += ["--group-add", "keep-groups" if podman else "video"]
        else:
            raise SpecError(f"GPU kind {how.gpu_kind!r} is not nvidia or amd", "set --gpu-kind nvidia|amd")
    head += [f"--ipc={opts.get('ipc', 'host')}", f"--network={opts.get('network', 'host')}", "--uts=host"]
    for limit in filter(None, (u.strip() for u in opts.get("ulimits", DEFAULT_ULIMITS).split(","))):
        head += ["--ulimit", limit]
    if opts.get("shm_size"):
        head.append(f"--shm-size={opts['shm_size']}")
    if opts.get("pull"):
        head.append(f"--pull={opts['pull']}")
    if opts.get("user"):
        head += ["--user", opts["user"]]

    for b in c.mounts(container, opts):
        c.reject_chars(b.src, ":", f"{container.runtime}'s -v SRC:DST")
        c.reject_chars(b.dst, ":", f"{container.runtime}'s -v SRC:DST")
        head += ["-v", f"{b.src}:{b.dst}" + (":ro" if b.readonly else "")]
    wd = c.workdir(container, opts)
    if wd:
        head += ["-w", wd]

    # Environment: nothing passes by default. NAME takes the host's value; podman also
    # understands PREFIX* itself, docker needs the names found when the task starts.
    patterns = c.all_patterns(container, how.pass_env)
    exact = [p for p in patterns if podman or not p.endswith("*")]
    wild = [p for p in patterns if not podman and p.endswith("*")]
    for name in exact:
        head += ["-e", name]
    _, pairs = c.env_entries(container)
    for k, v in pairs:
        head += ["-e", f"{k}={v}"]
    head += c.split_args(opts)
    tail = [c.image_word(docker_ref(container.image, container.runtime)), *argv]
    full = c.env_expand_argv("flag", "-e", wild, head, tail, how) if wild else head + tail
    if nvidia:
        pre = full[: len(full) - len(tail)]
        return ["bash", how.program("gpus.sh"), container.runtime, str(len(pre)), *pre, *tail]
    return full
