"""FedPC's ternary vectors on the wire: four values per byte, decoded strictly (core/ternary.py)."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trustformer.core import ternary
from trustformer.wire import PayloadError


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from([-1, 0, 1]), min_size=0, max_size=41))
def test_packing_round_trips_every_length(values):
    vector = torch.tensor(values, dtype=torch.int8)
    packed = ternary.pack(vector)
    assert packed.dtype == torch.uint8 and packed.shape == ((len(values) + 3) // 4,)
    assert ternary.unpack(packed, len(values)).tolist() == values


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6, 7, 8])  # every length mod 4, with and without a full last byte
def test_packing_is_four_values_per_byte_with_the_papers_codes(n):
    values = torch.tensor([1, -1, 0, 1, -1, -1, 0, 1][:n], dtype=torch.int8)
    packed = ternary.pack(values)
    assert packed.numel() == (n + 3) // 4
    codes = [(int(packed[i // 4]) >> (2 * (i % 4))) & 0b11 for i in range(n)]
    assert codes == [{1: 0b01, -1: 0b11, 0: 0b00}[int(v)] for v in values]
    assert ternary.unpack(packed, n).tolist() == values.tolist()


@settings(max_examples=40, deadline=None)
@given(st.integers(min_value=1, max_value=40), st.data())
def test_malformed_vectors_are_rejected(n, data):
    values = torch.tensor(data.draw(st.lists(st.sampled_from([-1, 0, 1]), min_size=n, max_size=n)), dtype=torch.int8)
    packed = ternary.pack(values)
    with pytest.raises(PayloadError, match="cannot hold"):
        ternary.unpack(torch.cat([packed, torch.zeros(1, dtype=torch.uint8)]), n)  # one byte too many
    with pytest.raises(PayloadError, match="cannot hold"):
        ternary.unpack(packed[:-1], n)  # one byte short
    slot = data.draw(st.integers(min_value=0, max_value=n - 1))
    bad = packed.clone()
    bad[slot // 4] = (int(bad[slot // 4]) & ~(0b11 << (2 * (slot % 4)))) | (0b10 << (2 * (slot % 4)))
    with pytest.raises(PayloadError, match="unused code"):
        ternary.unpack(bad, n)
    if n % 4:
        padded = packed.clone()
        padded[-1] = int(padded[-1]) | (0b01 << (2 * (n % 4)))  # a value in the padding
        with pytest.raises(PayloadError, match="padding"):
            ternary.unpack(padded, n)


def test_wrong_dtype_or_shape_is_rejected():
    with pytest.raises(PayloadError, match="1-D uint8"):
        ternary.unpack(torch.zeros(2, dtype=torch.int8), 8)
    with pytest.raises(PayloadError, match="1-D uint8"):
        ternary.unpack(torch.zeros((1, 2), dtype=torch.uint8), 8)
    with pytest.raises(ValueError):
        ternary.pack(torch.tensor([2]))


def test_eq4_and_eq5():
    p0 = torch.tensor([0.0, 0.0, 0.0, 1.0])
    q = torch.tensor([0.5, -0.5, 0.05, 1.0])
    assert ternary.ternary_initial(q, p0, 0.1).tolist() == [1, -1, 0, 0]  # Eq. 4, α = 0.1
    before, last = torch.tensor([0.0, 0.0, 0.0, 0.0]), torch.tensor([1.0, 1.0, -1.0, 1.0])
    q = torch.tensor([2.0, 0.0, -1.1, 1.1])
    # changes now: +1, -1, -0.1, +0.1; before: +1, +1, -1, +1; β = 0.2 -> threshold 0.2
    assert ternary.ternary_evolution(q, last, before, 0.2).tolist() == [1, -1, 0, 0]
    assert ternary.shares(torch.tensor([1, -1, 0, 0])) == {
        "ternary_neg": 0.25,
        "ternary_zero": 0.5,
        "ternary_pos": 0.25,
    }
