"""Small tokenizers of every kind a Hugging Face model folder carries, built here with `tokenizers`
and saved with transformers' `save_pretrained`, as the open models ship them (no download).

KINDS: byte-level BPE with GPT-2's pre-split (`gpt2`), Llama 3's (`llama3`: ignore_merges, a
begin-of-text template) and Qwen2's (`qwen2`: NFC, FIM specials, no template); SentencePiece-style
BPE with byte fallback and the `▁` normaliser (`llama2`: Llama 2, Mistral v0.1, TinyLlama);
WordPiece (`bert`) and Unigram (`unigram`, T5-like). Each is trained on TRAINING_TEXT.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
    r"\s+(?!\S)|\s+"
)
QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
KINDS = ("gpt2", "llama3", "qwen2", "llama2", "bert", "unigram")
BYTE_LEVEL = ("gpt2", "llama3", "qwen2")

TRAINING_TEXT = [
    "def parse(value):\n    return value.strip().split(',')\n\n",
    "The quick brown fox jumps over the lazy dog. It's 2024; we'll see 1,234,567 foxes!\n",
    "class Tokenizer:\n\tdef __init__(self, path: str) -> None:\n\t\tself.path = path  # keep it\n",
    "Die Grüße aus München: Straße, Äpfel und Öl. Ça coûte 12,50 € à Paris.\n",
    "東京は日本の首都です。北京是中国的首都。서울은 한국의 수도입니다.\n",
    "Emoji: 🙂🙃 👩‍💻 🇫🇷 — and whitespace    runs\n\n\n   between lines.\r\n",
    "SELECT name, count(*) FROM users WHERE id > 10 GROUP BY name;\n",
    "Приветствую всех! Как дела? Всё хорошо, спасибо.\n",
]


def _specials(kind: str) -> dict[str, list[str]]:
    """Special tokens (the vocabulary's first ids unless said) and the roles save_pretrained records."""
    return {
        "gpt2": {"specials": ["<|endoftext|>"]},
        "llama3": {"specials": ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>"]},
        "qwen2": {
            "specials": [
                "<|endoftext|>",
                "<|im_start|>",
                "<|im_end|>",
                "<|fim_prefix|>",
                "<|fim_middle|>",
                "<|fim_suffix|>",
                "<|fim_pad|>",
            ]
        },
        "llama2": {"specials": ["<unk>", "<s>", "</s>"]},
        "bert": {"specials": ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]},
        "unigram": {"specials": ["<pad>", "</s>", "<unk>"]},
    }[kind]


def _byte_level(kind: str, vocab_size: int) -> Tokenizer:
    tok = Tokenizer(models.BPE(ignore_merges=kind == "llama3"))
    if kind == "gpt2":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        pattern = LLAMA3_PATTERN if kind == "llama3" else QWEN2_PATTERN
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
            ]
        )
    if kind == "qwen2":
        tok.normalizer = normalizers.NFC()
    tok.decoder = decoders.ByteLevel()
    specials = _specials(kind)["specials"]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(TRAINING_TEXT * 20, trainer=trainer)
    if kind == "llama3":
        bos = specials[0]
        tok.post_processor = processors.Sequence(
            [
                processors.ByteLevel(trim_offsets=False),
                processors.TemplateProcessing(
                    single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tok.token_to_id(bos))]
                ),
            ]
        )
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def _sentencepiece_bpe(vocab_size: int) -> Tokenizer:
    """Llama 2's layout: <unk> <s> </s>, then the 256 byte-fallback tokens <0x00>.., then the merges' tokens."""
    trained = Tokenizer(models.BPE())
    trained.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    trained.pre_tokenizer = pre_tokenizers.Split("▁", behavior="merged_with_next")
    trained.train_from_iterator(
        TRAINING_TEXT * 20, trainer=trainers.BpeTrainer(vocab_size=vocab_size - 259, show_progress=False)
    )
    model = json.loads(trained.to_str())["model"]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2} | {f"<0x{b:02X}>": 3 + b for b in range(256)}
    for token, _ in sorted(model["vocab"].items(), key=lambda kv: kv[1]):
        vocab.setdefault(token, len(vocab))
    merges = [tuple(m) for m in model["merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)]
    )
    tok.add_special_tokens(["<unk>", "<s>", "</s>"])
    return tok


def _wordpiece(vocab_size: int) -> Tokenizer:
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    specials = _specials("bert")["specials"]
    tok.train_from_iterator(
        TRAINING_TEXT * 20,
        trainer=trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False),
    )
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    return tok


def _unigram(vocab_size: int) -> Tokenizer:
    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    specials = _specials("unigram")["specials"]
    tok.train_from_iterator(
        TRAINING_TEXT * 20,
        trainer=trainers.UnigramTrainer(
            vocab_size=vocab_size, special_tokens=specials, unk_token="<unk>", show_progress=False
        ),
    )
    tok.post_processor = processors.TemplateProcessing(
        single="$A </s>", pair="$A </s> $B </s>", special_tokens=[("</s>", tok.token_to_id("</s>"))]
    )
    return tok


ROLES = {
    "gpt2": {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>"},
    "llama3": {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"},
    "qwen2": {
        "eos_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>",
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
    },
    "llama2": {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "add_bos_token": True},
    "bert": {
        "cls_token": "[CLS]",
        "sep_token": "[SEP]",
        "pad_token": "[PAD]",
        "unk_token": "[UNK]",
        "mask_token": "[MASK]",
    },
    "unigram": {"eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>"},
}


@cache
def build(kind: str, vocab_size: int = 600) -> Tokenizer:
    """A trained tokenizer of `kind` (one of KINDS)."""
    if kind in BYTE_LEVEL:
        return _byte_level(kind, vocab_size)
    return {"llama2": _sentencepiece_bpe, "bert": _wordpiece, "unigram": _unigram}[kind](vocab_size)


def save(kind: str, folder: Path, vocab_size: int = 600) -> Path:
    """`kind`'s tokenizer saved into `folder` by transformers' save_pretrained (tokenizer.json,
    tokenizer_config.json, special_tokens_map.json where transformers writes one); returns folder."""
    from transformers import PreTrainedTokenizerFast

    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(build(kind, vocab_size).to_str()), **ROLES[kind]
    )
    folder.mkdir(parents=True, exist_ok=True)
    wrapped.save_pretrained(folder)
    return folder
