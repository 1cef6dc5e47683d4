import pytest
import torch

from trustformer.core.aggregation import weighted_mean


def test_weighted_mean_equals_hand_computed():
    a = {"w": torch.tensor([[1.0, 2.0], [3.0, 4.0]]), "b": torch.tensor([1.0])}
    b = {"w": torch.tensor([[5.0, 6.0], [7.0, 8.0]]), "b": torch.tensor([4.0])}
    c = {"w": torch.tensor([[0.0, 0.0], [0.0, 1.0]]), "b": torch.tensor([-2.0])}
    out = weighted_mean([a, b, c], [100, 300, 600])
    # by hand: 0.1 a + 0.3 b + 0.6 c
    assert torch.allclose(out["w"], torch.tensor([[1.6, 2.0], [2.4, 3.4]]))
    assert torch.allclose(out["b"], torch.tensor([0.1 + 1.2 - 1.2]))
    assert out["w"].dtype == torch.float32


def test_weighted_mean_rejects_mismatches():
    a = {"w": torch.zeros(2, 2)}
    with pytest.raises(ValueError, match="shape"):
        weighted_mean([a, {"w": torch.zeros(3, 2)}], [1, 1])
    with pytest.raises(ValueError, match="names"):
        weighted_mean([a, {"v": torch.zeros(2, 2)}], [1, 1])
    with pytest.raises(ValueError, match="weights"):
        weighted_mean([a, a], [0, 0])
