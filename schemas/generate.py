"""Writes the JSON Schema file of every event model under `schemas/json/`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from schemas.events import EVENT_TYPES, LEGACY_TYPES, Event

JSON_DIR = Path(__file__).resolve().parent / "json"


def schema_file(model: type[Event]) -> Path:
    return JSON_DIR / f"{model.SCHEMA}.v{model.VERSION}.json"


def render(model: type[Event]) -> str:
    schema = model.model_json_schema()
    schema["$id"] = f"https://ragwarm.dev/schemas/{model.SCHEMA}.v{model.VERSION}.json"
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def main() -> int:
    JSON_DIR.mkdir(exist_ok=True)
    for model in (*LEGACY_TYPES, *EVENT_TYPES):
        schema_file(model).write_text(render(model))
        print(schema_file(model))
    return 0


if __name__ == "__main__":
    sys.exit(main())
