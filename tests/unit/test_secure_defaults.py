"""Secure defaults: the start-up verdict of each process, and the stack's stored keys."""

from __future__ import annotations

import click
import pytest
import yaml

from ragwarm.secure import check_start, is_loopback, open_keys, unsigned_events, verdict
from ragwarm.settings import HomeSettings, KafkaSettings, StackSettings, infra_dir
from ragwarm.stack.keys import StackSecurity, load, load_or_create, worker_events_key
from ragwarm.stack.local import Stack, security_lines, stack_keys
from schemas.signing import derive_commands_key, derive_worker_key

OPEN = open_keys("streams", operator_set=False, tenants_set=False)


def test_a_key_or_a_secret_closes_each_exposure() -> None:
    assert open_keys("worker", operator_set=True, tenants_set=False) == []
    assert open_keys("gateway", operator_set=False, tenants_set=True) == []
    assert unsigned_events("streams", secret_set=True) == []
    assert "RAGWARM_STREAMS_API_KEY" in OPEN[0].fix
    assert "RAGWARM_GATEWAY_OPERATOR_KEY" in open_keys("gateway", False, False)[0].fix
    assert "RAGWARM_WORKER_EVENTS_SECRET" in unsigned_events("worker", False)[0].fix
    assert "RAGWARM_GATEWAY_WORKER_EVENTS_SECRET" in unsigned_events("gateway", False)[0].fix


@pytest.mark.parametrize(("host", "loop"), [("127.0.0.1", True), ("::1", True),
                                            ("localhost", True), ("0.0.0.0", False),
                                            ("10.0.0.5", False), ("worker-0.svc", False)])
def test_loopback_hosts(host: str, loop: bool) -> None:
    assert is_loopback(host) is loop


def test_open_beyond_loopback_is_refused_unless_opted_out() -> None:
    assert verdict([], "0.0.0.0", insecure=False) == "ok"
    assert verdict(OPEN, "127.0.0.1", insecure=False) == "warn"
    assert verdict(OPEN, "0.0.0.0", insecure=False) == "refuse"
    assert verdict(OPEN, "0.0.0.0", insecure=True) == "warn"


