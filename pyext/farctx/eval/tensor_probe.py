"""Reading llama.cpp's graph tensors while it computes: the evaluation callback (`cb_eval`).

llama.cpp hands every node of a graph to `cb_eval` twice: first asking whether we want it
(`ask=True`), then, for the nodes we said yes to, once it has been computed (`ask=False`); the
scheduler computes the graph in pieces that end at those nodes. `Probe` wraps that protocol:
`want(tensor)` picks the nodes, `seen(tensor)` reads them (`array()` copies a tensor to numpy
through `ggml_backend_tensor_get`, so any backend works). `eval_callback_installed` gives the
next `farctx.Llama` built inside it the callback (llama-cpp-python builds its context parameters
inside `Llama.__init__`, so the callback is added to them there).
"""

from __future__ import annotations

import ctypes
import sys
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable, Iterator, Optional

import numpy as np

from .. import _paths

GGML_MAX_DIMS = 4
GGML_MAX_OP_PARAMS = 64
GGML_MAX_SRC = 10
GGML_MAX_NAME = 64

GGML_TYPE_F32 = 0
GGML_TYPE_F16 = 1
_NUMPY_TYPES = {GGML_TYPE_F32: np.float32, GGML_TYPE_F16: np.float16}


class GgmlTensor(ctypes.Structure):
    """`struct ggml_tensor` of the pinned ggml (ggml.h)."""

    _fields_ = [
        ("type", ctypes.c_int),
        ("buffer", ctypes.c_void_p),
        ("ne", ctypes.c_int64 * GGML_MAX_DIMS),
        ("nb", ctypes.c_size_t * GGML_MAX_DIMS),
        ("op", ctypes.c_int),
        ("op_params", ctypes.c_int32 * (GGML_MAX_OP_PARAMS // 4)),
        ("flags", ctypes.c_int32),
        ("src", ctypes.c_void_p * GGML_MAX_SRC),
        ("view_src", ctypes.c_void_p),
        ("view_offs", ctypes.c_size_t),
        ("data", ctypes.c_void_p),
        ("name", ctypes.c_char * GGML_MAX_NAME),
        ("extra", ctypes.c_void_p),
        ("padding", ctypes.c_char * 8),
    ]


_BASE = {"darwin": "libggml-base.dylib", "win32": "ggml-base.dll"}


@lru_cache(maxsize=1)
def ggml_base() -> Any:
    """libggml-base (the one libllama uses), with the few functions read here."""
    from .._native import native

    native()  # llama_cpp first: the same libggml-base is loaded once
    lib = ctypes.CDLL(str(_paths.lib_dir() / _BASE.get(sys.platform, "libggml-base.so")))
    for name, restype, argtypes in (
        ("ggml_nbytes", ctypes.c_size_t, [ctypes.c_void_p]),
        ("ggml_op_name", ctypes.c_char_p, [ctypes.c_int]),
        ("ggml_backend_tensor_get", None, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t]),
        ("ggml_type_name", ctypes.c_char_p, [ctypes.c_int]),
        ("ggml_flash_attn_ext_has_lse", ctypes.c_bool, [ctypes.c_void_p]),
    ):
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    return lib


class Tensor:
    """One graph node seen by the callback: its address, name, op, shape, and a numpy copy on demand."""

    def __init__(self, address: int) -> None:
        self.address = address
        self.t = GgmlTensor.from_address(address)
        self.name = self.t.name.decode("utf-8", errors="replace")

    @property
    def op(self) -> str:
        return _op_name(self.t.op)

    @property
    def ne(self) -> tuple[int, ...]:
        return tuple(int(x) for x in self.t.ne)

    def src(self, i: int) -> Optional["Tensor"]:
        address = self.t.src[i]
        return Tensor(address) if address else None

    def op_param_f32(self, i: int) -> float:
        return float(ctypes.c_float.from_buffer_copy(ctypes.c_int32(self.t.op_params[i])).value)

    def array(self) -> Optional[np.ndarray]:
        """The tensor as a float32 numpy array of shape (ne[3], ne[2], ne[1], ne[0]); None for other types."""
        dtype = _NUMPY_TYPES.get(self.t.type)
        if dtype is None:
            return None
        lib = ggml_base()
        size = int(lib.ggml_nbytes(self.address))
        raw = np.empty(size, dtype=np.uint8)
        lib.ggml_backend_tensor_get(self.address, raw.ctypes.data, 0, size)
        shape = tuple(int(x) for x in reversed(self.t.ne))
        strides = tuple(int(x) for x in reversed(self.t.nb))
        view = np.lib.stride_tricks.as_strided(raw.view(dtype), shape=shape, strides=strides, writeable=False)
        return view.astype(np.float32)


@lru_cache(maxsize=None)
def _op_name(op: int) -> str:
    return (ggml_base().ggml_op_name(op) or b"").decode()


class Probe:
    """Subclass: `want` says which nodes to read, `seen` reads them. An exception inside the callback
    is kept (`error`) and the rest of the graph computed without further reads; raise it afterwards
    with `check()`."""

    def __init__(self) -> None:
        self.error: Optional[BaseException] = None
        callback_type = _callback_type()

        def callback(address: int, ask: bool, _user: Any) -> bool:
            if self.error is not None:
                return bool(ask) is False
            try:
                tensor = Tensor(address)
                if ask:
                    return self.want(tensor)
                self.seen(tensor)
            except BaseException as exc:  # a ctypes callback must not raise
                self.error = exc
            return True

        self.c_callback = callback_type(callback)  # kept alive as long as the probe

    def want(self, tensor: Tensor) -> bool:
        raise NotImplementedError

    def seen(self, tensor: Tensor) -> None:
        raise NotImplementedError

    def check(self) -> None:
        if self.error is not None:
            error, self.error = self.error, None
            raise error


def _callback_type() -> Any:
    from .._native import native

    return native().llama_cpp.ggml_backend_sched_eval_callback


# one installation at a time (the swap is of a module attribute)
_INSTALL_LOCK = threading.Lock()


@contextmanager
def eval_callback_installed(probe: Probe) -> Iterator[None]:
    """Inside: every llama context this thread creates gets `probe` as its evaluation callback (build the
    farctx.Llama here; llama_cpp.Llama makes its context parameters with
    llama_context_default_params() in its constructor, and cb_eval has no setter after that)."""
    from .._native import native

    module = native().llama_cpp.llama_cpp
    with _INSTALL_LOCK:
        original: Callable[[], Any] = module.llama_context_default_params
        owner = threading.get_ident()

        def with_callback() -> Any:
            params = original()
            if threading.get_ident() == owner:  # a context another thread builds meanwhile gets no callback
                params.cb_eval = probe.c_callback
                params.cb_eval_user_data = None
            return params

        module.llama_context_default_params = with_callback
        try:
            yield
        finally:
            module.llama_context_default_params = original


# -- what flash attention is handed: the layout of every FLASH_ATTN_EXT node ---------------------------------------

GGML_TENSOR_FLAG_INPUT = 1


@dataclass(frozen=True)
class Operand:
    """One source of a flash-attention node: its type, shape, strides and view offset, and what owns its memory
    (`origin`: "cache" for a KV-cache tensor, "input" for a graph input, else the op that wrote it)."""

    type: str
    ne: tuple[int, ...]
    nb: tuple[int, ...]
    offs: int
    origin: str
    base_ne: tuple[int, ...]

    @property
    def layout(self) -> tuple[object, ...]:
        return self.type, self.ne, self.nb, self.offs

    @property
    def whole(self) -> bool:
        """A view of all of the owning tensor's elements (a permutation of a fresh tensor)."""
        return self.offs == 0 and int(np.prod(self.ne)) == int(np.prod(self.base_ne))


@dataclass(frozen=True)
class FlashAttnNode:
    """A FLASH_ATTN_EXT node: its Q, K, V and mask, and whether it returns its rows' log-sum-exp (a CPU-only
    node, ggml_flash_attn_ext_lse)."""

    ops: dict[str, Operand]
    lse: bool = False


def _operand(tensor: Tensor) -> Operand:
    t = tensor.t
    base = Tensor(t.view_src) if t.view_src else tensor
    if base.t.op == 0:  # GGML_OP_NONE: a leaf, the KV cache or a graph input
        origin = "input" if base.t.flags & GGML_TENSOR_FLAG_INPUT else "cache"
    else:
        origin = base.op
    return Operand((ggml_base().ggml_type_name(t.type) or b"").decode(), tensor.ne, tuple(int(x) for x in t.nb),
                   int(t.view_offs), origin, base.ne)


class FlashAttnLayouts(Probe):
    """Records every flash-attention node a graph computes (`nodes`, in order; a reused graph's nodes again each
    time it runs) and reads no data: the graph is computed as without the callback."""

    def __init__(self) -> None:
        super().__init__()
        self.nodes: list[FlashAttnNode] = []

    def want(self, tensor: Tensor) -> bool:
        if tensor.op == "FLASH_ATTN_EXT":
            ops = {name: _operand(src) for name, src in
                   zip(("q", "k", "v", "mask"), (tensor.src(i) for i in range(4))) if src is not None}
            self.nodes.append(FlashAttnNode(ops, bool(ggml_base().ggml_flash_attn_ext_has_lse(tensor.address))))
        return False

    def seen(self, tensor: Tensor) -> None:  # never asked for
        pass

