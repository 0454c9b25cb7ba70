"""Min-Trust LAMB, the optimizer of the SHA-RNN paper (its "Minimum Trust LAMB" section;
docs/optimizer.md).

LAMB (You et al. 2019, "v3" form, without bias correction) with a floor on the
trust ratio. Per parameter tensor ``theta`` with gradient ``g``::

    m = b1 m + (1 - b1) g
    v = b2 v + (1 - b2) g^2
    u = m / (sqrt(v) + eps) + weight_decay * theta
    phi = min(||theta||, 10)
    r = phi / ||u||            (r = 1 when phi = 0 or ||u|| = 0)
    r = max(r, min_trust)
    theta -= lr * r * u
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor


class MinTrustLAMB(torch.optim.Optimizer):
    """Min-Trust LAMB (docs/optimizer.md).

    Args:
        params: parameters or parameter groups.
        lr: learning rate (paper: 2e-3).
        betas: ``(b1, b2)`` moment decay rates (0.9, 0.999).
        eps: added to ``sqrt(v)``, outside the square root (1e-6).
        weight_decay: decay added to the update direction before the trust ratio (paper: 0).
        min_trust: floor on the trust ratio (paper: 0.25); 0 gives plain LAMB.
        max_weight_norm: clamp on ``||theta||`` in the trust ratio (10).

    After each :meth:`step`, :attr:`trust_ratios` maps each updated parameter to its trust
    ratio ``r`` (a 0-dim tensor on the parameter's device), for logging.

    Raises:
        ValueError: on a negative lr, eps, weight decay or min_trust, or betas outside [0, 1).
    """

    def __init__(
        self,
        params: Iterable[Tensor] | Iterable[dict],
        lr: float = 2e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.0,
        min_trust: float = 0.25,
        max_weight_norm: float = 10.0,
    ):
        if lr < 0 or eps < 0 or weight_decay < 0 or min_trust < 0 or max_weight_norm <= 0:
            raise ValueError("lr, eps, weight_decay and min_trust must be >= 0, max_weight_norm > 0")
        if not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"betas must be in [0, 1), got {betas}")
        defaults = dict(
            lr=lr,
            betas=tuple(betas),
            eps=eps,
            weight_decay=weight_decay,
            min_trust=min_trust,
            max_weight_norm=max_weight_norm,
        )
        super().__init__(params, defaults)
        self.trust_ratios: dict[Tensor, Tensor] = {}

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.trust_ratios = {}
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                state = self.state[p]
                if not state:
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                m, v = state["exp_avg"], state["exp_avg_sq"]
                m.mul_(b1).add_(g, alpha=1 - b1)
                v.mul_(b2).addcmul_(g, g, value=1 - b2)

                update = m / (v.sqrt() + group["eps"])
                if group["weight_decay"]:
                    update.add_(p, alpha=group["weight_decay"])

                weight_norm = p.norm().clamp(max=group["max_weight_norm"])
                update_norm = update.norm()
                trust = torch.where(
                    (weight_norm > 0) & (update_norm > 0), weight_norm / update_norm, torch.ones_like(weight_norm)
                ).clamp(min=group["min_trust"])
                p.sub_(update * (group["lr"] * trust))
                self.trust_ratios[p] = trust
        return loss
