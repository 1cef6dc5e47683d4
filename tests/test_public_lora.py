"""The public start (``train.init = "public"``) and LoRA adapters (``model.adapters = "lora"``), through the real
code path: the real corpus split, the real pretraining and cache, real ``peft`` adapters in real in-process runs."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from helpers import Crash, crash_at, jsonl, tiny_config

from trustformer.app import client_app
from trustformer.cli import main
from trustformer.config import ConfigError, load_config
from trustformer.data.batching import encode_pairs
from trustformer.engine.inprocess import run_in_process
from trustformer.export import load_translation_model, select_model
from trustformer.models.adapters import LORA_MODULES, add_lora, merged
from trustformer.models.transformer import Seq2SeqTransformer, TransformerConfig
from trustformer.runtime.checkpoint import read_checkpoint, resume_config
from trustformer.tasks import public as pub
from trustformer.tasks import translation_workload as wl
from trustformer.tasks.run import initial_tensors, load_task
from trustformer.wire import payload_bytes

torch.set_num_threads(1)  # the tiny preset's runtime.threads, also outside run_in_process

PUBLIC = {
    "train.init": "public",
    "train.public_epochs": 1,
    "runtime.progress": False,
    "eval.meteor": False,
    "eval.bertscore": False,
    "eval.bleu_size": 4,
    "eval.beam_size": 1,
}
LORA = {**PUBLIC, "model.adapters": "lora", "model.lora_rank": 4, "model.lora_alpha": 8.0}


tiny = tiny_config


# ------------------------------------------------------------------------------ configuration


def test_config_refuses_what_does_not_compose_naming_the_option():
    with pytest.raises(ConfigError, match=r"model.adapters = 'lora' needs train.init = 'public'"):
        tiny(**{"model.adapters": "lora"})
    with pytest.raises(ConfigError, match=r"model.adapters = 'lora' applies to task = 'translation' only"):
        load_config("tiny", None, {"task": "image-classification", "model.adapters": "lora", "train.init": "scratch"})
    with pytest.raises(ConfigError, match=r"train.init = 'public' applies to task = 'translation' only"):
        load_config("tiny", None, {"task": "segmentation", "train.init": "public"})
    with pytest.raises(ConfigError, match=r"train.public_data = .* applies only with train.init = 'public'"):
        tiny(**{"train.public_data": "pairs.tsv"})
    with pytest.raises(ConfigError, match=r"model.lora_targets"):
        tiny(**{**LORA, "model.lora_targets": ["attention", "norms"]})
    assert tiny().train.init == "scratch" and tiny().model.adapters == "none"  # the demo's defaults


# ------------------------------------------------------------------------------ the public model


def _private(workload: wl.Workload) -> set[str]:
    """Every sentence of the clients' data and of the test set, read from the workload's own accessors."""
    pairs = [p for c in range(len(workload.splits.clients)) for p in workload.shard(c) + workload.own_test(c)]
    return {side for pair in pairs + list(workload.splits.test) for side in pair}


def test_public_pairs_never_hold_a_client_sentence(tmp_path):
    cfg = tiny(**{**PUBLIC, "data.partition": "domain", "data.own_test_size": 10})
    workload = wl.load_workload(cfg)
    pairs, _ = pub.public_pairs(cfg, workload)
    assert len(pairs) > 1000
    assert not {side for pair in pairs for side in pair} & _private(workload)
    # a public file that holds client pairs, test pairs and pairs of its own: only its own are kept
    leaked = workload.shard(0)[:5] + workload.own_test(1)[:3] + list(workload.splits.test[:2])
    # the same sentences in other case and punctuation are the same sentences
    leaked += [(f"  {a.upper()} !", "x") for a, _ in workload.shard(2)[:2]] + [
        ("y", f"{b.lower()}...") for _, b in workload.splits.test[2:4]
    ]
    own = [
        ("Совершенно новое предложение номер один.", "A brand new sentence number one."),
        ("Ещё одно новое предложение.", "Yet another new sentence."),
    ]
    path = tmp_path / "public.tsv"
    path.write_text("".join(f"{a}\t{b}\n" for a, b in leaked + own), encoding="utf-8")
    cfg = tiny(**{**PUBLIC, "data.partition": "domain", "data.own_test_size": 10, "train.public_data": str(path)})
    pairs, dropped = pub.public_pairs(cfg, workload)
    assert pairs == own and dropped == len(leaked)


def test_public_model_is_trained_once_cached_and_every_client_starts_from_it(tmp_path):
    cfg = tiny(tmp_path / "run", **PUBLIC)
    task = load_task(cfg)
    first = task.public()
    folder = Path(first.report["path"])
    shutil.rmtree(folder)  # this test's own cache entry: trained now, from nothing
    pub._loaded.clear()
    first = task.public()
    assert first.report["cached"] is False and (folder / "model.pt").is_file()
    stamp = (folder / "model.pt").stat().st_mtime_ns
    pub._loaded.clear()  # a new process: from the cache, not trained again
    again = task.public()
    assert again.report["cached"] is True and (folder / "model.pt").stat().st_mtime_ns == stamp
    assert again.report["key"] == first.report["key"]
    assert all(torch.equal(again.state[n], first.state[n]) for n in first.state)
    assert {"test_loss", "bleu", "pairs", "train_s"} <= set(again.report)
    # every client, every protocol and training alone start from it; from scratch is another model
    start = initial_tensors(cfg)
    assert all(torch.equal(start[n].cpu(), first.state[n]) for n in start)
    scratch = initial_tensors(tiny(tmp_path / "run"))
    assert not torch.equal(scratch["embedding.weight"].cpu(), first.state["embedding.weight"])
    # the key follows its data and its own recipe: another public recipe or other pairs are another model; the
    # federated run's recipe (train.*) is not its recipe, so a sweep of it keeps the same start
    workload = wl.load_workload(cfg)
    encoded = encode_pairs(pub.public_pairs(cfg, workload)[0], workload.tokenizer, max_len=cfg.model.max_len)
    assert pub.cache_key(cfg, workload, encoded) == first.report["key"]
    swept = tiny(**{**PUBLIC, "train.lr": 1e-3, "train.batch_tokens": 80, "train.warmup_steps": 9})
    assert pub.cache_key(swept, workload, encoded) == first.report["key"]
    assert pub.public_recipe(swept) == pub.public_recipe(cfg)
    assert pub.cache_key(tiny(**{**PUBLIC, "train.public_lr": 1e-3}), workload, encoded) != first.report["key"]
    assert pub.cache_key(tiny(**{**PUBLIC, "train.public_epochs": 2}), workload, encoded) != first.report["key"]
    assert pub.cache_key(cfg, workload, encoded[1:]) != first.report["key"]


# ------------------------------------------------------------------------------ adapters


def test_merged_model_computes_what_the_adapted_one_does_embedding_included():
    config = TransformerConfig(
        vocab_size=50,
        pad_id=0,
        bos_id=1,
        eos_id=2,
        d_model=16,
        n_heads=2,
        n_encoder_layers=1,
        n_decoder_layers=1,
        d_ff=32,
        max_len=12,
        dropout=0.0,
    )
    torch.manual_seed(0)
    model = add_lora(
        Seq2SeqTransformer(config), rank=2, alpha=4.0, dropout=0.0, targets=("attention", "ffn", "embedding"), seed=1
    )
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_" in n for n in trainable)
    with torch.no_grad():  # lora_B starts at zero: give every adapter an update
        for _name, p in model.named_parameters():
            if p.requires_grad:
                p.normal_(0.0, 0.3)
    src, tgt = torch.randint(3, 50, (3, 7)), torch.randint(3, 50, (3, 6))
    plain = merged(model)
    assert isinstance(plain, Seq2SeqTransformer)
    assert set(plain.state_dict()) == set(Seq2SeqTransformer(config).state_dict())
    with torch.no_grad():
        assert torch.allclose(model.eval()(src, tgt), plain.eval()(src, tgt), atol=1e-4)


def _expected_adapter_numel(cfg) -> int:
    """r·(in + out) for every adapted layer of the model's sizes (q/k/v/out of every attention, fc1/fc2)."""
    m, r = cfg.model, cfg.model.lora_rank
    attention = 4 * r * 2 * m.d_model
    ffn = r * (m.d_model + m.d_ff) * 2
    return m.n_encoder_layers * (attention + ffn) + m.n_decoder_layers * (2 * attention + ffn)


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    """A tiny FedAvg run over LoRA adapters, every reply kept (the bytes it counted, the payloads it sent)."""
    out = tmp_path_factory.mktemp("lora") / "fedavg"
    cfg = tiny(out, **LORA)
    replies: list[tuple[str, int, int, object]] = []

    def recording(message, context):
        reply = client_app(message, context)
        replies.append(
            (message.metadata.message_type, message.metadata.group_id, int(context.node_config["partition-id"]), reply)
        )
        return reply

    summary = run_in_process(cfg, client_app=recording)
    return cfg, summary, replies


