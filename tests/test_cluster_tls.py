"""TLS clusters: a real ``dask scheduler`` and ``dask worker`` speaking ``tls://`` on
127.0.0.1, with a throwaway certificate authority made at test time.

Issue #7 promises that for ``tls://`` addresses the CA, certificate and key in the
``cluster`` config reach ``distributed.security.Security``. Only a real TLS handshake
shows that: a mocked ``Client`` would accept a certificate the scheduler rejects, or
miss that distributed uses mutual TLS (the scheduler asks the client for a certificate
signed by the cluster's CA, so a CA file alone is not enough). The certificates are
generated here rather than checked in, so none can expire or leak a key that anything
else trusts.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import re
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from pipeline.cluster import cluster
from pipeline.errors import ClusterError
from tests.conftest import (assert_same_store, run_cli, scheduler_address, small_run_config, stop_cluster,
                            wait_until)

BIN = Path(sys.executable).parent


@dataclass(frozen=True, slots=True)
class TLSFiles:
    """PEM files of a throwaway CA and of one certificate it signed, with its key."""

    ca_file: Path
    cert_file: Path
    key_file: Path

    def cli_flags(self) -> list[str]:
        """The flags ``dask scheduler`` and ``dask worker`` take for these files."""
        return ["--tls-ca-file", str(self.ca_file), "--tls-cert", str(self.cert_file),
                "--tls-key", str(self.key_file)]


def make_tls_files(directory: Path) -> TLSFiles:
    """Write a self-signed CA and a loopback certificate signed by it into ``directory``.

    One certificate serves the scheduler, the workers and the client: distributed uses
    it both to serve and to authenticate as a client (mutual TLS), so it carries both
    the serverAuth and clientAuth extended key usages. The subject alternative names
    (IP 127.0.0.1, DNS localhost) are what a hostname check would look at; distributed
    turns that check off today, but a certificate without them would start failing the
    day it turns it on. EC P-256 keys are generated in milliseconds, unlike RSA.
    """
    now = dt.datetime.now(dt.timezone.utc)
    # Back-dated a little so a clock that is a few seconds behind still accepts it.
    not_before, not_after = now - dt.timedelta(minutes=5), now + dt.timedelta(days=1)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "pipeline test CA")])
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                          data_encipherment=False, key_agreement=False, key_cert_sign=True,
                          crl_sign=True, encipher_only=False, decipher_only=False),
            critical=True,
        )
        .add_extension(ca_ski, critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                          data_encipherment=False, key_agreement=True, key_cert_sign=False,
                          crl_sign=False, encipher_only=False, decipher_only=False),
            critical=True,
        )
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
            critical=False,
        )
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
            ),
            critical=False,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski),
                       critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    directory.mkdir(parents=True, exist_ok=True)
    files = TLSFiles(directory / "ca.pem", directory / "cert.pem", directory / "key.pem")
    files.ca_file.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    files.cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    # Readable by its owner only, as a real private key would be.
    files.key_file.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                          serialization.NoEncryption())
    )
    files.key_file.chmod(0o600)
    return files


@pytest.fixture(scope="module")
def tls_remote(tmp_path_factory):
    """A TLS-only scheduler and two workers as separate OS processes on 127.0.0.1.

    Yields the ``tls://`` address, the certificate files and the scheduler file. The
    scheduler file is the signal that the scheduler listens; the workers are waited for
    through a TLS client, a first check that the generated certificates are accepted. One
    cluster serves the whole module: no test here disturbs it, and starting three
    processes costs more than every test's own work.
    """
    tmp_path = tmp_path_factory.mktemp("tls_cluster")
    tls = make_tls_files(tmp_path / "tls")
    sched_file = tmp_path / "scheduler.json"
    procs: list[subprocess.Popen] = []
    try:
        procs.append(subprocess.Popen(
            [str(BIN / "dask"), "scheduler", "--host", "127.0.0.1", "--port", "0", "--protocol", "tls",
             "--dashboard-address", "127.0.0.1:0", "--scheduler-file", str(sched_file), *tls.cli_flags()],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        ))
        # The scheduler writes the file in place: poll until it holds complete JSON, or
        # until the scheduler has exited (a certificate it cannot load, for instance).
        wait_until(lambda: scheduler_address(sched_file) is not None or procs[0].poll() is not None, timeout=60,
                   watch=tmp_path, procs=procs[:1])
        assert procs[0].poll() is None, "the TLS scheduler exited at start"
        address = scheduler_address(sched_file)
        assert address is not None, "the TLS scheduler did not write its scheduler file"
        assert address.startswith("tls://127.0.0.1:"), address
        for i in range(2):
            procs.append(subprocess.Popen(
                [str(BIN / "dask"), "worker", address, "--nthreads", "1", "--memory-limit", "1GiB",
                 "--host", "127.0.0.1", "--no-dashboard", "--local-directory", str(tmp_path / f"w{i}"),
                 *tls.cli_flags()],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            ))
        from distributed import Client
        from distributed.security import Security

        security = Security(tls_ca_file=str(tls.ca_file), tls_client_cert=str(tls.cert_file),
                            tls_client_key=str(tls.key_file), require_encryption=True)
        with Client(address, timeout=30, security=security) as c:
            c.wait_for_workers(2, timeout=60)
        yield address, tls, sched_file
    finally:
        stop_cluster(procs)


def _tls_kwargs(tls: TLSFiles) -> dict[str, str]:
    return {"tls_ca_file": str(tls.ca_file), "tls_cert_file": str(tls.cert_file),
            "tls_key_file": str(tls.key_file)}


@pytest.mark.parametrize("by", ["address", "scheduler_file"])
def test_tls_files_reach_security_and_the_workers_compute(tls_remote, by):
    import dask.array as da

    address, tls, sched_file = tls_remote
    where = {"address": address} if by == "address" else {"scheduler_file": str(sched_file)}
    with cluster(**where, timeout=30, log=None, **_tls_kwargs(tls)) as client:
        assert client.scheduler.address == address
        workers = client.scheduler_info()["workers"]
        # The workers registered over TLS too, so the task below crosses TLS twice.
        assert len(workers) == 2 and all(w.startswith("tls://127.0.0.1:") for w in workers)
        x = np.arange(10_000, dtype=np.float64).reshape(100, 100)
        # Eight chunks: a graph of tasks the scheduler spreads over the workers, whose
        # partial sums then travel between processes over TLS.
        assert float(da.from_array(x, chunks=(25, 50)).sum().compute()) == float(x.sum())


@pytest.mark.parametrize("given", ["none", "ca_only"])
def test_tls_scheduler_without_all_tls_files_is_a_clear_error(tls_remote, given):
    """distributed itself raises a bare TypeError here, before any traffic; the user
    should hear which address and which config keys, as for an unreachable scheduler.

    distributed also leaves the Client it failed to start behind, with its IO-loop
    thread running; finalized later by the garbage collector inside the next Client's
    starting IO loop, it deadlocks that start for 10 s (see pipeline/cluster.py). So
    the error must come before any Client, hence before any new IO-loop thread.
    """
    address, tls, _ = tls_remote
    kwargs = {} if given == "none" else {"tls_ca_file": str(tls.ca_file)}
    loops_before = {t for t in threading.enumerate() if t.name == "IO loop"}
    with pytest.raises(ClusterError, match=rf"{re.escape(address)}.*cluster\.tls_ca_file, cluster\.tls_cert_file"):
        with cluster(address, timeout=5, log=None, **kwargs):
            pass
    assert {t for t in threading.enumerate() if t.name == "IO loop"} <= loops_before


@pytest.mark.parametrize("trusted_ca", [False, True], ids=["another_ca", "our_ca_another_cert"])
def test_a_certificate_the_cluster_does_not_trust_is_refused(tls_remote, tmp_path, trusted_ca):
    """The files are used, not merely required: a client whose certificate another CA
    signed is turned away, even when it trusts the scheduler's CA (mutual TLS)."""
    address, tls, _ = tls_remote
    other = make_tls_files(tmp_path / "other")
    kwargs = _tls_kwargs(other)
    if trusted_ca:
        kwargs["tls_ca_file"] = str(tls.ca_file)
    # The wording comes from OpenSSL and differs between versions; the address does not.
    with pytest.raises(ClusterError, match=re.escape(address)):
        with cluster(address, timeout=5, log=None, **kwargs):
            pass


