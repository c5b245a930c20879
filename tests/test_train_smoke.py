"""The head-training pipeline end to end on tiny data (what CI can afford): prompts -> self-distillation ->
features -> training (with a kill and --resume) -> a head that loads and decodes losslessly -> LDLP."""

from __future__ import annotations

import json

import pytest
import torch

from drafttree.api import SpeculativeModel
from drafttree.errors import DraftTreeError
from drafttree.heads import load_head
from drafttree.train.data import extract_features, load_feature_dir, read_prompts, self_distill
from drafttree.train.head import TrainConfig, train_head

PROMPTS = [
    {"conversations": [{"from": "human", "value": "Write one sentence about the moon."},
                       {"from": "gpt", "value": "ignored"},
                       {"from": "human", "value": "Now one about the sun."}]},
    {"messages": [{"role": "user", "content": "List two fruits."}]},
    {"instruction": "Add the numbers.", "input": "2 and 3"},
    {"messages": [{"role": "user", "content": "Say hello in French."}]},
    {"messages": [{"role": "user", "content": "What is a prime number?"}]},
]


AUX = [2, 15, 27]  # EAGLE-3's default fused layers for the 30-layer default target


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory, default_fp32):
    d = tmp_path_factory.mktemp("pipe")
    (d / "prompts.jsonl").write_text("\n".join(json.dumps(p) for p in PROMPTS))
    prompts = read_prompts(d / "prompts.jsonl")
    assert len(prompts) == 5 and prompts[0]["messages"][1]["role"] == "assistant"
    stats = self_distill(default_fp32, prompts, d / "distill.jsonl", batch_size=4, max_new_tokens=24,
                         show_progress=False)
    assert stats["samples"] == 6  # 5 first turns + the second turn of the ShareGPT conversation
    again = self_distill(default_fp32, prompts, d / "distill.jsonl", batch_size=4, max_new_tokens=24,
                         show_progress=False)
    assert again["samples"] == 0, "a re-run resumes: finished turns are skipped"
    feats = extract_features(default_fp32, d / "distill.jsonl", d / "features", shard_size=4, show_progress=False,
                             aux_layers=AUX)
    assert feats["samples"] == 6 and feats["shards"] == 2
    return d


def test_features_match_the_target(pipeline, default_fp32):
    manifest, samples = load_feature_dir(pipeline / "features")
    assert manifest["target"]["hidden_size"] == default_fp32.config.hidden_size
    s = samples[0]
    with torch.no_grad():
        ref = default_fp32.model.base_model(s["input_ids"][None]).last_hidden_state[0]
    torch.testing.assert_close(s["hidden"].float(), ref, atol=0.05, rtol=0.02)  # stored in bf16
    with torch.no_grad():
        states = default_fp32.model.base_model(s["input_ids"][None], output_hidden_states=True).hidden_states
    h = ref.shape[-1]
    for k, layer in enumerate(AUX):  # the inputs of the fused layers, side by side
        torch.testing.assert_close(s["aux"][:, k * h:(k + 1) * h].float(), states[layer][0], atol=0.1, rtol=0.02)
    assert manifest["aux_layers"] == AUX
    assert s["loss_mask"].any() and not s["loss_mask"][0]


def test_corrupt_or_missing_shards_are_clear_errors(pipeline, tmp_path):
    import shutil

    bad = tmp_path / "f"
    shutil.copytree(pipeline / "features", bad)
    (bad / "shard-00001.safetensors").unlink()
    with pytest.raises(DraftTreeError, match="missing"):
        load_feature_dir(bad)
    shutil.rmtree(bad)
    shutil.copytree(pipeline / "features", bad)
    (bad / "shard-00000.safetensors").write_bytes(b"\x00" * 64)
    with pytest.raises(DraftTreeError, match="corrupt"):
        load_feature_dir(bad)
    with pytest.raises(DraftTreeError, match="no manifest"):
        load_feature_dir(tmp_path)


