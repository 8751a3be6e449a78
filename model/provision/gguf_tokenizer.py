"""Rebuild a Hugging Face ``tokenizer.json`` from the vocabulary stored in a GGUF file.

llama.cpp's converter stores the BPE vocabulary, the merges, a type per token
and the name of the pre-tokenizer, which is enough to reconstruct the
original fast tokenizer exactly for byte-level BPE models. Control tokens
become special added tokens (never split, skippable when decoding) and
user-defined ones plain added tokens, mirroring how llama.cpp's converter
derived those types from the original tokenizer. Padding entries
(``[PAD…]``, type UNUSED) are left out, as in the original tokenizer.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Final

from gguf import GGUFReader, TokenType
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, processors
from tokenizers import pre_tokenizers as pre

log = logging.getLogger(__name__)

_REQUIRED: Final = object()

# Pre-tokenizer split patterns, as in the models' Hugging Face tokenizer.json.
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Tokens that end a turn in common chat templates. GGUF files record one EOS
# id, but generation must also stop on these or a chat model runs on.
_END_OF_TURN = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>")


@dataclass(frozen=True)
class TokenizerFacts:
    """What the config files need to know about the rebuilt tokenizer."""

    tokens: list[str]
    bos_id: int | None
    eos_ids: list[int]
    pad_id: int | None
    unk_id: int | None
    add_bos: bool
    chat_template: str | None

    def name(self, token_id: int | None) -> str | None:
        return None if token_id is None else self.tokens[token_id]


def field(reader: GGUFReader, key: str, default: Any = _REQUIRED) -> Any:
    """A metadata value; a missing key without default is a clear error."""
    entry = reader.get_field(key)
    if entry is None:
        if default is _REQUIRED:
            raise ValueError(f"GGUF metadata lacks {key!r}")
        return default
    return entry.contents()


def _opt_int(reader: GGUFReader, key: str) -> int | None:
    value = field(reader, key, None)
    return None if value is None else int(value)


def build_tokenizer(reader: GGUFReader) -> tuple[Tokenizer, TokenizerFacts]:
    """The fast tokenizer for ``reader``'s vocabulary, plus facts for the config files."""
    kind = field(reader, "tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(f"unsupported tokenizer model {kind!r} (only byte-level BPE 'gpt2')")
    tokens: list[str] = field(reader, "tokenizer.ggml.tokens")
    types: list[int] = field(reader, "tokenizer.ggml.token_type", [TokenType.NORMAL] * len(tokens))
    merges: list[str] = field(reader, "tokenizer.ggml.merges")
    typed = list(zip(tokens, types, strict=True))
    vocab = {tok: i for i, (tok, ty) in enumerate(typed) if ty != TokenType.UNUSED}
    pairs = [_merge_pair(m) for m in merges]
    tokenizer = Tokenizer(
        models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, byte_fallback=False)
    )
    _set_pre_tokenizer(tokenizer, str(field(reader, "tokenizer.ggml.pre", "default")))
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(
        [
            AddedToken(t, special=True, normalized=False)
            for t, ty in typed
            if ty == TokenType.CONTROL
        ]
    )
    tokenizer.add_tokens(
        [
            AddedToken(t, special=False, normalized=False)
            for t, ty in typed
            if ty == TokenType.USER_DEFINED
        ]
    )

    bos_id = _opt_int(reader, "tokenizer.ggml.bos_token_id")
    add_bos = bool(field(reader, "tokenizer.ggml.add_bos_token", False))
    _set_post_processor(tokenizer, tokens, bos_id if add_bos else None)
    template_text = field(reader, "tokenizer.chat_template", None)
    facts = TokenizerFacts(
        tokens=tokens,
        bos_id=bos_id,
        eos_ids=_eos_ids(reader, vocab),
        pad_id=_opt_int(reader, "tokenizer.ggml.padding_token_id"),
        unk_id=_opt_int(reader, "tokenizer.ggml.unknown_token_id"),
        add_bos=add_bos,
        chat_template=str(template_text) if template_text else None,
    )
    return tokenizer, facts


def _set_post_processor(tokenizer: Tokenizer, tokens: list[str], bos_id: int | None) -> None:
    """Byte-level offsets, and `bos_id`'s token before each sequence when one is added."""
    byte_level = processors.ByteLevel(trim_offsets=False)
    if bos_id is not None:
        bos = tokens[bos_id]
        template = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, bos_id)]
        )
        tokenizer.post_processor = processors.Sequence([byte_level, template])
    else:
        tokenizer.post_processor = byte_level


def _eos_ids(reader: GGUFReader, vocab: dict[str, int]) -> list[int]:
    """Every token that ends generation, once each: the declared end-of-sequence and
    end-of-turn tokens, then the known end-of-turn markers the vocabulary holds."""
    eos_ids: list[int] = []
    candidates = [
        _opt_int(reader, "tokenizer.ggml.eos_token_id"),
        _opt_int(reader, "tokenizer.ggml.eot_token_id"),
        *(vocab.get(t) for t in _END_OF_TURN),
    ]
    for token_id in candidates:
        if token_id is not None and token_id not in eos_ids:
            eos_ids.append(token_id)
    return eos_ids


def _set_pre_tokenizer(tokenizer: Tokenizer, pre_name: str) -> None:
    """Word splitting as the original tokenizer did it, keyed by llama.cpp's name."""
    if pre_name in ("qwen2", "llama-bpe", "llama3"):
        split = _QWEN2_SPLIT if pre_name == "qwen2" else _LLAMA3_SPLIT
        tokenizer.pre_tokenizer = pre.Sequence(
            [
                pre.Split(Regex(split), behavior="isolated", invert=False),
                pre.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
        if pre_name == "qwen2":
            tokenizer.normalizer = normalizers.NFC()
        return
    if pre_name in ("smollm", "starcoder", "refact"):
        tokenizer.pre_tokenizer = pre.Sequence(
            [
                pre.Digits(individual_digits=True),
                pre.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        )
        return
    if pre_name not in ("gpt-2", "gpt2", "default"):
        log.warning("Unknown pre-tokenizer %r; using GPT-2's word split", pre_name)
    tokenizer.pre_tokenizer = pre.ByteLevel(add_prefix_space=False, use_regex=True)


def _merge_pair(merge: str) -> tuple[str, str]:
    # Byte-level tokens never contain a literal space (it is mapped to "Ġ").
    left, sep, right = merge.partition(" ")
    if not sep:
        raise ValueError(f"malformed BPE merge {merge!r}")
    return left, right


def tokenizer_config(facts: TokenizerFacts, max_length: int) -> dict[str, Any]:
    """``tokenizer_config.json`` so transformers (and so mlx-lm) load the fast tokenizer."""
    result: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": facts.add_bos,
        "add_eos_token": False,
        "bos_token": facts.name(facts.bos_id),
        "eos_token": facts.name(facts.eos_ids[0] if facts.eos_ids else None),
        "pad_token": facts.name(facts.pad_id),
        "unk_token": facts.name(facts.unk_id),
        "clean_up_tokenization_spaces": False,
        "model_max_length": max_length,
        "split_special_tokens": False,
    }
    if facts.chat_template:
        result["chat_template"] = facts.chat_template
    return result
