"""A model and its context: the runtime options, the model loaded once, its facts, and the context plan.

`RuntimeOptions` is the one set of options that says how llama.cpp runs a model (llama.cpp's names; the CLI, the
server and the llm plugin fill it from their flags, farctx.Llama and SequenceBatch from their keyword arguments).
`LoadedModel` loads a model once through llama-cpp-python's LlamaModel (whose cleanup frees it), reads the facts
the plan needs from the loaded model, and builds a llama_context to a plan; SequenceBatch is built on it.
farctx.Llama, whose model llama_cpp.Llama loads, asks `plan_for` with the facts of that model. Nothing here
decides a size: libfarctx's context plan does (`farctx.methods.context_plan`).
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass, field, fields
from typing import Any, Optional, Sequence

from . import rpc
from .errors import FarctxError
from .kv_types import check_kv_types, kv_type_id
from .methods import ContextPlan, context_plan
from .models import ModelInfo, check_gguf, resolve_model_path
from ._native import llama_log, native

_N = native()
_LOG = llama_log()


@dataclass(frozen=True)
class OptionInfo:
    """A runtime option's row of the one table: the CLI flag that sets it (llama.cpp's names), how the flag's text
    becomes the value (`kind`), its help, its least value, whether the llm plugin offers it, and why its default
    differs from llama.cpp's where it does. The table is RuntimeOptions' fields (`option_infos()`)."""

    name: str                     # the field: farctx.Llama's keyword argument, the llm plugin's option
    flags: tuple[str, ...]        # () : no flag
    kind: str                     # cells, threads, layers, switch, kv, split, servers ('' : no flag)
    help: str
    minimum: Optional[int] = None
    plugin: bool = False
    differs: str = ""


def _option(default: Any, help: str, *, flags: tuple[str, ...] = (), kind: str = "", minimum: Optional[int] = None,
            plugin: bool = False, differs: str = "", factory: Any = None) -> Any:
    meta = dict(flags=flags, kind=kind, help=help, minimum=minimum, plugin=plugin, differs=differs)
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class RuntimeOptions:
    """How llama.cpp runs the model, by llama.cpp's names (docs/python-api.md, "Runtime options"): the one table of
    runtime options. Each field's metadata gives its CLI flag, help and reason where its default differs from
    llama.cpp's; the CLI's flags (every command and the server), farctx.Llama's and SequenceBatch's keyword
    arguments and the llm plugin's options are made from it (`option_infos`)."""

    n_ctx: int = _option(
        0, "KV cache size in tokens (0: what the method needs: head + n_local + n_ubatch for a fixed-cache method; "
        "the prompt and the generation, else the trained context (vanilla, auto) or 4 x it, for the others)",
        flags=("-c", "--ctx-size"), kind="cells", minimum=0, plugin=True,
        differs="llama.cpp's 512 (llama-server: the trained context); a method past the trained context needs its "
                "own size")
    n_batch: Optional[int] = _option(
        None, "logical batch size (0 / unset: 512, at most the cache)", flags=("-b", "--batch-size"), kind="cells",
        minimum=1, plugin=True,
        differs="llama.cpp's 2048: 512 is llama-cpp-python's, and a cache smaller than 2048 clamps it anyway")
    n_ubatch: Optional[int] = _option(
        None, "physical batch size (0 / unset: 512, or what a fixed-cache method's -c leaves room for)",
        flags=("-ub", "--ubatch-size"), kind="cells", minimum=1, plugin=True)
    n_threads: Optional[int] = _option(
        None, "CPU threads (unset: llama.cpp's default; -t sets the batch threads too, as llama.cpp's)",
        flags=("-t", "--threads"), kind="threads", minimum=1, plugin=True)
    n_threads_batch: Optional[int] = _option(None, "CPU threads for prompt batches (unset: n_threads)", minimum=1)
    flash_attn: bool = _option(
        False, "flash attention", flags=("-fa", "--flash-attn"), kind="switch", plugin=True,
        differs="llama.cpp's auto: the methods' graphs are checked with it on and off, and off is the one every "
                "backend runs the same")
    type_k: Optional[int] = _option(
        None, "KV cache type for K (a ggml type id or llama.cpp's name; unset: f16)", flags=("-ctk", "--cache-type-k"),
        kind="kv")
    type_v: Optional[int] = _option(
        None, "KV cache type for V (a quantized V needs flash attention)", flags=("-ctv", "--cache-type-v"), kind="kv")
    n_gpu_layers: int = _option(
        0, "layers to offload to the GPU (a number or 'all'; -1: all)", flags=("-ngl", "--gpu-layers", "--n-gpu-layers"),
        kind="layers", minimum=-1, plugin=True,
        differs="llama.cpp's -1, every layer: 0 is llama-cpp-python's, and the CPU is where every method is checked "
                "first")
    tensor_split: Optional[Sequence[float]] = _option(
        None, "proportions of the offloaded layers per device, in llama.cpp's order: the --rpc servers, then the "
        "local GPUs (unset: by free memory)", flags=("-ts", "--tensor-split"), kind="split")
    rpc_servers: list[str] = _option(
        None, "comma-separated HOST:PORT of ggml RPC servers (`farctx rpc-server`): the offloaded layers (-ngl) go "
        "to them, then to the local GPUs", flags=("--rpc",), kind="servers", factory=list)
    offload_kqv: bool = _option(True, "the KV cache and its attention on the GPU with the offloaded layers")
    use_mmap: bool = _option(True, "map the model file instead of reading it")
    swa_full: bool = _option(False, "a full-size cache for sliding-window layers",
                             differs="on in the library; off is llama-server's: a sliding-window cache holds its "
                                     "window, not the context")
    verbose: bool = _option(False, "llama.cpp's log on stderr")

    def __post_init__(self) -> None:
        self.type_k, self.type_v = kv_type_id(self.type_k), kv_type_id(self.type_v)
        check_kv_types(self.type_k, self.type_v, self.flash_attn)
        self.rpc_servers = rpc.parse_servers(self.rpc_servers) if self.rpc_servers else []
        if self.n_ctx is None or self.n_ctx < 0:
            raise FarctxError(f"n_ctx must be 0 (the method's) or a number of cells, not {self.n_ctx}")

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @classmethod
    def take(cls, kwargs: dict[str, Any]) -> "RuntimeOptions":
        """The options among keyword arguments, removed from them (None: the default)."""
        given = {name: kwargs.pop(name) for name in cls.names() if name in kwargs}
        return cls(**{k: v for k, v in given.items() if v is not None})

    def kwargs(self) -> dict[str, Any]:
        """The options set away from their defaults, as keyword arguments of farctx.Llama and SequenceBatch."""
        default = RuntimeOptions()
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) != getattr(default, f.name)}

    def llama_kwargs(self) -> dict[str, Any]:
        """These options as keyword arguments of llama_cpp.Llama (n_ctx, the batches and rpc_servers left to
        farctx.Llama, which plans them)."""
        out: dict[str, Any] = {"flash_attn": self.flash_attn, "n_gpu_layers": self.n_gpu_layers,
                               "offload_kqv": self.offload_kqv, "use_mmap": self.use_mmap,
                               "swa_full": self.swa_full, "verbose": self.verbose}
        for name in ("n_threads", "type_k", "type_v", "tensor_split"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        if self.n_threads_batch is not None or self.n_threads is not None:
            out["n_threads_batch"] = self.n_threads_batch or self.n_threads  # llama.cpp's -t sets both
        return out


def option_infos() -> tuple[OptionInfo, ...]:
    """The table of runtime options, in RuntimeOptions' field order."""
    return tuple(OptionInfo(f.name, **f.metadata) for f in fields(RuntimeOptions))


@dataclass(frozen=True)
class ModelFacts:
    """What the plan and the streams need to know of a loaded model."""

    n_ctx_train: int
    n_swa: int          # the sliding window of its sliding-window layers; 0: none
    n_vocab: int

    @classmethod
    def of(cls, model: Any) -> "ModelFacts":
        """The facts of a loaded llama_model (a ctypes pointer)."""
        lc = _N.llama_cpp
        return cls(n_ctx_train=int(lc.llama_model_n_ctx_train(model)), n_swa=int(lc.llama_model_n_swa(model)),
                   n_vocab=int(lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(model))))


