"""Secure defaults at start: what a process would leave open, and whether it may start so.

A process listening beyond loopback with open views, an open API or gateway, or accepting
unsigned worker events refuses to start unless the user opted out (--insecure,
RAGWARM_INSECURE); on loopback it starts with a warning, as a test or a hand-run process
on a laptop does. `ragwarm up`, the compose file and the Helm chart always pass keys.
"""

from __future__ import annotations

import ipaddress
import logging
from dataclasses import dataclass
from typing import Literal

import click

log = logging.getLogger(__name__)

Verdict = Literal["ok", "warn", "refuse"]


@dataclass(frozen=True)
class Exposure:
    """One thing a process would leave open, and the setting that closes it."""

    what: str
    fix: str


def open_keys(component: str, operator_set: bool, tenants_set: bool) -> list[Exposure]:
    """Views or an API with no key at all: anyone reaching the port acts for every tenant."""
    if operator_set or tenants_set:
        return []
    if component == "gateway":
        return [Exposure("the gateway accepts any key for any tenant",
                         "RAGWARM_GATEWAY_OPERATOR_KEY or RAGWARM_GATEWAY_KEYS")]
    prefix = "RAGWARM_STREAMS" if component == "streams" else "RAGWARM_WORKER"
    what = "the views answer without a key" if component == "streams" else \
        "the worker API answers without a key"
    return [Exposure(what, f"{prefix}_API_KEY (or {prefix}_TENANT_KEYS)")]


def unsigned_events(component: str, secret_set: bool) -> list[Exposure]:
    """Worker events without a signature: any writer of worker.events could name a URL
    the clients then send prompts and keys to."""
    if secret_set:
        return []
    if component in ("streams", "gateway"):
        return [Exposure("unsigned worker events are accepted",
                         f"RAGWARM_{component.upper()}_WORKER_EVENTS_SECRET")]
    return [Exposure("this worker's events are unsigned", "RAGWARM_WORKER_EVENTS_SECRET")]


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to any interface


def verdict(exposures: list[Exposure], host: str, insecure: bool) -> Verdict:
    if not exposures:
        return "ok"
    if insecure or is_loopback(host):
        return "warn"
    return "refuse"


def check_start(component: str, exposures: list[Exposure], host: str, insecure: bool) -> None:
    """Start, warn, or stop with a ClickException that names the settings to set."""
    decided = verdict(exposures, host, insecure)
    if decided == "ok":
        return
    listed = "; ".join(f"{e.what} (set {e.fix})" for e in exposures)
    if decided == "refuse":
        raise click.ClickException(
            f"{component} refuses to listen on {host} insecurely: {listed}. "
            "`ragwarm up` and the Helm chart generate these keys (docs/security.md); "
            "to run open anyway, pass --insecure or set RAGWARM_INSECURE=1."
        )
    why = "--insecure" if insecure else f"listening on loopback {host} only"
    log.warning("INSECURE %s (%s): %s. Anyone who can reach it acts for every tenant; "
                "see docs/security.md", component, why, listed)