def test_lora_run_exchanges_only_the_adapters_with_bytes_counted_exactly(lora_run):
    cfg, summary, replies = lora_run
    adapters = initial_tensors(cfg)
    assert all(".lora_A." in n or ".lora_B." in n for n in adapters)
    assert sum(t.numel() for t in adapters.values()) == _expected_adapter_numel(cfg)
    modules = {n.split(".lora_")[0].rsplit(".", 1)[-1] for n in adapters}
    assert modules == set(LORA_MODULES["attention"] + LORA_MODULES["ffn"])
    payloads = [r.content["payload"] for kind, _, _, r in replies if kind == "train"]
    assert len(payloads) == cfg.federation.rounds * cfg.federation.clients
    for payload in payloads:
        assert set(payload) == set(adapters)  # nothing of the frozen public model travels
    lines = jsonl(Path(cfg.out) / "metrics.jsonl")
    for line in (x for x in lines if "bytes_up" in x):  # every byte counted is a byte of a real reply
        sent = [
            payload_bytes(r.content)
            for kind, rnd, client, r in replies
            if rnd == str(line["round"]) and client == line["client"] and kind in ("train", "train.apply")
        ]
        assert line["bytes_up"] == sum(sent)
    model_bytes = summary["bytes"]["fedavg_model_bytes"]
    full = sum(t.numel() for t in initial_tensors(tiny(cfg.out)).values())
    assert model_bytes < 0.5 * 4 * full  # the adapters' payload, not the model's
    assert summary["bytes"]["up_per_client_per_round"] < 1.1 * model_bytes


