"""The per-model quality gate for chunk-KV blending (pure): the stored calibration, the gate
over its figures, and whether a worker blends, at which share, and why."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

# Mean first-token KL (nats) a blend may add over the float32 full prefill (issue 38): about
# twice the bfloat16 floor measured on SmolLM2 (0.0019), far below what changes an answer.
MAX_MEAN_KL = 0.005
CALIBRATIONS_DIR = Path(__file__).with_name("calibrations")
ReuseMode = Literal["auto", "on", "off"]
# WorkerSettings.chunk_selection's default (defined here: the settings import this module).
DEFAULT_SELECTION: Final = "hkvd"


class CalibrationError(ValueError):
    """A calibration file that is missing fields, malformed, or contradicts its own figures."""


class Quality(BaseModel):
    """Agreement of a computation with the float32 full prefill, over the calibration's prompts."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    first_token_agreement: float = Field(ge=0, le=1)
    greedy16_exact: float = Field(ge=0, le=1)
    mean_kl_first_token: float = Field(ge=0)


class Floor(Quality):
    """The same model in a lower precision against float32: noise no blend needs to beat."""

    dtype: str = "bfloat16"


class ShareFigures(Quality):
    """The blend at one recompute share, and its TTFT against the cold full prefill's."""

    recompute_share: float = Field(ge=0, le=1)
    ttft_full_ms_p50: float = Field(ge=0)
    ttft_blend_ms_p50: float = Field(ge=0)
    ttft_ratio: float = Field(ge=0)
    # On the same cache with blending off (None in calibrations before 2026-12-07): what the
    # blend itself gains; `ttft_ratio` also credits it with the first chunk's exact hit.
    ttft_exact_ms_p50: float | None = Field(default=None, ge=0)
    ttft_vs_exact: float | None = Field(default=None, ge=0)
    blended_tokens_mean: float = Field(default=0.0, ge=0)


class Outcome(BaseModel):
    """One prompt, one computation, against the float32 full prefill."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    same_first: bool
    same_greedy16: bool
    kl: float = Field(ge=0)


class QuestionRow(BaseModel):
    """One question's outcomes: the floor's, and the blend's per share (in `shares` order),
    with a hash of its prompt's token ids so a re-run can check it measures the same prompt."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    qid: str
    prompt_sha: str
    floor: Outcome
    blend: tuple[Outcome, ...]


class Provenance(BaseModel):
    """Where a calibration's figures come from, so they can be re-run and compared."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    command: str
    date: str
    machine: str
    commit: str
    trace: str = ""
    questions: int = Field(default=0, ge=0)
    # The bfloat16 floor moves with the kernels (another CPU moved one question's KL 2.5x,
    # 2026-12-05), so a re-run is compared knowing what it ran on. "": not recorded.
    packages: str = ""


class Calibration(BaseModel):
    """One model's measured blend quality per share, its floor, and the share the gate chose."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model_id: str = Field(min_length=1)
    selection: str
    passed: bool
    share: float | None = Field(default=None, ge=0, le=1)
    ttft_ratio: float | None = None
    max_mean_kl: float = MAX_MEAN_KL
    floor: Floor
    shares: tuple[ShareFigures, ...] = Field(min_length=1)
    provenance: Provenance
    questions: tuple[QuestionRow, ...] = ()

    @model_validator(mode="after")
    def _agrees_with_its_figures(self) -> Calibration:
        # The verdict is recomputed from the figures: an edited `passed` cannot switch it on.
        chosen = choose_share(self.floor, self.shares, self.max_mean_kl)
        if self.passed != (chosen is not None):
            raise ValueError(f"passed={self.passed} but the figures say {chosen is not None}")
        if chosen is not None and self.share != chosen.recompute_share:
            raise ValueError(f"share {self.share} is not the gate's choice "
                             f"{chosen.recompute_share}")
        if any(len(q.blend) != len(self.shares) for q in self.questions):
            raise ValueError("every question row needs one blend outcome per share")
        return self


def shortfalls(floor: Quality, figures: Quality, max_kl: float = MAX_MEAN_KL) -> list[str]:
    """The criteria `figures` miss (empty: the gate passes at that share)."""
    missed = []
    if figures.first_token_agreement < floor.first_token_agreement:
        missed.append(f"first-token agreement {figures.first_token_agreement:.3f} < floor "
                      f"{floor.first_token_agreement:.3f}")
    if figures.greedy16_exact < floor.greedy16_exact:
        missed.append(f"greedy-16 agreement {figures.greedy16_exact:.3f} < floor "
                      f"{floor.greedy16_exact:.3f}")
    if figures.mean_kl_first_token > max_kl:
        missed.append(f"mean KL {figures.mean_kl_first_token:.4f} > {max_kl}")
    return missed


def choose_share(
    floor: Quality, shares: Sequence[ShareFigures], max_kl: float = MAX_MEAN_KL
) -> ShareFigures | None:
    """The passing share with the lowest TTFT ratio (ties: the lower share); None if none."""
    passing = [s for s in shares if not shortfalls(floor, s, max_kl)]
    return min(passing, key=lambda s: (s.ttft_ratio, s.recompute_share), default=None)


