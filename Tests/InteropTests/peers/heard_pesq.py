"""What one listener heard, scored: `heard_pesq.py REF REC` finds REF (8 kHz mono WAV)
in the recording REC (8 kHz mono WAV, e.g. a sound server's sink recorded with parec) by
cross-correlation, cuts it out and scores it with PESQ (P.862 narrowband). Prints
{"pesq": score, "at": seconds into REC where REF starts, "onset": ...} as JSON; a
recording shorter than REF scores 0.

"onset" tells whether the first words were heard: the level of the recording in the
first 300 ms after REF's speech begins, against its level over the whole of REF, each
relative to REF's own: about 1 when the start was heard as the rest, near 0 when it was
lost (a device or a connection that took the first words).
"""
import json
import sys

import numpy as np
from pesq import pesq

from party_pesq import RATE, locate, read


def rms(x):
    return float(np.sqrt(np.mean(x.astype(np.float64) ** 2))) if len(x) else 0.0


def onset(ref, cut):
    """The first 300 ms of speech heard, against the whole, each relative to REF."""
    window = RATE // 50
    levels = [rms(ref[i: i + window]) for i in range(0, len(ref) - window, window)]
    if not levels or max(levels) == 0:
        return 0.0
    start = next(k for k, v in enumerate(levels) if v > 0.25 * max(levels)) * window
    span = slice(start, start + 3 * RATE // 10)
    whole = rms(cut[: len(ref)]) / max(rms(ref), 1e-9)
    first = rms(cut[span]) / max(rms(ref[span]), 1e-9)
    return first / whole if whole > 0 else 0.0


def main(ref_path, rec_path):
    ref = read(ref_path)
    rec = read(rec_path)
    if len(rec) < len(ref):
        print(json.dumps({"pesq": 0.0, "at": 0.0, "onset": 0.0}))
        return
    at = locate(rec, ref)
    cut = rec[at: at + len(ref) + RATE // 5]
    score = float(pesq(RATE, ref.astype(np.float64), cut.astype(np.float64), "nb"))
    print(json.dumps({"pesq": round(score, 3), "at": round(at / RATE, 3), "onset": round(onset(ref, cut), 3)}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
