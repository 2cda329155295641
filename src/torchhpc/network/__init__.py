"""NCCL/RCCL/gloo network settings that prove themselves.

* :mod:`~torchhpc.network.sysfs` reads what the kernel says (RDMA ports, GIDs,
  interfaces, routes) under an injectable root, so tests run on fake trees;
* :mod:`~torchhpc.network.select` turns that into ``NCCL_IB_HCA``,
  ``NCCL_IB_GID_INDEX``, ``NCCL_SOCKET_IFNAME``... each with the reason;
* :mod:`~torchhpc.network.presets` holds the documented per-site presets,
  applied with setdefault so the user's values win;
* :mod:`~torchhpc.network.check` parses ``NCCL_DEBUG=INFO`` output and runs a
  2-rank collective to show which transport was really used.

Stdlib only; torch is imported only by the check's worker processes.
"""

from __future__ import annotations
