"""DP-SGD in a public subspace (Zhou, Wu & Banerjee 2021, "Bypassing the ambient dimension: private SGD with
gradient subspace identification"; the projection of GEP, Yu et al. 2021, "Do not let privacy overbill utility").

The noise of DP-SGD grows with the number of trained weights d; the signal does not. Where public data is at hand,
the gradients of public examples at the current model span a k-dimensional subspace (their top-k right singular
vectors, an orthonormal basis V, d × k) where most of the private gradients' signal lies. Each record's gradient g_i
is replaced by its projection V Vᵀ g_i before it is clipped to C; after the Gaussian noise is added to the clipped
sum, the noisy sum is projected again, V Vᵀ (Σ clip(V Vᵀ g_i) + N(0, σ²C² I_d)); and so is the optimizer's move,
which an adaptive optimizer (Adam: a per-coordinate scaling) would otherwise spread over every weight again. The
first projection changes the function each record goes through (still norm ≤ C after clipping: the sensitivity is
unchanged); the others are post-processing of the release. V depends on public data and on the model, itself a
release. So the mechanism, the σ and the ε are DP-SGD's; the noise that reaches the model lies in k dimensions
instead of d.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch


def public_basis(gradients: torch.Tensor, k: int) -> torch.Tensor:
    """The top-``k`` right singular vectors of the public per-example ``gradients`` (m × d): an orthonormal basis of
    the subspace they span most, d × k (float32). Directions with a zero singular value are left out, so the basis
    may have fewer than ``k`` columns."""
    if gradients.ndim != 2:
        raise ValueError(f"public gradients must be a matrix (examples × weights), got shape {tuple(gradients.shape)}")
    _, singular, vh = torch.linalg.svd(gradients.double(), full_matrices=False)
    kept = int((singular[:k] > singular[0] * 1e-10).sum()) if singular.numel() and singular[0] > 0 else 0
    return vh[:kept].T.contiguous().float()


class Subspace:
    """An orthonormal basis V (d × k) over named tensors (the trained parameters, in ``shapes``' order), and the two
    projections DP-SGD makes with it."""

    def __init__(self, basis: torch.Tensor, shapes: Mapping[str, torch.Size]) -> None:
        total = sum(int(torch.Size(s).numel()) for s in shapes.values())
        if basis.ndim != 2 or basis.shape[0] != total:
            raise ValueError(f"basis of shape {tuple(basis.shape)} for {total} weights")
        self.basis = basis
        self.shapes = {n: torch.Size(s) for n, s in shapes.items()}

    @property
    def dim(self) -> int:
        return int(self.basis.shape[1])

    def flatten(self, tensors: Mapping[str, torch.Tensor], batch: bool = False) -> torch.Tensor:
        """The tensors as one vector (``batch``: one row per example, their first dimension)."""
        if batch:
            return torch.cat([tensors[n].reshape(tensors[n].shape[0], -1) for n in self.shapes], dim=1)
        return torch.cat([tensors[n].reshape(-1) for n in self.shapes])

    def unflatten(self, flat: torch.Tensor, batch: bool = False) -> dict[str, torch.Tensor]:
        out, offset = {}, 0
        for name, shape in self.shapes.items():
            size = shape.numel()
            piece = flat[..., offset : offset + size]
            out[name] = piece.reshape(flat.shape[0], *shape) if batch else piece.reshape(shape)
            offset += size
        return out

    def project(self, flat: torch.Tensor) -> torch.Tensor:
        """V Vᵀ x for a vector, or for each row of a matrix."""
        basis = self.basis.to(flat.device, flat.dtype)
        return (flat @ basis) @ basis.T


def example_gradients(
    params: Mapping[str, torch.nn.Parameter], loss_of: Callable[[int], torch.Tensor], count: int
) -> torch.Tensor:
    """Row i: the gradient of ``loss_of(i)``, example i's loss, with respect to ``params`` (in their order), flattened
    (count × d). One forward and backward pass per example: the obviously correct per-example gradient."""
    rows = []
    for i in range(count):
        grads = torch.autograd.grad(loss_of(i), list(params.values()), allow_unused=True)
        flat = [
            (torch.zeros_like(p) if g is None else g).reshape(-1) for p, g in zip(params.values(), grads, strict=True)
        ]
        rows.append(torch.cat(flat).detach())
    return torch.stack(rows) if rows else torch.zeros((0, sum(p.numel() for p in params.values())))


def public_subspace(model: torch.nn.Module, loss_of: Callable[[int], torch.Tensor], count: int, k: int) -> Subspace:
    """The top ``k`` directions of the gradients of ``count`` public examples (``loss_of(i)``: example i's loss) at
    ``model`` as it is now, over its trained tensors; computed in eval mode (no dropout). Public data and the model (a
    release) only: it spends no ε."""
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    was_training = model.training
    model.eval()
    try:
        gradients = example_gradients(params, loss_of, count)
    finally:
        model.train(was_training)
    return Subspace(public_basis(gradients, k), {n: p.shape for n, p in params.items()})


__all__ = ["Subspace", "example_gradients", "public_basis", "public_subspace"]
