"""Greedy answers from an OpenAI-compatible `/v1/chat/completions` endpoint (SGLang, vLLM, ...).

The prompts of a chunk are sent concurrently, so the server can batch them; each request asks
for temperature 0, and the server applies the target's chat template itself. An API key (from
`--api-key` or `OPENAI_API_KEY`) goes in `Authorization: Bearer`, and nowhere else: it is not
logged, recorded with the output or put in an error message.

A server that goes away mid-run (restarted, preempted, its node rebooted) is waited for: a
request that fails with a refused or dropped connection, a timeout or a retryable status is
retried with exponential backoff (capped, with jitter). Each request gets `retries` retries in
any case, as a transient hiccup deserves; beyond them it goes on retrying while the outage, the
time since the first failure after the last answer from the server, is shorter than
`retry_for_s`. The window only opens once the server has answered in this run: a wrong URL or a
server never started is an error at once, not after ten minutes. When one request gives up, the
others of the batch stop retrying, and those in flight are let finish so their answers are kept.
"""

from __future__ import annotations

import logging
import math
import queue
import random
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from ..runtime.http_client import HttpFailure, call_json
from .replay import AnswerCallback, ChatPrompt, RegenerateError

log = logging.getLogger(__name__)

CHAT_PATH = "/v1/chat/completions"
# Statuses worth a retry: the server is overloaded or restarting, not refusing the request.
RETRY_STATUSES = {429, 500, 502, 503, 504}
API_KEY_ENV = "OPENAI_API_KEY"
DEFAULT_TIMEOUT_S = 600.0
# How long a server that stopped answering is waited for (`--retry-for`).
DEFAULT_RETRY_FOR_S = 600.0
# Retries every failed request gets, whatever the window (a dropped connection, one 503).
DEFAULT_RETRIES = 3
# Backoff of the n-th retry: BACKOFF_BASE_S * 2**n, at most BACKOFF_CAP_S, times a random factor
# in [0.5, 1] so that the requests of a batch do not come back in lockstep. Read when a
# responder is made, so tests can shorten them.
BACKOFF_BASE_S = 1.0
BACKOFF_CAP_S = 30.0
# How often the caller wakes while requests are pending (to notice Ctrl-C, to show the status).
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


def format_duration(seconds: float) -> str:
    """A duration the way the status line says it: '8 s', '1 min 20 s', '10 min', '2 h 5 min'."""
    total = max(0, round(seconds))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    if minutes:
        return f"{minutes} min {secs} s" if secs else f"{minutes} min"
    return f"{secs} s"


def _is_transient(failure: HttpFailure) -> bool:
    return failure.kind != "status" or failure.status in RETRY_STATUSES


def _what_failed(failure: HttpFailure) -> str:
    if failure.kind == "timeout":
        return "server not answering (timed out)"
    if failure.kind == "status":
        return f"server busy ({failure.status})"
    return "server unreachable"


class EndpointGone(RegenerateError):
    """The endpoint stopped answering and the retries (and the --retry-for window) ran out."""

    resumable = True


class _Stopped(Exception):
    """A request abandoned because another request of its batch failed (or Ctrl-C)."""


