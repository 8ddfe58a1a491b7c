"""Test helpers for TLS: a throwaway CA and server certificate, and a TLS-only redis-server.

Certificates come from the ``openssl`` command line (no extra Python package); the server
certificate names 127.0.0.1 in its subjectAltName so hostname checking stays on.
"""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import free_port


@dataclass(frozen=True)
class Certs:
    ca: Path
    cert: Path
    key: Path


def make_certs(folder: Path) -> Certs:
    """A self-signed CA and a server certificate for 127.0.0.1 signed by it (valid 2 days)."""
    folder.mkdir(parents=True, exist_ok=True)
    ca, ca_key = folder / "ca.pem", folder / "ca.key"
    cert, key, csr = folder / "server.pem", folder / "server.key", folder / "server.csr"
    ext = folder / "server.ext"
    ext.write_text("subjectAltName = IP:127.0.0.1, DNS:localhost\n")

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
            "/CN=nitro-test-ca", "-keyout", str(ca_key), "-out", str(ca))
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1",
            "-keyout", str(key), "-out", str(csr))
    openssl("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key),
            "-CAcreateserial", "-days", "2", "-extfile", str(ext), "-out", str(cert))
    return Certs(ca=ca, cert=cert, key=key)


class TlsUnsupported(RuntimeError):
    """The installed redis-server was built without TLS."""


class TlsRedisServer:
    """``redis-server`` listening only on a TLS port (``--port 0``), optionally with a password.

    Clients are not asked for certificates (``--tls-auth-clients no``): the point is an
    encrypted, server-authenticated channel, as with a managed Redis."""

    def __init__(self, tmp: Path, certs: Certs, password: str | None = None):
        self.tmp = tmp
        self.certs = certs
        self.password = password
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self._log = tmp / f"redis-tls-{self.port}.log"

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"rediss://{auth}127.0.0.1:{self.port}/0"

    def start(self, attempts: int = 3) -> None:
        """Start, moving to a fresh port if the one found free was taken before redis-server
        bound it (the suite's parallel workers each look for free ports)."""
        if shutil.which("redis-server") is None:
            raise TlsUnsupported("redis-server is not installed")
        args = ["redis-server", "--port", "0", "--tls-port", str(self.port),
                "--bind", "127.0.0.1", "--tls-cert-file", str(self.certs.cert),
                "--tls-key-file", str(self.certs.key), "--tls-ca-cert-file", str(self.certs.ca),
                "--tls-auth-clients", "no", "--save", "", "--appendonly", "no",
                "--dir", str(self.tmp), "--logfile", str(self._log)]
        if self.password:
            args += ["--requirepass", self.password]
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                out = (self.proc.stdout.read() if self.proc.stdout else b"").decode(
                    errors="replace")
                log = self._log.read_text(errors="replace") if self._log.exists() else ""
                self.proc = None
                text = out + log
                if "already in use" in text.lower() and attempts > 1:
                    self.port = free_port()
                    self._log = self.tmp / f"redis-tls-{self.port}.log"
                    return self.start(attempts - 1)
                if "tls" in text.lower() or "Bad directive" in text:
                    raise TlsUnsupported(f"redis-server has no TLS support: {text[-300:]}")
                raise RuntimeError(f"redis-server (TLS) exited: {text[-1000:]}")
            if self._handshake():
                return
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"redis-server (TLS) did not start on port {self.port}")

    def _handshake(self) -> bool:
        context = ssl.create_default_context(cafile=str(self.certs.ca))
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as raw, \
                    context.wrap_socket(raw, server_hostname="127.0.0.1"):
                return True
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=10)
            self.proc = None
