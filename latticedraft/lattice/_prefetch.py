"""``prefetch(arr, i)``: a cache-line prefetch hint for numba kernels (LLVM ``llvm.prefetch``).

No effect on results and never faults (an index past the end is harmless; no bounds check).
Used to issue a slot's independent table reads together, so their cache misses overlap.
"""

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic


@intrinsic
def prefetch(typingctx, arr, i):
    """Prefetch the cache line of ``arr[i]`` (1-d array, integer index) for reading."""
    if not isinstance(arr, types.Array) or arr.ndim != 1 or not isinstance(i, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        aryty = sig.args[0]
        ary = context.make_array(aryty)(context, builder, args[0])
        idx = context.cast(builder, args[1], sig.args[1], types.intp)
        ptr = cgutils.get_item_pointer(context, builder, aryty, ary, [idx], wraparound=False)
        i8p = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]),
                                            "llvm.prefetch.p0")
        builder.call(fn, [builder.bitcast(ptr, i8p), i32(0), i32(3), i32(1)])  # read, keep in all levels, data
        return context.get_dummy_value()

    return types.none(arr, i), codegen
