"""The parametric scaling law L(N, D) = E + A / N^alpha + B / D^beta and its compute-optimal frontier.

N is parameters (all of them, embeddings included, as Hoffmann et al. count), D training
tokens, L the loss in nats per token, compute C = 6ND. Two published coefficient sets ship:
  hoffmann  Hoffmann et al. 2022, "Training Compute-Optimal Large Language Models", Section 3.3
            / Appendix D.2 (Approach 3): E=1.69, A=406.4, B=410.7, alpha=0.34, beta=0.28.
  epoch     Besiroglu, Erdil, Barnett and You 2024, "Chinchilla Scaling: A Replication Attempt"
            (Epoch AI), refit on data read off Hoffmann's plots: E=1.8172, A=482.01,
            B=2085.43, alpha=0.3478, beta=0.3658. They show the rounded Hoffmann values are
            inconsistent with Hoffmann's own Approaches 1 and 2, while their refit agrees with
            them. Computed here at Chinchilla's budget (5.76e23 FLOPs): hoffmann gives 32B
            params on 3.0T tokens (93 tokens/param), epoch 72B on 1.33T (18 tokens/param),
            next to Chinchilla's actual 70B on 1.4T.
The losses are those of Hoffmann's MassiveText models: the absolute numbers transfer to other
data and tokenizers only roughly; the trade-off between N and D transfers better.
Both rest on runs of 70M to 16B parameters on 5B to 500B tokens; extrapolation_warnings flags a
size or token count more than 10x outside that, or more than 10,000 tokens per parameter (the
most Sardana et al. 2023 trained).
Not handled here: fitting coefficients (kiln.plan.fit), data-constrained (repeated epoch)
scaling, and cost (kiln.plan.hardware).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from kiln.core.errors import ConfigError

# Hoffmann et al. 2022 (Table 3 and Chinchilla itself, 70B parameters on 1.4T tokens): compute-optimal
# D is about 20 N. The `rule20` split and the recipe plan's `chinchilla_tokens` both use it.
TOKENS_PER_PARAM = 20


@dataclass(frozen=True)
class LossLaw:
    E: float  # irreducible loss, nats/token
    A: float
    B: float
    alpha: float  # parameter exponent
    beta: float  # data exponent
    source: str = "fitted"

    def loss(self, params: float, tokens: float) -> float:
        """Predicted loss (nats/token) of a model of `params` parameters trained on `tokens` tokens."""
        return self.E + self.A / params**self.alpha + self.B / tokens**self.beta

    @property
    def g(self) -> float:
        # Minimising A N^-a + B D^-b on 6ND = C gives a*A*N^-a = b*B*D^-b; solving,
        # N_opt = G (C/6)^(b/(a+b)) and D_opt = (C/6)^(a/(a+b)) / G (Hoffmann et al., eq. 4).
        return (self.alpha * self.A / (self.beta * self.B)) ** (1 / (self.alpha + self.beta))

    def optimal(self, flops: float) -> tuple[float, float]:
        """Compute-optimal (params, tokens) for a budget of `flops` training FLOPs."""
        s = self.alpha + self.beta
        n = self.g * (flops / 6) ** (self.beta / s)
        return n, flops / (6 * n)

    def optimal_tokens(self, params: float) -> float:
        """Tokens for which `params` is the compute-optimal size (the frontier read the other way)."""
        # From a*A*N^-a = b*B*D^-b at the optimum.
        return (self.beta * self.B * params**self.alpha / (self.alpha * self.A)) ** (1 / self.beta)

    def optimal_params_for_loss(self, loss: float) -> float:
        """The compute-optimal size that reaches `loss`, in closed form.

        On the frontier a*A*N^-a = b*B*D^-b, so B/D^b = (a/b) A/N^a and loss - E = A/N^a (a + b)/b.
        """
        if loss <= self.E:
            raise ConfigError(
                f"loss = {loss:g} is at or below the irreducible loss E = {self.E:g} of the {self.source} fit; "
                "choose a loss above it"
            )
        return (self.A * (self.alpha + self.beta) / (self.beta * (loss - self.E))) ** (1 / self.alpha)

    def tokens_for_loss(self, params: float, loss: float) -> float | None:
        """Tokens a `params` model needs to reach `loss`; None where no amount of data suffices."""
        room = loss - self.E - self.A / params**self.alpha
        return None if room <= 0 else (self.B / room) ** (1 / self.beta)

    def coefficients(self) -> dict[str, float]:
        return {k: v for k, v in asdict(self).items() if k != "source"}


HOFFMANN_2022 = LossLaw(E=1.69, A=406.4, B=410.7, alpha=0.34, beta=0.28, source="Hoffmann et al. 2022, Approach 3")
BESIROGLU_2024 = LossLaw(
    E=1.8172, A=482.01, B=2085.43, alpha=0.3478, beta=0.3658, source="Besiroglu et al. 2024 (Epoch AI replication)"
)
LAWS = {"hoffmann": HOFFMANN_2022, "epoch": BESIROGLU_2024}


def get_law(name: str) -> LossLaw:
    try:
        return LAWS[name]
    except KeyError:
        raise ConfigError(f"fit {name!r} is unknown; choose one of {', '.join(LAWS)}") from None


# Both published fits rest on Hoffmann et al.'s runs: "over 400 language models ranging from 70
# million to over 16 billion parameters on 5 to 500 billion tokens" (their abstract).
FITTED_PARAMS = (70e6, 16e9)
FITTED_TOKENS = (5e9, 500e9)
EXTRAPOLATION_FACTOR = 10  # warn beyond 10x outside the fitted range
# Sardana et al. 2023 (v2) trained models up to 10,000 tokens per parameter and found the loss
# still falling; past that no published run checks the law.
MAX_TOKENS_PER_PARAM = 10_000


def extrapolation_warnings(
    params: float,
    tokens: float,
    params_range: tuple[float, float] = FITTED_PARAMS,
    tokens_range: tuple[float, float] = FITTED_TOKENS,
    fitted_on: str = "Hoffmann et al.'s runs",
    max_tokens_per_param: float | None = MAX_TOKENS_PER_PARAM,
) -> list[str]:
    """Warnings when (params, tokens) lie more than EXTRAPOLATION_FACTOR x outside the ranges a law was fitted on."""
    out = []
    for name, value, (lo, hi) in (("params", params, params_range), ("tokens", tokens, tokens_range)):
        if value > EXTRAPOLATION_FACTOR * hi:
            out.append(
                f"{name} = {value:.3g} is {value / hi:.3g}x the largest of {fitted_on} ({hi:.3g}): the law is "
                "extrapolated far past its data"
            )
        elif value < lo / EXTRAPOLATION_FACTOR:
            out.append(
                f"{name} = {value:.3g} is {lo / value:.3g}x below the smallest of {fitted_on} ({lo:.3g}): the law "
                "is extrapolated far below its data"
            )
    if max_tokens_per_param is not None and tokens / params > max_tokens_per_param:
        out.append(
            f"{tokens / params:,.0f} tokens per parameter is beyond the {max_tokens_per_param:,.0f} up to which "
            "Sardana et al. 2023 checked that loss keeps following the law"
        )
    return out


def min_params_for_loss(law: LossLaw, loss: float) -> float:
    """Below this size even infinite data cannot reach `loss` (the A/N^alpha term alone exceeds the room)."""
    if loss <= law.E:
        raise ConfigError(
            f"loss = {loss:g} is at or below the irreducible loss E = {law.E:g} of the {law.source} fit; choose a "
            "loss above it"
        )
    return (law.A / (loss - law.E)) ** (1 / law.alpha)


def log_range(lo: float, hi: float, n: int) -> list[float]:
    """n points evenly spaced in log between lo and hi, for curves and searches."""
    a, b = math.log(lo), math.log(hi)
    return [math.exp(a + (b - a) * i / (n - 1)) for i in range(n)]
