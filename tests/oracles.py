"""Slow, obvious reference implementations shared by several test files.

Written from the model's description (paper eq. 1 and the corrector table in
the README), one element or one time step at a time, never calling racsim.
"""

import math


def oracle_weight(name, delay, status, ratio, alpha, tau_age, rho_bar, gamma, tau=None):
    """Corrector weight c of one (sample, channel) element; plain Python floats.
    ``status`` 0 means injected; ``ratio`` is pi_now / pi_behaviour (1 at an identity actor);
    ``tau``: rac_adaptive's age constant for this element (see oracle_adaptive_tau)."""
    if name == "naive":
        return 0.0
    if name == "sync_oracle":
        return 1.0
    if status != 0:  # dropped or pending: the slow result never reaches the update
        return 0.0
    if name == "wait_for_slow":
        return 1.0
    if name == "bare_additive":
        return alpha
    rho = rho_bar if ratio > rho_bar else ratio
    if name == "rac":
        return alpha * math.exp(-delay / tau_age) * rho
    if name == "rac_no_age":
        return alpha * rho
    if name == "retrace_a":
        return alpha * gamma**delay * rho
    if name == "rac_adaptive":
        return alpha * math.exp(-delay / tau) * rho
    raise AssertionError(name)


def oracle_adaptive_tau(delay, status, lane, update, channel, quantile, scale, min_results, prior):
    """rac_adaptive's tau_age at ``update`` of one lane and channel, from the README's rule:
    collect the delays of that lane's and channel's injected results whose landing step
    (origin step + delay) is before ``update``; fewer than ``min_results``: the prior;
    else scale * max(1, Q) with Q the ceil(quantile * n)-th smallest of them.
    ``delay``/``status``: a schedule's (lanes, steps, batch, K) arrays."""
    seen = []
    for t in range(delay.shape[1]):
        for b in range(delay.shape[2]):
            if status[lane, t, b, channel] == 0 and t + delay[lane, t, b, channel] < update:
                seen.append(int(delay[lane, t, b, channel]))
    if len(seen) < min_results:
        return float(prior)
    q = sorted(seen)[math.ceil(quantile * len(seen)) - 1]
    return scale * max(1, q)


def oracle_returns(rewards, gamma):
    """G_t = sum_{j >= t} gamma^(j - t) r_j, truncated at the horizon; plain floats."""
    T = len(rewards)
    return [sum(gamma ** (j - t) * rewards[j] for j in range(t, T)) for t in range(T)]


def oracle_backward_returns(rewards, gamma):
    """G_t = r_t + gamma * G_{t+1} written out one step at a time, G_{T-1} = r_{T-1}; plain floats.

    The same two roundings per step as any float64 evaluation of the recursion,
    so it may be compared bit for bit (``oracle_returns`` sums the powers instead)."""
    out = [0.0] * len(rewards)
    for t in reversed(range(len(rewards))):
        out[t] = float(rewards[t]) if t == len(rewards) - 1 else float(rewards[t]) + gamma * out[t + 1]
    return out


def oracle_score(states, actions, returns, pi):
    """(1/T) sum_t G_t grad_theta log pi(a_t|s_t) of ONE trajectory for a tabular softmax
    policy pi (S x A), one cell at a time: d log pi(a|s) / d theta[s, b] = 1[b = a] - pi(b|s).
    Returns a list of S lists of A floats."""
    S, A = len(pi), len(pi[0])
    T = len(states)
    g = [[0.0] * A for _ in range(S)]
    for t in range(T):
        s, a = int(states[t]), int(actions[t])
        for b in range(A):
            g[s][b] += ((1.0 if b == a else 0.0) - float(pi[s][b])) * float(returns[t]) / T
    return g


def erlang_c(c, a):
    """Erlang C: P(wait > 0) in an M/M/c queue of offered load a = lambda / mu < c, from the
    Erlang B recursion B(0) = 1, B(k) = a B(k-1) / (k + a B(k-1)), C = B / (1 - (a / c)(1 - B))."""
    b = 1.0
    for k in range(1, c + 1):
        b = a * b / (k + a * b)
    return b / (1.0 - (a / c) * (1.0 - b))


def mmc_mean_wait(c, lam, mean_service):
    """M/M/c mean queue wait: C(c, a) / (c mu - lambda), a = lambda E[S], mu = 1 / E[S]."""
    return erlang_c(c, lam * mean_service) / (c / mean_service - lam)


def mg1_mean_wait(lam, mean_service, second_moment):
    """M/G/1 mean queue wait (Pollaczek-Khinchine): lambda E[S^2] / (2 (1 - lambda E[S]))."""
    return lam * second_moment / (2.0 * (1.0 - lam * mean_service))


def allen_cunneen_mean_wait(c, lam, mean_service, cs2):
    """M/G/c mean queue wait by the Allen-Cunneen approximation: the M/M/c wait x (1 + cs^2) / 2,
    cs^2 the service time's squared coefficient of variation (Poisson arrivals: ca^2 = 1)."""
    return mmc_mean_wait(c, lam, mean_service) * (1.0 + cs2) / 2.0
