"""Public API and CLI behaviour on the real default model: streaming, stopping, JSON output, bad input."""

from __future__ import annotations

import json

import pytest
import torch

from drafttree import DraftTreeError, SpeculativeModel
from drafttree.cli import main
from drafttree.models import resolve_reference

PROMPT = "Name three colours of the rainbow."


@pytest.fixture(scope="module")
def sm(default_fp32):
    return SpeculativeModel(default_fp32, method="lookup")


def test_stream_yields_the_same_tokens_as_generate(sm):
    full = sm.generate(PROMPT, max_new_tokens=40)
    s = sm.stream(PROMPT, max_new_tokens=40)
    chunks = list(s)
    assert [t for c in chunks for t in c.tokens] == full.tokens == s.result.tokens
    assert "".join(c.text for c in chunks) == full.text
    assert s.result.new_tokens == len(full.tokens) <= 40


def test_max_new_tokens_and_stats(sm):
    r = sm.generate(PROMPT, max_new_tokens=5, method="ar")
    assert r.new_tokens == 5 and r.target_forwards == 5 and r.tau == 1.0
    assert r.finish_reason == "length" and r.tokens_per_second > 0


def test_eos_ends_generation(sm):
    r = sm.generate("Reply with just the word: yes", max_new_tokens=64)
    assert r.finish_reason == "stop" and r.tokens[-1] in sm.eos_ids


def test_stop_strings(sm):
    r = sm.generate("Count from 1 to 20, separated by commas.", max_new_tokens=80, stop=["7"])
    assert r.finish_reason == "stop" and "7" not in r.text and "6" in r.text


def test_seeded_sampling_is_reproducible(sm):
    a = sm.generate(PROMPT, max_new_tokens=20, temperature=1.0, seed=3)
    b = sm.generate(PROMPT, max_new_tokens=20, temperature=1.0, seed=3)
    assert a.tokens == b.tokens


@pytest.mark.parametrize("kwargs,msg", [
    ({"max_new_tokens": 0}, "max_new_tokens"),
    ({"max_new_tokens": -3}, "max_new_tokens"),
    ({"temperature": -0.1}, "temperature"),
    ({"top_p": 0.0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"top_k": -1}, "top_k"),
    ({"method": "nope"}, "unknown method"),
    ({"method": "draft"}, "draft model"),
    ({"temperature": float("nan")}, "temperature must be a finite number"),
    ({"temperature": float("inf")}, "temperature must be a finite number"),
    ({"temperature": None}, "temperature must be a finite number"),
    ({"temperature": "hot"}, "temperature must be a finite number"),
    ({"temperature": 1e-40}, "temperature must be 0 .greedy. or at least"),
    ({"top_p": float("nan")}, "top_p"),
    ({"top_k": 1.5}, "top_k must be an integer"),
    ({"top_k": None}, "top_k must be an integer"),
    ({"seed": "abc"}, "seed must be an integer"),
])
def test_bad_generation_arguments(sm, kwargs, msg):
    with pytest.raises(DraftTreeError, match=msg):
        sm.generate(PROMPT, **{"max_new_tokens": 8, **kwargs})


def test_empty_and_too_long_prompts(sm):
    with pytest.raises(DraftTreeError, match="empty"):
        sm.generate("   ")
    with pytest.raises(DraftTreeError, match="messages"):
        sm.generate([{"content": "no role"}])
    too_long = torch.ones(sm.target.context_length + 5, dtype=torch.long)
    with pytest.raises(DraftTreeError, match="context window"):
        sm.generate(too_long)


@pytest.mark.parametrize("prompt,msg", [
    (torch.tensor([1, 2, 10**9]), r"token ids must be in \[0, "),
    (torch.tensor([-1, 5]), r"token ids must be in \[0, "),
    (torch.tensor([1.0, 2.0]), "must hold integers, got a float32 tensor"),
    (torch.ones(2, 3, dtype=torch.long), r"must be 1-D \(or \[1, n\]\), got shape \[2, 3\]"),
])
def test_bad_token_prompts_are_refused_before_any_forward(sm, prompt, msg):
    with pytest.raises(DraftTreeError, match=msg):
        sm.generate(prompt, max_new_tokens=4)
    with pytest.raises(DraftTreeError, match=msg):
        sm.generate([prompt, torch.tensor([1, 2])], max_new_tokens=4)


