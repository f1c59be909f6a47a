"""The shared models' corpus and tokenizer, rebuilt identically on every machine from a pin.

The corpus is the text of one pinned pure-Python wheel (data/trained_models.yaml, `corpus`):
read from the wheel's zip, never from an installed package (the CPU machines run Python 3.11,
the GPU machine 3.12, and each has its own site-packages). The wheel is looked for in
$HANDBOOK_WHEELS (folders separated by ':'), the repository's .whl/corpus/ (what the GPU machine
is given: a folder of its own, because the wheels directly in .whl/ are installed onto the
GPU machine's PYTHONPATH, where this sympy would shadow the one torch uses), .whl/ and the
cache's wheels/; where it is in none of them, pip downloads it into the cache (CPU machines
reach PyPI; the GPU machine does not, and gets the wheel carried in .whl/corpus/).

- selection: the zip's members under `prefix`, ending in `suffix`, with no folder named in
  `exclude_dirs`, sorted by path; each must be UTF-8;
- split: a file is held out when int(sha256(path)[:8], 16) % heldout_modulus == 0: by file, so
  no held-out line was ever seen in training, and stable if the package changes elsewhere;
- hashes: `files_sha256` of the newline-joined sorted paths, `content_sha256` of the manifest
  "<sha256 of the file>  <path>\\n" per file (what `sha256sum` prints, in path order).

The tokenizer is a byte-level BPE trained with `tokenizers` (its version pinned: training is
deterministic for a given version, whatever the thread count or hash seed) on the training
files, each followed by the end-of-text token, id 0. It is versioned by the sha256 of its JSON.
Token streams put each file's ids followed by the end-of-text id, in path order.

Every mismatch with the pin is a CorpusError naming the data file and the field's line.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from snippets.common.models.trained_configs import Pin, TrainedSpec, load_trained_models

if TYPE_CHECKING:
    import torch
    from tokenizers import Tokenizer

ROOT = Path(__file__).resolve().parents[2]
CACHE_ENV = "HANDBOOK_MODEL_CACHE"  # where checkpoints, tokenizers and token streams are kept
WHEELS_ENV = "HANDBOOK_WHEELS"
EOS_ID = 0  # the end-of-text token: the only special token, so the first id


class CorpusError(RuntimeError):
    """The corpus or the tokenizer does not match its pin; the message names the data file."""


def cache_dir() -> Path:
    """$HANDBOOK_MODEL_CACHE, else <system temp>/handbook-models: one per machine and run."""
    path = Path(os.environ.get(CACHE_ENV) or Path(tempfile.gettempdir()) / "handbook-models")
    path.mkdir(parents=True, exist_ok=True)
    return path


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def wheel_dirs() -> list[Path]:
    given = [Path(p) for p in os.environ.get(WHEELS_ENV, "").split(os.pathsep) if p]
    return [*given, ROOT / ".whl" / "corpus", ROOT / ".whl", cache_dir() / "wheels"]


def find_wheel(pin: Pin, *, download: bool = True) -> Path:
    """The pinned wheel, its sha256 checked; downloaded with pip into the cache if absent."""
    for folder in wheel_dirs():
        if (folder / pin.wheel).is_file():
            return _checked(folder / pin.wheel, pin)
    dest = cache_dir() / "wheels"
    where = ", ".join(str(d) for d in wheel_dirs())
    if download:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--retries", "0", "--timeout", "20", "--disable-pip-version-check", "-q",
               "-d", str(dest), f"{pin.package}=={pin.version}"]  # fmt: skip
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        except (OSError, subprocess.TimeoutExpired) as exc:
            done = subprocess.CompletedProcess(cmd, 1, "", str(exc))
        if done.returncode == 0 and (dest / pin.wheel).is_file():
            return _checked(dest / pin.wheel, pin)
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no wheel"]
        where += f"; pip download failed: {tail[0]}"
    raise CorpusError(pin.error("wheel", f"{pin.wheel} (sha256 {pin.sha256}) is not in {where}: "
                                "carry it into the repository's .whl/corpus/"))  # fmt: skip


def _checked(path: Path, pin: Pin) -> Path:
    got = sha256_file(path)
    if got != pin.sha256:
        problem = f"{path} has sha256 {got}, the pin says {pin.sha256}"
        raise CorpusError(pin.error("sha256", problem))
    return path


def selected(names, pin: Pin) -> list[str]:
    """The selection rule: under prefix, ending in suffix, in no excluded folder; sorted."""
    excluded = set(pin.exclude_dirs)
    return sorted(
        n for n in names
        if n.startswith(pin.prefix) and n.endswith(pin.suffix)
        and not excluded.intersection(n.split("/")[:-1])
    )  # fmt: skip


def is_heldout(path: str, modulus: int) -> bool:
    return int(hashlib.sha256(path.encode()).hexdigest()[:8], 16) % modulus == 0


@dataclass(frozen=True)
class Corpus:
    paths: tuple[str, ...]  # sorted
    texts: tuple[str, ...]
    heldout: tuple[bool, ...]
    files_sha256: str
    content_sha256: str

    def split(self, heldout: bool) -> list[str]:
        return [t for t, h in zip(self.texts, self.heldout, strict=True) if h == heldout]

    @property
    def bytes(self) -> int:
        return sum(len(t.encode()) for t in self.texts)


def read_wheel(wheel: Path, pin: Pin) -> Corpus:
    """The selected files of a wheel and their hashes (nothing compared with the pin yet)."""
    with zipfile.ZipFile(wheel) as z:
        paths = selected(z.namelist(), pin)
        raw = [z.read(p) for p in paths]
    texts = []
    for path, data in zip(paths, raw, strict=True):
        try:
            texts.append(data.decode("utf-8"))
        except UnicodeDecodeError as exc:
            problem = f"{path} in {wheel.name} is not UTF-8: {exc}"
            raise CorpusError(pin.error("suffix", problem)) from None
    pairs = zip(paths, raw, strict=True)
    manifest = "".join(f"{hashlib.sha256(d).hexdigest()}  {p}\n" for p, d in pairs)
    return Corpus(
        tuple(paths), tuple(texts), tuple(is_heldout(p, pin.heldout_modulus) for p in paths),
        hashlib.sha256("\n".join(paths).encode()).hexdigest(),
        hashlib.sha256(manifest.encode()).hexdigest(),
    )  # fmt: skip


def measure(corpus: Corpus) -> dict:
    """The pin's derived fields for a corpus (to write a new pin: see `python -m` below)."""
    return {"files": len(corpus.paths), "heldout_files": sum(corpus.heldout),
            "bytes": corpus.bytes, "files_sha256": corpus.files_sha256,
            "content_sha256": corpus.content_sha256}  # fmt: skip


