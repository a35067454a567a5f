"""Kafka security: what every client gets, Faust's credentials, the secure broker config."""

from __future__ import annotations

from pathlib import Path

import faust
import pytest
from pydantic import ValidationError

from ragwarm.cli.streams import broker_options
from ragwarm.kafka.local import server_properties
from ragwarm.kafka.secure import SecureMaterial, scram_format_args, secure_properties
from ragwarm.kafka.security import faust_credentials, ssl_context
from ragwarm.settings import KafkaSettings


def scram(**kw: object) -> KafkaSettings:
    return KafkaSettings(
        security_protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_username="ragwarm",
        sasl_password="s3cret",
        **kw,
    )


def test_plaintext_clients_get_only_the_protocol() -> None:
    assert KafkaSettings().client_options() == {"security_protocol": "PLAINTEXT"}
    assert KafkaSettings().producer_options()["acks"] == "all"
    assert KafkaSettings(acks="1").producer_options()["acks"] == 1


def test_sasl_ssl_options_reach_kafka_python(tmp_path: Path) -> None:
    opts = scram(ssl_cafile=tmp_path / "ca.pem").client_options()
    assert opts["sasl_mechanism"] == "SCRAM-SHA-512"
    assert opts["sasl_plain_username"] == "ragwarm"
    assert opts["sasl_plain_password"] == "s3cret"
    assert opts["ssl_cafile"] == str(tmp_path / "ca.pem")
    assert opts["ssl_check_hostname"] is True


def test_incomplete_credentials_are_refused() -> None:
    with pytest.raises(ValidationError, match="SASL_USERNAME"):
        KafkaSettings(security_protocol="SASL_SSL", sasl_username="u")
    with pytest.raises(ValidationError):
        KafkaSettings(security_protocol="SASL_SSL ")
    with pytest.raises(ValidationError, match="go together"):
        KafkaSettings(security_protocol="SSL", ssl_certfile=Path("/c.pem"))


def test_faust_gets_the_same_credentials() -> None:
    assert faust_credentials(KafkaSettings()) is None
    creds = faust_credentials(scram())
    assert isinstance(creds, faust.SASLCredentials)
    assert creds.mechanism.value == "SCRAM-SHA-512" and creds.password == "s3cret"
    assert creds.protocol.value == "SASL_SSL" and creds.ssl_context is not None
    ssl_only = faust_credentials(KafkaSettings(security_protocol="SSL"))
    assert isinstance(ssl_only, faust.SSLCredentials)
    assert ssl_context(KafkaSettings(security_protocol="SASL_PLAINTEXT", sasl_username="u",
                                     sasl_password="p")) is None


def test_streams_app_broker_options_carry_replicas_and_acks() -> None:
    options = broker_options(scram(replication_factor=3, acks="1", bootstrap="k1:9093,k2:9093"))
    assert options.replication_factor == 3 and options.acks == 1
    assert options.bootstrap == "k1:9093,k2:9093"
    assert isinstance(options.credentials, faust.SASLCredentials)
    assert broker_options(KafkaSettings()).acks == -1
    assert KafkaSettings().topic_replicas == -1


def test_secure_broker_opens_only_a_sasl_ssl_client_listener(tmp_path: Path) -> None:
    material = SecureMaterial(tmp_path, {"admin": "a1", "ragwarm": "r1", "keystore": "k1"})
    kafka = KafkaSettings(port=1, controller_port=2)
    text = server_properties(kafka, tmp_path / "data", secure_properties(kafka, material))
    props = dict(line.split("=", 1) for line in text.splitlines())
    assert props["listeners"] == "SASL_SSL://127.0.0.1:1,CONTROLLER://127.0.0.1:2"
    assert props["advertised.listeners"] == "SASL_SSL://127.0.0.1:1"
    assert "PLAINTEXT://" not in props["listeners"].replace("CONTROLLER://", "")
    assert props["sasl.enabled.mechanisms"] == "SCRAM-SHA-512"
    assert 'password="a1"' in props["listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config"]
    assert scram_format_args(material)[1] == "SCRAM-SHA-512=[name=admin,password=a1]"
    env = material.client_env()
    assert env["RAGWARM_KAFKA_SASL_PASSWORD"] == "r1"
    assert KafkaSettings(**{k.removeprefix("RAGWARM_KAFKA_").lower(): v for k, v in env.items()})