def test_token_prompts_in_every_accepted_shape_give_the_same_tokens(sm):
    ids = sm.encode_prompt(PROMPT).tolist()
    want = sm.generate(torch.tensor(ids), max_new_tokens=6).tokens
    assert sm.generate(ids, max_new_tokens=6).tokens == want  # a list of ints is one prompt, not a batch
    assert sm.generate(torch.tensor([ids]), max_new_tokens=6).tokens == want
    assert sm.generate(torch.tensor(ids, dtype=torch.int32), max_new_tokens=6).tokens == want


def test_seeds_beyond_64_bits_wrap_as_the_servers_do(sm):
    a = sm.generate(PROMPT, max_new_tokens=8, temperature=1.0, seed=5)
    b = sm.generate(PROMPT, max_new_tokens=8, temperature=1.0, seed=5 + 2**64)
    assert a.tokens == b.tokens
    outs = sm.generate([PROMPT, PROMPT], max_new_tokens=8, temperature=1.0, seed=2**64 - 1)  # row 1: seed 0
    assert outs[1].tokens == sm.generate(PROMPT, max_new_tokens=8, temperature=1.0, seed=0).tokens


def test_generate_keyword_arguments_for_one_prompt_or_a_batch(sm):
    with pytest.raises(DraftTreeError, match="record_rounds apply to one prompt"):
        sm.generate([PROMPT, "Hi."], max_new_tokens=4, record_rounds=True)
    one = sm.generate(PROMPT, max_new_tokens=4, max_batch=2)  # a batch of one
    assert one.tokens == sm.generate(PROMPT, max_new_tokens=4).tokens


def test_chat_template_errors_are_one_line(sm, monkeypatch):
    import jinja2

    def refuse(*a, **k):
        raise jinja2.exceptions.TemplateError("Conversation roles must alternate user/assistant/user/assistant")

    monkeypatch.setattr(sm.tokenizer, "apply_chat_template", refuse)
    with pytest.raises(DraftTreeError, match="chat template refused these messages: Conversation roles"):
        sm.generate([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}], max_new_tokens=4)


def test_model_references():
    with pytest.raises(DraftTreeError, match="unknown model"):
        resolve_reference("no-such-model")
    with pytest.raises(DraftTreeError, match="not found"):
        resolve_reference("/tmp/does/not/exist.gguf")
    assert resolve_reference("smollm2-135m-instruct")[0] == "gguf"


def test_unloadable_model_files_are_one_line_errors(tmp_path, monkeypatch):
    from drafttree.models import load_model

    monkeypatch.setenv("DRAFTTREE_CACHE", str(tmp_path / "cache"))
    arch = tmp_path / "arch"
    arch.mkdir()
    (arch / "config.json").write_text('{"model_type": "no_such_architecture_xyz"}')
    with pytest.raises(DraftTreeError, match="could not load model from") as e:
        load_model(str(arch), dtype="float32", device="cpu", show_progress=False)
    assert "\n" not in str(e.value)
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 64)  # the magic, then nothing a reader can use
    with pytest.raises(DraftTreeError, match="could not read the GGUF file"):
        load_model(str(bad), dtype="float32", device="cpu", show_progress=False)
    with pytest.raises(DraftTreeError, match="unknown device"):
        load_model(str(arch), device="gpu")


def test_draft_with_another_vocabulary_is_refused(default_fp32):
    from drafttree.models import LoadedModel, check_same_vocabulary

    class FakeTok:
        def get_vocab(self):
            return {"a": 0, "b": 1}

    other = LoadedModel(default_fp32.model, FakeTok(), "other", "")
    with pytest.raises(DraftTreeError, match="tokenizer"):
        check_same_vocabulary(default_fp32, other)


def _cli(capsys, *argv) -> tuple[int, str, str]:
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_cli_json_compare(capsys):
    rc, out, err = _cli(capsys, "generate", PROMPT, "--method", "lookup", "--dtype", "float32",
                        "--max-new-tokens", "16", "--json", "--compare")
    assert rc == 0, err
    d = json.loads(out)
    for key in ("text", "new_tokens", "tokens_per_second", "tau", "target_forwards",
                "baseline_tokens_per_second", "speedup", "identical"):
        assert key in d
    assert d["identical"] is True and d["new_tokens"] == 16


def test_cli_compare_when_sampling_gives_plain_samplings_text(capsys):
    """`--compare` at T > 0 without --seed runs both with one seed: the method's text is plain sampling's."""
    rc, out, err = _cli(capsys, "generate", PROMPT, "--method", "lookup", "--dtype", "float32", "--temperature", "1",
                        "--max-new-tokens", "16", "--json", "--compare")
    assert rc == 0, err
    assert json.loads(out)["identical"] is True


