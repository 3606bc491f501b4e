"""The llama.cpp report: the acceptance table next to specdraft's estimate, a refused draft in
llama-server's words, and the tokens/s table with its ceiling rows (no server needed here)."""

from __future__ import annotations

import pytest

from specdraft.trainer.serve.llama_report import llama_served_lines, llama_speed_lines


def phase(tokens_per_s, prompts=4, parallel=1):
    return {
        "prompts": prompts,
        "parallel": parallel,
        "tokens": 400,
        "seconds": 400 / tokens_per_s,
        "tokens_per_s": tokens_per_s,
    }


def row(name, label, one, many, accept=None, identical=4, synthetic=False):
    return {
        "name": name,
        "label": label,
        "synthetic": synthetic,
        "batch1": phase(one),
        "batch": phase(many, parallel=2),
        "acceptance_length": accept,
        "acceptance_per_step": accept,
        "identical_batch1": identical,
        "identical_batch": identical,
    }


def result(**changes):
    base = {
        "engine": "llama.cpp",
        "build": 11434,
        "family": "dspark",
        "stage": "done",
        "error": None,
        "prompts": 4,
        "max_tokens": 100,
        "draft_tokens": 8,
        "threads": 1,
        "target_gguf": "/x/eval/target-gguf-ab/target-f32.gguf",
        "target_gguf_given": False,
        "logs": "/x/eval/llama.cpp",
        "specdraft": {
            "acceptance_length": 2.0,
            "per_position_given_previous": [0.5, 0.25],
            "steps": 150,
            "tokens": 300,
        },
        "llama_cpp": {
            "acceptance_length": 1.98,
            "steps": 151,
            "generated": 303,
            "prompts": 4,
            "per_step": {
                "acceptance_length": 2.01,
                "drafts": 148,
                "per_position_given_previous": [0.5, 0.26],
            },
        },
        "outputs_identical": True,
        "identical_outputs": 4,
        "matches_target_greedy": 4,
    }
    return {**base, **changes}


def test_the_acceptance_table_puts_llama_cpp_next_to_specdraft():
    lines = llama_served_lines(result())
    assert "dspark draft, llama.cpp build 11434 (8 draft tokens" in lines[0]
    assert "target-f32.gguf, 1 thread)" in lines[0]
    accept = next(line for line in lines if line.startswith("acceptance length"))
    assert accept.split()[-2:] == ["1.980", "2.000"]
    steps = next(line for line in lines if line.startswith("verification steps"))
    assert steps.split()[-2:] == ["151", "150"]
    tokens = next(line for line in lines if line.startswith("tokens after each first"))
    assert tokens.split()[-2:] == ["299", "300"]
    assert any("(148 drafts)" in line for line in lines)
    assert "llama.cpp 0.50 0.26" in " ".join(lines)
    assert lines[-1].startswith("greedy outputs with and without the draft: identical (4 of 4)")
    assert lines[-1].endswith("equals the HF target's on 4 of 4")


def test_a_given_target_gguf_is_named_where_the_hf_target_is_compared():
    lines = llama_served_lines(
        result(target_gguf="/m/q4.gguf", target_gguf_given=True, matches_target_greedy=1)
    )
    assert lines[-1].endswith("on 1 of 4 (target GGUF given: q4.gguf)")


def test_different_outputs_are_called_out():
    lines = llama_served_lines(result(outputs_identical=False, identical_outputs=3))
    assert "DIFFERENT (3 of 4)" in lines[-1]


def test_a_refused_draft_is_reported_in_llama_server_s_words():
    lines = llama_served_lines(
        result(stage="draft", error="llama_model_load: error loading model: x", log="/l/d.log")
    )
    assert lines[0] == (
        "llama.cpp build 11434 refused the dspark draft: llama_model_load: error loading model: x"
    )
    assert lines[1] == "(log: /l/d.log)"


