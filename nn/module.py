"""Module, Parameter and the containers: how a model keeps track of its trainable arrays.

A Module registers a Parameter or a sub-Module the moment it is assigned to an attribute
(`self.weight = Parameter(...)`). The value is also stored as an ordinary instance attribute, so
reading `self.weight` in a forward pass is a plain attribute read: the bookkeeping costs only on
assignment. Names are dotted paths in registration order (`h.0.attn.c_attn.weight`), which is
what state_dict() and checkpoints use.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from autograd import Tensor, get_default_dtype, no_grad


class Parameter(Tensor):
    """A trainable Tensor: requires_grad=True, float data in the default dtype (or dtype=)."""

    __slots__ = ()

    def __init__(self, data: Any, dtype: Any = None, name: str | None = None) -> None:
        array = np.asarray(data.data if isinstance(data, Tensor) else data)
        if array.dtype.kind not in "fiub":
            raise TypeError(f"Parameter: expected numeric data, got dtype {array.dtype}")
        if dtype is None:
            dtype = get_default_dtype()
        super().__init__(array, requires_grad=True, dtype=dtype, name=name)

    def __repr__(self) -> str:
        return "Parameter containing:\n" + super().__repr__()


class Module:
    """Base class of every layer and model. Subclasses call super().__init__() first."""

    training: bool

    def __init__(self) -> None:
        # object.__setattr__: these three must exist before our __setattr__ can run.
        object.__setattr__(self, "_parameters", {})
        object.__setattr__(self, "_modules", {})
        object.__setattr__(self, "_buffers", {})
        object.__setattr__(self, "_non_persistent", set())
        object.__setattr__(self, "training", True)

    # --- registration --------------------------------------------------------------------------
    def __setattr__(self, name: str, value: Any) -> None:
        params = self.__dict__.get("_parameters")
        if params is None:
            raise AttributeError(
                f"{type(self).__name__}: cannot assign {name!r} before Module.__init__() ran; "
                "call super().__init__() first in __init__"
            )
        modules = self._modules
        if isinstance(value, Parameter):
            modules.pop(name, None)
            self._buffers.pop(name, None)
            params[name] = value
        elif isinstance(value, Module):
            params.pop(name, None)
            self._buffers.pop(name, None)
            modules[name] = value
        elif name in self._buffers:
            self._buffers[name] = self._as_buffer(name, value)
            value = self._buffers[name]
        else:
            params.pop(name, None)
            modules.pop(name, None)
        object.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        self._parameters.pop(name, None)
        self._modules.pop(name, None)
        self._buffers.pop(name, None)
        self._non_persistent.discard(name)
        object.__delattr__(self, name)

    def _as_buffer(self, name: str, value: Any) -> np.ndarray:
        if isinstance(value, Tensor):
            value = value.data
        if not isinstance(value, np.ndarray):
            raise TypeError(
                f"{type(self).__name__}: buffer {name!r} must be a numpy array, "
                f"got {type(value).__name__}"
            )
        return value

    def register_buffer(self, name: str, array: np.ndarray, persistent: bool = True) -> None:
        """Keep a non-trainable array (e.g. a running statistic) as `self.<name>`.

        Persistent buffers are part of state_dict() and are loaded by load_state_dict().
        """
        if name in self._parameters or name in self._modules:
            raise KeyError(f"{type(self).__name__}: {name!r} is already a parameter or module")
        self._buffers[name] = self._as_buffer(name, array)
        if persistent:
            self._non_persistent.discard(name)
        else:
            self._non_persistent.add(name)
        object.__setattr__(self, name, self._buffers[name])

    def add_module(self, name: str, module: Module) -> None:
        """Register `module` as `name` (its parameters are named `name.*`), as assigning it does;
        for names computed at run time."""
        setattr(self, name, module)

    # --- traversal -----------------------------------------------------------------------------
    def named_modules(self, prefix: str = "") -> Iterator[tuple[str, Module]]:
        """(dotted name, module) for this module and every submodule, depth first, each once."""
        seen: set[int] = set()
        stack: list[tuple[str, Module]] = [(prefix, self)]
        while stack:
            name, module = stack.pop()
            if id(module) in seen:
                continue
            seen.add(id(module))
            yield name, module
            children = [
                (f"{name}.{child_name}" if name else child_name, child)
                for child_name, child in module._modules.items()
            ]
            stack.extend(reversed(children))  # reversed: pop() then visits them in order

    def modules(self) -> Iterator[Module]:
        for _, module in self.named_modules():
            yield module

    def children(self) -> Iterator[Module]:
        yield from self._modules.values()

    def named_parameters(self, prefix: str = "") -> Iterator[tuple[str, Parameter]]:
        """(dotted name, parameter) in registration order; a shared parameter appears once."""
        seen: set[int] = set()
        for module_name, module in self.named_modules(prefix):
            for name, param in module._parameters.items():
                if id(param) in seen:
                    continue
                seen.add(id(param))
                yield (f"{module_name}.{name}" if module_name else name), param

    def parameters(self) -> Iterator[Parameter]:
        for _, param in self.named_parameters():
            yield param

    def named_buffers(self, persistent_only: bool = False) -> Iterator[tuple[str, np.ndarray]]:
        for module_name, module in self.named_modules():
            for name, buf in module._buffers.items():
                if persistent_only and name in module._non_persistent:
                    continue
                yield (f"{module_name}.{name}" if module_name else name), buf

    def num_parameters(self) -> int:
        """Number of scalars in the parameters, frozen ones included (a shared one counts once)."""
        return sum(p.size for p in self.parameters())

    def parameter_counts(self) -> tuple[int, int]:
        """(trainable, total) scalars: trainable ones require grad (see freeze)."""
        params = list(self.parameters())
        return sum(p.size for p in params if p.requires_grad), sum(p.size for p in params)

    # --- freezing ------------------------------------------------------------------------------
    def requires_grad_(self, requires_grad: bool = True) -> Module:
        """Set requires_grad on every parameter (False freezes the whole module)."""
        for p in self.parameters():
            p.requires_grad = requires_grad
        return self

    def freeze(self, *patterns: str) -> list[str]:
        """Freeze the parameters whose dotted name matches one of the glob patterns
        ("h.0.*", "*.ln_*", "wte.weight"); return their names. A frozen parameter gets no
        gradient (nothing is computed or stored for it), optimizers skip it and checkpoints
        remember it. A pattern that matches no parameter is an error (a typo freezes nothing)."""
        names = [name for name, _ in self.named_parameters()]
        unmatched = [pat for pat in patterns if not fnmatch.filter(names, pat)]
        if unmatched:
            raise KeyError(
                f"{type(self).__name__}.freeze: no parameter name matches {unmatched}; "
                f"names look like {names[:3]}"
            )
        frozen = []
        for name, p in self.named_parameters():
            if any(fnmatch.fnmatchcase(name, pat) for pat in patterns):
                p.requires_grad = False
                frozen.append(name)
        return frozen

    # --- modes and gradients -------------------------------------------------------------------
    def to(self, dtype: Any) -> Module:
        """Cast every parameter and float buffer to `dtype` in place (float32 or float64)."""
        dtype = np.dtype(dtype)
        if dtype not in (np.float32, np.float64):
            raise ValueError(f"{type(self).__name__}.to: expected float32 or float64, got {dtype}")
        with no_grad():
            for module in self.modules():
                for param in module._parameters.values():
                    param.data = param.data.astype(dtype)  # bumps the version: old graphs fail
                for name, buf in module._buffers.items():
                    if buf.dtype.kind == "f":
                        module._buffers[name] = buf.astype(dtype)
                        object.__setattr__(module, name, module._buffers[name])
        return self

    def train(self, mode: bool = True) -> Module:
        """Set training mode (dropout active) on this module and all submodules."""
        for module in self.modules():
            object.__setattr__(module, "training", bool(mode))
        return self

    def eval(self) -> Module:
        return self.train(False)

    def zero_grad(self) -> None:
        """Drop every parameter's .grad (the next backward starts from nothing)."""
        for p in self.parameters():
            p.grad = None

    # --- calling -------------------------------------------------------------------------------
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} does not define forward()")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)

    # --- state ---------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, np.ndarray]:
        """Name -> copy of the array, for every parameter and persistent buffer."""
        state = {name: p.data.copy() for name, p in self.named_parameters()}
        for name, buf in self.named_buffers(persistent_only=True):
            state[name] = buf.copy()
        return state

    def load_state_dict(self, state: dict[str, Any], strict: bool = True) -> None:
        """Copy arrays from `state` into the parameters and persistent buffers of the same name.

        Everything is checked first: with strict=True every missing and unexpected key, and
        (always) every shape mismatch, is reported in one error, and nothing is changed.
        Values are converted to each parameter's dtype.
        """
        targets: dict[str, tuple[Module, str, Any]] = {}
        for module_name, module in self.named_modules():
            for name, param in module._parameters.items():
                full = f"{module_name}.{name}" if module_name else name
                targets.setdefault(full, (module, name, param))
            for name, buf in module._buffers.items():
                if name not in module._non_persistent:
                    full = f"{module_name}.{name}" if module_name else name
                    targets[full] = (module, name, buf)
        problems = []
        arrays: dict[str, np.ndarray] = {}
        missing = [k for k in targets if k not in state]
        unexpected = [k for k in state if k not in targets]
        if strict and missing:
            problems.append(f"missing keys: {', '.join(missing)}")
        if strict and unexpected:
            problems.append(f"unexpected keys: {', '.join(unexpected)}")
        for key, (_, _, current) in targets.items():
            if key not in state:
                continue
            value = state[key]
            array = np.asarray(value.data if isinstance(value, Tensor) else value)
            if array.shape != current.shape:
                problems.append(
                    f"shape mismatch for {key}: checkpoint {array.shape}, model {current.shape}"
                )
            elif array.dtype.kind not in "fiub":
                problems.append(f"non-numeric value for {key}: dtype {array.dtype}")
            else:
                arrays[key] = array
        if problems:
            raise KeyError(
                f"{type(self).__name__}.load_state_dict: nothing was loaded:\n  "
                + "\n  ".join(problems)
            )
        with no_grad():
            for key, array in arrays.items():
                module, name, current = targets[key]
                if isinstance(current, Tensor):
                    # The setter bumps the version, so a graph recorded before cannot go stale.
                    current.data = np.array(array, dtype=current.dtype, copy=True)
                else:
                    module._buffers[name] = np.array(array, dtype=current.dtype, copy=True)
                    object.__setattr__(module, name, module._buffers[name])

    # --- printing ------------------------------------------------------------------------------
    def extra_repr(self) -> str:
        """One line of settings shown in repr (subclasses override)."""
        return ""

    def __repr__(self) -> str:
        lines = []
        for name, child in self._modules.items():
            child_repr = repr(child).replace("\n", "\n  ")
            lines.append(f"  ({name}): {child_repr}")
        extra = self.extra_repr()
        if not lines:
            return f"{type(self).__name__}({extra})"
        if extra:
            lines.insert(0, f"  {extra}")
        return f"{type(self).__name__}(\n" + "\n".join(lines) + "\n)"


