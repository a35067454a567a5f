"""The stored blend calibration reproduces: a small re-run on the real SmolLM2 (its first
questions at one share, through the worker's engine) agrees with it prompt by prompt."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest

from ragwarm.bench.blend import DEFAULT_QUESTIONS, retrieve_cases
from ragwarm.bench.calibrate import calibrate, cpu_name, package_versions
from ragwarm.bench.engine import DEFAULT_EVENTS
from workers.calibration import Calibration, load_calibration

pytestmark = pytest.mark.integration

QUESTIONS = 3
# Same code, weights and prompts in float32 on a CPU: what may differ from the stored run is
# the summation order (thread count, BLAS build, machine), which moves a KL by rounding-level
# amounts; a changed selection, chunk-KV source or reference moves it by multiples (the stored
# run's mean KL at share 0.3 is 2.2x that at 0.5). 25% of the stored KL, or 2e-4 nats for KLs
# near 0, allows the former and catches the latter.
KL_RELATIVE, KL_ABSOLUTE = 0.25, 2e-4
# A near tie between the two likeliest tokens can flip under another summation order; over 16
# greedy steps that happens now and then, so one question of the few may differ.
FLIPS_ALLOWED = 1


def _kl_close(new: float, stored: float) -> bool:
    return abs(new - stored) <= max(KL_ABSOLUTE, KL_RELATIVE * stored)


def _share_index(stored: Calibration) -> int:
    """The chosen share where the gate passed, else the middle one measured."""
    shares = [s.recompute_share for s in stored.shares]
    return shares.index(stored.share) if stored.share is not None else len(shares) // 2


def test_a_small_calibration_matches_the_stored_one(
    load_engine: Callable[..., Any],
) -> None:
    engine = load_engine(chunk_reuse="off")
    stored = load_calibration(engine.model_id)
    assert stored is not None, f"no stored calibration for {engine.model_id}"
    index = _share_index(stored)
    share = stored.shares[index].recompute_share
    # The stored run indexed every question's documents; so does this one, so the first
    # questions retrieve the same chunks and build the same prompts.
    cases = retrieve_cases(DEFAULT_EVENTS, DEFAULT_QUESTIONS, None, engine.tokenizer)
    tally = calibrate(engine, cases[:QUESTIONS], [share], stored.selection)
    by_qid = {row.qid: row for row in stored.questions}
    # The float32 figures reproduce across x86 CPUs (the stored run's, on an AMD EPYC, and a
    # re-run on an Intel Xeon agreed to every digit at every share); the bfloat16 floor does
    # not: each CPU has its own bf16 kernels (one question's floor KL 0.0008 there, 0.0020
    # here). The floor is compared on a CPU like the stored run's only.
    same_cpu = stored.provenance.machine.startswith(cpu_name() + ",")
    flips = {"first": 0, "greedy": 0}
    for row in tally.rows():
        old = by_qid[row["qid"]]
        assert row["prompt_sha"] == old.prompt_sha, (
            f"{row['qid']}'s prompt changed since the calibration: re-run "
            "`ragwarm bench blend --calibrate`"
        )
        compared = [(row["blend"][0], old.blend[index])]
        if same_cpu:
            compared.append((row["floor"], old.floor))
        for new, before in compared:
            assert _kl_close(new["kl"], before.kl), (
                row["qid"], new["kl"], before.kl,
                f"stored with {stored.provenance.packages or 'packages not recorded'}, "
                f"now {package_versions()}: re-run `ragwarm bench blend --calibrate`")
            flips["first"] += new["same_first"] != before.same_first
            flips["greedy"] += new["same_greedy16"] != before.same_greedy16
    assert flips["first"] <= FLIPS_ALLOWED and flips["greedy"] <= FLIPS_ALLOWED, flips
    # The blend really ran: the prompts' later chunks came from chunk KV.
    assert all(c.blended > 0 for c in tally.shares[share])


def test_a_default_worker_blends_only_where_the_stored_calibration_passes(
    load_engine: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="workers.engines.torch_engine"):
        engine = load_engine()
    stored = load_calibration(engine.model_id)
    assert stored is not None
    said = [r.getMessage() for r in caplog.records if "chunk-KV blending" in r.getMessage()]
    assert len(said) == 1, said  # one line saying whether and why
    selection = engine.chunks.selection
    if stored.passed:
        assert selection is not None and selection.share == stored.share
        assert "passes" in said[0]
    else:
        assert selection is None and "fails the quality gate" in said[0]
