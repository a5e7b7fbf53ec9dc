"""Audio-text examples for ``speech-to-text``: lazy decoding, mono, resampling, batching.

Decoding is ours, not datasets' ``Audio`` feature: datasets 5.x decodes ``Audio`` with torchcodec,
which needs FFmpeg installed as a system library. ``soundfile`` (libsndfile bundled in its wheels
on Windows, Linux and macOS) reads WAV, FLAC, OGG/Vorbis and (libsndfile >= 1.1) MP3, and
``scipy.signal.resample_poly`` (an anti-aliased polyphase filter) brings every clip to the
feature extractor's rate. An ``Audio`` column is switched to ``Audio(decode=False)`` (its
``{"bytes", "path"}`` cells are kept as they are) and read here.

Clips are never decoded up front: ``AudioTextRows[i]`` reads row ``i`` when the DataLoader asks
for it. Before training, ``check_audio_files`` reads each file's *header* only (``soundfile.info``)
so a missing or corrupt file, or a clip longer than ``data.max_audio_seconds`` under
``data.long_audio: refuse``, is one line naming the file and row before the first step.

Everything here is a top-level class holding plain data, so it pickles into spawned DataLoader
workers (Windows, macOS).
"""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xtrain.data.rows.images import describe, padded_labels, resolve_path, text_labels, undecoded
from xtrain.errors import RowError, XtrainError, shown

if TYPE_CHECKING:
    import io

    import numpy as np
    from datasets import Dataset
    from transformers import PreTrainedTokenizerBase
    from transformers.feature_extraction_sequence_utils import SequenceFeatureExtractor

_HINT = "fix or remove that row; audio must be files soundfile can read (WAV, FLAC, OGG, MP3)"
LONG_AUDIO = ("refuse", "cut")
_EMPTY_HINT = "remove that row, or give it the recording its text belongs to"
_LONG_HINT = "split long recordings, or set data.long_audio=cut (keeps the start; the text must match it)"


class UnreadableAudio(RowError):
    """A missing or undecodable clip: one line with the file and the row (see ``UnreadableImage``:
    a DataLoader worker re-raises as ``type(e)(traceback text)``; only the message is kept)."""

    HINT = _HINT
    OTHER_HINTS = (_EMPTY_HINT, _LONG_HINT)


def _source(value: Any, base_dir: Path | None) -> str | io.BytesIO | None:
    """What soundfile opens: a path, or a file-like object over embedded bytes."""
    if isinstance(value, str):
        return str(resolve_path(value, base_dir))
    if isinstance(value, dict) and value.get("bytes"):
        return io.BytesIO(value["bytes"])
    if isinstance(value, dict) and value.get("path"):
        return str(resolve_path(value["path"], base_dir))
    return None


def empty_clip(what: str, row: int, source: str) -> UnreadableAudio:
    """A clip with zero samples: refused, it would teach the model to write its text from silence."""
    message = f"audio {what} (row {row} of {source}): no samples, an empty recording"
    return UnreadableAudio(message, _EMPTY_HINT)


def to_mono(samples: np.ndarray) -> np.ndarray:
    """[frames] or [frames, channels] float array -> [frames] (channels averaged)."""
    return samples.mean(axis=1) if samples.ndim == 2 else samples


