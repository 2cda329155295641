"""Just enough of the Kubernetes REST API, stdlib only (``submit`` without kubectl): the
``kubernetes`` client package is never a runtime dependency."""

from __future__ import annotations

import json
import os
import ssl
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any

from torchhpc.errors import SchedulerError

__all__ = ["KubeAPI"]

_SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


class KubeAPI:
    """Just enough of the Kubernetes REST API: JSON requests with a bearer token.

    Configured from options (``api_server``, ``token_file``, ``ca_file``) or, in a
    pod, from the service account Kubernetes mounts (``KUBERNETES_SERVICE_HOST``).
    """

    def __init__(self, server: str, token: str | None = None, ca_file: str | None = None, timeout: float = 30) -> None:
        self.server = server.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.ca_file = ca_file

    def _context(self) -> ssl.SSLContext | None:
        if not self.server.startswith("https"):
            return None
        try:
            return ssl.create_default_context(cafile=self.ca_file)
        except OSError as e:
            raise SchedulerError(
                f"cannot load the CA bundle {self.ca_file!r}: {e.strerror}", "pass --opt ca_file=PATH"
            ) from None

    @classmethod
    def from_options(cls, opts: Mapping[str, str], environ: Mapping[str, str] | None = None) -> KubeAPI:
        env = os.environ if environ is None else environ
        server = opts.get("api_server") or ""
        token_file, ca_file = opts.get("token_file"), opts.get("ca_file")
        if not server and env.get("KUBERNETES_SERVICE_HOST"):
            host, port = env["KUBERNETES_SERVICE_HOST"], env.get("KUBERNETES_SERVICE_PORT", "443")
            server = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
            token_file = token_file or f"{_SA_DIR}/token"
            ca_file = ca_file or f"{_SA_DIR}/ca.crt"
        if not server:
            raise SchedulerError(
                "no kubectl and no Kubernetes API server to talk to",
                "install kubectl, or pass --opt api_server=https://HOST:6443 --opt token_file=PATH",
            )
        token = None
        if token_file:
            try:
                with open(token_file) as f:
                    token = f.read().strip()
            except OSError as e:
                raise SchedulerError(f"cannot read token_file {token_file!r}: {e.strerror}") from None
        return cls(server, token, ca_file)

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, str]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.server + path, data=data, method=method)
        req.add_header("Accept", "application/json, */*")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout, context=self._context()) as resp:
                return resp.status, resp.read().decode(errors="replace")
        except urllib.error.HTTPError as e:
            text = e.read().decode(errors="replace")
            try:
                message = json.loads(text).get("message", text)
            except ValueError:
                message = text
            raise SchedulerError(
                f"{method} {path} -> HTTP {e.code}: {message.strip()[:300]}",
                "401/403: check the token and its RBAC; 404: check the namespace and that the CRD is installed "
                "(`kubectl get crd trainjobs.trainer.kubeflow.org`; with --opt api=pytorchjob, pytorchjobs.kubeflow.org)",
            ) from None
        except urllib.error.URLError as e:
            raise SchedulerError(f"cannot reach the Kubernetes API at {self.server}: {e.reason}") from None