def test_bad_prompt_files(tmp_path):
    (tmp_path / "e.jsonl").write_text("")
    with pytest.raises(DraftTreeError, match="empty"):
        read_prompts(tmp_path / "e.jsonl")
    (tmp_path / "u.jsonl").write_text(json.dumps({"foo": 1}))
    with pytest.raises(DraftTreeError, match="unknown prompt format"):
        read_prompts(tmp_path / "u.jsonl")
    (tmp_path / "j.jsonl").write_text("{not json")
    with pytest.raises(DraftTreeError, match="not valid JSON"):
        read_prompts(tmp_path / "j.jsonl")
    with pytest.raises(DraftTreeError, match="not found"):
        read_prompts(tmp_path / "missing.jsonl")


def test_train_resume_and_decode(pipeline, default_fp32):
    out = pipeline / "run"
    cfg = TrainConfig(features=str(pipeline / "features"), out=str(out), epochs=2, batch_tokens=256,
                      draft_vocab=512, eval_samples=1, eval_every=0, save_every=1, ttt_steps=2, max_steps=2,
                      mixed_precision="no", warmup_steps=2)
    first = train_head(default_fp32, cfg, show_progress=False)
    assert first["steps"] == 2
    with pytest.raises(DraftTreeError, match="resume"):
        train_head(default_fp32, cfg, show_progress=False)
    cfg.max_steps = 4
    second = train_head(default_fp32, cfg, resume=True, show_progress=False)
    assert second["steps"] == 4, "resume continues from the checkpoint instead of starting over"
    head = load_head(out / "head", default_fp32)
    assert head.draft_vocab.numel() == 512
    # any head, even a barely trained one, must be lossless
    sm = SpeculativeModel(default_fp32, method="eagle2", head=head, total_tokens=10)
    prompt = "Write a short poem about rivers."
    ref = sm.generate(prompt, max_new_tokens=24, method="ar")
    for method in ("eagle2", "eagle1", "eagle-chain"):
        assert sm.generate(prompt, max_new_tokens=24, method=method).tokens == ref.tokens
    # and the AdaEAGLE length predictor trains on the same data
    from drafttree.heads.length import load_length_predictor
    from drafttree.train.length import train_length_predictor

    rep = train_length_predictor(default_fp32, head, str(pipeline / "features"), str(out / "head"), k_max=3,
                                 epochs=1, eval_samples=1, show_progress=False)
    assert sum(rep["label_hist"]) == rep["eval_positions"] > 0
    ldlp = load_length_predictor(out / "head", default_fp32.config.hidden_size)
    head = load_head(out / "head", default_fp32)
    sm2 = SpeculativeModel(default_fp32, method="eagle-chain-ldlp", head=head)
    for method in ("eagle-chain-ldlp", "eagle-chain-ldlp-threshold", "eagle2-ldlp", "eagle-chain-threshold"):
        assert sm2.generate(prompt, max_new_tokens=24, method=method).tokens == ref.tokens, method
    from drafttree.bench.oracle import oracle_drafter

    ids = sm2.encode_prompt(prompt)
    assert sm2.generate(ids, max_new_tokens=24, drafter=oracle_drafter(sm2, ids, 24)).tokens == ref.tokens
    assert ldlp.k_max == 3


def test_eagle3_head_trains_resumes_and_decodes_losslessly(pipeline, default_fp32):
    from drafttree.heads import Eagle3Head

    out = pipeline / "run3"
    cfg = TrainConfig(features=str(pipeline / "features"), out=str(out), epochs=2, batch_tokens=256,
                      draft_vocab=512, eval_samples=1, eval_every=0, save_every=1, ttt_steps=3, max_steps=2,
                      mixed_precision="no", warmup_steps=2, head_kind="eagle3")
    first = train_head(default_fp32, cfg, show_progress=False)
    cfg.max_steps = 3
    second = train_head(default_fp32, cfg, resume=True, show_progress=False)
    assert (first["steps"], second["steps"]) == (2, 3)
    assert len(second["eval"]["top1"]) == cfg.eval_depth
    # the last held-out score is recorded with what it cost, for `drafttree train-curves`
    from drafttree.train.curves import describe, run_points

    (pt,) = [p for p in run_points(out) if p["step"] == 3]
    assert pt["top1"] == second["eval"]["top1"][0] and 0 < pt["cpu_hours"] < 1
    assert describe(out) == "run3 (EAGLE-3, from scratch)"
    again = train_head(default_fp32, cfg, resume=True, show_progress=False)  # a finished run resumed: no new point
    assert again["eval"] == second["eval"] and [p["step"] for p in run_points(out)] == [2, 3]
    head = load_head(out / "head", default_fp32)
    assert isinstance(head, Eagle3Head) and head.aux_layers == AUX and head.draft_vocab.numel() == 512
    sm = SpeculativeModel(default_fp32, method="eagle2", head=head, total_tokens=10)
    prompt = "Write a short poem about rivers."
    ref = sm.generate(prompt, max_new_tokens=24, method="ar")
    for method in ("eagle2", "eagle1", "eagle-chain", "hybrid"):
        assert sm.generate(prompt, max_new_tokens=24, method=method).tokens == ref.tokens, method
    with pytest.raises(DraftTreeError, match="EAGLE-1/2 heads"):
        sm.generate(prompt, max_new_tokens=4, method="eagle-chain-ldlp")


