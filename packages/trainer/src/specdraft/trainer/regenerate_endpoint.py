"""Greedy answers from an OpenAI-compatible `/v1/chat/completions` endpoint (SGLang, vLLM, ...).

The prompts of a chunk are sent concurrently, so the server can batch them; each request asks
for temperature 0, and the server applies the target's chat template itself.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .disagg.http_json import HttpFailure, call_json
from .regenerate import Prompt, RegenerateError

CHAT_PATH = "/v1/chat/completions"
# Statuses worth a retry: the server is overloaded or restarting, not refusing the request.
RETRY_STATUSES = {429, 500, 502, 503, 504}


def endpoint_base(url: str) -> str:
    """The server's base URL from a base, a `/v1` or a full chat-completions URL."""
    base = url.rstrip("/")
    for suffix in (CHAT_PATH, "/v1"):
        if base.endswith(suffix):
            base = base[: -len(suffix)]
    if not base.startswith(("http://", "https://")):
        raise ValueError(f"--endpoint {url!r}: expected an http:// or https:// URL")
    return base


class EndpointResponder:
    """Asks a chat-completions endpoint for each prompt's greedy answer."""

    def __init__(
        self,
        url: str,
        *,
        model: str | None,
        max_new_tokens: int,
        concurrency: int = 8,
        timeout_s: float = 600.0,
        retries: int = 3,
    ) -> None:
        self.base = endpoint_base(url)
        self.max_new_tokens = max_new_tokens
        self.concurrency = max(1, concurrency)
        self.timeout_s = timeout_s
        self.retries = retries
        self.model = model or self._served_model()

    def _served_model(self) -> str:
        """The first model the server lists (SGLang and vLLM serve one)."""
        try:
            listing = call_json("GET", f"{self.base}/v1/models", timeout=self.timeout_s)
            return str(listing["data"][0]["id"])
        except HttpFailure as exc:
            raise RegenerateError(
                f"--endpoint {self.base}: cannot list its models ({exc}); is the server up? "
                "Pass --model NAME if it has no /v1/models"
            ) from None
        except (KeyError, IndexError, TypeError):
            raise RegenerateError(
                f"--endpoint {self.base}: /v1/models lists no model; pass --model NAME"
            ) from None

    def describe(self) -> dict[str, Any]:
        """The served model and the answer budget (the URL may change between resumes)."""
        return {"kind": "endpoint", "model": self.model, "max_new_tokens": self.max_new_tokens}

    def answer(self, prompts: Sequence[Prompt]) -> list[str]:
        """Each prompt's answer, requested concurrently, in prompt order."""
        if not prompts:
            return []
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(prompts))) as pool:
            return list(pool.map(self._complete, prompts))

    def _complete(self, prompt: Prompt) -> str:
        payload = {
            "model": self.model,
            "messages": prompt.messages,
            "temperature": 0,
            "max_tokens": min(self.max_new_tokens, prompt.max_new_tokens),
            "stream": False,
        }
        url = f"{self.base}{CHAT_PATH}"
        for attempt in range(self.retries + 1):
            try:
                reply = call_json("POST", url, payload, timeout=self.timeout_s)
                break
            except HttpFailure as exc:
                transient = exc.kind != "status" or exc.status in RETRY_STATUSES
                if not transient or attempt == self.retries:
                    raise RegenerateError(f"--endpoint: {exc}") from None
                time.sleep(min(30.0, 2.0**attempt))
        try:
            content = reply["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            raise RegenerateError(
                f"{url} answered without choices[0].message.content: {str(reply)[:300]}"
            ) from None
        return content or ""
