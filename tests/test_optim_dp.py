"""DP-AdamBC (optim.AdamWBiasCorrected): AdamW exactly without noise, the noise variance taken out of the second
moment with it, and the record-level DP runs that use it."""

import torch

from trustformer.config import load_config
from trustformer.engine.inprocess import run_in_process
from trustformer.tasks.optim import AdamWBiasCorrected, build_optimizer


def _pair(seed: int = 0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))
    twin = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))
    twin.load_state_dict(model.state_dict())
    return model, twin


def _steps(model, optimizer, n: int = 12) -> None:
    g = torch.Generator().manual_seed(1)
    for _ in range(n):
        x, y = torch.randn(8, 6, generator=g), torch.randn(8, 3, generator=g)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()


def test_without_noise_it_is_adamw():
    model, twin = _pair()
    _steps(model, build_optimizer(model, lr=1e-2, weight_decay=0.1, noise_corrected=True))
    _steps(twin, build_optimizer(twin, lr=1e-2, weight_decay=0.1))
    for a, b in zip(model.parameters(), twin.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6)


def test_the_noise_variance_is_taken_out_of_the_second_moment():
    """Gradients g = s + N(0, Φ): Adam's v̂ ≈ s² + Φ makes every step about s/sqrt(Φ) (a slow DP-SGD); the corrected
    denominator sqrt(max(v̂ − Φ, γΦ)) restores steps of about s/|s| on the coordinates the signal dominates."""
    p = torch.nn.Parameter(torch.zeros(2000))
    q = torch.nn.Parameter(torch.zeros(2000))
    phi = 0.01
    corrected = AdamWBiasCorrected([p], lr=1e-3, betas=(0.9, 0.999))
    corrected.param_groups[0]["noise_variance"] = phi
    corrected.param_groups[0]["floor"] = 0.1  # γ: v̂ − Φ ≈ s² = 0.25 Φ stays above the floor
    plain = torch.optim.AdamW([q], lr=1e-3, betas=(0.9, 0.999), weight_decay=0.0)
    g = torch.Generator().manual_seed(0)
    signal = torch.full((2000,), 0.05)  # noise std 0.1: the noise dominates v̂
    for _ in range(200):
        noise = torch.randn(2000, generator=g) * phi**0.5
        p.grad, q.grad = signal + noise, signal + noise
        corrected.step()
        plain.step()
    assert (-p).mean() > 1.5 * (-q).mean()  # the corrected steps go further along the signal
    assert torch.isfinite(p).all()


def test_a_record_level_run_steps_with_dp_sgds_noise_variance(tmp_path, monkeypatch):
    seen = []
    step = AdamWBiasCorrected.step

    def spy(self, closure=None):
        seen.append(self.param_groups[0]["noise_variance"])
        return step(self, closure)

    monkeypatch.setattr(AdamWBiasCorrected, "step", spy)
    values = {
        "privacy.unit": "record",
        "privacy.epsilon": 8.0,
        "privacy.delta": 1e-5,
        "privacy.adam_correction": True,
        "privacy.batch_size": 16,
        "out": str(tmp_path),
    }
    summary = run_in_process(load_config("tiny", None, values))
    assert summary["privacy"]["epsilon"] <= 8.0 + 1e-6
    row = summary["privacy"]["clients"]["0"]
    sigma, batch = row["noise_multiplier"], 16  # privacy.batch_size
    assert seen and all(v == (sigma * 0.5 / batch) ** 2 for v in seen[:1])  # (σ C / B)², C = privacy.clip_norm