def check_corpus(corpus: Corpus, pin: Pin, wheel_name: str) -> Corpus:
    got = measure(corpus)
    rule = f"prefix {pin.prefix!r}, suffix {pin.suffix!r}, exclude_dirs {pin.exclude_dirs}"
    if (got["files"], got["files_sha256"]) != (pin.files, pin.files_sha256):
        raise CorpusError(pin.error("files_sha256", (
            f"the file list changed: the rule ({rule}) selects {got['files']} files of "
            f"{wheel_name} (list sha256 {got['files_sha256']}); the pin says {pin.files} files "
            f"({pin.files_sha256})")))  # fmt: skip
    for field in ("content_sha256", "bytes", "heldout_files"):
        if got[field] != pin.values[field]:
            problem = f"the selected files of {wheel_name} give {got[field]}, the pin says "
            raise CorpusError(pin.error(field, problem + str(pin.values[field])))
    return corpus


def load_corpus(spec: TrainedSpec | None = None) -> Corpus:
    """The pinned corpus, every hash checked."""
    pin = (spec or load_trained_models()).corpus
    wheel = find_wheel(pin)
    return check_corpus(read_wheel(wheel, pin), pin, wheel.name)


# ---------------------------------------------------------------------------------- tokenizer


def tokenizer_json_sha256(tokenizer: Tokenizer) -> str:
    return hashlib.sha256(tokenizer.to_str().encode()).hexdigest()


