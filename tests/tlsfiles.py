"""Throwaway TLS material for the exporter's tests: a CA, a server certificate and a client certificate.

Made with the openssl command through the project's one runner (slurm_gpushare/proc.py); EC P-256 keys,
so each file takes milliseconds. The server certificate names ``hosts`` (DNS names, and IP addresses for
entries that are one) in its subjectAltName, as Go's TLS (Prometheus) requires; the client certificate's
subjectAltName is ``DNS:<client>``.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path

from slurm_gpushare.proc import run


@dataclass(frozen=True)
class TlsFiles:
    ca: Path
    ca_key: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _san(name: str) -> str:
    try:
        ipaddress.ip_address(name)
        return f"IP:{name}"
    except ValueError:
        return f"DNS:{name}"


def _signed(where: Path, stem: str, subject: str, san: str, ca: Path, ca_key: Path, usage: str) -> tuple[Path, Path]:
    key, csr, cert, ext = (where / f"{stem}.key", where / f"{stem}.csr", where / f"{stem}.crt", where / f"{stem}.ext")
    run(
        [
            "openssl",
            "req",
            "-new",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            key,
            "-subj",
            subject,
            "-out",
            csr,
        ],
        timeout=60,
    )
    ext.write_text(f"subjectAltName={san}\nextendedKeyUsage={usage}\nbasicConstraints=CA:FALSE\n")
    run(
        [
            "openssl",
            "x509",
            "-req",
            "-in",
            csr,
            "-CA",
            ca,
            "-CAkey",
            ca_key,
            "-CAcreateserial",
            "-days",
            "2",
            "-sha256",
            "-extfile",
            ext,
            "-out",
            cert,
        ],
        timeout=60,
    )
    return cert, key


def make(where: Path, hosts: tuple[str, ...] = ("localhost", "127.0.0.1"), client: str = "prometheus") -> TlsFiles:
    """Write the CA, server and client files under ``where`` (created)."""
    where.mkdir(parents=True, exist_ok=True)
    ca, ca_key = where / "ca.crt", where / "ca.key"
    run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            ca_key,
            "-out",
            ca,
            "-days",
            "2",
            "-subj",
            "/CN=gpushare test CA",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ],
        timeout=60,
    )
    server = _signed(where, "server", f"/CN={hosts[0]}", ",".join(_san(h) for h in hosts), ca, ca_key, "serverAuth")
    cl = _signed(where, "client", f"/CN={client}", f"DNS:{client}", ca, ca_key, "clientAuth")
    for path in where.iterdir():
        path.chmod(0o644)  # the containers' users (prometheus) read them through a bind mount
    return TlsFiles(ca, ca_key, *server, *cl)
