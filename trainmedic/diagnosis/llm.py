"""Optional last resort: ask an OpenAI-compatible chat endpoint when no rule matched.

Off unless TRAINMEDIC_LLM_URL and TRAINMEDIC_LLM_MODEL are set. The answer is never
trusted as is: the label must be one of the taxonomy's, the confidence is capped, and
any failure (network, HTTP status, malformed reply) means "no answer", not an error. The
API key is sent only as a bearer header and never appears in logs or exception text.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import httpx

from trainmedic.core.settings import Settings
from trainmedic.core.taxonomy import Category

__all__ = ["LlmAnswer", "LlmConfig", "classify_with_llm", "llm_config_from_settings"]

log = logging.getLogger(__name__)

MAX_CONFIDENCE = 0.6  # a model's guess never outranks a matched signature
TAIL_CHARS = 6000


@dataclass(frozen=True)
class LlmConfig:
    url: str
    model: str
    api_key: str | None = field(default=None, repr=False)
    timeout_s: float = 20.0

    @property
    def endpoint(self) -> str:
        base = self.url.rstrip("/")
        if base.endswith("/chat/completions"):
            return base
        if base.endswith("/v1"):
            return base + "/chat/completions"
        return base + "/v1/chat/completions"


@dataclass(frozen=True)
class LlmAnswer:
    category: Category
    confidence: float
    root_cause_host: str | None
    reason: str


def llm_config_from_settings(settings: Settings) -> LlmConfig | None:
    """The fallback's endpoint, or None (off) unless both its URL and model are set."""
    url, model = settings.llm_url.strip(), settings.llm_model.strip()
    if not url or not model:
        return None
    key = settings.llm_api_key.get_secret_value() if settings.llm_api_key else None
    return LlmConfig(url=url, model=model, api_key=key or None, timeout_s=settings.llm_timeout_s)


_SYSTEM_PROMPT = (
    "You classify why a large-model training job failed. Answer with one JSON object only: "
    '{"category": <label>, "root_cause_host": <host, "rank N" or null>, '
    '"confidence": <0..1>, "reason": <one sentence>}. Allowed labels: '
    + ", ".join(c.value for c in Category)
    + ". Prefer the hardware/infrastructure cause over the symptoms other ranks show "
    "(collective timeouts). Use Unknown when the logs do not say."
)


def _prompt(tails: Mapping[str, Sequence[str]]) -> str:
    parts = []
    budget = TAIL_CHARS
    for name, lines in tails.items():
        text = "\n".join(lines)[-max(0, budget // max(1, len(tails))) :]
        parts.append(f"=== {name} (last lines) ===\n{text}")
    return "\n\n".join(parts)


def _redact(text: str, secret: str | None) -> str:
    return text.replace(secret, "***") if secret else text


def classify_with_llm(
    tails: Mapping[str, Sequence[str]],
    config: LlmConfig,
    *,
    transport: httpx.BaseTransport | None = None,
) -> LlmAnswer | None:
    """Ask the model about the last lines of each log; None when it gives no usable answer."""
    headers = {"Content-Type": "application/json"}
    if config.api_key:
        headers["Authorization"] = f"Bearer {config.api_key}"
    payload = {
        "model": config.model,
        "temperature": 0,
        "messages": [
            {"role": "system", "content": _SYSTEM_PROMPT},
            {"role": "user", "content": _prompt(tails)},
        ],
    }
    try:
        with httpx.Client(timeout=config.timeout_s, transport=transport) as client:
            response = client.post(config.endpoint, json=payload, headers=headers)
            response.raise_for_status()
            body = response.json()
    except (httpx.HTTPError, ValueError) as exc:
        log.warning(
            "LLM fallback unavailable: %s", _redact(f"{type(exc).__name__}: {exc}", config.api_key)
        )
        return None
    return parse_llm_reply(body)


_JSON_OBJECT = re.compile(r"\{.*\}", re.DOTALL)


def parse_llm_reply(body: object) -> LlmAnswer | None:
    """Validate an OpenAI chat-completion response body against the taxonomy."""
    try:
        content = body["choices"][0]["message"]["content"]  # type: ignore[index]
    except (KeyError, IndexError, TypeError):
        log.warning("LLM fallback: response has no choices[0].message.content")
        return None
    if not isinstance(content, str):
        return None
    match = _JSON_OBJECT.search(content)
    if match is None:
        return None
    try:
        answer = json.loads(match.group(0))
    except json.JSONDecodeError:
        return None
    if not isinstance(answer, dict):
        return None
    label = str(answer.get("category", ""))
    category = Category(label) if label in Category.__members__ else Category.Unknown
    try:
        confidence = float(answer.get("confidence", 0.3))
    except (TypeError, ValueError):
        confidence = 0.3
    if math.isnan(confidence):
        confidence = 0.3
    host = answer.get("root_cause_host")
    host_text = str(host)[:128] if isinstance(host, str | int) and str(host).strip() else None
    return LlmAnswer(
        category=category,
        confidence=max(0.0, min(MAX_CONFIDENCE, confidence)),
        root_cause_host=host_text,
        reason=str(answer.get("reason", ""))[:500],
    )