def train_tokenizer(texts: list[str], pin: Pin) -> Tokenizer:
    """A byte-level BPE (GPT-2's pre-tokenizer, all 256 bytes in the alphabet: any text
    round-trips), the end-of-text token first (id 0)."""
    import tokenizers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if tokenizers.__version__ != pin.version:
        problem = (f"this machine has tokenizers {tokenizers.__version__}; the tokenizer is "
                   f"pinned with {pin.version} (install tokenizers=={pin.version})")  # fmt: skip
        raise CorpusError(pin.error("version", problem))
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=pin.vocab_size, min_frequency=pin.min_frequency, special_tokens=[pin.eos],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )  # fmt: skip
    tok.train_from_iterator(texts, trainer)
    if tok.get_vocab_size() != pin.vocab_size:
        problem = f"training reached {tok.get_vocab_size()} tokens: the corpus is too small"
        raise CorpusError(pin.error("vocab_size", problem))
    return tok


def load_tokenizer(spec: TrainedSpec | None = None, corpus: Corpus | None = None) -> Tokenizer:
    """The pinned tokenizer: from the cache (its hash checked), else trained and cached."""
    from tokenizers import Tokenizer

    spec = spec or load_trained_models()
    pin = spec.tokenizer
    path = cache_dir() / f"tokenizer-{pin.sha256[:16]}.json"
    if path.is_file():
        tok = Tokenizer.from_str(path.read_text(encoding="utf-8"))
        if tokenizer_json_sha256(tok) == pin.sha256:
            return tok
    corpus = corpus or load_corpus(spec)
    tok = train_tokenizer(corpus.split(heldout=False), pin)
    got = tokenizer_json_sha256(tok)
    if got != pin.sha256:
        problem = (f"the tokenizer trained here (tokenizers {pin.version}) has JSON sha256 "
                   f"{got}, the pin says {pin.sha256}")  # fmt: skip
        raise CorpusError(pin.error("sha256", problem))
    _atomic_write(path, tok.to_str().encode())
    return tok


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def encode(tokenizer: Tokenizer, texts: list[str]) -> torch.Tensor:
    """Each text's ids followed by the end-of-text id (0), concatenated: int32."""
    import torch

    ids = [i for e in tokenizer.encode_batch(texts) for i in (*e.ids, EOS_ID)]
    return torch.tensor(ids, dtype=torch.int32)


def token_streams(spec: TrainedSpec | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(train, heldout) int32 token streams of the pinned corpus, cached per corpus and
    tokenizer hash."""
    import torch

    spec = spec or load_trained_models()
    key = hashlib.sha256((spec.corpus.content_sha256 + spec.tokenizer.sha256).encode())
    path = cache_dir() / f"tokens-{key.hexdigest()[:16]}.pt"
    if path.is_file():
        saved = torch.load(path, weights_only=True)
        return saved["train"], saved["heldout"]
    corpus = load_corpus(spec)
    tok = load_tokenizer(spec, corpus)
    train, heldout = encode(tok, corpus.split(False)), encode(tok, corpus.split(True))
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    torch.save({"train": train, "heldout": heldout}, tmp)
    os.replace(tmp, path)
    return train, heldout


if __name__ == "__main__":  # python -m snippets.common.corpus WHEEL: the pin's derived fields
    spec = load_trained_models()
    wheel = Path(sys.argv[1]) if len(sys.argv) > 1 else find_wheel(spec.corpus)
    corpus = read_wheel(wheel, spec.corpus)
    print(f"sha256: {sha256_file(wheel)}")
    for field, value in measure(corpus).items():
        print(f"{field}: {value}")
    tokenizer = train_tokenizer(corpus.split(False), spec.tokenizer)
    print(f"tokenizer sha256: {tokenizer_json_sha256(tokenizer)}")
