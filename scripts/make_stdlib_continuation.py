"""Build evals/stdlib_continuation/test.jsonl: pick the true continuation of held-out stdlib text.

    python scripts/make_stdlib_continuation.py

Each item: 160 characters of a held-out document as context, its next 48 characters and the
48 characters at the same offset of three other held-out documents as choices. Deterministic.
"""
from __future__ import annotations

import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from quantlab.corpus import documents  # noqa: E402

CONTEXT, CONTINUATION, DISTRACTORS = 160, 48, 3


def main() -> None:
    rng = random.Random(0)
    docs = [" ".join(d.text.split()) for d in documents("heldout")]
    docs = [d for d in docs if len(d) >= CONTEXT + CONTINUATION]
    items = []
    for i, doc in enumerate(docs):
        others = rng.sample([j for j in range(len(docs)) if j != i], DISTRACTORS)
        choices = [doc[CONTEXT: CONTEXT + CONTINUATION]] + [docs[j][CONTEXT: CONTEXT + CONTINUATION] for j in others]
        order = list(range(len(choices)))
        rng.shuffle(order)
        items.append({"context": doc[:CONTEXT], "choices": [choices[k] for k in order], "gold": order.index(0)})
    out = Path(__file__).resolve().parents[1] / "evals" / "stdlib_continuation" / "test.jsonl"
    out.write_text("".join(json.dumps(item) + "\n" for item in items), encoding="utf-8")
    print(f"{len(items)} items -> {out}")


if __name__ == "__main__":
    main()