def test_translate_works_on_a_lora_runs_folder(lora_run, capsys):
    cfg, summary, _ = lora_run
    _client, folder = select_model(Path(cfg.out))
    model, _tokenizer, _meta = load_translation_model(folder)
    assert not any("lora" in n for n in model.state_dict())  # merged: a plain model
    task = load_task(cfg)  # the saved model scores what the run's final model scored
    assert wl.test_loss(cfg, model, task.workload) == pytest.approx(summary["test_loss"][0], abs=1e-5)
    assert main(["translate", "--run", cfg.out, "--beam", "1", "Введите нужную высоту."]) == 0
    assert capsys.readouterr().out.strip()


@pytest.mark.slow  # the default tier within 12 minutes; CI runs the slow tier too
def test_lora_run_resumed_after_a_kill_ends_as_the_uninterrupted_one(tmp_path):
    values = {**LORA, "federation.rounds": 3, "runtime.store": "disk"}
    full = run_in_process(tiny(tmp_path / "full", **values))
    stopped = tiny(tmp_path / "stopped", **values)

    with pytest.raises(Crash):
        run_in_process(stopped, client_app=crash_at("train.apply", 2, 1))
    assert read_checkpoint(stopped.out).round == 1
    state = next((tmp_path / "stopped" / "client-state").rglob("*.pt"))
    assert any(".lora_A." in n for n in torch.load(state, weights_only=False)["model"])  # the adapters are held
    resumed = run_in_process(resume_config(stopped.out))
    assert resumed["test_loss"] == full["test_loss"]


@pytest.mark.parametrize(
    "extra",
    [
        {"federation.strategy": "trustformer", "trustformer.beta": 0.5},
        {"federation.strategy": "fedavg-topk", "fedavg-topk.keep": 0.25},
        {"federation.strategy": "fedavg", "secure.mode": "secagg"},
        {"federation.strategy": "fedavg", "federation.clients_per_round": 2},
    ],
    ids=["trustformer", "top-k", "secagg", "sampling"],
)
def test_every_protocol_moves_only_the_adapters(tmp_path, extra):
    cfg = tiny(tmp_path / "run", **{**LORA, "federation.rounds": 1, **extra})
    summary = run_in_process(cfg)
    adapters = initial_tensors(cfg)
    assert all(".lora_" in n for n in adapters)
    adapter_bytes = 4 * sum(t.numel() for t in adapters.values())
    assert 0 < summary["bytes"]["up_per_client_per_round"] < 2.5 * adapter_bytes + 4096


# ------------------------------------------------------------------------------ the frontier's rows


