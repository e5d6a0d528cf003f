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
