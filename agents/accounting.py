"""Prices, budgets and what a model call costs.

A price table maps a model (as a spec names it, `openai:gpt-4o`) to its prices in US
dollars per million tokens: `input` for the prompt, `output` for the completion, `cached`
for the part of the prompt the provider read from its cache (default: `input`),
`cache_write` for the part it wrote there (default: 1.25x `input`, Anthropic's price for its
5-minute cache; only Anthropic reports writes). Cairn
ships no prices (they change): a task's spec carries its own (`prices`), over a file the
submitter configures (`CAIRN_PRICES`). A model without a price costs nothing, its tokens
still counted.

A budget bounds a task's spend, in tokens (prompt + completion) or dollars or both;
reaching it pauses the task at its next barrier.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from cairn.agents.userfiles import load_json, load_yaml, read_bounded
from cairn.errors import InvalidSpec
from cairn.storage.public import public
from cairn.storage.records import Usage

PER = 1_000_000  # prices are per million tokens
CACHE_WRITE = 1.25  # a cache write's price, of the input's, unless a table says otherwise
MAX_PRICES_BYTES = 1024 * 1024  # of a price table file: a few lines per model


@public
class Price(BaseModel):
    """One model's prices, US dollars per million tokens."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, frozen=True)

    input: float = Field(ge=0)
    output: float = Field(ge=0)
    cached: float | None = Field(default=None, ge=0)
    cache_write: float | None = Field(default=None, ge=0)


@public
class Budget(BaseModel):
    """How much a task may spend: tokens (prompt + completion), US dollars, or both."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, frozen=True)

    tokens: int | None = Field(default=None, ge=1)
    cost_usd: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _some_limit(self) -> Budget:
        if self.tokens is None and self.cost_usd is None:
            raise ValueError("give tokens, cost_usd or both")
        return self

    def reached(self, tokens: int, cost_usd: float) -> bool:
        """True once `tokens` or `cost_usd` spent is at or past its limit."""
        over_tokens = self.tokens is not None and tokens >= self.tokens
        return over_tokens or (self.cost_usd is not None and cost_usd >= self.cost_usd)


@public
class MemberBudget(BaseModel):
    """How much one member and the members it spawned may spend: tokens, dollars, steps.

    The limit holds for the member's subtree (itself and every member it spawned, theirs
    too): once reached, the subtree takes no more steps, while the rest of the team goes on.
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, frozen=True)

    tokens: int | None = Field(default=None, ge=1)
    cost_usd: float | None = Field(default=None, gt=0)
    steps: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _some_limit(self) -> MemberBudget:
        if self.tokens is None and self.cost_usd is None and self.steps is None:
            raise ValueError("give tokens, cost_usd, steps or some of them")
        return self

    def over(self, usage: Usage, steps: int) -> str | None:
        """What of this budget `usage` and `steps` have reached ("" parts joined), or None."""
        parts = []
        if self.tokens is not None and usage.tokens >= self.tokens:
            parts.append(f"{usage.tokens} of {self.tokens} tokens")
        if self.cost_usd is not None and usage.cost_usd >= self.cost_usd:
            parts.append(f"${usage.cost_usd:.4f} of ${self.cost_usd:.4f}")
        if self.steps is not None and steps >= self.steps:
            parts.append(f"{steps} of {self.steps} steps")
        return " and ".join(parts) or None


def cost(usage: Usage, price: Price | None) -> float:
    """What a call that used `usage` cost at `price`, in US dollars (0 without a price)."""
    if price is None:
        return 0.0
    cached = min(usage.cached_tokens, usage.prompt_tokens)
    written = min(usage.cache_write_tokens, usage.prompt_tokens - cached)
    cached_price = price.input if price.cached is None else price.cached
    write_price = CACHE_WRITE * price.input if price.cache_write is None else price.cache_write
    return (
        (usage.prompt_tokens - cached - written) * price.input
        + cached * cached_price
        + written * write_price
        + usage.completion_tokens * price.output
    ) / PER


def load_prices(path: str | Path) -> dict[str, Price]:
    """Read a price table (YAML or JSON: model → {input, output, cached, cache_write}).

    Raises `InvalidSpec` naming the file and what is wrong.
    """
    source = Path(path)
    raw = read_bounded(source, MAX_PRICES_BYTES, f"price table {source}")
    try:
        text = raw.decode()
        data = load_json(text) if source.suffix == ".json" else load_yaml(text)
    except (ValueError, yaml.YAMLError) as exc:  # UnicodeDecodeError is a ValueError
        said = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise InvalidSpec(f"cannot read price table {source}: {said}") from None
    if not isinstance(data, dict):
        raise InvalidSpec(f"price table {source}: must map each model to its prices")
    prices: dict[str, Price] = {}
    for model, price in data.items():
        try:
            prices[str(model)] = Price.model_validate(price)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in (model, *first["loc"]))
            raise InvalidSpec(f"price table {source}: {where}: {first['msg']}") from None
    return prices