def test_bench_plans_the_public_rows_and_gains_against_both_references():
    from trustformer_lab.bench.federation_bench import BenchRun, plan_public_runs, table

    runs = plan_public_runs([0], [4, 16], [4], [0.5])
    labels = [r.label for r in runs]
    assert labels[:3] == ["public model", "public + local", "public + fedavg"]
    assert {
        "public + fedavg lora r4",
        "public + fedavg lora r4 4-bit",
        "public + fedavg lora r16",
        "public + fedavg lora r16 4-bit",
        "public + trustformer β=0.5",
        "public + trustformer β=0.5 lora r16",
    } <= set(labels)
    assert all(r.overrides["train.init"] == "public" for r in runs)
    assert runs[0].kind == "public-model"

    def result(loss, up=1.0):
        return {
            "config": {"federation": {"strategy": "x"}},
            "wall_s": 1.0,
            "summary": {
                "test_loss": [loss],
                "bleu": [10.0],
                "own_test_loss": [loss],
                "own_bleu": [10.0],
                "bytes": {"up_per_client_per_round": up, "down_per_client_per_round": up},
            },
            "attack": {"recovered_fraction_mean": 0.0, "relative_error_mean": 0.0},
            "membership": {"advantage": {"auc_minus_half": 0.1, "tpr_at_1pct_fpr": 0.0}},
        }

    plan = [
        BenchRun("local", {}, 0),
        BenchRun("fedavg", {}, 0),
        BenchRun("public + local", {}, 0),
        BenchRun("public + fedavg", {}, 0),
        BenchRun("public + fedavg lora r4", {}, 0),
    ]
    rows = table(plan, [result(5.0), result(3.0), result(4.0), result(2.0), result(3.0, up=0.01)])
    lora = next(r for r in rows if r["run"] == "public + fedavg lora r4")
    assert lora["gain_loss"] == pytest.approx(1.0) and lora["pgain_loss"] == pytest.approx(0.5)
    assert lora["upload_vs_fedavg"] == pytest.approx(0.01)


def test_ffa_lora_trains_and_sends_only_b_with_a_frozen_at_the_same_start(tmp_path, lora_run):
    """model.lora_train = "b" (FFA-LoRA): only the lora_B tensors train and travel, half the adapters' bytes, every
    client keeps the same seeded lora_A, and the run still learns from the public start."""
    cfg = tiny(tmp_path / "ffa", **{**LORA, "model.lora_train": "b", "runtime.store": "disk"})
    start = initial_tensors(cfg)
    assert start and all(".lora_B." in n for n in start)
    model = load_task(cfg).initial_model()
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if ".lora_A." in n}
    assert frozen and not any(p.requires_grad for n, p in model.named_parameters() if ".lora_A." in n)
    summary = run_in_process(cfg)
    lora_cfg, lora_summary, _ = lora_run
    assert summary["bytes"]["fedavg_model_bytes"] < 0.6 * lora_summary["bytes"]["fedavg_model_bytes"]
    public_loss = load_task(cfg).public().report["test_loss"]
    assert max(summary["test_loss"]) < public_loss  # it learns beyond the public start
    from trustformer.runtime.store import DiskStore

    store = DiskStore(next((Path(cfg.out) / "client-state").iterdir()))
    for client in range(cfg.federation.clients):  # every client ends with the seeded lora_A it started with
        state = store.load(f"client-{client}").model
        assert all(torch.equal(state[name], tensor) for name, tensor in frozen.items())
        assert not all(torch.equal(state[n], start[n]) for n in start)  # and B trained


@pytest.mark.parametrize("params", ["all", "trainable"])
def test_fine_tuning_trains_every_weight_by_default_and_only_the_adapters_when_asked(tmp_path, monkeypatch, params):
    """federation.finetune_params: "all" fine-tunes the plain model (adapters merged in), every weight of it;
    "trainable" only the adapters, the frozen public weights left as they were. Fine-tuning the adapted copy in
    "all" mode (no merge) fails the first case."""
    from trustformer.tasks.translation import TranslationTask

    seen: list[tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]] = []
    real = TranslationTask.finetune

    def recording(self, model, shard, **kwargs):
        before = {n: t.detach().clone() for n, t in model.named_parameters()}
        out = real(self, model, shard, **kwargs)
        seen.append((before, {n: t.detach().clone() for n, t in model.named_parameters()}))
        return out

    monkeypatch.setattr(TranslationTask, "finetune", recording)
    cfg = tiny(tmp_path, **LORA, **{"federation.finetune_epochs": 1, "federation.finetune_params": params})
    summary = run_in_process(cfg)
    assert len(seen) == cfg.federation.clients and "ft_test_loss" in summary
    for before, after in seen:
        changed = {n for n in before if not torch.equal(before[n], after[n])}
        adapters = {n for n in before if ".lora_" in n}
        if params == "all":  # the public weights LoRA adapts (their base layers) and the embedding trained too
            assert not adapters and {n for n in before if n.endswith(("fc1.weight", "q_proj.weight"))} <= changed
            assert any("embedding" in n for n in changed)
        else:
            assert adapters and changed and changed <= adapters


