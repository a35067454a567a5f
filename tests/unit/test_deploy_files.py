"""The deployment files that no test here can run (no container engine): their structure.

Each role's image installs its own extra, runs as a non-root user and carries no JDK or
Maven; compose pins a Qdrant server the installed client accepts.
"""

from __future__ import annotations

import re
from importlib.metadata import version
from pathlib import Path

import yaml
from qdrant_client.common.version_check import is_compatible

ROOT = Path(__file__).resolve().parents[2]
ROLES = {"gateway": "client", "worker": "worker", "streams": "streams", "all": "all"}


def stages() -> dict[str, str]:
    """Stage name -> its text, from infra/Dockerfile."""
    text = (ROOT / "infra" / "Dockerfile").read_text()
    parts = re.split(r"^FROM ", text, flags=re.M)[1:]
    return {re.match(r"\S+ AS (\S+)", p).group(1): p for p in parts}


def test_each_role_image_has_its_extra_and_a_non_root_user() -> None:
    found = stages()
    assert list(found)[-1] == "all", "the default target (the last stage) holds every role"
    for target, extra in ROLES.items():
        stage = found[target]
        assert re.search(r"^USER 10001", stage, flags=re.M), target
        venv = re.search(r"--from=(venv-\S+) /opt/venv", stage).group(1)
        assert f'"/src[{extra}]"' in found[venv], (target, venv)


def test_no_image_carries_a_jdk_or_maven() -> None:
    text = (ROOT / "infra" / "Dockerfile").read_text()
    assert not re.search(r"apt-get install[^\n]*(openjdk|maven)", text)


def test_the_build_context_holds_only_what_the_image_installs() -> None:
    lines = [ln.strip() for ln in (ROOT / ".dockerignore").read_text().splitlines()
             if ln.strip() and not ln.startswith("#")]
    assert lines[0] == "**"
    kept = {ln[1:] for ln in lines if ln.startswith("!")}
    copies = re.findall(r"^COPY (?!--)(.+)$", stages()["source"], flags=re.M)
    copied = {src for line in copies for src in line.split()[:-1]}
    assert copied and copied <= kept, copied - kept
    assert not kept & {"tests", ".git", "docs", ".venv"}


def test_compose_pins_a_qdrant_server_the_client_accepts() -> None:
    compose = yaml.safe_load((ROOT / "infra" / "compose.yaml").read_text())
    tag = compose["services"]["qdrant"]["image"].rpartition(":v")[2]
    client = version("qdrant-client")
    assert is_compatible(client, tag), f"qdrant server {tag} vs qdrant-client {client}"
