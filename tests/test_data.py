import json
from pathlib import Path

import pytest

from quantlab import QuantlabError, load_recipe
from quantlab.data import DatasetText, load_text


def test_builtin_and_file_texts_carry_a_content_hash(tmp_path: Path) -> None:
    held = load_text("bundled-heldout")
    assert len(held.text) > 100_000 and len(held.sha256) == 64
    docs = tmp_path / "docs.jsonl"
    docs.write_text("\n".join(json.dumps({"text": t}) for t in ("first doc", "second doc")) + "\n")
    assert load_text(str(docs)).text == "first doc\n\nsecond doc"
    docs.write_text('{"body": 1}\n')
    with pytest.raises(QuantlabError, match="line 1: expected a JSON object with a 'text' field"):
        load_text(str(docs))


def test_a_local_dataset_folder_loads_through_the_hub_code_path(tmp_path: Path) -> None:
    pytest.importorskip("datasets")
    folder = tmp_path / "wikitext-copy"
    folder.mkdir()
    (folder / "test.jsonl").write_text("\n".join(json.dumps({"text": t}) for t in (" = Title = ", "A line .", "")))
    text = load_text(DatasetText(dataset=str(folder), split="test"))
    assert text.text == " = Title = \n\nA line .\n\n" and text.source.endswith(":test")
    with pytest.raises(QuantlabError, match="no field 'body'"):
        load_text(DatasetText(dataset=str(folder), field="body"))


def test_recipe_dataset_paths_resolve_against_the_recipe(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    recipe = tmp_path / "r.yaml"
    recipe.write_text("name: t\nmodel: {bundled: tiny-stdlib-llama}\nweights: [fp32]\n"
                      "evaluations: {perplexity: {text: {dataset: ./data, split: test}}}\n")
    assert load_recipe(recipe).evaluations.perplexity.text.dataset == str(tmp_path / "data")
    recipe.write_text(recipe.read_text().replace("./data", "./nowhere"))
    with pytest.raises(QuantlabError, match="no such dataset folder"):
        load_recipe(recipe)
