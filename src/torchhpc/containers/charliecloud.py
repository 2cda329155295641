"""Charliecloud: ``ch-run -b SRC:DST [-c DIR] IMAGE_DIR -- CMD``.

Really tested here, under the dev cluster's Slurm (tests/integration). ch-run passes
the host environment through, so the rank and scheduler variables reach the task
without flags; it needs ``$USER`` set and takes an image *directory* (or SquashFS).
It has no read-only binds, so ``:ro`` is refused rather than silently dropped.
"""

from __future__ import annotations

from collections.abc import Sequence

import torchhpc.containers._common as c
from torchhpc.core.spec import ContainerSpec
from torchhpc.errors import SpecError

OPTIONS: dict[str, str] = {
    "write": "true: -w (mount the image read-write)",
    "private_tmp": "true: -t (a container-private /tmp)",
    "home": "true: --home (mount $HOME at /home/$USER)",
}


def wrap(container: ContainerSpec, argv: Sequence[str], how: c.Wrapping = c.PLAIN) -> list[str]:
    opts = c.options(container, OPTIONS)
    cmd = [c.binary(container, opts, "ch-run")]
    if container.cleanenv:
        # ch-run's only way to drop the host environment: unset all, keep what must pass.
        raise SpecError(
            "--cleanenv is not supported with --runtime charliecloud",
            "drop --cleanenv; ch-run passes the host environment, use --container-env to add to it",
        )
    # ch-run mounts in order and only onto directories that exist: a bind inside another one's
    # target comes after it (the job dir under the bound checkout), else its mount point is missing.
    for b in sorted(c.mounts(container, opts), key=lambda b: b.dst.rstrip("/").count("/")):
        if b.readonly:
            raise SpecError(
                f"--bind {b.src}:{b.dst}:ro: ch-run cannot mount read-only",
                "drop ':ro' or use another runtime",
            )
        c.reject_chars(b.src, ":", "ch-run's -b SRC:DST")
        c.reject_chars(b.dst, ":", "ch-run's -b SRC:DST")
        cmd.append(f"--bind={b.src}:{b.dst}")
    wd = c.workdir(container, opts)
    if wd:
        cmd.append(f"--cd={wd}")
    cmd += c.switches(opts, {"write": "--write", "private_tmp": "--private-tmp", "home": "--home"})
    _, pairs = c.env_entries(container)
    cmd += [f"--set-env={k}={v}" for k, v in pairs]
    if pairs:
        cmd.append("--env-no-expand")
    cmd += c.split_args(opts)
    return [*cmd, c.image_word(container.image), "--", *argv]
