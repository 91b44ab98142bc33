"""ggml RPC: a model's layers on other machines (`--rpc`, `farctx.Llama(rpc_servers=...)`), served by
llama.cpp's own RPC server (`farctx rpc-server`, the `ggml-rpc-server` built from the pinned source).

ggml-rpc aborts the whole process when a server cannot be reached or speaks another protocol version,
and its connect has no timeout. So every server is first checked here, with a timeout: a TCP connect
and the protocol's HELLO, closed again (the server serves one client at a time). Then its devices are
added through the RPC backend's `ggml_backend_rpc_add_server` and handed to llama.cpp in the model's
`devices` list (RPC devices first, then the local GPUs, as llama.cpp's `--rpc` orders them); they are
never registered with ggml, so a model loaded later without `rpc_servers` does not see them.

The protocol has no authentication: whoever reaches a server's port can run graphs on it and read and
write its memory. Keep servers on loopback or a private network.
"""

from __future__ import annotations

import ctypes
import socket
import struct
import weakref
from typing import Any, Iterable, Optional, Sequence

from .errors import FarctxError

DEFAULT_PORT = 50052
CONNECT_TIMEOUT = 5.0  # seconds, for the connect and for the HELLO answer each

# The pinned ggml-rpc's wire protocol (ggml/include/ggml-rpc.h: RPC_PROTO_*; ggml/src/ggml-rpc/ggml-rpc.cpp:
# RPC_CMD_HELLO, rpc_msg_hello_{req,rsp}; transport.h: RPC_CONN_CAPS_SIZE). tests/test_rpc.py reads them
# from the source, so a new pin that changes them fails there.
PROTO_MAJOR = 7
PROTO_MINOR = 0
CMD_HELLO = 14
CONN_CAPS_SIZE = 24

# ggml_backend_dev_type
_DEV_GPU, _DEV_IGPU = 1, 2

# Endpoints with a connection that a live engine of this process holds (ggml keeps one connection per
# endpoint for as long as a buffer or backend of it exists): the check would wait behind it, because
# a server serves one client at a time. Mirrors ggml's own per-process connection table.
_HOLDERS: dict[str, "weakref.WeakSet[Any]"] = {}


def parse_servers(servers: str | Sequence[str] | None) -> list[str]:
    """'HOST:PORT[,HOST:PORT...]' (or a list of 'HOST:PORT') as a list of endpoints, checked for form."""
    if servers is None:
        return []
    items = servers.split(",") if isinstance(servers, str) else list(servers)
    endpoints = []
    for item in items:
        item = str(item).strip()
        host, sep, port = item.rpartition(":")
        if not sep or not host or ":" in host or not port.isdigit() or not 0 < int(port) < 65536:
            raise FarctxError(f"RPC server '{item}' is not HOST:PORT (an IPv4 address or a host name, port 1-65535)")
        endpoints.append(f"{host}:{int(port)}")
    if not endpoints:
        raise FarctxError("no RPC server given")
    if len(set(endpoints)) != len(endpoints):
        raise FarctxError(f"an RPC server is given twice: {','.join(endpoints)}")
    return endpoints


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


def check_server(endpoint: str, timeout: Optional[float] = None) -> tuple[int, int, int]:
    """Connect to an RPC server and exchange HELLO, within `timeout` seconds for each (default
    CONNECT_TIMEOUT); the server's protocol version (major, minor, patch). FarctxError, naming the
    endpoint, when it cannot be used."""
    timeout = timeout or CONNECT_TIMEOUT
    host, _, port = endpoint.rpartition(":")
    try:
        sock = socket.create_connection((host, int(port)), timeout=timeout)
    except socket.timeout:
        raise FarctxError(f"RPC server {endpoint}: no connection within {timeout:g} s") from None
    except OSError as exc:
        raise FarctxError(f"RPC server {endpoint} unreachable: {exc.strerror or exc}") from None
    with sock:
        sock.settimeout(timeout)
        try:
            sock.sendall(bytes([CMD_HELLO]) + struct.pack("<Q", CONN_CAPS_SIZE) + bytes(CONN_CAPS_SIZE))
            (size,) = struct.unpack("<Q", _recv_exact(sock, 8))
            if size < 3 or size > 4096:
                raise FarctxError(f"RPC server {endpoint}: not a ggml RPC server (HELLO answer of {size} bytes)")
            major, minor, patch = _recv_exact(sock, size)[:3]
        except socket.timeout:
            raise FarctxError(f"RPC server {endpoint}: no answer to HELLO within {timeout:g} s "
                              "(busy with another client, or not a ggml RPC server)") from None
        except EOFError:
            raise FarctxError(f"RPC server {endpoint} closed the connection at HELLO: another ggml RPC "
                              f"protocol version than this build's {PROTO_MAJOR}.{PROTO_MINOR}, or not an RPC "
                              "server (run `farctx rpc-server` of this farctx there)") from None
        except OSError as exc:
            raise FarctxError(f"RPC server {endpoint}: {exc.strerror or exc} at HELLO") from None
    if major != PROTO_MAJOR or minor > PROTO_MINOR:
        raise FarctxError(f"RPC server {endpoint} speaks ggml RPC protocol {major}.{minor}.{patch}, this build "
                          f"{PROTO_MAJOR}.{PROTO_MINOR}.x: run `farctx rpc-server` of this farctx there")
    return major, minor, patch


