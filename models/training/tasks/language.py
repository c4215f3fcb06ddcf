"""Language modelling with the GPT/Llama decoder: next-token prediction on a corpus (notes 9),
the task of `python -m models.train`.

By default a character-level GPT learns the Python standard library's own source (no download);
--tokenizer bpe --vocab-size N trains on GPT-2 style byte-level BPE tokens learned from the
training split instead. Besides the loop's files, --out holds tokenizer.json (or, with
--tokenizer bpe, GPT-2's vocab.json + merges.txt: the directory then loads like a GPT-2 download),
and config.json carries GPT-2's keys, so that GPT.from_pretrained loads model.safetensors.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import models
from autograd.quantized import FORMATS
from models.architectures.decoder import Decoder, DecoderConfig
from models.architectures.gpt import GPT, GPTConfig
from models.architectures.llama import Llama, llama_config
from models.formats.tokenizer import load_tokenizer, save_tokenizer
from models.training.config import TrainConfig, setting
from models.training.data import (
    Corpus,
    eval_batches,
    get_batch,
    prepare_corpus,
    refused_data,
    unigram_baseline,
)
from models.training.step import Batch
from models.training.task import Task


@dataclass(kw_only=True)
class LanguageConfig(TrainConfig):
    """The decoder's settings; the defaults are the demo's, tuned to finish in a few minutes on
    2 CPU cores (see docs/gpt.md)."""

    data: str | None = setting(
        "UTF-8 text file to train on (default: Python standard library sources)",
        None,
        resume_keeps=True,
    )
    sft: str | None = setting(
        'chat fine-tuning: a .jsonl file, one {"messages": [{"role", "content"}, ...]} per '
        "line; the loss counts the assistant's tokens only (with --init-from)",
        None,
        resume_keeps=True,
    )
    quantize: str | None = setting(
        "keep the --init-from model's Linear weights quantized and frozen (gguf: a .gguf "
        "file's own blocks), with --lora-rank: LoRA on a quantized base (QLoRA)",
        None,
        choices=(*FORMATS, "gguf"),
        resume_keeps=True,
    )
    tokenizer: str = setting(
        "characters or byte-level BPE", "char", choices=("char", "bpe"), resume_keeps=True
    )
    arch: str = setting(
        "the new model's family: GPT-2 (LayerNorm, learned positions, GELU) or Llama "
        "(RMSNorm, rotary positions, SwiGLU)",
        "gpt2",
        choices=("gpt2", "llama"),
        resume_keeps=True,
    )
    vocab_size: int = setting("BPE vocabulary", 1024, resume_keeps=True)
    # None until the conversations are read (--sft with --init-from: the longest one)
    block_size: int | None = setting("context length", 64, resume_keeps=True, positive=True)
    eval_batches: int = setting("batches per evaluation", 4, positive=True)
    sample_tokens: int = setting("length of the final sample (0: none)", 400)
    sample_prompt: str = setting("prompt of the final sample", "def ")
    positions: int | None = setting("the --init-from model's positions", None, flag=False)
    out: str | None = "runs/demo"
    steps: int = 2000
    batch_size: int = 16
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    lr: float = 3e-3
    min_lr: float | None = 3e-4
    warmup: int = 60
    weight_decay: float = 0.1
    seed: int = 1337


@dataclass
class LanguageData:
    """The corpus and the fixed evaluation windows of both splits."""

    corpus: Corpus
    evals: dict[str, list[tuple[np.ndarray, np.ndarray]]]

    @property
    def tokenizer(self) -> Any:
        return self.corpus.tokenizer


class LanguageModelling(Task):
    """Next-token prediction on a corpus with a new decoder (GPT-2 or Llama) or one --init-from
    loads. Its config and checks are also chat fine-tuning's (--sft, chat.py)."""

    name = "train"
    prog = "python -m models.train"
    description = "Train a GPT on characters or BPE tokens (default corpus: Python stdlib)."
    title = "GPT training"
    Config = LanguageConfig
    model_class, model_config_class = GPT, GPTConfig

    def check(self, c: LanguageConfig, given: dict[str, Any]) -> None:
        if "vocab_size" in given and c.tokenizer != "bpe":
            raise SystemExit("train: --vocab-size needs --tokenizer bpe")
        if c.sft is not None:
            if not c.init_from:
                raise SystemExit("train: --sft fine-tunes a trained model: give --init-from")
            if c.data is not None:
                raise SystemExit("train: --sft and --data are two kinds of data: give one")
        if c.quantize is not None and c.lora_rank is None:
            raise SystemExit(
                "train: --quantize freezes the base's Linear weights: train adapters with "
                "--lora-rank (and --init-from)"
            )
        if c.init_from:
            if "arch" in given:
                raise SystemExit("train: --init-from brings its architecture; drop --arch")
            if "tokenizer" in given or "vocab_size" in given:
                raise SystemExit("train: --init-from brings its tokenizer; drop --tokenizer")
            c.positions = pretrained_config(Path(c.init_from)).block_size
            if "block_size" not in given:  # --sft: the longest conversation (set when the data
                # is read); text: the default windows, or the checkpoint's if shorter
                c.block_size = None if c.sft is not None else min(c.block_size, c.positions)
            elif c.block_size > c.positions:
                raise SystemExit(
                    f"train: --block-size {c.block_size} exceeds the {c.positions} "
                    f"positions of --init-from {c.init_from}"
                )

    def pretrained_shape(self, directory: Path) -> dict[str, Any]:
        found = pretrained_config(directory)
        return {k: getattr(found, k) for k in self.SHAPE}

    def pretrained(self, directory: Path, c: LanguageConfig) -> Decoder:
        """Any family models.from_pretrained reads (a GPT-2 or Llama-family directory)."""
        return models.from_pretrained(directory, dtype=c.dtype, quantize=c.quantize)

    def build(self, c: LanguageConfig, data: Any) -> Decoder:
        if c.arch == "gpt2":
            return super().build(c, data)
        sizes = {k: getattr(c, k) for k in ("n_layer", "n_head", "n_embd", "dropout")}
        config = llama_config(**sizes, **self.config_fields(c, data))
        return Llama(config, rng=np.random.default_rng(c.seed)).to(c.dtype)

    def prepare(self, c: LanguageConfig, saved: Path | None) -> LanguageData:
        # the checkpoint's tokenizer (a BPE is not learned again)
        tokenizer = None if saved is None else load_tokenizer(saved)
        bpe = c.vocab_size if saved is None and c.tokenizer == "bpe" else None
        with refused_data(self.name, c.data):
            corpus = prepare_corpus(c.data, tokenizer=tokenizer, bpe_vocab_size=bpe)
            evals = {
                name: eval_batches(ids, c.batch_size, c.block_size, c.eval_batches, c.seed)
                for name, ids in (("train", corpus.train), ("val", corpus.val))
            }
        return LanguageData(corpus, evals)

    def config_fields(self, c: LanguageConfig, data: Any) -> dict[str, Any]:
        return {"vocab_size": data.tokenizer.vocab_size, "block_size": c.block_size}

    def save_model(self, out: Path, model: Decoder, data: Any, stamp: dict[str, str]) -> None:
        model.save_pretrained(out, metadata=stamp)
        save_tokenizer(data.tokenizer, out)

    def load_model(self, out: Path, c: LanguageConfig) -> Decoder:
        return models.from_pretrained(out, dtype=c.dtype)

    def batch(
        self, c: LanguageConfig, data: LanguageData, step: int, rank: int, world_size: int
    ) -> Batch:
        ids = data.corpus.train
        return get_batch(ids, c.batch_size, c.block_size, c.seed, step, rank, world_size)

    def baselines(self, data: LanguageData) -> dict[str, float]:
        c = data.corpus
        return {"val": unigram_baseline(c.train, c.val, c.tokenizer.vocab_size)}

    def evaluate(self, model: Decoder, data: Any, c: LanguageConfig) -> dict[str, float]:
        """The mean loss over the fixed windows of each split."""
        return {
            name: float(np.mean([model(x, y)[1].item() for x, y in batches]))
            for name, batches in data.evals.items()
        }

    def describe_data(self, data: LanguageData) -> str:
        c = data.corpus
        return (
            f"data: {c.source}, {len(c.train):,} train / {len(c.val):,} val tokens; unigram "
            f"baseline {self.baselines(data)['val']:.3f} nats/token"
        )

    def sample(self, model: Decoder, data: LanguageData, c: LanguageConfig) -> str | None:
        if c.sample_tokens <= 0:
            return None
        text = sample_text(model, data.tokenizer, c.sample_prompt, c.sample_tokens, c.seed)
        return f"--- sample (temperature 0.8) ---\n{text}"


def pretrained_config(path: Path) -> DecoderConfig:
    """The model settings of what models.from_pretrained reads (a directory or a .gguf file)."""
    try:
        return models.pretrained_config(path)
    except (FileNotFoundError, ValueError, ImportError) as exc:
        raise SystemExit(f"train: --init-from {path}: {exc}") from None


def sample_text(model: Decoder, tokenizer: Any, prompt: str, n_tokens: int, seed: int) -> str:
    """Prompt + n_tokens sampled at temperature 0.8 (a little sharper than the model)."""
    ids = np.asarray(tokenizer.encode(prompt), dtype=np.int64) if prompt else np.array([0])
    out = model.generate(ids[None, :], n_tokens, temperature=0.8, rng=np.random.default_rng(seed))
    return tokenizer.decode(out[0])
