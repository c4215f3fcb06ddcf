"""Loading a model with its Linear weights kept quantized (models.from_pretrained(quantize=)),
tensor by tensor, for every file format: the float weights being replaced are never allocated.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

import nn
from autograd.quantized import FORMATS
from autograd.quantized import quantize as quantize_weight
from models.architectures.decoding import quantized_side_by_side, side_by_side_groups
from models.formats.errors import FileFormatError

QUANTIZE = (*FORMATS, "gguf")  # from_pretrained(quantize=): a block format, or a file's own


class QuantizedLoading:
    """Loads a model's Linear weights (and a tied embedding) as QuantizedWeights, tensor by tensor.

    Made once the model exists (built with _NoInit: its weights are zeros never written, so never
    in memory) and the files are checked. take(tensors) first takes each target's float weight
    Parameter out of its module, so the loader neither expects nor allocates it, then passes the
    other tensors on and turns each target's, as it streams by, into a QuantizedLinear
    (QuantizedEmbedding): a float array is quantized to `fmt`, a QuantizedWeight (a GGUF file's
    own blocks) kept as it is; with "gguf", a target the file stores in float stays float."""

    def __init__(self, model: Any, fmt: str, dtype: Any) -> None:
        if fmt not in QUANTIZE:
            raise ValueError(f"quantize must be one of {', '.join(QUANTIZE)} or None, got {fmt!r}")
        self.model, self.fmt, self.dtype = model, fmt, np.dtype(dtype)
        tied = model.config.tie_word_embeddings
        self.modules = modules = dict(model.named_modules())
        self.targets: dict[str, tuple[str, bool]] = {}  # HF name -> (module name, transposed)
        for hf_name, (name, transposed) in model.hf_names().items():
            module_name, _, kind = name.rpartition(".")
            module = modules[module_name]
            if kind == "weight" and (
                isinstance(module, nn.Linear) or (tied and module is model.transformer.wte)
            ):
                self.targets[hf_name] = (module_name, transposed)
        self.loaded: set[str] = set()
        # layers a compiled decode step runs as one product: packed side by side once all of a
        # group is quantized, while the next layer's tensors can reuse the memory freed
        self.group_of = {name: group for group in side_by_side_groups(model) for name in group}
        self.placed: dict[str, nn.Module] = {}

    def rows_are_outputs(self, hf_name: str) -> bool:
        """Whether hf_name is a target whose file rows are its outputs (the rows of the blocks):
        a Linear's weight stored (out, in), as torch does, or the embedding's table."""
        if hf_name not in self.targets:
            return False
        module_name, transposed = self.targets[hf_name]
        return transposed or isinstance(self.modules[module_name], nn.Embedding)

    def take(self, tensors: Iterator[tuple[str, str, Any]]) -> Iterator[tuple[str, str, Any]]:
        """The tensors that are not targets; the targets' weights taken out of the model now."""
        for module_name, _ in self.targets.values():
            del self.modules[module_name]._parameters["weight"]
        return self._others(tensors)

    def _others(self, tensors: Iterator[tuple[str, str, Any]]) -> Iterator[tuple[str, str, Any]]:
        for source, hf_name, array in tensors:
            if hf_name not in self.targets:
                yield source, hf_name, array
                continue
            self._place(hf_name, array)
            self.loaded.add(hf_name)

    def _place(self, hf_name: str, array: Any) -> None:
        module_name, transposed = self.targets[hf_name]
        module = self.modules[module_name]
        if isinstance(array, np.ndarray):  # W (in, out) = the file's array, transposed or not
            weight = array.T if transposed else array
            if self.fmt == "gguf":  # a float tensor of the file stays float, laid out as the
                # float loader lays it (C order: a decode step's product is then Numba's
                # matrix-vector kernel, not BLAS threads beside Numba's polling ones)
                module.weight = nn.Parameter(np.ascontiguousarray(weight), dtype=self.dtype)
                return
            if isinstance(module, nn.Embedding):  # its rows are the blocks' rows
                weight = array.T
            try:
                array = quantize_weight(weight, self.fmt)
            except ValueError as exc:
                raise ValueError(f"{hf_name}: {exc}") from None
        if isinstance(module, nn.Embedding):
            new = nn.QuantizedEmbedding(array, self.dtype)
        else:
            new = nn.QuantizedLinear(array)
            new.bias = module.bias
        nn.module.set_child(self.model, module_name, new)
        self.placed[module_name] = new
        group = self.group_of.get(module_name, ())
        if group and all(name in self.placed for name in group):
            layers = [self.placed[name] for name in group]
            if quantized_side_by_side(layers):
                nn.QuantizedLinear.side_by_side(layers)  # the layers keep views of one array

    def check(self, path: Path) -> None:
        """Every target was loaded (a FileFormatError naming the missing ones otherwise)."""
        missing = [name for name in self.targets if name not in self.loaded]
        if missing:
            raise FileFormatError(path, None, f"the file lacks {', '.join(missing)}")
