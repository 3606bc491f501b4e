"""The client of the embedded capture server: POST /capture, then check the reply."""

from __future__ import annotations

from ...runtime.http_client import HttpFailure, call_json
from ..wire.capture import (
    CaptureError,
    CaptureMismatch,
    CaptureRejected,
    CaptureReply,
    CaptureRequest,
    CaptureSpec,
    CaptureTimeout,
    CaptureUnavailable,
    ProtocolError,
    check_reply,
    reply_from_json,
    request_to_json,
)


class HttpCaptureClient:
    """A `CaptureClient` for one embedded capture server at `url` (sending the run's secret)."""

    def __init__(self, url: str, spec: CaptureSpec, *, secret: str | None = None) -> None:
        self.url = url.rstrip("/")
        self.spec = spec
        self._secret = secret

    def __repr__(self) -> str:
        return f"HttpCaptureClient({self.url!r})"

    def capture(self, request: CaptureRequest, *, timeout: float) -> CaptureReply:
        """Capture one prompt; the reply is checked against the request and the spec."""
        try:
            body = call_json(
                "POST",
                f"{self.url}/capture",
                request_to_json(request),
                timeout=timeout,
                secret=self._secret,
            )
        except HttpFailure as exc:
            raise http_capture_error(exc) from None
        try:
            reply = reply_from_json(body)
        except ProtocolError as exc:
            raise CaptureMismatch(f"{self.url}: {exc}") from None
        check_reply(reply, request, self.spec)
        return reply

    def health(self, *, timeout: float) -> bool:
        """True when GET /health answers 'ok' in time."""
        try:
            body = call_json("GET", f"{self.url}/health", timeout=timeout, secret=self._secret)
        except HttpFailure:
            return False
        return isinstance(body, dict) and body.get("status") == "ok"


def http_capture_error(exc: HttpFailure) -> CaptureError:
    """The CaptureError subclass for an HTTP failure (the producer may treat them apart)."""
    if exc.kind == "timeout":
        return CaptureTimeout(str(exc))
    if exc.kind == "unavailable":
        return CaptureUnavailable(str(exc))
    return CaptureRejected(str(exc))
