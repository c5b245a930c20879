"""``drafttree serve``: an OpenAI-compatible HTTP server with a web page that shows accepted tokens."""

from drafttree.server.app import create_server

__all__ = ["create_server"]
