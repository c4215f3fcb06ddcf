"""The compiled step, `autograd.compile` (docs/compile.md): trace one training step, plan its
memory, replay it. Read in this order:

    recorder.py   trace: what one eager call did, refusing what a replay could not repeat
    plan.py       plan: a slot per value, liveness, the arena, one closure per replay step;
                  each op's step is the op's own (autograd.tensor.Function's compiled form)
    matmul.py     large products split over two threads (fusion=True)
    optimizer.py  the fused optimizer over flat buffers
    shard.py      the batch split over threads, one plan per shard
    optimizer.py  how a plan asks the optimizer for its update over flat buffers
    compiler.py   compile(): one plan per argument signature, trace on the first call, replay

`autograd.compile` is the function (compiler.compile); this package is `autograd.compile`'s home,
reached by its submodules' names (`from autograd.compile import plan`).
"""

from autograd.compile.compiler import CompiledStep, compile
from autograd.compile.recorder import TraceError
from autograd.compile.shard import ShardedPlan

__all__ = ["CompiledStep", "ShardedPlan", "TraceError", "compile"]
