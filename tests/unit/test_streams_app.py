"""The Faust app's producer settings (no broker: the app is only configured)."""

from __future__ import annotations

from pathlib import Path

from streams.settings import StreamsSettings
from streams.shell.app import BrokerOptions, create_app


def _conf(tmp_path: Path, **settings: int):
    app = create_app(StreamsSettings(**settings), BrokerOptions("127.0.0.1:9"), tmp_path)
    return app.conf


def test_a_partition_batch_holds_many_records_not_faust_16_kib(tmp_path: Path) -> None:
    conf = _conf(tmp_path)
    assert conf.producer_max_batch_size == StreamsSettings().producer_batch_bytes > 16_384


def test_a_batch_never_exceeds_the_max_request(tmp_path: Path) -> None:
    conf = _conf(tmp_path, producer_batch_bytes=4_000_000, producer_max_request_bytes=200_000)
    assert conf.producer_max_batch_size == conf.producer_max_request_size == 200_000
