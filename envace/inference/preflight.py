"""Pre-flight check of every endpoint a stage will use, before anything heavy loads.

``preflight(cfg, stage)`` lists the OpenAI-compatible endpoints the stage's config points at
(``ENDPOINT_SOURCES``: the training judge for ``judge.name`` llm/composite, grpo's remote simulator,
the benchmarks' user-simulator and judge endpoints) and sends each one cheap request:
``GET {base_url}/models``; when the server has no ``/models`` (HTTP 404/405) a one-token chat
completion instead. Checks run concurrently, each bounded by ``CHECK_TIMEOUT_S`` and without retries, so a
stage with a dead endpoint fails in seconds instead of training on judge failures.

A failure raises ``EndpointUnavailable`` (a ``ConfigError``: the stage CLIs print it as one line) whose
message names the URL, the cause in words ("connection refused", "HTTP 401 ...") and the config key to
fix (``judge.base_url``, ``judge.api_key_env``, ``eval.suites.vitabench.user_base_url`` ...).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from envace.config.load import ConfigError, to_plain
from envace.inference.base import ChatRequest
from envace.inference.openai_client import NO_AUTH_HINT, EndpointError, OpenAIChatBackend

logger = logging.getLogger(__name__)

CHECK_TIMEOUT_S = 4.0  # per request; at most two requests per endpoint: well inside 10 s
NO_MODELS_ROUTE = frozenset({404, 405})


class EndpointUnavailable(ConfigError):
    """An endpoint the configuration points at cannot be used (refused, unauthenticated, unreachable ...)."""


@dataclass(frozen=True)
class Endpoint:
    """One configured endpoint and the config keys that set it."""

    what: str  # "judge", "vitabench user simulator" ...
    base_url: str
    model: str | None
    api_key_env: str | None
    url_key: str  # e.g. judge.base_url
    model_key: str
    key_env_key: str
    timeout_s: float = CHECK_TIMEOUT_S
    alternative: str = ""  # another way out, e.g. "judge.base_url=null judges by rules only"


def _judge_endpoints(cfg: Mapping[str, Any]) -> list[Endpoint]:
    """The training judge: llm always needs an endpoint, composite only when ``judge.base_url`` is set."""
    judge = cfg.get("judge") or {}
    name = judge.get("name")
    if name not in ("llm", "composite") or (name == "composite" and not judge.get("base_url")):
        return []
    if not judge.get("base_url") or not judge.get("model"):
        raise ConfigError(
            f"judge.name={name} needs judge.base_url (an OpenAI-compatible endpoint ending in /v1) "
            f"and judge.model; got base_url={judge.get('base_url')!r}, model={judge.get('model')!r}"
        )
    rules_only = "or set judge.base_url=null to judge by rules only" if name == "composite" else ""
    return [
        Endpoint(
            "judge",
            str(judge["base_url"]),
            str(judge["model"]),
            judge.get("api_key_env"),
            "judge.base_url",
            "judge.model",
            "judge.api_key_env",
            min(float(judge.get("timeout_s") or CHECK_TIMEOUT_S), CHECK_TIMEOUT_S),
            rules_only,
        )
    ]


def _simulator_endpoints(cfg: Mapping[str, Any]) -> list[Endpoint]:
    """grpo's frozen simulator served remotely (engine=verl, algo.grpo_responses=simulator)."""
    algo, engine = cfg.get("algo") or {}, cfg.get("engine") or {}
    sim = engine.get("simulator") or {}
    used = engine.get("name") == "verl" and algo.get("name") == "grpo" and algo.get("grpo_responses") == "simulator"
    if not used or not sim.get("base_url"):
        return []
    return [
        Endpoint(
            "simulator",
            str(sim["base_url"]),
            sim.get("model"),
            sim.get("api_key_env"),
            "engine.simulator.base_url",
            "engine.simulator.model",
            "engine.simulator.api_key_env",
        )
    ]


def _suite_endpoints(cfg: Mapping[str, Any], benchmarks: list[str]) -> list[Endpoint]:
    """``eval.suites.<benchmark>.{user,judge}_base_url`` of the benchmarks a stage runs."""
    out = []
    suites = (cfg.get("eval") or {}).get("suites") or {}
    for benchmark in benchmarks:
        suite = suites.get(benchmark) or {}
        for prefix, what in (("user", "user simulator"), ("judge", "judge")):
            url = suite.get(f"{prefix}_base_url")
            if url:
                key = f"eval.suites.{benchmark}.{prefix}"
                out.append(
                    Endpoint(
                        f"{benchmark} {what}",
                        str(url).removesuffix("/chat/completions"),
                        suite.get(f"{prefix}_model"),
                        suite.get(f"{prefix}_api_key_env"),
                        f"{key}_base_url",
                        f"{key}_model",
                        f"{key}_api_key_env",
                    )
                )
    return out


