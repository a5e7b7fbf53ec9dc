"""speech-to-text: the built-ins, data layouts (paths relative to a JSONL/CSV, audiofolder +
metadata, an Audio feature saved with save_to_disk), decoding (mono, resampling, long clips),
bad audio as one line, Whisper prefix tokens and labels, LoRA on the encoder and/or decoder,
generation eval with normalised WER, 1 vs 2 processes."""

from __future__ import annotations

import csv
import json
import pickle
import random
import re
from pathlib import Path

import numpy as np
import pytest
import soundfile
import torch
from support.workloads import build_workload

from xtrain import builtin
from xtrain.builtin import audio as builtin_audio
from xtrain.data.rows.audio import UnreadableAudio, read_audio, resample
from xtrain.errors import XtrainError
from xtrain.tasks.generation import normalize_text, text_metrics
from xtrain.tasks.validation import load_config

TEXTS = builtin_audio.clip_texts(8, seed=3)


pytestmark = pytest.mark.usefixtures("private_caches")  # conftest: one offline cache for the session


@pytest.fixture
def whisper(private_caches) -> str:
    return str(builtin.ensure_builtin_model("builtin:tiny-whisper"))


def _clips(folder: Path, n: int = len(TEXTS), rate: int = 8000, channels: int = 1) -> list[str]:
    """``n`` synthetic clips as WAV files in ``folder``; returns their file names."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    names = []
    for i, text in enumerate(TEXTS[:n]):
        samples = builtin_audio.synthesize(text, rng, rate)
        if channels == 2:
            samples = np.stack([samples, samples], axis=1)
        name = f"{i:03d}.wav"
        soundfile.write(folder / name, samples, rate)
        names.append(name)
    return names


def _jsonl(folder: Path, n: int = len(TEXTS), **kwargs) -> Path:
    names = _clips(folder / "clips", n, **kwargs)
    rows = [{"audio": f"clips/{name}", "text": t} for name, t in zip(names, TEXTS[:n], strict=True)]
    (folder / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder / "train.jsonl"


def _cfg(model: str, train: Path | str, *extra: str, eval_: Path | str | None = None):
    overrides = [
        f"model.name_or_path={model}",
        "model.task=speech-to-text",
        f"data.train={train}",
        "data.max_length=24",
        "batch.per_device=4",
        "generation.max_new_tokens=8",
        *extra,
    ]
    overrides.append(f"data.eval={eval_ if eval_ is not None else 'null'}")
    return load_config(None, overrides)


def _batch(workload, n: int = 4) -> dict:
    return workload.collator([workload.train_dataset[i] for i in range(n)])


# --------------------------------------------------------------------------------------------
# Built-ins, decoding


def test_builtins_are_deterministic_and_load_like_a_checkpoint(whisper, tmp_path):
    from transformers import WhisperForConditionalGeneration

    again = builtin_audio.build_tiny_whisper
    folder = tmp_path / "again"
    folder.mkdir()
    again(folder)
    a = (Path(whisper) / "model.safetensors").read_bytes()
    assert a == (folder / "model.safetensors").read_bytes()
    model = WhisperForConditionalGeneration.from_pretrained(whisper)
    assert model.config.decoder_start_token_id == 1
    data = builtin.ensure_builtin_data("builtin:spoken-words")
    rows = [json.loads(line) for line in (data / "eval.jsonl").read_text().splitlines()]
    assert len(rows) == builtin_audio.EVAL_CLIPS and (data / rows[0]["audio"]).is_file()
    assert set(" ".join(r["text"] for r in rows).split()) <= set(builtin_audio.WORDS)
    rng = random.Random(5)
    clip = builtin_audio.synthesize("zero four", rng)
    assert np.array_equal(clip, builtin_audio.synthesize("zero four", random.Random(5)))


def test_stereo_is_mixed_to_mono_and_resampled(tmp_path):
    t = np.arange(44100) / 44100
    tone = 0.5 * np.sin(2 * np.pi * 440 * t)
    soundfile.write(tmp_path / "s.flac", np.stack([tone, tone], axis=1), 44100)
    samples = read_audio("s.flac", tmp_path, 0, "x.jsonl", 16000)
    assert samples.dtype == np.float32 and samples.ndim == 1 and len(samples) == 16000
    spectrum = np.abs(np.fft.rfft(samples))
    assert abs(int(np.argmax(spectrum)) - 440) <= 1  # 1 s at 16 kHz: bin k is k Hz
    assert len(resample(np.zeros(8000, dtype=np.float32), 8000, 16000)) == 16000


def test_long_clips_are_cut_or_refused(tmp_path):
    soundfile.write(tmp_path / "long.wav", np.zeros(16000 * 3, dtype=np.float32), 16000)
    cut = read_audio("long.wav", tmp_path, 4, "d.csv", 16000, max_seconds=2.0, long_audio="cut")
    assert len(cut) == 32000
    with pytest.raises(UnreadableAudio, match=r"long.wav \(row 4 of d.csv\) is 3.0 s"):
        read_audio("long.wav", tmp_path, 4, "d.csv", 16000, max_seconds=2.0, long_audio="refuse")


def test_normalised_wer():
    assert normalize_text("  Hello, World!  it's ") == "hello world it s"
    refs = [normalize_text(t) for t in ["Go left.", "stop"]]
    assert text_metrics(refs, [normalize_text("go LEFT"), "stop"])["wer"] == 0.0


# --------------------------------------------------------------------------------------------
# Data layouts and bad input


def test_jsonl_with_relative_paths_builds_whisper_batches(whisper, tmp_path):
    train = _jsonl(tmp_path, channels=2)
    workload = build_workload(_cfg(whisper, train))
    batch = _batch(workload)
    assert batch["input_features"].shape == (4, 40, 100)
    tok = workload.evaluate.tokenizer
    first = batch["labels"][0][batch["labels"][0] != -100].tolist()
    assert first[0] != 1 and first[-1] == tok.eos_token_id  # start stripped, eos kept
    assert tok.decode(first, skip_special_tokens=True) == TEXTS[0]
    assert workload.main_metric == "wer"
    pickle.loads(pickle.dumps(workload.collator))  # spawned DataLoader workers
    pickle.loads(pickle.dumps(workload.train_dataset))
    loss = workload.model(**batch).loss
    assert torch.isfinite(loss)
    # data.group_by_length: audio seconds from the headers read by the file check, no decoding
    expected = [soundfile.info(str(tmp_path / "clips" / f"{i:03d}.wav")).duration for i in range(len(TEXTS))]
    assert workload.train_lengths() == pytest.approx(expected)


def test_csv_and_audiofolder_with_metadata(whisper, tmp_path):
    names = _clips(tmp_path / "csvdata")
    with open(tmp_path / "csvdata" / "data.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["file", "sentence"])
        w.writerows(zip(names, TEXTS, strict=True))
    cfg = _cfg(
        whisper, tmp_path / "csvdata" / "data.csv", "data.audio_column=file", "data.text_column=sentence"
    )
    assert build_workload(cfg).train_dataset[1]["text"] == TEXTS[1]

    folder = tmp_path / "af"
    names = _clips(folder)
    (folder / "metadata.csv").write_text(
        "file_name,text\n" + "".join(f"{n},{t}\n" for n, t in zip(names, TEXTS, strict=True))
    )
    workload = build_workload(_cfg(whisper, folder))
    row = workload.train_dataset[2]
    assert row["audio"].ndim == 1 and row["text"] in TEXTS


def test_audio_feature_saved_with_save_to_disk(whisper, tmp_path):
    import datasets

    names = _clips(tmp_path / "clips")
    ds = datasets.Dataset.from_dict(
        {"audio": [str(tmp_path / "clips" / n) for n in names], "text": TEXTS}
    ).cast_column("audio", datasets.Audio(decode=False))
    ds = ds.map(lambda r: {"audio": {"bytes": Path(r["audio"]["path"]).read_bytes(), "path": None}})
    ds = ds.cast_column("audio", datasets.Audio())  # decode=True as saved by users
    ds.save_to_disk(str(tmp_path / "saved"))
    workload = build_workload(_cfg(whisper, tmp_path / "saved"))
    assert workload.train_dataset.ds.features["audio"].decode is False
    assert _batch(workload)["input_features"].shape[0] == 4
    # lengths of embedded clips: read from the bytes' headers, one batch of rows at a time
    expected = [soundfile.info(str(tmp_path / "clips" / n)).duration for n in names]
    assert workload.train_lengths() == pytest.approx(expected)


def test_missing_and_corrupt_audio_are_one_line(whisper, tmp_path):
    train = _jsonl(tmp_path)
    (tmp_path / "clips" / "002.wav").unlink()
    with pytest.raises(XtrainError, match=r"002.wav \(row 2 of .*train.jsonl\) not found"):
        build_workload(_cfg(whisper, train))
    (tmp_path / "clips" / "002.wav").write_bytes(b"RIFF not really a wave file")
    with pytest.raises(XtrainError, match=r"cannot read audio .*002.wav \(row 2 of"):
        build_workload(_cfg(whisper, train))


def test_corrupt_embedded_audio_is_one_line_even_from_a_dataloader_worker(whisper, tmp_path):
    import datasets
    from torch.utils.data import DataLoader

    names = _clips(tmp_path / "clips", 4)
    cells = [{"bytes": (tmp_path / "clips" / n).read_bytes(), "path": n} for n in names]
    cells[2] = {"bytes": b"RIFF but not audio", "path": "broken.wav"}
    ds = datasets.Dataset.from_dict({"audio": cells, "text": TEXTS[:4]})
    ds = ds.cast_column("audio", datasets.Audio(decode=False))
    ds.save_to_disk(str(tmp_path / "saved"))
    workload = build_workload(_cfg(whisper, tmp_path / "saved"))  # lazy: nothing decoded yet
    loader = DataLoader(workload.train_dataset, batch_size=4, collate_fn=workload.collator, num_workers=1)
    with pytest.raises(XtrainError) as e:
        list(loader)
    message = e.value.one_line()
    assert "\n" not in message and "Traceback" not in message
    assert re.search(r"cannot read audio broken.wav \(row 2 of .*saved\)", message), message


def test_worker_error_keeps_one_line():
    e = UnreadableAudio(
        "Caught UnreadableAudio in DataLoader worker process 0.\nOriginal Traceback ...\n"
        "xtrain.data.rows.audio.UnreadableAudio: cannot read audio a.wav (row 3 of t.csv): bad"
    )
    assert e.message == "cannot read audio a.wav (row 3 of t.csv): bad"


def test_config_checks(whisper, tmp_path):
    with pytest.raises(XtrainError, match="lora.apply_to=decoder"):
        _cfg(whisper, "x.jsonl", "model.freeze_encoder=true")
    with pytest.raises(XtrainError, match="data.long_audio"):
        _cfg(whisper, "x.jsonl", "data.long_audio=drop")
    assert _cfg(whisper, "x.jsonl", "model.task=asr").model.task == "speech-to-text"
    with pytest.raises(XtrainError, match="not a speech encoder-decoder"):
        build_workload(_cfg(str(builtin.ensure_builtin_model("builtin:tiny-trocr")), _jsonl(tmp_path)))
    with pytest.raises(XtrainError, match="generation.language=de but .* no language/task tokens"):
        build_workload(_cfg(whisper, _jsonl(tmp_path), "generation.language=de"))
    with pytest.raises(
        XtrainError, match="column 'nope' not in .*set data.audio_column|column 'nope' not in"
    ):
        build_workload(_cfg(whisper, _jsonl(tmp_path), "data.audio_column=nope"))
    with pytest.raises(XtrainError, match="generation.speech_task=translate"):
        build_workload(_cfg(whisper, _jsonl(tmp_path), "generation.speech_task=translate"))


# --------------------------------------------------------------------------------------------
# Model: LoRA, frozen encoder, Whisper prefix


@pytest.mark.parametrize(
    "extra, encoder, decoder",
    [
        ((), True, True),
        (("lora.apply_to=decoder",), False, True),
        (("lora.apply_to=encoder",), True, False),
    ],
)
def test_lora_targets_attention_of_each_half(whisper, tmp_path, extra, encoder, decoder):
    workload = build_workload(_cfg(whisper, _jsonl(tmp_path, 4), *extra))
    trained = [n for n, p in workload.model.named_parameters() if p.requires_grad]
    assert all("lora_" in n for n in trained)
    assert any(".encoder." in n for n in trained) == encoder
    assert any(".decoder." in n for n in trained) == decoder
    kinds = {n.split(".lora_")[0].rsplit(".", 1)[-1] for n in trained}
    assert kinds == {"q_proj", "k_proj", "v_proj", "out_proj"}


def test_gradient_checkpointing_keeps_encoder_adapters_training(whisper, tmp_path):
    workload = build_workload(_cfg(whisper, _jsonl(tmp_path, 4), "model.gradient_checkpointing=true"))
    workload.model.train()
    workload.model(**_batch(workload)).loss.backward()
    grads = {n: p.grad for n, p in workload.model.named_parameters() if "lora_B" in n}
    assert any(".encoder." in n and g is not None and g.abs().sum() > 0 for n, g in grads.items())


def test_full_fine_tune_with_frozen_encoder(whisper, tmp_path):
    cfg = _cfg(whisper, _jsonl(tmp_path, 4), "lora.enabled=false", "model.freeze_encoder=true")
    model = build_workload(cfg).model
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trained and not any(n.startswith("model.encoder.") for n in trained)
    assert "model.decoder.layers.0.self_attn.q_proj.weight" in trained


def test_multilingual_whisper_prefix_tokens(tmp_path):
    """A Whisper-shaped checkpoint with language/task tokens: labels start with the prefix
    (after <|startoftranscript|>, which the model adds), generate gets language and task."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GenerationConfig, PreTrainedTokenizerFast, WhisperConfig

    from xtrain.tasks.speech.parts import set_prefix

    specials = ["<|endoftext|>", "<|startoftranscript|>", "<|en|>", "<|de|>", "<|translate|>",
                "<|transcribe|>", "<|notimestamps|>"]  # fmt: skip
    vocab = {t: i for i, t in enumerate(specials + ["a", "b"])}
    raw = Tokenizer(models.WordLevel(vocab=vocab, unk_token="a"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="<|endoftext|>")

    class Model:
        config = WhisperConfig(vocab_size=len(vocab))
        generation_config = GenerationConfig(
            lang_to_id={"<|en|>": 2, "<|de|>": 3},
            task_to_id={"translate": 4, "transcribe": 5},
            forced_decoder_ids=[[1, 2]],
        )

    model = Model()
    assert set_prefix(tok, model, "de", "transcribe") == {"language": "de", "task": "transcribe"}
    assert model.generation_config.forced_decoder_ids is None
    assert set_prefix(tok, model, None, "translate") == {"task": "translate"}


# --------------------------------------------------------------------------------------------
# Evaluation by generation, 1 vs 2 processes


def test_generation_eval_reports_wer_and_samples(whisper, tmp_path):
    from accelerate import Accelerator

    train = _jsonl(tmp_path, 4)
    workload = build_workload(_cfg(whisper, train, eval_=train))
    loader = torch.utils.data.DataLoader(workload.eval_dataset, batch_size=2, collate_fn=workload.collator)
    metrics, samples = workload.evaluate(Accelerator(cpu=True), workload.model, loader)
    assert {"eval_loss", "wer", "cer"} <= set(metrics) and metrics["wer"] >= 0.9
    assert [s.reference for s in samples] == TEXTS[:4]


JOB = """\
model:
  name_or_path: {model}
  task: speech-to-text
lora:
  r: 4
  alpha: 8
  dropout: 0.1
data:
  train: {root}/train.jsonl
  eval: {root}/eval.jsonl
  max_length: 20
  num_workers: 0
generation:
  max_new_tokens: 6
optim:
  lr: 0.01
  warmup_steps: 1
batch:
  per_device: 4
  global_batch: 8
run:
  max_steps: 4
  log_every: 1
  save_every: 2
  eval_at_start: true
  best_metric: wer
"""


@pytest.fixture(scope="module")
def words_job(tmp_path_factory):
    """A 4-step LoRA run on 32 + 10 generated clips (the last eval batch is partial on 2 ranks)."""
    from support.jobs import session_builtin, task_job

    root = tmp_path_factory.mktemp("speech-job")
    rng = random.Random(11)
    (root / "wav").mkdir()
    rows = []
    for i, text in enumerate(builtin_audio.clip_texts(42, seed=11)):
        clip = builtin_audio.synthesize(text, rng)
        soundfile.write(root / "wav" / f"{i}.wav", clip, builtin_audio.FILE_RATE)
        rows.append({"audio": f"wav/{i}.wav", "text": text})
    return task_job(root, JOB, session_builtin(tmp_path_factory, "builtin:tiny-whisper"), rows)


@pytest.fixture(scope="module")
def words_straight(words_job):
    from support.jobs import train_once

    out, proc = train_once(words_job)
    assert "reference" in proc.stderr and "prediction" in proc.stderr  # sample transcripts shown
    return out


@pytest.mark.slow
# One launcher runs by default; the other two, which test_launch_modes covers on the text job,
# run with `pytest -m soak` (docs/reliability.md: keeping the default run under 40 min on 2 cores).
@pytest.mark.parametrize(
    "mode",
    [
        pytest.param("spawn", marks=pytest.mark.soak),
        pytest.param("torchrun", marks=pytest.mark.soak),
        "accelerate-config",
    ],
)
def test_one_and_two_processes_give_the_same_wer(mode, words_job, words_straight):
    """The same launch modes as the other tasks (support.jobs.TWO_PROCESSES): `python -m
    xtrain.run --processes 2`, `torchrun --nproc_per_node 2 -m xtrain.run` and `accelerate launch
    -m xtrain.run` with the config `xtrain configure --processes 2` writes, each against one process
    with the same global batch."""
    from support.jobs import assert_same_training, run_xtrain, two_process_command

    out = words_job.root / f"two-{mode}"
    command, env = two_process_command(mode, words_job.root, words_job.env)
    proc = run_xtrain([*command, "--config", str(words_job.config), f"run.output_dir={out}"], env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    one = json.loads((words_straight / "train_result.json").read_text())
    two = json.loads((out / "train_result.json").read_text())
    assert (two["world_size"], two["accumulation"], one["accumulation"]) == (2, 1, 2)
    assert two["run_info"]["backend"] == "gloo"
    assert two["run_info"]["distributed_type"] == "DistributedType.MULTI_CPU"
    assert one["eval_history"][0]["step"] == 0  # eval_at_start: the "before" WER
    for a, b in zip(one["eval_history"], two["eval_history"], strict=True):
        assert (a["step"], a["wer"], a["cer"]) == (b["step"], b["wer"], b["cer"])
    assert one["predictions"] == two["predictions"] and len(one["predictions"]) == 4
    assert_same_training(words_straight, out)
    assert json.loads((words_straight / "best" / "best.json").read_text())["metric"] == "wer"


@pytest.mark.slow
def test_kill_and_resume_is_exact(words_job, words_straight):
    from support.jobs import assert_same_training, python_run, run_until, run_xtrain

    out = words_job.root / "killed"
    args = ["--config", str(words_job.config), f"run.output_dir={out}", "run.resume=auto"]
    marker = out / "checkpoints" / "step-2" / "xtrain_state.json"
    assert run_until(python_run(*args), words_job.env, marker.exists) == -9
    proc = run_xtrain(python_run(*args), words_job.env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((out / "train_result.json").read_text())["resumed_from"]
    assert_same_training(words_straight, out, exact=True)


@pytest.mark.slow
def test_predict_transcribes_audio_with_the_trained_adapter(words_job, words_straight, capsys):
    from xtrain.cli import main

    clips = words_job.root / "wav"
    assert main(["predict", str(words_straight), str(clips / "0.wav"), str(clips / "1.wav")]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line.split("\t")[0] for line in lines] == [str(clips / "0.wav"), str(clips / "1.wav")]
    assert main(["predict", str(words_straight), "--prompt", "hi"]) == 2
    assert "reads audio" in capsys.readouterr().err


@pytest.mark.slow
def test_group_by_length_same_for_one_and_two_processes_and_resumes_exactly(words_job, words_straight):
    """data.group_by_length on the speech job: 1 and 2 processes train on the same samples per
    step (same WER/CER, eval loss and adapter), a kill mid-run resumes bit for bit, and the order
    really changed (not the plain run's losses)."""
    from support.jobs import assert_same_training, python_run, run_until, run_xtrain

    def args(name: str, *extra: str) -> list[str]:
        out = words_job.root / name
        return [
            "--config",
            str(words_job.config),
            f"run.output_dir={out}",
            "data.group_by_length=true",
            *extra,
        ]

    one, two, killed = (words_job.root / n for n in ("grouped-one", "grouped-two", "grouped-killed"))
    for cmd in (python_run(*args("grouped-one")), python_run("--processes", "2", *args("grouped-two"))):
        proc = run_xtrain(cmd, words_job.env)
        assert proc.returncode == 0, proc.stderr[-3000:]
    a, b = (json.loads((out / "train_result.json").read_text()) for out in (one, two))
    assert [(e["step"], e["wer"], e["cer"]) for e in a["eval_history"]] == [
        (e["step"], e["wer"], e["cer"]) for e in b["eval_history"]
    ]
    assert_same_training(one, two)
    plain = json.loads((words_straight / "train_result.json").read_text())
    assert [x for _, x in plain["losses"]] != [x for _, x in a["losses"]]

    marker = killed / "checkpoints" / "step-2" / "xtrain_state.json"
    resume = args("grouped-killed", "run.resume=auto")
    assert run_until(python_run(*resume), words_job.env, marker.exists) == -9
    proc = run_xtrain(python_run(*resume), words_job.env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((killed / "train_result.json").read_text())["resumed_from"]
    assert_same_training(one, killed, exact=True)
