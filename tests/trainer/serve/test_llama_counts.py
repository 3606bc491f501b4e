"""llama-server's acceptance counts read from its answers' timings and its /metrics text (no
server needed here)."""

from __future__ import annotations

import pytest

from specdraft.trainer.serve.llama_counts import (
    acceptance_from_metrics,
    acceptance_from_timings,
    acceptance_length_within,
    count_identical,
    metrics_delta,
    parse_metrics,
    per_position_from_steps,
    steps_from_trace,
)

# The shape of llama-server's /metrics answer (server-task.cpp, to_metrics), abridged.
METRICS = """\
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 120
llamacpp:tokens_predicted_total 40
llamacpp:spec_decode_num_draft_tokens_total 70
llamacpp:spec_decode_num_accepted_tokens_total 20
llamacpp:spec_decode_num_drafts_total 10
llamacpp:predicted_tokens_seconds 12.5
# TYPE llamacpp:spec_decode_num_accepted_tokens_per_pos_total counter
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 8
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="1"} 6
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="2"} 3
"""


def response(generated, drafted=0, accepted=0):
    timings = {"prompt_n": 30, "predicted_n": generated}
    if drafted:  # llama-server leaves the draft keys out when nothing was drafted
        timings.update(draft_n=drafted, draft_n_accepted=accepted)
    return {"tokens": list(range(generated)), "timings": timings}


def test_acceptance_from_timings_counts_steps_after_each_prefill_token():
    # Two prompts of 10 and 5 generated tokens; 6 of the draft's tokens accepted in all.
    # Steps after the prefill token: (10 - 1) + (5 - 1) = 13 tokens in 13 - 6 = 7 steps.
    result = acceptance_from_timings([response(10, 14, 4), response(5, 7, 2)])
    assert result["prompts"] == 2 and result["generated"] == 15 and result["accepted"] == 6
    assert result["steps"] == 7
    assert result["acceptance_length"] == pytest.approx(13 / 7)


def test_without_a_draft_every_step_yields_one_token():
    result = acceptance_from_timings([response(8), response(3)])
    assert result["acceptance_length"] == 1.0
    assert result["draft_tokens"] == 0


def test_an_empty_answer_is_not_a_prompt():
    assert acceptance_from_timings([response(0)])["acceptance_length"] is None


def test_metrics_are_parsed_with_the_per_position_counter_as_a_list():
    parsed = parse_metrics(METRICS)
    assert parsed["spec_decode_num_drafts_total"] == 10
    assert parsed["prompt_tokens_total"] == 120
    assert parsed["spec_decode_num_accepted_tokens_per_pos_total"] == [8, 6, 3]


def test_acceptance_from_metrics_is_per_verification_step_and_position():
    before = parse_metrics(METRICS.replace(" 20\n", " 5\n").replace(" 10\n", " 4\n"))
    before["spec_decode_num_accepted_tokens_per_pos_total"] = [3, 2]
    delta = metrics_delta(before, parse_metrics(METRICS))
    assert delta["spec_decode_num_drafts_total"] == 6
    assert delta["spec_decode_num_accepted_tokens_per_pos_total"] == [5, 4, 3]
    result = acceptance_from_metrics(delta)
    assert result["acceptance_length"] == pytest.approx(1 + 15 / 6)
    assert result["per_position"] == pytest.approx([5 / 6, 4 / 6, 3 / 6])
    # Position k given position k - 1 accepted; the first against the drafts.
    assert result["per_position_given_previous"] == pytest.approx([5 / 6, 4 / 5, 3 / 4])


def test_no_drafts_give_no_acceptance():
    result = acceptance_from_metrics(parse_metrics("llamacpp:tokens_predicted_total 3\n"))
    assert result["acceptance_length"] is None and result["per_position"] == []


def test_identical_outputs_are_counted_prompt_by_prompt():
    assert count_identical([[1, 2], [3]], [[1, 2], [4]]) == 1
    with pytest.raises(ValueError):
        count_identical([[1]], [[1], [2]])


# The lines LLAMA_TRACE=1 adds to llama-server's log (server-context.cpp), around the others.
TRACE = """\
0.00.156.261 I slot launch_slot_: id  0 | task 0 | processing task, is_child = 0
0.00.160.001 I slot update_slots: id  0 | task 0 | accepted  1/ 2 draft tokens
0.00.164.836 I slot launch_slot_: id  0 | task 6 | processing task, is_child = 0
0.00.170.001 I slot update_slots: id  0 | task 6 | accepted  7/ 7 draft tokens
0.00.171.001 I slot update_slots: id  0 | task 6 | accepted  0/ 7 draft tokens
0.00.172.001 I slot update_slots: id  0 | task 6 | accepted  2/ 2 draft tokens
0.00.173.001 I slot update_slots: id  0 | task 6 | accepted  2/ 7 draft tokens (restore checkpoint)
0.00.180.836 I slot launch_slot_: id  0 | task 9 | processing task, is_child = 0
0.00.181.001 I slot update_slots: id  0 | task 9 | accepted  3/ 7 draft tokens
"""


def test_trace_steps_leave_out_the_warm_up_task_and_checkpoint_restores():
    steps = steps_from_trace(TRACE)
    assert steps == [(7, 7), (0, 7), (2, 2), (3, 7)]
    assert steps_from_trace(TRACE, skip_first_task=False)[0] == (1, 2)


def test_per_position_counts_a_position_only_where_it_was_drafted_and_reached():
    result = per_position_from_steps([(7, 7), (0, 7), (2, 2), (3, 7)], 7)
    # Position 0: four attempts, three accepted; position 2: the two-token draft never got there.
    assert result["attempts"] == [4, 3, 2, 2, 1, 1, 1]
    assert result["accepts"] == [3, 3, 2, 1, 1, 1, 1]
    assert result["per_position_given_previous"] == pytest.approx([0.75, 1, 1, 0.5, 1, 1, 1])


def test_acceptance_within_fewer_draft_tokens_sums_the_survival_rates():
    rates = [0.5, 0.5, 1.0, 0.2]
    assert acceptance_length_within(rates, 0) == 1.0
    assert acceptance_length_within(rates, 2) == pytest.approx(1 + 0.5 + 0.25)
    assert acceptance_length_within(rates, 4) == pytest.approx(1 + 0.5 + 0.25 + 0.25 + 0.05)
    assert acceptance_length_within(rates, 9) == acceptance_length_within(rates, 4)
