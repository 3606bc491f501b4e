"""Chat rendering and the assistant-only loss mask: exactly the assistant turns (with their
end-of-turn token, without the newline after it), for the Qwen format and other templates, and
truncation that only ever cuts the tail."""

from __future__ import annotations

import unicodedata

import pytest
from data_support import assistant_turns, masked_runs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specdraft.trainer.assets import tiny_assets_info
from specdraft.trainer.data import (
    ChatTemplate,
    ChatTemplateError,
    TemplateSpanError,
    assistant_char_spans,
    encodes_piecewise,
    render_chat,
    resolve_chat_template,
    tokenize_conversation,
)
from specdraft.trainer.data.chat_template import QWEN_CHAT_TEMPLATE

QWEN = ChatTemplate("qwen", QWEN_CHAT_TEMPLATE)

# A different format: markdown headers, <|endoftext|> ends a turn, blank line between turns.
HEADERS = ChatTemplate(
    "headers.jinja",
    "{% for m in messages %}### {{ m['role'] | capitalize }}:\n{{ m['content'] }}<|endoftext|>\n\n"
    "{% endfor %}{% if add_generation_prompt %}### Assistant:\n{% endif %}",
)

# Rewrites history: only the final turn carries a marker (as Qwen3 keeps reasoning only in the
# last turn), so a prefix rendering is not a prefix of the full rendering.
LAST_MARKED = ChatTemplate(
    "last-marked.jinja",
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if loop.last %}(final) {% endif %}"
    "{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
)

# Trims every content, as the Llama 3 template does.
TRIMMING = ChatTemplate(
    "trimming.jinja",
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] | trim }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
)

# Rewrites contents, so they cannot be located by markers: prefix renderings are used instead.
REWRITING = ChatTemplate(
    "rewriting.jinja",
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] | replace('a', 'A') }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
)

# The generation prompt opens an empty think block that finished turns do not have.
THINK_PROMPT = ChatTemplate(
    "think-prompt.jinja",
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n\n</think>\n\n"
    "{% endif %}",
)

_text = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="<|>"),
    max_size=40,
)


@st.composite
def conversations(draw):
    """Alternating user/assistant turns (optional system first), at least one assistant turn."""
    messages = []
    if draw(st.booleans()):
        messages.append({"role": "system", "content": draw(_text)})
    pairs = draw(st.integers(min_value=1, max_value=4))
    first = draw(st.sampled_from(["user", "assistant"]))
    roles = ["user", "assistant"] if first == "user" else ["assistant", "user"]
    for _ in range(pairs):
        for role in roles:
            messages.append({"role": role, "content": draw(_text)})
    if draw(st.booleans()) and messages[-1]["role"] == "assistant":
        messages.append({"role": "user", "content": draw(_text)})
    return messages


_fast = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_fast
@given(messages=conversations())
def test_qwen_mask_is_exactly_the_assistant_turns(tiny_tokenizer, messages):
    out = tokenize_conversation(messages, tiny_tokenizer, QWEN, max_length=100_000)
    assert not out.truncated
    assert masked_runs(tiny_tokenizer, out.input_ids, out.loss_mask) == assistant_turns(messages)
    # Nothing is lost or added: the ids decode to the rendered conversation.
    assert tiny_tokenizer.decode(out.input_ids) == _nfc_pieces(
        render_chat(QWEN, messages, tiny_tokenizer)
    )


@_fast
@given(messages=conversations())
def test_another_template_masks_its_own_end_of_turn_token(tiny_tokenizer, messages):
    out = tokenize_conversation(messages, tiny_tokenizer, HEADERS, max_length=100_000)
    expected = assistant_turns(messages, end_of_turn="<|endoftext|>")
    assert masked_runs(tiny_tokenizer, out.input_ids, out.loss_mask) == expected


