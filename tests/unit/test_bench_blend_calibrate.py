"""`bench blend --calibrate`'s bookkeeping: the tally of comparisons into a calibration and the
report's `gate` object (the measuring itself is covered by the integration test)."""

from __future__ import annotations

import json
from pathlib import Path

from ragwarm.bench.calibrate import (
    Compared,
    Tally,
    build_calibration,
    prompt_sha,
    report,
    table,
    write_calibration,
)
from workers.calibration import load_calibration

MODEL = "smollm2-135m-instruct"
ORIGIN = {"command": "ragwarm bench blend --calibrate", "date": "2026-12-03T17:00Z",
          "machine": "test", "commit": "abc", "trace": "events.jsonl", "questions": 4}


def rows(agree: list[tuple[bool, bool]], kl: float, ttft_s: float = 0.0) -> list[Compared]:
    return [Compared(first, greedy, kl, ttft_s, 100) for first, greedy in agree]


def tally(share_rows: dict[float, list[Compared]]) -> Tally:
    floor = rows([(True, True), (True, False), (True, True), (False, False)], 0.002)
    return Tally(floor=floor, shares=share_rows, cold_s=[1.0, 1.2, 0.8, 1.0],
                 prompts=[(f"q{i}", prompt_sha([i, 1, 2])) for i in range(4)])


def test_the_gate_picks_the_fastest_share_that_matches_the_floor(tmp_path: Path) -> None:
    good = [(True, True), (True, True), (True, False), (False, False)]
    t = tally({0.3: rows([(True, False)] * 4, 0.01, 0.3),
               0.5: rows(good, 0.004, 0.4), 0.7: rows(good, 0.001, 0.6)})
    calibration = build_calibration(MODEL, "hkvd", t, ORIGIN)
    assert calibration.passed and calibration.share == 0.5 and calibration.ttft_ratio == 0.4
    rep = report(calibration, tmp_path / "c.json")
    assert rep["gate"] == {"passed": True, "share": 0.5, "ttft_ratio": 0.4}
    assert rep["results"][0]["shortfalls"] and not rep["results"][1]["shortfalls"]
    assert [len(q.blend) for q in calibration.questions] == [3] * 4
    assert "gate passes at share 0.5" in table(rep)


def test_a_failing_calibration_is_written_and_read_back_as_failing(tmp_path: Path) -> None:
    t = tally({0.5: rows([(True, False)] * 4, 0.003, 0.4)})
    calibration = build_calibration(MODEL, "hkvd", t, ORIGIN)
    out = tmp_path / "calibrations" / f"{MODEL}.json"
    write_calibration(calibration, out)
    loaded = load_calibration(MODEL, out)
    assert loaded == calibration and not loaded.passed and loaded.share is None
    rep = report(loaded, out)
    assert json.loads(json.dumps(rep))["gate"] == {"passed": False, "share": None,
                                                    "ttft_ratio": None}
    assert "greedy-16 agreement 0.000 < floor 0.500" in table(rep)


def test_the_prompt_hash_tells_prompts_apart() -> None:
    assert prompt_sha([1, 2, 3]) == prompt_sha([1, 2, 3]) != prompt_sha([1, 2, 4])
    assert prompt_sha([12, 3]) != prompt_sha([1, 23])
