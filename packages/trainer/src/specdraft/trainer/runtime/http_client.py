"""One JSON request over HTTP, stdlib only: the clients of the runtime's services (capture
servers, window controller, SGLang) and of corpus regeneration's chat endpoint.

A request either returns the decoded body of a 2xx answer or raises `HttpFailure`, whose `kind`
says whether the peer was unreachable, too slow, or answered with an error status.
"""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.request
from typing import Any


class HttpFailure(Exception):
    """An HTTP exchange that failed: `kind` is 'unavailable', 'timeout' or 'status'."""

    def __init__(self, kind: str, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.status = status


def call_json(
    method: str, url: str, payload: Any = None, *, timeout: float, secret: str | None = None
) -> Any:
    """One JSON request; returns the decoded body of a 2xx answer, else raises HttpFailure.

    `secret`, when given, is sent as `Authorization: Bearer <secret>` (the run's secret).
    """
    body = call_bytes(method, url, payload, timeout=timeout, secret=secret)
    if not body:
        return None
    try:
        return json.loads(body)
    except ValueError as exc:
        raise HttpFailure("status", f"{method} {url} answered with non-JSON: {exc}") from None


def call_bytes(
    method: str, url: str, payload: Any = None, *, timeout: float, secret: str | None = None
) -> bytes:
    """One request with a JSON body; the raw body of a 2xx answer, else raises HttpFailure
    (for answers too large to decode the usual way, such as SGLang's hidden states)."""
    data = None if payload is None else json.dumps(payload).encode()
    request = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    if secret:
        request.add_header("Authorization", f"Bearer {secret}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            body = response.read()
    except urllib.error.HTTPError as exc:
        detail = _error_detail(exc)
        raise HttpFailure(
            "status", f"{method} {url} answered {exc.code}: {detail}", exc.code
        ) from None
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, TimeoutError):
            raise HttpFailure("timeout", f"{method} {url} timed out after {timeout:g} s") from None
        raise HttpFailure("unavailable", f"{method} {url} failed: {exc.reason}") from None
    except TimeoutError:
        raise HttpFailure("timeout", f"{method} {url} timed out after {timeout:g} s") from None
    except (ConnectionError, http.client.HTTPException, OSError) as exc:
        raise HttpFailure("unavailable", f"{method} {url} failed: {exc}") from None
    return body


def _error_detail(exc: urllib.error.HTTPError) -> str:
    try:
        body = exc.read().decode(errors="replace")
    except Exception:
        return exc.reason or ""
    try:
        parsed = json.loads(body)
    except ValueError:
        return body[:500]
    if isinstance(parsed, dict) and "error" in parsed:
        return str(parsed["error"])
    return body[:500]