class _Outage:
    """What the requests of a responder share: whether the server ever answered, since when it
    has not (the first failure after its last answer), and when the waiting requests retry."""

    def __init__(self, *, retry_for_s: float, retries: int, base_s: float, cap_s: float) -> None:
        self.retry_for_s = retry_for_s
        self.retries = retries
        self.base_s = base_s
        self.cap_s = cap_s
        self.lock = threading.Lock()
        self.answered = False
        self.since: float | None = None
        self.failure: HttpFailure | None = None
        self.retry_at: dict[int, float] = {}
        self._random = random.Random()

    @property
    def window_s(self) -> float:
        """The outage allowed now: none before the server's first answer."""
        return self.retry_for_s if self.answered else 0.0

    def answered_now(self) -> float | None:
        """The server answered: the outage (if any) is over; returns how long it lasted."""
        with self.lock:
            lasted = None if self.since is None else time.monotonic() - self.since
            self.answered = True
            self.since = None
            self.failure = None
            return lasted

    def delay(self, attempt: int, failure: HttpFailure) -> float | None:
        """Seconds before retry number `attempt + 1` of a request, or None: give up."""
        with self.lock:
            now = time.monotonic()
            if self.since is None:
                self.since = now
            self.failure = failure
            # The exponent is capped: 2.0 ** attempt overflows after ~1000 short retries.
            backoff = min(self.cap_s, self.base_s * 2.0 ** min(attempt, 60))
            backoff *= self._random.uniform(0.5, 1.0)
            if attempt < self.retries:
                return backoff
            left = self.since + self.window_s - now
            # The last retry lands at the end of the window, not one backoff past it.
            return min(backoff, left) if left > 0 else None

    def waited_s(self) -> float:
        """How long the current outage has lasted (0 when there is none)."""
        with self.lock:
            return 0.0 if self.since is None else time.monotonic() - self.since

    def status(self) -> str:
        """The progress bar's line while the server is failing ('' when it is not)."""
        with self.lock:
            if self.since is None or self.failure is None:
                return ""
            now = time.monotonic()
            text = _what_failed(self.failure)
            if self.retry_at:
                wait = math.ceil(max(0.0, min(self.retry_at.values()) - now))
                text += f", retrying in {format_duration(wait)}"
            else:
                text += ", retrying"
            if self.window_s > 0:
                waited = format_duration(now - self.since)
                text += f" ({waited} of {format_duration(self.window_s)})"
            return text


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
        retries: int = DEFAULT_RETRIES,
        retry_for_s: float = DEFAULT_RETRY_FOR_S,
        api_key: str | None = None,
        backoff_base_s: float | None = None,
        backoff_cap_s: float | None = None,
    ) -> None:
        if not timeout_s > 0 or timeout_s == float("inf"):
            raise ValueError(f"--timeout must be a positive number of seconds, not {timeout_s}")
        if not 0 <= retry_for_s < float("inf"):
            raise ValueError(f"--retry-for must be 0 or more seconds, not {retry_for_s}")
        self.base = endpoint_base(url)
        self._api_key = api_key or None
        self.max_new_tokens = max_new_tokens
        self.concurrency = max(1, concurrency)
        self.timeout_s = timeout_s
        self.retries = retries
        self.retry_for_s = retry_for_s
        self._outage = _Outage(
            retry_for_s=retry_for_s,
            retries=retries,
            base_s=BACKOFF_BASE_S if backoff_base_s is None else backoff_base_s,
            cap_s=BACKOFF_CAP_S if backoff_cap_s is None else backoff_cap_s,
        )
        # Set by `regenerate` to show a line on its progress bar; without one, a log line.
        self.show_status: Callable[[str], Any] | None = None
        self._shown = ""
        self.model = model or self._served_model()

    def _served_model(self) -> str:
        """The first model the server lists (SGLang and vLLM serve one)."""
        try:
            listing = call_json(
                "GET", f"{self.base}/v1/models", timeout=self.timeout_s, secret=self._api_key
            )
            self._outage.answered_now()
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

    def answer(
        self, prompts: Sequence[ChatPrompt], on_answer: AnswerCallback | None = None
    ) -> list[str | None]:
        """Each prompt's answer (None: the server's answer had no text), in prompt order.

        Requests run on daemon threads and the caller waits interruptibly, so Ctrl-C stops the
        command at once instead of after the pending requests (up to the timeout) return. Each
        answer goes to `on_answer` as it arrives; when a request fails for good, the requests
        not yet sent are dropped and the ones in flight finish (their answers kept) first."""
        if not prompts:
            return []
        todo: queue.Queue[int] = queue.Queue()
        for index in range(len(prompts)):
            todo.put(index)
        results: list[Any] = [None] * len(prompts)
        errors: list[BaseException] = []
        workers = min(self.concurrency, len(prompts))
        running = [workers]
        lock = threading.Lock()
        finished = threading.Event()
        stop = threading.Event()

        def work() -> None:
            try:
                while not stop.is_set():
                    try:
                        index = todo.get_nowait()
                    except queue.Empty:
                        return
                    try:
                        results[index] = self._complete(prompts[index], stop)
                        if on_answer is not None:
                            on_answer(index, results[index])
                    except _Stopped:
                        return
                    except BaseException as exc:  # handed to the caller's thread
                        with lock:
                            errors.append(exc)
                        stop.set()
                        return
            finally:
                with lock:
                    running[0] -= 1
                    if running[0] == 0:
                        finished.set()

        for _ in range(workers):
            threading.Thread(target=work, name="regenerate-endpoint", daemon=True).start()
        try:
            # Wake up often: a Ctrl-C the kernel hands to another thread only sets Python's
            # flag, and the main thread runs the handler when it next runs Python code, not
            # while it blocks.
            while not finished.wait(POLL_S):
                if errors:
                    self._show(f"stopping: {running[0]} request(s) in flight finishing")
                else:
                    self._show(self._outage.status())
        finally:
            # Ctrl-C or done: no request waits to retry any more.
            stop.set()
            self._show("")
        if errors:
            raise errors[0]
        return results

    def _show(self, text: str) -> None:
        """Put the status on the progress bar, or log when the server stops/starts answering."""
        if text == self._shown:
            return
        if self.show_status is not None:
            self.show_status(text)
        elif text.startswith("server") and not self._shown.startswith("server"):
            log.warning("--endpoint %s: %s", self.base, text)
        self._shown = text

    def _complete(self, prompt: ChatPrompt, stop: threading.Event) -> str | None:
        payload = {
            "model": self.model,
            "messages": prompt.messages,
            "temperature": 0,
            "max_tokens": min(self.max_new_tokens, prompt.max_new_tokens),
            "stream": False,
        }
        url = f"{self.base}{CHAT_PATH}"
        attempt = 0
        while True:
            try:
                reply = call_json(
                    "POST", url, payload, timeout=self.timeout_s, secret=self._api_key
                )
                lasted = self._outage.answered_now()
                if lasted is not None and self.show_status is None:
                    log.warning(
                        "--endpoint %s: answering again after %s",
                        self.base,
                        format_duration(lasted),
                    )
                break
            except HttpFailure as exc:
                if not _is_transient(exc):
                    raise RegenerateError(f"--endpoint {self.base}: {exc}") from None
                if stop.is_set():
                    raise _Stopped from None
                delay = self._outage.delay(attempt, exc)
                if delay is None:
                    raise self._gone(exc) from None
                me = threading.get_ident()
                with self._outage.lock:
                    self._outage.retry_at[me] = time.monotonic() + delay
                try:
                    if stop.wait(delay):
                        raise _Stopped from None
                finally:
                    with self._outage.lock:
                        self._outage.retry_at.pop(me, None)
                attempt += 1
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

    def _gone(self, failure: HttpFailure) -> EndpointGone:
        """The error of a request that gives up: what failed, and for how long it was waited."""
        waited = format_duration(self._outage.waited_s())
        if self._outage.window_s > 0:
            return EndpointGone(
                f"--endpoint {self.base}: no answer for {waited}, gave up "
                f"(--retry-for {self.retry_for_s:g}): {failure}"
            )
        if not self._outage.answered:
            why = "it has not answered in this run, so --retry-for does not apply"
        else:
            why = "--retry-for 0"
        return EndpointGone(
            f"--endpoint {self.base}: {failure} (gave up after {self.retries} retries in "
            f"{waited}; {why})"
        )
