"""``drafttree chat``: a conversation in the terminal, each answer streamed as its tokens are accepted.

The conversation so far goes back to the model with every turn (its chat template), as the server's chat route does;
the prefix cache keeps the earlier turns' keys, so each turn computes only what is new (``--no-prefix-cache``: every
turn from scratch, each answer then reproducible on its own with ``--seed``);
``/reset`` starts over, ``/exit`` (or end of input) ends it. A turn that cannot run (a conversation grown past the
context window) is refused with its one-line reason and dropped, the conversation kept; Ctrl+C stops an answer
where it is (what came out so far is kept as the answer) and, at the prompt, ends the chat.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator

from drafttree.errors import DraftTreeError, positive_int

HELP = "/reset starts a new conversation, /exit ends it; end a line with \\ to continue on the next one"


def read_turns(read: Callable[[], str]) -> Iterator[str]:
    """The user's turns: lines (a line ending with a backslash continues on the next), until end of input."""
    while True:
        parts = []
        try:
            line = read()
            while line.endswith("\\"):
                parts.append(line[:-1])
                line = read()
        except EOFError:
            if parts:
                yield "\n".join(parts)
            return
        yield "\n".join([*parts, line])


def chat_loop(lm, turns: Iterator[str], write: Callable[[str], None], report: Callable[[str], None],
              system: str | None = None, **kw) -> list[dict]:
    """Answer each turn with ``lm.stream`` over the whole conversation; returns the conversation at the end.
    ``write`` gets the answer's text as it comes, ``report`` one line of stats (or an error) per turn."""
    start = [{"role": "system", "content": system}] if system else []
    messages = list(start)
    for turn in turns:
        text = turn.strip()
        if not text:
            continue
        if text in ("/exit", "/quit"):
            break
        if text == "/reset":
            messages = list(start)
            report("(new conversation)")
            continue
        if text in ("/help", "/?"):
            report(HELP)
            continue
        if text.startswith("/") and len(text.split()) == 1:  # a mistyped command is not a question for the model
            report(f"unknown command {text}: {HELP}")
            continue
        messages.append({"role": "user", "content": turn})
        said = []
        try:
            stream = lm.stream(messages, **kw)
            for chunk in stream:
                said.append(chunk.text)
                write(chunk.text)
        except DraftTreeError as e:  # e.g. past the context window: the turn is dropped, the conversation kept
            messages.pop()
            if said:
                write("\n")
            report(f"drafttree: error: {e} (/reset starts a new conversation)")
            continue
        except KeyboardInterrupt:
            write("\n")
            report("(answer stopped)")
            messages.append({"role": "assistant", "content": "".join(said)})
            continue
        write("\n")
        res = stream.result
        messages.append({"role": "assistant", "content": res.text})
        cached = f", {res.cached_tokens} of {res.prompt_tokens} prompt tokens cached" if res.cached_tokens else ""
        report(f"[{res.method}] {res.new_tokens} tokens, {res.tokens_per_second:.1f} tok/s, tau {res.tau:.2f}{cached}")
    return messages


def cmd_chat(args) -> int:
    import drafttree
    from drafttree.cli import _method_options, _threads

    _threads(args.threads)
    drafttree.Sampling(args.temperature, args.top_p, args.top_k)  # bad settings fail before the model loads
    if args.system is not None and not args.system.strip():
        raise DraftTreeError("--system is empty")
    lm = drafttree.SpeculativeModel.from_pretrained(
        args.model, method=args.method, draft_model=args.draft_model, head=args.head or "auto",
        dtype=args.dtype, device=args.device, prefix_cache=not args.no_prefix_cache, **_method_options(args))
    tty = sys.stdin.isatty()
    if tty:
        print(f"drafttree chat: {lm.target.name}, method {lm.method}. {HELP}.", file=sys.stderr)

    def read() -> str:
        return input(">>> " if tty else "")

    def write(text: str) -> None:
        print(text, end="", flush=True)

    try:
        chat_loop(lm, read_turns(read), write, lambda line: print(line, file=sys.stderr, flush=True),
                  system=args.system, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                  top_p=args.top_p, top_k=args.top_k, seed=args.seed)
    except KeyboardInterrupt:  # at the prompt: the chat ends
        print(file=sys.stderr)
    return 0


def add_parser(sub) -> None:
    from drafttree.cli import _add_model_args
    from drafttree.drafters import METHODS

    c = sub.add_parser("chat", help="chat with a model in the terminal, answers streamed",
                       description=f"A conversation in the terminal: each turn goes to the model with the whole "
                                   f"conversation (its chat template) and the answer streams as its tokens are "
                                   f"accepted. {HELP}.")
    _add_model_args(c)
    c.add_argument("--method", default="auto", help=f"auto or one of: {', '.join(METHODS)}")
    c.add_argument("--draft-model", default=None, help="draft LM for --method draft (same tokenizer)")
    c.add_argument("--head", default=None, help="EAGLE head directory (default: the one shipped for the model)")
    c.add_argument("--system", default=None, help="a system message that starts the conversation")
    c.add_argument("--temperature", type=float, default=0.0)
    c.add_argument("--top-p", type=float, default=1.0)
    c.add_argument("--top-k", type=int, default=0, help="target sampling top-k (0 = off)")
    c.add_argument("--max-new-tokens", type=positive_int, default=512, help="longest answer per turn")
    c.add_argument("--seed", type=int, default=None, help="seeds each answer's sampling")
    c.add_argument("--no-prefix-cache", action="store_true",
                   help="compute every turn's whole conversation again (default: keep the earlier turns' keys)")
    c.set_defaults(func=cmd_chat)
