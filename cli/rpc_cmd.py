"""farctx rpc-server: llama.cpp's ggml RPC server (built from the pinned source, shipped in farctx/lib),
which lends this machine's devices to `--rpc` runs elsewhere."""

from __future__ import annotations

import errno
import os
import socket
import sys
from typing import Optional

import click


@click.command(name="rpc-server")
@click.option("-H", "--host", default="127.0.0.1", show_default=True,
              help="address to listen on (IPv4 or a host name; loopback by default: the protocol has no "
                   "authentication)")
@click.option("-p", "--port", type=click.IntRange(1, 65535), default=50052, show_default=True, help="port to listen on")
@click.option("-d", "--device", "devices", default=None, metavar="DEV1,DEV2",
              help="devices to offer, by ggml name (CPU, CUDA0, Vulkan0, ...; `farctx info` lists them) "
                   "[default: every GPU, else the CPU]")
@click.option("-t", "--threads", "n_threads", type=click.IntRange(1), default=None,
              help="threads for the CPU device [default: half the cores]")
@click.option("-c", "--cache", is_flag=True,
              help="keep the tensors clients send in a local file cache ($LLAMA_CACHE/rpc, else "
                   "~/.cache/llama.cpp/rpc): a client loading the same model again sends only the hashes of "
                   "tensors of 10 MiB or more")
def rpc_server(host: str, port: int, devices: Optional[str], n_threads: Optional[int], cache: bool) -> None:
    """Lend this machine's devices to `--rpc` runs (llama.cpp's RPC server; runs until stopped).

    Start one per machine, then elsewhere: farctx generate --rpc HOST:PORT,HOST:PORT -ngl all ...
    """
    from farctx import _paths
    from farctx.errors import FarctxError
    from farctx.rpc import PROTO_MAJOR, PROTO_MINOR, is_loopback, server_argv

    binary = _paths.rpc_server_path()
    try:
        address = socket.gethostbyname(host)  # the server binds IPv4 literals only
    except OSError as exc:
        raise click.BadParameter(f"cannot resolve '{host}': {exc}", param_hint="--host") from None
    _check_port_free(address, port)
    if not is_loopback(address):
        click.echo(f"farctx: warning: listening on {host}:{port} ({address}), beyond loopback. The RPC protocol has "
                   "no authentication and no encryption: anyone who reaches this port can run computations here "
                   "and read or write the memory this server hands out. Use it only on a network you trust.",
                   err=True)
    click.echo(f"farctx: rpc-server on {address}:{port} (ggml RPC protocol {PROTO_MAJOR}.{PROTO_MINOR}; "
               f"{binary}); clients: --rpc {address if address != '0.0.0.0' else 'THIS_HOST'}:{port}", err=True)
    sys.stdout.flush()
    sys.stderr.flush()
    argv = server_argv(str(binary), address, port, devices, n_threads, cache)
    try:
        os.execv(argv[0], argv)  # the server itself: signals and the exit status are its own
    except OSError as exc:
        raise FarctxError(f"could not start {binary}: {exc.strerror or exc}") from None


def _check_port_free(address: str, port: int) -> None:
    """The server reports a port it cannot bind only as a line and exit status 0: ask first."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((address, port))
        except OSError as exc:
            reason = "in use" if exc.errno == errno.EADDRINUSE else (exc.strerror or str(exc))
            raise click.ClickException(f"cannot listen on {address}:{port}: {reason}") from None