def resample(samples: np.ndarray, rate: int, target: int) -> np.ndarray:
    """``samples`` at ``rate`` Hz -> at ``target`` Hz (polyphase, anti-aliased; exact for any
    integer rates: 44100 -> 16000 is up 160, down 441)."""
    if rate == target:
        return samples
    from scipy.signal import resample_poly

    g = math.gcd(int(rate), int(target))
    return resample_poly(samples, int(target) // g, int(rate) // g).astype("float32")


def read_audio(
    value: Any,
    base_dir: Path | None,
    row: int,
    source: str,
    sampling_rate: int,
    max_seconds: float | None = None,
    long_audio: str = "cut",
) -> np.ndarray:
    """One cell of the audio column as a mono float32 numpy array at ``sampling_rate``: a path
    string, an undecoded ``Audio`` cell (``{"bytes", "path"}``) or a decoded one
    (``{"array", "sampling_rate"}``)."""
    import numpy as np

    what = describe(value, base_dir, "audio")
    try:
        if isinstance(value, dict) and value.get("array") is not None:
            samples, rate = np.asarray(value["array"], dtype=np.float32), int(value["sampling_rate"])
        else:
            import soundfile

            opened = _source(value, base_dir)
            if opened is None:
                raise UnreadableAudio(f"row {row} of {source} has no audio (value: {shown(value)})")
            samples, rate = soundfile.read(opened, dtype="float32", always_2d=False)
    except XtrainError:
        raise
    except FileNotFoundError:
        raise UnreadableAudio(f"audio {what} (row {row} of {source}) not found") from None
    except Exception as e:  # soundfile.LibsndfileError, RuntimeError, ValueError on a bad file
        if isinstance(value, str) and not resolve_path(value, base_dir).is_file():
            raise UnreadableAudio(f"audio {what} (row {row} of {source}) not found") from None
        reason = (str(e).splitlines() or [type(e).__name__])[0][:160]
        raise UnreadableAudio(f"cannot read audio {what} (row {row} of {source}): {reason}") from None
    if len(samples) == 0:
        raise empty_clip(what, row, source)
    samples = resample(to_mono(samples), rate, sampling_rate)
    if max_seconds is not None and len(samples) > max_seconds * sampling_rate:
        if long_audio == "refuse":
            raise UnreadableAudio(
                f"audio {what} (row {row} of {source}) is {len(samples) / sampling_rate:.1f} s, "
                f"longer than data.max_audio_seconds={max_seconds:g}",
                _LONG_HINT,
            )
        samples = samples[: int(max_seconds * sampling_rate)]
    return samples


def check_audio_files(
    ds: Dataset,
    audio_column: str,
    base_dir: Path | None,
    source: str,
    max_seconds: float | None,
    long_audio: str,
) -> list[float] | None:
    """Path cells are checked before training: the file exists, its header reads, it has samples,
    and (with ``long_audio: refuse``) it is not longer than ``max_seconds``. Only headers are read.
    Returns each clip's length in seconds from those headers (``None`` for an ``Audio`` feature
    column, whose cells are checked when each row is read)."""
    feature = ds.features.get(audio_column)
    if getattr(feature, "dtype", None) not in ("string", "large_string"):  # CSV/parquet: large_string
        return None
    import soundfile

    durations = []
    for row, value in enumerate(ds[audio_column]):
        if value is None or not str(value).strip():
            raise UnreadableAudio(f"row {row} of {source} has an empty {audio_column} cell")
        path = resolve_path(value, base_dir)
        if not path.is_file():
            raise UnreadableAudio(f"audio {path} (row {row} of {source}) not found")
        try:
            info = soundfile.info(str(path))
        except Exception as e:
            reason = (str(e).splitlines() or [type(e).__name__])[0][:160]
            raise UnreadableAudio(f"cannot read audio {path} (row {row} of {source}): {reason}") from None
        if info.frames == 0:
            raise empty_clip(str(path), row, source)
        if long_audio == "refuse" and max_seconds is not None and info.duration > max_seconds + 1e-3:
            raise UnreadableAudio(
                f"audio {path} (row {row} of {source}) is {info.duration:.1f} s, "
                f"longer than data.max_audio_seconds={max_seconds:g}",
                _LONG_HINT,
            )
        durations.append(float(info.duration))
    return durations


def clip_seconds(value: Any, base_dir: Path | None) -> float:
    """A clip's length in seconds without decoding it: a decoded cell's array length, else the
    file header (``soundfile.info``) of its path or embedded bytes; 0 when it cannot be read
    (the row then fails with its one line when the batch reads it)."""
    if isinstance(value, dict) and value.get("array") is not None:
        return len(value["array"]) / float(value["sampling_rate"])
    opened = _source(value, base_dir)
    if opened is None:
        return 0.0
    import soundfile

    try:
        return float(soundfile.info(opened).duration)
    except Exception:
        return 0.0


METADATA = ("metadata.jsonl", "metadata.csv", "metadata.json")
SPLIT_FOLDERS = {"train": ("train",), "eval": ("eval", "validation", "valid", "dev", "test")}


def audiofolder_metadata(source: str | None, role: str) -> Path | None:
    """The metadata file of an ``audiofolder`` layout (``metadata.csv/jsonl`` with a ``file_name``
    column next to the clips, or in ``train/`` and ``eval|validation|test/`` subfolders); None
    for anything else. Read as a plain CSV/JSONL: datasets' own ``audiofolder`` builder encodes
    an ``Audio`` feature, which in datasets 5.x needs torchcodec and FFmpeg."""
    if not source:
        return None
    folder = Path(source).expanduser()
    if not folder.is_dir() or (folder / "dataset_dict.json").exists() or (folder / "state.json").exists():
        return None
    for sub in ("", *SPLIT_FOLDERS["train" if role == "train" else "eval"]):
        for name in METADATA:
            if (folder / sub / name).is_file():
                return folder / sub / name
    return None


class AudioTextRows:
    """A map-style data set over ``ds``: ``[i]`` -> ``{"audio": float32 mono array at
    sampling_rate, "text": str}``, the clip read only then."""

    def __init__(
        self,
        ds: Dataset,
        audio_column: str,
        text_column: str,
        base_dir: Path | None,
        source: str,
        sampling_rate: int,
        max_seconds: float | None,
        long_audio: str,
        durations: list[float] | None = None,
    ) -> None:
        self.ds = undecoded(ds, audio_column, "Audio")
        self.durations = durations  # seconds per row, when the headers were read already
        self.audio_column = audio_column
        self.text_column = text_column
        self.base_dir = base_dir
        self.source = source
        self.sampling_rate = sampling_rate
        self.max_seconds = max_seconds
        self.long_audio = long_audio

    def __len__(self) -> int:
        return len(self.ds)

    def lengths(self) -> list[float]:
        """Each clip's seconds as the model gets it (cut to ``max_seconds`` under
        ``long_audio: cut``), from the file headers: no clip is decoded."""
        seconds = self.durations
        if seconds is None:  # an Audio feature column: one header read per cell, a batch of rows at a time
            seconds = []
            for batch in self.ds.select_columns([self.audio_column]).iter(batch_size=256):
                seconds.extend(clip_seconds(v, self.base_dir) for v in batch[self.audio_column])
            self.durations = seconds
        limit = self.max_seconds if self.max_seconds is not None else float("inf")
        return [min(x, limit) for x in seconds]

    def __getitem__(self, i: int) -> dict[str, Any]:
        row = self.ds[int(i)]
        text = row[self.text_column]
        audio = read_audio(
            row[self.audio_column],
            self.base_dir,
            int(i),
            self.source,
            self.sampling_rate,
            self.max_seconds,
            self.long_audio,
        )
        return {"audio": audio, "text": "" if text is None else str(text)}


class SpeechTextCollator:
    """A list of ``{"audio", "text"}`` -> ``input_features`` (the feature extractor: log-mel
    frames, padded to its window) and ``labels`` (the tokenizer with its prefix tokens, ending in
    eos, the decoder start token stripped because the model prepends it, padded with -100)."""

    def __init__(
        self,
        feature_extractor: SequenceFeatureExtractor,
        tokenizer: PreTrainedTokenizerBase,
        max_length: int,
        decoder_start_token_id: int | None,
    ) -> None:
        self.feature_extractor = feature_extractor
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.decoder_start_token_id = decoder_start_token_id

    def labels(self, texts: list[str]) -> list[list[int]]:
        # Whisper's tokenizer writes <|startoftranscript|> first, and the model shifts the
        # labels right behind that same token: kept, it would be learnt twice.
        return text_labels(self.tokenizer, texts, self.max_length, drop_first=self.decoder_start_token_id)

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:

        if not features:
            raise ValueError("empty batch")
        fe = self.feature_extractor
        extracted = fe([f["audio"] for f in features], sampling_rate=fe.sampling_rate, return_tensors="pt")
        labels = padded_labels(self.labels([f["text"] for f in features]))
        return {"input_features": extracted["input_features"], "labels": labels}

    def __repr__(self) -> str:
        return f"SpeechTextCollator(max_length={self.max_length})"
