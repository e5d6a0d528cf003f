from pathlib import Path

import pytest
import yaml

from quantlab import RecipeError, load_recipe

GOOD = {
    "name": "t",
    "model": {"bundled": "tiny-stdlib-llama"},
    "weights": ["fp32", {"format": "int4", "group_size": 128}],
}


def _write(tmp_path: Path, data: object) -> Path:
    p = tmp_path / "r.yaml"
    p.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return p


def _error(tmp_path: Path, data: object) -> RecipeError:
    with pytest.raises(RecipeError) as e:
        load_recipe(_write(tmp_path, data))
    assert "\n" not in str(e.value)
    return e.value


def test_valid_recipe_expands_variants_with_derived_labels(tmp_path: Path) -> None:
    r = load_recipe(_write(tmp_path, GOOD))
    assert [v.label for v in r.variants()] == ["fp32", "int4-g128-asym"]
    assert r.baseline_label == "fp32"
    assert r.variants()[1].weight.bits == 4


def test_variant_keys_change_with_any_setting(tmp_path: Path) -> None:
    a = load_recipe(_write(tmp_path, GOOD)).variants()
    b = load_recipe(_write(tmp_path, {**GOOD, "workload": {"new_tokens": 5}})).variants()
    assert a[0].key != b[0].key and a[0].key != a[1].key


def test_unknown_top_level_key_suggests_the_close_one(tmp_path: Path) -> None:
    e = _error(tmp_path, {**GOOD, "wieghts": []})
    assert e.field == "wieghts" and "did you mean 'weights'" in e.message and str(tmp_path / "r.yaml") in str(e)


def test_unknown_format_name_suggests_and_lists(tmp_path: Path) -> None:
    e = _error(tmp_path, {**GOOD, "weights": ["fp32", {"format": "int44"}]})
    assert e.field == "weights[1].format"
    assert "did you mean 'int4'" in e.message and "fp16" in e.message


def test_misspelt_format_field(tmp_path: Path) -> None:
    e = _error(tmp_path, {**GOOD, "weights": [{"format": "int4", "grup_size": 128}]})
    assert e.field == "weights[0].grup_size" and "did you mean 'group_size'" in e.message


def test_bad_field_value_names_the_path_and_value(tmp_path: Path) -> None:
    e = _error(tmp_path, {**GOOD, "weights": [{"format": "int4", "group_size": 100}]})
    assert e.field == "weights[0]" and "power of two" in e.message
    e = _error(tmp_path, {**GOOD, "workload": {"batch_size": 0}})
    assert e.field == "workload.batch_size" and "0 is below 1" in e.message and "(got 0)" in e.message
    e = _error(tmp_path, {**GOOD, "workload": {"batch_size": [1, 0]}})
    assert e.field == "workload.batch_size" and e.message.startswith("element 1 (0) is below 1")
    e = _error(tmp_path, {**GOOD, "workload": {"prompt_tokens": [64, "x"]}})
    assert e.field == "workload.prompt_tokens" and e.message.startswith("element 1 ('x') is not a whole number")


def test_fixed_field_of_a_preset(tmp_path: Path) -> None:
    e = _error(tmp_path, {**GOOD, "weights": [{"format": "int4", "bits": 3}]})
    assert e.field == "weights[0].bits" and "fixed by format 'int4'" in e.message


def test_nested_unknown_key(tmp_path: Path) -> None:
    e = _error(tmp_path, {**GOOD, "workload": {"prompt_token": 3}})
    assert e.field == "workload.prompt_token" and "did you mean 'prompt_tokens'" in e.message


def test_missing_model_path(tmp_path: Path) -> None:
    e = _error(tmp_path, {**GOOD, "model": {"path": "nowhere"}})
    assert e.field == "model.path" and "no such folder" in e.message


def test_unknown_bundled_model_and_literal_choices(tmp_path: Path) -> None:
    assert "did you mean 'tiny-stdlib-llama'" in _error(tmp_path, {**GOOD, "model": {"bundled": "tiny-stdlib"}}).message
    e = _error(tmp_path, {**GOOD, "device": "tpu"})
    assert e.field == "device" and "'auto', 'cpu' or 'cuda'" in e.message


def test_duplicate_labels_and_unknown_baseline(tmp_path: Path) -> None:
    assert "share the label" in _error(tmp_path, {**GOOD, "weights": ["fp32", "fp32"]}).message
    assert "no variant or weight-format label" in _error(tmp_path, {**GOOD, "baseline": "bf16"}).message


def test_baseline_given_by_its_weight_label_is_its_variant_with_the_first_kv_format(tmp_path: Path) -> None:
    kv = {**GOOD, "kv_cache": ["native", {"format": "int8"}], "baseline": "int4-g128-asym"}
    r = load_recipe(_write(tmp_path, kv))
    assert r.baseline == r.baseline_label == "int4-g128-asym/kv-native"
    assert r.baseline_variant.kv.label == "native"
    flipped = load_recipe(_write(tmp_path, {**kv, "kv_cache": [{"format": "int8"}, "native"]}))
    assert flipped.baseline_variant.kv.label != "native" and flipped.baseline_label.startswith("int4-g128-asym/")


def test_variant_timeout_is_positive_and_needs_process_isolation(tmp_path: Path) -> None:
    assert load_recipe(_write(tmp_path, {**GOOD, "variant_timeout_s": 600})).variant_timeout_s == 600
    e = _error(tmp_path, {**GOOD, "variant_timeout_s": 0})
    assert e.field == "variant_timeout_s" and "greater than 0" in e.message
    assert "needs isolation: process" in _error(tmp_path, {**GOOD, "variant_timeout_s": 60, "isolation": "none"}).message