def plan_for(params: Any, facts: ModelFacts, options: RuntimeOptions, *, n_seq: int = 1, n_prompt: int = 0,
             n_predict: int = 0) -> ContextPlan:
    """The context plan of a method on a loaded model under these options (a stream of n_prompt + n_predict
    tokens; 0 and 0: of unknown length). Raises FarctxError with every size when the cache cannot hold it."""
    return context_plan(params, facts.n_ctx_train, n_swa=facts.n_swa, n_ctx=options.n_ctx, n_batch=options.n_batch,
                        n_ubatch=options.n_ubatch, n_seq=n_seq, n_prompt=n_prompt, n_predict=n_predict)


def batch_sizes(plan: ContextPlan, options: RuntimeOptions) -> tuple[int, int]:
    """n_batch and n_ubatch to make a context with: the plan's, but a size given as 0 stays 0 for llama.cpp to
    accept or refuse (the plan reads 0 as unset)."""
    return (0 if options.n_batch == 0 else plan.n_batch), (0 if options.n_ubatch == 0 else plan.n_ubatch)


class LoadedModel:
    """A model loaded once under `options` (llama-cpp-python's LlamaModel owns it), its facts, and its contexts.

    `deterministic` loads the weights without repacking (the batch-invariant kernels need the plain layout).
    """

    def __init__(self, model_path: Any, options: RuntimeOptions, *, deterministic: bool = False) -> None:
        path = resolve_model_path(model_path)
        check_gguf(path)
        self.path = str(path)
        self.options = options
        self.deterministic = deterministic
        lc = _N.llama_cpp
        params = lc.llama_model_default_params()
        params.n_gpu_layers = 0x7FFFFFFF if options.n_gpu_layers == -1 else options.n_gpu_layers
        params.use_mmap = options.use_mmap
        if deterministic:
            params.use_extra_bufts = False  # repacked weights take other kernels by the batch's column count
        # kept referenced while the model lives: llama.cpp reads both arrays at load
        self._devices = rpc.model_devices(options.rpc_servers) if options.rpc_servers else None
        if self._devices is not None:
            params.devices = ctypes.addressof(self._devices)
        self._split = None
        if options.tensor_split:
            self._split = (ctypes.c_float * lc.LLAMA_MAX_DEVICES)(*options.tensor_split)
            params.tensor_split = self._split
        _LOG.clear()
        _LOG.verbose = options.verbose
        try:
            self.model = _N.llama_cpp._internals.LlamaModel(path_model=self.path, params=params,
                                                                        verbose=options.verbose)
        except ValueError:
            raise FarctxError(f"llama.cpp could not load {self.path}: {_LOG.reason() or 'see the log'}") from None
        rpc.hold(self, options.rpc_servers)
        self.facts = ModelFacts.of(self.model.model)

    def plan(self, params: Any, *, n_seq: int = 1, n_prompt: int = 0, n_predict: int = 0) -> ContextPlan:
        return plan_for(params, self.facts, self.options, n_seq=n_seq, n_prompt=n_prompt, n_predict=n_predict)

    def new_context(self, plan: ContextPlan, n_seq: int) -> Any:
        """A llama_context (llama-cpp-python's LlamaContext, freed with the model) of n_seq KV streams, made to
        the plan."""
        lc = _N.llama_cpp
        opts = self.options
        n_batch, n_ubatch = batch_sizes(plan, opts)
        if n_ubatch < 1 or n_batch < n_seq:
            # llama.cpp keeps an output row per sequence in a buffer of n_batch rows (it aborts past it)
            raise FarctxError(f"n_batch ({n_batch}) must be at least n_seq ({n_seq}) and n_ubatch ({n_ubatch}) "
                              "at least 1: each decode holds an output row per sequence")
        cparams = lc.llama_context_default_params()
        cparams.n_ctx = plan.n_ctx
        cparams.n_seq_max = n_seq
        cparams.kv_unified = False  # one KV stream per sequence: the attention methods fill a mask per stream
        cparams.n_batch = n_batch
        cparams.n_ubatch = n_ubatch
        if opts.n_threads:
            cparams.n_threads = opts.n_threads
        if opts.n_threads_batch or opts.n_threads:
            cparams.n_threads_batch = opts.n_threads_batch or opts.n_threads
        cparams.flash_attn_type = (lc.LLAMA_FLASH_ATTN_TYPE_ENABLED if opts.flash_attn
                                   else lc.LLAMA_FLASH_ATTN_TYPE_DISABLED)
        if opts.type_k is not None:
            cparams.type_k = opts.type_k
        if opts.type_v is not None:
            cparams.type_v = opts.type_v
        cparams.offload_kqv = opts.offload_kqv
        cparams.swa_full = opts.swa_full
        cparams.no_perf = True
        _LOG.clear()
        try:
            ctx = lc._internals.LlamaContext(model=self.model, params=cparams, verbose=opts.verbose)
        except ValueError:
            raise FarctxError(f"llama.cpp could not create a context for {self.path}: "
                              f"{_LOG.reason() or 'see the log'}") from None
        if self.deterministic and not _batch_invariant(ctx.ctx):
            ctx.close()
            raise FarctxError("deterministic needs every layer on the CPU backend: a GPU or RPC backend computes "
                              "part of this context's graph, and only the CPU has batch-invariant kernels "
                              "(use -ngl 0 on a CPU-only build)")
        return ctx

    def close(self) -> None:
        """Free the model and the contexts made from it (a second call does nothing)."""
        model = getattr(self, "model", None)
        if model is not None:
            model.close()
            self.model = None
            rpc.release(self)  # the model and its RPC connections are freed


