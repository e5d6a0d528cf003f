"""quantlab's grouped attention gives transformers' eager attention's output: decode rows and prompts, grouped
query heads, boolean, additive and skipped masks, softcapping."""
import pytest
import torch

from quantlab.engine.torch.attention import grouped_attention


class Module(torch.nn.Module):
    def __init__(self, groups: int) -> None:
        super().__init__()
        self.num_key_value_groups, self.is_causal, self.training = groups, True, False


def reference(query, key, value, mask_add, scaling, softcap=None):
    from transformers.models.llama.modeling_llama import repeat_kv

    groups = query.shape[1] // key.shape[1]
    k, v = repeat_kv(key, groups), repeat_kv(value, groups)
    scores = query @ k.transpose(2, 3) * scaling
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    probs = torch.softmax(scores + mask_add, -1)
    return (probs @ v).transpose(1, 2)


@pytest.mark.parametrize("rows", [1, 3, 12, 40])
@pytest.mark.parametrize("mask_kind", ["bool", "additive", "none"])
def test_grouped_attention_matches_eager_attention(rows: int, mask_kind: str) -> None:
    torch.manual_seed(0)
    b, hq, hkv, t, d = 2, 6, 2, 40, 16
    query, key, value = torch.randn(b, hq, rows, d), torch.randn(b, hkv, t, d), torch.randn(b, hkv, t, d)
    causal = torch.arange(t) <= torch.arange(rows).unsqueeze(-1) + (t - rows)  # the last row sees every key
    if mask_kind == "none":  # transformers skips the mask where SDPA's is_causal is exact: rows == keys, or one row
        t_eff = rows if rows > 1 else t
        key, value, causal = key[:, :, :t_eff], value[:, :, :t_eff], causal[:, -t_eff:] if rows > 1 else causal
        mask = None
    else:
        mask = causal.expand(b, 1, rows, t) if mask_kind == "bool" else \
            torch.where(causal, 0.0, torch.finfo(torch.float32).min).expand(b, 1, rows, t)
    add = torch.where(causal, 0.0, float("-inf"))
    got, _ = grouped_attention(Module(hq // hkv), query, key, value, mask, scaling=0.25)
    assert torch.allclose(got, reference(query, key, value, add, 0.25), atol=1e-5)


def test_softcapped_scores_match() -> None:
    torch.manual_seed(1)
    query, key, value = torch.randn(1, 4, 2, 8), torch.randn(1, 2, 10, 8) * 4, torch.randn(1, 2, 10, 8)
    mask = torch.ones(1, 1, 2, 10, dtype=torch.bool)
    got, _ = grouped_attention(Module(2), query, key, value, mask, scaling=0.5, softcap=5.0)
    assert torch.allclose(got, reference(query, key, value, torch.zeros(2, 10), 0.5, softcap=5.0), atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("mask_kind", ["bool", "additive", "none"])
def test_a_decode_row_over_a_float_cache_is_read_by_the_c_kernel(dtype: torch.dtype, mask_kind: str,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """One query row over keys and values held as floats (a native cache) goes through the C kernel's casts, with
    float32 products: it equals the float32 reference on the same stored values, softcapped too."""
    from quantlab.kv import code_attention

    torch.manual_seed(2)
    b, hq, hkv, t, d = 2, 9, 3, 37, 64  # 37 slots: off the kernel's chunks
    query, key, value = (torch.randn(b, hq, 1, d).to(dtype), torch.randn(b, hkv, t, d).to(dtype),
                         torch.randn(b, hkv, t, d).to(dtype))
    visible = torch.arange(t) < 30  # the static cache's slots past the length are masked
    mask = {"bool": visible.expand(b, 1, 1, t), "none": None,
            "additive": torch.where(visible, 0.0, torch.finfo(torch.float32).min).expand(b, 1, 1, t)}[mask_kind]
    add = torch.where(visible, 0.0, float("-inf")) if mask is not None else torch.zeros(t)
    calls = []
    scores_op = code_attention.scores_op
    monkeypatch.setattr(code_attention, "scores_op", lambda *a: calls.append(a[0]) or scores_op(*a))
    for softcap in (None, 5.0):
        got, _ = grouped_attention(Module(hq // hkv), query, key, value, mask, scaling=0.125, softcap=softcap)
        want = reference(query.float(), key.float(), value.float(), add, 0.125, softcap).to(dtype)
        assert got.dtype == dtype
        tol = 1e-5 if dtype == torch.float32 else 1e-2
        assert torch.allclose(got.float(), want.float(), atol=tol, rtol=tol), softcap
    assert calls == [code_attention.CASTS[dtype]] * 2


def _prompt_case(b: int, hq: int, hkv: int, q: int, t: int, d: int, window: int | None, dtype: torch.dtype, seed: int):
    """A prompt's query rows at positions t - q .. t - 1 of a static cache with ``t + 5`` slots (the last 5 empty)."""
    torch.manual_seed(seed)
    slots = t + 5
    query = torch.randn(b, hq, q, d).to(dtype)
    key, value = torch.randn(b, hkv, slots, d).to(dtype), torch.randn(b, hkv, slots, d).to(dtype)
    position = torch.arange(t - q, t).unsqueeze(-1)
    seen = torch.arange(slots) <= position
    if window is not None:
        seen &= torch.arange(slots) > position - window
    return query, key, value, seen


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mask_kind", ["bool", "additive", "none"])
@pytest.mark.parametrize("window", [None, 9])
def test_a_prompt_in_chunks_matches_eager_attention(dtype: torch.dtype, mask_kind: str, window: int | None,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Query rows 16 at a time (47 rows: the last chunk short), each over the keys its rows see, give eager
    attention's output: causal, a sliding window and a static cache's empty slots masked; bf16 within bf16's
    rounding of the float32 result on the same values."""
    from quantlab.engine.torch import attention

    monkeypatch.setattr(attention, "PREFILL_CHUNK_ROWS", 16)
    b, hq, hkv, q, d = 2, 6, 2, 47, 16
    t = q if mask_kind == "none" else 60  # transformers skips the mask only where rows == keys, causal
    query, key, value, seen = _prompt_case(b, hq, hkv, q, t, d, window if mask_kind != "none" else None, dtype, 3)
    if mask_kind == "none":
        key, value, seen = key[:, :, :t], value[:, :, :t], seen[:, :t]
    mask = {"bool": seen.expand(b, 1, q, -1), "none": None,
            "additive": torch.where(seen, 0.0, torch.finfo(torch.float32).min).expand(b, 1, q, -1)}[mask_kind]
    got, _ = grouped_attention(Module(hq // hkv), query, key, value, mask, scaling=0.25)
    want = reference(query.float(), key.float(), value.float(), torch.where(seen, 0.0, float("-inf")), 0.25)
    assert got.dtype == dtype and got.shape == (b, q, hq, d)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert torch.allclose(got.float(), want, atol=tol, rtol=tol)


def test_each_chunk_scores_only_the_keys_its_rows_see(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a sliding window of 8 and 64 rows in chunks of 16, no chunk's scores span more than 16 + 7 keys; the
    causal (mask-free) chunk r spans keys 0 .. 16(r + 1)."""
    from quantlab.engine.torch import attention

    monkeypatch.setattr(attention, "PREFILL_CHUNK_ROWS", 16)
    widths = []
    matmul = torch.matmul
    monkeypatch.setattr(torch, "matmul", lambda a, b_: widths.append(b_.shape[-1]) or matmul(a, b_))
    query, key, value, seen = _prompt_case(1, 4, 2, 64, 64, 8, 8, torch.float32, 4)
    attention.chunked_attention(query, key, value, seen.expand(1, 1, 64, -1), 0.5)
    assert widths[0::2] == [16, 23, 23, 23]  # the first chunk's window starts at key 0
    widths.clear()
    attention.chunked_attention(query, key[:, :, :64], value[:, :, :64], None, 0.5)
    assert widths[0::2] == [16, 32, 48, 64]


def test_a_prompt_in_chunks_is_as_close_to_float32_as_sdpa_is_in_bf16() -> None:
    """bf16 with 128-row chunks (two and a bit): the error against the float32 result stays within 3x the error of
    PyTorch's fused SDPA kernel on the same bf16 values (its probabilities are float32, the chunks' bf16)."""
    query, key, value, _ = _prompt_case(1, 9, 3, 300, 300, 64, None, torch.bfloat16, 5)
    key, value = key[:, :, :300], value[:, :, :300]
    want = torch.nn.functional.scaled_dot_product_attention(query.float(), key.float(), value.float(), is_causal=True,
                                                            enable_gqa=True).transpose(1, 2)
    sdpa = torch.nn.functional.scaled_dot_product_attention(query, key, value, is_causal=True, enable_gqa=True)
    got, _ = grouped_attention(Module(3), query, key, value, None, scaling=64 ** -0.5)
    assert (got.float() - want).abs().max() <= 3 * (sdpa.transpose(1, 2).float() - want).abs().max()
