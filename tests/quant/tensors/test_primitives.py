import pytest
import torch

from quantlab.quant.tensors.primitives import pack, pack_multiple, packed_row_bytes, unpack


@pytest.mark.parametrize("bits", range(1, 9))
@pytest.mark.parametrize("n", [1, 7, 8, 128, 130])
def test_pack_round_trip_is_exact(bits: int, n: int) -> None:
    g = torch.Generator().manual_seed(bits * 1000 + n)
    codes = torch.randint(0, 1 << bits, (3, n), generator=g, dtype=torch.int64).to(torch.uint8)
    packed = pack(codes, bits)
    assert packed.dtype == torch.uint8
    assert packed.shape == (3, packed_row_bytes(n, bits))
    assert torch.equal(unpack(packed, bits, n), codes)


@pytest.mark.parametrize("bits,expected", [(2, 64), (3, 96), (4, 128), (8, 256), (6, 192)])
def test_packed_bytes_are_bits_over_eight(bits: int, expected: int) -> None:
    assert packed_row_bytes(256, bits) == expected
    assert pack(torch.zeros(1, 256, dtype=torch.uint8), bits).numel() == expected


def test_pack_multiple() -> None:
    assert [pack_multiple(b) for b in range(1, 9)] == [8, 4, 8, 2, 8, 4, 8, 1]


def test_int4_packs_two_values_per_byte_low_nibble_first() -> None:
    packed = pack(torch.tensor([[0x3, 0xA]], dtype=torch.uint8), 4)
    assert packed.tolist() == [[0xA3]]
