"""The secured local broker: a CA and broker certificate, SCRAM users, a SASL_SSL listener."""

from __future__ import annotations

import json
import os
import secrets
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from pydantic import SecretStr

from ragwarm.kafka.local import LocalKafka
from ragwarm.settings import KafkaSettings

MECHANISM = "SCRAM-SHA-512"
ADMIN_USER = "admin"  # the broker's own (inter-broker) user, also for operators
CLIENT_USER = "ragwarm"  # what the streams app, workers and the CLI log in as
HOST = "127.0.0.1"


class SecureSetupError(RuntimeError):
    """The certificates or the secrets of the secured broker could not be made."""


@dataclass(frozen=True)
class SecureMaterial:
    """Files and secrets of the secured broker, kept under `<kafka dir>/secure` (mode 0700)."""

    dir: Path
    passwords: dict[str, str]  # user (and "keystore") -> password

    @property
    def ca_file(self) -> Path:
        return self.dir / "ca.pem"

    @property
    def keystore(self) -> Path:
        return self.dir / "broker.p12"

    def client_settings(self, kafka: KafkaSettings, user: str = CLIENT_USER) -> KafkaSettings:
        """`kafka` switched to this broker's SASL_SSL listener as `user`."""
        return kafka.model_copy(
            update={
                "security_protocol": "SASL_SSL",
                "sasl_mechanism": MECHANISM,
                "sasl_username": user,
                "sasl_password": SecretStr(self.passwords[user]),
                "ssl_cafile": self.ca_file,
            }
        )

    def client_env(self, user: str = CLIENT_USER) -> dict[str, str]:
        """The RAGWARM_KAFKA_* variables a client of this broker exports."""
        return {
            "RAGWARM_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
            "RAGWARM_KAFKA_SASL_MECHANISM": MECHANISM,
            "RAGWARM_KAFKA_SASL_USERNAME": user,
            "RAGWARM_KAFKA_SASL_PASSWORD": self.passwords[user],
            "RAGWARM_KAFKA_SSL_CAFILE": str(self.ca_file),
        }


def secure_properties(kafka: KafkaSettings, material: SecureMaterial) -> dict[str, str]:
    """Overrides of the plaintext broker config: clients get only a SASL_SSL listener.

    The controller listener stays PLAINTEXT on the loopback address: only the broker
    itself (same process, one node) talks to it.
    """
    admin = material.passwords[ADMIN_USER]
    jaas = (
        "org.apache.kafka.common.security.scram.ScramLoginModule required "
        f'username="{ADMIN_USER}" password="{admin}";'
    )
    store = material.passwords["keystore"]
    return {
        "listeners": f"SASL_SSL://{HOST}:{kafka.port},CONTROLLER://{HOST}:{kafka.controller_port}",
        "advertised.listeners": f"SASL_SSL://{HOST}:{kafka.port}",
        "inter.broker.listener.name": "SASL_SSL",
        "listener.security.protocol.map": "SASL_SSL:SASL_SSL,CONTROLLER:PLAINTEXT",
        "sasl.enabled.mechanisms": MECHANISM,
        "sasl.mechanism.inter.broker.protocol": MECHANISM,
        f"listener.name.sasl_ssl.{MECHANISM.lower()}.sasl.jaas.config": jaas,
        "ssl.keystore.type": "PKCS12",
        "ssl.keystore.location": str(material.keystore),
        "ssl.keystore.password": store,
        "ssl.key.password": store,
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(material.ca_file),
        "ssl.client.auth": "none",
    }


def scram_format_args(material: SecureMaterial) -> list[str]:
    """`kafka-storage format` options that create the SCRAM users (KRaft needs them there)."""
    args = []
    for user in (ADMIN_USER, CLIENT_USER):
        args += ["--add-scram", f"{MECHANISM}=[name={user},password={material.passwords[user]}]"]
    return args


def ensure_material(kafka_dir: Path) -> SecureMaterial:
    """Load the secure broker's CA, certificate and passwords, making them the first time."""
    folder = kafka_dir / "secure"
    secrets_file = folder / "secrets.json"
    if secrets_file.exists():
        return SecureMaterial(folder, json.loads(secrets_file.read_text()))
    part = folder.with_name("secure.part")
    shutil.rmtree(part, ignore_errors=True)
    part.mkdir(mode=0o700, parents=True)
    # Hex passwords: nothing in them needs quoting in JAAS or in the format tool's syntax.
    passwords = {u: secrets.token_hex(16) for u in (ADMIN_USER, CLIENT_USER, "keystore")}
    _make_certificates(part, passwords["keystore"])
    _write_private(part / "secrets.json", json.dumps(passwords, indent=1))
    part.rename(folder)
    material = SecureMaterial(folder, passwords)
    lines = [f"export {k}={shlex.quote(v)}\n" for k, v in material.client_env().items()]
    _write_private(folder / "client.env", "".join(lines))
    return material


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)


def _make_certificates(folder: Path, store_password: str) -> None:
    """A CA, and a broker certificate for 127.0.0.1/localhost signed by it, in PKCS12."""
    (folder / "broker.ext").write_text(
        f"subjectAltName=IP:{HOST},DNS:localhost\nbasicConstraints=CA:FALSE\n"
        "keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth,clientAuth\n"
    )
    days = "3650"
    _openssl(folder, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", days,
             "-keyout", "ca.key", "-out", "ca.pem", "-subj", "/CN=ragwarm local CA",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign")  # fmt: skip
    _openssl(folder, "req", "-newkey", "rsa:2048", "-nodes", "-keyout", "broker.key",
             "-out", "broker.csr", "-subj", f"/CN={HOST}")  # fmt: skip
    _openssl(folder, "x509", "-req", "-in", "broker.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
             "-CAcreateserial", "-days", days, "-out", "broker.pem",
             "-extfile", "broker.ext")  # fmt: skip
    _openssl(folder, "pkcs12", "-export", "-in", "broker.pem", "-inkey", "broker.key",
             "-certfile", "ca.pem", "-name", "broker", "-out", "broker.p12",
             "-passout", f"pass:{store_password}")  # fmt: skip
    for key in ("ca.key", "broker.key"):
        (folder / key).chmod(0o600)


def _openssl(folder: Path, *args: str) -> None:
    tool = shutil.which("openssl")
    if tool is None:
        raise SecureSetupError("openssl is needed to make the secure broker's certificates")
    done = subprocess.run([tool, *args], cwd=folder, capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise SecureSetupError(f"openssl {args[0]} failed: {done.stderr.strip()}")



class SecureLocalKafka(LocalKafka):
    """The local broker opening only a SASL_SSL listener (SCRAM-SHA-512) to clients."""

    mode = "secure"

    @cached_property
    def material(self) -> SecureMaterial:
        return ensure_material(self.dir)

    @property
    def data_dir(self) -> Path:
        # SCRAM users are created when the storage is formatted: a folder of its own.
        return self.dir / "data-secure"

    def _config_overrides(self) -> dict[str, str]:
        return secure_properties(self.kafka, self.material)

    def _format_args(self) -> list[str]:
        return scram_format_args(self.material)

    def _probe_options(self) -> dict[str, object]:
        return self.material.client_settings(self.kafka, ADMIN_USER).client_options()
