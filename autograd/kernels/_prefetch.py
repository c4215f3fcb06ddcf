"""prefetch(array, index): ask the CPU to start loading the cache line of array.flat[index].

LLVM's llvm.prefetch (read, keep in all cache levels), for Numba kernels that stream through
more memory than the caches hold while doing enough arithmetic per byte that the hardware
prefetcher falls behind: the quantized matrix-vector kernels (kernels/quantized.py) read their
blocks from memory at 5.4 GB/s on one core without it and 11.7 GB/s with it (a 2-core Xeon,
a (400000, 576) q8_0 weight; numpy's own sum reads 16.3 GB/s there). A hint only: it changes
no value, and an index past the array is never dereferenced (the kernels still stay inside).

Imported by kernel modules only (it imports Numba at once).
"""

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

_I32 = ir.IntType(32)


@intrinsic
def prefetch(typingctx, array, index):
    """prefetch(array, index) -> None, for a C-contiguous array and an element index."""
    if not isinstance(array, types.Array) or not isinstance(index, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        byte_pointer = ir.IntType(8).as_pointer()
        function_type = ir.FunctionType(ir.VoidType(), [byte_pointer, _I32, _I32, _I32])
        llvm_prefetch = builder.module.declare_intrinsic(
            "llvm.prefetch", [byte_pointer], function_type
        )
        address = builder.bitcast(builder.gep(data, [args[1]]), byte_pointer)
        # rw = 0 (read), locality = 3 (keep in every level), cache type = 1 (data)
        builder.call(llvm_prefetch, [address, _I32(0), _I32(3), _I32(1)])
        return context.get_dummy_value()

    return types.void(array, index), codegen
