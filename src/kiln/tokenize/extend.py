"""The extend-tokenizer stage: domain terms become whole tokens; a checkpoint grows rows for them.

Each term (one per line of the terms file) is added in the two forms running text has: after a
space (" Kubernetes") and bare ("Kubernetes", at a line start). A form is a new vocabulary entry
with the next id; merges are completed over the vocabulary again (tokenizer.tiktoken_rules), so
the Hugging Face file and kiln's tiktoken encoder still agree. A pre-split piece equal to a form
becomes that one token; text that never contains a term encodes exactly as before, so a model's
outputs on it are unchanged (tested).
A term must be a single pre-split piece, such as a word of letters in any script: letters,
digits and punctuation are cut apart before BPE ("COVID-19" is three pieces), so such a term is
refused with its pieces named. When only the bare form is one piece ("'s": " 's" is two), only
it is added. A form that is already one token is left as it is.
The checkpoint (the run's train checkpoint, or --checkpoint) gains one embedding row per new
token, the mean of the rows of the pieces the old tokenizer cut that form into, and likewise
one output row when the output projection is not tied. Optimizer state is not carried over.
An imported run's tokenizer (kiln.text.hf_tokenizer: byte-level BPE as GPT-2, Llama 3 and Qwen2
ship it, or SentencePiece-style BPE as Llama 2 and Mistral do) gains each form as a vocabulary
entry after every id it has (added tokens included), and its BPE reads a pre-split piece found in
the vocabulary as that one token (`ignore_merges`, Llama 3's rule). No merge is added, so text
without the terms keeps its ids: the rule changes none when every token encodes as itself
(checked); a SentencePiece-style file, which has no pre-split, gets one at each space marker `▁`
(no id changes when no token holds a marker after another character, checked). A form is what
the term is after a line break: the bare form is a piece of its own only under a byte-level
pre-split; with `▁` pieces only the spaced form is added, and a term followed by punctuation
stays split (the piece holds the punctuation). tokenizer_config.json then names the transformers
class that runs tokenizer.json as it is (run_as_is); the other files and the boundaries are kept.
A Qwen2 model's folder is read by transformers with its own class, rebuilt from vocabulary and
merges, so there merges join each form's old pieces from the left; the tokens on the way are new
too (rows likewise), and text holding their pieces side by side takes them (the summary says so).
--text: the domain's validation text, its fertility and tokens per word (kiln.tokenize.report)
before and after. --specials fim,mask,sentinels:N: kiln's spellings of those special tokens join an
imported tokenizer as special added tokens (kiln's own has them from training), each row the mean
of every old row, as no piece of text stands for them. Ids are checked against transformers'
AutoTokenizer in the tests.
Not handled here: WordPiece and Unigram vocabularies (refused); the objectives that use the specials.
Output: `tokenizer-extended/{tokenizer.json, kiln_tokenizer.json, terms.json, checkpoint/}`.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from pydantic import Field
from tokenizers import Regex, Tokenizer, pre_tokenizers

from kiln.core import storage
from kiln.core.config import Section
from kiln.core.errors import FatalError
from kiln.core.layout import CHECKPOINT, TOKENIZER, TOKENIZER_EXTENDED, TOKENIZER_JSON, RunLayout
from kiln.core.manifest import Stage
from kiln.model.transformer import Transformer
from kiln.model.weights import CONFIG, WEIGHTS, load_trained_model, save_weights
from kiln.text.hf_tokenizer import CONFIG as HF_CONFIG
from kiln.text.hf_tokenizer import MODEL_CONFIG, HfTokenizer
from kiln.text.load import AnyTokenizer, load_tokenizer
from kiln.text.specials import FIM_MIDDLE, FIM_PREFIX, FIM_SUFFIX, MASK, sentinel
from kiln.text.tokenizer import META_NAME, KilnTokenizer, tiktoken_rules
from kiln.tokenize.report import HeldoutDoc, measure

log = logging.getLogger("kiln.tokenizer")

SPECIAL_GROUPS = {"fim": (FIM_PREFIX, FIM_MIDDLE, FIM_SUFFIX), "mask": (MASK,)}  # --specials; also sentinels:N
CONTEXT = "\n"  # a form is read after a line break: there every pre-split cuts it off as it does mid-text
WORD_MARKER = "▁"  # SentencePiece's space
# subtle: pieces cut where a space marker follows another character, as BPE over the whole text never
# merges across such a place when no token holds "x▁" (checked in marker_split)
MARKER_PIECES = Regex(f"{WORD_MARKER}*[^{WORD_MARKER}]+|{WORD_MARKER}+")
AS_IS = "PreTrainedTokenizerFast"  # transformers' class that runs a tokenizer.json as it is (TokenizersBackend in 5)
AS_IS_CLASSES = (AS_IS, "TokenizersBackend")
# Model types whose folders transformers 5 reads with a tokenizer class of its own whatever tokenizer_config.json
# names (its MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS; of them kiln imports Qwen2): that class rebuilds BPE from
# the vocabulary and merges alone, so their terms are made by merges (tested against AutoTokenizer).
REBUILT_BY_TRANSFORMERS = ("qwen2",)


class ExtendConfig(Section):
    """What `kiln extend-tokenizer` was asked to do (hashed into its manifest)."""

    terms: str = Field(description="Terms file: UTF-8, one term per line; blank lines are skipped.")
    checkpoint: str | None = Field(
        default=None,
        description="Checkpoint folder to resize; None means the run's train checkpoint when there is one.",
    )
    specials: str | None = Field(
        default=None,
        description=(
            "kiln's special tokens to add to an imported tokenizer as special tokens, comma-separated: fim "
            "(<|fim_prefix|> <|fim_middle|> <|fim_suffix|>), mask (<|mask|>), sentinels:N (<|sentinel_0|>...); "
            "None: none."
        ),
    )
    text: str | None = Field(
        default=None,
        description=(
            "The domain's validation text (UTF-8 file): its fertility and tokens per word are reported before and "
            "after; None: only each term form's token count."
        ),
    )


@dataclass(frozen=True)
class FormAdded:
    term: str
    form: str
    id: int | None  # its token; None when the form was one token already
    new: bool  # whether this form made the token (False: already one token, or a repeat)
    pieces: list[int]  # its ids under the old tokenizer
    step: bool = False  # a token merges make on the way to a form (form: its spelling in the vocabulary)
    special: bool = False  # one of kiln's special tokens (--specials): its rows are the mean of every old row


def read_terms(path: Path) -> list[str]:
    try:
        lines = storage.read_text(path).splitlines()
    except FileNotFoundError:
        raise FatalError(f"{path}: no such terms file; give one term per line") from None
    except UnicodeDecodeError as e:
        raise FatalError(f"{path}: not UTF-8 ({e}); save the terms file as UTF-8") from None
    terms = list(dict.fromkeys(t.strip() for t in lines if t.strip()))
    if not terms:
        raise FatalError(f"{path}: no terms (one per line); nothing to add")
    return terms


def parse_specials(spec: str) -> list[str]:
    """The spellings `spec` (ExtendConfig.specials) names, in order, each once."""
    spellings: list[str] = []
    for item in filter(None, (i.strip() for i in spec.split(","))):
        name, _, count = item.partition(":")
        if name in SPECIAL_GROUPS and not count:
            spellings += SPECIAL_GROUPS[name]
        elif name == "sentinels" and count.isdigit() and int(count) > 0:
            spellings += [sentinel(i) for i in range(int(count))]
        else:
            raise FatalError(
                f"--specials {spec!r}: {item!r} is not fim, mask or sentinels:N (N > 0); e.g. --specials fim,mask,"
                "sentinels:8"
            )
    return list(dict.fromkeys(spellings))


def add_specials(data: dict[str, Any], spellings: list[str], next_id: int, have: set[str]) -> list[FormAdded]:
    """Add to tokenizer.json `data` each spelling not in `have` as a special added token, from `next_id` on."""
    added = []
    for spelling in (s for s in spellings if s not in have):
        flags = {"single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": True}
        data["added_tokens"].append({"id": next_id, "content": spelling, **flags})
        added.append(FormAdded(spelling, spelling, next_id, True, [], special=True))
        next_id += 1
    return added


def read_text(path: Path) -> str:
    try:
        return storage.read_text(path)
    except FileNotFoundError:
        raise FatalError(f"{path}: no such validation text file; give the domain's held-out text (--text)") from None
    except UnicodeDecodeError as e:
        raise FatalError(f"{path}: not UTF-8 ({e}); save the validation text as UTF-8") from None


def text_fertility(old: AnyTokenizer, new: AnyTokenizer, text: str) -> dict[str, dict[str, Any]]:
    """Fertility and tokens per word of `text` (kiln.tokenize.report's measures) under each tokenizer."""
    doc = [HeldoutDoc("text", "text", text)]
    measures = ("fertility", "tokens_per_word")
    return {name: {k: measure(tok, doc)["all"][k] for k in measures} for name, tok in (("before", old), ("after", new))}


def extend(tokenizer: KilnTokenizer, terms: list[str]) -> tuple[KilnTokenizer, list[FormAdded]]:
    """The tokenizer with each term's forms as whole tokens, and what was added for each form."""
    data = json.loads(tokenizer.hf.to_str())
    vocab: dict[str, int] = data["model"]["vocab"]
    added: list[FormAdded] = []
    for term in terms:
        pieces = tokenizer.hf.pre_tokenizer.pre_tokenize_str(term)
        if len(pieces) != 1:
            shown = [term[a:b] for _, (a, b) in pieces]
            raise FatalError(
                f"term {term!r}: kiln's pre-split cuts it into {len(pieces)} pieces {shown}; a term must be one "
                "pre-split piece, such as a word of letters (digits and punctuation are split off before BPE), "
                "so it cannot become one token"
            )
        for form in (" " + term, term):
            form_pieces = tokenizer.hf.pre_tokenizer.pre_tokenize_str(form)
            if len(form_pieces) != 1:
                log.info("extend-tokenizer: %r is %d pre-split pieces; only %r is added", form, len(form_pieces), term)
                continue
            piece = form_pieces[0][0]
            old_ids = tokenizer.encode(form)
            if len(old_ids) == 1 or piece in vocab:
                added.append(FormAdded(term, form, vocab.get(piece) if len(old_ids) > 1 else None, False, old_ids))
                continue
            vocab[piece] = len(vocab)  # specials are in the model's vocab too, so this is the next free id
            added.append(FormAdded(term, form, vocab[piece], True, old_ids))
    extended = KilnTokenizer(Tokenizer.from_str(json.dumps(tiktoken_rules(data))), list(tokenizer.specials))
    return extended, added


def marker_split(hf: Tokenizer, vocab: dict[str, int], where: str) -> None:
    """Give a tokenizer with no pre-split one at each space marker; FatalError when that could change an id."""
    crossing = [t for t in vocab if WORD_MARKER in t.lstrip(WORD_MARKER)]
    if crossing:
        raise FatalError(
            f"{where}: tokenizer.json has no pre-split and tokens that hold {WORD_MARKER!r} after another "
            f"character ({crossing[:5]}), so a term cannot be read as a piece of its own; extend-tokenizer adds "
            "terms to byte-level and SentencePiece-style BPE"
        )
    hf.pre_tokenizer = pre_tokenizers.Split(MARKER_PIECES, behavior="isolated")


def check_whole_pieces(hf: Tokenizer, model: dict[str, Any], added: set[str], where: str) -> None:
    """FatalError unless every vocabulary token encodes as itself, so that reading a piece found in the
    vocabulary as one token (ignore_merges) changes no id; a file that has that rule already passes."""
    if model.get("ignore_merges"):
        return
    # subtle: byte_fallback's <0xNN> tokens are spellings of bytes, never a piece of text (every piece starts ▁)
    byte = model.get("byte_fallback")
    unreached = [
        t
        for t in model["vocab"]
        if t not in added
        and not (byte and len(t) == 6 and t.startswith("<0x"))
        and [x.value for x in hf.model.tokenize(t)] != [t]
    ]
    if unreached:
        raise FatalError(
            f"{where}: {len(unreached)} tokens of tokenizer.json do not encode as themselves ({unreached[:5]}); "
            "adding terms would change how they encode, so this tokenizer cannot be extended"
        )


def form_piece(hf: Tokenizer, form: str) -> str | None:
    """What BPE sees of `form` after a line break (normalised, in the pre-split's alphabet), or None when the
    pre-split does not cut it off as one piece there."""
    normalize = hf.normalizer.normalize_str if hf.normalizer else str
    head, text = normalize(CONTEXT), normalize(CONTEXT + form)
    if not text.startswith(head):
        return None
    head_pieces = [p for p, _ in hf.pre_tokenizer.pre_tokenize_str(head)]
    pieces = [p for p, _ in hf.pre_tokenizer.pre_tokenize_str(text)]
    return pieces[-1] if len(pieces) == len(head_pieces) + 1 and pieces[:-1] == head_pieces else None


def extend_hf(
    tokenizer: HfTokenizer, terms: list[str], specials: list[str] | None = None
) -> tuple[HfTokenizer, list[FormAdded]]:
    """The imported BPE tokenizer with each term's forms as whole tokens (module docstring) and `specials` (kiln's
    spellings) as special tokens where it lacks them, and what was added."""
    where = tokenizer.where
    data = json.loads(tokenizer.files[TOKENIZER_JSON])
    model = data["model"]
    if model.get("type") != "BPE" or model.get("continuing_subword_prefix") or model.get("end_of_word_suffix"):
        raise FatalError(
            f"{where}: a {model.get('type')} tokenizer with subword markers or no BPE; extend-tokenizer adds terms "
            "to byte-level and SentencePiece-style BPE vocabularies"
        )
    hf = Tokenizer.from_str(tokenizer.files[TOKENIZER_JSON].decode("utf-8"))
    if hf.pre_tokenizer is None:
        marker_split(hf, model["vocab"], where)
    by_merges = not model.get("ignore_merges") and model_type(tokenizer) in REBUILT_BY_TRANSFORMERS
    if not by_merges:
        check_whole_pieces(hf, model, {t.content for t in hf.get_added_tokens_decoder().values()}, where)
    vocab: dict[str, int] = model["vocab"]
    next_id = max(hf.get_vocab(with_added_tokens=True).values()) + 1  # after the added tokens' ids too
    merges: dict[tuple[str, str], int] = {}  # the new merges by rank, after every merge the file has
    old_ids: dict[str, list[int]] = {}  # each new token's ids under the old tokenizer
    added: list[FormAdded] = []
    for term in terms:
        forms = [(form, piece) for form in (" " + term, term) if (piece := form_piece(hf, form)) is not None]
        if any(c.isspace() for c in term) or not forms:
            raise FatalError(
                f"term {term!r}: {where}'s pre-split cuts it into several pieces; a term must be one piece, such as "
                "a word of letters (digits, punctuation and spaces are split off before BPE)"
            )
        for form, piece in forms:
            old = hf.model.tokenize(piece)
            if "".join(t.value for t in old) != piece:
                raise FatalError(
                    f"term {term!r}: {where}'s vocabulary lacks some of its characters (they fall back to bytes: "
                    f"{[t.value for t in old]}); such a term cannot become one token"
                )
            ids = [t.id for t in old]
            if len(ids) == 1:
                added.append(FormAdded(term, form, None, False, ids))
                continue
            existed = piece in vocab
            if by_merges:
                for made, pieces in merge_chain([t.value for t in old], merges, vocab, old_ids):
                    vocab[made], next_id = next_id, next_id + 1
                    old_ids[made] = pieces
                    if made != piece:
                        added.append(FormAdded(term, made, vocab[made], True, pieces, step=True))
            elif not existed:
                vocab[piece], next_id = next_id, next_id + 1
            added.append(FormAdded(term, form, vocab[piece], not existed, ids))
    added += add_specials(data, specials or [], next_id, set(hf.get_vocab(with_added_tokens=True)) | set(vocab))
    if by_merges:
        pairs = model["merges"]
        pairs += [[a, b] if not pairs or isinstance(pairs[0], list) else f"{a} {b}" for a, b in merges]
        merged = Tokenizer.from_str(json.dumps(data))
        check_built(merged, hf, [f for f in added if f.id is not None and not f.step and not f.special], where)
        return tokenizer.with_files({TOKENIZER_JSON: merged.to_str(pretty=True).encode("utf-8")}), added
    model["ignore_merges"] = True
    data["pre_tokenizer"] = json.loads(hf.to_str())["pre_tokenizer"]
    rewritten = Tokenizer.from_str(json.dumps(data, ensure_ascii=False)).to_str(pretty=True)
    changed = {TOKENIZER_JSON: rewritten.encode("utf-8"), HF_CONFIG: run_as_is(tokenizer.files.get(HF_CONFIG), where)}
    return tokenizer.with_files(changed), added


def check_built(merged: Tokenizer, hf: Tokenizer, forms: list[FormAdded], where: str) -> None:
    """FatalError naming the forms the new merges do not make one token (a merge that makes a token the file
    had can let one of the file's own merges in before the next new one)."""
    split = [f.form for f in forms if [t.id for t in merged.model.tokenize(form_piece(hf, f.form) or "")] != [f.id]]
    if split:
        raise FatalError(
            f"terms {split}: {where}'s merges cannot build them into one token each; leave them out of the terms file"
        )


def model_type(tokenizer: HfTokenizer) -> str | None:
    try:
        return json.loads(tokenizer.origin.get(MODEL_CONFIG, b"{}")).get("model_type")
    except ValueError:
        return None


def apply_merges(pieces: list[str], ranks: dict[tuple[str, str], int]) -> list[str]:
    """`pieces` after the new merges in `ranks`, lowest rank and then leftmost first, as BPE applies them (the
    file's own merges are spent by then: every new one ranks after them, and none of them makes a new token)."""
    while True:
        found = [(ranks[pair], i) for i, pair in enumerate(zip(pieces, pieces[1:])) if pair in ranks]
        if not found:
            return pieces
        _, i = min(found)
        pieces = [*pieces[:i], pieces[i] + pieces[i + 1], *pieces[i + 2 :]]


def merge_chain(
    pieces: list[str], ranks: dict[tuple[str, str], int], vocab: dict[str, int], old_ids: dict[str, list[int]]
) -> list[tuple[str, list[int]]]:
    """Add to `ranks` the merges that join `pieces` (a form's old split) from the left into one token; returns
    the tokens this makes that the vocabulary lacks, each with its ids under the old tokenizer."""
    pieces = apply_merges(pieces, ranks)  # the split the merges of earlier forms leave
    made: list[tuple[str, list[int]]] = []
    ids = {**{t: [vocab[t]] for t in pieces if t in vocab}, **old_ids}
    left = pieces[0]
    for right in pieces[1:]:
        ranks.setdefault((left, right), len(ranks))
        joined = left + right
        ids.setdefault(joined, ids[left] + ids[right])
        if joined not in vocab:
            made.append((joined, ids[joined]))
        left = joined
    return made


def run_as_is(config: bytes | None, where: str) -> bytes:
    """tokenizer_config.json naming the class that runs tokenizer.json as it is (the file unchanged when it
    names it already). subtle: transformers 5 rebuilds a LlamaTokenizer, Qwen2Tokenizer or GPT2Tokenizer, and
    picks one from config.json's model_type when no class is named, from the vocabulary and merges alone,
    dropping the ignore_merges rule and the pre-split that make the terms one token (tested)."""
    settings = json.loads(config) if config else {}
    if settings.get("tokenizer_class") in AS_IS_CLASSES:
        assert config is not None
        return config
    log.info("extend-tokenizer: %s's tokenizer_class %s becomes %s", where, settings.get("tokenizer_class"), AS_IS)
    return (json.dumps({**settings, "tokenizer_class": AS_IS}, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


def form_tokens(tokenizer: AnyTokenizer, form: str) -> int:
    """How many tokens `form` takes in running text (after a line break; alone, a SentencePiece-style
    tokenizer would read a leading space as two markers)."""
    return len(tokenizer.encode(CONTEXT + form)) - len(tokenizer.encode(CONTEXT))


def resize(model: Transformer, added: list[FormAdded], old_vocab: int, vocab_size: int) -> Transformer:
    """A copy of `model` with rows for the new ids: each the mean of its form's old pieces' rows."""
    rows_before = model.cfg.vocab_size or 0
    if rows_before < old_vocab:
        raise FatalError(
            f"checkpoint: its model has {rows_before:,} embedding rows, fewer than the tokenizer's {old_vocab:,} "
            "ids; it was not trained with this run's tokenizer"
        )
    if rows_before > old_vocab:
        # Padding rows, or rows of an earlier extension: the new ids take them over.
        log.warning(
            (
                "extend-tokenizer: the checkpoint has %d rows for a tokenizer of %d ids; rows %d-%d are overwritten "
                "by the new terms"
            ),
            rows_before,
            old_vocab,
            old_vocab,
            vocab_size - 1,
        )
    cfg = model.cfg.model_copy(update={"vocab_size": max(vocab_size, rows_before)})
    grown = Transformer(cfg)
    state = model.state_dict()
    rows = cfg.vocab_size - rows_before
    with torch.no_grad():
        for key in ("embed.weight", "lm_head.weight"):
            table = state[key]
            new = torch.cat([table, table.new_zeros(rows, table.shape[1])])
            for form in added:
                if form.new:  # subtle: with a padded vocabulary the id may be an unused row already there
                    new[form.id] = table[:old_vocab].mean(dim=0) if form.special else table[form.pieces].mean(dim=0)
            state[key] = new
        grown.load_state_dict(state)
    return grown.eval()


def run(cfg: ExtendConfig, run_dir: Path, force: bool = False) -> dict[str, Any]:
    run_dir = Path(run_dir)
    layout = RunLayout(run_dir)
    tok_path = layout.tokenizer_json
    checkpoint = Path(cfg.checkpoint) if cfg.checkpoint else layout.checkpoint
    if checkpoint.resolve().is_relative_to(layout.stage(TOKENIZER_EXTENDED).resolve()):
        raise FatalError(
            f"{checkpoint}: inside tokenizer-extended/, which this stage rewrites; extend the run's own "
            "checkpoint (runs/NAME/train/checkpoint) with all the terms at once"
        )
    if cfg.checkpoint and not (checkpoint / CONFIG).is_file():
        raise FatalError(
            f"{checkpoint}: no checkpoint there (config.json missing); give the folder `kiln train` wrote, e.g. "
            "runs/NAME/train/checkpoint"
        )
    has_checkpoint = (checkpoint / CONFIG).is_file()
    inputs = [storage.as_location(cfg.terms), tok_path, tok_path.with_name(META_NAME)] + (
        [checkpoint / WEIGHTS, checkpoint / CONFIG] if has_checkpoint else []
    )
    inputs += [storage.as_location(cfg.text)] if cfg.text else []  # either may be a store's object
    stage = Stage(run_dir, TOKENIZER_EXTENDED, {"extend": cfg}, inputs=inputs, upstream=[TOKENIZER])
    if done := stage.up_to_date(force, lambda m: f"vocab {m['counts']['vocab_size']}"):
        return done
    old = load_tokenizer(tok_path)
    terms = read_terms(storage.as_location(cfg.terms))
    text = read_text(storage.as_location(cfg.text)) if cfg.text else None
    specials = parse_specials(cfg.specials) if cfg.specials else []
    if specials and isinstance(old, KilnTokenizer):
        raise FatalError(
            f"--specials {cfg.specials}: {tok_path} is kiln's own tokenizer, which has mask, FIM and "
            "tokenizer.sentinel_tokens sentinels from train-tokenizer; --specials is for an imported one"
        )
    # A bad term or tokenizer stops here, before the stage folder is touched.
    new, added = extend(old, terms) if isinstance(old, KilnTokenizer) else extend_hf(old, terms, specials)
    stage.begin()
    outputs = new.save(stage.dir / TOKENIZER_JSON)
    forms, steps = [f for f in added if not f.step and not f.special], [f for f in added if f.step]
    new_specials = [f for f in added if f.special]
    rows = [{**asdict(f), "tokens_before": len(f.pieces), "tokens_after": form_tokens(new, f.form)} for f in forms]
    rows += [{**asdict(f), "tokens_before": len(f.pieces), "tokens_after": 1} for f in steps]
    (stage.dir / "terms.json").write_text(json.dumps(rows, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    outputs.append(stage.dir / "terms.json")
    if has_checkpoint:
        model = load_trained_model(checkpoint)
        outputs += save_weights(stage.dir / CHECKPOINT, resize(model, added, old.vocab_size, new.vocab_size))
    else:
        log.info("tokenizer-extended: no checkpoint at %s; extended the tokenizer only", checkpoint)
    new_ids = [f.id for f in added if f.new]
    counts = {
        "vocab_size": new.vocab_size,
        "added_tokens": len(new_ids),
        "terms": len({f.term for f in added}),
        "checkpoint_resized": has_checkpoint,
        **({"merge_steps": len(steps)} if steps else {}),
        **({"special_tokens": [f.form for f in new_specials]} if new_specials else {}),
        **({"fertility": text_fertility(old, new, text)} if text is not None else {}),
    }
    rows = rows[: len(forms)]  # the table and fertility are the forms'
    width = max(len(repr(f.form)) for f in forms)
    lines = [
        f"vocab {old.vocab_size:,} -> {new.vocab_size:,}: {len(new_ids)} new tokens for {counts['terms']} terms"
        + (f"; checkpoint resized into {layout.stage(TOKENIZER_EXTENDED) / CHECKPOINT}" if has_checkpoint else "")
        + ("" if has_checkpoint else "; no checkpoint to resize")
    ]
    if has_checkpoint:
        lines.append(
            "each new embedding row (and output row, when not tied) is the mean of the rows of the tokens its form "
            "was cut into before"
        )
    if new_specials:
        lines.append(
            f"special tokens {' '.join(f.form for f in new_specials)} (ids {new_specials[0].id}-{new_specials[-1].id})"
            + (": each row the mean of every old row" if has_checkpoint else "")
        )
    if steps:
        lines.append(
            f"{len(steps)} of the new tokens are steps on the way to a form (its merges join the old pieces from the "
            "left); text that holds a step's pieces side by side now takes that token"
        )
    before, after = (sum(r[k] for r in rows) / len(rows) for k in ("tokens_before", "tokens_after"))
    lines.append(f"fertility of the term forms (tokens per form in running text): {before:.2f} -> {after:.2f}")
    if text is not None:
        f = counts["fertility"]
        lines.append(
            f"validation text {cfg.text}: fertility {f['before']['fertility']} -> {f['after']['fertility']}, tokens "
            f"per word {f['before']['tokens_per_word']} -> {f['after']['tokens_per_word']}"
        )
    lines.append(f"  {'term form':<{width}}  tokens before -> after")
    lines += [f"  {r['form']!r:<{width}}  {r['tokens_before']:>6} -> {r['tokens_after']}" for r in rows]
    return stage.finish(outputs, counts, "\n".join(lines))