@pytest.mark.parametrize("template", [LAST_MARKED, THINK_PROMPT], ids=lambda t: t.choice)
@_fast
@given(messages=conversations())
def test_templates_that_are_not_prefix_stable_still_mask_exactly_the_answers(
    tiny_tokenizer, template, messages
):
    out = tokenize_conversation(messages, tiny_tokenizer, template, max_length=100_000)
    runs = masked_runs(tiny_tokenizer, out.input_ids, out.loss_mask)
    assert runs == assistant_turns(messages)


@_fast
@given(messages=conversations())
def test_a_trimming_template_masks_the_trimmed_answers(tiny_tokenizer, messages):
    out = tokenize_conversation(messages, tiny_tokenizer, TRIMMING, max_length=100_000)
    trimmed = [{**m, "content": m["content"].strip()} for m in messages]
    runs = masked_runs(tiny_tokenizer, out.input_ids, out.loss_mask)
    assert runs == assistant_turns(trimmed)


@_fast
@given(messages=conversations())
def test_a_rewriting_template_falls_back_to_prefix_renderings(tiny_tokenizer, messages):
    out = tokenize_conversation(messages, tiny_tokenizer, REWRITING, max_length=100_000)
    rewritten = [{**m, "content": m["content"].replace("a", "A")} for m in messages]
    runs = masked_runs(tiny_tokenizer, out.input_ids, out.loss_mask)
    assert runs == assistant_turns(rewritten)


def test_a_template_that_rewrites_contents_and_history_is_refused(tiny_tokenizer):
    both = ChatTemplate(
        "both.jinja",
        "{% for m in messages %}{% if loop.last %}(final) {% endif %}"
        "{{ m['content'] | replace('a', 'A') }}<|im_end|>\n{% endfor %}",
    )
    messages = [
        {"role": "user", "content": "question"},
        {"role": "assistant", "content": "an answer"},
        {"role": "user", "content": "again"},
        {"role": "assistant", "content": "another"},
    ]
    with pytest.raises(TemplateSpanError, match=r"both\.jinja.*assistant turn 1.*'qwen'"):
        tokenize_conversation(messages, tiny_tokenizer, both, max_length=1000)


def test_end_of_turn_is_supervised_and_the_newline_after_it_is_not(tiny_tokenizer):
    info = tiny_assets_info()
    newline = tiny_tokenizer.encode("\n", add_special_tokens=False)
    messages = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello there"},
        {"role": "user", "content": "Bye"},
        {"role": "assistant", "content": "Goodbye"},
    ]
    out = tokenize_conversation(messages, tiny_tokenizer, QWEN, max_length=1000)
    ends = [i for i, t in enumerate(out.input_ids) if t == info.eos_token_id]
    assert len(ends) == 4  # every turn ends with <|im_end|>
    assert [out.loss_mask[i] for i in ends] == [0, 1, 0, 1]
    for i in ends[:-1]:
        assert out.input_ids[i + 1 : i + 1 + len(newline)] == newline
        assert out.loss_mask[i + 1] == 0
    # The assistant header is prompt: the first supervised token follows "assistant\n".
    first = out.loss_mask.index(1)
    assert tiny_tokenizer.decode(out.input_ids[:first]).endswith("<|im_start|>assistant\n")


@_fast
@given(messages=conversations(), max_length=st.integers(min_value=1, max_value=120))
def test_truncation_keeps_a_prefix_of_the_full_sample(tiny_tokenizer, messages, max_length):
    full = tokenize_conversation(messages, tiny_tokenizer, QWEN, max_length=100_000)
    cut = tokenize_conversation(messages, tiny_tokenizer, QWEN, max_length=max_length)
    assert len(cut.input_ids) == min(max_length, len(full.input_ids))
    assert cut.input_ids == full.input_ids[:max_length]
    assert cut.loss_mask == full.loss_mask[:max_length]
    assert cut.truncated == (len(full.input_ids) > max_length)


