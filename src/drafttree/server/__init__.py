"""``drafttree serve``: an OpenAI-compatible server (FastAPI + uvicorn) over the batched decoder, with a web page
that shows accepted tokens.

Imported lazily, so that ``drafttree``'s other commands run where the web stack is not installed (a training box).
"""

from __future__ import annotations

import importlib

_EXPORTS = {"create_app": "drafttree.server.app", "ServerThread": "drafttree.server.run",
            "serve": "drafttree.server.run"}
WEB_STACK = ("fastapi", "uvicorn", "starlette", "pydantic")

__all__ = ["ServerThread", "create_app", "serve"]


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'drafttree.server' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
