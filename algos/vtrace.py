"""V-trace off-policy targets (Espeholt et al., 2018, "IMPALA", section 4.1).

Actors sample with a policy that lags the learner's (the behaviour policy mu); V-trace turns
their trajectories into value targets ``vs`` and policy-gradient advantages for the learner's
current policy (the target policy pi), with truncated importance weights

    rho_t = min(rho_bar, pi(a_t|x_t) / mu(a_t|x_t)),   c_t = min(c_bar, pi / mu)
    delta_t V = rho_t * (r_t + gamma_t * V(x_{t+1}) - V(x_t))
    v_s = V(x_s) + delta_s V + gamma_s * c_s * (v_{s+1} - V(x_{s+1}))      (eq. 1, recursive)
    A_s = rho_s * (r_s + gamma_s * v_{s+1} - V(x_s))                       (the pg advantage)

Everything is time-first [T, B]; ``discounts[t] = gamma * (1 - done[t])``, so a done cuts the
trace exactly like the zero discount of the paper's episode boundaries. On-policy (pi = mu) with
rho_bar, c_bar >= 1 every weight is 1 and ``vs`` are the n-step returns bootstrapped from
``bootstrap_value``, i.e. TD(lambda = 1) targets.
"""

from __future__ import annotations

import torch

__all__ = ["vtrace"]


@torch.no_grad()
def vtrace(
    behaviour_logp: torch.Tensor,
    target_logp: torch.Tensor,
    rewards: torch.Tensor,
    values: torch.Tensor,
    bootstrap_value: torch.Tensor,
    discounts: torch.Tensor,
    rho_bar: float = 1.0,
    c_bar: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``(vs, pg_advantages)``, both [T, B] and without gradient.

    ``bootstrap_value`` [B] is V(x_T), the value after the last step. The pg advantages use the
    same clipping threshold ``rho_bar`` as the value targets (the paper's rho_bar; the reference
    implementation's separate ``clip_pg_rho_threshold`` defaults to the same 1.0).
    """
    rhos = torch.exp(target_logp - behaviour_logp)
    clipped_rhos = torch.clamp(rhos, max=rho_bar)
    cs = torch.clamp(rhos, max=c_bar)

    values_t_plus_1 = torch.cat([values[1:], bootstrap_value.unsqueeze(0)], dim=0)
    deltas = clipped_rhos * (rewards + discounts * values_t_plus_1 - values)

    # v_s - V(x_s), accumulated backwards from the end of the fragment (where it is 0).
    vs_minus_v_xs = torch.zeros_like(values)
    acc = torch.zeros_like(bootstrap_value)
    for t in reversed(range(values.shape[0])):
        acc = deltas[t] + discounts[t] * cs[t] * acc
        vs_minus_v_xs[t] = acc
    vs = vs_minus_v_xs + values

    vs_t_plus_1 = torch.cat([vs[1:], bootstrap_value.unsqueeze(0)], dim=0)
    pg_advantages = clipped_rhos * (rewards + discounts * vs_t_plus_1 - values)
    return vs, pg_advantages
