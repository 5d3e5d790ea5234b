"""A TCP relay on loopback that delays every byte by a fixed time each way: a network's round trip, emulated.

The benchmark's PostgreSQL server answers over loopback, where a round trip
costs about 0.07 ms; a warehouse answers across a network. The kernel here has
no ``netem`` queueing discipline, so this relay stands in for it: it accepts
connections on a free loopback port, connects each to the server, and holds
every chunk it reads for ``one_way_ms`` before writing it on, in both
directions and in order. A client waiting for an answer therefore waits
``2 x one_way_ms`` more per round trip (plus the relay's own hop, which
:func:`bench.pg_server.round_trip_ms` measures with the rest). Bandwidth is not
limited. The relay runs in a process of its own, so its threads never compete
with the measured client for a Python lock.

Run by :func:`delayed_server`, which forks the relay's process.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import queue
import signal
import socket
import threading
import time
from collections.abc import Iterator

from bench.measure import BenchError

CHUNK = 256 * 1024


def _nodelay(sock: socket.socket) -> socket.socket:
    """Send every write at once (no Nagle wait): the delay is the relay's own, nothing else."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _precise_sleeps() -> None:
    """Wake sleeping threads on time: Linux may otherwise add up to 50 µs of timer slack to every sleep.

    The slack is per thread and inherited, so setting it before any thread starts sets it for all.
    """
    import ctypes

    pr_set_timerslack = 29
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_timerslack, 1, 0, 0, 0)


def _pump(src: socket.socket, dst: socket.socket, delay_s: float) -> None:
    """Copy ``src`` to ``dst``, each chunk written ``delay_s`` after it was read; ends when ``src`` closes."""
    held: queue.SimpleQueue[tuple[float, bytes]] = queue.SimpleQueue()

    def write() -> None:
        while True:
            due, data = held.get()
            if not data:
                break
            wait = due - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            try:
                dst.sendall(data)
            except OSError:
                break
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    try:
        while data := src.recv(CHUNK):
            held.put((time.perf_counter() + delay_s, data))
    except OSError:
        pass
    held.put((0.0, b""))
    writer.join()


def _relay(client: socket.socket, target: tuple[str, int], delay_s: float) -> None:
    """One connection: the client's bytes to the server and back, each way delayed."""
    try:
        server = _nodelay(socket.create_connection(target))
    except OSError:
        client.close()
        return
    back = threading.Thread(target=_pump, args=(server, client, delay_s), daemon=True)
    back.start()
    _pump(client, server, delay_s)
    back.join()
    client.close()
    server.close()


def _serve(listener: socket.socket, target: tuple[str, int], delay_s: float) -> None:
    """The relay process: relay each connection accepted on ``listener``, forever.

    A forked child inherits its parent's signal handlers (Airflow's, say, in a
    test process that loaded it), so SIGTERM is set back to its default here:
    otherwise ``terminate`` could leave the relay accepting connections.
    """
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _precise_sleeps()
    while True:
        client, _ = listener.accept()
        threading.Thread(target=_relay, args=(_nodelay(client), target, delay_s), daemon=True).start()


@contextlib.contextmanager
def delayed_server(server: str, one_way_ms: float) -> Iterator[str]:
    """A relay to ``server`` (a libpq connection string) delaying each way by ``one_way_ms``, while in the block.

    Yields:
        The connection string of the server through the relay (the same one
        with ``host`` and ``port`` of the relay).

    Raises:
        BenchError: the server is not reached over TCP.
    """
    import psycopg

    params = psycopg.conninfo.conninfo_to_dict(server)
    host, port = str(params.get("host") or ""), int(params.get("port") or 5432)
    if not host or host.startswith("/"):
        raise BenchError(f"the relay needs a server reached over TCP, not {host or 'the default socket'!r}")
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    # A process of its own (forked, so it inherits the listening socket), never competing for this one's GIL.
    relay = multiprocessing.get_context("fork").Process(
        target=_serve, args=(listener, (host, port), one_way_ms / 1000.0), daemon=True
    )
    relay.start()
    try:
        yield psycopg.conninfo.make_conninfo(server, host="127.0.0.1", port=str(listener.getsockname()[1]))
    finally:
        relay.terminate()
        relay.join(timeout=5)
        if relay.is_alive():
            relay.kill()
            relay.join()
        listener.close()
