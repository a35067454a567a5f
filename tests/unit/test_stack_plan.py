"""`ragwarm up --streams N --workers M`: the processes the local stack would run (none started)."""

from __future__ import annotations

import yaml

from ragwarm.settings import HomeSettings, KafkaSettings, StackSettings, infra_dir
from ragwarm.stack.local import ONE_THREAD, Stack
from streams.settings import StreamsSettings


def stack(tmp_path, streams: int = 1, workers: int = 1) -> Stack:
    return Stack(
        home=HomeSettings(home=tmp_path),
        kafka=KafkaSettings(bootstrap="127.0.0.1:1"),
        stack=StackSettings(streams=streams, workers=workers, worker_port=9000),
        streams=StreamsSettings(web_port=7000),
    )


def test_n_streams_instances_share_the_app_id_with_their_own_port_and_disk(tmp_path):
    s = stack(tmp_path, streams=3, workers=2)
    assert [p.name for p in s.streams_all] == ["streams", "streams-2", "streams-3"]
    assert [p.health_url for p in s.streams_all] == [
        f"http://127.0.0.1:{port}/ragwarm/health" for port in (7000, 7001, 7002)
    ]
    assert all("RAGWARM_STREAMS_APP_ID" not in p.env for p in s.streams_all)
    paths = [p.env.get("RAGWARM_QDRANT_PATH") for p in s.streams_all]
    assert paths[0] is None and len(set(paths)) == 3  # the first keeps $RAGWARM_HOME/qdrant
    assert len({p.env.get("RAGWARM_STREAMS_DATA_DIR") for p in s.streams_all}) == 3
    assert [p.name for p in s.workers] == ["worker-1", "worker-2"]
    assert [p.args[2] for p in s.workers] == ["w1", "w2"]
    assert s.streams is s.streams_all[0] and s.streams_url == "http://127.0.0.1:7000"


def test_down_reaches_every_instance_up_started(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    for name in ("streams", "streams-4", "worker-1", "worker-3", "gateway"):
        (run / f"{name}.pid").write_text("1")
    s = stack(tmp_path)
    assert len(s.streams_all) == 4 and len(s.workers) == 3


def test_the_streams_app_runs_its_math_on_one_thread_unless_the_environment_says(
    tmp_path, monkeypatch
):
    for name in ONE_THREAD:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MKL_NUM_THREADS", "4")
    s = stack(tmp_path, streams=2, workers=1)
    for proc in s.streams_all:
        assert proc.env["OMP_NUM_THREADS"] == proc.env["OPENBLAS_NUM_THREADS"] == "1"
        assert "MKL_NUM_THREADS" not in proc.env  # the environment's 4 reaches it unchanged
    assert "OMP_NUM_THREADS" not in s.workers[0].env  # a worker's torch uses every core


def test_the_shipped_deployments_cap_the_streams_threads_as_the_local_stack_does():
    """compose and the chart's defaults set what `ragwarm up` sets for the streams process."""
    infra = infra_dir()
    compose = yaml.safe_load((infra / "compose.yaml").read_text())
    values = yaml.safe_load((infra / "helm" / "ragwarm" / "values.yaml").read_text())
    assert ONE_THREAD.items() <= compose["services"]["streams"]["environment"].items()
    assert ONE_THREAD.items() <= values["streams"]["env"].items()
    assert not ONE_THREAD.keys() & compose["services"]["worker"]["environment"].keys()