def _batch_invariant(ctx: Any) -> bool:
    """Switch ctx to batch-invariant kernels; False if a backend without them computes part of its graph."""
    lib = _N.llama_cpp.llama_cpp._lib
    fn = lib.llama_set_batch_invariant
    fn.restype, fn.argtypes = ctypes.c_bool, [ctypes.c_void_p, ctypes.c_bool]
    return bool(fn(ctx, True))


def method_support(model: ModelInfo | str | os.PathLike[str] | None = None) -> dict[str, str]:
    """For each method: "yes", or libfarctx's reason why it cannot run on this model in this build
    (farctx_method_supported, the check farctx_session_init makes), as "no: <reason>"; a method that runs another
    one here (auto on a model only vanilla runs: farctx_method_for_model) as "as <method>: <reason>"."""
    path = model.path if isinstance(model, ModelInfo) else model
    loaded = LoadedModel(path, RuntimeOptions())  # memory-mapped on the CPU: the weights are not read
    try:
        nat = _N
        c_model = nat.llama_model_ptr(loaded.model.model)
        err = nat.ffi.new("char[]", 512)
        result = {}
        for code in range(nat.lib.farctx_method_count()):
            name = nat.ffi.string(nat.lib.farctx_method_name(code)).decode()
            rc = nat.lib.farctx_method_supported(code, c_model, err, 512)
            result[name] = "yes" if rc == nat.lib.FARCTX_OK else "no: " + nat.ffi.string(err).decode()
            runs = nat.lib.farctx_method_for_model(code, c_model, err, 512)
            if rc == nat.lib.FARCTX_OK and runs != code:
                other = nat.ffi.string(nat.lib.farctx_method_name(runs)).decode()
                result[name] = f"as {other}: {nat.ffi.string(err).decode()}"
    finally:
        loaded.close()
    return result
