"""The helper process of extract.PageExtractor: `python -m kiln.curate.readers.extract_helper module:function`.

It imports the extractor, runs it once on a tiny page (so lazy imports are not charged to the
first real page), says it is ready, then answers one framed request at a time on stdin/stdout
(frames in extract.py) until its input ends. An extractor's error is sent back as a reply; a
crash or a hang is the parent's to notice. Its own stdout is moved to stderr first, so a print
inside a library cannot corrupt the replies. Not handled here: time limits (the parent kills it).
"""

from __future__ import annotations

import os
import sys

from kiln.curate.readers.extract import REPLY, REQUEST, _read_exactly, load_extractor, write_all


def main(target: str) -> int:
    replies = os.fdopen(os.dup(1), "wb", buffering=0)
    requests = os.fdopen(os.dup(0), "rb", buffering=0)
    os.dup2(2, 1)  # stray prints go to stderr, not into the reply stream
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)

    def send(status: int, data: bytes) -> None:
        write_all(replies, REPLY.pack(status, len(data)) + data)  # one write: the parent reads a reply whole

    try:
        extract = load_extractor(target)
        extract("<html><body><p>warm up</p></body></html>")
    except Exception as e:  # noqa: BLE001 - reported to the parent, which quarantines the pages
        send(1, f"{type(e).__name__}: {e}".encode("utf-8", "replace"))
        return 1
    send(2, b"")
    # The parent writes without blocking and reads replies while it writes, so a reply this
    # process is writing never waits on a request the parent is writing (no deadlock).
    while (header := _read_exactly(requests, REQUEST.size)) is not None:
        html = (_read_exactly(requests, REQUEST.unpack(header)[0]) or b"").decode("utf-8", "surrogatepass")
        try:
            text = extract(html)
        except Exception as e:  # noqa: BLE001 - this page's failure, never the helper's
            send(1, f"{type(e).__name__}: {e}".encode("utf-8", "replace"))
            continue
        send(0, text.encode("utf-8", "surrogatepass"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
