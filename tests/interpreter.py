"""One fix to Triton's interpreter (TRITON_INTERPRET=1), installed by the root conftest.

Triton 3.6's interpreter rounds downcasts to 8-bit floats wrongly (triton-lang/triton#8322): ties
round away from zero, not to even; a round-up that overflows the mantissa loses its carry (fp32
126.24 to float8e4nv becomes 64, not 128); subnormal results are rounded twice -- as
triton-lang/triton#11897 describes (#9808 fixes the ties only); neither merged yet.
The GPU rounds to nearest even and saturates at 448 (cvt.rn.satfinite), as torch's own cast
does, so the interpreter takes torch's cast for that one conversion; GPU tests check the
compiled kernels against the same references without this."""

import numpy as np
import torch
import triton.language as tl
from triton._C.libtriton import ir
from triton.runtime import interpreter

SOURCES = {tl.float32: np.float32, tl.float16: np.float16}


def fix_e4m3_rounding() -> None:
    original = interpreter._convert_float
    if getattr(original, "handbook_fix", False):
        return

    def convert(data, src, dst, rounding_mode):
        if dst == tl.float8e4nv and src in SOURCES and rounding_mode == ir.ROUNDING_MODE.RTNE:
            values = torch.from_numpy(np.ascontiguousarray(data).view(SOURCES[src]))
            return values.to(torch.float8_e4m3fn).view(torch.uint8).numpy().reshape(data.shape)
        return original(data, src, dst, rounding_mode)

    convert.handbook_fix = True
    interpreter._convert_float = convert