def speed_result():
    settings = [
        row("none", "target alone", 100.0, 300.0, accept=1.0),
        row("draft", "dspark draft", 150.0, 330.0, accept=2.0),
        row("ngram-simple", "ngram-simple", 110.0, 290.0, accept=1.1, identical=3),
        row("synth-measured", "  at accept 2.01 (synth)", 155.0, 320.0, 2.0, 0, True),
        row("synth-full", "  at accept 9 (synth)", 400.0, 600.0, 8.9, 0, True),
    ]
    speed = {"parallel": 2, "prompts": 4, "draft_tokens": 8, "settings": settings}
    return result(speed=speed)


def test_the_speed_table_has_ratios_against_the_target_alone_at_each_batch():
    lines = llama_speed_lines(speed_result())
    assert lines[0].startswith("output tokens/s, llama.cpp build 11434, greedy, 100 new tokens")
    assert "batch 1 = 4 prompts one at a time, 2 slots = all 4 at once (-np 2)" in lines[0]
    header = lines[1].split()
    assert header[:4] == ["setting", "accept", "len", "batch"]
    draft = next(line for line in lines if line.startswith("dspark draft"))
    assert draft.split()[2:8] == ["2.000", "150.0", "1.50x", "330.0", "1.10x", "4/4,"]
    plain = next(line for line in lines if line.startswith("target alone"))
    assert plain.split()[2] == "-"  # no acceptance without speculation
    ngram = next(line for line in lines if line.startswith("ngram-simple"))
    assert "3/4, 3/4" in ngram
    synthetic = [line for line in lines if "(synth)" in line]
    assert len(synthetic) == 2
    assert all(line.endswith("(synthetic acceptance)") for line in synthetic)


def test_the_ceiling_rows_split_the_gap_into_quality_and_cost():
    lines = llama_speed_lines(speed_result())
    ceiling = next(line for line in lines if line.startswith("batch 1: the draft gives"))
    assert "gives 1.50x" in ceiling and "would give 4.00x" in ceiling
    assert "9 tokens per target step would be 9.00x" in ceiling
    random = next(line for line in lines if line.startswith("batch 1 at the draft's"))
    assert "1.55x" in random


@pytest.mark.parametrize("missing", ["synth-full", "draft"])
def test_no_ceiling_reading_without_its_rows(missing):
    data = speed_result()
    data["speed"]["settings"] = [s for s in data["speed"]["settings"] if s["name"] != missing]
    lines = llama_speed_lines(data)
    assert not any(line.startswith("batch 1: the draft gives") for line in lines)


def test_the_per_position_row_reads_the_step_trace_when_there_is_one():
    data = result()
    data["llama_cpp"]["per_position"] = {"per_position_given_previous": [0.5, 0.25]}
    assert "llama.cpp 0.50 0.25" in " ".join(llama_served_lines(data))


def test_a_batch_1_only_table_has_one_column_of_speeds():
    data = speed_result()
    data["speed"]["parallel"] = 1
    for setting in data["speed"]["settings"]:
        setting["batch"], setting["identical_batch"] = None, None
    lines = llama_speed_lines(data)
    assert lines[0].endswith("batch 1 = 4 prompts one at a time")
    assert "slots" not in lines[1]
    draft = next(line for line in lines if line.startswith("dspark draft"))
    assert draft.split()[2:] == ["2.000", "150.0", "1.50x", "4/4"]


def test_an_estimate_cut_to_fewer_draft_tokens_says_so():
    data = result(draft_tokens=1)
    data["specdraft"] = {
        "acceptance_length": 1.5,
        "per_position_given_previous": [0.5],
        "steps": 150,
        "block_acceptance_length": 2.0,
    }
    lines = llama_served_lines(data)
    tokens = next(line for line in lines if line.startswith("tokens after each first"))
    assert tokens.split()[-1] == "-"
    assert lines[-1] == (
        "specdraft's estimate is cut to the block's first 1 positions (the whole block: 2.000)"
    )
