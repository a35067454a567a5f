"""The per-model blend gate: the calibration's verdict, its loader, and the worker's setting."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from workers.calibration import (
    MAX_MEAN_KL,
    CalibrationError,
    Floor,
    ShareFigures,
    blend_setting,
    calibration_path,
    choose_share,
    default_blending,
    load_calibration,
    model_slug,
    parse_calibration,
    shortfalls,
)
from workers.settings import WorkerSettings

MODEL = "smollm2-135m-instruct"
FLOOR = Floor(first_token_agreement=0.944, greedy16_exact=0.556, mean_kl_first_token=0.0019)


def figures(share: float, first: float, greedy: float, kl: float, ratio: float) -> ShareFigures:
    return ShareFigures(recompute_share=share, first_token_agreement=first, greedy16_exact=greedy,
                        mean_kl_first_token=kl, ttft_full_ms_p50=1000.0,
                        ttft_blend_ms_p50=ratio * 1000, ttft_ratio=ratio)


def calibration_data(*shares: ShareFigures, model_id: str = MODEL) -> dict[str, Any]:
    chosen = choose_share(FLOOR, shares)
    return {
        "model_id": model_id, "selection": "hkvd", "passed": chosen is not None,
        "share": chosen and chosen.recompute_share, "ttft_ratio": chosen and chosen.ttft_ratio,
        "floor": FLOOR.model_dump(), "shares": [s.model_dump() for s in shares],
        "provenance": {"command": "ragwarm bench blend --calibrate", "date": "2026-12-03",
                       "machine": "test", "commit": "abc"},
    }


PASSING = (figures(0.3, 0.9, 0.4, 0.004, 0.3), figures(0.5, 0.95, 0.6, 0.003, 0.45),
           figures(0.7, 0.97, 0.7, 0.001, 0.6))
FAILING = (figures(0.3, 0.9, 0.2, 0.012, 0.3), figures(0.5, 1.0, 0.3, 0.004, 0.45))


def write(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps(data))
    return path


# -- the gate ------------------------------------------------------------------------------


def test_a_share_passes_only_when_it_meets_every_criterion() -> None:
    assert shortfalls(FLOOR, figures(0.5, 0.944, 0.556, MAX_MEAN_KL, 0.4)) == []
    missed = shortfalls(FLOOR, figures(0.3, 0.9, 0.5, 0.006, 0.3))
    assert [m.split()[0] for m in missed] == ["first-token", "greedy-16", "mean"]


def test_the_chosen_share_is_the_passing_one_with_the_lowest_ttft_ratio() -> None:
    chosen = choose_share(FLOOR, PASSING)
    assert chosen is not None and chosen.recompute_share == 0.5
    assert choose_share(FLOOR, FAILING) is None


def test_a_calibration_whose_verdict_contradicts_its_figures_is_refused() -> None:
    claims_pass = {**calibration_data(*FAILING), "passed": True, "share": 0.5}
    with pytest.raises(CalibrationError, match="passed=True"):
        parse_calibration(claims_pass)
    wrong_share = {**calibration_data(*PASSING), "share": 0.7}
    with pytest.raises(CalibrationError, match="not the gate's choice"):
        parse_calibration(wrong_share)


# -- the loader ----------------------------------------------------------------------------


def test_load_reads_a_valid_calibration(tmp_path: Path) -> None:
    calibration = load_calibration(MODEL, write(tmp_path, calibration_data(*PASSING)))
    assert calibration is not None and calibration.passed and calibration.share == 0.5


def test_load_without_a_file_is_none(tmp_path: Path) -> None:
    assert load_calibration(MODEL, tmp_path / "absent.json") is None


@pytest.mark.parametrize(
    ("text", "match"),
    [("{not json", "not JSON"), (json.dumps({"model_id": MODEL}), "not a valid blend "
                                                                   "calibration")],
)
def test_load_refuses_a_malformed_file_with_its_path(tmp_path: Path, text: str, match: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(CalibrationError, match=match) as info:
        load_calibration(MODEL, path)
    assert str(path) in str(info.value)


def test_load_refuses_another_models_calibration(tmp_path: Path) -> None:
    path = write(tmp_path, calibration_data(*PASSING, model_id="other-model"))
    with pytest.raises(CalibrationError, match="calibrates 'other-model'"):
        load_calibration(MODEL, path)


def test_the_stored_file_is_named_after_the_model() -> None:
    slug = model_slug("HuggingFaceTB/SmolLM2-135M-Instruct")
    assert slug == "huggingfacetb-smollm2-135m-instruct"
    assert calibration_path(MODEL).name == f"{MODEL}.json"
    assert calibration_path(MODEL).parent.name == "calibrations"


# -- the worker's setting ------------------------------------------------------------------


def test_auto_blends_at_the_calibrated_share_only_when_the_calibration_passes() -> None:
    settings = WorkerSettings()
    share, reason = blend_setting(settings, parse_calibration(calibration_data(*PASSING)))
    assert share == 0.5 and "passes at share 0.5" in reason
    share, reason = blend_setting(settings, parse_calibration(calibration_data(*FAILING)))
    assert share is None and "fails the quality gate" in reason and "greedy-16" in reason


def test_auto_without_a_calibration_is_off_and_says_how_to_make_one() -> None:
    share, reason = blend_setting(WorkerSettings(), None)
    assert share is None and "bench blend --calibrate" in reason


def test_auto_does_not_blend_with_a_selection_the_calibration_did_not_measure() -> None:
    share, reason = blend_setting(WorkerSettings(chunk_selection="tail"),
                                  parse_calibration(calibration_data(*PASSING)))
    assert share is None and "'hkvd'" in reason


def test_an_explicit_share_overrides_the_calibrated_one() -> None:
    share, _ = blend_setting(WorkerSettings(chunk_recompute_share=0.7),
                             parse_calibration(calibration_data(*PASSING)))
    assert share == 0.7


def test_on_forces_blending_with_a_warning_and_off_never_blends() -> None:
    share, reason = blend_setting(WorkerSettings(chunk_reuse="on"), None)
    assert share == WorkerSettings().chunk_recompute_share and "forced on" in reason
    share, _ = blend_setting(WorkerSettings(chunk_reuse="off"),
                             parse_calibration(calibration_data(*PASSING)))
    assert share is None


@pytest.mark.parametrize(("value", "mode"), [(True, "on"), ("true", "on"), (False, "off"),
                                             ("false", "off"), ("AUTO", "auto")])
def test_the_old_boolean_setting_still_reads(value: object, mode: str) -> None:
    assert WorkerSettings(chunk_reuse=value).chunk_reuse == mode


def test_a_bad_reuse_mode_is_refused_with_the_valid_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAGWARM_WORKER_CHUNK_REUSE", "sometimes")
    with pytest.raises(ValueError, match="auto, on or off"):
        WorkerSettings()


def test_default_blending_follows_the_stored_calibration(tmp_path: Path) -> None:
    assert default_blending(MODEL, write(tmp_path, calibration_data(*PASSING)))
    assert not default_blending(MODEL, write(tmp_path, calibration_data(*FAILING)))
    assert not default_blending(MODEL, tmp_path / "absent.json")