class ModuleList(Module):
    """A list of modules, registered as "0", "1", ... (e.g. the GPT's blocks `h.0`, `h.1`)."""

    def __init__(self, modules: Iterable[Module] = ()) -> None:
        super().__init__()
        for module in modules:
            self.append(module)

    def append(self, module: Module) -> ModuleList:
        if not isinstance(module, Module):
            raise TypeError(f"ModuleList.append: expected a Module, got {type(module).__name__}")
        setattr(self, str(len(self._modules)), module)
        return self

    def extend(self, modules: Iterable[Module]) -> ModuleList:
        for module in modules:
            self.append(module)
        return self

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules.values())

    def __getitem__(self, index: int | slice) -> Any:
        items = list(self._modules.values())
        if isinstance(index, slice):
            return ModuleList(items[index])
        try:
            return items[index]
        except IndexError:
            raise IndexError(
                f"ModuleList: index {index} out of range for {len(items)} modules"
            ) from None


class Sequential(ModuleList):
    """Modules applied one after another: Sequential(a, b, c)(x) == c(b(a(x)))."""

    def __init__(self, *modules: Module) -> None:
        super().__init__(modules)

    def forward(self, x: Any) -> Any:
        for module in self._modules.values():
            x = module(x)
        return x


def set_child(model: Module, name: str, module: Module) -> None:
    """Put `module` where `name` is, and in every other attribute of the parent that held the
    old one (a second name a forward may read it by)."""
    parent_name, _, child = name.rpartition(".")
    parent = model
    for part in parent_name.split(".") if parent_name else ():  # down the path, not a search
        parent = parent._modules[part]
    old = parent._modules[child]
    setattr(parent, child, module)
    for attr, value in list(vars(parent).items()):
        if value is old:
            object.__setattr__(parent, attr, module)