# ------------------------------------------------------------------------------ BitFit: the bias terms alone


BITFIT = {**PUBLIC, "model.adapters": "bitfit"}


def test_bitfit_trains_and_sends_the_bias_terms_alone_and_leaves_the_public_weights_as_they_were(tmp_path):
    """``model.adapters = "bitfit"``: the trainable tensors are the public model's biases; every payload holds them
    and nothing else, under record-level DP-SGD too; the weights stay the public model's. Fine-tuning with
    ``federation.finetune_params = "all"`` trains every weight of the owner's copy."""
    cfg = tiny(tmp_path / "bitfit", **BITFIT, **{"privacy.unit": "record", "privacy.epsilon": 8.0})
    task = load_task(cfg)
    model = task.initial_model()
    public = task.public().state
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(n.endswith(".bias") for n in trainable)
    assert trainable == {n for n, _ in model.named_parameters() if n.endswith(".bias")}
    assert set(initial_tensors(cfg)) == trainable
    replies = []

    def recording(message, context):
        reply = client_app(message, context)
        if message.metadata.message_type == "train":
            replies.append(reply.content["payload"])
        return reply

    summary = run_in_process(cfg, client_app=recording)
    assert replies and all(set(p) == trainable for p in replies)
    assert summary["privacy"]["clients"]["0"]["epsilon"] <= 8.0 + 1e-6
    full = sum(t.numel() for t in initial_tensors(tiny(cfg.out)).values())
    assert summary["bytes"]["fedavg_model_bytes"] < 0.1 * 4 * full  # the biases' payload, not the model's
    _client, folder = select_model(Path(cfg.out))
    final = load_translation_model(folder)[0].state_dict()  # the run's final model, as saved
    frozen = {n for n, _ in model.named_parameters() if n not in trainable}
    assert all(torch.equal(final[n], public[n]) for n in frozen)
    assert not all(torch.equal(final[n], public[n]) for n in trainable)  # the biases trained
    assert all(p.requires_grad for p in task.personal_copy(model).parameters())


def test_adapters_on_the_last_layers_only():
    """model.lora_layers = N: adapters in the last N layers of the encoder and of the decoder, and on the embedding
    where it is a target; 0 adapts every layer. Too many layers is refused at load, naming the option."""
    from trustformer.config import ConfigError, load_config
    from trustformer.models.adapters import add_lora
    from trustformer.tasks.run import load_task

    cfg = load_config("tiny", None, {"model.n_encoder_layers": 3, "model.n_decoder_layers": 3})
    adapted = {}
    for last in (0, 1, 2):
        model = add_lora(
            load_task(cfg).initial_model(),
            rank=2,
            alpha=4.0,
            dropout=0.0,
            targets=("attention", "ffn", "embedding"),
            seed=0,
            last_layers=last,
        )
        adapted[last] = {n.split(".lora_")[0] for n, p in model.named_parameters() if p.requires_grad}
    layers = lambda names: sorted({n.split(".")[0] + "." + n.split(".")[2] for n in names if ".layers." in n})  # noqa: E731
    assert layers(adapted[0]) == ["decoder.0", "decoder.1", "decoder.2", "encoder.0", "encoder.1", "encoder.2"]
    assert layers(adapted[1]) == ["decoder.2", "encoder.2"]
    assert layers(adapted[2]) == ["decoder.1", "decoder.2", "encoder.1", "encoder.2"]
    assert all("embedding" in names for names in adapted.values())
    assert len(adapted[1]) < len(adapted[2]) < len(adapted[0])
    with pytest.raises(ConfigError, match="model.lora_layers = 4 exceeds"):
        load_config("tiny", None, {"model.n_encoder_layers": 3, "model.n_decoder_layers": 3, "model.lora_layers": 4})
