"""Greedy answers from an OpenAI-compatible `/v1/chat/completions` endpoint (SGLang, vLLM, ...).

The prompts of a chunk are sent concurrently, so the server can batch them; each request asks
for temperature 0, and the server applies the target's chat template itself. An API key (from
`--api-key` or `OPENAI_API_KEY`) goes in `Authorization: Bearer`, and nowhere else: it is not
logged, recorded with the output or put in an error message.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Sequence
from typing import Any

from ..runtime.http_client import HttpFailure, call_json
from .replay import ChatPrompt, RegenerateError

CHAT_PATH = "/v1/chat/completions"
# Statuses worth a retry: the server is overloaded or restarting, not refusing the request.
RETRY_STATUSES = {429, 500, 502, 503, 504}
API_KEY_ENV = "OPENAI_API_KEY"
DEFAULT_TIMEOUT_S = 600.0
# How often the caller wakes while requests are pending (to notice Ctrl-C).
POLL_S = 0.1


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
        timeout_s: float = DEFAULT_TIMEOUT_S,
        retries: int = 3,
        api_key: str | None = None,
    ) -> None:
        if not timeout_s > 0 or timeout_s == float("inf"):
            raise ValueError(f"--timeout must be a positive number of seconds, not {timeout_s}")
        self.base = endpoint_base(url)
        self._api_key = api_key or None
        self.max_new_tokens = max_new_tokens
        self.concurrency = max(1, concurrency)
        self.timeout_s = timeout_s
        self.retries = retries
        self.model = model or self._served_model()

    def _served_model(self) -> str:
        """The first model the server lists (SGLang and vLLM serve one)."""
        try:
            listing = call_json(
                "GET", f"{self.base}/v1/models", timeout=self.timeout_s, secret=self._api_key
            )
            return str(listing["data"][0]["id"])
        except HttpFailure as exc:
            if exc.status in (401, 403):
                raise RegenerateError(
                    f"--endpoint {self.base}: refused ({exc.status}): pass its key with "
                    f"--api-key or the {API_KEY_ENV} environment variable"
                ) from None
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

    def answer(self, prompts: Sequence[ChatPrompt]) -> list[str | None]:
        """Each prompt's answer (None: the server's answer had no text), in prompt order.

        Requests run on daemon threads and the caller waits interruptibly, so Ctrl-C stops the
        command at once instead of after the pending requests (up to the timeout) return."""
        if not prompts:
            return []
        todo: queue.Queue[int] = queue.Queue()
        for index in range(len(prompts)):
            todo.put(index)
        results: list[Any] = [None] * len(prompts)
        errors: list[BaseException] = []
        left = [len(prompts)]
        lock = threading.Lock()
        finished = threading.Event()

        def work() -> None:
            while True:
                try:
                    index = todo.get_nowait()
                except queue.Empty:
                    return
                try:
                    results[index] = self._complete(prompts[index])
                except BaseException as exc:  # handed to the caller's thread
                    errors.append(exc)
                with lock:
                    left[0] -= 1
                    if left[0] == 0 or errors:
                        finished.set()

        for _ in range(min(self.concurrency, len(prompts))):
            threading.Thread(target=work, name="regenerate-endpoint", daemon=True).start()
        # Wake up often: a Ctrl-C the kernel hands to another thread only sets Python's flag, and
        # the main thread runs the handler when it next runs Python code, not while it blocks.
        while not finished.wait(POLL_S):
            pass
        if errors:
            # Stop handing out the remaining prompts; the running ones end on their own.
            while not todo.empty():
                todo.get_nowait()
            raise errors[0]
        return results

    def _complete(self, prompt: ChatPrompt) -> str | None:
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
                reply = call_json(
                    "POST", url, payload, timeout=self.timeout_s, secret=self._api_key
                )
                break
            except HttpFailure as exc:
                transient = exc.kind != "status" or exc.status in RETRY_STATUSES
                if not transient or attempt == self.retries:
                    raise RegenerateError(f"--endpoint: {exc}") from None
                time.sleep(min(30.0, 2.0**attempt))
        try:
            message = reply["choices"][0]["message"]
        except (KeyError, IndexError, TypeError):
            raise RegenerateError(
                f"{url} answered without choices[0].message: {str(reply)[:300]}"
            ) from None
        content = message.get("content") if isinstance(message, dict) else None
        # null, a list of parts, a number: not an answer this corpus can hold. The caller
        # counts it as a bad answer (the conversation is not written) instead of writing an
        # empty or invented assistant turn.
        return content if isinstance(content, str) else None
