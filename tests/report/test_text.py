"""Report sentences that depend on the run: a model read from a GGUF file says its weights were quantized."""
from pathlib import Path

from quantlab.report import write_report
from quantlab.report.text import gguf_note
from tests.report.conftest import make_row, write_run


def test_a_model_read_from_a_gguf_file_is_named_with_its_tensor_types_in_both_reports(tmp_path: Path) -> None:
    import json

    folder = write_run(tmp_path / "run", "gguf", [make_row("bf16", 9.5, 15.4, 3.7), make_row("int8", 5.8, 15.44, 2.9)])
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["recipe"]["model"] = {"package": "p", "gguf_file": "m.Q4_1.gguf"}
    manifest["model_gguf_tensor_types"] = {"Q4_1": 210, "F32": 61, "Q8_0": 1}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    report = write_report(folder).read_text()
    assert "**Weights read from a GGUF file** (m.Q4_1.gguf: 210 Q4_1, 61 F32, 1 Q8_0 tensors)" in report
    assert "Weights read from a GGUF file (m.Q4_1.gguf" in (folder / "report.html").read_text()
    assert gguf_note({"recipe": {"model": {"bundled": "tiny"}}}) == []


def test_the_tensor_types_are_read_only_for_a_gguf_source() -> None:
    from quantlab.models import ModelSpec, gguf_tensor_types

    assert gguf_tensor_types(ModelSpec(bundled="tiny-stdlib-llama")) is None