@pytest.mark.parametrize("argv,msg", [
    (["generate", "hi", "--method", "nope"], "unknown method"),
    (["generate", ""], "empty prompt"),
    (["generate", "hi", "--max-new-tokens", "0"], "max-new-tokens"),
    (["generate", "hi", "--temperature", "-1"], "temperature"),
    (["generate", "hi", "--top-p", "0"], "top_p"),
    (["generate", "hi", "--model", "nonexistent-model-xyz"], "unknown model"),
    (["generate", "hi", "--model", "/nope/m.gguf"], "not found"),
    (["generate", "hi", "--method", "draft", "--dtype", "float32"], "draft model"),
    (["generate", "hi", "--method", "lookup", "--depth", "3"], "option 'depth' does not apply to method 'lookup'"),
    (["generate", "hi", "--method", "eagle2", "--total-tokens", "many"], "total_tokens must be an integer or auto"),
    (["generate", "hi", "--method", "eagle-chain", "--k", "0"], "k (depth) must be >= 1"),
    (["generate", "hi", "--temperature", "nan"], "temperature must be a finite number"),
    (["generate", "hi", "--device", "gpu"], "unknown device 'gpu'"),
    (["generate", "hi", "--method", "ar", "--head", "/no/such/head"], "head not found: /no/such/head"),
    (["generate", "hi", "--method", "lookup", "--head", "."], "method 'lookup' does not use an EAGLE head"),
    (["generate", "hi", "--depth", "0"], "depth must be >= 1"),  # auto's options are checked before loading too
    (["generate", "hi", "--tokens"], "--tokens needs --json"),
    (["generate", "hi", "--stream", "--json"], "pick one"),
    (["generate", "hi", "--device", "meta"], "device 'meta' cannot run a model here"),
    (["generate", "caf\udce9 hi"], "not valid Unicode text"),  # bytes that are not UTF-8 in the command line
    (["bench", "--quick", "--out", "/etc/passwd"], "not a directory"),
])
def test_cli_errors_are_one_line(capsys, argv, msg):
    rc, out, err = _cli(capsys, *argv)
    assert rc == 2
    assert msg in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_cli_calibrate_prints_the_cached_curve(capsys):
    rc, out, err = _cli(capsys, "calibrate", "--dtype", "float32")
    assert rc == 0, err
    lines = out.splitlines()
    floor = next(i for i, line in enumerate(lines) if line.startswith("bandwidth floor of one forward"))
    rows = [line.split() for line in lines[2:floor]]
    # then the cost per token of context (each verified token attends to all of it), measured with the curve
    assert lines[floor + 1:] == [] or "per 1,000 tokens" in lines[floor + 1]
    sizes = [int(r[0]) for r in rows]
    assert sizes[0] == 1 and sizes == sorted(sizes) and len(sizes) >= 6
    assert [float(r[2]) for r in rows][0] == 1.0
    assert out.split(": ", 1)[1].splitlines()[0].endswith(".json")


def test_verbose_summary_of_rounds_with_numbers_and_lists(capsys):
    """`generate --verbose` (what `make demo` prints): numeric per-round notes are averaged, lists (the sources behind
    each tree) counted."""
    from types import SimpleNamespace

    from drafttree.cli import _print_verbose
    from drafttree.decode import DecodeStats

    st = DecodeStats(wall_time=1.0, tree_sizes=[3, 1], accept_lengths=[2, 1],
                     rounds=[{"depth": 2, "sources": ["head", "ngram"]}, {"depth": 0, "sources": []}])
    _print_verbose(SimpleNamespace(stats=st))
    err = capsys.readouterr().err
    assert "depth mean 1.00 (first 2, last 0)" in err and "sources head 1, ngram 1" in err


@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")  # inside inductor
def test_compiled_forward_is_timed_beside_ours():
    """`calibrate --compare-compile`: an untouched copy of the model, compiled over a static cache, timed at every
    size next to our path over the same context."""
    import copy

    from conftest import tiny_causal_lm

    from drafttree.bench.compiled import compiled_vs_ours
    from drafttree.target import TargetModel

    model = tiny_causal_lm()
    stock = copy.deepcopy(model)
    curves = compiled_vs_ours(TargetModel(model), stock, context=16, sizes=(1, 3), reps=2)
    assert set(curves) == {"ours", "compiled"}
    for c in curves.values():
        assert c.sizes == [1, 3] and c.context == 16 and all(s > 0 for s in c.seconds)