def test_template_choices_resolve_to_their_sources(tiny_tokenizer, tmp_path):
    assert resolve_chat_template("qwen", tiny_tokenizer).source == QWEN_CHAT_TEMPLATE
    own = resolve_chat_template("tokenizer", tiny_tokenizer)
    assert own.source == tiny_tokenizer.chat_template
    path = tmp_path / "t.jinja"
    path.write_text(HEADERS.source, encoding="utf-8")
    assert resolve_chat_template(str(path), tiny_tokenizer).source == HEADERS.source


def test_a_missing_template_file_names_the_field_and_the_choices(tiny_tokenizer, tmp_path):
    with pytest.raises(ChatTemplateError, match=r"data\.chat_template = .*nope\.jinja.*'qwen'"):
        resolve_chat_template(str(tmp_path / "nope.jinja"), tiny_tokenizer)


def test_a_tokenizer_without_a_template_says_what_to_set(tiny_tokenizer):
    bare = tiny_tokenizer.__class__(tokenizer_object=tiny_tokenizer.backend_tokenizer)
    bare.chat_template = None
    with pytest.raises(ChatTemplateError, match=r"carries no chat template.*'qwen'"):
        resolve_chat_template("tokenizer", bare, tokenizer_path="/models/x")


def _nfc_pieces(text: str) -> str:
    # The tokenizer normalises each piece it encodes to NFC; the pieces are split at the
    # special tokens, which NFC never changes, so NFC of the whole equals the joined pieces.
    return unicodedata.normalize("NFC", text)


@pytest.fixture(scope="module")
def word_marker_tokenizer():
    """A SentencePiece-style tokenizer (Metaspace word marker prepended to every text), as in
    Llama 2 and Mistral, with the Qwen chat template."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="always")
    bpe.decoder = decoders.Metaspace(prepend_scheme="always")
    corpus = ["user assistant hello there how are you fine thanks", "abcdefghijklmnopqrstuvwxyz"]
    trainer = trainers.BpeTrainer(vocab_size=120, special_tokens=["<unk>"])
    bpe.train_from_iterator(corpus * 20, trainer)
    bpe.add_special_tokens([AddedToken(t, special=True) for t in ("<|im_start|>", "<|im_end|>")])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>")
    tokenizer.chat_template = QWEN_CHAT_TEMPLATE
    return tokenizer


def test_byte_level_tokenizers_encode_piecewise_and_word_marker_ones_do_not(
    tiny_tokenizer, word_marker_tokenizer
):
    assert encodes_piecewise(tiny_tokenizer)
    assert not encodes_piecewise(word_marker_tokenizer)


@settings(max_examples=30, deadline=None)
@given(max_length=st.integers(min_value=1, max_value=200))
def test_word_marker_tokenizers_mask_tokens_that_start_in_an_answer(
    word_marker_tokenizer, max_length
):
    tokenizer = word_marker_tokenizer
    messages = [
        {"role": "user", "content": "hello there"},
        {"role": "assistant", "content": "fine thanks"},
        {"role": "user", "content": "how are you"},
        {"role": "assistant", "content": "hello how are you"},
    ]
    out = tokenize_conversation(messages, tokenizer, QWEN, max_length=max_length)
    text = render_chat(QWEN, messages, tokenizer)
    encoding = tokenizer.backend_tokenizer.encode(text, add_special_tokens=False)
    # The whole text is encoded once: no word marker is inserted at the span boundaries.
    assert out.input_ids == encoding.ids[:max_length]
    spans = list(assistant_char_spans(messages, tokenizer, QWEN, text))
    for token, supervised, (start, _) in zip(
        out.input_ids, out.loss_mask, encoding.offsets, strict=False
    ):
        inside = any(a <= start < b for a, b in spans)
        assert supervised == int(inside), tokenizer.convert_ids_to_tokens([token])
    end_of_turn = tokenizer.convert_tokens_to_ids("<|im_end|>")
    ends = [m for t, m in zip(out.input_ids, out.loss_mask, strict=True) if t == end_of_turn]
    assert ends == [0, 1, 0, 1][: len(ends)]
