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
from tokenizers import Tokenizer

from kiln.core.config import Section
from kiln.core.errors import FatalError
from kiln.core.layout import CHECKPOINT, TOKENIZER, TOKENIZER_EXTENDED, TOKENIZER_JSON, RunLayout
from kiln.core.manifest import Stage
from kiln.model.transformer import Transformer
from kiln.model.weights import CONFIG, WEIGHTS, load_trained_model, save_weights
from kiln.text.tokenizer import META_NAME, KilnTokenizer, tiktoken_rules

log = logging.getLogger("kiln.tokenizer")


class ExtendConfig(Section):
    """What `kiln extend-tokenizer` was asked to do (hashed into its manifest)."""

    terms: str = Field(description="Terms file: UTF-8, one term per line; blank lines are skipped.")
    checkpoint: str | None = Field(
        default=None,
        description="Checkpoint folder to resize; None means the run's train checkpoint when there is one.",
    )


@dataclass(frozen=True)
class FormAdded:
    term: str
    form: str
    id: int | None  # its token; None when the form was one token already
    new: bool  # whether this form made the token (False: already one token, or a repeat)
    pieces: list[int]  # its ids under the old tokenizer


def read_terms(path: Path) -> list[str]:
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise FatalError(f"{path}: no such terms file; give one term per line") from None
    except UnicodeDecodeError as e:
        raise FatalError(f"{path}: not UTF-8 ({e}); save the terms file as UTF-8") from None
    terms = list(dict.fromkeys(t.strip() for t in lines if t.strip()))
    if not terms:
        raise FatalError(f"{path}: no terms (one per line); nothing to add")
    return terms


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
                    new[form.id] = table[form.pieces].mean(dim=0)
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
    inputs = [Path(cfg.terms), tok_path, tok_path.with_name(META_NAME)] + (
        [checkpoint / WEIGHTS, checkpoint / CONFIG] if has_checkpoint else []
    )
    stage = Stage(run_dir, TOKENIZER_EXTENDED, {"extend": cfg}, inputs=inputs, upstream=[TOKENIZER])
    if done := stage.up_to_date(force, lambda m: f"vocab {m['counts']['vocab_size']}"):
        return done
    old = KilnTokenizer.load(tok_path)
    new, added = extend(old, read_terms(Path(cfg.terms)))  # a bad term stops here, before the stage folder is touched
    stage.begin()
    outputs = new.save(stage.dir / TOKENIZER_JSON)
    rows = [{**asdict(f), "tokens_before": len(f.pieces), "tokens_after": len(new.encode(f.form))} for f in added]
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
    }
    width = max(len(repr(f.form)) for f in added)
    lines = [
        f"vocab {old.vocab_size:,} -> {new.vocab_size:,}: {len(new_ids)} new tokens for {counts['terms']} terms"
        + (f"; checkpoint resized into {stage.dir / 'checkpoint'}" if has_checkpoint else "; no checkpoint to resize")
    ]
    lines.append(f"  {'term form':<{width}}  tokens before -> after")
    lines += [f"  {r['form']!r:<{width}}  {r['tokens_before']:>6} -> {r['tokens_after']}" for r in rows]
    return stage.finish(outputs, counts, "\n".join(lines))
