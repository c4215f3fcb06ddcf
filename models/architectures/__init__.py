"""Model definitions: one decoder (decoder.py) and its two families, GPT-2 (gpt.py) and the Llama
family (llama.py), each family file mapping its Hugging Face names explicitly; the encoder-only
Transformer (encoder.py) and the encoder-decoder with its digit vocabulary (seq2seq.py)."""

from typing import Any

import numpy as np


def check_positive_integers(config: Any, keys: tuple[str, ...]) -> None:
    """Each of config's `keys` a positive integer (a bool is not one), or a ValueError naming the
    config class, the field and the value: the sizes every model config checks first."""
    for key in keys:
        value = getattr(config, key)
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(
                f"{type(config).__name__}: {key} must be a positive integer, got {value!r}"
            )
