"""``drafttree serve``: an OpenAI-compatible server (FastAPI + uvicorn) over the batched decoder, with a web page
that shows accepted tokens."""

from drafttree.server.app import create_app
from drafttree.server.run import ServerThread, serve

__all__ = ["ServerThread", "create_app", "serve"]
