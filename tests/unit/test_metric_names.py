"""Every metric family the worker, streams app and gateway export follows the naming
convention: vLLM's own `vllm:` names, else `ragwarm_<component>_<name>_<unit>`; counters
end in `_total`, durations are seconds (never ms), ratios are left to Prometheus, and no
family is exported twice. Seed 000's four names are the documented exceptions."""

from __future__ import annotations

import re
from collections import Counter

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.unit.metrics_kit import scrapes
from workers.metrics import SEED_ALIASES

# vLLM's V1 metric names (docs.vllm.ai, "Production Metrics"; family names as the text
# format's parser gives them, counters without `_total`): a `vllm:` name must be one of
# these, so a dashboard written for vLLM reads the same thing from a ragwarm worker.
VLLM_NAMES = frozenset({
    "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
    "vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:prompt_tokens",
    "vllm:generation_tokens", "vllm:request_success", "vllm:time_to_first_token_seconds",
    "vllm:e2e_request_latency_seconds", "vllm:inter_token_latency_seconds",
    "vllm:request_queue_time_seconds", "vllm:request_prefill_time_seconds",
})
FAMILY = re.compile(r"^# TYPE (\S+) (\S+)$", re.MULTILINE)
RATIO_WORDS = ("_rate", "_ratio", "_perc", "_percent", "_fraction", "_share")


def families(text: str) -> list[tuple[str, str, set[str]]]:
    """(name, type, label values) of each family, without prometheus_client's `_created`
    companions (the creation time of a counter or histogram, part of that family)."""
    found = [(f.name, f.type, {v for s in f.samples for v in s.labels.values()})
             for f in text_string_to_metric_families(text)]
    stateful = {name for name, kind, _ in found if kind in ("counter", "histogram")}
    return [(name, kind, values) for name, kind, values in found
            if not (name.endswith("_created") and name.removesuffix("_created") in stateful)]


@pytest.fixture(scope="module")
def exported() -> dict[str, str]:
    return scrapes()


def test_every_family_has_its_component_prefix_or_a_vllm_name(exported) -> None:
    wrong = []
    for component, text in exported.items():
        for name, _, _ in families(text):
            if component == "worker" and (name in SEED_ALIASES or name in VLLM_NAMES):
                continue
            if not name.startswith(f"ragwarm_{component}_"):
                wrong.append(f"{component}: {name}")
    assert not wrong, wrong


def test_counters_end_in_total_and_durations_are_seconds(exported) -> None:
    wrong = []
    for component, text in exported.items():
        for name, kind, values in families(text):
            if name in SEED_ALIASES:
                continue
            samples = {s.name for f in text_string_to_metric_families(text) if f.name == name
                       for s in f.samples}
            if kind == "counter" and not all(s.endswith(("_total", "_created")) for s in samples):
                wrong.append(f"{component} {name}: a counter's samples end in _total")
            if kind != "counter" and name.endswith("_total"):
                wrong.append(f"{component} {name}: only counters end in _total")
            if kind == "histogram" and not name.endswith("_seconds"):
                wrong.append(f"{component} {name}: a duration histogram is in seconds")
            if re.search(r"_(ms|millis|milliseconds)(_|$)", name):
                wrong.append(f"{component} {name}: milliseconds")
            if kind == "counter" and any(v.endswith("_ms") for v in values):
                wrong.append(f"{component} {name}: a label value in milliseconds: {sorted(values)}")
    assert not wrong, wrong


def test_ratios_are_left_to_prometheus(exported) -> None:
    """A since-start ratio in a gauge hides the present behind the past: export the two
    counters. vLLM's `kv_cache_usage_perc` is a level, not a ratio of counters."""
    ratios = [name for text in exported.values() for name, kind, _ in families(text)
              if kind == "gauge" and name.endswith(RATIO_WORDS)
              and name not in SEED_ALIASES and name not in VLLM_NAMES]
    assert not ratios


def test_no_family_is_exported_twice(exported) -> None:
    declared = Counter(name for text in exported.values() for name, _ in FAMILY.findall(text))
    assert [name for name, n in declared.items() if n > 1] == []


def test_the_seed_aliases_name_metrics_that_exist(exported) -> None:
    """Each alias says what to query instead; that metric is exported."""
    samples = {s.name for text in exported.values()
               for f in text_string_to_metric_families(text) for s in f.samples}
    for alias, instead in SEED_ALIASES.items():
        assert any(alias == s or s.startswith(alias + "_") for s in samples), alias
        for name in re.findall(r"(?:vllm:|ragwarm_)[a-z_:]+", instead):
            assert name in samples or f"{name}_bucket" in samples, (alias, name)
