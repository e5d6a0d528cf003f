import json
from pathlib import Path

import pytest

from quantlab import QuantlabError
from quantlab.cli import main
from quantlab.estimate.fit import parse_bytes

CONFIGS = Path(__file__).parents[2] / "evals" / "configs"
GIB = 2**30
KV_PER_TOKEN_BF16 = 2 * 80 * 8 * 128 * 2  # Llama-3-70B: K and V, 80 layers, 8 KV heads of 128, bf16


def _fit(capsys: pytest.CaptureFixture[str], *extra: str) -> dict:
    argv = ["estimate", str(CONFIGS / "llama-3-70b.json"), "--seq-len", "8192", "--batch", "8", "--json",
            "--weight-format", "bf16", "int4:group_size=128", "--kv-format", "native", "fp8", *extra]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    return {(f["weight_format"], f["kv_format"]): f for f in out["fit"]} | {"_est": out}


def test_llama_3_70b_on_80_gib_devices(capsys: pytest.CaptureFixture[str]) -> None:
    fits = _fit(capsys, "--gpu-memory", "80GiB", "--gpus", "2")
    est = fits.pop("_est")
    bf16 = fits[("bf16", "native")]
    usable = int(80 * GIB * 0.9)
    assert bf16["weight_bytes"] == est["weight_bytes"]["bf16"] > 140 * 10**9  # 141 GB of weights
    assert bf16["kv_cache_bytes"] == 8 * 8192 * KV_PER_TOKEN_BF16 == est["kv_cache_bytes_retained"]["native"]
    assert bf16["devices_needed"] == -(-bf16["total_bytes"] // usable) == 3 and not bf16["fits_on_devices"]
    capacity = 2 * usable - bf16["weight_bytes"]
    assert bf16["max_batch_size"] == capacity // (8192 * KV_PER_TOKEN_BF16) == 5
    assert bf16["max_seq_len_tokens"] == capacity // (8 * KV_PER_TOKEN_BF16)  # the longest context for batch 8
    fp8 = fits[("bf16", "fp8")]
    assert fp8["fits_on_devices"] and fp8["max_batch_size"] > bf16["max_batch_size"]
    int4 = fits[("int4-g128-asym", "native")]
    assert int4["devices_needed"] == 1 and int4["max_seq_len_tokens"] == 8192  # capped at the position limit


def test_one_device_and_the_markdown_table(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["estimate", str(CONFIGS / "llama-3.1-8b.json"), "--seq-len", "4096", "--gpu-memory", "24GB",
            "--weight-format", "bf16", "--kv-format", "native"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "## Fit on 1 × 22 GiB" in out and "| bf16 | native |" in out


@pytest.mark.parametrize("text,value", [("80GiB", 80 * GIB), ("80GB", 80 * 10**9), ("81920 MiB", 80 * GIB),
                                        ("1024", 1024)])
def test_sizes_parse(text: str, value: int) -> None:
    assert parse_bytes(text) == value


def test_a_bad_size_is_a_one_line_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(QuantlabError, match="--gpu-memory: expected a size"):
        parse_bytes("eighty")
    assert main(["estimate", str(CONFIGS / "gpt2.json"), "--gpu-memory", "80 parsecs"]) == 2