def test_two_process_training_keeps_replicas_in_sync(pipeline):
    """`accelerate launch --num_processes 2 -m drafttree train` on CPU (gloo): gradients averaged, one head."""
    import subprocess
    import sys
    from pathlib import Path

    out = pipeline / "ddp"
    launcher = Path(sys.executable).parent / "accelerate"
    cmd = [str(launcher), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",  # gloo on CPU
           "--mixed_precision", "no", "--dynamo_backend", "no", "-m", "drafttree", "train",
           "--features", str(pipeline / "features"), "--out", str(out), "--dtype", "float32", "--epochs", "1",
           "--batch-tokens", "128", "--max-steps", "2", "--draft-vocab", "256", "--eval-samples", "1",
           "--eval-every", "0", "--mixed-precision", "no", "--head-kind", "eagle3", "--threads", "1",
           "--warmup-steps", "1", "--lr", "0.01"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["processes"] == 2 and summary["replicas_in_sync"] is True
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint", "head", "summary.json"]


def test_extra_features_train_but_are_never_held_out(pipeline, default_fp32, tmp_path, monkeypatch):
    import shutil

    import drafttree.train.head as head_mod

    extra = tmp_path / "extra"
    shutil.copytree(pipeline / "features", extra)
    seen = []
    real_split = head_mod.split_samples

    def spy(samples, *args):
        seen.append(len(samples))
        return real_split(samples, *args)

    monkeypatch.setattr(head_mod, "split_samples", spy)
    cfg = TrainConfig(features=str(pipeline / "features"), out=str(tmp_path / "run"), epochs=1, batch_tokens=256,
                      draft_vocab=512, eval_samples=1, eval_every=0, save_every=1, ttt_steps=1, max_steps=1,
                      mixed_precision="no", warmup_steps=1, extra_features=str(extra))
    summary = train_head(default_fp32, cfg, show_progress=False)
    assert seen == [6], "the held-out split sees the --features samples only"
    assert summary["eval_samples"] == 1 and summary["train_samples"] == 5 + 6 and summary["extra_samples"] == 6
    cfg.max_steps = 2  # a resume may run longer, but not on other data
    cfg.extra_features = ""
    with pytest.raises(DraftTreeError, match="extra-features"):
        train_head(default_fp32, cfg, resume=True, show_progress=False)
    cfg.extra_features = str(extra)
    assert train_head(default_fp32, cfg, resume=True, show_progress=False)["steps"] == 2
    manifest = json.loads((extra / "manifest.json").read_text())
    (extra / "manifest.json").write_text(json.dumps({**manifest, "aux_layers": None}))
    eagle3 = TrainConfig(**{**cfg.__dict__, "out": str(tmp_path / "run-e3"), "head_kind": "eagle3"})
    with pytest.raises(DraftTreeError, match="no aux-layer features"):
        train_head(default_fp32, eagle3, show_progress=False)
    manifest["target"]["vocab_size"] += 1
    (extra / "manifest.json").write_text(json.dumps(manifest))
    cfg.out = str(tmp_path / "run2")
    with pytest.raises(DraftTreeError, match="another target"):
        train_head(default_fp32, cfg, show_progress=False)


def test_held_out_split_can_be_kept_to_samples_an_earlier_head_never_saw():
    from drafttree.train.unroll import split_samples

    samples = [{"i": i} for i in range(50)]
    train, held = split_samples(samples, 4, seed=0)
    assert len(held) == 4 and len(train) == 46 and not {s["i"] for s in held} & {s["i"] for s in train}
    assert split_samples(samples, 4, seed=0)[1] == held, "the split is a function of the seed"
    train, held = split_samples(samples, 4, seed=0, eval_after=30)
    assert len(held) == 2 and all(s["i"] >= 30 for s in held)  # a tenth of the 20 candidates
    assert len(train) == 48 and all(s["i"] < 30 for s in train[:30])
    with pytest.raises(DraftTreeError, match="eval-after"):
        split_samples(samples, 4, seed=0, eval_after=50)


def test_training_continues_from_a_head_and_heads_compare_on_one_held_out_set(pipeline, default_fp32, capsys):
    """--init-head starts from a head's weights and draft vocabulary; eval-head scores heads side by side."""
    from drafttree.cli import main

    base = pipeline / "init-base"
    cfg = TrainConfig(features=str(pipeline / "features"), out=str(base), epochs=1, batch_tokens=256,
                      draft_vocab=300, eval_samples=1, eval_every=0, save_every=0, ttt_steps=2, max_steps=2,
                      mixed_precision="no", warmup_steps=1, lr=0.01)
    train_head(default_fp32, cfg, show_progress=False)
    first = load_head(base / "head", default_fp32)
    frozen = TrainConfig(**{**cfg.__dict__, "out": str(pipeline / "init-cont"), "init_head": str(base / "head"),
                            "draft_vocab": 8192, "lr": 1e-12, "max_steps": 1, "eval_after": 3})
    summary = train_head(default_fp32, frozen, show_progress=False)
    cont = load_head(pipeline / "init-cont" / "head", default_fp32)
    assert torch.equal(cont.draft_vocab, first.draft_vocab), "the init head's draft vocabulary is kept"
    for k, v in first.trainable_state().items():  # a step at lr 1e-12 leaves the weights where they started
        torch.testing.assert_close(cont.trainable_state()[k], v)
    assert summary["draft_vocab"] == 300 and summary["eval_samples"] == 1
    moved = TrainConfig(**{**frozen.__dict__, "out": str(pipeline / "init-moved"), "lr": 0.05})
    train_head(default_fp32, moved, show_progress=False)
    w = load_head(pipeline / "init-moved" / "head", default_fp32).trainable_state()["fc.weight"]
    assert not torch.equal(w, first.trainable_state()["fc.weight"]), "training from the init head trains it"
    wrong = TrainConfig(**{**frozen.__dict__, "out": str(pipeline / "init-wrong"), "head_kind": "eagle3"})
    with pytest.raises(DraftTreeError, match="not eagle3"):
        train_head(default_fp32, wrong, show_progress=False)

    capsys.readouterr()
    args = ["eval-head", "--features", str(pipeline / "features"), "--head", str(base / "head"), "--head",
            str(pipeline / "init-moved" / "head"), "--eval-samples", "1", "--eval-after", "3", "--depth", "2"]
    assert main(args) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["held_out_samples"] == 1 and len(rep["heads"]) == 2
    a, b = rep["heads"].values()
    assert a["positions"] == b["positions"] > 0 and len(a["top1"]) == 2
    capsys.readouterr()
    assert main(args[:-4] + ["--eval-after", "99"]) == 2  # a clear error, not a traceback
    assert "eval-after 99 leaves no sample" in capsys.readouterr().err


def test_held_out_evaluation_of_a_float32_head_over_a_bf16_target():
    """Training keeps the head in float32 while a bf16 target's LM-head rows score its drafts (a crash once)."""
    from conftest import tiny_causal_lm

    from drafttree.heads import EagleHead
    from drafttree.train.unroll import evaluate

    model = tiny_causal_lm(vocab=64, hidden=32, dtype=torch.bfloat16)
    head = EagleHead(model, draft_vocab=torch.arange(0, 64, 2)).float()
    torch.manual_seed(1)
    n = 12
    sample = {"input_ids": torch.randint(0, 64, (n,)), "loss_mask": torch.arange(n) >= 4,
              "hidden": torch.randn(n, 32, dtype=torch.bfloat16)}
    rep = evaluate(head, [sample], 2, 64, torch.device("cpu"), model.get_output_embeddings().weight)
    assert rep["positions"] > 0 and len(rep["top1"]) == 2


def test_held_out_checks_and_ldlp_labels_do_not_depend_on_the_batch():
    """Evaluation and LDLP labelling run many conversations per forward (right-padded): every check must be
    the one a conversation gets alone, padding included. Some conversations are the head's own chains (each
    feature is the head's prediction of it), so long accepted chains occur next to random misses."""
    from conftest import tiny_causal_lm

    from drafttree.heads import EagleHead
    from drafttree.train.length import make_labels
    from drafttree.train.unroll import collate, evaluate, unrolled_forward

    torch.manual_seed(3)
    model = tiny_causal_lm(vocab=64, hidden=32, dtype=torch.float32)
    head = EagleHead(model, draft_vocab=None).float().eval()
    lm_w = model.get_output_embeddings().weight
    samples = []
    for i, n in enumerate((9, 17, 12, 30, 5, 21)):
        s = {"input_ids": torch.randint(0, 64, (n,)), "loss_mask": torch.arange(n) >= 3, "hidden": torch.randn(n, 32)}
        if i % 2 == 0:
            with torch.no_grad():
                for t in range(n - 1):  # feature t+1 := the head's step-1 prediction from anchor t
                    ids, mask, valid, f, _ = collate([s], [0], 64)
                    s["hidden"][t + 1] = unrolled_forward(head, f, ids, mask, valid, 1, 0.0, train=False)[0][0][0, t]
        samples.append(s)
    cpu = torch.device("cpu")
    alone = evaluate(head, samples, 3, 64, cpu, lm_w, batch_tokens=1)
    together = evaluate(head, samples, 3, 64, cpu, lm_w, batch_tokens=4096)
    assert alone == together and alone["positions"] == sum(int(s["loss_mask"][1:].sum()) for s in samples)
    assert 0.1 < alone["chain_all_correct"][2] < 0.6  # the own-chain conversations: ~30% of the positions
    one = make_labels(head, samples, 4, 64, cpu, show_progress=False, batch_tokens=1)
    many = make_labels(head, samples, 4, 64, cpu, show_progress=False, batch_tokens=4096)
    # rows come out in length order either way; compare them as sets of (feature, label)
    key = lambda t: sorted(zip(t[1][:, 0].tolist(), t[2].tolist()))  # noqa: E731
    assert key(one) == key(many) and len(one[2]) == alone["positions"] and one[1].shape[1] == 32
    assert {0, 4} <= set(one[2].tolist()), "both misses and full chains"


def test_every_train_option_explains_itself():
    """`drafttree train --help` reads each option's text from TrainConfig: a new option without one fails here."""
    from dataclasses import fields

    from drafttree.train.head import TrainConfig

    missing = [f.name for f in fields(TrainConfig) if f.name not in ("features", "out") and not f.metadata.get("help")]
    assert not missing, f"TrainConfig options without help text: {missing}"


def test_train_curves_of_runs_from_before_runs_recorded_their_clock(tmp_path, capsys):
    """Old runs: points spread over the summary's seconds, threads given by the caller (or a clear error)."""
    from drafttree.cli import main

    run = tmp_path / "old"
    (run / "checkpoint").mkdir(parents=True)
    ev = {"top1": [0.3, 0.2], "chain_all_correct": [0.3, 0.1, 0.05], "expected_chain_tau": 1.4, "positions": 10}
    (run / "checkpoint" / "progress.json").write_text(json.dumps(
        {"step": 100, "history": [{"step": 50, "eval": {**ev, "top1": [0.2, 0.1]}}], "config": {}}))
    (run / "summary.json").write_text(json.dumps({"steps": 100, "train_seconds": 3600.0, "eval": ev}))
    assert main(["train-curves", str(run)]) != 0
    assert "--assume-threads" in capsys.readouterr().err
    assert main(["train-curves", str(run), "--assume-threads", "2"]) == 0
    out = capsys.readouterr().out
    assert "| old (EAGLE-1, from scratch) | 50 | 1.00 | 0.200 |" in out
    assert "| old (EAGLE-1, from scratch) | 100 | 2.00 | 0.300 | 0.050 | 1.400 |" in out


def test_sampled_distillation_reproduces_and_passes_the_cache_by_its_current_name():
    import warnings

    from conftest import tiny_causal_lm

    from drafttree.train.data import _sampled_answers

    model = tiny_causal_lm()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = _sampled_answers(model, [[2, 3, 4], [5, 6]], 6, 1, 1.0, 0, "cpu")
    again = _sampled_answers(model, [[2, 3, 4], [5, 6]], 6, 1, 1.0, 0, "cpu")
    assert first == again and len(first) == 2 and 0 < len(first[0]) <= 6
    assert not [w for w in caught if "past_key_values" in str(w.message)]


def test_a_time_budget_replans_the_last_step_from_the_measured_rate(monkeypatch):
    """--max-seconds: at 1 step/s and 100 s, the schedule ends near step 100; out of time, at the step reached."""
    import drafttree.train.head as head_mod

    now = [1000.0]
    monkeypatch.setattr(head_mod.time, "time", lambda: now[0])
    budget = head_mod._TimeBudget(100.0, step=5, n_proc=1, every=10)
    now[0] += 3
    assert budget.plan(8, 1000, 1000, "cpu") == 1000, "between planning points the plan stands"
    now[0] += 17  # 10 steps in 20 s: a slow start (warm-up) plans short
    assert budget.plan(15, 1000, 1000, "cpu") == 15 + 40
    now[0] += 5  # 10 more in 5 s: the plan grows again, past the last one
    assert budget.plan(25, 55, 1000, "cpu") == 25 + int(75 * 20 / 25)
    assert budget.plan(25, 55, 50, "cpu") == 50, "never beyond the steps the data or --max-steps allow"
    now[0] += 200
    assert budget.plan(35, 1000, 1000, "cpu") == 35, "out of time: the step reached is the last"
    with pytest.raises(DraftTreeError, match="max-seconds"):
        head_mod._TimeBudget(-1.0, step=0, n_proc=1)


def test_training_under_a_time_budget_stops_and_saves_its_head(pipeline, default_fp32):
    out = pipeline / "timed"
    cfg = TrainConfig(features=str(pipeline / "features"), out=str(out), epochs=50, batch_tokens=256,
                      draft_vocab=256, eval_samples=1, eval_every=0, save_every=0, ttt_steps=1,
                      mixed_precision="no", warmup_steps=1, max_seconds=1e-6)
    summary = train_head(default_fp32, cfg, show_progress=False)
    assert summary["steps"] == 10, "the first planning point finds the time spent and ends the run there"
    assert load_head(out / "head", default_fp32).draft_vocab.numel() == 256


def test_training_precision_auto_avoids_slow_bf16_products(monkeypatch):
    """``auto`` trains in float32 on a CPU whose bf16 products are slow, bf16 where they are fast or on a CUDA GPU
    with bf16 (float32 on one without);
    an explicit choice is kept and a bad one is a one-line error."""
    import drafttree.models as models_mod
    import drafttree.train.head as head_mod

    monkeypatch.setattr(models_mod, "cpu_has_fast_bf16", lambda: False)
    assert head_mod.training_precision("auto", torch.device("cpu")) == "no"
    assert head_mod.training_precision("bf16", torch.device("cpu")) == "bf16"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert head_mod.training_precision("auto", torch.device("cuda")) == "bf16"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)  # e.g. a V100 or T4
    assert head_mod.training_precision("auto", torch.device("cuda")) == "no"
    monkeypatch.setattr(models_mod, "cpu_has_fast_bf16", lambda: True)
    assert head_mod.training_precision("auto", torch.device("cpu")) == "bf16"
    assert head_mod.training_precision("no", torch.device("cpu")) == "no"
    with pytest.raises(DraftTreeError, match="mixed precision must be auto, bf16 or no"):
        head_mod.training_precision("fp8", torch.device("cpu"))