def test_the_refusal_names_the_fix(caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(click.ClickException) as refused:
        check_start("streams", OPEN, "0.0.0.0", insecure=False)
    assert "RAGWARM_STREAMS_API_KEY" in refused.value.message
    assert "--insecure" in refused.value.message and "RAGWARM_INSECURE" in refused.value.message
    with caplog.at_level("WARNING"):
        check_start("streams", OPEN, "0.0.0.0", insecure=True)
    assert "INSECURE streams (--insecure)" in caplog.text


def test_keys_are_made_once_with_mode_0600(tmp_path) -> None:
    folder = tmp_path / "keys"
    assert load(folder) is None
    first = load_or_create(folder)
    assert first.created and first.operator != first.signing and len(first.operator) >= 40
    assert folder.stat().st_mode & 0o777 == 0o700
    for path in (first.operator_file, first.signing_file):
        assert path.stat().st_mode & 0o777 == 0o600
    first.operator_file.chmod(0o644)
    again = load_or_create(folder)
    assert not again.created and (again.operator, again.signing) == (first.operator,
                                                                       first.signing)
    assert first.operator_file.stat().st_mode & 0o777 == 0o600


def test_an_empty_key_file_is_an_error(tmp_path) -> None:
    keys = load_or_create(tmp_path)
    keys.operator_file.write_text("\n")
    with pytest.raises(ValueError, match="empty key file"):
        load(tmp_path)


def test_every_process_gets_the_operator_key_and_the_signing_secret(tmp_path) -> None:
    keys = load_or_create(tmp_path)
    security = StackSecurity(keys, {})
    assert security.streams() == {"RAGWARM_STREAMS_API_KEY": keys.operator,
                                  "RAGWARM_STREAMS_WORKER_EVENTS_SECRET": keys.signing}
    assert security.worker("w1") == {"RAGWARM_WORKER_API_KEY": keys.operator,
                                     "RAGWARM_WORKER_EVENTS_SECRET":
                                     worker_events_key(keys.signing, "w1"),
                                     "RAGWARM_WORKER_COMMANDS_KEY":
                                     derive_commands_key(keys.signing.encode())}
    # A worker gets its own key, never the master: it cannot sign as another worker.
    w1, w2 = (security.worker(w)["RAGWARM_WORKER_EVENTS_SECRET"] for w in ("w1", "w2"))
    assert len({w1, w2, keys.signing}) == 3
    assert w1 == derive_worker_key(keys.signing.encode(), "w1")
    assert security.gateway() == {"RAGWARM_GATEWAY_OPERATOR_KEY": keys.operator,
                                  "RAGWARM_CLIENT_API_KEY": keys.operator,
                                  # The master: the gateway verifies every worker's events.
                                  "RAGWARM_GATEWAY_WORKER_EVENTS_SECRET": keys.signing}


def test_a_key_the_user_set_is_kept_and_shared_with_the_others(tmp_path) -> None:
    """RAGWARM_STREAMS_API_KEY=k: the workers and the gateway's client get k too (the stack
    refused its own readiness check when only the views had it)."""
    security = StackSecurity(load_or_create(tmp_path), {"RAGWARM_STREAMS_API_KEY": "k"})
    assert "RAGWARM_STREAMS_API_KEY" not in security.streams()  # inherited as set
    assert security.worker("w1")["RAGWARM_WORKER_API_KEY"] == "k"
    assert security.gateway()["RAGWARM_CLIENT_API_KEY"] == "k"
    assert security.key_of("RAGWARM_WORKER_API_KEY") == "k"
    assert "from your RAGWARM_*_API_KEY setting" in security_lines(security)[0]


def test_insecure_generates_nothing_and_says_so() -> None:
    security = StackSecurity(None, {}, insecure=True)
    assert security.streams() == {"RAGWARM_INSECURE": "true"}
    assert security.worker("w1") == {"RAGWARM_INSECURE": "true"}
    assert "open" in security_lines(security)[0]


def test_the_new_key_is_printed_once(tmp_path) -> None:
    made = StackSecurity(load_or_create(tmp_path), {})
    assert any(made.operator in line for line in security_lines(made))
    reused = StackSecurity(load_or_create(tmp_path), {})
    assert not any(reused.operator in line for line in security_lines(reused))


def test_the_stack_starts_every_process_with_the_keys(tmp_path, monkeypatch) -> None:
    for name in ("RAGWARM_STREAMS_API_KEY", "RAGWARM_WORKER_API_KEY", "RAGWARM_INSECURE",
                 "RAGWARM_WORKER_EVENTS_SECRET", "RAGWARM_CLIENT_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    home = HomeSettings(home=tmp_path)
    s = Stack(home, kafka=KafkaSettings(bootstrap="127.0.0.1:1"),
              stack=StackSettings(streams=2, workers=2), keys=stack_keys(home, False))
    key = (tmp_path / "keys" / "operator.key").read_text().strip()
    assert all(p.env["RAGWARM_STREAMS_API_KEY"] == key for p in s.streams_all)
    assert all(p.env["RAGWARM_WORKER_API_KEY"] == key for p in s.workers)
    assert s.gateway.env["RAGWARM_CLIENT_API_KEY"] == key
    assert s.headers("RAGWARM_STREAMS_API_KEY") == {"Authorization": f"Bearer {key}"}
    # `status` and `down` build the stack without keys=: they read the stored ones.
    assert Stack(home, kafka=KafkaSettings(bootstrap="127.0.0.1:1")).security.operator == key
    assert stack_keys(home, insecure=True) is None


def test_compose_requires_the_keys_for_every_listening_service() -> None:
    compose = yaml.safe_load((infra_dir() / "compose.yaml").read_text())["services"]
    wanted = {"streams": ("RAGWARM_STREAMS_API_KEY", "RAGWARM_STREAMS_WORKER_EVENTS_SECRET"),
              "worker": ("RAGWARM_WORKER_API_KEY", "RAGWARM_WORKER_EVENTS_SECRET"),
              "gateway": ("RAGWARM_GATEWAY_OPERATOR_KEY", "RAGWARM_CLIENT_API_KEY",
                          "RAGWARM_GATEWAY_WORKER_EVENTS_SECRET")}
    for service, names in wanted.items():
        env = compose[service]["environment"]
        for name in names:
            assert env[name].startswith("${RAGWARM_") and ":?" in env[name], (service, name)
        assert "RAGWARM_INSECURE" not in env


@pytest.mark.parametrize(("command", "args", "fix"), [
    ("ragwarm.cli.streams:streams", [], "RAGWARM_STREAMS_API_KEY"),
    ("ragwarm.cli.worker:worker", ["--host", "0.0.0.0"], "RAGWARM_WORKER_EVENTS_SECRET"),
    ("ragwarm.gateway.app:gateway", ["--host", "0.0.0.0"], "RAGWARM_GATEWAY_OPERATOR_KEY"),
])
def test_a_process_beyond_loopback_without_keys_refuses_before_any_work(
    command: str, args: list[str], fix: str, monkeypatch
) -> None:
    import importlib

    from click.testing import CliRunner

    for name in ("RAGWARM_STREAMS_API_KEY", "RAGWARM_STREAMS_WORKER_EVENTS_SECRET",
                 "RAGWARM_WORKER_API_KEY", "RAGWARM_WORKER_EVENTS_SECRET", "RAGWARM_INSECURE",
                 "RAGWARM_GATEWAY_OPERATOR_KEY", "RAGWARM_GATEWAY_KEYS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RAGWARM_STREAMS_WEB_HOST", "0.0.0.0")
    module, _, attr = command.partition(":")
    cli = getattr(importlib.import_module(module), attr)
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 1 and "refuses to listen on 0.0.0.0" in result.output, result.output
    assert fix in result.output and "--insecure" in result.output
