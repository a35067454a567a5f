"""The local stack's operator key and signing secret: made once, kept 0600 under RAGWARM_HOME.

`ragwarm up` generates both on its first start and reuses them on later ones, so a client
configured once keeps working across restarts. Rotating is deleting the files and running
`ragwarm down && ragwarm up` (docs/security.md).
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from schemas.signing import derive_commands_key, derive_worker_key

OPERATOR_FILE = "operator.key"
SIGNING_FILE = "signing.key"
# Variables a user may set to choose the keys instead; the first one set wins.
OPERATOR_VARS = ("RAGWARM_STREAMS_API_KEY", "RAGWARM_WORKER_API_KEY",
                 "RAGWARM_GATEWAY_OPERATOR_KEY", "RAGWARM_CLIENT_API_KEY")
SIGNING_VARS = ("RAGWARM_STREAMS_WORKER_EVENTS_SECRET", "RAGWARM_WORKER_EVENTS_SECRET")


@dataclass(frozen=True)
class StackKeys:
    """The operator key every view, worker and the gateway accept, and the signing secret."""

    operator: str
    signing: str
    folder: Path
    created: bool = False  # made by this call: the only time the key itself is printed

    @property
    def operator_file(self) -> Path:
        return self.folder / OPERATOR_FILE

    @property
    def signing_file(self) -> Path:
        return self.folder / SIGNING_FILE


def load_or_create(folder: Path) -> StackKeys:
    """The keys stored in `folder`, generating the missing ones (files 0600, folder 0700)."""
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o700)
    made = [_ensure(folder / name) for name in (OPERATOR_FILE, SIGNING_FILE)]
    found = load(folder)
    assert found is not None  # both files were just made or read
    return StackKeys(found.operator, found.signing, folder, created=any(made))


def load(folder: Path) -> StackKeys | None:
    """The stored keys, or None while `ragwarm up` has not made them (nothing is created)."""
    try:
        operator = (folder / OPERATOR_FILE).read_text().strip()
        signing = (folder / SIGNING_FILE).read_text().strip()
    except FileNotFoundError:
        return None
    if not operator or not signing:
        raise ValueError(f"an empty key file in {folder}: delete it and run `ragwarm up` again")
    return StackKeys(operator, signing, folder)


def _ensure(path: Path) -> bool:
    """Create `path` with a fresh secret unless it exists; True when created. Mode 0600 from
    the first byte (O_EXCL: two `up` racing never overwrite each other's key)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        path.chmod(0o600)  # a copy restored with looser permissions is tightened again
        return False
    with os.fdopen(fd, "w") as out:
        out.write(secrets.token_urlsafe(32) + "\n")
    return True


def chosen(environ: Mapping[str, str], names: tuple[str, ...]) -> str | None:
    """The first of `names` set (non-empty) in `environ`: a key the user chose."""
    return next((environ[n] for n in names if environ.get(n)), None)


def worker_events_key(signing: str, worker_id: str) -> str:
    """The key worker `worker_id` signs its events with: derived from the master secret (the
    streams app holds the master and derives the same key to verify), so a worker cannot
    sign as another (`schemas.signing.derive_worker_key`)."""
    return derive_worker_key(signing.encode(), worker_id)


def worker_commands_key(signing: str) -> str:
    """The key workers verify warmup commands with; the streams app signs with it."""
    return derive_commands_key(signing.encode())


@dataclass(frozen=True)
class StackSecurity:
    """The keys each process of the stack is started with.

    A variable the user set is kept as set; every other key variable gets the operator key
    (one the user named in any of OPERATOR_VARS, else the stored one), so the views, the
    workers, the gateway and the gateway's own client all agree on one key.
    """

    keys: StackKeys | None  # None: --insecure, nothing generated
    environ: Mapping[str, str]
    insecure: bool = False

    @property
    def operator(self) -> str | None:
        return chosen(self.environ, OPERATOR_VARS) or (self.keys.operator if self.keys else None)

    @property
    def signing(self) -> str | None:
        return chosen(self.environ, SIGNING_VARS) or (self.keys.signing if self.keys else None)

    def streams(self) -> dict[str, str]:
        return self._env({"RAGWARM_STREAMS_API_KEY": self.operator,
                          "RAGWARM_STREAMS_WORKER_EVENTS_SECRET": self.signing})

    def worker(self, worker_id: str) -> dict[str, str]:
        env = self._env({"RAGWARM_WORKER_API_KEY": self.operator})
        if self.signing:
            # Always set: the key of this worker id, even where the user named the master.
            env["RAGWARM_WORKER_EVENTS_SECRET"] = worker_events_key(self.signing, worker_id)
            env["RAGWARM_WORKER_COMMANDS_KEY"] = worker_commands_key(self.signing)
        return env

    def gateway(self) -> dict[str, str]:
        return self._env({"RAGWARM_GATEWAY_OPERATOR_KEY": self.operator,
                          "RAGWARM_CLIENT_API_KEY": self.operator,
                          "RAGWARM_GATEWAY_WORKER_EVENTS_SECRET": self.signing})

    def key_of(self, variable: str) -> str | None:
        """The key a process reads from `variable` (to call it as an operator)."""
        return self.environ.get(variable) or self.operator

    def _env(self, wanted: Mapping[str, str | None]) -> dict[str, str]:
        env = {k: v for k, v in wanted.items() if v and not self.environ.get(k)}
        if self.insecure:
            env["RAGWARM_INSECURE"] = "true"
        return env
