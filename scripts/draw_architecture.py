"""Draw docs/architecture.png, the README's picture of ragwarm's parts and topics.

Run `python scripts/draw_architecture.py` (matplotlib, from the `[bench]` extra) after a
change to the topics in schemas/topics.py or to who produces and consumes them.
"""

from __future__ import annotations

import sys
from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

OUT = Path(__file__).resolve().parents[1] / "docs" / "architecture.png"

# name: (x, y, width, height, fill, title, body); coordinates in a 16 x 9 canvas.
BOXES = {
    "ingest": (0.3, 5.6, 3.2, 1.6, "#e8f0fe", "KB ingestion",
               "ragwarm ingest, KbProducer"),
    "apps": (0.3, 1.6, 3.2, 2.0, "#e8f0fe", "RAG apps",
             "RagClient, ragwarm query,\nOpenAI SDK via the gateway"),
    "streams": (5.6, 1.6, 4.6, 5.0, "#fff4e5", "streams app (Faust)",
                "KB-change agent: chunk, embed,\n  diff chunk hashes:\n"
                "  invalidate | extend TTL | re-prefill\n"
                "query agent: track prefixes,\n  heavy hitters (hot set)\n"
                "worker table: placement, routing\n"
                "web views: /ragwarm/route, /retrieve"),
    "qdrant": (5.6, 7.3, 4.6, 1.3, "#f1f3f4", "Qdrant",
               "local mode (replicated via rag.chunks)\nor a shared server"),
    "workers": (12.3, 1.6, 3.4, 5.0, "#e6f4ea", "inference workers",
                "KV cache index:\nbudgets, TTLs, pins\n\nengines: torch,\nvLLM, llama.cpp,\n"
                "SGLang (remote)"),
}

# (from, to, label, label position as a fraction along the arrow, bend)
ARROWS = [
    ("ingest", "streams", "kb.changes", 0.5, 0.0),
    ("apps", "streams", "rag.queries", 0.5, 0.0),
    ("streams", "workers", "warmup.commands", 0.5, 0.0),
    ("workers", "streams", "worker.events", 0.5, 0.0),
    ("streams", "qdrant", "index, retrieve", 0.5, 0.0),
]
# The routed request goes around the streams app, below it: (x, y) corners, then a label.
COMPLETION = [(1.9, 1.6), (1.9, 0.6), (14.0, 0.6), (14.0, 1.6)]
COMPLETION_LABEL = "POST /v1/completions to the worker that holds the prefix (routed, already warm)"


def anchor(name: str, toward: str) -> tuple[float, float]:
    """The middle of the side of box `name` that faces box `toward`."""
    x, y, w, h = BOXES[name][:4]
    tx, ty, tw, th = BOXES[toward][:4]
    cx, cy, tcx, tcy = x + w / 2, y + h / 2, tx + tw / 2, ty + th / 2
    if abs(tcx - cx) > abs(tcy - cy) * 1.2:
        return (x + w if tcx > cx else x, cy)
    return (cx, y + h if tcy > cy else y)


def draw(out: Path) -> Path:
    fig = Figure(figsize=(16, 9))
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, 16)
    ax.set_ylim(0, 9)
    ax.axis("off")
    for x, y, w, h, fill, title, body in BOXES.values():
        ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.08", fc=fill,
                                    ec="#5f6368", lw=1.5))
        ax.text(x + w / 2, y + h - 0.3, title, ha="center", va="top", fontsize=15,
                weight="bold")
        ax.text(x + 0.2, y + h - 0.85, body, ha="left", va="top", fontsize=11.5,
                linespacing=1.35)
    for src, dst, label, at, bend in ARROWS:
        start, end = anchor(src, dst), anchor(dst, src)
        if {src, dst} == {"streams", "workers"}:  # two arrows between the same sides
            shift = 0.8 if src == "streams" else -0.8
            start, end = (start[0], start[1] + shift), (end[0], end[1] + shift)
        ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=22,
                                     lw=1.8, color="#1a73e8",
                                     connectionstyle=f"arc3,rad={bend}"))
        lx = start[0] + (end[0] - start[0]) * at
        ly = start[1] + (end[1] - start[1]) * at
        vertical = abs(end[0] - start[0]) < 0.01  # label beside the arrow, not on it
        ax.text(lx + (0.15 if vertical else 0), ly + (0 if vertical else 0.22), label,
                ha="left" if vertical else "center", va="center" if vertical else "bottom",
                fontsize=11.5,
                color="#174ea6", family="monospace",
                bbox={"fc": "white", "ec": "none", "alpha": 0.85, "pad": 1.5})
    xs, ys = zip(*COMPLETION[:-1], strict=True)
    ax.plot(xs, ys, color="#188038", lw=1.8)
    ax.add_patch(FancyArrowPatch(COMPLETION[-2], COMPLETION[-1], arrowstyle="-|>",
                                 mutation_scale=22, lw=1.8, color="#188038"))
    ax.text(8, 0.7, COMPLETION_LABEL, ha="center", va="bottom", fontsize=11.5,
            color="#137333", family="monospace")
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=80)
    return out


if __name__ == "__main__":
    print(draw(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT))
