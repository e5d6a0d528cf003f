"""quantlab's own C apart from vendored code: each third-party folder names its licence and the upstream version
it was taken at, and every kernel builds from what the package holds."""
from __future__ import annotations

import re

from quantlab import native


def test_every_vendored_folder_carries_its_licence_and_upstream_version() -> None:
    folders = [p for p in native.THIRD_PARTY.iterdir() if p.is_dir()]
    assert sorted(p.name for p in folders) == ["ggml", "ggml_repack"]
    for folder in folders:
        assert "Permission is hereby granted" in (folder / "LICENSE").read_text()
        assert re.search(r"commit [0-9a-f]{40}", (folder / "VERSION").read_text())


def test_quantlabs_own_sources_hold_no_vendored_code_and_include_it_by_name() -> None:
    own = {p.name: p.read_text() for p in native.SOURCES.iterdir() if p.suffix in (".c", ".h", ".cpp")}
    assert set(own) == {"bitplane.c", "common.h", "fp8.c", "ggml.c", "half_rows.c", "int4pack.c", "int8_act.c", "kv_attention.c",
                        "lut4.c", "torch_ops.h", *(f"{name}_ops.cpp" for name in NATIVE_OPS)}
    assert not any("The ggml authors" in text for text in own.values())
    assert '#include "ggml_quants.c"' in own["ggml.c"]  # one translation unit: ggml's static functions in reach
    assert '#include "ggml_repack.c"' in own["ggml.c"]


NATIVE_OPS = ("bitplane", "fp8", "ggml", "half_rows", "int8_act", "kv_attention", "lut4")  # libraries whose ops have C++ kernels


def test_each_kernel_builds_and_loads_from_the_package_sources() -> None:
    for name in (*NATIVE_OPS, "int4pack"):
        assert native.load(name) is not None