def model_slug(model_id: str) -> str:
    """The file name stem of a model's calibration: `HF/SmolLM2-135M` -> `hf-smollm2-135m`."""
    slug = re.sub(r"[^a-z0-9.]+", "-", model_id.lower()).strip("-.")
    if not slug:
        raise CalibrationError(f"model id {model_id!r} has no usable name")
    return slug


def calibration_path(model_id: str) -> Path:
    """Where the repository stores (and the package ships) a model's calibration."""
    return CALIBRATIONS_DIR / f"{model_slug(model_id)}.json"


def parse_calibration(data: Any, source: str = "calibration") -> Calibration:
    try:
        return Calibration.model_validate(data)
    except ValidationError as exc:
        raise CalibrationError(f"{source} is not a valid blend calibration: {exc}") from None


def load_calibration(model_id: str, path: Path | None = None) -> Calibration | None:
    """The calibration of `model_id` (from `path`, else the stored one); None when there is
    none. Raises CalibrationError when the file is invalid or calibrates another model."""
    path = path if path is not None else calibration_path(model_id)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CalibrationError(f"{path} is not JSON: {exc}") from None
    calibration = parse_calibration(data, str(path))
    if calibration.model_id != model_id:
        raise CalibrationError(f"{path} calibrates {calibration.model_id!r}, not {model_id!r}")
    return calibration


def reuse_mode(value: object) -> ReuseMode:
    """`auto`, `on` or `off`; booleans (the old setting) map to on and off."""
    if isinstance(value, bool):
        return "on" if value else "off"
    text = str(value).strip().lower()
    legacy = {"true": "on", "1": "on", "yes": "on", "false": "off", "0": "off", "no": "off"}
    text = legacy.get(text, text)
    if text not in ("auto", "on", "off"):
        raise ValueError(f"chunk_reuse must be auto, on or off (or true/false), not {value!r}")
    return text  # type: ignore[return-value]


def blend_setting(
    settings: Any, calibration: Calibration | None
) -> tuple[float | None, str]:
    """The recompute share a worker blends at (None: blending off) and one line saying why.

    `settings` is a WorkerSettings: `chunk_reuse` auto blends only where `calibration` passes
    for the selection in use; on blends regardless (the reason is a warning); off never. An
    explicitly set `chunk_recompute_share` overrides the calibration's chosen share.
    """
    mode = reuse_mode(settings.chunk_reuse)
    explicit = "chunk_recompute_share" in settings.model_fields_set
    override = settings.chunk_recompute_share if explicit else None
    if mode == "off":
        return None, "chunk-KV blending off (RAGWARM_WORKER_CHUNK_REUSE=off)"
    verdict = _verdict(settings.chunk_selection, calibration)
    if mode == "on":
        share = override if override is not None else _calibrated_share(settings, calibration)
        note = "" if verdict is None else f" although {verdict}"
        return share, (f"chunk-KV blending forced on at share {share}{note} "
                       "(RAGWARM_WORKER_CHUNK_REUSE=on): answers may differ from full prefill")
    if verdict is not None:
        return None, f"chunk-KV blending off: {verdict}"
    assert calibration is not None and calibration.share is not None
    share = override if override is not None else calibration.share
    return share, (f"chunk-KV blending on at share {share} ({settings.chunk_selection}): the "
                   f"calibration of {calibration.model_id} passes at share {calibration.share}, "
                   f"TTFT {calibration.ttft_ratio:.0%} of full prefill")


def _calibrated_share(settings: Any, calibration: Calibration | None) -> float:
    if calibration is not None and calibration.share is not None:
        return calibration.share
    return float(settings.chunk_recompute_share)


def _verdict(selection: str, calibration: Calibration | None) -> str | None:
    """Why a calibration does not let this worker blend (None: it does)."""
    if calibration is None:
        return ("no blend calibration for this model (`ragwarm bench blend --calibrate` "
                "writes one)")
    if not calibration.passed:
        limits = "; ".join(_limits(calibration))
        return f"the calibration of {calibration.model_id} fails the quality gate ({limits})"
    if selection != calibration.selection:
        return (f"the calibration measured selection {calibration.selection!r}, not "
                f"{selection!r}")
    return None


def _limits(calibration: Calibration) -> list[str]:
    """What keeps the best-quality share from passing: its missed criteria."""
    best = max(calibration.shares, key=lambda s: (s.greedy16_exact, s.first_token_agreement,
                                                  -s.mean_kl_first_token))
    missed = shortfalls(calibration.floor, best, calibration.max_mean_kl)
    return [f"best share {best.recompute_share}: {m}" for m in missed]


def default_blending(model_id: str, path: Path | None = None) -> bool:
    """Whether a worker with default settings blends for `model_id` (its stored calibration
    passes for the default selection)."""
    return _verdict(DEFAULT_SELECTION, load_calibration(model_id, path)) is None
