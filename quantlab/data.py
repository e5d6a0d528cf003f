"""Text sources for evaluation and calibration: built-in corpora or local files, each with a content hash."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from pydantic import BaseModel, ConfigDict

from .errors import QuantlabError
from .paths import BUNDLED_DIR

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Text:
    """A text and where it came from; ``sha256`` identifies the exact content scored."""

    source: str
    text: str

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()


class DatasetText(BaseModel):
    """A Hugging Face dataset split whose ``field`` values are joined with blank lines (as the GPTQ paper
    joins WikiText-2). ``dataset`` is a hub name (needs the hub) or a local dataset folder."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    dataset: str
    name: str | None = None
    split: str = "test"
    field: str = "text"
    revision: str | None = None


TextSource = str | DatasetText  # a built-in text's name, a .txt / .jsonl file, or a dataset split


def _bundled_heldout() -> str:
    return (BUNDLED_DIR / "tiny-stdlib-llama" / "heldout.txt").read_text(encoding="utf-8")


def _stdlib(split: str) -> Callable[[], str]:
    def load() -> str:
        from .corpus import documents, text_of

        return text_of(documents(split))  # type: ignore[arg-type]

    return load


BUILTIN_TEXTS: dict[str, Callable[[], str]] = {
    "bundled-heldout": _bundled_heldout,
    "stdlib-train": _stdlib("train"),
    "stdlib-heldout": _stdlib("heldout"),
}


def read_text_file(path: Path) -> str:
    """A local .txt file's text, or a .jsonl file's ``text`` fields joined by blank lines."""
    if path.suffix == ".jsonl":
        texts = []
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                texts.append(json.loads(line)["text"])
            except (json.JSONDecodeError, KeyError, TypeError):
                raise QuantlabError(f"{path}: line {n}: expected a JSON object with a 'text' field") from None
        return "\n\n".join(texts)
    return path.read_text(encoding="utf-8")


def _dataset_text(spec: Any) -> Text:
    try:
        import datasets
    except ImportError:
        raise QuantlabError("a dataset text needs the datasets library: pip install datasets") from None
    try:
        data = datasets.load_dataset(spec.dataset, spec.name, split=spec.split, revision=spec.revision)
    except Exception as e:  # the hub, a missing split or a missing folder: all one line for the user
        raise QuantlabError(f"cannot load dataset {spec.dataset} ({spec.name or 'default'}, {spec.split}): "
                            f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    if spec.field not in data.column_names:
        raise QuantlabError(f"dataset {spec.dataset} has no field '{spec.field}' (fields: {', '.join(data.column_names)})")
    name = f"{spec.dataset}" + (f"/{spec.name}" if spec.name else "") + f":{spec.split}"
    return Text(name, "\n\n".join(data[spec.field]))


def load_text(source: Any) -> Text:
    """A built-in text by name, a local .txt / .jsonl (one {"text": ...} per line) file, or a dataset split."""
    if not isinstance(source, str):
        return _dataset_text(source)
    if source in BUILTIN_TEXTS:
        return Text(source, BUILTIN_TEXTS[source]())
    path = Path(source)
    if not path.is_file():
        raise QuantlabError(f"no such text: {source} (built-in: {', '.join(BUILTIN_TEXTS)})")
    return Text(str(path), read_text_file(path))


def calibration_samples(ids: "torch.Tensor", n_samples: int, seq_len: int, seed: int) -> list["torch.Tensor"]:
    """``n_samples`` windows of ``seq_len`` tokens at seeded random offsets of a token stream (as GPTQ samples C4)."""
    import torch

    if ids.numel() <= seq_len:
        raise QuantlabError(f"calibration text has {ids.numel()} tokens; need more than seq_len={seq_len}")
    g = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, ids.numel() - seq_len, (n_samples,), generator=g)
    return [ids[s: s + seq_len].unsqueeze(0) for s in starts.tolist()]


def tokenize(tokenizer: Any, text: Text) -> torch.Tensor:
    """A text's token ids (no special tokens added) as a 1-D long tensor."""
    import torch

    return torch.tensor(tokenizer(text.text, add_special_tokens=False)["input_ids"], dtype=torch.long)


def token_ids_sha256(ids: torch.Tensor) -> str:
    """The SHA-256 of token ids as stored (what a stamp names when the ids, not a text, were scored)."""
    return hashlib.sha256(ids.numpy().tobytes()).hexdigest()
