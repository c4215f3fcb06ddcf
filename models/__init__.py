"""glassgrad's models: one decoder (models.architectures.decoder) in two families, GPT-2
(models.architectures.gpt) and Llama (models.architectures.llama: Llama, Qwen2, Mistral, SmolLM2),
the encoder and the encoder-decoder, tokenizers, data and the train/sample/chat CLIs.

>>> from models import GPT, GPTConfig
>>> model = GPT(GPTConfig(vocab_size=65, block_size=64, n_layer=2, n_head=2, n_embd=32))
>>> [name for name, _ in model.named_parameters()][:2]
['transformer.wte.weight', 'transformer.wpe.weight']
"""

from pathlib import Path
from typing import Any

from autograd import check_packages  # nn, imported by models.architectures.gpt, checks autograd
from models.architectures.decoder import Decoder, DecoderConfig
from models.architectures.gpt import GPT, GPTConfig
from models.architectures.llama import Llama
from models.formats.errors import FileFormatError
from models.formats.hf import Fields, read_config
from models.formats.hub import resolve
from models.formats.quantized import QUANTIZE
from models.formats.tokenizer import BPETokenizer, CharTokenizer

FAMILIES = {"gpt2": GPT, "llama": Llama, "qwen2": Llama, "mistral": Llama}


def from_pretrained(
    path: str | Path,
    dtype: Any = None,
    revision: str | None = None,
    max_bytes: int | None = None,
    quantize: str | None = None,
) -> Decoder:
    """The model of a Hugging Face directory (or of a glassgrad checkpoint), by config.json's
    model_type: gpt2 -> GPT; llama, qwen2, mistral -> Llama; or of a llama.cpp GGUF file (a
    path ending in .gguf: models.formats.gguf; IQ, TQ or MXFP4 tensors need the gguf package).
    Weights in dtype (default float32). A hub name ("org/name", at `revision`) that is not a local
    path is fetched (models.formats.hub).

    A malformed file is a FileFormatError naming it and the field; a model too large for the
    memory available (or max_bytes, or $GLASSGRAD_MAX_LOAD_BYTES) is refused before allocating.

    quantize (docs/quantization.md): "q8_0", "q4_0", "q4_1", "q5_0" or "q5_1" keep every Linear
    weight (and a tied embedding, which is also the output head) quantized in llama.cpp's block
    format, quantized as it is read; "gguf" keeps a GGUF file's own blocks of those formats as
    they are (other types dequantized to dtype). Tensor by tensor: the float model is never held."""
    if quantize not in (None, *QUANTIZE):
        raise ValueError(
            f"from_pretrained: quantize must be one of {', '.join(QUANTIZE)} or None, "
            f"got {quantize!r}"
        )
    path = resolve(path, revision)
    if path.suffix.lower() == ".gguf":
        from models.formats import gguf

        return gguf.load(path, dtype, max_bytes, quantize)
    if quantize == "gguf":
        raise ValueError(f"from_pretrained: quantize='gguf' needs a .gguf file, got {path}")
    directory, config = read_config(path)
    family = _family(config, directory / "config.json")
    return family.from_pretrained(path, dtype, max_bytes, quantize)


def pretrained_config(path: str | Path, revision: str | None = None) -> DecoderConfig:
    """The model settings of what from_pretrained reads (a directory, a .gguf file or a hub
    name), without reading its weights."""
    path = resolve(path, revision)
    if path.suffix.lower() == ".gguf":
        from models.formats import gguf

        return Llama.config_from_hf(gguf.read_config(path), str(path))
    directory, config = read_config(path)
    source = directory / "config.json"
    return _family(config, source).config_from_hf(config, str(source))


def _family(config: dict[str, Any], source: Path) -> type[Decoder]:
    return FAMILIES[Fields(config, source).choice("model_type", tuple(FAMILIES))]


__all__ = [
    "GPT",
    "BPETokenizer",
    "CharTokenizer",
    "Decoder",
    "DecoderConfig",
    "FileFormatError",
    "GPTConfig",
    "Llama",
    "from_pretrained",
    "pretrained_config",
]

check_packages("nn", "models")  # no folder of the same name may shadow glassgrad's