# stage name -> the functions listing the endpoints it uses (stages not named here use none)
ENDPOINT_SOURCES: dict[str, tuple[Callable[[Mapping[str, Any]], list[Endpoint]], ...]] = {
    "train": (_judge_endpoints, _simulator_endpoints),
    "evaluate": (lambda cfg: _suite_endpoints(cfg, [str(cfg["eval"]["benchmark"])]),),
    "rehearsal_sweep": (lambda cfg: _suite_endpoints(cfg, [str(b) for b in cfg["rehearsal"]["benchmarks"]]),),
}


def stage_endpoints(cfg: Any, stage: str) -> list[Endpoint]:
    """The endpoints ``stage`` will call under ``cfg`` (a DictConfig or a plain dict)."""
    plain = to_plain(cfg)
    return [ep for source in ENDPOINT_SOURCES.get(stage, ()) for ep in source(plain)]


def _unavailable(ep: Endpoint, cause: str, fix: str) -> EndpointUnavailable:
    also = f" ({ep.alternative})" if ep.alternative else ""
    return EndpointUnavailable(f"{ep.what} endpoint {ep.base_url} is unavailable: {cause}; {fix}{also}")


def _fix_for(ep: Endpoint, err: EndpointError) -> str:
    """Which config key to change for this failure."""
    if err.status in (401, 403):
        now = f"now {ep.api_key_env}" if ep.api_key_env else "now null: no key is sent"
        return f"set {ep.key_env_key} to the environment variable holding its API key ({now})"
    if err.status == 404:
        return f"check {ep.url_key} (it ends in /v1) and {ep.model_key}={ep.model!r}"
    if err.status is not None:
        return f"check that {ep.url_key} points at a healthy OpenAI-compatible server"
    return f"start the server or fix {ep.url_key}"


def check_endpoint(ep: Endpoint) -> float:
    """Seconds one cheap request to ``ep`` took; ``EndpointUnavailable`` naming the key to fix otherwise."""
    started = time.perf_counter()
    try:
        client = OpenAIChatBackend(
            ep.base_url, ep.model or "", api_key_env=ep.api_key_env, timeout=ep.timeout_s, max_retries=0
        )
    except EndpointError as err:
        raise EndpointUnavailable(
            f"{ep.what} endpoint {ep.base_url}: {ep.key_env_key}={ep.api_key_env} names an "
            f"environment variable that is not set: export it, or {NO_AUTH_HINT} "
            f"({ep.key_env_key}=null)"
        ) from err
    try:
        try:
            served = client.list_models()
        except EndpointError as err:
            if err.status not in NO_MODELS_ROUTE or not ep.model:
                raise
            served = []  # no /models route: ask for one token instead
        if ep.model and ep.model not in served:
            client.complete(ChatRequest(messages=({"role": "user", "content": "ping"},), max_new_tokens=1))
    except EndpointError as err:
        cause = str(err)  # names the request, the cause in words ("connection refused") and the status
        if err.status == 404 and ep.model and "/chat/completions" in cause:
            cause = f"model {ep.model!r} is not served there ({cause})"
        raise _unavailable(ep, cause, _fix_for(ep, err)) from err
    finally:
        client.close()
    return time.perf_counter() - started


def preflight(cfg: Any, stage: str) -> list[Endpoint]:
    """Check every endpoint ``stage`` uses (concurrently); returns them, raises ``EndpointUnavailable``."""
    endpoints = stage_endpoints(cfg, stage)
    if not endpoints:
        return []
    with ThreadPoolExecutor(max_workers=len(endpoints)) as pool:
        futures = [(ep, pool.submit(check_endpoint, ep)) for ep in endpoints]
    problems = []
    for ep, future in futures:
        try:
            logger.info("%s: %s endpoint %s answers (%.2f s)", stage, ep.what, ep.base_url, future.result())
        except EndpointUnavailable as exc:
            problems.append(exc)
    if len(problems) == 1:
        raise problems[0]
    if problems:
        raise EndpointUnavailable(f"{len(problems)} endpoints unavailable: " + " | ".join(map(str, problems)))
    return endpoints
