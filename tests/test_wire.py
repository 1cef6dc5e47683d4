import numpy as np
import pytest
import torch
from flwr.app import RecordDict
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import array_shapes, arrays

from trustformer.wire import PayloadError, from_array_record, payload_bytes, spec_of, to_array_record

finite = st.floats(allow_nan=False, allow_infinity=False, width=32)


@settings(max_examples=40, deadline=None)
@given(
    st.dictionaries(
        st.text(min_size=1, max_size=8),
        arrays(np.float32, array_shapes(max_dims=3, max_side=5), elements=finite),
        min_size=1,
        max_size=4,
    )
)
def test_round_trip_preserves_names_shapes_values(named):
    tensors = {k: torch.from_numpy(v) for k, v in named.items()}
    back = from_array_record(to_array_record(tensors), spec_of(tensors))
    assert list(back) == list(tensors)
    for k in tensors:
        assert torch.equal(back[k], tensors[k])


def test_rejects_wrong_shape_dtype_names_and_nan():
    good = {"a": torch.zeros(2, 3)}
    spec = spec_of(good)
    with pytest.raises(PayloadError, match="shape"):
        from_array_record(to_array_record({"a": torch.zeros(3, 2)}), spec)
    with pytest.raises(PayloadError, match="dtype"):
        from_array_record(to_array_record({"a": torch.zeros(2, 3, dtype=torch.float64)}), spec)
    with pytest.raises(PayloadError, match="missing"):
        from_array_record(to_array_record({"b": torch.zeros(2, 3)}), spec)
    bad = torch.zeros(2, 3)
    bad[1, 2] = float("nan")
    with pytest.raises(PayloadError, match="NaN"):
        from_array_record(to_array_record({"a": bad}), spec)
    bad[1, 2] = float("inf")
    with pytest.raises(PayloadError, match="Inf"):
        from_array_record(to_array_record({"a": bad}), None)


def test_payload_bytes_grow_with_the_data():
    small = payload_bytes(RecordDict({"p": to_array_record({"a": torch.zeros(10)})}))
    big = payload_bytes(RecordDict({"p": to_array_record({"a": torch.zeros(1010)})}))
    assert 4000 <= big - small <= 4010  # 1000 more float32 values, plus a few length bytes