def _bind(lib: Any) -> Any:
    from .backends import declare

    return declare(lib, (
        ("ggml_backend_reg_by_name", ctypes.c_void_p, [ctypes.c_char_p]),
        ("ggml_backend_reg_get_proc_address", ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_char_p]),
        ("ggml_backend_reg_dev_count", ctypes.c_size_t, [ctypes.c_void_p]),
        ("ggml_backend_reg_dev_get", ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_size_t]),
        ("ggml_backend_dev_count", ctypes.c_size_t, []),
        ("ggml_backend_dev_get", ctypes.c_void_p, [ctypes.c_size_t]),
        ("ggml_backend_dev_type", ctypes.c_int, [ctypes.c_void_p]),
        ("ggml_backend_dev_name", ctypes.c_char_p, [ctypes.c_void_p]),
    ))


def _ggml(ggml: Optional[ctypes.CDLL]) -> Any:
    if ggml is None:
        from .backends import _ggml as ours

        ggml = ours()
    return _bind(ggml)


def rpc_devices(endpoints: Iterable[str], ggml: Optional[ctypes.CDLL] = None,
                timeout: Optional[float] = None) -> list[int]:
    """The devices of these RPC servers (ggml_backend_dev_t addresses), each server checked first."""
    lib = _ggml(ggml)
    reg = lib.ggml_backend_reg_by_name(b"RPC")
    if not reg:
        raise FarctxError("this build has no RPC backend (build it with CMAKE_ARGS=-DGGML_RPC=on)")
    address = lib.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_rpc_add_server")
    if not address:
        raise FarctxError("the RPC backend has no ggml_backend_rpc_add_server")
    add_server = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)(address)
    devices = []
    for endpoint in endpoints:
        if not _HOLDERS.get(endpoint):
            check_server(endpoint, timeout)
        server_reg = add_server(endpoint.encode())
        n = lib.ggml_backend_reg_dev_count(server_reg) if server_reg else 0
        if not n:
            raise FarctxError(f"RPC server {endpoint} offers no device")
        devices += [lib.ggml_backend_reg_dev_get(server_reg, i) for i in range(n)]
    return devices


def local_gpus(ggml: Optional[ctypes.CDLL] = None) -> list[int]:
    """The devices llama.cpp offloads to by default (GPUs; integrated GPUs only when there is no other)."""
    lib = _ggml(ggml)
    devs = [lib.ggml_backend_dev_get(i) for i in range(lib.ggml_backend_dev_count())]
    gpus = [d for d in devs if lib.ggml_backend_dev_type(d) == _DEV_GPU]
    return gpus or [d for d in devs if lib.ggml_backend_dev_type(d) == _DEV_IGPU]


def device_names(devices: Sequence[int], ggml: Optional[ctypes.CDLL] = None) -> list[str]:
    lib = _ggml(ggml)
    return [(lib.ggml_backend_dev_name(d) or b"").decode() for d in devices]


def model_devices(endpoints: Sequence[str], ggml: Optional[ctypes.CDLL] = None) -> Any:
    """llama_model_params.devices for a model on these RPC servers: a NULL-terminated array of the
    servers' devices, then the local GPUs (llama.cpp's order for `--rpc`: the first layers go to the
    servers). Keep it referenced while the model loads."""
    devices = rpc_devices(endpoints, ggml) + local_gpus(ggml)
    return (ctypes.c_void_p * (len(devices) + 1))(*devices, None)


def hold(owner: Any, endpoints: Iterable[str]) -> None:
    """`owner` (an engine) holds a connection to each endpoint until it is collected or released."""
    for endpoint in endpoints:
        _HOLDERS.setdefault(endpoint, weakref.WeakSet()).add(owner)


def release(owner: Any) -> None:
    for holders in _HOLDERS.values():
        holders.discard(owner)


def model_params_property() -> property:
    """`model_params` for a llama_cpp.Llama subclass: llama_cpp.Llama.__init__ creates the struct and sets
    its fields, never `devices`; this puts the instance's `_model_devices` (if any) there as it is
    assigned, before the model loads."""

    def get(self: Any) -> Any:
        return self.__dict__["model_params"]

    def set_(self: Any, params: Any) -> None:
        devices = getattr(self, "_model_devices", None)
        if devices is not None:
            params.devices = ctypes.addressof(devices)
        self.__dict__["model_params"] = params

    return property(get, set_)


def server_argv(binary: str, host: str, port: int, devices: Optional[str], threads: Optional[int],
                cache: bool) -> list[str]:
    """The RPC server's command line (llama.cpp's tools/rpc flags)."""
    argv = [binary, "--host", host, "--port", str(port)]
    if devices:
        argv += ["--device", devices]
    if threads:
        argv += ["--threads", str(threads)]
    if cache:
        argv.append("--cache")
    return argv


def is_loopback(host: str) -> bool:
    try:
        address = socket.gethostbyname(host)
    except OSError:
        return False
    return address.startswith("127.")
