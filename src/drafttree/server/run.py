"""Running the app with uvicorn: in the foreground (``drafttree serve``) or in a thread (tests, notebooks)."""

from __future__ import annotations

import gc
import threading
import time

import uvicorn

from drafttree.errors import DraftTreeError


class ServerThread:
    """uvicorn serving ``app`` from a background thread; ``url`` once started, ``stop()`` shuts down gracefully."""

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning"):
        self.server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level=log_level,
                                                    timeout_graceful_shutdown=10))
        self.thread = threading.Thread(target=self.server.run, name="drafttree-uvicorn", daemon=True)

    def start(self, timeout: float = 120.0) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive():
                raise DraftTreeError("the server did not start (is the port free?)")
            if time.monotonic() > deadline:
                raise DraftTreeError("the server did not start in time")
            time.sleep(0.05)
        return self

    @property
    def server_address(self) -> tuple[str, int]:
        sock = self.server.servers[0].sockets[0]
        return sock.getsockname()[:2]

    @property
    def url(self) -> str:
        host, port = self.server_address
        host = "127.0.0.1" if host == "0.0.0.0" else host
        return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


def serve(app, host: str, port: int, quiet: bool = False, on_start=None) -> None:
    """Serve in the foreground until Ctrl+C (graceful shutdown: running streams end, the scheduler stops)."""
    config = uvicorn.Config(app, host=host, port=port, log_level="warning" if quiet else "info",
                            timeout_graceful_shutdown=10)
    server = uvicorn.Server(config)
    if on_start is not None:
        original = server.startup

        async def startup(sockets=None):
            await original(sockets=sockets)
            if server.started:
                on_start(server)

        server.startup = startup
    freeze_loaded_objects()
    server.run()


def freeze_loaded_objects() -> None:
    """Exempt what is loaded by now (model, tokenizer, corpus index: ~400k objects for the default) from the cyclic
    garbage collector's full passes: each one walked them all, a ~0.2 s stall of every stream about once per burst of
    64 users (a diagnostic, logs/s52_gc.py); the rounds' own garbage is still collected."""
    gc.collect()
    gc.freeze()
