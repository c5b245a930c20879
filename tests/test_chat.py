"""``drafttree chat``: every turn answered over the whole conversation, as one generation of it would be; commands,
a turn that cannot run, continued lines."""

from __future__ import annotations

import io

import pytest

from drafttree import SpeculativeModel
from drafttree.chat import chat_loop, read_turns
from drafttree.cli import main

KW = {"max_new_tokens": 10, "temperature": 0.0}


@pytest.fixture(scope="module")
def lm(default_fp32):
    return SpeculativeModel(default_fp32)  # method auto


def run(lm, turns, system=None):
    out, lines = io.StringIO(), []
    conv = chat_loop(lm, iter(turns), out.write, lines.append, system=system, **KW)
    return conv, out.getvalue(), lines


def test_each_turn_is_answered_over_the_conversation_so_far(lm):
    """Float32, T=0: each streamed answer is exactly what one generation over the conversation so far gives (the
    earlier answers go back into it), and what plain decoding gives."""
    conv, out, lines = run(lm, ["Name a colour.", "And another one?"], system="Answer briefly.")
    assert [m["role"] for m in conv] == ["system", "user", "assistant", "user", "assistant"]
    first = lm.generate(conv[:2], **KW)
    second = lm.generate(conv[:4], **KW)
    assert conv[2]["content"] == first.text and conv[4]["content"] == second.text
    assert lm.generate(conv[:4], method="ar", **KW).tokens == second.tokens
    assert out == first.text + "\n" + second.text + "\n"
    assert len(lines) == 2 and all("tok/s" in line and "tau" in line for line in lines)


def test_reset_help_and_exit(lm):
    conv, _, lines = run(lm, ["Name a colour.", "/help", "/reset", "Name a fruit.", "/exit", "never read"])
    assert [m["role"] for m in conv] == ["user", "assistant"] and conv[0]["content"] == "Name a fruit."
    assert conv[1]["content"] == lm.generate(conv[:1], **KW).text
    assert any("/reset" in line for line in lines) and "(new conversation)" in lines


def test_an_unknown_command_is_not_sent_to_the_model(lm):
    conv, out, lines = run(lm, ["/rest", "/usr/bin holds what?"])
    assert lines[0].startswith("unknown command /rest: /reset starts") and len(lines) == 2
    assert [m["content"] for m in conv if m["role"] == "user"] == ["/usr/bin holds what?"]  # a question is one


def test_a_turn_past_the_context_window_is_refused_and_the_conversation_kept(lm):
    huge = "word " * (lm.target.context_length + 10)
    conv, _, lines = run(lm, ["Name a colour.", huge, "And another one?"])
    assert [m["content"] for m in conv if m["role"] == "user"] == ["Name a colour.", "And another one?"]
    errors = [line for line in lines if line.startswith("drafttree: error:")]
    assert len(errors) == 1 and "context window" in errors[0] and "\n" not in errors[0]
    assert conv[3]["content"] == lm.generate(conv[:3], **KW).text


def test_read_turns_continues_lines_ending_with_a_backslash():
    lines = iter(["one \\", "two", "three", "four \\"])

    def read():
        try:
            return next(lines)
        except StopIteration:
            raise EOFError from None

    assert list(read_turns(read)) == ["one \ntwo", "three", "four "]


@pytest.mark.parametrize("argv,msg,code", [
    (["chat", "--max-new-tokens", "0"], "max-new-tokens", "argparse"),
    (["chat", "--temperature", "-1"], "temperature", 2),
    (["chat", "--system", " "], "--system is empty", 2),
    (["chat", "--method", "nope"], "unknown method", 2),
])
def test_chat_cli_errors_are_one_line(capsys, argv, msg, code):
    if code == "argparse":  # a bad value of a typed flag: argparse's own one-line usage error
        with pytest.raises(SystemExit):
            main(argv)
    else:
        assert main(argv) == code
    err = capsys.readouterr().err
    assert msg in err and "Traceback" not in err


def test_with_the_prefix_cache_later_turns_compute_only_what_is_new(lm, default_fp32):
    """``drafttree chat``'s default: the earlier turns' keys are kept; the answers are those without it, and the
    turn's line says how much of the conversation was cached."""
    cached = SpeculativeModel(default_fp32, prefix_cache=True)
    turns = ["Name a colour.", "And another one?", "Now a third."]
    conv, _, lines = run(cached, turns, system="Answer briefly.")
    plain, _, _ = run(lm, turns, system="Answer briefly.")
    assert conv == plain
    assert "cached" not in lines[0] and all("prompt tokens cached" in line for line in lines[1:])