def test_cli_calibrate_rejects_bad_compile_sizes(capsys):
    rc, out, err = _cli(capsys, "calibrate", "--dtype", "float32", "--compare-compile", "--compile-sizes", "0,4")
    assert rc != 0 and "--compile-sizes takes token counts >= 1" in err


@pytest.mark.parametrize("value", ["0", "-1", "two"])
def test_cli_thread_counts_must_be_positive(capsys, value):
    with pytest.raises(SystemExit) as e:
        main(["generate", "hi", "--threads", value])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "argument --threads: must be" in err and "Traceback" not in err


def _close_to_reference(entries, ref, top: int) -> None:
    """Each entry's log-probability and alternatives against ``ref`` (log-softmax rows of an independent forward)."""
    for e, row in zip(entries, ref):
        assert abs(e.logprob - row[e.token].item()) < 1e-3
        assert len(e.top) == top
        assert all(abs(lp - v) < 1e-3 for (_, lp), v in zip(e.top, row.topk(top).values.tolist()))
        assert all(abs(lp - row[t].item()) < 1e-3 for t, lp in e.top)


def test_logprobs_are_the_targets_own_for_every_method_and_path(sm):
    ids = sm.encode_prompt(PROMPT)
    r = sm.generate(PROMPT, max_new_tokens=12, logprobs=3)  # lookup trees
    assert len(r.logprobs) == len(r.tokens) == 12 and [e.token for e in r.logprobs] == r.tokens
    with torch.no_grad():  # the reference: one plain forward of the stock model over the prompt and the answer
        full = torch.cat([ids, torch.tensor(r.tokens[:-1])])[None]
        ref = torch.log_softmax(sm.target.model(full).logits[0, ids.numel() - 1:].float(), dim=-1)
    _close_to_reference(r.logprobs, ref, 3)
    plain = sm.generate(PROMPT, max_new_tokens=12, logprobs=3, method="ar")
    assert plain.tokens == r.tokens
    _close_to_reference(plain.logprobs, ref, 3)
    s = sm.stream(PROMPT, max_new_tokens=12, logprobs=0)  # each chunk carries its own tokens' entries
    chunks = list(s)
    assert [e.token for c in chunks for e in c.logprobs] == [t for c in chunks for t in c.tokens] == r.tokens
    assert all(e.top == [] for c in chunks for e in c.logprobs)
    outs = sm.generate([PROMPT, "Hi."], max_new_tokens=6, logprobs=2)  # the batch decoder's rows
    assert outs[0].tokens == r.tokens[:6]
    _close_to_reference(outs[0].logprobs, ref[:6], 2)
    assert len(outs[1].logprobs) == len(outs[1].tokens)
    off = sm.generate(PROMPT, max_new_tokens=4)
    assert off.logprobs is None and "logprobs" not in off.to_dict()
    assert len(r.to_dict()["logprobs"]) == 12
    for bad in (21, -1, 1.5, True):
        with pytest.raises(DraftTreeError, match="logprobs must be an integer in 0..20"):
            sm.generate(PROMPT, max_new_tokens=4, logprobs=bad)


def test_ignore_eos_runs_past_the_end_token_and_stays_lossless(sm):
    """vLLM's ignore_eos (benchmark clients send it): the end-of-sequence token no longer ends the generation; every
    method still gives plain decoding's tokens, alone and in a batch."""
    short = "Reply with just the word: yes"
    natural = sm.generate(short, max_new_tokens=64, method="ar")
    assert natural.finish_reason == "stop" and natural.tokens[-1] in sm.eos_ids
    n = len(natural.tokens) + 16
    plain = sm.generate(short, max_new_tokens=n, method="ar", ignore_eos=True)
    assert plain.finish_reason == "length" and len(plain.tokens) == n
    assert plain.tokens[: len(natural.tokens)] == natural.tokens
    assert sm.generate(short, max_new_tokens=n, ignore_eos=True).tokens == plain.tokens
    s = sm.stream(short, max_new_tokens=n, ignore_eos=True)
    assert [t for c in s for t in c.tokens] == plain.tokens
    both = sm.generate([short, PROMPT], max_new_tokens=n, ignore_eos=True)
    assert both[0].tokens == plain.tokens
    assert both[1].tokens == sm.generate(PROMPT, max_new_tokens=n, method="ar", ignore_eos=True).tokens