def test_which_side_refused_the_certificate_is_said(tls_remote, tmp_path):
    """distributed said "cannot start or reach tls://...: " with nothing after it for a
    certificate refused in the handshake."""
    address, tls, _ = tls_remote
    other = make_tls_files(tmp_path / "other")
    with pytest.raises(ClusterError, match=re.escape(f"cannot reach {address}: this client does not trust the "
                                                     "scheduler's certificate (") + r".+\): cluster\.tls_ca_file"):
        with cluster(address, timeout=5, log=None, **_tls_kwargs(other)):
            pass
    # Its alert (TLSV1_ALERT_UNKNOWN_CA) is read, or lost with the connection it closes.
    with pytest.raises(ClusterError, match=re.escape(f"cannot reach {address}: the scheduler ") + r"(refused|closed) .*"
                       + re.escape("cluster.tls_cert_file must be signed by a CA the scheduler trusts")):
        with cluster(address, timeout=5, log=None, **{**_tls_kwargs(other), "tls_ca_file": str(tls.ca_file)}):
            pass


def test_a_tcp_address_at_a_tls_scheduler_says_so(tls_remote):
    """The scheduler closes a connection that does not start with a TLS handshake."""
    address, _, _ = tls_remote
    as_tcp = address.replace("tls://", "tcp://")
    with pytest.raises(ClusterError, match=re.escape(
            f"no dask scheduler answered at {as_tcp}: the connection was closed without a dask handshake (is it a "
            f"tls:// scheduler? then use {address} with the cluster.tls_* files")):
        with cluster(as_tcp, timeout=5, log=None):
            pass


def test_cli_run_on_a_tls_cluster_gives_the_local_output(tls_remote, tmp_path):
    address, tls, _ = tls_remote
    path = small_run_config(tmp_path, rows_per_day=3000, seed=7, chunk_rows=1000)
    local = run_cli("run", str(path), "--no-progress")
    assert local.returncode == 0, local.stderr

    # The TLS files arrive the way a user passes them, through --set, so this also
    # covers config parsing and pipeline.job handing them to pipeline.cluster.
    tls_sets = [arg for key, value in _tls_kwargs(tls).items()
                for arg in ("--set", f"cluster.{key}={value}")]
    remote = run_cli("run", str(path), "--no-progress", "--scheduler", address,
                     "--set", f"output.path={tmp_path / 'remote.zarr'}", *tls_sets)
    assert remote.returncode == 0, remote.stderr
    assert f"scheduler {address}" in remote.stderr
    assert_same_store(tmp_path / "local.zarr", tmp_path / "remote.zarr")

    # The same run without the TLS files: exit status 1 and one line naming the address.
    bare = run_cli("run", str(path), "--no-progress", "--scheduler", address,
                   "--set", f"output.path={tmp_path / 'bare.zarr'}")
    assert bare.returncode == 1, bare.stderr
    assert address in bare.stderr and "tls_cert_file" in bare.stderr
    assert "Traceback" not in bare.stderr
