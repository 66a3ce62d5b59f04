"""attnviz: see how attention works, in real and toy transformers.

The library does every computation; the Streamlit pages only read widgets, call it and draw.
Only attnviz.ui imports streamlit; attnviz.figures imports neither torch nor streamlit.
"""

import ctypes.util
import os

__version__ = "0.1.0"


def _choose_triton_backend() -> None:
    """Without a GPU driver, Triton's kernels must run under its interpreter.

    TRITON_INTERPRET is read when a function is decorated with @triton.jit, and triton.language decorates its own
    standard library when it is first imported, which torch and transformers may do long before attnviz.kernels is
    imported. So the choice is made here, when attnviz is first imported, without importing torch. An explicit
    setting is left alone; attnviz.kernels refines the choice with torch.cuda.is_available().
    """
    if "TRITON_INTERPRET" in os.environ:
        return
    if os.path.exists("/proc/driver/nvidia/version") or ctypes.util.find_library("cuda"):
        return
    os.environ["TRITON_INTERPRET"] = "1"


_choose_triton_backend()