def test_stop_token_ids_end_at_the_first_such_token(sm):
    natural = sm.generate(PROMPT, max_new_tokens=30, method="ar")
    t = natural.tokens[4]
    first = natural.tokens.index(t)
    for kw in ({}, {"method": "ar"}):
        r = sm.generate(PROMPT, max_new_tokens=30, stop_token_ids=[t], **kw)
        assert r.finish_reason == "stop" and r.tokens == natural.tokens[: first + 1]
        # as vLLM: the stop token counts, its text is dropped unless include_stop
        assert r.text == sm.tokenizer.decode(r.tokens[:-1], skip_special_tokens=True)
        kept = sm.generate(PROMPT, max_new_tokens=30, stop_token_ids=[t], include_stop=True, **kw)
        assert kept.tokens == r.tokens and kept.text == sm.tokenizer.decode(r.tokens, skip_special_tokens=True)
        s = sm.stream(PROMPT, max_new_tokens=30, stop_token_ids=[t], **kw)
        assert "".join(c.text for c in s) == r.text
    assert sm.generate(PROMPT, max_new_tokens=30, stop_token_ids=t).tokens == natural.tokens[: first + 1]
    batch = sm.generate([PROMPT, PROMPT], max_new_tokens=30, stop_token_ids=[t])
    assert [b.tokens for b in batch] == [natural.tokens[: first + 1]] * 2


def test_include_stop_keeps_the_stop_string(sm):
    prompt = "Count from 1 to 20, separated by commas."
    full = sm.generate(prompt, max_new_tokens=80, method="ar").text
    cut = full.index("7")
    for kw in ({}, {"method": "ar"}):
        r = sm.generate(prompt, max_new_tokens=80, stop=["7"], include_stop=True, **kw)
        assert r.finish_reason == "stop" and r.text == full[: cut + 1]
        assert sm.tokenizer.decode(r.tokens, skip_special_tokens=True).startswith(r.text)
        s = sm.stream(prompt, max_new_tokens=80, stop="7", include_stop=True, **kw)
        assert "".join(c.text for c in s) == r.text and s.result.tokens == r.tokens
    assert sm.generate(prompt, max_new_tokens=80, stop=["7"]).text == full[:cut]


@pytest.mark.parametrize("kwargs", [{"stop_token_ids": [-1]}, {"stop_token_ids": [10**9]}, {"stop_token_ids": ["a"]},
                                    {"stop_token_ids": [True]}, {"ignore_eos": "yes"}])
def test_bad_end_tokens_are_one_line_errors(sm, kwargs):
    with pytest.raises(DraftTreeError) as e:
        sm.generate(PROMPT, max_new_tokens=4, **kwargs)
    assert "\n" not in str(e.value)
    with pytest.raises(DraftTreeError):
        sm.generate([PROMPT, PROMPT], max_new_tokens=4, **kwargs)


def test_stop_strings_wait_for_min_tokens(sm):
    """As vLLM: a stop string counts only once more than min_tokens tokens are out."""
    prompt = "Count from 1 to 20, separated by commas."
    early = sm.generate(prompt, max_new_tokens=60, method="ar", stop=["1"])
    assert early.finish_reason == "stop" and len(early.tokens) < 10
    for kw in ({"method": "ar"}, {}):
        late = sm.generate(prompt, max_new_tokens=60, stop=["1"], min_tokens=10, **kw)
        assert len(late.tokens) > 10 and late.finish_reason == "stop", kw
    with pytest.raises(DraftTreeError, match="min_tokens"):
        sm.generate(prompt, max_new_tokens=5, min_tokens=6)


def test_the_processs_first_load_freezes_its_objects_and_later_loads_do_not(monkeypatch, default_fp32):
    import gc

    from drafttree import api

    monkeypatch.setattr(api, "load_model", lambda *a, **k: default_fp32)
    monkeypatch.setattr(api, "_frozen", False)
    gc.unfreeze()
    try:
        SpeculativeModel.from_pretrained(method="lookup", head=None, freeze_gc=False)
        assert gc.get_freeze_count() == 0 and not api._frozen
        SpeculativeModel.from_pretrained(method="lookup", head=None)
        frozen = gc.get_freeze_count()
        assert api._frozen and frozen > 1000, "the import-time objects are frozen"
        keep = [[i] for i in range(5000)]  # objects made after the first load stay collectable
        SpeculativeModel.from_pretrained(method="lookup", head=None)
        assert gc.get_freeze_count() == frozen and keep
    finally:
        gc.unfreeze()
