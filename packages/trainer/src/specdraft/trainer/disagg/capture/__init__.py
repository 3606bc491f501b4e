"""Capture: turning a prompt into target features in the feature store.

The embedded capture server (`server`, on a transformers target loaded by `target`) is what
`python -m specdraft.trainer.disagg.capture` and `specdraft serve-capture` run; it is not
imported here, so a producer that only talks to capture servers never loads transformers. The
producer's side is a `wire.CaptureClient`: `HttpCaptureClient` for the embedded server,
`SGLangCaptureClient` for an SGLang server, which `sglang_launcher` starts with the flags the
installed SGLang accepts.
"""

from .client import HttpCaptureClient
from .sglang_client import SGLangCaptureClient
from .sglang_launcher import ManagedSGLang, sglang_command

__all__ = ["HttpCaptureClient", "ManagedSGLang", "SGLangCaptureClient", "sglang_command"]
