"""What each live worker has, said in Redis, and a spec checked against it at submit.

Every Cairn worker writes its offer (`Offer`: its tools, agent kinds, MCP servers and model
providers) under `keys.worker_offer(name)` with a TTL of `OFFER_TTL` s, refreshed with its
liveness beat and deleted as it stops; `keys.WORKERS` indexes the names. A worker killed
stops refreshing it, and its offer expires: the live workers are those whose offers are
there.

A submit (and a fork with a spec) is refused when an agent names something that *every*
live worker lacks, naming the agent, the thing and the closest name any worker has: such
a task could not take a step. With no live worker at all it is accepted (workers may
come later), and when only some workers lack it, the first step that lands on one fails
the task with the reason (`MissingTool`).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import cast

import redis
from pydantic import BaseModel, ConfigDict, ValidationError
from redis.client import Pipeline

from cairn.agents.mcp.names import PREFIX as MCP_PREFIX
from cairn.agents.mcp.names import parse_ref
from cairn.agents.spec import LLM_KIND, NO_MODEL, AgentSpec
from cairn.errors import InvalidSpec
from cairn.storage import keys

OFFER_TTL = 30  # seconds an offer outlives its worker's last beat (beats come every 5 to 10 s)
MAX_PROBLEMS = 5  # what one refusal names
MAX_LISTED = 12  # names of what the workers have, listed when none is close


class Offer(BaseModel):
    """What one worker has: the names a spec may give it.

    `refused` maps a tool the worker has but will not run to why (a worker that cannot
    sandbox runs no command); such a tool is not in `tools`.
    """

    model_config = ConfigDict(extra="ignore")  # a newer worker may say more

    worker: str  # host:pid
    tools: list[str]
    kinds: list[str]
    mcp: list[str]
    providers: list[str]
    refused: dict[str, str] = {}


def advertise(
    client: redis.Redis | Pipeline, name: str, offer: Offer, ttl: int = OFFER_TTL
) -> None:
    """Write worker `name`'s offer for `ttl` seconds (idempotent: a beat rewrites it)."""
    client.set(keys.worker_offer(name), offer.model_dump_json(), ex=ttl)
    client.sadd(keys.WORKERS, name)


def withdraw(client: redis.Redis | Pipeline, name: str) -> None:
    """Remove worker `name`'s offer: it takes no more jobs."""
    client.delete(keys.worker_offer(name))
    client.srem(keys.WORKERS, name)


def live_offers(client: redis.Redis) -> list[Offer]:
    """The offers of the live workers; names whose offer expired are dropped from the index."""
    members = cast("set[bytes]", client.smembers(keys.WORKERS))
    names = sorted(member.decode() for member in members)
    if not names:
        return []
    with client.pipeline(transaction=False) as batch:
        for name in names:
            batch.get(keys.worker_offer(name))
        values = batch.execute()
    offers, gone = [], []
    for name, value in zip(names, values, strict=True):
        if value is None:
            gone.append(name)
            continue
        try:
            offers.append(Offer.model_validate_json(value))
        except ValidationError:
            continue  # another program's key: no offer, and not ours to delete
    if gone:
        client.srem(keys.WORKERS, *gone)
    return offers


@dataclass(frozen=True, slots=True)
class Need:
    """One thing an agent names that a worker must have."""

    what: str  # "tool", "MCP server", "agent kind", "model provider"
    name: str
    given: str  # as the spec gives it (`mcp:notes/get`, `openai:gpt-4o`)

    def held_by(self, offer: Offer) -> bool:
        """Say whether `offer`'s worker has it."""
        return self.name in self.names(offer)

    def names(self, offer: Offer) -> list[str]:
        """The names of its sort that `offer`'s worker has."""
        return {"tool": offer.tools, "MCP server": offer.mcp, "agent kind": offer.kinds,
                "model provider": offer.providers}[self.what]  # fmt: skip


def needs_of(agent: AgentSpec) -> list[Need]:
    """What a worker needs to take `agent`'s steps."""
    needs = []
    if agent.kind != LLM_KIND:
        needs.append(Need("agent kind", agent.kind, agent.kind))
    if agent.model != NO_MODEL:
        provider = agent.model.partition(":")[0]
        needs.append(Need("model provider", provider, agent.model))
    for name in agent.tools:
        if name.startswith(MCP_PREFIX):
            server, _tool = parse_ref(name)
            needs.append(Need("MCP server", server, name))
        else:
            needs.append(Need("tool", name, name))
    return needs


def check_offers(agents: Iterable[AgentSpec], offers: Sequence[Offer]) -> None:
    """Raise `InvalidSpec` when an agent names what no worker of `offers` has.

    Nothing is refused when `offers` is empty: no worker is live to say.
    """
    if not offers:
        return
    problems = [
        _problem(agent.name, need, offers)
        for agent in agents
        for need in dict.fromkeys(needs_of(agent))
        if not any(need.held_by(offer) for offer in offers)
    ]
    if problems:
        more = len(problems) - MAX_PROBLEMS
        tail = f"; and {more} more" if more > 0 else ""
        raise InvalidSpec("; ".join(problems[:MAX_PROBLEMS]) + tail)


def _problem(agent: str, need: Need, offers: Sequence[Offer]) -> str:
    """One line: the agent, what it names, and what the workers have instead."""
    given = "" if need.given == need.name else f" (in {need.given!r})"
    said = f"agent {agent} names {need.what} {need.name!r}{given}, which no live worker has"
    if need.what == "agent kind":
        said = f"agent {agent} is of kind {need.name!r}, which no live worker has"
    refusals = sorted({o.refused[need.name] for o in offers if need.name in o.refused})
    if refusals:
        return f"{said}: {refusals[0]}"
    known = sorted({name for offer in offers for name in need.names(offer)})
    close = difflib.get_close_matches(need.name, known, n=1, cutoff=0.6)
    if close:
        return f"{said} (did you mean {close[0]}?)"
    return f"{said} (live workers have {_listed(known)})"


def _listed(names: list[str]) -> str:
    if not names:
        return "none"
    shown = ", ".join(names[:MAX_LISTED])
    return shown + (f", … ({len(names)} in all)" if len(names) > MAX_LISTED else "")
