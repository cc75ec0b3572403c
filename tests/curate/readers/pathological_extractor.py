"""An extractor for test_extract.py that hangs, fails, crashes or dawdles on cue.

The extractor helper process imports it by module path (extract.EXTRACTORS), as it would a real
one, so a hang here is a real hang in another process: only killing that process ends it.
"""

from __future__ import annotations

import os
import signal
import time

from kiln.curate.readers.extract import resiliparse_text


def extract(html: str) -> str:
    if "hang here" in html:
        while True:  # forever; a sleep, like C code, ignores everything but being killed
            time.sleep(60)
    if "explode here" in html:
        raise ValueError("parser exploded")
    if "crash here" in html:
        os.kill(os.getpid(), signal.SIGSEGV)  # what a bug in C code does
    if "dawdle here" in html:
        time.sleep(0.3)  # slow, but finishes within the limit: kept
    return resiliparse_text(html)