def test_yaml_syntax_error_and_non_mapping(tmp_path: Path) -> None:
    assert "not valid YAML" in _error(tmp_path, "name: [unclosed\n").message
    assert "must be a YAML mapping" in _error(tmp_path, "- a\n- b\n").message


def test_recipe_spec_round_trips(tmp_path: Path) -> None:
    from quantlab import validate_recipe

    r = load_recipe(_write(tmp_path, GOOD))
    again = validate_recipe(r.to_spec())
    assert [v.key for v in again.variants()] == [v.key for v in r.variants()]


def test_shipped_recipes_validate() -> None:
    from quantlab.models import package_folder

    paths = sorted((Path(__file__).resolve().parents[2] / "recipes").glob("*.yaml"))
    assert len(paths) >= 3
    for path in paths:
        package = (yaml.safe_load(path.read_text())["model"]).get("package")
        if package and package_folder(package) is None:  # an optional model package that is not installed here
            with pytest.raises(RecipeError, match=f"no installed package '{package}'"):
                load_recipe(path)
            continue
        recipe = load_recipe(path)
        assert recipe.variants()
        if recipe.model.bundled:  # and pass the checks a run makes against the model before any work
            from quantlab.run.runner import check_against_model

            check_against_model(recipe)


MIXED = {"format": "int4", "group_size": 128, "exclude": ["*.o_proj"],
         "overrides": [{"modules": "*.down_proj", "format": "int8"},
                       {"modules": ["*.q_proj"], "format": "gptq", "bits": 4}]}


def test_per_module_formats_parse_label_and_round_trip(tmp_path: Path) -> None:
    from quantlab import validate_recipe

    r = load_recipe(_write(tmp_path, {**GOOD, "weights": ["fp32", MIXED]}))
    mixed = r.variants()[1]
    assert mixed.label == "int4-g128-asym-no:o_proj+int8-pc-asym@down_proj+int4-pc-asym-gptq@q_proj"
    assert mixed.weight.needs_calibration
    again = validate_recipe(r.to_spec())
    assert [v.key for v in again.variants()] == [v.key for v in r.variants()]
    plain = load_recipe(_write(tmp_path, GOOD)).variants()[1]
    assert plain.key != mixed.key


def test_override_errors_name_the_entry(tmp_path: Path) -> None:
    e = _error(tmp_path, {**GOOD, "weights": [{**MIXED, "overrides": [{"format": "int8"}]}]})
    assert "weights[0].overrides[0].modules" in str(e) and "glob" in str(e)
    e = _error(tmp_path, {**GOOD, "weights": [{**MIXED, "overrides": [{"modules": "*.x", "format": "int9"}]}]})
    assert "weights[0].overrides[0].format" in str(e) and "int8" in str(e)
    e = _error(tmp_path, {**GOOD, "weights": [{**MIXED, "overrides": [{"modules": "*.x", "format": "int8", "bitz": 3}]}]})
    assert "weights[0].overrides[0].bitz" in str(e)
    e = _error(tmp_path, {**GOOD, "weights": [{**MIXED, "overrides": "int8"}]})
    assert "weights[0].overrides" in str(e)
    e = _error(tmp_path, {**GOOD, "weights": [{**MIXED, "overrides": [{"modules": "*.x", "format": "bf16"}]}]})
    assert "weights[0]" in str(e) and "compute_dtype" in str(e)


def test_perplexity_reads_the_kv_cache_by_default_when_a_recipe_compares_kv_formats() -> None:
    from quantlab import validate_recipe

    spec = {"name": "kv", "model": {"bundled": "tiny-stdlib-llama"}, "weights": ["fp32"],
            "evaluations": {"perplexity": {"window_tokens": 256}}}
    for kv, expected in ((None, "windows"), (["native"], "windows"), (["native", "fp8"], "kv-chunked"),
                         ([{"format": "int4", "group_size": 32}], "kv-chunked")):
        recipe = validate_recipe({**spec, **({"kv_cache": kv} if kv else {})})
        assert recipe.evaluations.perplexity.name == expected
        assert validate_recipe(recipe.to_spec()).evaluations.perplexity.name == expected  # what workers read
    explicit = validate_recipe({**spec, "kv_cache": ["native", "fp8"],
                                "evaluations": {"perplexity": {"protocol": "windows", "window_tokens": 256}}})
    assert explicit.evaluations.perplexity.name == "windows"  # the opt-out
    assert validate_recipe(explicit.to_spec()).evaluations.perplexity.name == "windows"


def test_files_named_by_formats_inside_a_mix_resolve_beside_the_recipe(tmp_path: Path) -> None:
    """A mix's candidates read and write their importance matrix where the recipe says, not in the directory the
    run was started from (before: a candidate's relative imatrix_path resolved against the working directory)."""
    candidate = {"format": "gguf", "type": "Q4_K", "imatrix": True, "imatrix_path": "../shared/imatrix.gguf"}
    spec = {"name": "m", "model": {"bundled": "tiny-stdlib-llama"},
            "weights": ["fp32", {"format": "mixed", "candidates": [candidate, {**candidate, "type": "Q6_K"}],
                                 "budget_format": {"format": "gguf", "recipe": "Q4_K_M"}, "head": True,
                                 "sensitivity_path": "scan.csv"}]}
    (tmp_path / "recipes").mkdir()
    recipe = load_recipe(_write(tmp_path / "recipes", spec))
    mix = recipe.weights[1]
    expected = str((tmp_path / "shared" / "imatrix.gguf").resolve())
    assert [c.imatrix_path for c in mix.candidates] == [expected, expected]
    assert mix.sensitivity_path == str((tmp_path / "recipes" / "scan.csv").resolve())
