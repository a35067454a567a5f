"""JSON log lines and the hint a command gives when its extra is not installed."""

from __future__ import annotations

import json
import logging
import sys

import click
import pytest

from ragwarm.cli import LazyGroup
from ragwarm.logs import JsonFormatter, LogSettings, faust_logging_config


def test_a_json_line_is_one_object_with_the_exception() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.LogRecord("ragwarm.x", logging.ERROR, __file__, 1, "failed %s", ("a",),
                                   sys.exc_info())
    line = JsonFormatter().format(record)
    body = json.loads(line)
    assert "\n" not in line
    assert (body["level"], body["logger"], body["message"]) == ("ERROR", "ragwarm.x", "failed a")
    assert "ValueError: boom" in body["exc"] and body["ts"].endswith("+00:00")


def test_faust_gets_the_json_formatter_only_when_asked() -> None:
    assert faust_logging_config(LogSettings(format="text")) is None
    config = faust_logging_config(LogSettings(format="json"))
    assert config["handlers"]["default"]["formatter"] == "json"


def test_a_command_whose_extra_is_missing_says_which_to_install() -> None:
    group = LazyGroup(targets={"worker": "no_such_module_xyz:worker"})
    with pytest.raises(click.ClickException, match=r"ragwarm\[worker\]"):
        group.get_command(click.Context(group), "worker")
