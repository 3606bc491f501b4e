"""The llama-server command line of a measurement, the reason read from its log, and the
speculative flags of each measured setting (no server needed here)."""

from __future__ import annotations

from pathlib import Path

from specdraft.trainer.serve.llama_server import ServerOptions, failure_reason, server_command
from specdraft.trainer.serve.llama_settings import (
    ceiling_settings,
    draft_setting,
    ngram_settings,
    spec_type,
)


def test_the_server_binds_loopback_on_its_own_port_with_metrics_and_no_prompt_reuse():
    options = ServerOptions(Path("t.gguf"), threads=1, ctx_size=512, parallel=4, extra=("-x",))
    command = server_command(Path("/bin/llama-server"), options)
    flags = dict(zip(command[1::2], command[2::2], strict=False))
    assert flags["--host"] == "127.0.0.1" and flags["--port"] == "0"
    assert flags["-t"] == "1" and flags["-c"] == "512" and flags["-np"] == "4"
    assert "--metrics" in command and "--no-cache-prompt" in command
    assert command[-1] == "-x"
    # The key travels in the environment, never on the command line.
    secret = ServerOptions(Path("t.gguf"), api_key="k3y")
    assert "k3y" not in server_command(Path("s"), secret)


def test_the_failure_reason_is_llama_server_s_own_error_lines():
    # The shape of a log of llama-server build 11434 whose draft crashed at load.
    log = (
        "$ llama-server -m t.gguf -md d.gguf\n"
        "0.00.006.648 I srv  llama_server: initializing ...\n"
        "0.00.010.680 W srv  llama_server: security: no API key is set\n"
        "0.01.498.345 E llama_init_from_model: failed to initialize the context: dflash requires "
        "ctx_other to be set (this warning is normal during memory fitting)\n"
        "0.01.599.305 W operator(): failed to measure the memory of the extra model, fitting "
        "without it: failed to create llama_context from model\n"
        "system_info: n_threads = 1 | AVX = 1 | ...\n"
        "/src/ggml/src/ggml.c:2273: GGML_ASSERT(ggml_can_repeat(b, a)) failed\n"
        "0.01.700.000 E llama_model_load: error loading model: tensor 'x' has wrong shape\n"
        "#4  0x0000557ccef88568 in llm_graph_context::build_norm(...) const ()\n"
    )
    assert failure_reason(log).splitlines() == [
        "/src/ggml/src/ggml.c:2273: GGML_ASSERT(ggml_can_repeat(b, a)) failed",
        "llama_model_load: error loading model: tensor 'x' has wrong shape",
    ]
    # Without an error line, the log's last lines.
    assert failure_reason("0.0.0.1 I just\nsome\noutput\nhere") == "some\noutput\nhere"


def test_each_family_s_draft_flags():
    assert spec_type("dspark") == "draft-dspark"
    assert spec_type("dflash") == spec_type("dflash2") == "draft-dflash"
    setting = draft_setting("dspark", Path("d.gguf"), 8)
    assert setting.args == (
        "--spec-type",
        "draft-dspark",
        "-md",
        "d.gguf",
        "--spec-draft-n-max",
        "8",
    )


def test_n_gram_modes_draft_the_same_number_of_tokens_where_llama_cpp_has_a_flag():
    settings = {s.name: s.args for s in ngram_settings(5)}
    assert set(settings) == {"ngram-simple", "ngram-map-k", "ngram-mod", "ngram-cache"}
    assert settings["ngram-simple"][-2:] == ("--spec-ngram-simple-size-m", "5")
    assert settings["ngram-map-k"][-2:] == ("--spec-ngram-map-k-size-m", "5")
    assert "--spec-ngram-mod-n-max" in settings["ngram-mod"]
    assert settings["ngram-mod"][-2:] == ("--spec-ngram-mod-n-min", "5")
    assert settings["ngram-cache"] == ("--spec-type", "ngram-cache")


def test_the_ceiling_rows_hold_the_measured_and_the_full_acceptance():
    draft = draft_setting("dflash", Path("d.gguf"), 7)
    measured, full = ceiling_settings(draft, 2.5, 7)
    assert measured.synthetic and full.synthetic
    assert measured.args[: len(draft.args)] == draft.args
    assert measured.args[-2:] == ("--spec-synth-len", "2.500000")
    assert full.args[-2:] == ("--spec-synth-len", "8")
    # A measured acceptance outside llama.cpp's range [1, N + 1) leaves only the full row.
    assert [s.name for s in ceiling_settings(draft, None, 7)] == ["synth-full"]
    assert [s.name for s in ceiling_settings(draft, 8.0, 7)] == ["synth-full"]
